//! Benchmark (not a test): Cairn's database controller and CloudNativePG's
//! operator side by side on one local cluster, one at a time, each against N
//! equivalent single-instance clusters on the kwok nodes (one fresh
//! namespace each, created the same way; the operator's ServiceAccount, Lease
//! and clusters in it). Prints, for each: RSS before any cluster, peak, and
//! after an idle minute; CPU seconds; its write requests per cluster by verb
//! (audit log, attributed to its ServiceAccount); every client's requests per
//! cluster by verb (API server metrics); its writes and reconciles in an idle
//! minute; and the ratios Cairn/CloudNativePG.
//!
//!   hack/bench.sh cnpg-side-by-side 100
//!
//! (builds both, starts a fresh local cluster, runs this with
//! CAIRN_DATABASE_CONTROLLER, CAIRN_CNPG_BIN and CAIRN_CLUSTER_STATE set,
//! stops the cluster).
//!
//! CloudNativePG's instance manager cannot run in a kwok pod: its operator
//! calls every instance at `https://<pod IP>:8000`, and kwok's pod addresses
//! are blackholed on this machine (checked before it starts, and for every
//! one of its pods after), so each call fails at once and the cluster stays
//! in phase "Instance Status Extraction Error", reconciled again every 10 s.
//! What compares: memory and the API cost of creating the same objects. What
//! does not: readiness (Cairn's clusters are Ready, CloudNativePG's have
//! their instance pod Running), and CPU and reconciles while idle (inflated
//! for CloudNativePG by that 10-second loop, which a healthy install does
//! not run).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cairn_api::database::v1::DatabaseCluster;
use cairn_testing::process::{ControllerProcess, free_address, http_get};
use cairn_testing::{Error, audit, cluster, wait};
use common::{
    create, election_lease, process_cpu_seconds, request_counts, rss_kib, start_controller,
    until_ready,
};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::{Api, Client};

/// CloudNativePG's Cluster, as its CRD (from the pinned module) defines it.
fn cnpg_cluster_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "postgresql.cnpg.io",
        "v1",
        "Cluster",
    ))
}

/// The figures of one operator's run.
#[derive(Default)]
struct Figures {
    rss_empty_kib: Option<u64>,
    rss_peak_kib: Option<u64>,
    rss_idle_kib: Option<u64>,
    cpu_converge: f64,
    cpu_idle_minute: f64,
    converged_secs: f64,
    /// `verb resource[/subresource]` → requests, the leader election's
    /// Lease apart.
    writes: BTreeMap<String, usize>,
    failed_writes: usize,
    lease_writes: usize,
    /// Every client's requests by verb, from the API server's metrics.
    all_clients: BTreeMap<String, f64>,
    /// `verb resource[/subresource]` → requests in the idle minute.
    idle_writes: BTreeMap<String, usize>,
    idle_lease_writes: usize,
    idle_reconciles: Option<f64>,
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let count: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(100);
    let cnpg_bin = PathBuf::from(std::env::var("CAIRN_CNPG_BIN").map_err(|_| {
        Error::Setup(
            "set CAIRN_CNPG_BIN to the folder hack/build-tools.sh cnpg prints (hack/bench.sh does)"
                .into(),
        )
    })?);
    eprintln!("Cairn: {count} DatabaseClusters");
    let (cairn_namespace, cairn) = run_cairn(count).await?;
    eprintln!(
        "Cairn: RSS {:?} KiB empty, {:?} KiB peak, {:?} KiB after the idle minute; CPU {:.1} s \
         to converged, {:.2} s idle; {:.2} writes per cluster {:?}; idle minute {:?}",
        cairn.rss_empty_kib,
        cairn.rss_peak_kib,
        cairn.rss_idle_kib,
        cairn.cpu_converge,
        cairn.cpu_idle_minute,
        cairn.writes.values().sum::<usize>() as f64 / count as f64,
        cairn.writes,
        cairn.idle_writes,
    );
    // The guard: the kwok pods' addresses (Cairn's, from the same range
    // CloudNativePG's get) route nowhere but a local blackhole.
    let cairn_pods = Api::<Pod>::namespaced(cairn_namespace.client.clone(), &cairn_namespace.name);
    let route = check_blackholed(&cairn_pods, "").await?;
    eprintln!("kwok pod addresses are blackholed here ({route}): starting CloudNativePG");

    eprintln!("CloudNativePG: {count} Clusters");
    let (cnpg, cnpg_route, phases) = run_cnpg(count, &cnpg_bin).await?;

    print(count, &cairn, &cnpg, &cnpg_route, &phases);
    // The namespaces go with the local cluster: deleting thousands of
    // objects here would only keep the garbage collector busy.
    drop(cairn_namespace);
    Ok(())
}

async fn run_cairn(count: usize) -> Result<(cairn_testing::TestNamespace, Figures), Error> {
    let local = cluster();
    let (namespace, controller, user) = start_controller().await?;
    let mut figures = Figures {
        rss_empty_kib: settled_empty_rss(&controller).await,
        ..Figures::default()
    };
    let requests_before = request_counts(&namespace.client).await?;
    let cpu_start = cpu_seconds(&controller).unwrap_or(0.0);
    let clusters = namespace.api::<DatabaseCluster>();
    let started = Instant::now();
    create(&clusters, 0..count).await?;
    until_ready(&clusters, count, started).await?;
    figures.converged_secs = started.elapsed().as_secs_f64();
    converge_figures(
        &mut figures,
        &local.audit_log(),
        &user,
        &namespace.client,
        &requests_before,
        &controller,
        cpu_start,
    )
    .await?;
    let reconciles = || async {
        controller.metrics().await.ok().map(|m| {
            m.lines()
                .filter(|l| l.starts_with("cairn_reconcile_total{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
        })
    };
    idle_minute(
        &mut figures,
        &local.audit_log(),
        &user,
        &controller,
        reconciles,
    )
    .await?;
    drop(controller);
    Ok((namespace, figures))
}

/// CloudNativePG's operator outside a cluster, as far as it can go: its CRDs
/// and ClusterRole from the pinned module, a ServiceAccount, the namespace
/// file of a pod (in a private mount namespace), a webhook certificate of its
/// own (so it skips its certificate setup), and its binary where its image
/// has it (`operator/manager_amd64`, which it serves to its instances).
async fn run_cnpg(
    count: usize,
    bin: &Path,
) -> Result<(Figures, String, BTreeMap<String, usize>), Error> {
    let local = cluster();
    let namespace = local.namespace("cnpg").await?;
    let crds = bin.join("cnpg-crds.yaml");
    let crds = crds.to_string_lossy();
    local
        .kubectl(&["apply", "--server-side", "-f", &crds])
        .await?;
    local
        .kubectl(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "-f",
            &crds,
        ])
        .await?;
    local
        .kubectl(&["apply", "-f", &bin.join("cnpg-role.yaml").to_string_lossy()])
        .await?;
    let account = "cnpg-manager";
    namespace.create_service_account(account).await?;
    local
        .kubectl(&[
            "create",
            "clusterrolebinding",
            &format!("{}-manager", namespace.name),
            "--clusterrole=manager",
            &format!("--serviceaccount={}:{account}", namespace.name),
        ])
        .await?;
    let user = format!("system:serviceaccount:{}:{account}", namespace.name);
    let kubeconfig = local.service_account_kubeconfig(&namespace.name, account)?;

    let work = local.state_dir().join("cnpg").join(&namespace.name);
    let setup = |e: std::io::Error| Error::Setup(format!("{}: {e}", work.display()));
    for dir in ["operator", "plugins", "webhook"] {
        std::fs::create_dir_all(work.join(dir)).map_err(setup)?;
    }
    let manager = std::fs::canonicalize(bin.join("cnpg-manager")).map_err(setup)?;
    std::os::unix::fs::symlink(&manager, work.join("operator/manager_amd64")).map_err(setup)?;
    let certificate = tokio::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=cnpg-webhook",
            "-keyout",
        ])
        .arg(work.join("webhook/apiserver.key"))
        .arg("-out")
        .arg(work.join("webhook/apiserver.crt"))
        .output()
        .await
        .map_err(setup)?;
    if !certificate.status.success() {
        return Err(Error::Setup(format!(
            "openssl: {}",
            String::from_utf8_lossy(&certificate.stderr)
        )));
    }
    let metrics = free_address()?;
    let webhook = free_address()?;
    // Outside a pod, controller-runtime's leader election reads the pod's
    // namespace file: a private mount namespace gets one, the machine's /run
    // untouched.
    let script = work.join("run.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nset -e\ncd '{work}'\nexec unshare --mount --propagation private /bin/sh -c \
             'mount -t tmpfs cnpg-run /run && mkdir -p /run/secrets/kubernetes.io/serviceaccount && \
             printf %s \"$OPERATOR_NAMESPACE\" >/run/secrets/kubernetes.io/serviceaccount/namespace && \
             exec \"$0\" \"$@\"' '{manager}' controller --leader-elect \
             --metrics-bind-address={metrics} --webhook-port={port}\n",
            work = work.display(),
            manager = manager.display(),
            port = webhook.port(),
        ),
    )
    .map_err(setup)?;
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .map_err(setup)?;
    let plugins = work.join("plugins").to_string_lossy().into_owned();
    let certificates = work.join("webhook").to_string_lossy().into_owned();
    let controller = ControllerProcess::start(
        local,
        &script,
        &format!("{}-operator", namespace.name),
        &kubeconfig,
        &[
            ("OPERATOR_NAMESPACE", namespace.name.as_str()),
            ("WATCH_NAMESPACE", namespace.name.as_str()),
            ("PLUGIN_SOCKET_DIR", plugins.as_str()),
            ("WEBHOOK_CERT_DIR", certificates.as_str()),
        ],
    )?;
    // Leading, with its workers started.
    wait::until(
        "CloudNativePG's operator running its controllers",
        Duration::from_secs(120),
        || async {
            let log = std::fs::read_to_string(&controller.log).unwrap_or_default();
            if log.contains("Starting workers") && log.contains("\"controller\":\"cluster\"") {
                return Ok(Some(()));
            }
            Err(controller.log_tail(5))
        },
    )
    .await?;
    let cnpg_metrics = || async {
        http_get(metrics, "/metrics")
            .await
            .ok()
            .filter(|(status, _)| *status == 200)
            .map(|(_, body)| body)
    };
    if cnpg_metrics().await.is_none() {
        return Err(Error::Setup(format!(
            "CloudNativePG's metrics at {metrics}: no answer"
        )));
    }

    let mut figures = Figures {
        rss_empty_kib: settled_empty_rss(&controller).await,
        ..Figures::default()
    };
    let requests_before = request_counts(&namespace.client).await?;
    let cpu_start = cpu_seconds(&controller).unwrap_or(0.0);
    let resource = cnpg_cluster_resource();
    let clusters: Api<DynamicObject> =
        Api::namespaced_with(namespace.client.clone(), &namespace.name, &resource);
    let started = Instant::now();
    futures::stream::iter(0..count)
        .map(|i| {
            let clusters = clusters.clone();
            let resource = resource.clone();
            async move {
                let mut object = DynamicObject::new(&format!("db-{i:05}"), &resource);
                object.data = serde_json::json!({"spec": {
                    "instances": 1,
                    "imageName": "ghcr.io/cloudnative-pg/postgresql:17",
                    "storage": {"size": "1Gi"},
                }});
                clusters
                    .create(&PostParams::default(), &object)
                    .await
                    .map(drop)
                    .map_err(Error::from)
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    let pods = Api::<Pod>::namespaced(namespace.client.clone(), &namespace.name);
    until_instances_running(&pods, count, started).await?;
    figures.converged_secs = started.elapsed().as_secs_f64();
    let route = check_blackholed(&pods, "cnpg.io/podRole=instance").await?;
    converge_figures(
        &mut figures,
        &local.audit_log(),
        &user,
        &namespace.client,
        &requests_before,
        &controller,
        cpu_start,
    )
    .await?;
    let reconciles = || async {
        cnpg_metrics().await.map(|m| {
            m.lines()
                .filter(|l| {
                    l.starts_with("controller_runtime_reconcile_total{")
                        && l.contains("controller=\"cluster\"")
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
        })
    };
    idle_minute(
        &mut figures,
        &local.audit_log(),
        &user,
        &controller,
        reconciles,
    )
    .await?;
    let mut phases = BTreeMap::new();
    for object in clusters.list(&ListParams::default()).await?.items {
        let phase = object
            .data
            .pointer("/status/phase")
            .and_then(|p| p.as_str())
            .unwrap_or("(none)")
            .to_owned();
        *phases.entry(phase).or_default() += 1;
    }
    drop(controller);
    drop(namespace);
    Ok((figures, route, phases))
}

/// Waits until `count` CloudNativePG instance pods are Running (its
/// initdb Jobs complete on kwok, then it creates each instance pod).
async fn until_instances_running(
    pods: &Api<Pod>,
    count: usize,
    started: Instant,
) -> Result<(), Error> {
    wait::until(
        &format!("{count} instance pods Running"),
        Duration::from_secs(3600),
        || async {
            let list = pods
                .list(&ListParams::default().labels("cnpg.io/podRole=instance"))
                .await
                .map_err(|e| e.to_string())?;
            let running = list
                .items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count();
            if running >= count {
                return Ok(Some(()));
            }
            eprint!(
                "\r{running}/{count} instance pods Running after {} s   ",
                started.elapsed().as_secs()
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
            Ok(None)
        },
    )
    .await?;
    eprintln!();
    Ok(())
}

/// Checks that every pod address `selector` picks routes to a blackhole on
/// this machine: the most specific route of `ip route show match` (`ip route
/// get` only answers "Invalid argument" for one). Returns one as evidence.
async fn check_blackholed(pods: &Api<Pod>, selector: &str) -> Result<String, Error> {
    let list = pods.list(&ListParams::default().labels(selector)).await?;
    let addresses: BTreeSet<String> = list
        .items
        .iter()
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect();
    let mut evidence = None;
    for address in &addresses {
        let output = tokio::process::Command::new("ip")
            .args(["-o", "route", "show", "match", address])
            .output()
            .await
            .map_err(|e| Error::Setup(format!("ip route show: {e}")))?;
        let routes = String::from_utf8_lossy(&output.stdout).into_owned();
        let route = most_specific(&routes);
        if !route.is_some_and(|r| r.starts_with("blackhole ")) {
            return Err(Error::Setup(format!(
                "pod address {address} is not blackholed on this machine (routes: {}): \
                 CloudNativePG's calls to its instances would leave it",
                routes.trim()
            )));
        }
        if evidence.is_none() {
            evidence = route.map(|r| format!("{address}: `{}`", r.trim()));
        }
    }
    evidence
        .map(|route| format!("{} addresses, all blackholed ({route})", addresses.len()))
        .ok_or_else(|| Error::Setup("no kwok pod address to check".into()))
}

/// The route of the longest prefix among `ip -o route show match` lines.
fn most_specific(routes: &str) -> Option<&str> {
    const TYPES: [&str; 6] = [
        "blackhole",
        "unreachable",
        "prohibit",
        "throw",
        "local",
        "broadcast",
    ];
    routes.lines().max_by_key(|line| {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or_default();
        let destination = if TYPES.contains(&first) {
            words.next().unwrap_or_default()
        } else {
            first
        };
        match destination.split_once('/') {
            _ if destination == "default" => 0,
            Some((_, length)) => length.parse().unwrap_or(0),
            None => 32,
        }
    })
}

/// The RSS of a controller with no cluster yet, once started: sampled 10 s
/// after it is ready.
async fn settled_empty_rss(controller: &ControllerProcess) -> Option<u64> {
    tokio::time::sleep(Duration::from_secs(10)).await;
    rss_kib(controller, "VmRSS:")
}

/// The figures up to convergence: writes (audit log, the operator's user),
/// every client's requests, peak RSS and CPU.
async fn converge_figures(
    figures: &mut Figures,
    audit_log: &Path,
    user: &str,
    client: &Client,
    requests_before: &BTreeMap<String, f64>,
    controller: &ControllerProcess,
    cpu_start: f64,
) -> Result<(), Error> {
    // The audit log is written in batches, at most a second late.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for write in audit::write_requests(audit_log)?
        .iter()
        .filter(|w| w.user == user)
    {
        if election_lease(write) {
            figures.lease_writes += 1;
            continue;
        }
        if write.code.is_some_and(|c| c >= 400) {
            figures.failed_writes += 1;
        }
        *figures.writes.entry(verb_resource(write)).or_default() += 1;
    }
    let after = request_counts(client).await?;
    for (verb, n) in after {
        figures.all_clients.insert(
            verb.clone(),
            n - requests_before.get(&verb).copied().unwrap_or(0.0),
        );
    }
    figures.rss_peak_kib = rss_kib(controller, "VmHWM:");
    figures.cpu_converge = cpu_seconds(controller).unwrap_or(0.0) - cpu_start;
    Ok(())
}

/// One idle minute: the operator's writes (leader election apart), reconciles, CPU,
/// and its RSS at the end.
async fn idle_minute<F, Fut>(
    figures: &mut Figures,
    audit_log: &Path,
    user: &str,
    controller: &ControllerProcess,
    reconciles: F,
) -> Result<(), Error>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<f64>>,
{
    let mut tail = audit::Tail::from_now(audit_log)?;
    let cpu = cpu_seconds(controller).unwrap_or(0.0);
    let reconciles_before = reconciles().await;
    eprintln!("one idle minute");
    tokio::time::sleep(Duration::from_secs(60)).await;
    figures.cpu_idle_minute = cpu_seconds(controller).unwrap_or(0.0) - cpu;
    figures.rss_idle_kib = rss_kib(controller, "VmRSS:");
    figures.rss_peak_kib = rss_kib(controller, "VmHWM:");
    figures.idle_reconciles = match (reconciles_before, reconciles().await) {
        (Some(before), Some(after)) => Some(after - before),
        _ => None,
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    for write in tail.recorded()?.iter().filter(|w| w.user == user) {
        if election_lease(write) {
            figures.idle_lease_writes += 1;
        } else {
            *figures.idle_writes.entry(verb_resource(write)).or_default() += 1;
        }
    }
    Ok(())
}

/// `verb resource[/subresource]` of a write.
fn verb_resource(write: &audit::WriteRequest) -> String {
    match &write.subresource {
        Some(sub) => format!("{} {}/{sub}", write.verb, write.resource),
        None => format!("{} {}", write.verb, write.resource),
    }
}

/// User and system CPU time of a process so far, in seconds.
fn cpu_seconds(process: &ControllerProcess) -> Option<f64> {
    process_cpu_seconds(process.pid()?)
}

fn print(
    count: usize,
    cairn: &Figures,
    cnpg: &Figures,
    cnpg_route: &str,
    phases: &BTreeMap<String, usize>,
) {
    let n = count as f64;
    let mib = |kib: Option<u64>| kib.map(|k| k as f64 / 1024.0);
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "–".to_owned(),
    };
    let row = |figure: &str, a: Option<f64>, b: Option<f64>, unit: &str, digits: usize| {
        let show = |v: Option<f64>| v.map_or("–".to_owned(), |v| format!("{v:.digits$}{unit}"));
        println!("| {figure} | {} | {} | {} |", show(a), show(b), ratio(a, b));
    };
    println!(
        "\n## {count} single-instance clusters: Cairn and CloudNativePG 1.27.1, one after the other\n"
    );
    println!("| figure | Cairn | CloudNativePG | Cairn/CNPG |\n|---|---|---|---|");
    row(
        "RSS started, no cluster yet",
        mib(cairn.rss_empty_kib),
        mib(cnpg.rss_empty_kib),
        " MiB",
        1,
    );
    row(
        "peak RSS",
        mib(cairn.rss_peak_kib),
        mib(cnpg.rss_peak_kib),
        " MiB",
        1,
    );
    row(
        "RSS after the idle minute (all clusters cached)",
        mib(cairn.rss_idle_kib),
        mib(cnpg.rss_idle_kib),
        " MiB",
        1,
    );
    row(
        "CPU from the first create to converged",
        Some(cairn.cpu_converge),
        Some(cnpg.cpu_converge),
        " s",
        1,
    );
    row(
        "CPU in the idle minute (CNPG: its 10 s error loop)",
        Some(cairn.cpu_idle_minute),
        Some(cnpg.cpu_idle_minute),
        " s",
        2,
    );
    row(
        "converged (Cairn: all Ready; CNPG: every instance pod Running), from the first create",
        Some(cairn.converged_secs),
        Some(cnpg.converged_secs),
        " s",
        1,
    );
    let total = |f: &Figures| f.writes.values().sum::<usize>() as f64 / n;
    row(
        "operator writes per cluster (leader election apart)",
        Some(total(cairn)),
        Some(total(cnpg)),
        "",
        2,
    );
    let verbs: BTreeSet<&String> = cairn.writes.keys().chain(cnpg.writes.keys()).collect();
    for verb in verbs {
        let per = |f: &Figures| f.writes.get(verb).map(|w| *w as f64 / n);
        row(
            &format!("… {verb} per cluster"),
            per(cairn),
            per(cnpg),
            "",
            2,
        );
    }
    row(
        "… of which failed (4xx/5xx), per cluster",
        Some(cairn.failed_writes as f64 / n),
        Some(cnpg.failed_writes as f64 / n),
        "",
        2,
    );
    row(
        "operator leader-election writes until converged",
        Some(cairn.lease_writes as f64),
        Some(cnpg.lease_writes as f64),
        "",
        0,
    );
    let verbs: BTreeSet<&String> = cairn
        .all_clients
        .keys()
        .chain(cnpg.all_clients.keys())
        .collect();
    for verb in verbs {
        let per = |f: &Figures| f.all_clients.get(verb).map(|r| r / n);
        row(
            &format!("API server requests per cluster, all clients, {verb}"),
            per(cairn),
            per(cnpg),
            "",
            1,
        );
    }
    let idle = |f: &Figures| f.idle_writes.values().sum::<usize>() as f64;
    row(
        "operator writes in the idle minute (leader election apart)",
        Some(idle(cairn)),
        Some(idle(cnpg)),
        "",
        0,
    );
    let verbs: BTreeSet<&String> = cairn
        .idle_writes
        .keys()
        .chain(cnpg.idle_writes.keys())
        .collect();
    for verb in verbs {
        let of = |f: &Figures| f.idle_writes.get(verb).map(|w| *w as f64);
        row(&format!("… {verb}"), of(cairn), of(cnpg), "", 0);
    }
    row(
        "operator leader-election writes in the idle minute",
        Some(cairn.idle_lease_writes as f64),
        Some(cnpg.idle_lease_writes as f64),
        "",
        0,
    );
    row(
        "cluster reconciles in the idle minute",
        cairn.idle_reconciles,
        cnpg.idle_reconciles,
        "",
        0,
    );
    println!();
    println!("CloudNativePG's clusters by phase at the end: {phases:?}");
    println!("Its instance pods' addresses: {cnpg_route}.");
    println!(
        "Comparable: memory, and the writes that create and converge the same objects. Not \
         comparable: readiness (no instance manager runs in a kwok pod, so no CNPG cluster \
         becomes healthy), and idle CPU and reconciles (every CNPG cluster is reconciled again \
         every 10 s after its status call fails; a healthy install does not do that). Reads \
         are not attributed to an operator: the audit log records writes only, so the API \
         server rows count every client (the control plane and this benchmark's polling too)."
    );
}
