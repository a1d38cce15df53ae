//! Self-managed webhook certificates, for installs without cert-manager: a CA
//! and a serving certificate kept in a Secret (every replica uses the same
//! pair; the first to start creates it), and the CA written into the CRDs'
//! conversion `caBundle`.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, SanType};
use serde_json::json;

/// Keys of the Secret, as cert-manager names them.
const CA_KEY: &str = "ca.crt";
const CERT_KEY: &str = "tls.crt";
const KEY_KEY: &str = "tls.key";

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
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "cairn-webhook-ca");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(
        DnType::CommonName,
        hosts.first().copied().unwrap_or("cairn-webhook"),
    );
    for host in hosts {
        params.subject_alt_names.push(match host.parse() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName((*host).try_into()?),
        });
    }
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &ca)?;
    Ok(WebhookCerts {
        ca: ca.pem(),
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// Writes `ca` into the conversion webhook `caBundle` of each CRD in
/// `crd_names` that does not already hold it (no write when it does).
pub async fn inject_ca_bundle(
    client: Client,
    crd_names: &[&str],
    ca: &str,
) -> Result<(), kube::Error> {
    let crds = Api::<CustomResourceDefinition>::all(client);
    for name in crd_names {
        let crd = crds.get(name).await?;
        let current = crd
            .spec
            .conversion
            .as_ref()
            .and_then(|c| c.webhook.as_ref())
            .and_then(|w| w.client_config.as_ref())
            .and_then(|c| c.ca_bundle.as_ref());
        if current.is_some_and(|bundle| bundle.0 == ca.as_bytes()) {
            continue;
        }
        let patch = json!({ "spec": { "conversion": { "webhook": { "clientConfig": {
            "caBundle": ByteString(ca.as_bytes().to_vec())
        } } } } });
        crds.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
