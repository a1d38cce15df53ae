//! Benchmark (not a test): N single-instance DatabaseClusters against one
//! controller process running with its chart's RBAC. Prints the seconds until
//! all are Ready, the controller's write requests per cluster by verb (audit
//! log), every client's requests by verb (API server metrics), the
//! controller's peak RSS, and its writes during one idle minute afterwards.
//!
//!   hack/bench.sh database-clusters 100
//!
//! (builds the release binary, starts a fresh local cluster, runs this with
//! CAIRN_DATABASE_CONTROLLER and CAIRN_CLUSTER_STATE set, stops the cluster).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cairn_api::database::v1::{DatabaseCluster, DatabaseClusterSpec};
use cairn_testing::process::ControllerProcess;
use cairn_testing::{Error, audit, cluster, crds, wait};
use futures::{StreamExt, TryStreamExt};
use kube::Client;
use kube::api::{ListParams, PostParams};

const CHART: &str = "cairn-database-controller";

#[tokio::main]
async fn main() -> Result<(), Error> {
    let count: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(100);
    let binary = PathBuf::from(std::env::var("CAIRN_DATABASE_CONTROLLER").map_err(|_| {
        Error::Setup(
            "set CAIRN_DATABASE_CONTROLLER to the controller binary (hack/bench.sh does)".into(),
        )
    })?);
    let local = cluster();
    let namespace = local.namespace("bench").await?;
    crds::install(&namespace.client, &cairn_api::crds::for_chart(CHART)).await?;
    let account = local
        .install_controller_rbac(CHART, "bench", &namespace.name)
        .await?;
    let user = format!("system:serviceaccount:{}:{account}", namespace.name);
    let kubeconfig = local.service_account_kubeconfig(&namespace.name, &account)?;
    let controller = ControllerProcess::start(
        local,
        &binary,
        &format!("{}-controller", namespace.name),
        &kubeconfig,
        &[
            ("CAIRN_NAMESPACES", namespace.name.as_str()),
            ("CAIRN_LEASE_NAMESPACE", namespace.name.as_str()),
            ("CAIRN_LOG_LEVEL", "info"),
        ],
    )?;
    wait::until("controller ready", Duration::from_secs(60), || async {
        match controller.get("/readyz").await {
            Ok((200, _)) => Ok(Some(())),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    let requests_before = request_counts(&namespace.client).await?;

    let clusters = namespace.api::<DatabaseCluster>();
    let started = Instant::now();
    futures::stream::iter(0..count)
        .map(|i| {
            let clusters = clusters.clone();
            async move {
                let spec: DatabaseClusterSpec = serde_json::from_value(serde_json::json!({
                    "instances": 1, "postgres": {"version": "17"}, "storage": {"size": "1Gi"}
                }))
                .map_err(|e| Error::Setup(e.to_string()))?;
                clusters
                    .create(
                        &PostParams::default(),
                        &DatabaseCluster::new(&format!("db-{i:04}"), spec),
                    )
                    .await
                    .map(drop)
                    .map_err(Error::from)
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    let created = started.elapsed();
    wait::until(
        &format!("{count} clusters Ready"),
        Duration::from_secs(3600),
        || async {
            let list = clusters
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let ready = list
                .items
                .iter()
                .filter(|c| wait::condition_status(c, "Ready").as_deref() == Some("True"))
                .count();
            if ready == count {
                return Ok(Some(()));
            }
            eprint!(
                "\r{ready}/{count} Ready after {} s   ",
                started.elapsed().as_secs()
            );
            // Listing every cluster is load on the API server too: not too often.
            tokio::time::sleep(Duration::from_secs(2)).await;
            Ok(None)
        },
    )
    .await?;
    let all_ready = started.elapsed();
    eprintln!();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let writes = audit::write_requests(&local.audit_log())?;
    let controller_writes: Vec<_> = writes
        .iter()
        .filter(|w| w.user == user && w.namespace.as_deref() == Some(namespace.name.as_str()))
        .collect();
    let requests_after = request_counts(&namespace.client).await?;
    let peak_rss = peak_rss_kib(&controller);

    let idle_from = controller_writes.len();
    tokio::time::sleep(Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_writes = audit::write_requests(&local.audit_log())?
        .into_iter()
        .filter(|w| w.user == user && w.namespace.as_deref() == Some(namespace.name.as_str()))
        .skip(idle_from)
        .filter(|w| w.resource != "leases")
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
    let mut by_verb: BTreeMap<String, usize> = BTreeMap::new();
    for write in &controller_writes {
        if write.resource != "leases" {
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
    match peak_rss {
        Some(kib) => println!("| controller peak RSS | {:.1} MiB |", kib as f64 / 1024.0),
        None => println!("| controller peak RSS | unknown |"),
    }
    println!("| controller writes in one idle minute after | {idle_writes} |");
    drop(controller);
    Ok(())
}

/// `apiserver_request_total` summed by verb, from the API server's metrics.
async fn request_counts(client: &Client) -> Result<BTreeMap<String, f64>, Error> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(|e| Error::Setup(e.to_string()))?;
    let text = client.request_text(request).await?;
    let mut counts = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let verb = line
            .split("verb=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or("?")
            .to_owned();
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *counts.entry(verb).or_insert(0.0) += value;
    }
    Ok(counts)
}

/// The controller's peak resident set (VmHWM), in KiB.
fn peak_rss_kib(process: &ControllerProcess) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{}/status", process.pid()?)).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .ok()
}
