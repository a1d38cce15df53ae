//! Benchmark (not a test): cairn-instance with real PostgreSQL servers on
//! loopback. Prints the time to a ready primary, a base backup's throughput,
//! pgbench's rate with a streaming replica and that replica's lag under it,
//! the instance's own memory, CPU and queries while idle, and a switchover.
//!
//!   hack/bench.sh instance [PGBENCH_SCALE]   (default 10: about 160 MB)

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use support::{Fixture, Result, database_size, pgbench};

#[tokio::main]
async fn main() -> Result {
    let scale = support::scale_arg(10);
    let mut fixture = Fixture::new("bench", &[])?;
    // The default poll (tests poll faster): the idle cost below is production's.
    let primary_spec = fixture
        .instance("orders-0", "primary")?
        .env("CAIRN_POLL_MILLISECONDS", "1000");
    let mut primary = fixture.start(&primary_spec)?;
    let took = primary.wait_ready(Duration::from_secs(120)).await?;
    println!(
        "primary ready after start (initdb)      {:>8.2} s",
        took.as_secs_f64()
    );

    let started = Instant::now();
    pgbench(&fixture, &primary, &["-i", "-q", "-s", &scale.to_string()]).await?;
    let size = database_size(&primary).await?;
    println!(
        "pgbench -i -s {scale}                        {:>8.2} s ({:.0} MB)",
        started.elapsed().as_secs_f64(),
        size as f64 / 1e6
    );

    let replica_spec = fixture.instance("orders-1", "replica")?.following(&primary);
    let replica = fixture.start(&replica_spec)?;
    let took = replica.wait_ready(Duration::from_secs(600)).await?;
    println!(
        "replica ready after start (base backup)  {:>8.2} s ({:.0} MB/s)",
        took.as_secs_f64(),
        size as f64 / 1e6 / took.as_secs_f64()
    );

    // Write load on the primary while the replica's lag is sampled.
    let sampler = {
        let http = replica.spec.http;
        tokio::spawn(async move {
            let (mut bytes, mut seconds) = (0i64, 0f64);
            let until = Instant::now() + Duration::from_secs(31);
            while Instant::now() < until {
                if let Ok((_, body)) = cairn_testing::process::http_get(http, "/status").await
                    && let Ok(status) = serde_json::from_str::<serde_json::Value>(&body)
                {
                    bytes = bytes.max(status["replicationLagBytes"].as_i64().unwrap_or(0));
                    seconds = seconds.max(status["replicationLagSeconds"].as_f64().unwrap_or(0.0));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (bytes, seconds)
        })
    };
    let output = pgbench(&fixture, &primary, &["-c", "4", "-j", "2", "-T", "30"]).await?;
    let tps = output
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|tps| tps.parse::<f64>().ok())
        .unwrap_or(f64::NAN);
    let load_ended = Instant::now();
    let (max_bytes, max_seconds) = sampler.await?;
    println!("pgbench 4 clients, 30 s, with a replica {tps:>8.0} transactions/s");
    println!(
        "replica lag under that load (max)        {:>8} bytes, {max_seconds:.2} s",
        max_bytes
    );
    replica
        .wait_status("caught up", Duration::from_secs(120), |s| {
            s["replicationLagBytes"] == 0
        })
        .await?;
    println!(
        "replica caught up after the load         {:>8.2} s",
        load_ended.elapsed().as_secs_f64()
    );

    // The instance's own cost while idle: memory, CPU, and the queries it sends.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let pid = primary.pid().ok_or("the primary's instance exited")?;
    let commits = |client: tokio_postgres::Client| async move {
        let row = client
            .query_one(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = 'postgres'",
                &[],
            )
            .await?;
        Ok::<i64, tokio_postgres::Error>(row.get(0))
    };
    let (cpu_before, commits_before) = (cpu_ticks(pid)?, commits(primary.sql().await?).await?);
    let window = Duration::from_secs(30);
    tokio::time::sleep(window).await;
    let (cpu_after, commits_after) = (cpu_ticks(pid)?, commits(primary.sql().await?).await?);
    let ticks_per_second = 100.0; // USER_HZ on Linux
    let cpu = (cpu_after - cpu_before) as f64 / ticks_per_second / window.as_secs_f64() * 100.0;
    // Each of the two reading sessions here commits once; the rest is the instance.
    let per_second = (commits_after - commits_before - 2) as f64 / window.as_secs_f64();
    println!(
        "instance RSS (peak / now)                {:>8} / {} KiB",
        status_field(pid, "VmHWM")?,
        status_field(pid, "VmRSS")?
    );
    println!("instance CPU while idle                  {cpu:>8.2} % of one core");
    println!("instance transactions while idle         {per_second:>8.1} per second (1 s poll)");

    // Switchover: the primary stops cleanly, the replica is promoted.
    primary.terminate(Duration::from_secs(60)).await?;
    fixture.assign(&replica_spec, "primary")?;
    let took = replica
        .wait_status("promoted", Duration::from_secs(60), |s| {
            s["ready"] == true && s["role"] == "primary"
        })
        .await?;
    println!(
        "promotion, role change to ready primary  {:>8.2} s",
        took.as_secs_f64()
    );
    fixture.passed()
}

/// User plus system CPU time of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .map(|(_, rest)| rest)
        .unwrap_or("")
        .split(' ')
        .collect();
    // After the command name: state is field 0, utime 11, stime 12.
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok(field(11) + field(12))
}

fn status_field(pid: u32, name: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .ok_or_else(|| format!("no {name} in /proc/{pid}/status").into())
}
