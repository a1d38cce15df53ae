//! The backup controller as a process under its chart's RBAC, against the
//! local cluster. The test plays the database side: the pods of cluster
//! `orders` and their membership Leases, renewed every second with the
//! observed state an instance would write (the instances themselves, taking
//! real backups, are tested in cairn-instance's tests and on the real
//! nodes). Checked: which instance gets a Backup, the status copied from the
//! instance's report, a lost instance failing it with a reason, and nothing
//! written once a Backup is final (a passed deadline is the plan's unit
//! tests': a decision on the clock alone).

mod support;

use std::time::Duration;

use cairn_api::backup::v1::BackupPhase;
use cairn_api::database::instance::{BackupProgress, BackupProgressPhase};
use cairn_testing::{cluster, wait};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::DeleteParams;
use serde_json::json;
use support::{
    Result, TIMEOUT, controller, create_backup, create_pod, database_side, ready_reason, report,
    unchanged_for, until_phase,
};

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
            location: Some(format!(
                "{}base/nightly-1234abcd/",
                support::destination(&ns)
            )),
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

    // A Backup taken and never finished fails at its deadline: a decision
    // on the clock alone, tested without waiting one out
    // (plan::tests::past_its_deadline_a_backup_fails_unless_its_instance_finished
    // and the recheck that wakes the controller at the deadline).

    // A logical backup goes to the standby too (pg_dump from a replica).
    create_backup(&ns, "dump", json!({ "method": "logical" })).await?;
    let running = until_phase(&ns, "dump", BackupPhase::Running).await?;
    let instance = running.status.and_then(|s| s.instance);
    assert_eq!(instance.as_deref(), Some("orders-1"));
    Ok(())
}
