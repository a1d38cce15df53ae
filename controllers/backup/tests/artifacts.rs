//! What a Backup's deletion does to the bucket (moto), with the controller
//! as a process under its chart's RBAC and the test playing the instances
//! (reports in their Leases) and writing the files an instance would: base
//! backups with their manifests, and WAL.
//!
//! Checked: `deletionPolicy: Delete` removes the backup's folder and then
//! the WAL no remaining backup needs, and nothing else; `Retain` removes
//! nothing; a Backup whose instance is still writing is held until it
//! stops; a bucket that is gone does not hold the deletion; a schedule
//! reports the recoverability window the bucket shows.

mod support;

use std::time::Duration;

use cairn_api::backup::layout::BASE_BACKUP_DATA;
use cairn_api::backup::v1::{ARTIFACT_FINALIZER, Backup, BackupPhase, BackupSchedule};
use cairn_api::database::instance::{BackupProgress, BackupProgressPhase};
use cairn_storage::{BackupId, BaseBackups, Manifest, S3Settings, WalArchive, WalName};
use cairn_testing::{TestNamespace, cluster, wait};
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::{
    Reports, Result, TIMEOUT, completed, controller, create_backup, database_side, report, s3,
    unchanged_for, until_phase,
};

#[tokio::test]
async fn a_deleted_backup_takes_its_files_and_only_the_wal_no_other_backup_needs() -> Result {
    let ns = cluster().namespace("backup-artifacts").await?;
    let controller = controller(&ns).await?;
    let (reports, _heartbeat) = database_side(&ns).await?;
    let settings = settings(&ns);

    // Two backups, the older one to be deleted: segments 2 and 5 begin them.
    let old = stored_backup(&ns, &reports, "old", "Delete", "0/2000028").await?;
    let new = stored_backup(&ns, &reports, "new", "Retain", "0/5000028").await?;
    assert!(old.finalizers().iter().any(|f| f == ARTIFACT_FINALIZER));
    assert!(new.finalizers().is_empty(), "Retain needs no finalizer");
    let dir = std::env::temp_dir().join(format!("cairn-artifacts-{}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir)?;
    let archive = WalArchive::new(&settings, "orders");
    for segment in 1..=6 {
        let name = WalName::parse(&format!("00000001000000000000000{segment}"))?;
        let path = dir.join(name.as_str());
        std::fs::write(&path, name.as_str())?;
        archive.put(&name, &path).await?;
    }
    std::fs::remove_dir_all(&dir)?;

    // A schedule reports the window the bucket shows: from the older
    // backup's end to the newest file stored.
    let schedule = create_schedule(&ns).await?;
    let window = |s: &BackupSchedule| {
        let status = s.status.clone().unwrap_or_default();
        (
            status.first_recoverability_point.map(|t| t.0.to_string()),
            status.last_recoverability_point.map(|t| t.0),
        )
    };
    let reported = wait::for_object(
        &ns.api::<BackupSchedule>(),
        &schedule,
        "a recoverability window",
        TIMEOUT,
        |s: &BackupSchedule| window(s).0.is_some(),
    )
    .await?;
    assert_eq!(window(&reported).0.as_deref(), Some(ended("old").as_str()));
    assert!(window(&reported).1 >= Some(ended("new").parse()?));
    // What the alerts read, per schedule (refreshed every 10 s): its health
    // and its window.
    let line = |metrics: &str, name: &str, with: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with(&format!("{name}{{"))
                    && l.contains(&format!("schedule=\"{schedule}\""))
                    && l.contains(with)
            })
            .map(str::to_owned)
    };
    let exported = wait::until("the schedule's metrics", TIMEOUT, || async {
        let metrics = controller.metrics().await.map_err(|e| e.to_string())?;
        Ok(
            line(&metrics, "cairn_backup_schedule_healthy", "reason=").zip(line(
                &metrics,
                "cairn_backup_schedule_timestamp_seconds",
                "time=\"first_recoverability_point\"",
            )),
        )
    })
    .await?;
    assert!(exported.0.ends_with(" 1"), "healthy: {}", exported.0);
    let first: i64 = ended("old")
        .parse::<k8s_openapi::jiff::Timestamp>()?
        .as_second();
    assert!(exported.1.ends_with(&format!(" {first}")), "{}", exported.1);

    // Delete: the folder goes, then WAL before segment 5 (the start of the
    // oldest backup left); the Retain backup and its WAL stay.
    ns.api::<Backup>()
        .delete("old", &DeleteParams::default())
        .await?;
    wait::for_deletion(&ns.api::<Backup>(), "old", TIMEOUT).await?;
    let base = BaseBackups::new(&settings, "orders");
    let catalog: Vec<String> = base.catalog().await?.into_iter().map(|m| m.id).collect();
    assert_eq!(catalog, [id(&new)?.to_string()]);
    let folder = format!("orders/base/{}/", id(&old)?);
    let left = cairn_testing::s3::keys(&s3(), &ns.name, &folder).await?;
    assert!(left.is_empty(), "{left:?}");
    let wal: Vec<String> = archive
        .list()
        .await?
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(
        wal,
        ["000000010000000000000005", "000000010000000000000006"]
    );
    // The window moves with it (a touch of the schedule makes it look).
    touch(&ns, &schedule).await?;
    wait::for_object(
        &ns.api::<BackupSchedule>(),
        &schedule,
        "the window after the deletion",
        TIMEOUT,
        |s: &BackupSchedule| window(s).0.as_deref() == Some(ended("new").as_str()),
    )
    .await?;

    // Retain: the object goes, the files stay.
    ns.api::<Backup>()
        .delete("new", &DeleteParams::default())
        .await?;
    wait::for_deletion(&ns.api::<Backup>(), "new", TIMEOUT).await?;
    assert_eq!(base.catalog().await?.len(), 1);

    // Deleted while its instance writes: held (nothing written, nothing
    // removed) until the instance reports it stopped.
    let cut = create_backup(&ns, "cut", json!({ "deletionPolicy": "Delete" })).await?;
    until_phase(&ns, "cut", BackupPhase::Running).await?;
    report(
        &reports,
        "orders-1",
        BackupProgress {
            name: "cut".into(),
            uid: cut.uid().unwrap_or_default(),
            phase: BackupProgressPhase::Running,
            ..BackupProgress::default()
        },
    );
    ns.api::<Backup>()
        .delete("cut", &DeleteParams::default())
        .await?;
    unchanged_for(&ns, "cut", Duration::from_secs(8)).await?;
    report(
        &reports,
        "orders-1",
        BackupProgress {
            name: "cut".into(),
            uid: cut.uid().unwrap_or_default(),
            phase: BackupProgressPhase::Failed,
            error: Some("the Backup was withdrawn".into()),
            ..BackupProgress::default()
        },
    );
    wait::for_deletion(&ns.api::<Backup>(), "cut", TIMEOUT).await?;

    // The bucket gone: nothing to remove, the deletion completes.
    stored_backup(&ns, &reports, "orphan", "Delete", "0/7000028").await?;
    cairn_testing::s3::delete_bucket(&s3(), &ns.name).await?;
    ns.api::<Backup>()
        .delete("orphan", &DeleteParams::default())
        .await?;
    wait::for_deletion(&ns.api::<Backup>(), "orphan", TIMEOUT).await?;
    Ok(())
}

fn settings(ns: &TestNamespace) -> S3Settings {
    S3Settings {
        endpoint: Some(cluster().s3_endpoint().to_owned()),
        bucket: ns.name.clone(),
        region: None,
        prefix: String::new(),
        access_key_id: "testing".into(),
        secret_access_key: "testing".into(),
    }
}

fn id(backup: &Backup) -> Result<BackupId> {
    Ok(BackupId::of_backup(
        &backup.name_any(),
        &backup.uid().unwrap_or_default(),
    )?)
}

/// When the test's backup `name` ended, as its manifest says.
fn ended(name: &str) -> String {
    match name {
        "old" => "2026-11-20T02:05:00Z",
        _ => "2026-11-25T02:05:00Z",
    }
    .to_owned()
}

/// A Backup taken by the standby: its files stored as the instance would
/// (data, then the manifest), then its report Completed.
async fn stored_backup(
    ns: &TestNamespace,
    reports: &Reports,
    name: &str,
    policy: &str,
    begin_lsn: &str,
) -> Result<Backup> {
    create_backup(ns, name, json!({ "deletionPolicy": policy })).await?;
    let running = until_phase(ns, name, BackupPhase::Running).await?;
    let id = id(&running)?;
    let base = BaseBackups::new(&settings(ns), "orders");
    let content = format!("the data folder of {name}").into_bytes();
    let file = base
        .upload(&id, BASE_BACKUP_DATA, std::io::Cursor::new(content), |_| {})
        .await?;
    base.write_manifest(&Manifest {
        id: id.to_string(),
        cluster: "orders".into(),
        backup_name: name.into(),
        backup_uid: running.uid().unwrap_or_default(),
        timeline: 1,
        begin_lsn: begin_lsn.into(),
        end_lsn: begin_lsn.into(),
        started_at: ended(name),
        completed_at: ended(name),
        server_version: None,
        files: vec![file],
    })
    .await?;
    let mut done = completed(&running);
    done.id = id.to_string();
    done.location = Some(base.location(&id));
    report(reports, "orders-1", done);
    until_phase(ns, name, BackupPhase::Completed).await
}

/// A schedule of `orders` whose slot does not come during the test.
async fn create_schedule(ns: &TestNamespace) -> Result<String> {
    let schedule: BackupSchedule = serde_json::from_value(json!({
        "apiVersion": "backup.cairn.dev/v1", "kind": "BackupSchedule",
        "metadata": { "name": "yearly" },
        "spec": { "schedule": "0 0 1 1 *",
                  "template": { "spec": { "cluster": { "name": "orders" }, "method": "physical" } } },
    }))?;
    ns.api::<BackupSchedule>()
        .create(&PostParams::default(), &schedule)
        .await?;
    Ok("yearly".into())
}

/// An annotation changed: the schedule is reconciled again.
async fn touch(ns: &TestNamespace, schedule: &str) -> Result {
    let patch = json!({ "metadata": { "annotations": { "test/touched": rand::random::<u32>().to_string() } } });
    ns.api::<BackupSchedule>()
        .patch(schedule, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}
