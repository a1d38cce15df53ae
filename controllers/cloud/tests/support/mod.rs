//! What the cloud controller's test binaries share: the controller as a
//! process under its chart's RBAC, a ProviderConfig for moto, ObjectBuckets
//! and waits on their conditions.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use cairn_api::cloud::v1alpha1::{DnsRecord, ObjectBucket, ProviderConfig};
use cairn_testing::process::ControllerProcess;
use cairn_testing::{Error, TestNamespace, cluster, crds, s3, wait};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

pub type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

pub const CHART: &str = "cairn-cloud-controller";
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// The chart's CRDs, before a test or a controller uses their kinds: a test
/// binary may be the first on the cluster to need them.
async fn install_crds(namespace: &TestNamespace) -> std::result::Result<(), Error> {
    crds::install(&namespace.client, &cairn_api::crds::for_chart(CHART)).await
}

/// The controller binary with its chart's RBAC, watching `namespace`, its
/// ServiceAccount and Lease there too.
pub async fn controller(
    namespace: &TestNamespace,
) -> std::result::Result<ControllerProcess, Error> {
    controller_as(namespace, "cloud", &[]).await
}

/// [`controller`] with its log named after `name` and `env` on top (e.g.
/// a Lease of its own, for a process that follows a killed one at once).
pub async fn controller_as(
    namespace: &TestNamespace,
    name: &str,
    env: &[(&str, &str)],
) -> std::result::Result<ControllerProcess, Error> {
    let local = cluster();
    install_crds(namespace).await?;
    let account = local
        .install_controller_rbac(CHART, "cloud", &namespace.name)
        .await?;
    let kubeconfig = local.service_account_kubeconfig(&namespace.name, &account)?;
    let mut all_env = vec![
        ("CAIRN_NAMESPACES", namespace.name.as_str()),
        ("CAIRN_LEASE_NAMESPACE", namespace.name.as_str()),
    ];
    all_env.extend_from_slice(env);
    ControllerProcess::start(
        local,
        Path::new(env!("CARGO_BIN_EXE_cairn-cloud-controller")),
        &format!("{}-{name}", namespace.name),
        &kubeconfig,
        &all_env,
    )
}

/// The controller binary with its chart's default, cluster-wide RBAC (a
/// ClusterRoleBinding, left behind), its ServiceAccount and Lease in `home`,
/// watching only `watched`, which a test may delete whole: a RoleBinding in
/// `watched` would go with it, and the controller's access too.
pub async fn controller_watching(
    home: &TestNamespace,
    watched: &TestNamespace,
) -> std::result::Result<ControllerProcess, Error> {
    let local = cluster();
    install_crds(home).await?;
    let release = format!("{}-cloud", home.name);
    let account = local
        .install_controller_rbac_watching(CHART, &release, &home.name, "")
        .await?;
    let kubeconfig = local.service_account_kubeconfig(&home.name, &account)?;
    ControllerProcess::start(
        local,
        Path::new(env!("CARGO_BIN_EXE_cairn-cloud-controller")),
        &format!("{}-cloud", watched.name),
        &kubeconfig,
        &[
            ("CAIRN_NAMESPACES", watched.name.as_str()),
            ("CAIRN_LEASE_NAMESPACE", home.name.as_str()),
        ],
    )
}

/// A ProviderConfig `moto` for the local cluster's moto, and its Secret.
pub async fn provider(namespace: &TestNamespace) -> Result {
    provider_at(namespace, cluster().s3_endpoint(), None).await
}

/// A ProviderConfig `moto` reaching moto at `endpoint` (a fault proxy in
/// front of it), with `rate_limit` if given, and its Secret.
pub async fn provider_at(
    namespace: &TestNamespace,
    endpoint: &str,
    rate_limit: Option<serde_json::Value>,
) -> Result {
    install_crds(namespace).await?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "moto-credentials" },
        "stringData": { "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing" },
    }))?;
    namespace
        .api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await?;
    let mut spec = json!({
        "type": "aws", "region": "us-east-1", "endpoint": endpoint,
        "credentialsSecretRef": { "name": "moto-credentials" },
    });
    if let Some(rate_limit) = rate_limit {
        spec["rateLimit"] = rate_limit;
    }
    let config: ProviderConfig = serde_json::from_value(json!({
        "apiVersion": "cloud.cairn.dev/v1alpha1", "kind": "ProviderConfig",
        "metadata": { "name": "moto" },
        "spec": spec,
    }))?;
    namespace
        .api::<ProviderConfig>()
        .create(&PostParams::default(), &config)
        .await?;
    Ok(())
}

pub fn bucket(name: &str, spec: serde_json::Value) -> Result<ObjectBucket> {
    let mut object = json!({
        "apiVersion": "cloud.cairn.dev/v1alpha1", "kind": "ObjectBucket",
        "metadata": { "name": name, "annotations": { "cloud.cairn.dev/poll-seconds": "10" } },
        "spec": { "providerConfigRef": { "name": "moto" }, "deletionPolicy": "Delete" },
    });
    if let (Some(base), Some(extra)) = (object["spec"].as_object_mut(), spec.as_object()) {
        base.extend(extra.clone());
    }
    Ok(serde_json::from_value(object)?)
}

pub async fn until_condition(
    api: &Api<ObjectBucket>,
    name: &str,
    type_: &str,
    status: &str,
    reason: Option<&str>,
) -> std::result::Result<ObjectBucket, Error> {
    let what = format!("{type_}={status} {}", reason.unwrap_or(""));
    wait::for_object(api, name, &what, TIMEOUT, |b| {
        let condition = b
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_));
        condition.is_some_and(|c| c.status == status && reason.is_none_or(|r| c.reason == r))
    })
    .await
}

pub async fn exists(name: &str) -> Result<bool> {
    let s3 = s3::client(cluster().s3_endpoint());
    match s3.head_bucket().bucket(name).send().await {
        Ok(_) => Ok(true),
        Err(e) if e.raw_response().is_some_and(|r| r.status().as_u16() == 404) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// A Route53 client for the local cluster's moto.
pub fn route53() -> aws_sdk_route53::Client {
    cairn_testing::s3::route53(cluster().s3_endpoint())
}

/// The values of record set `name`/`type_` in `zone_id`, sorted; empty if
/// there is none.
pub async fn record_values(
    route53: &aws_sdk_route53::Client,
    zone_id: &str,
    name: &str,
    type_: &str,
) -> Result<Vec<String>> {
    let sets = route53
        .list_resource_record_sets()
        .hosted_zone_id(zone_id)
        .send()
        .await?;
    let mut values: Vec<String> = sets
        .resource_record_sets()
        .iter()
        .filter(|s| s.name().trim_end_matches('.') == name && s.r#type().as_str() == type_)
        .flat_map(|s| s.resource_records().iter().map(|r| r.value().to_owned()))
        .collect();
    values.sort();
    Ok(values)
}

/// A DnsRecord of ProviderConfig `moto`, type A, TTL 60, polled every 10 s,
/// with `spec` on top.
pub fn record(name: &str, spec: serde_json::Value) -> Result<DnsRecord> {
    let mut object = json!({
        "apiVersion": "cloud.cairn.dev/v1alpha1", "kind": "DnsRecord",
        "metadata": { "name": name, "annotations": { "cloud.cairn.dev/poll-seconds": "10" } },
        "spec": { "providerConfigRef": { "name": "moto" }, "type": "A", "ttl": 60 },
    });
    if let (Some(base), Some(extra)) = (object["spec"].as_object_mut(), spec.as_object()) {
        base.extend(extra.clone());
    }
    Ok(serde_json::from_value(object)?)
}

/// A hosted zone `<namespace>.cairn.test` made in moto: its domain and id.
pub async fn hosted_zone(
    route53: &aws_sdk_route53::Client,
    namespace: &TestNamespace,
) -> Result<(String, String)> {
    let zone = format!("{}.cairn.test", namespace.name);
    let zone_id = route53
        .create_hosted_zone()
        .name(&zone)
        .caller_reference(&namespace.name)
        .send()
        .await?
        .hosted_zone()
        .map(|z| z.id().to_owned())
        .ok_or("no hosted zone id")?;
    Ok((zone, zone_id))
}

/// Deletes the namespace's DnsRecords, then ObjectBuckets, then
/// ProviderConfigs, waiting until each kind is gone. Called at the end of a
/// test while its controller (and fault proxy) still run: their finalizers
/// need the controller, and a namespace deleted after it stopped would
/// stay Terminating, its objects left for the next controller to finish.
pub async fn tear_down(namespace: &TestNamespace) -> Result {
    wait::for_all_deleted(&namespace.api::<DnsRecord>(), TIMEOUT * 2).await?;
    wait::for_all_deleted(&namespace.api::<ObjectBucket>(), TIMEOUT * 2).await?;
    wait::for_all_deleted(&namespace.api::<ProviderConfig>(), TIMEOUT).await?;
    Ok(())
}
