//! Base backups on the real nodes, with the database and backup controllers
//! installed by their charts: a Backup of a two-instance cluster is taken by
//! the standby, in its pod, streamed to the bucket (moto, from the pod
//! network) with its manifest, and reported in the Backup's status; a
//! Backup whose instance pod is killed midway ends Failed with a reason,
//! and the bucket's catalog never lists it; the first Backup deleted
//! (`deletionPolicy: Delete`) takes its files and the WAL only it needed;
//! a new cluster restored from the oldest Backup left
//! (`bootstrap.fromBackup`) has every committed row, and so has one
//! restored from the bucket alone once the Backups are deleted
//! (`bootstrap.fromBucket`); a logical backup (pg_dump) loads into a new
//! cluster with the same rows; a Backup is verified in a throw-away pod, and
//! one altered in the bucket is not.

use std::time::{Duration, Instant};

use cairn_api::backup::v1::{Backup, BackupPhase, BackupStatus};
use cairn_api::database::v1::DatabaseCluster;
use cairn_e2e::real::{
    READY_TIMEOUT, as_superuser, backup_destination, cluster_spec, current_primary, install_chart,
    namespace_with_controller, psql, start_client,
};
use cairn_storage::{BaseBackups, S3Settings, WalArchive};
use cairn_testing::{TestNamespace, cluster, wait};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

const CLUSTER: &str = "vault";
/// The rows kept once the interrupted backup is done with the bulk.
const ROWS_KEPT: u32 = 10_000;
/// What each restored cluster must hold: those and the two inserted after.
const ROWS_AT_THE_END: &str = "10002";

/// The test's bucket in moto, as the instances reach it.
fn moto(bucket: &str) -> S3Settings {
    S3Settings {
        endpoint: Some(cluster().s3_endpoint().to_owned()),
        bucket: bucket.to_owned(),
        region: None,
        prefix: "e2e".into(),
        access_key_id: "testing".into(),
        secret_access_key: "testing".into(),
    }
}

fn catalog(bucket: &str) -> BaseBackups {
    BaseBackups::new(&moto(bucket), CLUSTER)
}

/// Waits until DatabaseCluster `name` is Ready.
async fn until_ready(clusters: &Api<DatabaseCluster>, name: &str) -> Result<DatabaseCluster> {
    Ok(
        wait::for_object(clusters, name, "Ready", READY_TIMEOUT, |c| {
            wait::condition_status(c, "Ready").as_deref() == Some("True")
        })
        .await?,
    )
}

/// Waits until Backup `name` is final; returns its status.
async fn until_final(backups: &Api<Backup>, name: &str) -> Result<BackupStatus> {
    let done = wait::for_object(backups, name, "final", Duration::from_secs(180), |b| {
        matches!(phase(b), Some(BackupPhase::Completed | BackupPhase::Failed))
    })
    .await?;
    Ok(done.status.unwrap_or_default())
}

async fn backup(ns: &TestNamespace, name: &str, deletion_policy: &str) -> Result<Backup> {
    backup_by(ns, name, "physical", deletion_policy).await
}

async fn backup_by(
    ns: &TestNamespace,
    name: &str,
    method: &str,
    deletion_policy: &str,
) -> Result<Backup> {
    create_backup(
        ns,
        json!({ "metadata": { "name": name },
            "spec": { "cluster": { "name": CLUSTER }, "method": method, "deadlineSeconds": 300,
                      "deletionPolicy": deletion_policy } }),
    )
    .await
}

async fn create_backup(ns: &TestNamespace, mut backup: serde_json::Value) -> Result<Backup> {
    backup["apiVersion"] = json!("backup.cairn.dev/v1");
    backup["kind"] = json!("Backup");
    let backup: Backup = serde_json::from_value(backup)?;
    Ok(ns
        .api::<Backup>()
        .create(&PostParams::default(), &backup)
        .await?)
}

fn phase(backup: &Backup) -> Option<BackupPhase> {
    backup.status.as_ref().and_then(|s| s.phase)
}

#[tokio::test]
async fn a_standby_takes_a_base_backup_and_a_killed_one_fails_cleanly() -> Result {
    let ns = namespace_with_controller("backups").await?;
    install_chart(&ns, "cairn-backup-controller").await?;
    let bucket = format!("base-{}", ns.name);
    let mut spec = cluster_spec(2);
    spec.backup = Some(backup_destination(&ns, &bucket, "e2e").await?);
    let clusters = ns.api::<DatabaseCluster>();
    clusters
        .create(&PostParams::default(), &DatabaseCluster::new(CLUSTER, spec))
        .await?;
    until_ready(&clusters, CLUSTER).await?;
    start_client(&ns, CLUSTER).await?;
    // About 200 MB that compresses about twofold: a backup that takes
    // seconds, so that it can be interrupted.
    psql(
        &ns,
        "vault-rw",
        "CREATE TABLE items AS SELECT i AS id, md5(random()::text) || md5(random()::text) \
         || md5(random()::text) || md5(random()::text) AS payload \
         FROM generate_series(1, 1000000) i",
    )
    .await?;
    let primary = current_primary(&clusters, CLUSTER).await?;
    let standby = if primary == "vault-0" {
        "vault-1"
    } else {
        "vault-0"
    };

    // A Backup: taken by the standby, Completed with its WAL range, in the
    // bucket's catalog with the same range.
    let started = Instant::now();
    backup(&ns, "first", "Delete").await?;
    let backups = ns.api::<Backup>();
    let status = until_final(&backups, "first").await?;
    assert_eq!(status.phase, Some(BackupPhase::Completed), "{status:?}");
    eprintln!(
        "base backup from {}: {} bytes stored in {:?} s (instance), {:.1} s from creation to Completed",
        status.instance.as_deref().unwrap_or("?"),
        status.size_bytes.unwrap_or(0),
        status.duration_seconds,
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        status.instance.as_deref(),
        Some(standby),
        "taken by the standby"
    );
    let manifests = catalog(&bucket).catalog().await?;
    assert_eq!(manifests.len(), 1, "{manifests:?}");
    assert_eq!(Some(&manifests[0].id), status.backup_id.as_ref());
    assert_eq!(Some(&manifests[0].end_lsn), status.end_lsn.as_ref());
    assert_eq!(
        status.location.as_deref(),
        Some(format!("s3://{bucket}/e2e/{CLUSTER}/base/{}/", manifests[0].id).as_str())
    );

    // A second one, its instance's pod killed as soon as it runs: Failed
    // with the reason, within its deadline; the catalog still has only the
    // first.
    backup(&ns, "interrupted", "Retain").await?;
    let running = wait::for_object(
        &backups,
        "interrupted",
        "Running",
        Duration::from_secs(60),
        |b| phase(b).is_some() && phase(b) != Some(BackupPhase::Pending),
    )
    .await?;
    let taker = running
        .status
        .and_then(|s| s.instance)
        .ok_or("no instance")?;
    ns.api::<Pod>()
        .delete(&taker, &DeleteParams::default().grace_period(0))
        .await?;
    let killed = Instant::now();
    let failed = wait::for_object(
        &backups,
        "interrupted",
        "Failed",
        Duration::from_secs(120),
        |b| matches!(phase(b), Some(BackupPhase::Completed | BackupPhase::Failed)),
    )
    .await?;
    let status = failed.status.clone().unwrap_or_default();
    eprintln!(
        "instance {taker} killed mid-backup: {:?} after {:.1} s: {}",
        status.phase,
        killed.elapsed().as_secs_f64(),
        status.error.as_deref().unwrap_or("")
    );
    assert_eq!(status.phase, Some(BackupPhase::Failed), "{status:?}");
    assert!(
        status.error.as_deref().unwrap_or("").contains(&taker),
        "{status:?}"
    );
    let manifests = catalog(&bucket).catalog().await?;
    assert_eq!(
        manifests.len(),
        1,
        "only the first is complete: {manifests:?}"
    );

    // The rest needs no bulk: the table cut to its first rows (a new table
    // renamed over it, so that neither a million deletions nor their WAL
    // are written), and each backup and restore from here on moves
    // megabytes, not the 200 MB the interruption needed.
    psql(
        &ns,
        "vault-rw",
        &format!(
            "CREATE TABLE kept AS SELECT * FROM items WHERE id <= {ROWS_KEPT}; \
             DROP TABLE items; ALTER TABLE kept RENAME TO items"
        ),
    )
    .await?;

    // A row after the first backup, a second backup, another row, its WAL
    // archived.
    psql(
        &ns,
        "vault-rw",
        "INSERT INTO items VALUES (0, 'after the first backup')",
    )
    .await?;
    backup(&ns, "second", "Retain").await?;
    let second = until_final(&backups, "second").await?;
    assert_eq!(second.phase, Some(BackupPhase::Completed), "{second:?}");
    psql(
        &ns,
        "vault-rw",
        "INSERT INTO items VALUES (-1, 'after the second backup')",
    )
    .await?;
    let primary = current_primary(&clusters, CLUSTER).await?;
    let segment = as_superuser(&ns, &primary, "SELECT pg_walfile_name(pg_switch_wal())").await?;
    let archive = WalArchive::new(&moto(&bucket), CLUSTER);
    wait::until(
        "the switched segment archived",
        Duration::from_secs(60),
        || async {
            let names = archive.list().await.map_err(|e| e.to_string())?;
            Ok(names.iter().any(|n| n.as_str() == segment).then_some(()))
        },
    )
    .await?;

    // The first Backup deleted (deletionPolicy Delete): its files go, and
    // the WAL before the second backup's start (only the first needed it);
    // the rest stays.
    let segments_before = archive.list().await?.len();
    backups.delete("first", &DeleteParams::default()).await?;
    wait::for_deletion(&backups, "first", Duration::from_secs(60)).await?;
    let ids: Vec<String> = catalog(&bucket)
        .catalog()
        .await?
        .into_iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(ids, [second.backup_id.clone().unwrap_or_default()]);
    let begin = cairn_api::database::instance::parse_lsn(second.begin_lsn.as_deref().unwrap_or(""))
        .ok_or("the second backup's begin LSN")?;
    let first_needed = cairn_api::backup::layout::segment_number_of(begin);
    let left = archive.list().await?;
    eprintln!(
        "Backup first deleted: {} of {segments_before} WAL files removed, the oldest left {:?}",
        segments_before - left.len(),
        left.first().map(|n| n.to_string())
    );
    assert!(
        left.len() < segments_before,
        "WAL only the first needed is deleted"
    );
    assert!(
        left.iter()
            .filter_map(|n| n.segment_number())
            .all(|s| s >= first_needed.as_str()),
        "nothing older than segment {first_needed} is left: {left:?}"
    );
    assert!(left.iter().any(|n| n.as_str() == segment), "newer WAL kept");

    // A new cluster restored from the oldest Backup left, to the end of the
    // archive, has every row, on a new timeline.
    let mut copy = cluster_spec(1);
    copy.backup = clusters.get(CLUSTER).await?.spec.backup;
    copy.bootstrap = Some(serde_json::from_value(
        json!({ "fromBackup": { "name": "second" } }),
    )?);
    clusters
        .create(
            &PostParams::default(),
            &DatabaseCluster::new("vault-copy", copy),
        )
        .await?;
    let restoring = Instant::now();
    let restored = until_ready(&clusters, "vault-copy").await?;
    eprintln!(
        "vault-copy restored from Backup second and Ready {:.1} s after its creation",
        restoring.elapsed().as_secs_f64()
    );
    let source = restored
        .status
        .and_then(|s| s.restored_from)
        .ok_or("restoredFrom")?;
    assert_eq!(source.backup.as_deref(), Some("second"));
    assert_eq!(source.cluster, CLUSTER);
    let count = in_app_database(&ns, "vault-copy-0", "SELECT count(*) FROM items").await?;
    assert_eq!(count, ROWS_AT_THE_END, "every committed row");
    let timeline = as_superuser(
        &ns,
        "vault-copy-0",
        "SELECT timeline_id FROM pg_control_checkpoint()",
    )
    .await?;
    assert_ne!(timeline, "1", "a new timeline");

    // From the bucket alone: every Backup object deleted, a new cluster
    // restores the source's folder (its newest complete backup, then all of
    // its WAL).
    for name in ["second", "interrupted"] {
        backups.delete(name, &DeleteParams::default()).await?;
    }
    let mut dr = cluster_spec(1);
    dr.backup = clusters.get(CLUSTER).await?.spec.backup;
    dr.bootstrap = Some(serde_json::from_value(
        json!({ "fromBucket": { "cluster": CLUSTER } }),
    )?);
    clusters
        .create(
            &PostParams::default(),
            &DatabaseCluster::new("vault-dr", dr),
        )
        .await?;
    let restoring = Instant::now();
    until_ready(&clusters, "vault-dr").await?;
    eprintln!(
        "vault-dr restored from the bucket alone and Ready {:.1} s after its creation",
        restoring.elapsed().as_secs_f64()
    );
    let count = in_app_database(&ns, "vault-dr-0", "SELECT count(*) FROM items").await?;
    assert_eq!(
        count, ROWS_AT_THE_END,
        "every committed row, from the bucket alone"
    );

    // A logical backup (pg_dump, from the standby) loaded into a new
    // cluster: the same rows, and Ready only once they are in.
    backup_by(&ns, "dump", "logical", "Delete").await?;
    let dumped = until_final(&backups, "dump").await?;
    assert_eq!(dumped.phase, Some(BackupPhase::Completed), "{dumped:?}");
    eprintln!(
        "logical backup from {}: {} bytes stored in {:?} s",
        dumped.instance.as_deref().unwrap_or("?"),
        dumped.size_bytes.unwrap_or(0),
        dumped.duration_seconds
    );
    let mut loaded = cluster_spec(1);
    loaded.backup = clusters.get(CLUSTER).await?.spec.backup;
    loaded.bootstrap = Some(serde_json::from_value(
        json!({ "fromBackup": { "name": "dump" } }),
    )?);
    clusters
        .create(
            &PostParams::default(),
            &DatabaseCluster::new("vault-dump", loaded),
        )
        .await?;
    let restoring = Instant::now();
    until_ready(&clusters, "vault-dump").await?;
    eprintln!(
        "vault-dump loaded from Backup dump and Ready {:.1} s after its creation",
        restoring.elapsed().as_secs_f64()
    );
    let count = in_app_database(&ns, "vault-dump-0", "SELECT count(*) FROM items").await?;
    assert_eq!(count, ROWS_AT_THE_END, "every row of the dump");
    // Deleted with deletionPolicy Delete: its folder goes with it.
    backups.delete("dump", &DeleteParams::default()).await?;
    wait::for_deletion(&backups, "dump", Duration::from_secs(60)).await?;
    let dumps = BaseBackups::dumps(&moto(&bucket), CLUSTER);
    assert!(
        dumps.catalog().await?.is_empty(),
        "the dump's folder removed"
    );
    verification_tells_a_good_backup_from_a_damaged_one(&ns, &bucket).await
}

/// A Backup with `spec.verification` is restored in a throw-away pod on
/// the real nodes, read, and checked with the user's SQL: Verified, with
/// the LSN replay reached; the pod is deleted. A Backup whose data file
/// was altered in the bucket, verified afterwards: not verified, with the
/// reason.
async fn verification_tells_a_good_backup_from_a_damaged_one(
    ns: &TestNamespace,
    bucket: &str,
) -> Result {
    let backups = ns.api::<Backup>();
    let pods = ns.api::<Pod>();
    let check = format!("SELECT count(*) = {ROWS_AT_THE_END} FROM items");
    create_backup(
        ns,
        json!({ "metadata": { "name": "verified" },
            "spec": { "cluster": { "name": CLUSTER }, "method": "physical",
                      "deletionPolicy": "Delete", "verification": { "sql": check } } }),
    )
    .await?;
    let completed = until_final(&backups, "verified").await?;
    assert_eq!(
        completed.phase,
        Some(BackupPhase::Completed),
        "{completed:?}"
    );
    let status = until_verified(&backups, "verified").await?;
    let verification = status.verification.clone().unwrap_or_default();
    let pod_seconds = match (&verification.started_at, &verification.completed_at) {
        (Some(start), Some(end)) => end.0.duration_since(start.0).as_secs_f64(),
        _ => f64::NAN,
    };
    eprintln!(
        "Backup verified in a throw-away pod: {pod_seconds:.1} s from the pod's creation to the \
         outcome, {:?} s in the instance, restored to {:?}",
        verification.duration_seconds, verification.restored_lsn
    );
    assert_eq!(verified(&status), Some(("True", "Verified")), "{status:?}");
    let message = verification.message.unwrap_or_default();
    assert!(message.contains("the check returned t"), "{message}");
    let lsn = |text: Option<&str>| cairn_api::database::instance::parse_lsn(text.unwrap_or(""));
    assert!(
        lsn(verification.restored_lsn.as_deref()) >= lsn(status.end_lsn.as_deref()),
        "replayed at least to the end of the backup: {status:?}"
    );
    wait::for_deletion(&pods, "verified-verify", Duration::from_secs(60)).await?;

    // Altered in the bucket once completed, then verified.
    backup(ns, "damaged", "Delete").await?;
    let damaged = until_final(&backups, "damaged").await?;
    assert_eq!(damaged.phase, Some(BackupPhase::Completed), "{damaged:?}");
    let id = damaged.backup_id.clone().unwrap_or_default();
    let key = format!("e2e/{CLUSTER}/base/{id}/data.tar.zst");
    let s3 = cairn_testing::s3::client(cluster().s3_endpoint());
    let stored = s3.get_object().bucket(bucket).key(&key).send().await?;
    let mut tar = zstd::decode_all(&stored.body.collect().await?.into_bytes()[..])?;
    let middle = tar.len() / 2;
    tar[middle] ^= 0xff;
    s3.put_object()
        .bucket(bucket)
        .key(&key)
        .body(zstd::encode_all(&tar[..], 3)?.into())
        .send()
        .await?;
    backups
        .patch(
            "damaged",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "verification": { "sql": check } } })),
        )
        .await?;
    let status = until_verified(&backups, "damaged").await?;
    let message = status
        .verification
        .clone()
        .and_then(|v| v.message)
        .unwrap_or_default();
    eprintln!("damaged Backup: {:?}: {message}", verified(&status));
    assert_eq!(
        verified(&status),
        Some(("False", "RestoreFailed")),
        "{status:?}"
    );
    assert!(message.contains("differs from the manifest"), "{message}");
    wait::for_deletion(&pods, "damaged-verify", Duration::from_secs(60)).await?;
    for name in ["verified", "damaged"] {
        backups.delete(name, &DeleteParams::default()).await?;
    }
    Ok(())
}

/// Waits until Backup `name`'s verification has an outcome.
async fn until_verified(backups: &Api<Backup>, name: &str) -> Result<BackupStatus> {
    let done = wait::for_object(
        backups,
        name,
        "verified or not",
        Duration::from_secs(300),
        |b| {
            matches!(
                wait::condition_status(b, "Verified").as_deref(),
                Some("True" | "False")
            )
        },
    )
    .await?;
    Ok(done.status.unwrap_or_default())
}

/// The `Verified` condition's status and reason.
fn verified(status: &BackupStatus) -> Option<(&str, &str)> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == "Verified")
        .map(|c| (c.status.as_str(), c.reason.as_str()))
}

/// Runs `sql` in pod `pod`'s application database as the superuser.
async fn in_app_database(ns: &TestNamespace, pod: &str, sql: &str) -> Result<String> {
    let script = format!(
        "PGPASSWORD=$(cat /etc/cairn/credentials/superuser-password) psql -h 127.0.0.1 -U postgres \
         -d \"$(cat /etc/cairn/credentials/database)\" -XAtq -c \"{sql}\""
    );
    let out = cluster()
        .kubectl(&["-n", &ns.name, "exec", pod, "--", "sh", "-c", &script])
        .await?;
    Ok(out.stdout.trim().to_owned())
}
