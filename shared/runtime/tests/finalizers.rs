//! Finalizers hold an object back from deletion until the controller removes
//! them, and the helpers write only when the list must change.

use std::time::Duration;

use cairn_runtime::finalizers;
use cairn_testing::{cluster, wait};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

type Result = std::result::Result<(), Box<dyn std::error::Error>>;

const FINALIZER: &str = "cloud.cairn.dev/external-resource";

#[tokio::test]
async fn a_finalizer_holds_deletion_until_removed() -> Result {
    let ns = cluster().namespace("finalizers").await?;
    ns.create_service_account("controller").await?;
    ns.grant(
        "controller",
        "configmaps",
        &["get", "create", "patch", "delete"],
    )
    .await?;
    let api =
        Api::<ConfigMap>::namespaced(ns.client_as_service_account("controller").await?, &ns.name);
    let object: ConfigMap = serde_json::from_value(json!({
        "metadata": { "name": "bucket", "finalizers": ["someone.else/keep"] }
    }))?;
    let created = api.create(&PostParams::default(), &object).await?;

    assert!(
        finalizers::add(&api, &created, FINALIZER).await?,
        "first add writes"
    );
    let held = api.get("bucket").await?;
    assert_eq!(held.finalizers(), ["someone.else/keep", FINALIZER]);
    assert!(
        !finalizers::add(&api, &held, FINALIZER).await?,
        "present: no write"
    );

    // A stale copy cannot clobber a list that changed meanwhile.
    let stale = created.clone();
    let error = finalizers::add(&api, &stale, "other.cairn.dev/x").await;
    assert!(error.is_err(), "the test operation rejects a stale list");

    api.delete("bucket", &DeleteParams::default()).await?;
    let deleting = api.get("bucket").await?;
    assert!(deleting.metadata.deletion_timestamp.is_some(), "held back");
    assert!(finalizers::remove(&api, &deleting, FINALIZER).await?);
    let remaining = api.get("bucket").await?;
    assert_eq!(remaining.finalizers(), ["someone.else/keep"]);
    assert!(
        !finalizers::remove(&api, &remaining, FINALIZER).await?,
        "absent: no write"
    );

    // The other finalizer gone too, the API server completes the deletion.
    ns.api::<ConfigMap>()
        .patch(
            "bucket",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({ "metadata": { "finalizers": null } })),
        )
        .await?;
    wait::for_deletion(&api, "bucket", Duration::from_secs(10)).await?;
    Ok(())
}
