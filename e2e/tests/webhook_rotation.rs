//! The runtime's webhook server, with certificates from mounted files, serves
//! the API server's conversion requests and picks up a rotated certificate
//! without a restart.

use std::path::Path;
use std::time::Duration;

use cairn_testing::{cluster, wait};
use k8s_openapi::ByteString;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::WebhookClientConfig;
use kube::Api;
use kube::api::DynamicObject;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair, SanType};

type Result = std::result::Result<(), Box<dyn std::error::Error>>;

/// A fresh CA and its certificate for 127.0.0.1.
struct Issued {
    ca: String,
    cert: String,
    key: String,
}

impl Issued {
    /// Writes the pair as a mounted TLS Secret would (the key first: the
    /// server reloads when the files change).
    fn write(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::write(dir.join("tls.key"), &self.key)?;
        std::fs::write(dir.join("tls.crt"), &self.cert)
    }
}

fn issue() -> std::result::Result<Issued, Box<dyn std::error::Error>> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
    let mut params = CertificateParams::new(vec!["localhost".to_owned()])?;
    params
        .subject_alt_names
        .push(SanType::IpAddress([127, 0, 0, 1].into()));
    let key = KeyPair::generate()?;
    let certificate = params.signed_by(&key, &ca)?;
    Ok(Issued {
        ca: ca.pem(),
        cert: certificate.pem(),
        key: key.serialize_pem(),
    })
}

#[tokio::test]
async fn a_rotated_certificate_is_served_without_a_restart() -> Result {
    let certs = std::env::temp_dir().join(format!("cairn-webhook-{}", std::process::id()));
    std::fs::create_dir_all(&certs)?;
    let first = issue()?;
    first.write(&certs)?;
    let router = cairn_database_controller::webhook::router(
        cairn_runtime::metrics::Metrics::new("database", "0.0.0", "test")
            .expect("metrics register"),
    );
    let server = cairn_runtime::webhook::start(
        ([127, 0, 0, 1], 0).into(),
        router,
        &certs,
        Duration::from_millis(200),
    )
    .await?;
    let url = format!("https://{}/convert", server.address);
    let install = |ca: String| {
        let url = url.clone();
        async move {
            let crd = cairn_api::crds::database_cluster_with_conversion(WebhookClientConfig {
                url: Some(url),
                ca_bundle: Some(ByteString(ca.into_bytes())),
                service: None,
            });
            let client = cluster().admin_client().await?;
            cairn_testing::crds::install(&client, &[crd]).await
        }
    };
    install(first.ca.clone()).await?;

    let ns = cluster().namespace("webhook").await?;
    let old = Api::<DynamicObject>::namespaced_with(
        ns.client.clone(),
        &ns.name,
        &cairn_e2e::database_cluster("v1alpha1"),
    );
    cairn_e2e::create_v1alpha1_cluster(
        &old,
        "a conversion with the first certificate",
        "rotated",
        1,
        "17",
        "1Gi",
    )
    .await?;

    // Rotation. First the API server is told to trust only the new CA: while
    // the server still serves the old certificate, conversions fail...
    let second = issue()?;
    install(second.ca.clone()).await?;
    wait::until(
        "conversions to fail against the old certificate",
        Duration::from_secs(30),
        || async {
            match old.get("rotated").await {
                Err(e) => Ok(Some(e)),
                Ok(_) => Err("still converting".to_owned()),
            }
        },
    )
    .await?;
    // ...then the new pair lands in the mounted files, and conversions work
    // again without restarting the server.
    second.write(&certs)?;
    wait::until(
        "a conversion with the rotated certificate",
        Duration::from_secs(30),
        || async {
            old.get("rotated")
                .await
                .map(Some)
                .map_err(|e| e.to_string())
        },
    )
    .await?;
    server.shutdown();
    std::fs::remove_dir_all(&certs)?;
    Ok(())
}
