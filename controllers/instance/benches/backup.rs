//! Benchmark (not a test): Cairn's backups against pgBackRest's on the same
//! data and the same S3 endpoint (the local cluster's moto behind a TLS
//! front, since pgBackRest speaks only HTTPS to S3). Prints, for each: a
//! full base backup's time and stored size, a restore's time, and WAL
//! archiving's per-segment latency and throughput.
//!
//!   hack/bench.sh backup [PGBENCH_SCALE]   (default 10: about 160 MB)
//!
//! The bench script provides `CAIRN_BENCH_S3` (the TLS endpoint),
//! `SSL_CERT_FILE` (its CA, which Cairn's S3 client trusts) and
//! `CAIRN_BENCH_PGBACKREST` (the program). One primary, no standby: both
//! tools back up the same server.

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cairn_api::database::instance::{BackupProgressPhase, ObservedState};
use cairn_testing::cluster;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt};
use support::{Fixture, Instance, Result, database_size, pgbench};

/// Segments switched one at a time for the latency figures.
const SEGMENTS: usize = 20;

#[tokio::main]
async fn main() -> Result {
    let scale = support::scale_arg(10);
    let endpoint = std::env::var("CAIRN_BENCH_S3")?;
    let pgbackrest = std::env::var("CAIRN_BENCH_PGBACKREST")?;
    let bucket = format!("bench-{}", rand::random::<u32>());
    cairn_testing::s3::client(cluster().s3_endpoint())
        .create_bucket()
        .bucket(&bucket)
        .send()
        .await?;
    let ns = cluster().namespace("bench-backup").await?;
    cairn_testing::crds::install(
        &ns.client,
        &cairn_api::crds::for_chart("cairn-backup-controller"),
    )
    .await?;
    support::membership_objects(&ns).await?;
    support::instance_pods(&ns.api::<Pod>(), &[("orders-0", "primary", true)]).await?;
    let mut fixture = Fixture::new("bench-backup", &[])?;
    let kubeconfig = fixture.service_account_kubeconfig(&ns)?;
    // The instances' S3 client trusts the TLS front's CA (their
    // environment is cleared, so it is passed on).
    let ca = std::env::var("SSL_CERT_FILE")?;
    let spec = fixture
        .in_pod("orders-0", &ns, &kubeconfig)?
        .env("CAIRN_POLL_MILLISECONDS", "1000")
        .env("SSL_CERT_FILE", &ca);
    let primary = fixture.start(&fixture.archiving_to(spec, &endpoint, &bucket)?)?;
    primary.wait_ready(Duration::from_secs(120)).await?;
    println!("S3 endpoint: moto behind stunnel (TLS), {endpoint}");

    pgbench(&fixture, &primary, &["-i", "-q", "-s", &scale.to_string()]).await?;
    let size = database_size(&primary).await?;
    println!("data: pgbench -i -s {scale}, {:.0} MB", size as f64 / 1e6);

    // pgBackRest's stanza, on the same server (its own repository path).
    let pgbackrest = PgBackRest::new(&fixture, &primary, &pgbackrest, &bucket)?;
    pgbackrest.run(&["stanza-create"]).await?;

    println!();
    println!("{:<44} {:>12} {:>12}", "", "Cairn", "pgBackRest");
    // Base backups.
    let leases: Api<Lease> = ns.api();
    let started = Instant::now();
    // To the primary: there is no standby.
    let backup = support::assign_backup(&ns, "bench", "orders-0", "physical").await?;
    let uid = backup.uid().unwrap_or_default();
    let observed = support::until_observed_within(
        &leases,
        "orders-0",
        Duration::from_secs(1800),
        |o: &ObservedState| {
            o.backup
                .as_ref()
                .is_some_and(|b| b.uid == uid && b.phase != BackupProgressPhase::Running)
        },
    )
    .await?;
    let progress = observed.backup.ok_or("no report")?;
    if progress.phase != BackupProgressPhase::Completed {
        return Err(format!("Cairn's backup failed: {:?}", progress.error).into());
    }
    let cairn_backup = progress
        .duration_milliseconds
        .map_or(started.elapsed(), Duration::from_millis);
    let started = Instant::now();
    pgbackrest.run(&["--type=full", "backup"]).await?;
    let pgbackrest_backup = started.elapsed();
    let stored = pgbackrest.stored_bytes().await?;
    row(
        "full base backup (s)",
        secs(cairn_backup),
        secs(pgbackrest_backup),
    );
    row(
        "stored (MB)",
        format!("{:.3}", progress.stored_bytes as f64 / 1e6),
        format!("{:.3}", stored as f64 / 1e6),
    );

    // Restores: Cairn's to a ready primary (download, unpack, start,
    // replay to the end of the backup, promote); pgBackRest's files only.
    let restore = fixture
        .archiving_to(fixture.instance("copy-0", "primary")?, &endpoint, &bucket)?
        .env("CAIRN_CLUSTER", "copy")
        .env("CAIRN_MEMBERSHIP", "false")
        .env("CAIRN_RESTORE_CLUSTER", "orders")
        .env("CAIRN_RESTORE_BACKUP_ID", &progress.id)
        .env("CAIRN_RESTORE_TARGET_END_OF_BACKUP", "true")
        .env("SSL_CERT_FILE", &ca);
    let mut copy = fixture.start(&restore)?;
    let cairn_restore = copy.wait_ready(Duration::from_secs(1800)).await?;
    copy.terminate(Duration::from_secs(60)).await?;
    let target = fixture.root.join("pgbackrest-restore");
    std::fs::create_dir_all(&target)?;
    fixture.own(&target)?;
    let started = Instant::now();
    pgbackrest
        .run(&[&format!("--pg1-path={}", target.display()), "restore"])
        .await?;
    let pgbackrest_restore = started.elapsed();
    row(
        "restore (s; Cairn: to a ready primary)",
        secs(cairn_restore),
        secs(pgbackrest_restore),
    );

    // WAL: per-segment latency, one switch at a time. Cairn: from
    // pg_switch_wal() to pg_stat_archiver's last_archived_wal (the
    // archive_command's round trip through the instance). pgBackRest:
    // archive-push of the same segment, synchronous (its archive_command).
    let sql = primary.sql().await?;
    let (mut cairn_total, mut pgbackrest_total) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..SEGMENTS {
        sql.batch_execute("CREATE TABLE IF NOT EXISTS t (x int); INSERT INTO t VALUES (1)")
            .await?;
        let segment: String = sql
            .query_one("SELECT pg_walfile_name(pg_switch_wal())", &[])
            .await?
            .get(0);
        let switched = Instant::now();
        loop {
            let last: Option<String> = sql
                .query_one("SELECT last_archived_wal FROM pg_stat_archiver", &[])
                .await?
                .get(0);
            if last.as_deref() == Some(segment.as_str()) {
                break;
            }
            if switched.elapsed() > Duration::from_secs(120) {
                return Err(format!("{segment} not archived within 120 s").into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        cairn_total += switched.elapsed();
        let path = primary.spec.data_dir().join("pg_wal").join(&segment);
        let started = Instant::now();
        pgbackrest
            .run(&["archive-push", &path.display().to_string()])
            .await?;
        pgbackrest_total += started.elapsed();
    }
    let per = |total: Duration| total / SEGMENTS as u32;
    row(
        "WAL segment archived, one at a time (ms)",
        format!("{:.0}", per(cairn_total).as_secs_f64() * 1000.0),
        format!("{:.0}", per(pgbackrest_total).as_secs_f64() * 1000.0),
    );

    // Cairn's throughput under write load: segments archived per second and
    // the largest backlog while pgbench writes for 30 s.
    let archived = "cairn_postgres_wal_archived_files_total";
    let before = primary.metric(archived).await?.unwrap_or(0.0);
    let http = primary.spec.metrics;
    let sampler = tokio::spawn(async move {
        let mut largest = 0f64;
        let until = Instant::now() + Duration::from_secs(31);
        while Instant::now() < until {
            if let Ok((_, body)) = cairn_testing::process::http_get(http, "/metrics").await
                && let Some(pending) = cairn_testing::process::sample(
                    &body,
                    "cairn_postgres_wal_archive_pending_files",
                )
            {
                largest = largest.max(pending);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        largest
    });
    let started = Instant::now();
    pgbench(
        &fixture,
        &primary,
        &["-c", "4", "-j", "2", "-T", "30", "-N"],
    )
    .await?;
    let largest = sampler.await?;
    // What was written is archived: wait for the backlog to drain.
    primary
        .wait_status("archiving caught up", Duration::from_secs(300), |s| {
            s["walArchive"]["pending"].as_i64() == Some(0)
        })
        .await?;
    let segments = primary.metric(archived).await?.unwrap_or(0.0) - before;
    println!();
    println!(
        "Cairn under pgbench -c 4 -T 30 -N: {segments:.0} segments archived, {:.1} segments/s \
         (until the backlog drained), largest backlog {largest:.0} segments",
        segments / started.elapsed().as_secs_f64()
    );
    println!(
        "Cairn's backup includes the WAL it needs (pg_basebackup -X fetch); pgBackRest's here does \
         not (archive-check off: this server archives to Cairn), so its restore needs the archive."
    );
    drop(primary);
    fixture.passed()
}

fn row(what: &str, cairn: String, pgbackrest: String) {
    println!("{what:<44} {cairn:>12} {pgbackrest:>12}");
}

fn secs(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64())
}

/// pgBackRest configured for one stanza on `instance`'s server, its
/// repository in `bucket` at the bench's TLS endpoint.
struct PgBackRest {
    program: String,
    config: PathBuf,
}

impl PgBackRest {
    fn new(fixture: &Fixture, instance: &Instance, program: &str, bucket: &str) -> Result<Self> {
        let endpoint = std::env::var("CAIRN_BENCH_S3")?;
        let (host, port) = endpoint
            .trim_start_matches("https://")
            .split_once(':')
            .ok_or("CAIRN_BENCH_S3 must be https://host:port")?;
        let ca = std::env::var("SSL_CERT_FILE")?;
        let dir = fixture.root.join("pgbackrest");
        std::fs::create_dir_all(&dir)?;
        let config = dir.join("pgbackrest.conf");
        std::fs::write(
            &config,
            format!(
                "[global]\nrepo1-type=s3\nrepo1-path=/pgbackrest\nrepo1-s3-bucket={bucket}\n\
                 repo1-s3-endpoint={host}\nrepo1-storage-port={port}\nrepo1-s3-uri-style=path\n\
                 repo1-s3-region=us-east-1\nrepo1-s3-key=testing\nrepo1-s3-key-secret=testing\n\
                 repo1-storage-ca-file={ca}\nrepo1-retention-full=9999\ncompress-type=zst\n\
                 compress-level=3\nprocess-max=2\nlog-path={dir}\nlock-path={dir}\nspool-path={dir}\n\
                 start-fast=y\narchive-check=n\nlog-level-console=warn\n\n[bench]\npg1-path={data}\n\
                 pg1-port={pg_port}\npg1-socket-path={socket}\n",
                dir = dir.display(),
                data = instance.spec.data_dir().display(),
                pg_port = instance.spec.port,
                socket = instance.spec.dir.join("run").display(),
            ),
        )?;
        fixture.own(&dir)?;
        Ok(Self {
            program: program.to_owned(),
            config,
        })
    }

    /// Runs `pgbackrest <args>` as the OS user `postgres` (it reads the
    /// data folder and connects over the socket as its owner).
    async fn run(&self, args: &[&str]) -> Result<String> {
        let mut command = tokio::process::Command::new("runuser");
        command
            .args(["-u", "postgres", "--", &self.program])
            .arg(format!("--config={}", self.config.display()))
            .arg("--stanza=bench")
            .args(args);
        support::output_text(&mut command, &format!("pgbackrest {args:?}")).await
    }

    /// The repository size of the newest backup.
    async fn stored_bytes(&self) -> Result<u64> {
        let info: serde_json::Value =
            serde_json::from_str(&self.run(&["--output=json", "info"]).await?)?;
        info[0]["backup"]
            .as_array()
            .and_then(|b| b.last())
            .and_then(|b| b["info"]["repository"]["delta"].as_u64())
            .ok_or_else(|| "pgbackrest info: no backup size".into())
    }
}
