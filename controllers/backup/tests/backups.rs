//! The backup controller as a process under its chart's RBAC, against the
//! local cluster. The test plays the database side: the pods of cluster
//! `orders` and their membership Leases, renewed every second with the
//! observed state an instance would write (the instances themselves, taking
//! real backups, are tested in cairn-instance's tests and on the real
//! nodes). Checked: which instance gets a Backup, the status copied from the
//! instance's report, a lost instance and a passed deadline failing it with
//! a reason, refusals, and nothing written once a Backup is final.

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
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

const CHART: &str = "cairn-backup-controller";
const TIMEOUT: Duration = Duration::from_secs(60);
const DESTINATION: &str = "s3://backups/orders/";

async fn controller(ns: &TestNamespace) -> std::result::Result<ControllerProcess, Error> {
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
    ControllerProcess::start(
        local,
        Path::new(env!("CARGO_BIN_EXE_cairn-backup-controller")),
        &format!("{}-backup", ns.name),
        &kubeconfig,
        &[
            ("CAIRN_NAMESPACES", ns.name.as_str()),
            ("CAIRN_LEASE_NAMESPACE", ns.name.as_str()),
        ],
    )
}

/// What each instance reports, as the test sets it.
type Reports = Arc<Mutex<Vec<(String, ObservedState)>>>;

/// Cluster `orders` with a backup destination, pods `orders-0` (primary)
/// and `orders-1` (standby), and their Leases renewed every second with
/// `reports` until the returned task is dropped.
async fn database_side(ns: &TestNamespace) -> Result<(Reports, tokio::task::JoinHandle<()>)> {
    let post = PostParams::default();
    let database: DatabaseCluster = serde_json::from_value(json!({
        "apiVersion": "database.cairn.dev/v1", "kind": "DatabaseCluster",
        "metadata": { "name": "orders" },
        "spec": { "instances": 2, "postgres": { "version": "17" }, "storage": { "size": "1Gi" },
                  "backup": { "destination": { "s3": { "bucket": "backups", "credentialsSecret": { "name": "s3" } } } } },
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
                backup_destination: Some(DESTINATION.into()),
                ..ObservedState::default()
            },
        ));
    }
    let reports: Reports = Arc::new(Mutex::new(reports));
    let renewing = reports.clone();
    let leases = ns.api::<Lease>();
    let heartbeat = tokio::spawn(async move {
        loop {
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

async fn create_pod(ns: &TestNamespace, name: &str) -> Result<Pod> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": name, "labels": {
            "app.kubernetes.io/managed-by": "cairn", "app.kubernetes.io/name": APP_NAME,
            "app.kubernetes.io/instance": "orders" } },
        "spec": { "containers": [{ "name": "postgres", "image": "postgres:17" }] },
    }))?;
    Ok(ns.api::<Pod>().create(&PostParams::default(), &pod).await?)
}

fn report(reports: &Reports, pod: &str, progress: BackupProgress) {
    let mut reports = reports.lock().expect("reports");
    if let Some((_, observed)) = reports.iter_mut().find(|(p, _)| p == pod) {
        observed.backup = Some(progress);
    }
}

async fn create_backup(ns: &TestNamespace, name: &str, spec: serde_json::Value) -> Result<Backup> {
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

async fn until_phase(ns: &TestNamespace, name: &str, phase: BackupPhase) -> Result<Backup> {
    Ok(wait::for_object(
        &ns.api::<Backup>(),
        name,
        &format!("Backup {name} {phase:?}"),
        TIMEOUT,
        |b: &Backup| b.status.as_ref().and_then(|s| s.phase) == Some(phase),
    )
    .await?)
}

fn ready_reason(backup: &Backup) -> String {
    backup
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.reason.clone())
        .unwrap_or_default()
}

/// No change of Backup `name` for `quiet`, as a watch sees it.
async fn unchanged_for(ns: &TestNamespace, name: &str, quiet: Duration) -> Result {
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

#[tokio::test]
async fn a_standby_takes_the_backup_and_its_report_completes_it() -> Result {
    let ns = cluster().namespace("backup-controller").await?;
    let _controller = controller(&ns).await?;
    let (reports, _heartbeat) = database_side(&ns).await?;

    let backup = create_backup(&ns, "nightly", json!({})).await?;
    let running = until_phase(&ns, "nightly", BackupPhase::Running).await?;
    let status = running.status.clone().unwrap_or_default();
    assert_eq!(status.instance.as_deref(), Some("orders-1"), "the standby");
    let pod = ns.api::<Pod>().get("orders-1").await?;
    assert_eq!(status.instance_uid, pod.uid());
    assert!(status.started_at.is_some());

    report(
        &reports,
        "orders-1",
        BackupProgress {
            name: "nightly".into(),
            uid: backup.uid().unwrap_or_default(),
            phase: BackupProgressPhase::Completed,
            id: "nightly-1234abcd".into(),
            location: Some(format!("{DESTINATION}base/nightly-1234abcd/")),
            timeline: Some(1),
            begin_lsn: Some("0/2000028".into()),
            end_lsn: Some("0/2000138".into()),
            stored_bytes: 6_543_210,
            duration_milliseconds: Some(4_250),
            error: None,
        },
    );
    let completed = until_phase(&ns, "nightly", BackupPhase::Completed).await?;
    let status = completed.status.clone().unwrap_or_default();
    assert_eq!(status.backup_id.as_deref(), Some("nightly-1234abcd"));
    assert_eq!(status.end_lsn.as_deref(), Some("0/2000138"));
    assert_eq!(status.size_bytes, Some(6_543_210));
    assert_eq!(status.duration_seconds, Some(4.25));
    assert!(status.completed_at.is_some());
    assert_eq!(ready_reason(&completed), "Completed");
    // Final: the heartbeats go on, nothing is written.
    unchanged_for(&ns, "nightly", Duration::from_secs(12)).await?;
    Ok(())
}

#[tokio::test]
async fn a_backup_whose_instance_is_replaced_or_that_outlives_its_deadline_fails() -> Result {
    let ns = cluster().namespace("backup-controller-fail").await?;
    let _controller = controller(&ns).await?;
    let (reports, _heartbeat) = database_side(&ns).await?;

    // The instance's pod is replaced (same name, new uid) mid-backup.
    create_backup(&ns, "replaced", json!({})).await?;
    until_phase(&ns, "replaced", BackupPhase::Running).await?;
    ns.api::<Pod>()
        .delete("orders-1", &DeleteParams::default().grace_period(0))
        .await?;
    wait::for_deletion(&ns.api::<Pod>(), "orders-1", TIMEOUT).await?;
    create_pod(&ns, "orders-1").await?;
    let failed = until_phase(&ns, "replaced", BackupPhase::Failed).await?;
    assert_eq!(ready_reason(&failed), "InstanceLost");
    let error = failed.status.and_then(|s| s.error).unwrap_or_default();
    assert!(error.contains("orders-1"), "{error}");

    // The instance reports a failure: the Backup fails with its words.
    let backup = create_backup(&ns, "refused", json!({})).await?;
    until_phase(&ns, "refused", BackupPhase::Running).await?;
    report(
        &reports,
        "orders-1",
        BackupProgress {
            name: "refused".into(),
            uid: backup.uid().unwrap_or_default(),
            phase: BackupProgressPhase::Failed,
            id: "refused-0".into(),
            error: Some("pg_basebackup failed (exit code 1): could not connect".into()),
            ..BackupProgress::default()
        },
    );
    let failed = until_phase(&ns, "refused", BackupPhase::Failed).await?;
    assert_eq!(ready_reason(&failed), "BackupFailed");
    assert!(
        failed
            .status
            .and_then(|s| s.error)
            .unwrap_or_default()
            .contains("could not connect")
    );

    // Taken and never finished: Failed at its deadline (60 s, the least the
    // schema allows), not Running for ever.
    let started = std::time::Instant::now();
    create_backup(&ns, "stuck", json!({ "deadlineSeconds": 60 })).await?;
    until_phase(&ns, "stuck", BackupPhase::Running).await?;
    let failed = wait::for_object(
        &ns.api::<Backup>(),
        "stuck",
        "Backup stuck Failed",
        Duration::from_secs(90),
        |b: &Backup| b.status.as_ref().and_then(|s| s.phase) == Some(BackupPhase::Failed),
    )
    .await?;
    println!(
        "a stuck backup failed {:?} after its creation",
        started.elapsed()
    );
    assert_eq!(ready_reason(&failed), "DeadlineExceeded");
    assert!(started.elapsed() < Duration::from_secs(70));

    // What is not built is refused, never faked.
    create_backup(&ns, "dump", json!({ "method": "logical" })).await?;
    let refused = until_phase(&ns, "dump", BackupPhase::Failed).await?;
    assert_eq!(ready_reason(&refused), "MethodNotSupported");
    Ok(())
}
