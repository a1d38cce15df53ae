//! The cloud controller as its chart installs it: two replicas in pods on the
//! real nodes under restricted Pod Security, acting with its ServiceAccount's
//! RBAC only, reaching moto from the pod network. A bucket is made as
//! specified, its connection Secret published, and it is removed again when
//! the object is deleted (policy Delete).

use std::time::Duration;

use cairn_api::cloud::v1alpha1::{EXTERNAL_NAME_ANNOTATION, ObjectBucket, ProviderConfig};
use cairn_e2e::real::{
    controller_serves_metrics_from_its_pods, enforce_restricted_pod_security, install_chart,
};
use cairn_testing::{TestNamespace, cluster, s3, wait};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

const CHART: &str = "cairn-cloud-controller";
/// The tag the controller puts on what it creates: its object's UID.
const OWNER_TAG: &str = "cairn.dev/owner-uid";
const TIMEOUT: Duration = Duration::from_secs(90);

#[tokio::test]
async fn the_chart_runs_the_cloud_controller_in_pods() -> Result {
    let ns = cluster().namespace_on_real_nodes("cloud").await?;
    enforce_restricted_pod_security(&ns).await?;
    install_chart(&ns, CHART).await?;
    controller_serves_metrics_from_its_pods(&ns, CHART).await?;
    provider(&ns).await?;

    let buckets = ns.api::<ObjectBucket>();
    let object: ObjectBucket = serde_json::from_value(json!({
        "apiVersion": "cloud.cairn.dev/v1alpha1", "kind": "ObjectBucket",
        "metadata": { "name": "backups" },
        "spec": {
            "providerConfigRef": { "name": "moto" },
            "versioning": true,
            "deletionPolicy": "Delete",
            "writeConnectionSecretToRef": { "name": "backups-bucket" },
        },
    }))?;
    buckets.create(&PostParams::default(), &object).await?;
    let ready = wait::for_object(&buckets, "backups", "Ready=True", TIMEOUT, |b| {
        b.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
    })
    .await?;
    let name = ready
        .annotations()
        .get(EXTERNAL_NAME_ANNOTATION)
        .cloned()
        .ok_or("no external name")?;

    let s3 = s3::client(cluster().s3_endpoint());
    // Made by this object: tagged with its UID.
    let tags = s3.get_bucket_tagging().bucket(&name).send().await?.tag_set;
    assert!(
        tags.iter()
            .any(|t| t.key == OWNER_TAG && Some(t.value.as_str()) == ready.uid().as_deref()),
        "{name} is not tagged with its owner: {tags:?}"
    );
    let connection = ns.api::<Secret>().get("backups-bucket").await?;
    let bucket_key = connection
        .data
        .as_ref()
        .and_then(|d| d.get("bucket"))
        .map(|v| String::from_utf8_lossy(&v.0).into_owned());
    assert_eq!(bucket_key.as_deref(), Some(name.as_str()));

    buckets.delete("backups", &DeleteParams::default()).await?;
    wait::for_deletion(&buckets, "backups", TIMEOUT).await?;
    assert!(
        s3.head_bucket().bucket(&name).send().await.is_err(),
        "{name} is still in moto after its object was deleted"
    );
    Ok(())
}

/// ProviderConfig `moto`: the local cluster's moto, its dummy credentials.
async fn provider(ns: &TestNamespace) -> Result {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "moto-credentials" },
        "stringData": { "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing" },
    }))?;
    ns.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await?;
    let config: ProviderConfig = serde_json::from_value(json!({
        "apiVersion": "cloud.cairn.dev/v1alpha1", "kind": "ProviderConfig",
        "metadata": { "name": "moto" },
        "spec": {
            "type": "aws", "region": "us-east-1", "endpoint": cluster().s3_endpoint(),
            "credentialsSecretRef": { "name": "moto-credentials" },
        },
    }))?;
    ns.api::<ProviderConfig>()
        .create(&PostParams::default(), &config)
        .await?;
    Ok(())
}
