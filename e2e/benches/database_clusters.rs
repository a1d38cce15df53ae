//! Benchmark (not a test): N single-instance DatabaseClusters against one
//! controller process running with its chart's RBAC. Prints the seconds until
//! all are Ready, the controller's write requests per cluster by verb (audit
//! log), every client's requests by verb (API server metrics) and writes by
//! client (audit log: the operator's share of the API server's work), the
//! time the reconciles took (percentiles), when a quarter, half and three
//! quarters were Ready, the CPU seconds each control-plane process and the
//! controller used until then (where the time went), the controller's RSS
//! with no cluster and after (and so its memory per cached object), its
//! peak RSS, its writes during one idle minute afterwards, and
//! then a restart: a second process's time from start to `/readyz` with
//! every object to cache, and, once the leader is stopped, its time to
//! reconcile every cluster and its writes (none for converged clusters).
//!
//!   hack/bench.sh database-clusters 100
//!
//! With `churn TOTAL`, it creates and deletes TOTAL clusters in batches of
//! 200 (each batch Ready, then deleted, then every child collected and gone
//! from the controller's caches) and prints the controller's settled RSS after a
//! warm-up batch, after each batch and after the churn:
//!
//!   hack/bench.sh churn 2000
//!
//! (builds the release binary, starts a fresh local cluster, runs this with
//! CAIRN_DATABASE_CONTROLLER and CAIRN_CLUSTER_STATE set, stops the cluster).

mod common;

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::{Duration, Instant};

use cairn_api::database::v1::DatabaseCluster;
use cairn_testing::process::ControllerProcess;
use cairn_testing::{Error, audit, cluster, wait};
use common::{
    create, election_lease, process_cpu_seconds, request_counts, rss_kib, start_controller,
    start_replica, until_ready, until_ready_to_serve,
};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Api;
use kube::api::{DeleteParams, ListParams};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let count: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(100);
    if std::env::args().any(|a| a == "churn") {
        return churn(count).await;
    }
    let (namespace, controller, user) = start_controller().await?;
    let local = cluster();
    let requests_before = request_counts(&namespace.client).await?;
    // The process with its caches synced and no cluster yet.
    let empty_cached = cached_objects(&controller).await?;
    let empty_rss = settled_rss_kib(&controller).await;
    let empty_split = rss_split(&controller);

    let clusters = namespace.api::<DatabaseCluster>();
    let busy = busy_processes(&controller);
    let cpu_before = cpu_seconds(&busy);
    let writes_before = audit::write_requests(&local.audit_log())?.len();
    let started = Instant::now();
    create(&clusters, 0..count).await?;
    let created = started.elapsed();
    let progress = until_ready(&clusters, count, started).await?;
    let all_ready = started.elapsed();
    let cpu_used = cpu_seconds(&busy);
    let durations = reconcile_duration_quantiles(
        &controller.metrics().await?,
        "DatabaseCluster",
        &[0.5, 0.9, 0.99],
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let writes = audit::write_requests(&local.audit_log())?;
    let writes_by_client = by_client(&writes[writes_before.min(writes.len())..], &user);
    let controller_writes: Vec<_> = writes
        .iter()
        .filter(|w| w.user == user && w.namespace.as_deref() == Some(namespace.name.as_str()))
        .collect();
    let requests_after = request_counts(&namespace.client).await?;
    let peak_rss = rss_kib(&controller, "VmHWM:");

    let idle_from = controller_writes.len();
    tokio::time::sleep(Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let full_cached = cached_objects(&controller).await?;
    let full_rss = settled_rss_kib(&controller).await;
    let takeover = cold_start_and_takeover(&namespace, controller, &user, count).await?;
    let idle_writes = audit::write_requests(&local.audit_log())?
        .into_iter()
        .filter(|w| w.user == user && w.namespace.as_deref() == Some(namespace.name.as_str()))
        .skip(idle_from)
        .filter(|w| !election_lease(w))
        .count();

    println!("\n## {count} single-instance DatabaseClusters\n");
    println!("| figure | value |\n|---|---|");
    println!(
        "| created (16 at a time) | {:.1} s |",
        created.as_secs_f64()
    );
    println!(
        "| all Ready, from the first create | {:.1} s |",
        all_ready.as_secs_f64()
    );
    println!(
        "| DatabaseCluster reconcile duration until then: p50, p90, p99 (histogram bucket) | {} |",
        durations.join(", ")
    );
    println!(
        "| Ready over time | {} |",
        ready_over_time(&progress, count).join(", ")
    );
    let mut busiest: Vec<(&String, f64)> = cpu_used
        .iter()
        .map(|(name, after)| (name, after - cpu_before.get(name).copied().unwrap_or(0.0)))
        .collect();
    busiest.sort_by(|a, b| b.1.total_cmp(&a.1));
    for (name, seconds) in busiest {
        println!(
            "| CPU until all Ready: {name} | {seconds:.0} s ({:.0} % of a core) |",
            100.0 * seconds / all_ready.as_secs_f64()
        );
    }
    let mut by_verb: BTreeMap<String, usize> = BTreeMap::new();
    for write in &controller_writes {
        if !election_lease(write) {
            *by_verb
                .entry(format!("{} {}", write.verb, write.resource))
                .or_default() += 1;
        }
    }
    for (verb, n) in &by_verb {
        println!(
            "| controller {verb} per cluster | {:.2} |",
            *n as f64 / count as f64
        );
    }
    for (verb, after) in &requests_after {
        let delta = after - requests_before.get(verb).copied().unwrap_or(0.0);
        println!(
            "| API server requests, all clients, {verb} | {delta:.0} ({:.1} per cluster) |",
            delta / count as f64
        );
    }
    // Every client's writes, the control plane's own included: what the
    // API server spent its CPU on, and the operator's share of it.
    for (client, n) in &writes_by_client {
        println!(
            "| API server writes until all Ready (and 3 s after), {client} | {n} ({:.1} per cluster) |",
            *n as f64 / count as f64
        );
    }
    let mib = |kib: Option<u64>| {
        kib.map_or("unknown".to_owned(), |k| {
            format!("{:.1} MiB", k as f64 / 1024.0)
        })
    };
    println!(
        "| controller RSS, caches synced, no cluster ({empty_cached} objects cached) | {} |",
        mib(empty_rss)
    );
    println!(
        "| of which anonymous (heap, stacks) / mapped from the binary and libraries | {} |",
        empty_split.map_or("unknown".to_owned(), |(anon, file)| format!(
            "{} / {}",
            mib(Some(anon)),
            mib(Some(file))
        ))
    );
    println!(
        "| controller RSS after the idle minute ({full_cached} objects cached) | {} |",
        mib(full_rss)
    );
    if let (Some(empty), Some(full)) = (empty_rss, full_rss) {
        // Everything the controller holds for a cluster (cached children,
        // queues, per-cluster state), per cached object.
        println!(
            "| memory per cached object (RSS growth / objects added) | {:.1} KiB |",
            (full as f64 - empty as f64) / (full_cached - empty_cached).max(1.0)
        );
    }
    println!("| controller peak RSS | {} |", mib(peak_rss));
    println!("| controller writes in one idle minute after | {idle_writes} |");
    println!(
        "| a second process, from start to /readyz ({full_cached} objects to cache) | {:.1} s |",
        takeover.cold_start.as_secs_f64()
    );
    println!(
        "| leader change (SIGTERM): the old leader's exit | {:.1} s |",
        takeover.exit.as_secs_f64()
    );
    println!(
        "| leader change: from the old leader's exit until the new one reconciled every cluster | {:.1} s |",
        takeover.reconciled.as_secs_f64()
    );
    println!(
        "| new leader's writes, from the leader change to 30 s after it reconciled every cluster | {} |",
        takeover.writes
    );
    Ok(())
}

/// How many of `writes` each client made, most first: the controller (made
/// as `user`) by that name, every other by the program its user agent names.
fn by_client(writes: &[audit::WriteRequest], user: &str) -> Vec<(String, usize)> {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for write in writes {
        let client = if write.user == user {
            "cairn controller".to_owned()
        } else {
            write
                .client
                .clone()
                .unwrap_or_else(|| "no user agent".to_owned())
        };
        *counts.entry(client).or_default() += 1;
    }
    let mut sorted: Vec<_> = counts.into_iter().collect();
    sorted.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    sorted
}

/// When a quarter, half, three quarters and all of `count` clusters were
/// Ready, from the samples [`until_ready`] took.
fn ready_over_time(progress: &[(Duration, usize)], count: usize) -> Vec<String> {
    [25, 50, 75, 100]
        .into_iter()
        .filter_map(|percent| {
            let (at, _) = progress
                .iter()
                .find(|(_, ready)| ready * 100 >= count * percent)?;
            Some(format!("{percent} % at {:.0} s", at.as_secs_f64()))
        })
        .collect()
}

/// What a restart costs with every cluster's objects present.
struct Takeover {
    /// A second process from start to `/readyz` (its caches synced).
    cold_start: Duration,
    /// From SIGTERM until the leader has exited (it releases its Lease).
    exit: Duration,
    /// From then until the new leader has reconciled every cluster.
    reconciled: Duration,
    /// The new leader's writes (Leases aside) until 30 s after that.
    writes: usize,
}

/// Starts a standby next to the leader `controller`, stops the leader
/// gracefully and times the standby's takeover; counts its writes, which
/// must be none for converged clusters.
async fn cold_start_and_takeover(
    namespace: &cairn_testing::TestNamespace,
    mut controller: ControllerProcess,
    user: &str,
    count: usize,
) -> Result<Takeover, Error> {
    let account = user.rsplit(':').next().unwrap_or_default();
    let started = Instant::now();
    let standby = start_replica(namespace, account, "standby")?;
    until_ready_to_serve(&standby, Duration::from_secs(600)).await?;
    let cold_start = started.elapsed();
    let ours = |w: &cairn_testing::audit::WriteRequest| {
        w.user == user
            && w.namespace.as_deref() == Some(namespace.name.as_str())
            && !election_lease(w)
    };
    let log = cluster().audit_log();
    let before = audit::write_requests(&log)?
        .iter()
        .filter(|w| ours(w))
        .count();
    let stopping = Instant::now();
    controller.terminate()?;
    controller.wait(Duration::from_secs(60)).await?;
    let exit = stopping.elapsed();
    let exited = Instant::now();
    wait::until(
        "the new leader reconciled every cluster",
        Duration::from_secs(900),
        || async {
            let done = reconciles(&standby).await.map_err(|e| e.to_string())?;
            if done >= count as f64 {
                return Ok(Some(()));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            Err(format!("{done} reconciled"))
        },
    )
    .await?;
    let reconciled = exited.elapsed();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let writes = audit::write_requests(&log)?
        .iter()
        .filter(|w| ours(w))
        .count()
        - before;
    Ok(Takeover {
        cold_start,
        exit,
        reconciled,
        writes,
    })
}

/// DatabaseCluster reconciles the process has run, from its metrics.
async fn reconciles(controller: &ControllerProcess) -> Result<f64, Error> {
    Ok(controller
        .metrics()
        .await?
        .lines()
        .filter(|l| {
            l.starts_with("cairn_reconcile_total{") && l.contains(r#"kind="DatabaseCluster""#)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

const CHURN_BATCH: usize = 200;

/// Creates and deletes `total` clusters, a batch at a time, and prints the
/// controller's RSS before and after: per-object state must go with the
/// objects.
async fn churn(total: usize) -> Result<(), Error> {
    let (namespace, controller, _) = start_controller().await?;
    let clusters = namespace.api::<DatabaseCluster>();
    let started = Instant::now();
    // What the caches hold with no cluster (StorageClasses and the like).
    let empty = cached_objects(&controller).await?;
    // A first batch brings the caches and the allocator to working size.
    churn_batch(&clusters, &namespace.name, 0..CHURN_BATCH, started).await?;
    until_caches_hold(&controller, empty).await?;
    let before = settled_rss_kib(&controller).await;
    let mib = |kib: Option<u64>| {
        kib.map_or("unknown".to_owned(), |k| {
            format!("{:.1} MiB", k as f64 / 1024.0)
        })
    };
    eprintln!("warm-up batch gone: RSS {}", mib(before));
    let mut next = CHURN_BATCH;
    while next < CHURN_BATCH + total {
        let end = (next + CHURN_BATCH).min(CHURN_BATCH + total);
        churn_batch(&clusters, &namespace.name, next..end, started).await?;
        // Every child collected and gone from the caches: each batch ends
        // where the warm-up ended, so a leak shows as growth.
        until_caches_hold(&controller, empty).await?;
        eprintln!(
            "{} of {total} created and deleted after {} s: RSS {}",
            end - CHURN_BATCH,
            started.elapsed().as_secs(),
            mib(rss_kib(&controller, "VmRSS:"))
        );
        next = end;
    }
    let after = settled_rss_kib(&controller).await;
    // kube-runtime's Event recorder keeps each Event it published for 6
    // minutes (to count repeats as a series) and drops old ones only when it
    // publishes the next: wait out that window, then one more cluster.
    eprintln!("waiting out the Event recorder's 6-minute window");
    tokio::time::sleep(Duration::from_secs(6 * 60 + 10)).await;
    let last = CHURN_BATCH + total;
    churn_batch(&clusters, &namespace.name, last..last + 1, started).await?;
    until_caches_hold(&controller, empty).await?;
    let after_window = settled_rss_kib(&controller).await;
    println!("\n## {total} DatabaseClusters created and deleted, {CHURN_BATCH} at a time\n");
    println!("| figure | value |\n|---|---|");
    println!(
        "| controller RSS after the warm-up batch | {} |",
        mib(before)
    );
    println!("| controller RSS after the churn | {} |", mib(after));
    println!(
        "| controller RSS once the Event recorder forgot the churn's Events | {} |",
        mib(after_window)
    );
    if let (Some(before), Some(after)) = (before, after_window) {
        println!(
            "| change from after the warm-up | {:+.1} % |",
            (after as f64 - before as f64) * 100.0 / before as f64
        );
    }
    println!("| objects in the controller's caches after | {empty} |");
    println!(
        "| controller peak RSS | {} |",
        mib(rss_kib(&controller, "VmHWM:"))
    );
    println!("| duration | {:.0} s |", started.elapsed().as_secs_f64());
    drop(controller);
    Ok(())
}

/// The controller's RSS once the allocator has returned what it frees:
/// jemalloc purges freed pages after a decay time (10 s), so a figure read
/// the moment the caches empty still holds the last batch's pages. Sampled
/// every second until ten samples in a row stay within 1 MiB (at most 60 s).
async fn settled_rss_kib(controller: &ControllerProcess) -> Option<u64> {
    let mut samples: Vec<u64> = Vec::new();
    for _ in 0..60 {
        samples.push(rss_kib(controller, "VmRSS:")?);
        let last = &samples[samples.len().saturating_sub(10)..];
        let spread = last.iter().max()? - last.iter().min()?;
        if last.len() == 10 && spread <= 1024 {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    samples.last().copied()
}

/// The controller's RSS split into its anonymous pages (heap, stacks: what
/// it allocated) and its file-backed ones (the executable's and libraries'
/// pages it touched, shared with every process mapping the same files).
fn rss_split(controller: &ControllerProcess) -> Option<(u64, u64)> {
    Some((
        rss_kib(controller, "RssAnon:")?,
        rss_kib(controller, "RssFile:")?,
    ))
}

/// The objects in the controller's caches, from its metrics.
async fn cached_objects(controller: &ControllerProcess) -> Result<f64, Error> {
    Ok(controller
        .metrics()
        .await?
        .lines()
        .filter(|l| l.starts_with("cairn_objects_in_cache{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// Waits until the garbage collector has removed every child and the
/// controller's caches hold `count` objects again.
async fn until_caches_hold(controller: &ControllerProcess, count: f64) -> Result<(), Error> {
    wait::until(
        "every child collected",
        Duration::from_secs(1800),
        || async {
            let cached = cached_objects(controller)
                .await
                .map_err(|e| e.to_string())?;
            if cached <= count {
                return Ok(Some(()));
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
            Ok(None)
        },
    )
    .await
}

/// One batch: created, all Ready, and deleted with its volumes.
async fn churn_batch(
    clusters: &Api<DatabaseCluster>,
    namespace: &str,
    range: Range<usize>,
    started: Instant,
) -> Result<(), Error> {
    let count = range.len();
    create(clusters, range).await?;
    until_ready(clusters, count, started).await?;
    clusters
        .delete_collection(&DeleteParams::background(), &ListParams::default())
        .await?;
    wait::until("the batch gone", Duration::from_secs(600), || async {
        let left = clusters
            .list_metadata(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        Ok(left.items.is_empty().then_some(()))
    })
    .await?;
    // Volumes outlive their cluster (the data is kept): the user deletes them.
    let volumes =
        Api::<PersistentVolumeClaim>::namespaced(clusters.clone().into_client(), namespace);
    volumes
        .delete_collection(&DeleteParams::background(), &ListParams::default())
        .await?;
    Ok(())
}

/// The processes whose CPU time says where a benchmark's time went: the
/// local control plane's (from the cluster's pid files) and the controller.
fn busy_processes(controller: &ControllerProcess) -> Vec<(String, u32)> {
    let pids = cluster().state_dir().join("pids");
    let mut processes: Vec<(String, u32)> = [
        "kube-apiserver",
        "etcd",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
    ]
    .into_iter()
    .filter_map(|name| {
        let line = std::fs::read_to_string(pids.join(format!("{name}.pid"))).ok()?;
        let pid: u32 = line.split_whitespace().next()?.parse().ok()?;
        // A supervised component's pid file names its supervising shell.
        let child = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .ok()
            .and_then(|children| children.split_whitespace().next()?.parse().ok());
        Some((name.to_owned(), child.unwrap_or(pid)))
    })
    .collect();
    if let Some(pid) = controller.pid() {
        processes.push(("cairn controller".to_owned(), pid));
    }
    processes
}

/// CPU seconds (user and system) each process has used so far.
fn cpu_seconds(processes: &[(String, u32)]) -> BTreeMap<String, f64> {
    processes
        .iter()
        .filter_map(|(name, pid)| Some((name.clone(), process_cpu_seconds(*pid)?)))
        .collect()
}

/// The upper bounds of the histogram buckets holding quantiles `quantiles`
/// of the controller's reconcile durations for `kind` (Prometheus text).
fn reconcile_duration_quantiles(metrics: &str, kind: &str, quantiles: &[f64]) -> Vec<String> {
    let kind_label = format!(r#"kind="{kind}""#);
    let buckets: Vec<(String, f64)> = metrics
        .lines()
        .filter(|l| {
            l.starts_with("cairn_reconcile_duration_seconds_bucket{") && l.contains(&kind_label)
        })
        .filter_map(|l| {
            let le = l.split(r#"le=""#).nth(1)?.split('"').next()?.to_owned();
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect();
    let total = buckets.last().map_or(0.0, |(_, n)| *n);
    quantiles
        .iter()
        .map(|q| {
            buckets
                .iter()
                .find(|(_, n)| *n >= q * total && total > 0.0)
                .map_or("unknown".to_owned(), |(le, _)| format!("≤ {le} s"))
        })
        .collect()
}
