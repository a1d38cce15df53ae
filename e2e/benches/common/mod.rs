//! What the controller benchmarks share: Cairn's database controller started
//! as a process with its chart's RBAC, single-instance DatabaseClusters
//! created and waited for, and the figures read from the API server and
//! /proc. Included as a module by each benchmark (`mod common;`).

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cairn_api::database::v1::{DatabaseCluster, DatabaseClusterSpec};
use cairn_testing::process::ControllerProcess;
use cairn_testing::{Error, TestNamespace, audit, cluster, crds, wait};
use futures::{StreamExt, TryStreamExt};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};

const CHART: &str = "cairn-database-controller";

/// Cairn's database controller as a process with its chart's RBAC, watching
/// a fresh namespace; returns the namespace, the process and its user name.
pub async fn start_controller() -> Result<(TestNamespace, ControllerProcess, String), Error> {
    let local = cluster();
    let namespace = local.namespace("bench").await?;
    crds::install(&namespace.client, &cairn_api::crds::for_chart(CHART)).await?;
    let account = local
        .install_controller_rbac(CHART, "bench", &namespace.name)
        .await?;
    let user = format!("system:serviceaccount:{}:{account}", namespace.name);
    let controller = start_replica(&namespace, &account, "controller")?;
    until_ready_to_serve(&controller, Duration::from_secs(60)).await?;
    Ok((namespace, controller, user))
}

/// One more process of the controller started by [`start_controller`] in
/// `namespace`, as ServiceAccount `account`, named `<namespace>-<name>`: a
/// replica that waits for the leader Lease.
pub fn start_replica(
    namespace: &TestNamespace,
    account: &str,
    name: &str,
) -> Result<ControllerProcess, Error> {
    let binary = PathBuf::from(std::env::var("CAIRN_DATABASE_CONTROLLER").map_err(|_| {
        Error::Setup(
            "set CAIRN_DATABASE_CONTROLLER to the controller binary (hack/bench.sh does)".into(),
        )
    })?);
    let local = cluster();
    let kubeconfig = local.service_account_kubeconfig(&namespace.name, account)?;
    ControllerProcess::start(
        local,
        &binary,
        &format!("{}-{name}", namespace.name),
        &kubeconfig,
        &[
            ("CAIRN_NAMESPACES", namespace.name.as_str()),
            ("CAIRN_LEASE_NAMESPACE", namespace.name.as_str()),
            ("CAIRN_LOG_LEVEL", "info"),
        ],
    )
}

/// Until `controller` answers `/readyz` (its caches synced).
pub async fn until_ready_to_serve(
    controller: &ControllerProcess,
    timeout: Duration,
) -> Result<(), Error> {
    wait::until("controller ready", timeout, || async {
        match controller.get("/readyz").await {
            Ok((200, _)) => Ok(Some(())),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

/// Creates single-instance clusters `db-NNNNN` for `range`, 16 at a time.
pub async fn create(clusters: &Api<DatabaseCluster>, range: Range<usize>) -> Result<(), Error> {
    futures::stream::iter(range)
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
                        &DatabaseCluster::new(&format!("db-{i:05}"), spec),
                    )
                    .await
                    .map(drop)
                    .map_err(Error::from)
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await
        .map(drop)
}

/// Waits until `count` clusters exist and all are Ready; returns how many
/// were Ready when, from `started`, at each look (every 2 s or so).
pub async fn until_ready(
    clusters: &Api<DatabaseCluster>,
    count: usize,
    started: Instant,
) -> Result<Vec<(Duration, usize)>, Error> {
    let progress = std::sync::Mutex::new(Vec::new());
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
            if let Ok(mut progress) = progress.lock() {
                progress.push((started.elapsed(), ready));
            }
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
    eprintln!();
    Ok(progress.into_inner().unwrap_or_default())
}

/// `apiserver_request_total` summed by verb, from the API server's metrics.
pub async fn request_counts(client: &Client) -> Result<BTreeMap<String, f64>, Error> {
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

/// A memory figure of a controller from /proc (`VmRSS:` now, `VmHWM:` the
/// peak), in KiB.
pub fn rss_kib(process: &ControllerProcess, field: &str) -> Option<u64> {
    status_kib(process.pid()?, field)
}

/// A field of `/proc/PID/status` as a number (`VmRSS:` in KiB, `Threads:`).
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .ok()
}

/// CPU seconds (user and system) process `pid` has used so far.
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    let ticks = *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    });
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name: state is the 1st field, utime the 12th, stime the 13th.
    let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split(' ').collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / ticks)
}

/// A write to a Lease that is not a cluster's (Cairn's per-cluster
/// membership Leases are named after their cluster, `db-…`): the operator's
/// leader election, renewed every few seconds whatever the load.
pub fn election_lease(write: &audit::WriteRequest) -> bool {
    write.resource == "leases" && !write.name.as_deref().is_some_and(|n| n.starts_with("db-"))
}
