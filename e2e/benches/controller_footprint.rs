//! Benchmark (not a test): what each controller costs as its chart deploys
//! it. The database, backup and cloud controllers installed by their charts
//! on the real nodes (two replicas each, restricted Pod Security, the
//! self-managed webhook certificates), watching a namespace with nothing in
//! it; after an idle minute, each replica's process as the node's kernel
//! sees it: RSS (anonymous, and mapped from the image's files), threads and
//! CPU seconds since it started. This is the figure a user's node pays; the
//! database benchmark's local process reads a kubeconfig file (a YAML
//! parser's code) instead of the pod's ServiceAccount files, and serves no
//! webhook.
//!
//!   hack/bench.sh footprint

use std::time::Duration;

use cairn_e2e::real::{enforce_restricted_pod_security, install_chart};
use cairn_testing::{Error, cluster};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::ListParams;

// Its /proc readers; the rest is the database benchmarks'.
#[allow(dead_code)]
mod common;

const CHARTS: [&str; 3] = [
    "cairn-database-controller",
    "cairn-backup-controller",
    "cairn-cloud-controller",
];
const IDLE: Duration = Duration::from_secs(60);

#[tokio::main]
async fn main() -> Result<(), Error> {
    let ns = cluster().namespace_on_real_nodes("bench-footprint").await?;
    enforce_restricted_pod_security(&ns).await?;
    for chart in CHARTS {
        install_chart(&ns, chart).await?;
    }
    eprintln!(
        "three charts installed, two replicas each; idle for {} s",
        IDLE.as_secs()
    );
    tokio::time::sleep(IDLE).await;

    let holders: Vec<String> = ns
        .api::<Lease>()
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|l| l.spec.and_then(|s| s.holder_identity))
        .collect();
    println!(
        "\n| controller (its chart, idle, nothing to watch) | replica | RSS | anonymous / mapped from files | threads | CPU since start |"
    );
    println!("|---|---|---|---|---|---|");
    for chart in CHARTS {
        let selector = format!("app.kubernetes.io/name={chart}");
        let pods = ns
            .api::<Pod>()
            .list(&ListParams::default().labels(&selector))
            .await?;
        let mut rows: Vec<(bool, String)> = Vec::new();
        for pod in &pods.items {
            let leader = holders.contains(&pod.name_any());
            let role = if leader { "leader" } else { "standby" };
            let uid = pod.uid().unwrap_or_default();
            let Some(pid) = container_process(&uid) else {
                rows.push((
                    leader,
                    format!("| {chart} | {role} | no process found | | | |"),
                ));
                continue;
            };
            let kib = |field| common::status_kib(pid, field).unwrap_or(0);
            rows.push((
                leader,
                format!(
                    "| {chart} | {role} | {:.1} MiB | {:.1} / {:.1} MiB | {} | {:.2} s |",
                    mib(kib("VmRSS:")),
                    mib(kib("RssAnon:")),
                    mib(kib("RssFile:")),
                    kib("Threads:"),
                    common::process_cpu_seconds(pid).unwrap_or(0.0),
                ),
            ));
        }
        rows.sort_by_key(|(leader, _)| !leader);
        for (_, row) in rows {
            println!("{row}");
        }
    }
    Ok(())
}

/// The process of the pod with `uid` that is not its sandbox's `pause`: the
/// controller, found by the pod's cgroup, which every process of the pod is
/// in (`.../pod<uid>/<container>`).
fn container_process(uid: &str) -> Option<u32> {
    let marker = format!("pod{uid}/");
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            let in_pod = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .is_ok_and(|cgroup| cgroup.contains(&marker));
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            in_pod && comm.trim() != "pause"
        })
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}
