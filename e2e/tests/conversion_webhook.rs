//! DatabaseCluster v1alpha1 ↔ v1 through the API server and a real conversion
//! webhook: the CRD points at an HTTPS server that mounts the api crate's
//! `ConversionReview` handler.

use cairn_api::database::conversion;
use cairn_testing::{cluster, https};
use k8s_openapi::ByteString;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, WebhookClientConfig,
};
use kube::Api;
use kube::api::{DynamicObject, PostParams};
use serde_json::{Value, json};

type Result = std::result::Result<(), Box<dyn std::error::Error>>;

fn object(value: Value) -> DynamicObject {
    serde_json::from_value(value).expect("a valid object")
}

#[tokio::test]
async fn objects_read_the_same_in_both_versions_through_the_webhook() -> Result {
    let server = https::serve(cairn_database_controller::webhook::router(
        cairn_runtime::metrics::Metrics::new("database", "0.0.0", "test")
            .expect("metrics register"),
    ))
    .await?;
    let ns = cluster().namespace("conversion").await?;
    let crd = cairn_api::crds::database_cluster_with_conversion(WebhookClientConfig {
        url: Some(format!("{}/convert", server.url)),
        ca_bundle: Some(ByteString(server.ca_pem.clone().into_bytes())),
        service: None,
    });
    cairn_testing::crds::install(&ns.client, &[crd]).await?;
    let old = Api::<DynamicObject>::namespaced_with(
        ns.client.clone(),
        &ns.name,
        &cairn_e2e::database_cluster("v1alpha1"),
    );
    let new = Api::<DynamicObject>::namespaced_with(
        ns.client.clone(),
        &ns.name,
        &cairn_e2e::database_cluster("v1"),
    );

    // Created as v1alpha1, read as v1. The API server may route the first
    // requests to the old CRD definition for a moment: retry the create.
    cairn_e2e::create_v1alpha1_cluster(
        &old,
        "a v1alpha1 create to be converted",
        "legacy",
        3,
        "16",
        "5Gi",
    )
    .await?;
    let as_v1 = new.get("legacy").await?;
    assert_eq!(as_v1.data["spec"]["instances"], 3);
    assert_eq!(as_v1.data["spec"]["postgres"]["version"], "16");
    assert_eq!(as_v1.data["spec"]["storage"]["size"], "5Gi");

    // Created as v1 with fields v1alpha1 lacks, read as v1alpha1.
    let modern = object(json!({
        "apiVersion": "database.cairn.dev/v1", "kind": "DatabaseCluster",
        "metadata": { "name": "modern" },
        "spec": {
            "instances": 2,
            "postgres": { "version": "17", "parameters": { "work_mem": "64MB" } },
            "storage": { "size": "10Gi", "storageClassName": "standard" },
            "bootstrap": { "initdb": { "database": "app", "owner": "app" } }
        }
    }));
    new.create(&PostParams::default(), &modern).await?;
    let mut as_v1alpha1 = old.get("modern").await?;
    assert_eq!(
        as_v1alpha1.data["spec"],
        json!({ "size": 2, "version": "17", "storageSize": "10Gi" })
    );
    assert!(
        as_v1alpha1
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(conversion::SPEC_ANNOTATION))
    );

    // A change made through v1alpha1 keeps the fields only v1 has.
    as_v1alpha1.data["spec"]["size"] = json!(4);
    old.replace("modern", &PostParams::default(), &as_v1alpha1)
        .await?;
    let stored = new.get("modern").await?;
    assert_eq!(stored.data["spec"]["instances"], 4);
    assert_eq!(
        stored.data["spec"]["postgres"]["parameters"]["work_mem"],
        "64MB"
    );
    assert_eq!(
        stored.data["spec"]["storage"]["storageClassName"],
        "standard"
    );
    assert_eq!(stored.data["spec"]["bootstrap"]["initdb"]["owner"], "app");
    let annotations = stored.metadata.annotations.unwrap_or_default();
    assert!(
        !annotations.contains_key(conversion::SPEC_ANNOTATION),
        "{annotations:?}"
    );

    // v1's transition rules hold through v1alpha1 too.
    for (field, value, message) in [
        (
            "storageSize",
            json!("1Gi"),
            "spec.storageSize cannot shrink",
        ),
        ("version", json!("16"), "the major version cannot change"),
    ] {
        let mut changed = old.get("modern").await?;
        changed.data["spec"][field] = value;
        match old
            .replace("modern", &PostParams::default(), &changed)
            .await
        {
            Err(kube::Error::Api(status)) => {
                assert!(status.message.contains(message), "{}", status.message)
            }
            other => panic!("changing {field} through v1alpha1 must be rejected, got {other:?}"),
        }
    }

    // Another test installing the v1-only form the tests use leaves v1alpha1
    // served through this webhook (the lanes share the CRD).
    cairn_testing::crds::install(
        &ns.client,
        &cairn_api::crds::for_chart("cairn-database-controller"),
    )
    .await?;
    let crd = Api::<CustomResourceDefinition>::all(ns.client.clone())
        .get("databaseclusters.database.cairn.dev")
        .await?;
    let mut served: Vec<_> = crd.spec.versions.iter().map(|v| v.name.as_str()).collect();
    served.sort();
    assert_eq!(served, ["v1", "v1alpha1"]);
    let webhook = crd.spec.conversion.and_then(|c| c.webhook);
    let url = webhook.and_then(|w| w.client_config).and_then(|c| c.url);
    assert_eq!(url, Some(format!("{}/convert", server.url)));

    // Clients of the deprecated version are told so.
    let listed = cluster()
        .kubectl(&[
            "get",
            "databaseclusters.v1alpha1.database.cairn.dev",
            "-n",
            &ns.name,
        ])
        .await?;
    let warning =
        "database.cairn.dev/v1alpha1 DatabaseCluster is deprecated; use database.cairn.dev/v1";
    assert!(
        listed.stderr.contains(warning),
        "no deprecation warning in: {}",
        listed.stderr
    );
    assert!(listed.stdout.contains("modern"), "{}", listed.stdout);
    Ok(())
}
