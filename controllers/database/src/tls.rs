//! The cluster's TLS, built without I/O: a certificate authority made once
//! and kept with its key in Secret `<name>-ca`, a server certificate it signs
//! for the cluster's Services and pods in Secret `<name>-server` (mounted by
//! every instance, renewed well before it expires), and the CA alone in
//! ConfigMap `<name>-ca` for clients to verify the server with.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use cairn_api::database::v1::DatabaseCluster;
use cairn_runtime::certs::{self, Authority, Issued};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt;

use crate::build::{Names, metadata};

const DAY: Duration = Duration::from_secs(24 * 3600);
/// The cluster's CA outlives any cluster it is likely to serve; replacing it
/// means every client must trust a new one.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Server certificates are short-lived and renewed on their own.
pub const SERVER_VALIDITY: Duration = Duration::from_secs(90 * 24 * 3600);
/// A server certificate is replaced once it has less than this left.
pub const RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 3600);
/// Where the CA's private key is kept in Secret `<name>-ca`.
pub const CA_PRIVATE_KEY: &str = "ca.key";

/// The DNS names the server certificate is valid for: each Service, short
/// and qualified, and every pod by its stable name under the headless one.
pub fn server_hosts(cluster: &DatabaseCluster) -> Vec<String> {
    let names = Names::of(cluster);
    let namespace = cluster.namespace().unwrap_or_default();
    let pods = format!("*.{}", names.cluster);
    let mut hosts = Vec::new();
    for short in [&names.read_write, &names.read_only, &names.cluster, &pods] {
        hosts.push(short.clone());
        hosts.push(format!("{short}.{namespace}"));
        hosts.push(format!("{short}.{namespace}.svc"));
        hosts.push(format!("{short}.{namespace}.svc.cluster.local"));
    }
    hosts
}

/// Secret `<name>-ca`: the CA's certificate and key. Created once, never
/// applied over (a new CA would break every client that trusts the old one).
pub fn ca_secret(cluster: &DatabaseCluster, authority: &Authority) -> Secret {
    Secret {
        metadata: metadata(cluster, &Names::of(cluster).ca, "tls"),
        type_: Some("Opaque".to_owned()),
        data: Some(BTreeMap::from([
            (certs::CA_KEY.to_owned(), bytes(&authority.cert)),
            (CA_PRIVATE_KEY.to_owned(), bytes(&authority.key)),
        ])),
        ..Secret::default()
    }
}

/// The CA kept in Secret `<name>-ca`, if it holds one.
pub fn authority_of(secret: &Secret) -> Option<Authority> {
    Some(Authority {
        cert: text(secret, certs::CA_KEY)?,
        key: text(secret, CA_PRIVATE_KEY)?,
    })
}

/// Secret `<name>-server`, as cert-manager would write it: the server's
/// certificate and key, and the CA that signed it (replicas verify their
/// primary with it).
pub fn server_secret(cluster: &DatabaseCluster, authority: &Authority, issued: &Issued) -> Secret {
    Secret {
        metadata: metadata(cluster, &Names::of(cluster).server_tls, "tls"),
        type_: Some("kubernetes.io/tls".to_owned()),
        data: Some(BTreeMap::from([
            (certs::CA_KEY.to_owned(), bytes(&authority.cert)),
            (certs::CERT_KEY.to_owned(), bytes(&issued.cert)),
            (certs::KEY_KEY.to_owned(), bytes(&issued.key)),
        ])),
        ..Secret::default()
    }
}

/// ConfigMap `<name>-ca`: the CA's certificate, for clients to use with
/// `sslmode=verify-full` (no key: any pod may read it).
pub fn ca_config_map(cluster: &DatabaseCluster, authority: &Authority) -> ConfigMap {
    ConfigMap {
        metadata: metadata(cluster, &Names::of(cluster).ca, "tls"),
        data: Some(BTreeMap::from([(
            certs::CA_KEY.to_owned(),
            authority.cert.clone(),
        )])),
        ..ConfigMap::default()
    }
}

/// Whether the server certificate must be (re)issued now, and why; if not,
/// when it will be.
#[derive(Debug, PartialEq, Eq)]
pub enum Renewal {
    Now(&'static str),
    At(SystemTime),
}

/// When the server certificate in `server` needs replacing: at once when
/// there is none, another CA signed it or it does not name every host; else
/// [`RENEW_BEFORE`] its expiry.
pub fn renewal(
    server: Option<&Secret>,
    authority: &Authority,
    hosts: &[String],
    now: SystemTime,
) -> Renewal {
    let Some(server) = server else {
        return Renewal::Now("there is no server certificate yet");
    };
    if text(server, certs::CA_KEY).as_ref() != Some(&authority.cert) {
        return Renewal::Now("the server certificate is not from the cluster's CA");
    }
    let Some(validity) = text(server, certs::CERT_KEY).and_then(|pem| certs::validity(&pem)) else {
        return Renewal::Now("the server certificate cannot be read");
    };
    if hosts.iter().any(|host| !validity.hosts.contains(host)) {
        return Renewal::Now("the server certificate does not name every host");
    }
    let due = validity
        .not_after
        .checked_sub(RENEW_BEFORE)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    if due <= now {
        return Renewal::Now("the server certificate expires within 30 days");
    }
    Renewal::At(due)
}

/// How long until a renewal due at `due`, at least a minute and at most a
/// day (a clock that jumps is caught the next day).
pub fn until(due: SystemTime, now: SystemTime) -> Duration {
    due.duration_since(now)
        .unwrap_or_default()
        .clamp(Duration::from_secs(60), DAY)
}

fn bytes(text: &str) -> ByteString {
    ByteString(text.as_bytes().to_vec())
}

fn text(secret: &Secret, key: &str) -> Option<String> {
    let data = secret.data.as_ref()?.get(key)?;
    String::from_utf8(data.0.clone()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    fn authority() -> Authority {
        certs::new_authority("test", CA_VALIDITY).expect("authority")
    }

    #[test]
    fn the_server_certificate_names_each_service_and_pod() {
        let hosts = server_hosts(&fixtures::cluster(3, &[]));
        for host in [
            "orders-rw",
            "orders-ro.shop.svc",
            "orders-rw.shop.svc.cluster.local",
            "*.orders.shop.svc",
            "*.orders",
        ] {
            assert!(hosts.contains(&host.to_owned()), "{host} in {hosts:?}");
        }
    }

    #[test]
    fn a_server_certificate_is_renewed_a_month_before_it_expires_or_when_wrong() {
        let cluster = fixtures::cluster(3, &[]);
        let ca = authority();
        let hosts = server_hosts(&cluster);
        let issued = certs::issue(&ca, &hosts, SERVER_VALIDITY).expect("issued");
        let server = server_secret(&cluster, &ca, &issued);
        let now = SystemTime::now();
        assert_eq!(
            renewal(None, &ca, &hosts, now),
            Renewal::Now("there is no server certificate yet")
        );
        let Renewal::At(due) = renewal(Some(&server), &ca, &hosts, now) else {
            panic!("a fresh certificate is not due");
        };
        let after = due.duration_since(now).expect("due later");
        assert!(after > SERVER_VALIDITY - RENEW_BEFORE - DAY, "{after:?}");
        assert!(matches!(
            renewal(Some(&server), &ca, &hosts, due),
            Renewal::Now(_)
        ));
        let more_hosts = [hosts.clone(), vec!["orders-extra".to_owned()]].concat();
        assert!(matches!(
            renewal(Some(&server), &ca, &more_hosts, now),
            Renewal::Now(_)
        ));
        assert!(matches!(
            renewal(Some(&server), &authority(), &hosts, now),
            Renewal::Now(_)
        ));
    }

    #[test]
    fn clients_get_the_ca_without_its_key() {
        let cluster = fixtures::cluster(3, &[]);
        let ca = authority();
        let published = ca_config_map(&cluster, &ca);
        assert_eq!(published.metadata.name.as_deref(), Some("orders-ca"));
        let data = published.data.expect("data");
        assert_eq!(data.keys().collect::<Vec<_>>(), ["ca.crt"]);
        assert_eq!(authority_of(&ca_secret(&cluster, &ca)), Some(ca));
    }

    #[test]
    fn renewals_are_checked_between_a_minute_and_a_day_ahead() {
        let now = SystemTime::now();
        assert_eq!(until(now, now), Duration::from_secs(60));
        assert_eq!(until(now + 90 * DAY, now), DAY);
    }
}
