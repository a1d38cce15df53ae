//! Self-managed webhook certificates: the pair lives in a Secret (created once,
//! shared by every replica), the CA is injected into the CRD's caBundle, and
//! the API server's conversions go through.

use cairn_runtime::certs;
use cairn_testing::cluster;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, WebhookClientConfig,
};
use kube::api::DynamicObject;
use kube::{Api, ResourceExt};

type Result = std::result::Result<(), Box<dyn std::error::Error>>;

const CRD: &str = "databaseclusters.database.cairn.dev";

#[tokio::test]
async fn conversions_work_with_certificates_the_controller_made() -> Result {
    let ns = cluster().namespace("webhook-certs").await?;
    let pair = certs::ensure(ns.client.clone(), &ns.name, "webhook-cert", &["127.0.0.1"]).await?;
    // A second replica gets the same pair instead of making its own.
    let again = certs::ensure(ns.client.clone(), &ns.name, "webhook-cert", &["127.0.0.1"]).await?;
    assert_eq!(pair, again);

    let router = cairn_database_controller::webhook::router(
        cairn_runtime::metrics::Metrics::new("database", "0.0.0", "test")
            .expect("metrics register"),
    );
    let server = cairn_runtime::webhook::start_with_pem(
        ([127, 0, 0, 1], 0).into(),
        router,
        &pair.cert,
        &pair.key,
    )
    .await?;
    let crd = cairn_api::crds::database_cluster_with_conversion(WebhookClientConfig {
        url: Some(format!("https://{}/convert", server.address)),
        ca_bundle: None,
        service: None,
    });
    cairn_testing::crds::install(&ns.client, &[crd]).await?;
    certs::inject_ca_bundle(ns.client.clone(), &[CRD], &pair.ca, None).await?;
    let crds = Api::<CustomResourceDefinition>::all(ns.client.clone());
    let version = crds.get(CRD).await?.resource_version();
    // Injecting the same CA again writes nothing.
    certs::inject_ca_bundle(ns.client.clone(), &[CRD], &pair.ca, None).await?;
    assert_eq!(crds.get(CRD).await?.resource_version(), version);

    let old = Api::<DynamicObject>::namespaced_with(
        ns.client.clone(),
        &ns.name,
        &cairn_e2e::database_cluster("v1alpha1"),
    );
    cairn_e2e::create_v1alpha1_cluster(
        &old,
        "a conversion through the self-managed certificate",
        "self-managed",
        2,
        "17",
        "1Gi",
    )
    .await?;
    let read_back = old.get("self-managed").await?;
    assert_eq!(read_back.data["spec"]["size"], 2);
    server.shutdown();
    Ok(())
}
