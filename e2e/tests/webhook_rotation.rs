//! The runtime's webhook server, with certificates from mounted files, serves
//! the API server's conversion requests, injects the mounted CA into the CRD
//! itself, and after a rotation (a new CA and certificate in the files, as
//! cert-manager renews a Secret) injects the new CA and serves the new
//! certificate without a restart.

use std::path::Path;
use std::time::Duration;

use cairn_testing::{cluster, wait};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, WebhookClientConfig,
};
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
    /// Writes the files as a mounted cert-manager Secret holds them (the key
    /// first: the server reloads when the files change).
    fn write(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::write(dir.join("tls.key"), &self.key)?;
        std::fs::write(dir.join("ca.crt"), &self.ca)?;
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

/// The caBundle the API server uses for the CRD's conversions.
async fn ca_bundle(client: &kube::Client) -> std::result::Result<Option<String>, kube::Error> {
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let crd = crds.get(cairn_database_controller::webhook::CRD).await?;
    Ok(crd
        .spec
        .conversion
        .and_then(|c| c.webhook)
        .and_then(|w| w.client_config)
        .and_then(|c| c.ca_bundle)
        .map(|bundle| String::from_utf8_lossy(&bundle.0).into_owned()))
}

#[tokio::test]
async fn a_rotated_certificate_and_ca_are_taken_up_without_a_restart() -> Result {
    let certs = std::env::temp_dir().join(format!("cairn-webhook-{}", std::process::id()));
    std::fs::create_dir_all(&certs)?;
    let first = issue()?;
    first.write(&certs)?;
    // The CRD names the server but trusts nothing yet: the server injects
    // the mounted CA when it starts.
    let admin = cluster().admin_client().await?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let crd = cairn_api::crds::database_cluster_with_conversion(WebhookClientConfig {
        url: Some(format!("https://127.0.0.1:{port}/convert")),
        ca_bundle: None,
        service: None,
    });
    cairn_testing::crds::install(&admin, &[crd]).await?;
    let router = cairn_database_controller::webhook::router(
        cairn_runtime::metrics::Metrics::new("database", "0.0.0", "test")
            .expect("metrics register"),
    );
    let server = cairn_runtime::webhook::start(
        ([127, 0, 0, 1], port).into(),
        router,
        &certs,
        Duration::from_millis(200),
        Some(cairn_runtime::webhook::CaInjection {
            client: admin.clone(),
            crds: vec![cairn_database_controller::webhook::CRD.to_owned()],
            service: None,
        }),
    )
    .await?;
    assert_eq!(ca_bundle(&admin).await?.as_deref(), Some(first.ca.as_str()));

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

    // Rotation: a new CA and a certificate it signed land in the files. The
    // server puts the new CA into the CRD (nobody else does here)...
    let second = issue()?;
    second.write(&certs)?;
    wait::until(
        "the rotated CA in the CRD",
        Duration::from_secs(30),
        || async {
            let bundle = ca_bundle(&admin).await.map_err(|e| e.to_string())?;
            Ok((bundle.as_deref() == Some(second.ca.as_str())).then_some(()))
        },
    )
    .await?;
    // ...and, trusted only through it, serves conversions with the new
    // certificate, without a restart.
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
