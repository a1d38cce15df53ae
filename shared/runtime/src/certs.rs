//! Certificates a controller makes itself, for installs without
//! cert-manager: certificate authorities, the serving certificates they sign
//! (and when those expire), and the webhook's pair kept in a Secret (every
//! replica uses the same pair; the first to start creates it), its CA written
//! into the CRDs' conversion `caBundle`.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceConversion;
use kube::api::{GetParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::core::Request;
use kube::{Api, Client};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use serde::Deserialize;
use serde_json::json;

/// Keys of a TLS Secret, as cert-manager names them.
pub const CA_KEY: &str = "ca.crt";
pub const CERT_KEY: &str = "tls.crt";
pub const KEY_KEY: &str = "tls.key";

/// How long the webhook's self-made certificates are valid: they are made
/// once and not renewed (deleting the Secret makes new ones).
const WEBHOOK_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// A serving certificate and the CA that signed it, in PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookCerts {
    pub ca: String,
    pub cert: String,
    pub key: String,
}

/// Why certificates could not be provided.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("generating certificates: {0}")]
    Generate(#[from] rcgen::Error),
}

/// The certificates in Secret `namespace/name`, created there for `hosts`
/// (DNS names or IP addresses the API server uses to reach the webhook) if the
/// Secret does not exist. Replicas racing to create it all end up with the
/// winner's pair.
pub async fn ensure(
    client: Client,
    namespace: &str,
    name: &str,
    hosts: &[&str],
) -> Result<WebhookCerts, CertError> {
    let secrets = Api::<Secret>::namespaced(client, namespace);
    if let Some(certs) = secrets.get_opt(name).await?.as_ref().and_then(read) {
        return Ok(certs);
    }
    let certs = generate(hosts)?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_owned(),
                "cairn".to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        data: Some(BTreeMap::from([
            (CA_KEY.to_owned(), ByteString(certs.ca.clone().into_bytes())),
            (
                CERT_KEY.to_owned(),
                ByteString(certs.cert.clone().into_bytes()),
            ),
            (
                KEY_KEY.to_owned(),
                ByteString(certs.key.clone().into_bytes()),
            ),
        ])),
        ..Secret::default()
    };
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(certs),
        // Another replica won the race: use its pair.
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let existing = secrets.get(name).await?;
            read(&existing).ok_or_else(|| CertError::Kube(kube::Error::Api(status)))
        }
        Err(e) => Err(e.into()),
    }
}

fn read(secret: &Secret) -> Option<WebhookCerts> {
    let data = secret.data.as_ref()?;
    let text = |key: &str| {
        data.get(key)
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
    };
    Some(WebhookCerts {
        ca: text(CA_KEY)?,
        cert: text(CERT_KEY)?,
        key: text(KEY_KEY)?,
    })
}

/// A new CA and a certificate it signed for `hosts`.
pub fn generate(hosts: &[&str]) -> Result<WebhookCerts, rcgen::Error> {
    let ca = new_authority("cairn-webhook-ca", WEBHOOK_VALIDITY)?;
    let hosts: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
    let issued = issue(&ca, &hosts, WEBHOOK_VALIDITY)?;
    Ok(WebhookCerts {
        ca: ca.cert,
        cert: issued.cert,
        key: issued.key,
    })
}

/// A certificate authority: its certificate and private key, in PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct Authority {
    pub cert: String,
    pub key: String,
}

impl std::fmt::Debug for Authority {
    // The key never reaches a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").finish_non_exhaustive()
    }
}

/// A certificate and its private key, in PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct Issued {
    pub cert: String,
    pub key: String,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued").finish_non_exhaustive()
    }
}

/// A new self-signed certificate authority, valid from now for `valid_for`.
pub fn new_authority(common_name: &str, valid_for: Duration) -> Result<Authority, rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    set_validity(&mut params, valid_for);
    let key = KeyPair::generate()?;
    let ca = CertifiedIssuer::self_signed(params, key)?;
    Ok(Authority {
        cert: ca.pem(),
        key: ca.key().serialize_pem(),
    })
}

/// A serving certificate for `hosts` (DNS names or IP addresses; the first
/// is its common name) signed by `authority`, valid from now for `valid_for`.
pub fn issue(
    authority: &Authority,
    hosts: &[String],
    valid_for: Duration,
) -> Result<Issued, rcgen::Error> {
    let issuer = Issuer::from_ca_cert_pem(&authority.cert, KeyPair::from_pem(&authority.key)?)?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(
        DnType::CommonName,
        hosts.first().map_or("cairn", String::as_str),
    );
    for host in hosts {
        params.subject_alt_names.push(match host.parse() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(host.as_str().try_into()?),
        });
    }
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params, valid_for);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(Issued {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// Valid from a minute ago (clocks of other machines may lag) for `valid_for`.
fn set_validity(params: &mut CertificateParams, valid_for: Duration) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::minutes(1);
    params.not_after = now + valid_for;
}

/// What a PEM certificate says of itself: until when it is valid and the
/// host names and addresses it is valid for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Validity {
    pub not_after: SystemTime,
    pub hosts: Vec<String>,
}

/// The validity of the first certificate in `pem`; `None` if it is not one.
pub fn validity(pem: &str) -> Option<Validity> {
    use x509_parser::extensions::GeneralName;
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    let cert = pem.parse_x509().ok()?;
    let not_after = u64::try_from(cert.validity().not_after.timestamp()).ok()?;
    let hosts = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|name| match name {
                    GeneralName::DNSName(dns) => Some((*dns).to_owned()),
                    GeneralName::IPAddress(bytes) => ip_text(bytes),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    Some(Validity {
        not_after: SystemTime::UNIX_EPOCH + Duration::from_secs(not_after),
        hosts,
    })
}

fn ip_text(bytes: &[u8]) -> Option<String> {
    let ip: std::net::IpAddr = match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok()?.into(),
        16 => <[u8; 16]>::try_from(bytes).ok()?.into(),
        _ => return None,
    };
    Some(ip.to_string())
}

/// The one part of a CRD the injection reads. A whole CRD is mostly its
/// schema (174 KB of JSON for DatabaseCluster): parsed into typed structs,
/// its pieces left an idle controller about 0.4 MiB larger.
#[derive(Deserialize)]
struct CrdConversion {
    spec: ConversionSpec,
}

#[derive(Deserialize)]
struct ConversionSpec {
    conversion: Option<CustomResourceConversion>,
}

/// What [`inject_ca_bundle`] does with one CRD.
#[derive(Debug, PartialEq, Eq)]
enum Injection {
    /// Write the CA into its `caBundle`.
    Write,
    /// It holds the CA already.
    Held,
    /// It converts without a webhook: a CRD installed by other means (by
    /// hand, by a GitOps tool, by a test bed) that does not ask for one.
    NoWebhook,
    /// It converts through another release's Service (this release has
    /// `crds.install=false`), whose CA must stay.
    OtherRelease(String),
}

fn injection(
    conversion: Option<&CustomResourceConversion>,
    ca: &str,
    own_service: Option<&str>,
) -> Injection {
    let Some(webhook) = conversion
        .filter(|c| c.strategy == "Webhook")
        .and_then(|c| c.webhook.as_ref())
    else {
        return Injection::NoWebhook;
    };
    let client_config = webhook.client_config.as_ref();
    let target = client_config
        .and_then(|c| c.service.as_ref())
        .map(|s| format!("{}.{}.svc", s.name, s.namespace));
    if let (Some(own), Some(target)) = (own_service, target)
        && own != target
    {
        return Injection::OtherRelease(target);
    }
    let current = client_config.and_then(|c| c.ca_bundle.as_ref());
    if current.is_some_and(|bundle| bundle.0 == ca.as_bytes()) {
        Injection::Held
    } else {
        Injection::Write
    }
}

/// Writes `ca` into the conversion webhook `caBundle` of each CRD in
/// `crd_names` that does not already hold it (no write when it does), unless
/// the CRD converts without a webhook or through a Service other than
/// `own_service`.
pub async fn inject_ca_bundle(
    client: Client,
    crd_names: &[&str],
    ca: &str,
    own_service: Option<&str>,
) -> Result<(), kube::Error> {
    let crds = Request::new("/apis/apiextensions.k8s.io/v1/customresourcedefinitions");
    for name in crd_names {
        let get = crds
            .get(name, &GetParams::default())
            .map_err(kube::Error::BuildRequest)?;
        let crd: CrdConversion = client.request(get).await?;
        match injection(crd.spec.conversion.as_ref(), ca, own_service) {
            Injection::Held => continue,
            Injection::NoWebhook => {
                tracing::info!(
                    crd = name,
                    "the CRD converts without a webhook: no caBundle to write"
                );
                continue;
            }
            Injection::OtherRelease(target) => {
                tracing::info!(crd = name, %target, own = own_service, "the CRD converts through another release's webhook: its caBundle is left alone");
                continue;
            }
            Injection::Write => {}
        }
        let patch = json!({ "spec": { "conversion": { "webhook": { "clientConfig": {
            "caBundle": ByteString(ca.as_bytes().to_vec())
        } } } } });
        let patch = crds
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .map_err(kube::Error::BuildRequest)?;
        client.request::<CrdConversion>(patch).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conversion(value: serde_json::Value) -> CustomResourceConversion {
        serde_json::from_value(value).expect("a CRD conversion")
    }

    fn through_service(name: &str, ca_bundle: Option<&str>) -> CustomResourceConversion {
        let mut client = json!({ "service": { "name": name, "namespace": "cairn-system" } });
        if let Some(ca) = ca_bundle {
            client["caBundle"] = json!(ByteString(ca.as_bytes().to_vec()));
        }
        conversion(json!({
            "strategy": "Webhook",
            "webhook": { "clientConfig": client, "conversionReviewVersions": ["v1"] },
        }))
    }

    #[test]
    fn only_a_webhook_of_this_release_without_the_ca_is_written() {
        let own = Some("db-webhook.cairn-system.svc");
        assert_eq!(
            injection(Some(&through_service("db-webhook", None)), "CA", own),
            Injection::Write
        );
        assert_eq!(
            injection(Some(&through_service("db-webhook", Some("CA"))), "CA", own),
            Injection::Held
        );
        assert_eq!(
            injection(Some(&through_service("db-webhook", Some("OLD"))), "CA", own),
            Injection::Write,
            "a new CA replaces the old"
        );
        assert_eq!(
            injection(Some(&through_service("other-webhook", None)), "CA", own),
            Injection::OtherRelease("other-webhook.cairn-system.svc".into())
        );
        // Without a Service of its own to compare (a webhook by url), the
        // CRD's webhook is this process's.
        assert_eq!(
            injection(Some(&through_service("other-webhook", None)), "CA", None),
            Injection::Write
        );
    }

    /// A CRD installed with no conversion webhook (strategy None, or no
    /// conversion at all) gets none: the API server refuses a caBundle
    /// there, and the controller must start anyway.
    #[test]
    fn a_crd_converting_without_a_webhook_is_left_alone() {
        let own = Some("db-webhook.cairn-system.svc");
        let none = conversion(json!({ "strategy": "None" }));
        assert_eq!(injection(Some(&none), "CA", own), Injection::NoWebhook);
        assert_eq!(injection(None, "CA", own), Injection::NoWebhook);
    }

    #[test]
    fn generated_pairs_are_pem_and_distinct() {
        let a = generate(&[
            "cairn-database-controller-webhook.cairn-system.svc",
            "127.0.0.1",
        ])
        .expect("generates");
        let b = generate(&["x.svc"]).expect("generates");
        assert!(a.ca.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(a.key.contains("PRIVATE KEY"));
        assert_ne!(a.ca, b.ca);
    }

    #[test]
    fn an_issued_certificate_says_its_hosts_and_expiry() {
        let day = Duration::from_secs(24 * 3600);
        let ca = new_authority("test-ca", 10 * day).expect("authority");
        let hosts = vec!["orders-rw".to_owned(), "127.0.0.1".to_owned()];
        let issued = issue(&ca, &hosts, day).expect("issued");
        let read = validity(&issued.cert).expect("parses");
        assert_eq!(read.hosts, hosts);
        let left = read
            .not_after
            .duration_since(SystemTime::now())
            .expect("in the future");
        assert!(
            left > day - Duration::from_secs(60) && left <= day,
            "{left:?}"
        );
        assert!(validity(&ca.cert).is_some_and(|v| v.hosts.is_empty()));
        assert_eq!(validity("not a certificate"), None);
        assert!(!format!("{ca:?}{issued:?}").contains("PRIVATE"));
    }

    #[test]
    fn a_crds_conversion_is_read_without_its_schema() {
        let crd = json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": { "name": "databaseclusters.database.cairn.dev" },
            "spec": {
                "group": "database.cairn.dev",
                "versions": [{ "name": "v1", "schema": { "openAPIV3Schema": { "type": "object" } } }],
                "conversion": { "strategy": "Webhook", "webhook": {
                    "conversionReviewVersions": ["v1"],
                    "clientConfig": {
                        "caBundle": "Y2E=",
                        "service": { "name": "webhook", "namespace": "cairn-system" },
                    },
                } },
            },
        });
        let read: CrdConversion = serde_json::from_value(crd).expect("parses");
        let config = read
            .spec
            .conversion
            .and_then(|c| c.webhook)
            .and_then(|w| w.client_config)
            .expect("a client config");
        assert_eq!(config.ca_bundle, Some(ByteString(b"ca".to_vec())));
        assert_eq!(config.service.map(|s| s.name).as_deref(), Some("webhook"));
        let without: CrdConversion =
            serde_json::from_value(json!({ "spec": { "group": "g" } })).expect("parses");
        assert!(without.spec.conversion.is_none());
    }
}
