//! The real nodes: cairn-database-controller installed by `helm install` runs
//! in pods (probes, the mounted token, the chart's RBAC, the conversion webhook
//! behind its Service, restricted Pod Security), and a DatabaseCluster's
//! PostgreSQL runs in its pods (kubelet, containerd, runc, the CNI bridge,
//! kube-proxy, CoreDNS, local-path volumes). A client pod reaches it through
//! `<name>-rw` and `<name>-ro`, over TLS verified with the published CA.
//! Nothing here is faked by kwok.
//!
//! The images come from `hack/images.sh workspace`, imported into every node
//! by the test entry point.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_api::database::v1::DatabaseCluster;
use cairn_e2e::real::{CHART, Crds, READY_TIMEOUT, cluster_spec, namespace_with_controller_on};
use cairn_testing::{Error, TestNamespace, cluster, wait};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;

type Result<T = ()> = std::result::Result<T, Error>;

const CLUSTER: &str = "orders";

#[tokio::test]
async fn postgresql_and_the_controller_run_in_real_pods() -> Result {
    // The conversion webhook behind this release's Service is under test.
    let ns = namespace_with_controller_on("real", Crds::FromChart).await?;
    cairn_e2e::real::controller_serves_metrics_from_its_pods(&ns, CHART).await?;

    let started = Instant::now();
    create_cluster(&ns, 3).await?;
    let clusters = ns.api::<DatabaseCluster>();
    until_ready_instances(&clusters, 3).await?;
    eprintln!(
        "3-instance cluster Ready in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    read_through_the_conversion_webhook(&ns).await?;

    cairn_e2e::real::start_client(&ns, CLUSTER).await?;
    psql(&ns, "rw", "CREATE TABLE orders (id int PRIMARY KEY)").await?;
    psql(
        &ns,
        "rw",
        "INSERT INTO orders SELECT generate_series(1, 100)",
    )
    .await?;
    until_rows_on_replicas(&ns, 100).await?;
    only_tls_and_a_new_certificate_without_restart(&ns).await?;

    // Planned changes are Progressing, never Degraded: seen by a watch, so no
    // transition between two polls goes unnoticed.
    let degraded_log = Arc::new(Mutex::new(Vec::new()));
    let degraded = watch_degraded(clusters.clone(), degraded_log.clone());
    reload_without_restart(&ns).await?;
    restart_parameter_rolls_the_pods(&ns).await?;
    scale_down_and_up(&ns).await?;
    degraded.abort();
    let seen = degraded_seen(&degraded_log);
    assert!(
        seen.is_empty(),
        "Degraded=True during planned changes: {seen:?}"
    );
    deleted_pod_returns_with_its_data(&ns).await?;
    lost_folders_are_cloned_never_initialised(&ns).await?;
    Ok(())
}

async fn create_cluster(ns: &TestNamespace, instances: i32) -> Result {
    ns.api::<DatabaseCluster>()
        .create(
            &PostParams::default(),
            &DatabaseCluster::new(CLUSTER, cluster_spec(instances)),
        )
        .await?;
    Ok(())
}

async fn until_ready_instances(clusters: &Api<DatabaseCluster>, ready: i32) -> Result {
    wait::for_object(
        clusters,
        CLUSTER,
        &format!("{ready} ready instances and Ready=True"),
        READY_TIMEOUT,
        |c| {
            let status = c.status.as_ref();
            status.and_then(|s| s.ready_instances) == Some(ready)
                && status.and_then(|s| s.instances) == Some(ready)
                && wait::condition_status(c, "Ready").as_deref() == Some("True")
        },
    )
    .await?;
    Ok(())
}

/// v1alpha1 is served through the webhook in the controller's pods, behind its
/// Service: the API server reaches it through kube-proxy's rules.
async fn read_through_the_conversion_webhook(ns: &TestNamespace) -> Result {
    let resource = "databaseclusters.v1alpha1.database.cairn.dev";
    let size = wait::until(
        "the cluster read as v1alpha1",
        Duration::from_secs(30),
        || async {
            cluster()
                .kubectl(&[
                    "-n",
                    &ns.name,
                    "get",
                    resource,
                    CLUSTER,
                    "-o",
                    "jsonpath={.spec.size}",
                ])
                .await
                .map(|out| Some(out.stdout))
                .map_err(|e| e.to_string())
        },
    )
    .await?;
    assert_eq!(size, "3");
    Ok(())
}

/// The replicas stream the primary's writes: reads through `-ro` (which
/// balances over both replicas) see them. A replica is ready within
/// `CAIRN_MAX_LAG_BYTES` of its primary, so one that just (re)joined may
/// still be replaying for a moment: five reads in a row with every row show
/// both caught up.
async fn until_rows_on_replicas(ns: &TestNamespace, rows: i64) -> Result {
    let count = "SELECT count(*) FROM orders";
    let expected = rows.to_string();
    wait::until(
        &format!("five reads in a row of {rows} rows through -ro"),
        READY_TIMEOUT,
        || async {
            for _ in 0..5 {
                let read = psql(ns, "ro", count).await.map_err(|e| e.to_string())?;
                if read != expected {
                    return Err(format!("a read saw {read}"));
                }
            }
            Ok(Some(()))
        },
    )
    .await?;
    assert_eq!(psql(ns, "ro", "SELECT pg_is_in_recovery()").await?, "t");
    Ok(())
}

async fn set_parameter(ns: &TestNamespace, name: &str, value: &str) -> Result {
    ns.api::<DatabaseCluster>()
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "postgres": { "parameters": { name: value } } } })),
        )
        .await?;
    Ok(())
}

async fn pod_uids(ns: &TestNamespace) -> Result<BTreeMap<String, String>> {
    let selector =
        format!("app.kubernetes.io/instance={CLUSTER},app.kubernetes.io/name=postgresql");
    Ok(ns
        .api::<Pod>()
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
        .into_iter()
        .map(|p| {
            (
                p.metadata.name.unwrap_or_default(),
                p.metadata.uid.unwrap_or_default(),
            )
        })
        .collect())
}

/// A reloadable setting reaches PostgreSQL in place: no pod replaced, the
/// postmaster not restarted.
async fn reload_without_restart(ns: &TestNamespace) -> Result {
    let pods_before = pod_uids(ns).await?;
    let started_before = psql(ns, "rw", "SELECT pg_postmaster_start_time()").await?;
    set_parameter(ns, "work_mem", "12MB").await?;
    until_psql(ns, "rw", "SHOW work_mem", "12MB").await?;
    until_psql(ns, "ro", "SHOW work_mem", "12MB").await?;
    assert_eq!(
        psql(ns, "rw", "SELECT pg_postmaster_start_time()").await?,
        started_before,
        "the primary's postmaster was restarted for a reloadable setting"
    );
    assert_eq!(
        pod_uids(ns).await?,
        pods_before,
        "pods were replaced for a reload"
    );
    Ok(())
}

/// A setting read only at server start rolls the pods, driven by the
/// controller: the replicas restart first, one at a time, then exactly one
/// switchover moves the primary to an up-to-date replica, and the old
/// primary restarts last (the order seen by a watch of the pods). Every
/// instance runs with the new value, and no row is lost.
async fn restart_parameter_rolls_the_pods(ns: &TestNamespace) -> Result {
    let clusters = ns.api::<DatabaseCluster>();
    let old_primary = cairn_e2e::real::current_primary(&clusters, CLUSTER).await?;
    let pods_before = pod_uids(ns).await?;
    let restarts = Arc::new(Mutex::new(Vec::new()));
    let switchovers = Arc::new(Mutex::new(BTreeSet::new()));
    let watches = [
        watch_restarts(ns.api::<Pod>(), restarts.clone()),
        watch_switchovers(clusters.clone(), switchovers.clone()),
    ];
    let started = Instant::now();
    set_parameter(ns, "max_connections", "120").await?;
    wait::until("every pod replaced", READY_TIMEOUT, || async {
        let now = pod_uids(ns).await.map_err(|e| e.to_string())?;
        let replaced = now
            .iter()
            .filter(|(name, uid)| pods_before.get(*name) != Some(uid))
            .count();
        match replaced == pods_before.len() && now.len() == pods_before.len() {
            true => Ok(Some(())),
            false => Err(format!("{replaced} of {} replaced", pods_before.len())),
        }
    })
    .await?;
    until_ready_instances(&clusters, 3).await?;
    eprintln!(
        "rolling restart of 3 instances: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    watches.iter().for_each(tokio::task::JoinHandle::abort);
    let order = restarts.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(order.len(), 3, "restarts: {order:?}");
    assert_eq!(
        order.last(),
        Some(&old_primary),
        "the primary must restart last: {order:?}"
    );
    let switchovers = switchovers
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    assert_eq!(switchovers.len(), 1, "switchovers: {switchovers:?}");
    let (from, to, _) = switchovers.first().cloned().unwrap_or_default();
    assert_eq!(from, old_primary);
    assert_eq!(
        cairn_e2e::real::current_primary(&clusters, CLUSTER).await?,
        to
    );
    eprintln!("restarted in order {order:?}; one switchover {from} → {to}");
    until_psql(ns, "rw", "SHOW max_connections", "120").await?;
    until_psql(ns, "ro", "SHOW max_connections", "120").await?;
    until_psql(ns, "rw", "SELECT count(*) FROM orders", "100").await?;
    Ok(())
}

/// Records each instance pod once, when its deletion begins.
fn watch_restarts(pods: Api<Pod>, log: Arc<Mutex<Vec<String>>>) -> tokio::task::JoinHandle<()> {
    let selector = format!("app.kubernetes.io/instance={CLUSTER}");
    let mut seen = BTreeSet::new();
    watch(
        pods,
        watcher::Config::default().labels(&selector),
        move |pod| {
            if pod.metadata.deletion_timestamp.is_some() && seen.insert(pod.metadata.uid.clone()) {
                let name = pod.metadata.name.unwrap_or_default();
                log.lock().unwrap_or_else(|p| p.into_inner()).push(name);
            }
        },
    )
}

/// Records every switchover the cluster reports: (from, to, started at).
fn watch_switchovers(
    clusters: Api<DatabaseCluster>,
    log: Arc<Mutex<BTreeSet<(String, String, String)>>>,
) -> tokio::task::JoinHandle<()> {
    watch(clusters, the_cluster(), move |cluster| {
        if let Some(record) = cluster.status.and_then(|s| s.last_switchover) {
            let entry = (record.from, record.to, record.started_at.0.to_string());
            log.lock().unwrap_or_else(|p| p.into_inner()).insert(entry);
        }
    })
}

fn the_cluster() -> watcher::Config {
    watcher::Config::default().fields(&format!("metadata.name={CLUSTER}"))
}

/// Calls `seen` with every version of the objects `config` selects, from a
/// watch: no change between two polls goes unnoticed.
fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    mut seen: impl FnMut(K) + Send + 'static,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    use futures::StreamExt;
    use kube::runtime::WatchStreamExt;
    tokio::spawn(async move {
        let mut updates = std::pin::pin!(watcher(api, config).applied_objects());
        while let Some(update) = updates.next().await {
            if let Ok(object) = update {
                seen(object);
            }
        }
    })
}

async fn scale(ns: &TestNamespace, instances: i32) -> Result {
    ns.api::<DatabaseCluster>()
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "instances": instances } })),
        )
        .await?;
    until_ready_instances(&ns.api::<DatabaseCluster>(), instances).await
}

/// 3 → 2 → 3 with the primary on the pod that leaves: a switchover to an
/// instance that stays comes first (a planned change, not a failover), then
/// the third instance leaves, comes back on its kept volume and catches up
/// with what was written meanwhile. The primary is put there on request
/// first, so the test takes this path every time; that request follows the
/// rollout's switchover, so its record replaces a finished one.
async fn scale_down_and_up(ns: &TestNamespace) -> Result {
    let clusters = ns.api::<DatabaseCluster>();
    let leaving = format!("{CLUSTER}-2");
    if cairn_e2e::real::current_primary(&clusters, CLUSTER).await? != leaving {
        cairn_e2e::real::switch_over(ns, CLUSTER, &leaving).await?;
    }
    let requested = k8s_openapi::jiff::Timestamp::now() - Duration::from_secs(1);
    scale(ns, 2).await?;
    wait::for_deletion(&ns.api::<Pod>(), &leaving, READY_TIMEOUT).await?;
    // The leaving pod may go as soon as the target is promoted, before it
    // reports serving writes.
    let switched = wait::for_object(
        &clusters,
        CLUSTER,
        &format!("the scale-down's switchover from {leaving} completed"),
        READY_TIMEOUT,
        |c| {
            c.status
                .as_ref()
                .and_then(|s| s.last_switchover.as_ref())
                .is_some_and(|r| r.completed_at.is_some())
        },
    )
    .await?;
    let status = switched.status.unwrap_or_default();
    let record = status
        .last_switchover
        .ok_or_else(|| Error::Setup("no switchover recorded".into()))?;
    assert!(
        record.from == leaving && record.started_at.0 >= requested,
        "the scale-down switched over from {leaving}: {record:?}"
    );
    assert_eq!(status.last_failover, None, "a planned change failed over");
    eprintln!(
        "scale-down: switchover {} → {}, writes unavailable {:?} s",
        record.from, record.to, record.write_unavailable_seconds
    );
    psql(
        ns,
        "rw",
        "INSERT INTO orders SELECT generate_series(101, 150)",
    )
    .await?;
    scale(ns, 3).await?;
    until_rows_on_replicas(ns, 150).await
}

/// The primary's pod deleted: the StatefulSet brings it back on the same
/// volume, with every row.
async fn deleted_pod_returns_with_its_data(ns: &TestNamespace) -> Result {
    let pods = ns.api::<Pod>();
    let primary = cairn_e2e::real::current_primary(&ns.api::<DatabaseCluster>(), CLUSTER).await?;
    let uid = pods.get(&primary).await?.metadata.uid;
    pods.delete(&primary, &DeleteParams::default()).await?;
    wait::for_object(&pods, &primary, "a new pod, Ready", READY_TIMEOUT, |p| {
        p.metadata.uid != uid && wait::condition_status(p, "Ready").as_deref() == Some("True")
    })
    .await?;
    until_psql(ns, "rw", "SELECT count(*) FROM orders", "150").await?;
    until_rows_on_replicas(ns, 150).await
}

/// A data folder lost under a running instance: a replica's is cloned
/// again from the primary; the primary's is never initialised again (that
/// would serve an empty database): a replica takes over, and the old
/// primary is cloned from it, every row there. That failover happens while
/// the spec is invalid: a typo stops changes to the children, not failover.
async fn lost_folders_are_cloned_never_initialised(ns: &TestNamespace) -> Result {
    let clusters = ns.api::<DatabaseCluster>();
    let primary = cairn_e2e::real::current_primary(&clusters, CLUSTER).await?;
    let replica = (0..3)
        .map(|ordinal| format!("{CLUSTER}-{ordinal}"))
        .find(|pod| *pod != primary)
        .ok_or_else(|| Error::Setup("no replica".into()))?;
    lose_data_folder(ns, &replica).await?;
    let on = |pod: &str| format!("{pod}.{CLUSTER}");
    let count = "SELECT count(*) FROM orders";
    cairn_e2e::real::until_psql(ns, &on(&replica), count, "150").await?;
    assert_eq!(
        cairn_e2e::real::psql(ns, &on(&replica), "SELECT pg_is_in_recovery()").await?,
        "t"
    );

    // The pod deleted before may have failed over: a replica may be promoted
    // only once it follows the timeline.
    cairn_e2e::real::until_replicas_follow(ns, &clusters, CLUSTER, 3).await?;
    set_invalid_resources(ns, true).await?;
    lose_data_folder(ns, &primary).await?;
    wait::until("another primary", READY_TIMEOUT, || async {
        match cairn_e2e::real::current_primary(&clusters, CLUSTER).await {
            Ok(now) if now != primary => Ok(Some(())),
            Ok(now) => Err(now),
            Err(e) => Err(e.to_string()),
        }
    })
    .await?;
    until_psql(ns, "rw", "SELECT pg_is_in_recovery()", "f").await?;
    until_psql(ns, "rw", count, "150").await?;
    cairn_e2e::real::until_psql(ns, &on(&primary), "SELECT pg_is_in_recovery()", "t").await?;
    cairn_e2e::real::until_psql(ns, &on(&primary), count, "150").await?;
    set_invalid_resources(ns, false).await?;
    until_ready_instances(&clusters, 3).await
}

/// Requests above limits (which the schema cannot compare), reported as
/// `Ready=False` with reason `InvalidSpec`; or no resources again.
async fn set_invalid_resources(ns: &TestNamespace, invalid: bool) -> Result {
    let resources =
        invalid.then(|| json!({ "requests": { "cpu": "2" }, "limits": { "cpu": "1" } }));
    let clusters = ns.api::<DatabaseCluster>();
    clusters
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "resources": resources } })),
        )
        .await?;
    if invalid {
        wait::for_object(
            &clusters,
            CLUSTER,
            "Ready=False: InvalidSpec",
            READY_TIMEOUT,
            |c| {
                c.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.reason == "InvalidSpec")
                })
            },
        )
        .await?;
    }
    Ok(())
}

/// Moves the pod's data folder away and kills its postmaster: to
/// cairn-instance the data is gone (the moved copy stays on the volume).
async fn lose_data_folder(ns: &TestNamespace, pod: &str) -> Result {
    let script = "cd /var/lib/postgresql/data && pid=$(head -1 pgdata/postmaster.pid) \
                  && mv pgdata lost-by-test && kill -9 \"$pid\"";
    cluster()
        .kubectl(&[
            "-n", &ns.name, "exec", pod, "-c", "postgres", "--", "sh", "-c", script,
        ])
        .await?;
    Ok(())
}

/// Clients must use TLS (the client pod verifies the server with the
/// published CA); a new server certificate is served without a restart.
async fn only_tls_and_a_new_certificate_without_restart(ns: &TestNamespace) -> Result {
    let plain = cairn_e2e::real::exec(
        ns,
        &[
            "env",
            "PGSSLMODE=disable",
            "psql",
            "-h",
            &format!("{CLUSTER}-rw"),
            "-c",
            "SELECT 1",
        ],
    )
    .await;
    match plain {
        Err(e) => assert!(e.to_string().contains("no encryption"), "{e}"),
        Ok(out) => panic!("a connection without TLS was accepted: {out}"),
    }
    assert_eq!(
        psql(
            ns,
            "rw",
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
        )
        .await?,
        "t"
    );
    // (Only a superuser sees the WAL senders' pids.)
    let primary = cairn_e2e::real::current_primary(&ns.api::<DatabaseCluster>(), CLUSTER).await?;
    let encrypted = cairn_e2e::real::as_superuser(
        ns,
        &primary,
        "SELECT count(*) || ' ' || bool_and(s.ssl) FROM pg_stat_replication r JOIN pg_stat_ssl s USING (pid)",
    )
    .await?;
    assert_eq!(encrypted, "2 true", "both replicas stream over TLS");

    let started = psql(ns, "rw", "SELECT pg_postmaster_start_time()").await?;
    let uids = pod_uids(ns).await?;
    let secrets = ns.api::<Secret>();
    let served_before = served_serial(ns).await?;
    assert_eq!(served_before, secret_serial(ns, &secrets).await?);
    secrets
        .delete(&format!("{CLUSTER}-server"), &DeleteParams::default())
        .await?;
    let renewed = Instant::now();
    let issued = wait::until(
        "a new server certificate",
        Duration::from_secs(30),
        || async {
            match secret_serial(ns, &secrets).await {
                Ok(serial) if serial != served_before => Ok(Some(serial)),
                Ok(_) => Err("the old certificate".to_owned()),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await?;
    // The kubelet updates Secret volumes at its pod sync (about a minute).
    wait::until(
        "the new certificate served through -rw",
        Duration::from_secs(180),
        || async {
            match served_serial(ns).await {
                Ok(serial) if serial == issued => Ok(Some(())),
                Ok(serial) => Err(format!("serving {serial}")),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await?;
    eprintln!(
        "new server certificate served {:.1} s after the Secret was deleted",
        renewed.elapsed().as_secs_f64()
    );
    assert_eq!(
        psql(ns, "rw", "SELECT pg_postmaster_start_time()").await?,
        started
    );
    assert_eq!(pod_uids(ns).await?, uids, "no pod was replaced");
    Ok(())
}

/// The serial number of the certificate `<cluster>-rw` serves, verified
/// with the published CA (openssl in the client pod).
async fn served_serial(ns: &TestNamespace) -> Result<String> {
    let script = format!(
        "openssl s_client -starttls postgres -connect {CLUSTER}-rw:5432 -verify_return_error \
         -verify_hostname {CLUSTER}-rw -CAfile {} </dev/null 2>/dev/null | openssl x509 -noout -serial",
        cairn_e2e::real::CLIENT_CA_FILE
    );
    Ok(cairn_e2e::real::exec(ns, &["sh", "-c", &script])
        .await?
        .trim()
        .to_owned())
}

/// The serial number of the certificate in Secret `<cluster>-server`.
async fn secret_serial(ns: &TestNamespace, secrets: &Api<Secret>) -> Result<String> {
    let secret = secrets.get(&format!("{CLUSTER}-server")).await?;
    let pem = secret
        .data
        .and_then(|d| {
            d.get("tls.crt")
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        })
        .unwrap_or_default();
    let script = r#"printf '%s' "$1" | openssl x509 -noout -serial"#;
    Ok(
        cairn_e2e::real::exec(ns, &["sh", "-c", script, "serial", &pem])
            .await?
            .trim()
            .to_owned(),
    )
}

/// psql through Service `<cluster>-<service>`.
async fn psql(ns: &TestNamespace, service: &str, sql: &str) -> Result<String> {
    cairn_e2e::real::psql(ns, &format!("{CLUSTER}-{service}"), sql).await
}

async fn until_psql(ns: &TestNamespace, service: &str, sql: &str, expected: &str) -> Result {
    cairn_e2e::real::until_psql(ns, &format!("{CLUSTER}-{service}"), sql, expected).await
}

/// Records every `Degraded=True` (reason: message) the cluster reports.
fn watch_degraded(
    clusters: Api<DatabaseCluster>,
    log: Arc<Mutex<Vec<String>>>,
) -> tokio::task::JoinHandle<()> {
    watch(clusters, the_cluster(), move |cluster| {
        let degraded = cluster
            .status
            .iter()
            .flat_map(|s| s.conditions.iter())
            .find(|c| c.type_ == "Degraded" && c.status == "True")
            .map(|c| format!("{}: {}", c.reason, c.message));
        if let Some(degraded) = degraded {
            log.lock().unwrap_or_else(|p| p.into_inner()).push(degraded);
        }
    })
}

fn degraded_seen(log: &Mutex<Vec<String>>) -> Vec<String> {
    log.lock().unwrap_or_else(|p| p.into_inner()).clone()
}
