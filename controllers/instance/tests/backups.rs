//! Base backups taken by a real instance on request, through the API server
//! under the Role the database controller builds for instances: the test
//! plays the backup controller (it assigns a Backup to a standby in the
//! Backup's status), the standby streams pg_basebackup's tar into moto and
//! reports in its Lease; the backup then really restores (a server started
//! on the downloaded folder has the rows), and a bucket that fails midway
//! ends in a reported failure with nothing in the catalog. A logical backup
//! (pg_dump) from the standby loads into a new cluster, owned by its owner,
//! once; a damaged one is refused and the new cluster never reports ready.

mod support;

use std::time::Duration;

use cairn_api::backup::v1::Backup;
use cairn_api::database::instance::{
    BackupProgressPhase, ObservedState, VerificationReport, parse_lsn,
};
use cairn_storage::{BackupId, BaseBackups, S3Settings};
use cairn_testing::faults::{Fault, FaultProxy, Rule};
use cairn_testing::{TestNamespace, cluster, s3};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::{Fixture, Result};

async fn new_bucket() -> Result<String> {
    let bucket = format!("base-{}", rand::random::<u32>());
    s3::client(cluster().s3_endpoint())
        .create_bucket()
        .bucket(&bucket)
        .send()
        .await?;
    Ok(bucket)
}

/// `bucket` in moto, with moto's credentials.
fn moto(bucket: &str) -> S3Settings {
    S3Settings {
        endpoint: Some(cluster_endpoint()),
        bucket: bucket.to_owned(),
        region: None,
        prefix: String::new(),
        access_key_id: "testing".into(),
        secret_access_key: "testing".into(),
    }
}

fn base_backups(bucket: &str) -> BaseBackups {
    BaseBackups::new(&moto(bucket), "orders")
}

/// Waits until `pod` reports `backup` Completed in its Lease; its report.
async fn until_completed(
    leases: &Api<Lease>,
    pod: &str,
    backup: &Backup,
) -> Result<cairn_api::database::instance::BackupProgress> {
    let observed = support::until_observed_within(
        leases,
        pod,
        Duration::from_secs(120),
        reports(backup, BackupProgressPhase::Completed),
    )
    .await?;
    Ok(observed.backup.ok_or("no report")?)
}

/// Sets a Backup's phase, as the backup controller does.
async fn set_phase(ns: &TestNamespace, name: &str, phase: &str) -> Result {
    let status = json!({
        "apiVersion": "backup.cairn.dev/v1", "kind": "Backup",
        "status": { "phase": phase },
    });
    ns.api::<Backup>()
        .patch_status(
            name,
            &PatchParams::apply("backup-test").force(),
            &Patch::Apply(&status),
        )
        .await?;
    Ok(())
}

/// Creates Backup `name` of cluster `orders` and hands it to `instance`, as
/// the backup controller does.
async fn assign_backup(ns: &TestNamespace, name: &str, instance: &str) -> Result<Backup> {
    support::assign_backup(ns, name, instance, "physical").await
}

fn reports(backup: &Backup, phase: BackupProgressPhase) -> impl Fn(&ObservedState) -> bool {
    let uid = backup.uid().unwrap_or_default();
    move |o: &ObservedState| {
        o.backup
            .as_ref()
            .is_some_and(|b| b.uid == uid && b.phase == phase)
    }
}

/// Waits until the standby `orders-1` reports it replayed everything the
/// primary has written so far.
async fn until_replayed(leases: &Api<Lease>, primary: &support::Instance) -> Result {
    let written: String = primary
        .sql()
        .await?
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await?
        .get(0);
    let written = parse_lsn(&written).ok_or("an LSN")?;
    support::until_observed(leases, "orders-1", |o| {
        o.wal_position
            .as_deref()
            .and_then(parse_lsn)
            .is_some_and(|replayed| replayed >= written)
    })
    .await?;
    Ok(())
}

/// Instances `orders-0` (primary) and `orders-1` (standby) of `ns` as if in
/// their pods, under the Role instances get, archiving to `bucket` at
/// `endpoint`; both ready.
async fn primary_and_standby(
    ns: &TestNamespace,
    fixture: &Fixture,
    endpoint: &str,
    bucket: &str,
) -> Result<(support::Instance, support::Instance)> {
    primary_and_standby_with(ns, fixture, endpoint, bucket, &[]).await
}

/// The same, the standby with `env` too.
async fn primary_and_standby_with(
    ns: &TestNamespace,
    fixture: &Fixture,
    endpoint: &str,
    bucket: &str,
    env: &[(&str, &str)],
) -> Result<(support::Instance, support::Instance)> {
    cairn_testing::crds::install(
        &ns.client,
        &cairn_api::crds::for_chart("cairn-backup-controller"),
    )
    .await?;
    let pods: Api<Pod> = ns.api();
    support::membership_objects(ns).await?;
    support::instance_pods(
        &pods,
        &[
            ("orders-0", "primary", true),
            ("orders-1", "replica", false),
        ],
    )
    .await?;
    let kubeconfig = fixture.service_account_kubeconfig(ns)?;
    let spec = fixture.in_pod("orders-0", ns, &kubeconfig)?;
    let primary = fixture.start(&fixture.archiving_to(spec, endpoint, bucket)?)?;
    primary.wait_ready(Duration::from_secs(60)).await?;
    let mut spec = fixture
        .in_pod("orders-1", ns, &kubeconfig)?
        .following(&primary);
    for (name, value) in env {
        spec = spec.env(name, value);
    }
    let standby = fixture.start(&fixture.archiving_to(spec, endpoint, bucket)?)?;
    standby.wait_ready(Duration::from_secs(60)).await?;
    Ok((primary, standby))
}

#[tokio::test]
async fn a_standby_backs_up_on_request_and_the_backup_restores() -> Result {
    let ns = cluster().namespace("instance-backups").await?;
    let mut fixture = Fixture::new("backups", &[])?;
    let bucket = new_bucket().await?;
    let proxy = FaultProxy::start(cluster().s3_endpoint()).await?;
    let (primary, standby) = primary_and_standby(&ns, &fixture, &proxy.url(), &bucket).await?;

    let app = primary.app().await?;
    app.batch_execute(
        "CREATE TABLE orders (id int PRIMARY KEY, note text);
         INSERT INTO orders SELECT i, md5(i::text) FROM generate_series(1, 50000) i;",
    )
    .await?;
    // A backup holds what its standby had replayed when it ended.
    let leases: Api<Lease> = ns.api();
    until_replayed(&leases, &primary).await?;

    let backup = assign_backup(&ns, "nightly", "orders-1").await?;
    let progress = until_completed(&leases, "orders-1", &backup).await?;
    println!("base backup from the standby: {progress:?}");
    assert_eq!(progress.timeline, Some(1));
    assert!(progress.begin_lsn.is_some() && progress.end_lsn.is_some());
    assert!(progress.stored_bytes > 0);
    assert_eq!(
        progress.location.as_deref(),
        Some(format!("s3://{bucket}/orders/base/{}/", progress.id).as_str())
    );

    // The catalog, read from the bucket, has it; the tar restores.
    let catalog = base_backups(&bucket).catalog().await?;
    assert_eq!(catalog.len(), 1, "{catalog:?}");
    assert_eq!(catalog[0].backup_name, "nightly");
    assert_eq!(
        catalog[0].end_lsn,
        progress.end_lsn.clone().unwrap_or_default()
    );
    let restored = fixture.root.join("restored");
    download_and_extract(&bucket, &catalog[0], &restored).await?;
    fixture.own(&restored)?;
    let rows = fixture
        .count_rows_in_folder(&restored, "SELECT count(*) FROM orders")
        .await?;
    assert_eq!(rows, 50000);

    set_phase(&ns, "nightly", "Completed").await?;
    restores_to_a_point_in_time_and_to_the_end(&fixture, &primary, &app, &bucket, &progress.id)
        .await?;
    verifies_it_and_not_once_damaged(&fixture, &bucket, &catalog[0]).await?;

    // The bucket fails midway (every part upload, after the upload began): the
    // backup is reported failed with the reason, and nothing is complete
    // in the catalog.
    proxy.inject(Rule::every(Fault::Unreachable, |seen| {
        seen.method == "PUT" && seen.target.contains("partNumber=")
    }));
    app.batch_execute(
        "INSERT INTO orders SELECT i, md5(i::text) FROM generate_series(60001, 70000) i;",
    )
    .await?;
    let second = assign_backup(&ns, "broken", "orders-1").await?;
    let observed = support::until_observed_within(
        &leases,
        "orders-1",
        Duration::from_secs(120),
        reports(&second, BackupProgressPhase::Failed),
    )
    .await?;
    let error = observed.backup.and_then(|b| b.error).unwrap_or_default();
    println!("bucket unreachable midway: {error}");
    assert!(error.contains("UploadPart"), "{error}");
    proxy.heal();
    let id = BackupId::of_backup("broken", &second.uid().unwrap_or_default())?;
    assert_eq!(base_backups(&bucket).manifest(&id).await?, None);
    assert_eq!(base_backups(&bucket).catalog().await?.len(), 1);
    drop((standby, primary));
    fixture.passed()
}

#[tokio::test]
async fn a_slow_backup_under_writes_keeps_the_wal_it_spans() -> Result {
    let ns = cluster().namespace("instance-backup-wal").await?;
    // Little WAL kept by default, so that a restartpoint during the backup
    // would remove what it spans.
    let mut fixture = Fixture::new("backup-wal", &[("wal_keep_size", "16MB")])?;
    let bucket = new_bucket().await?;
    let endpoint = cluster_endpoint();
    let throttled = [("CAIRN_BACKUP_MAX_RATE", "4M")];
    let (primary, standby) =
        primary_and_standby_with(&ns, &fixture, &endpoint, &bucket, &throttled).await?;
    let leases: Api<Lease> = ns.api();
    let backup = assign_backup(&ns, "slow", "orders-1").await?;
    support::until_observed(
        &leases,
        "orders-1",
        reports(&backup, BackupProgressPhase::Running),
    )
    .await?;
    // 4 segments written while it runs, then a checkpoint the standby
    // replays and a restartpoint there: all the WAL since the backup began
    // is older than the 16 MB usually kept.
    let sql = primary.sql().await?;
    for _ in 0..4 {
        sql.batch_execute(
            "CREATE TABLE IF NOT EXISTS churn (x int); INSERT INTO churn SELECT generate_series(1, 1000); \
             SELECT pg_switch_wal();",
        )
        .await?;
    }
    sql.batch_execute("CHECKPOINT").await?;
    until_replayed(&leases, &primary).await?;
    standby.sql().await?.batch_execute("CHECKPOINT").await?;
    let still_running = standby.status().await?["backup"]["phase"] == "Running";
    let progress = until_completed(&leases, "orders-1", &backup).await?;
    println!(
        "a throttled backup (4 MB/s) with 4 segments written and a restartpoint meanwhile: {progress:?}"
    );
    assert!(still_running, "the restartpoint came while the backup ran");
    let catalog = base_backups(&bucket).catalog().await?;
    let (exit, report) = verification(
        &fixture,
        &bucket,
        &catalog[0].id,
        "verify",
        "SELECT true",
        false,
    )
    .await?;
    assert!(exit.success() && report.verified, "{report:?}");
    drop((standby, primary));
    fixture.passed()
}

/// A backup of a database that nobody writes to: its standby's backup ends
/// in the primary's current WAL file, which an idle primary never
/// completes, so never archives. The backup is restorable all the same,
/// verified and restored to its end from the bucket.
#[tokio::test]
async fn a_backup_of_an_idle_database_restores() -> Result {
    let ns = cluster().namespace("instance-backup-idle").await?;
    let mut fixture = Fixture::new("backup-idle", &[])?;
    let bucket = new_bucket().await?;
    let endpoint = cluster_endpoint();
    let (primary, standby) = primary_and_standby(&ns, &fixture, &endpoint, &bucket).await?;
    let app = primary.app().await?;
    app.batch_execute(
        "CREATE TABLE orders (id int PRIMARY KEY, note text);
         INSERT INTO orders SELECT i, md5(i::text) FROM generate_series(1, 1000) i;",
    )
    .await?;
    drop(app);
    // A checkpoint, replayed: the standby's restartpoint at the backup's
    // start then leaves nothing after the backup's end in its WAL.
    primary.sql().await?.batch_execute("CHECKPOINT").await?;
    let leases: Api<Lease> = ns.api();
    until_replayed(&leases, &primary).await?;
    // No writes from here on.
    let backup = assign_backup(&ns, "idle", "orders-1").await?;
    let progress = until_completed(&leases, "orders-1", &backup).await?;
    println!("a backup of an idle database: {progress:?}");
    let catalog = base_backups(&bucket).catalog().await?;
    let manifest = &catalog[0];
    let end = parse_lsn(&manifest.end_lsn).ok_or("an end LSN")?;
    let archived = cairn_storage::WalArchive::new(&moto(&bucket), "orders")
        .list()
        .await?;
    println!(
        "the backup ends at {} (segment {:X}); archived: {archived:?}",
        manifest.end_lsn,
        end >> 24
    );

    let (exit, report) = verification(
        &fixture,
        &bucket,
        &manifest.id,
        "verify",
        "SELECT count(*) = 1000 FROM orders",
        false,
    )
    .await?;
    println!("verified: {report:?}");
    assert!(exit.success() && report.verified, "{report:?}");

    // A new cluster restored to the end of the backup.
    let spec = fixture.instance("copy-0", "primary")?;
    let spec = fixture
        .archiving_to(spec, &endpoint, &bucket)?
        .env("CAIRN_CLUSTER", "copy")
        .env("CAIRN_MEMBERSHIP", "false")
        .env("CAIRN_RESTORE_CLUSTER", "orders")
        .env("CAIRN_RESTORE_BACKUP_ID", &manifest.id)
        .env("CAIRN_RESTORE_TARGET_END_OF_BACKUP", "true");
    let restored = fixture.start(&spec)?;
    if let Err(e) = restored.wait_ready(Duration::from_secs(120)).await {
        return Err(format!("{e}; its log:\n{}", tail(&restored.log_text(), 40)).into());
    }
    let count: i64 = restored
        .app()
        .await?
        .query_one("SELECT count(*) FROM orders", &[])
        .await?
        .get(0);
    assert_eq!(count, 1000);
    drop((restored, standby, primary));
    fixture.passed()
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A throw-away instance verifies backup `manifest`: restored, replayed to
/// the end of the backup, every table read, the user's check passing; a
/// check that returns false or tries more than reading, and the backup's
/// data file altered in the bucket, are reported not verified with the
/// reason.
async fn verifies_it_and_not_once_damaged(
    fixture: &Fixture,
    bucket: &str,
    manifest: &cairn_storage::Manifest,
) -> Result {
    let good = "SELECT count(*) >= 50000 FROM orders";
    let (exit, report) = verification(fixture, bucket, &manifest.id, "verify", good, false).await?;
    println!("verified: {report:?}");
    assert!(exit.success() && report.verified, "{report:?}");
    assert_eq!(report.reason, "Verified");
    assert!(
        report.message.contains("the check returned t"),
        "{report:?}"
    );
    let replayed = report.restored_lsn.as_deref().and_then(parse_lsn);
    assert!(
        replayed >= parse_lsn(&manifest.end_lsn),
        "replayed to {report:?}, the backup ends at {}",
        manifest.end_lsn
    );

    let bad = "SELECT count(*) > 1000000 FROM orders";
    let (exit, report) = verification(fixture, bucket, &manifest.id, "verify2", bad, false).await?;
    println!("a check that fails: {report:?}");
    assert!(!exit.success() && !report.verified, "{report:?}");
    assert_eq!(report.reason, "CheckFailed");
    assert!(report.message.contains("returned false"), "{report:?}");

    // The check reads data, nothing else: not the server's files (the pod's
    // credentials), not a second statement.
    for (name, sql, refusal) in [
        (
            "verify4",
            "SELECT pg_read_file('postgresql.conf') IS NOT NULL",
            "permission denied",
        ),
        (
            "verify5",
            "SELECT true; DROP TABLE orders",
            "multiple commands",
        ),
    ] {
        let (exit, report) = verification(fixture, bucket, &manifest.id, name, sql, false).await?;
        println!("a check beyond reading: {report:?}");
        assert!(
            !exit.success() && report.reason == "CheckFailed",
            "{report:?}"
        );
        assert!(report.message.contains(refusal), "{report:?}");
    }

    // One byte of the stored data file changed: the restore refuses it.
    let file = &manifest.files[0];
    let key = format!("orders/base/{}/{}", manifest.id, file.name);
    let client = s3::client(&cluster_endpoint());
    let original = client.get_object().bucket(bucket).key(&key).send().await?;
    let original = original.body.collect().await?.into_bytes().to_vec();
    let mut altered = zstd::decode_all(&original[..])?;
    let middle = altered.len() / 2;
    altered[middle] ^= 0xff;
    let put = |body: Vec<u8>| {
        client
            .put_object()
            .bucket(bucket)
            .key(&key)
            .body(body.into())
            .send()
    };
    put(zstd::encode_all(&altered[..], 3)?).await?;
    let (exit, report) =
        verification(fixture, bucket, &manifest.id, "verify3", good, false).await?;
    put(original).await?;
    println!("a damaged backup: {report:?}");
    assert!(!exit.success() && !report.verified, "{report:?}");
    assert_eq!(report.reason, "RestoreFailed");
    assert!(
        report.message.contains("differs from the manifest"),
        "{report:?}"
    );
    Ok(())
}

/// Runs a verifying instance `name` on backup `id` of `orders` with the
/// check `sql`: its exit and its report.
async fn verification(
    fixture: &Fixture,
    bucket: &str,
    id: &str,
    name: &str,
    sql: &str,
    logical: bool,
) -> Result<(std::process::ExitStatus, VerificationReport)> {
    let spec = fixture.instance(&format!("{name}-0"), "primary")?;
    let report = spec.dir.join("report.json");
    let spec = fixture
        .archiving_to(spec, &cluster_endpoint(), bucket)?
        .env("CAIRN_VERIFY", "true")
        .env("CAIRN_VERIFY_SQL", sql)
        .env("CAIRN_VERIFY_REPORT", &report.display().to_string())
        .env("CAIRN_RESTORE_CLUSTER", "orders")
        .env("CAIRN_RESTORE_BACKUP_ID", id)
        .env("CAIRN_RESTORE_TARGET_END_OF_BACKUP", "true")
        .env(
            "CAIRN_RESTORE_LOGICAL",
            if logical { "true" } else { "false" },
        );
    let mut instance = fixture.start(&spec)?;
    let exit = instance.wait_exit(Duration::from_secs(180)).await?;
    let text = std::fs::read_to_string(&report)
        .map_err(|e| format!("no report ({e}); log:\n{}", instance.log_text()))?;
    let report: VerificationReport = serde_json::from_str(&text)?;
    if !report.verified {
        println!("{name}'s log ends:\n{}", tail(&instance.log_text(), 40));
    }
    Ok((exit, report))
}

/// New clusters `copy` and `copy2` restored from backup `id` of `orders`
/// (its instances running outside pods: the configuration says restore):
/// up to a time between two batches of rows (the first present, the second
/// absent), and to the end of the archive (both present); `copy3` from the
/// newest backup in the bucket's catalog, without an id; each on a new
/// timeline, writable, archiving to its own folder, never the source's.
async fn restores_to_a_point_in_time_and_to_the_end(
    fixture: &Fixture,
    primary: &support::Instance,
    app: &tokio_postgres::Client,
    bucket: &str,
    id: &str,
) -> Result {
    app.batch_execute("INSERT INTO orders SELECT i, 'before' FROM generate_series(50001, 50100) i")
        .await?;
    let target: String = app
        .query_one("SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')", &[])
        .await?
        .get(0);
    tokio::time::sleep(Duration::from_millis(500)).await;
    app.batch_execute("INSERT INTO orders SELECT i, 'after' FROM generate_series(50101, 50200) i")
        .await?;
    let sql = primary.sql().await?;
    let last: String = sql
        .query_one("SELECT pg_walfile_name(pg_switch_wal())", &[])
        .await?
        .get(0);
    let archive = |cluster: &str| cairn_storage::WalArchive::new(&moto(bucket), cluster);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !archive("orders")
        .list()
        .await?
        .iter()
        .any(|n| n.as_str() == last)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "{last} never archived"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // copy3: no backup named, the newest in the source's catalog.
    for (name, backup, target, rows) in [
        ("copy", Some(id), Some(target.as_str()), 50100),
        ("copy2", Some(id), None, 50200),
        ("copy3", None, None, 50200),
    ] {
        let mut spec = fixture.instance(&format!("{name}-0"), "primary")?;
        spec = fixture
            .archiving_to(spec, &cluster_endpoint(), bucket)?
            .env("CAIRN_CLUSTER", name)
            .env("CAIRN_MEMBERSHIP", "false")
            .env("CAIRN_RESTORE_CLUSTER", "orders");
        if let Some(id) = backup {
            spec = spec.env("CAIRN_RESTORE_BACKUP_ID", id);
        }
        if let Some(time) = target {
            spec = spec.env("CAIRN_RESTORE_TARGET_TIME", time);
        }
        let restored = fixture.start(&spec)?;
        let took = restored.wait_ready(Duration::from_secs(120)).await?;
        let status = restored.status().await?;
        println!("{name}: restored (target {target:?}) and ready in {took:?}: {status}");
        assert_eq!(status["role"], "primary", "{status}");
        assert_eq!(status["timeline"], 2, "a new timeline: {status}");
        let copy = restored.app().await?;
        let count: i64 = copy
            .query_one("SELECT count(*) FROM orders", &[])
            .await?
            .get(0);
        assert_eq!(count, rows, "{name}");
        // Writable, and archiving to its own folder only.
        copy.batch_execute("INSERT INTO orders VALUES (90000, 'restored')")
            .await?;
        let own: String = restored
            .sql()
            .await?
            .query_one("SELECT pg_walfile_name(pg_switch_wal())", &[])
            .await?
            .get(0);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !archive(name)
            .list()
            .await?
            .iter()
            .any(|n| n.as_str() == own)
        {
            assert!(
                std::time::Instant::now() < deadline,
                "{own} never archived by {name}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let source = archive("orders").list().await?;
        assert!(
            source.iter().all(|n| n.timeline() == "00000001"),
            "the source's folder got another timeline: {source:?}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_logical_backup_from_the_standby_loads_into_a_new_cluster_once() -> Result {
    let ns = cluster().namespace("instance-dumps").await?;
    let mut fixture = Fixture::new("dumps", &[])?;
    let bucket = new_bucket().await?;
    let endpoint = cluster_endpoint();
    let (primary, standby) = primary_and_standby(&ns, &fixture, &endpoint, &bucket).await?;
    primary
        .app()
        .await?
        .batch_execute(
            "CREATE TABLE orders (id int PRIMARY KEY, note text);
             INSERT INTO orders SELECT i, md5(i::text) FROM generate_series(1, 20000) i;
             CREATE VIEW recent AS SELECT * FROM orders WHERE id > 19000;",
        )
        .await?;
    // The dump is of the standby: it waits until the standby replayed all.
    let leases: Api<Lease> = ns.api();
    until_replayed(&leases, &primary).await?;

    let backup = support::assign_backup(&ns, "dump", "orders-1", "logical").await?;
    let progress = until_completed(&leases, "orders-1", &backup).await?;
    println!("logical backup from the standby: {progress:?}");
    assert_eq!(
        progress.location.as_deref(),
        Some(format!("s3://{bucket}/orders/dumps/{}/", progress.id).as_str())
    );
    let settings = moto(&bucket);
    assert_eq!(
        BaseBackups::dumps(&settings, "orders")
            .catalog()
            .await?
            .len(),
        1
    );
    assert!(
        base_backups(&bucket).catalog().await?.is_empty(),
        "a dump is no base backup"
    );

    // A new cluster loads it: every row, owned by its own owner; started
    // again, even without the record of the load, it does not load it twice.
    let restore = |name: &str| -> Result<support::InstanceSpec> {
        Ok(fixture
            .archiving_to(
                fixture.instance(&format!("{name}-0"), "primary")?,
                &endpoint,
                &bucket,
            )?
            .env("CAIRN_CLUSTER", name)
            .env("CAIRN_MEMBERSHIP", "false")
            .env("CAIRN_RESTORE_CLUSTER", "orders")
            .env("CAIRN_RESTORE_BACKUP_ID", &progress.id)
            .env("CAIRN_RESTORE_LOGICAL", "true"))
    };
    let spec = restore("copy")?;
    let mut copy = fixture.start(&spec)?;
    let took = copy.wait_ready(Duration::from_secs(120)).await?;
    println!("copy: the dump loaded and ready in {took:?}");
    let count = |client: tokio_postgres::Client| async move {
        let row = client
            .query_one(
                "SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM recent),                  (SELECT tableowner::text FROM pg_tables WHERE tablename = 'orders'), current_user::text",
                &[],
            )
            .await?;
        Ok::<_, Box<dyn std::error::Error>>((
            row.get::<_, i64>(0),
            row.get::<_, i64>(1),
            row.get::<_, String>(2),
            row.get::<_, String>(3),
        ))
    };
    let (rows, recent, owner, user) = count(copy.app().await?).await?;
    assert_eq!((rows, recent), (20000, 1000));
    assert_eq!(owner, user, "owned by the new cluster's owner");
    let exit = copy.terminate(Duration::from_secs(60)).await?;
    assert!(exit.success(), "{exit}");
    // As if it had stopped between the load's commit and its record.
    std::fs::remove_file(spec.data_dir().join("cairn-dump-loaded"))?;
    let again = fixture.start(&spec)?;
    again.wait_ready(Duration::from_secs(60)).await?;
    assert_eq!(count(again.app().await?).await?.0, 20000, "loaded once");
    drop(again);
    let check = "SELECT count(*) = 20000 FROM orders";
    let (exit, report) =
        verification(&fixture, &bucket, &progress.id, "verify", check, true).await?;
    println!("the dump verified: {report:?}");
    assert!(exit.success() && report.verified, "{report:?}");

    // The dump altered in the bucket: refused, and the new cluster never
    // reports ready with an empty database.
    let key = format!(
        "orders/dumps/{}/{}",
        progress.id,
        cairn_storage::layout::DUMP_DATA
    );
    s3::client(&endpoint)
        .put_object()
        .bucket(&bucket)
        .key(&key)
        .body(zstd::encode_all(&b"not the dump"[..], 3)?.into())
        .send()
        .await?;
    let damaged = fixture.start(&restore("copy2")?)?;
    damaged
        .wait_status("the load refused", Duration::from_secs(60), |s| {
            support::last_error(s).contains("loading the logical backup")
        })
        .await?;
    let status = damaged.status().await?;
    println!(
        "copy2 from a damaged dump: {}",
        support::last_error(&status)
    );
    assert_eq!(status["ready"], false, "{status}");
    drop(damaged);
    let (exit, report) =
        verification(&fixture, &bucket, &progress.id, "verify2", check, true).await?;
    println!("the damaged dump: {report:?}");
    assert!(!exit.success() && !report.verified, "{report:?}");
    assert_eq!(report.reason, "RestoreFailed");
    drop((standby, primary));
    fixture.passed()
}

fn cluster_endpoint() -> String {
    cluster().s3_endpoint().to_owned()
}

/// Downloads a backup's tar and unpacks it into `folder`, as a restore
/// will.
async fn download_and_extract(
    bucket: &str,
    manifest: &cairn_storage::Manifest,
    folder: &std::path::Path,
) -> Result {
    std::fs::create_dir_all(folder)?;
    let tar = folder.with_extension("tar");
    let file = std::fs::File::create(&tar)?;
    base_backups(bucket)
        .download(&BackupId::parse(&manifest.id)?, &manifest.files[0], file)
        .await?;
    let status = std::process::Command::new("tar")
        .arg("-xf")
        .arg(&tar)
        .arg("-C")
        .arg(folder)
        .status()?;
    assert!(status.success(), "tar: {status}");
    std::fs::remove_file(&tar)?;
    Ok(())
}
