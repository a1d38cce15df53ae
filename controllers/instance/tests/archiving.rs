//! Continuous WAL archiving: a primary with real PostgreSQL hands every WAL
//! file to its instance, which stores it in moto (the real S3 wire
//! protocol); an unreachable bucket shows within a minute and holds WAL in
//! pg_wal until the bucket returns.

mod support;

use std::time::{Duration, Instant};

use cairn_storage::{S3Settings, WalArchive, WalName};
use cairn_testing::faults::{Fault, FaultProxy, Rule};
use cairn_testing::{cluster, s3};
use support::{Fixture, Instance, InstanceSpec, Result};

async fn new_bucket() -> Result<String> {
    let bucket = format!("archive-{}", rand::random::<u32>());
    s3::client(cluster().s3_endpoint())
        .create_bucket()
        .bucket(&bucket)
        .send()
        .await?;
    Ok(bucket)
}

/// What the instance archived, read from the bucket itself.
fn archive(bucket: &str) -> WalArchive {
    let settings = S3Settings {
        endpoint: Some(cluster().s3_endpoint().to_owned()),
        bucket: bucket.to_owned(),
        region: None,
        prefix: String::new(),
        access_key_id: "testing".into(),
        secret_access_key: "testing".into(),
    };
    WalArchive::new(&settings, "orders")
}

/// A primary archiving to a new bucket through a fault proxy in front of
/// moto (with the guard at `max_pending` bytes, if given), once it archived
/// its first segment.
async fn archiving_through_a_proxy(
    fixture: &Fixture,
    max_pending: Option<u64>,
) -> Result<(
    String,
    FaultProxy,
    InstanceSpec,
    Instance,
    tokio_postgres::Client,
)> {
    let bucket = new_bucket().await?;
    let proxy = FaultProxy::start(cluster().s3_endpoint()).await?;
    let mut spec = fixture.instance("orders-0", "primary")?;
    spec = fixture.archiving_to(spec, &proxy.url(), &bucket)?;
    if let Some(bytes) = max_pending {
        spec = spec.env("CAIRN_WAL_ARCHIVE_MAX_PENDING_BYTES", &bytes.to_string());
    }
    let primary = fixture.start(&spec)?;
    primary.wait_ready(Duration::from_secs(60)).await?;
    let sql = primary.sql().await?;
    let first = switch_wal(&sql).await?;
    until_archived(&primary, &first, Duration::from_secs(60)).await?;
    Ok((bucket, proxy, spec, primary, sql))
}

/// Writes about `megabytes` of WAL.
async fn write_wal(sql: &tokio_postgres::Client, megabytes: u32) -> Result {
    sql.batch_execute("CREATE TABLE IF NOT EXISTS load (id bigint, payload text)")
        .await?;
    // About 330 bytes of WAL per row.
    let rows = megabytes * 3_200;
    sql.execute(
        "INSERT INTO load SELECT g, repeat(md5(g::text), 8) FROM generate_series(1, $1::int) g",
        &[&(rows as i32)],
    )
    .await?;
    Ok(())
}

/// Ends the current segment; returns its name.
async fn switch_wal(sql: &tokio_postgres::Client) -> Result<String> {
    let row = sql
        .query_one("SELECT pg_walfile_name(pg_switch_wal())", &[])
        .await?;
    Ok(row.get(0))
}

/// `pg_stat_archiver`: the last file archived, archived and failed counts.
async fn archiver_stats(sql: &tokio_postgres::Client) -> Result<(String, i64, i64)> {
    let row = sql
        .query_one(
            "SELECT coalesce(last_archived_wal, ''), archived_count, failed_count FROM pg_stat_archiver",
            &[],
        )
        .await?;
    Ok((row.get(0), row.get(1), row.get(2)))
}

async fn until_archived(primary: &Instance, last: &str, timeout: Duration) -> Result<(i64, i64)> {
    let sql = primary.sql().await?;
    let start = Instant::now();
    loop {
        let (archived, count, failed) = archiver_stats(&sql).await?;
        if archived.as_str() >= last {
            return Ok((count, failed));
        }
        if start.elapsed() > timeout {
            return Err(
                format!("{last} not archived in {timeout:?}; last archived {archived:?}").into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The position of a 16 MiB segment in the WAL (timeline aside).
fn segment_number(name: &str) -> u64 {
    let log = u64::from_str_radix(&name[8..16], 16).unwrap_or(0);
    let seg = u64::from_str_radix(&name[16..24], 16).unwrap_or(0);
    log * 0x100 + seg
}

/// The segments in the bucket, which must follow each other without a gap.
async fn archived_segments(bucket: &str) -> Result<Vec<String>> {
    let names: Vec<String> = archive(bucket)
        .list()
        .await?
        .into_iter()
        .filter(WalName::is_segment)
        .map(|n| n.to_string())
        .collect();
    for pair in names.windows(2) {
        assert_eq!(
            segment_number(&pair[1]),
            segment_number(&pair[0]) + 1,
            "a gap in the archive between {} and {}",
            pair[0],
            pair[1]
        );
    }
    Ok(names)
}

#[tokio::test]
async fn every_wal_file_reaches_the_bucket_under_load() -> Result {
    let mut fixture = Fixture::new("archive-load", &[])?;
    let bucket = new_bucket().await?;
    let spec = fixture.instance("orders-0", "primary")?;
    let spec = fixture.archiving_to(spec, cluster().s3_endpoint(), &bucket)?;
    let primary = fixture.start(&spec)?;
    primary.wait_ready(Duration::from_secs(60)).await?;
    let sql = primary.sql().await?;
    let started = Instant::now();
    let mut largest_backlog = 0.0f64;
    for _ in 0..12 {
        write_wal(&sql, 32).await?;
        let pending = primary
            .metric("cairn_postgres_wal_archive_pending_files")
            .await?
            .unwrap_or(0.0);
        largest_backlog = largest_backlog.max(pending);
    }
    let last = switch_wal(&sql).await?;
    let (count, failed) = until_archived(&primary, &last, Duration::from_secs(120)).await?;
    let elapsed = started.elapsed();
    assert_eq!(failed, 0, "pg_stat_archiver counted failures");
    let segments = archived_segments(&bucket).await?;
    assert!(
        segments.first().is_some_and(|s| segment_number(s) <= 2),
        "the archive starts late: {segments:?}"
    );
    assert_eq!(segments.last(), Some(&last), "the last segment is missing");
    // The bucket's copy of a segment still in pg_wal is the same bytes.
    let copy = fixture.root.join("copy");
    assert!(archive(&bucket).get(&WalName::parse(&last)?, &copy).await?);
    let original = spec.data_dir().join("pg_wal").join(&last);
    if original.exists() {
        assert!(
            std::fs::read(&copy)? == std::fs::read(&original)?,
            "{last} differs"
        );
    }
    let archived_metric = primary
        .metric("cairn_postgres_wal_archived_files_total")
        .await?;
    assert!(
        archived_metric.unwrap_or(0.0) >= count as f64,
        "metric {archived_metric:?} < {count}"
    );
    println!(
        "archived {count} WAL files ({} segments, 384 MB written) in {:.1} s: {:.1} segments/s; largest backlog {largest_backlog} files",
        segments.len(),
        elapsed.as_secs_f64(),
        segments.len() as f64 / elapsed.as_secs_f64()
    );
    fixture.passed()
}

#[tokio::test]
async fn an_unreachable_bucket_holds_wal_until_it_returns() -> Result {
    let mut fixture = Fixture::new("archive-outage", &[])?;
    let (bucket, proxy, spec, primary, sql) = archiving_through_a_proxy(&fixture, None).await?;

    proxy.inject(Rule::always(Fault::Unreachable));
    let broken = Instant::now();
    let mut held = Vec::new();
    for _ in 0..3 {
        write_wal(&sql, 4).await?;
        held.push(switch_wal(&sql).await?);
    }
    // Seen within a minute: failures counted, the backlog in the metric.
    let seen = loop {
        let failures = primary
            .metric("cairn_postgres_wal_archive_failures_total")
            .await?;
        let pending = primary
            .metric("cairn_postgres_wal_archive_pending_files")
            .await?;
        if failures.unwrap_or(0.0) > 0.0 && pending.unwrap_or(0.0) >= held.len() as f64 {
            break broken.elapsed();
        }
        assert!(
            broken.elapsed() < Duration::from_secs(60),
            "not visible within a minute: failures {failures:?}, pending {pending:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (_, _, failed) = archiver_stats(&sql).await?;
    assert!(failed > 0, "pg_stat_archiver saw no failure");
    // What the membership Lease reports to the controller.
    let status = primary.status().await?;
    assert!(
        status["walArchive"]["failing"].is_string(),
        "the failure is not reported: {status}"
    );
    sql.batch_execute("CHECKPOINT").await?;
    for name in &held {
        let path = spec.data_dir().join("pg_wal").join(name);
        assert!(path.exists(), "{name} left pg_wal before it was archived");
    }

    proxy.heal();
    let healed = Instant::now();
    let last = held.last().cloned().unwrap_or_default();
    until_archived(&primary, &last, Duration::from_secs(150)).await?;
    let caught_up = healed.elapsed();
    primary
        .wait_status("archiving reported healthy", Duration::from_secs(30), |s| {
            s["walArchive"]["failing"].is_null() && s["walArchive"]["lastStored"].is_string()
        })
        .await?;
    let segments = archived_segments(&bucket).await?;
    for name in &held {
        assert!(segments.contains(name), "{name} missing from the bucket");
    }
    println!(
        "outage visible after {:.1} s; {} held segments archived {:.1} s after the bucket returned",
        seen.as_secs_f64(),
        held.len(),
        caught_up.as_secs_f64()
    );
    fixture.passed()
}

#[tokio::test]
async fn the_guard_drops_the_oldest_wal_rather_than_fill_the_volume() -> Result {
    let mut fixture = Fixture::new("archive-guard", &[])?;
    // 40 MiB: two and a half segments may wait.
    let (bucket, proxy, _, primary, sql) =
        archiving_through_a_proxy(&fixture, Some(40 << 20)).await?;

    proxy.inject(Rule::always(Fault::Unreachable));
    let mut switched = Vec::new();
    for _ in 0..5 {
        write_wal(&sql, 2).await?;
        switched.push(switch_wal(&sql).await?);
    }
    primary
        .wait_status("the gap reported", Duration::from_secs(60), |s| {
            s["walArchive"]["gap"].is_string()
        })
        .await?;
    let dropped = primary
        .metric("cairn_postgres_wal_archive_dropped_files_total")
        .await?
        .unwrap_or(0.0);
    assert!(dropped >= 1.0, "nothing dropped");
    let gap = primary.status().await?["walArchive"]["gap"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(gap, switched[0], "the oldest waiting file goes first");
    // What waits comes back within the guard (two segments and a half) as
    // PostgreSQL asks for the oldest files.
    let start = Instant::now();
    let waiting = loop {
        let waiting = primary
            .metric("cairn_postgres_wal_archive_pending_files")
            .await?
            .unwrap_or(f64::MAX);
        if waiting <= 2.0 {
            break waiting;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{waiting} files still wait"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    proxy.heal();
    let last = switched.last().cloned().unwrap_or_default();
    until_archived(&primary, &last, Duration::from_secs(150)).await?;
    let segments: Vec<String> = archive(&bucket)
        .list()
        .await?
        .into_iter()
        .map(|n| n.to_string())
        .collect();
    assert!(
        !segments.contains(&gap),
        "{gap} was dropped, yet it is in the bucket"
    );
    assert!(
        segments.contains(&last),
        "{last} missing after the bucket returned"
    );
    // The gap is still reported: recovery cannot cross it.
    assert_eq!(primary.status().await?["walArchive"]["gap"], gap.as_str());
    println!("guard: {dropped} files dropped, first {gap}; then {waiting} waited");
    fixture.passed()
}
