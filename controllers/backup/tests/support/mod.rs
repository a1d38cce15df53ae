//! What the backup controller's test binaries share: the controller as a
//! process under its chart's RBAC, and the database side played by the
//! test (cluster `orders`, its pods, their membership Leases renewed with
//! the observed state an instance would write).
#![allow(dead_code)]

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_api::backup::v1::{Backup, BackupPhase};
use cairn_api::database::instance::{
    APP_NAME, BackupProgress, BackupProgressPhase, MEMBERSHIP_COMPONENT, OBSERVED_ANNOTATION,
    ObservedState,
};
use cairn_api::database::v1::DatabaseCluster;
use cairn_testing::process::ControllerProcess;
use cairn_testing::{Error, TestNamespace, cluster, crds, wait};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

pub type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

pub const CHART: &str = "cairn-backup-controller";
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// Where cluster `orders` of `ns` stores backups: a bucket of moto named
/// after the namespace.
pub fn destination(ns: &TestNamespace) -> String {
    format!("s3://{}/orders/", ns.name)
}

/// An S3 client of moto, where the test's buckets are.
pub fn s3() -> aws_sdk_s3::Client {
    cairn_testing::s3::client(cluster().s3_endpoint())
}

pub async fn controller(ns: &TestNamespace) -> std::result::Result<ControllerProcess, Error> {
    controller_as(ns, "backup", &[]).await
}

/// [`controller`] with its log named after `name` and `env` on top (a
/// Lease of its own, for a process that follows a killed one at once).
pub async fn controller_as(
    ns: &TestNamespace,
    name: &str,
    env: &[(&str, &str)],
) -> std::result::Result<ControllerProcess, Error> {
    let local = cluster();
    crds::install(&ns.client, &cairn_api::crds::for_chart(CHART)).await?;
    crds::install(
        &ns.client,
        &cairn_api::crds::for_chart("cairn-database-controller"),
    )
    .await?;
    let account = local
        .install_controller_rbac(CHART, "backup", &ns.name)
        .await?;
    let kubeconfig = local.service_account_kubeconfig(&ns.name, &account)?;
    let mut all_env = vec![
        ("CAIRN_NAMESPACES", ns.name.as_str()),
        ("CAIRN_LEASE_NAMESPACE", ns.name.as_str()),
    ];
    all_env.extend_from_slice(env);
    ControllerProcess::start(
        local,
        Path::new(env!("CARGO_BIN_EXE_cairn-backup-controller")),
        &format!("{}-{name}", ns.name),
        &kubeconfig,
        &all_env,
    )
}

/// What each instance reports, as the test sets it.
pub type Reports = Arc<Mutex<Vec<(String, ObservedState)>>>;

/// Cluster `orders` with a backup destination (moto's bucket `ns.name` and
/// a credentials Secret `s3`), pods `orders-0` (primary)
/// and `orders-1` (standby), and their Leases renewed every second with
/// `reports` until the returned task is dropped.
pub async fn database_side(ns: &TestNamespace) -> Result<(Reports, tokio::task::JoinHandle<()>)> {
    database_side_completing(ns, false).await
}

/// [`database_side`]; with `complete`, the standby also reports every
/// Backup assigned to it Completed at its next heartbeat, as a fast
/// instance would.
pub async fn database_side_completing(
    ns: &TestNamespace,
    complete: bool,
) -> Result<(Reports, tokio::task::JoinHandle<()>)> {
    let post = PostParams::default();
    s3().create_bucket().bucket(&ns.name).send().await?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "s3" },
        "stringData": { "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing" },
    }))?;
    ns.api::<Secret>().create(&post, &secret).await?;
    let database: DatabaseCluster = serde_json::from_value(json!({
        "apiVersion": "database.cairn.dev/v1", "kind": "DatabaseCluster",
        "metadata": { "name": "orders" },
        "spec": { "instances": 2, "postgres": { "version": "17" }, "storage": { "size": "1Gi" },
                  "backup": { "destination": { "s3": {
                      "endpoint": cluster().s3_endpoint(), "bucket": ns.name,
                      "credentialsSecret": { "name": "s3" } } } } },
    }))?;
    ns.api::<DatabaseCluster>().create(&post, &database).await?;
    let labels = json!({
        "app.kubernetes.io/managed-by": "cairn", "app.kubernetes.io/name": APP_NAME,
        "app.kubernetes.io/instance": "orders",
    });
    let mut reports = Vec::new();
    for (pod, role) in [("orders-0", "primary"), ("orders-1", "replica")] {
        create_pod(ns, pod).await?;
        let mut lease_labels = labels.clone();
        lease_labels["app.kubernetes.io/component"] = json!(MEMBERSHIP_COMPONENT);
        let lease: Lease = serde_json::from_value(json!({
            "metadata": { "name": pod, "labels": lease_labels },
        }))?;
        ns.api::<Lease>().create(&post, &lease).await?;
        reports.push((
            pod.to_owned(),
            ObservedState {
                ready: true,
                role: Some(role.into()),
                wal_position: Some("0/3000000".into()),
                backup_destination: Some(destination(ns)),
                ..ObservedState::default()
            },
        ));
    }
    let reports: Reports = Arc::new(Mutex::new(reports));
    let renewing = reports.clone();
    let leases = ns.api::<Lease>();
    let backups = ns.api::<Backup>();
    let heartbeat = tokio::spawn(async move {
        loop {
            if complete
                && let Ok(list) = backups.list(&ListParams::default()).await
                && let Some(assigned) = list.items.iter().find(|b| {
                    b.status.as_ref().is_some_and(|s| {
                        s.phase == Some(BackupPhase::Running)
                            && s.instance.as_deref() == Some("orders-1")
                    })
                })
            {
                report(&renewing, "orders-1", completed(assigned));
            }
            let now: Vec<_> = renewing.lock().expect("reports").clone();
            for (pod, observed) in now {
                let patch = json!({
                    "metadata": { "annotations": { OBSERVED_ANNOTATION: serde_json::to_string(&observed).expect("json") } },
                    "spec": { "holderIdentity": pod, "renewTime": MicroTime(Timestamp::now()) },
                });
                let _ = leases
                    .patch(&pod, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    Ok((reports, heartbeat))
}

pub async fn create_pod(ns: &TestNamespace, name: &str) -> Result<Pod> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": name, "labels": {
            "app.kubernetes.io/managed-by": "cairn", "app.kubernetes.io/name": APP_NAME,
            "app.kubernetes.io/instance": "orders" } },
        "spec": { "containers": [{ "name": "postgres", "image": "postgres:17" }] },
    }))?;
    Ok(ns.api::<Pod>().create(&PostParams::default(), &pod).await?)
}

/// A report of `backup` Completed.
pub fn completed(backup: &Backup) -> BackupProgress {
    let id = format!("{}-1234abcd", backup.name_any());
    let bucket = backup.namespace().unwrap_or_default();
    BackupProgress {
        name: backup.name_any(),
        uid: backup.uid().unwrap_or_default(),
        phase: BackupProgressPhase::Completed,
        location: Some(format!("s3://{bucket}/orders/base/{id}/")),
        id,
        timeline: Some(1),
        begin_lsn: Some("0/2000028".into()),
        end_lsn: Some("0/2000138".into()),
        stored_bytes: 6_543_210,
        duration_milliseconds: Some(4_250),
        error: None,
    }
}

pub fn report(reports: &Reports, pod: &str, progress: BackupProgress) {
    let mut reports = reports.lock().expect("reports");
    if let Some((_, observed)) = reports.iter_mut().find(|(p, _)| p == pod) {
        observed.backup = Some(progress);
    }
}

pub async fn create_backup(
    ns: &TestNamespace,
    name: &str,
    spec: serde_json::Value,
) -> Result<Backup> {
    let mut full = json!({ "cluster": { "name": "orders" }, "method": "physical" });
    if let (Some(full), Some(extra)) = (full.as_object_mut(), spec.as_object()) {
        full.extend(extra.clone());
    }
    let backup: Backup = serde_json::from_value(json!({
        "apiVersion": "backup.cairn.dev/v1", "kind": "Backup",
        "metadata": { "name": name }, "spec": full,
    }))?;
    Ok(ns
        .api::<Backup>()
        .create(&PostParams::default(), &backup)
        .await?)
}

pub async fn until_phase(ns: &TestNamespace, name: &str, phase: BackupPhase) -> Result<Backup> {
    Ok(wait::for_object(
        &ns.api::<Backup>(),
        name,
        &format!("Backup {name} {phase:?}"),
        TIMEOUT,
        |b: &Backup| b.status.as_ref().and_then(|s| s.phase) == Some(phase),
    )
    .await?)
}

pub fn ready_reason(backup: &Backup) -> String {
    backup
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.reason.clone())
        .unwrap_or_default()
}

/// No change of Backup `name` for `quiet`, as a watch sees it.
pub async fn unchanged_for(ns: &TestNamespace, name: &str, quiet: Duration) -> Result {
    let backups = ns.api::<Backup>();
    let version = backups
        .get(name)
        .await?
        .resource_version()
        .unwrap_or_default();
    let params = WatchParams::default().fields(&format!("metadata.name={name}"));
    let mut events = backups.watch(&params, &version).await?.boxed();
    let deadline = tokio::time::sleep(quiet);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            () = &mut deadline => return Ok(()),
            event = events.next() => match event {
                Some(Ok(WatchEvent::Bookmark(_))) => {}
                Some(Ok(WatchEvent::Modified(b))) => return Err(format!("Backup {name} written again: {:?}", b.status).into()),
                Some(other) => return Err(format!("watch: {other:?}").into()),
                None => return Err("the watch ended".into()),
            },
        }
    }
}
