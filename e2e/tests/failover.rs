//! Automated failover on the real nodes, with the controller installed by its
//! chart: the primary's node stops (kubelet and containers frozen, nothing
//! deleted) while a client pod commits rows through `<name>-rw` in a loop. A
//! replica is promoted, `-rw` follows it, writes resume; when the node
//! returns, the old primary rejoins as a replica, and it never acknowledged a
//! write the new timeline lost. Then a switchover back, on request, loses no
//! row either. Then that primary is cut off from the API server alone: its
//! replicas still hear it, so it serves on and no failover happens. Cut off
//! from its peers too, it stops taking writes before a replica may be
//! promoted, one is, and after the cuts heal it rejoins as a replica. Last,
//! the primary's node is drained: it is switched over before its eviction.

use std::time::{Duration, Instant};

use cairn_api::database::instance::ROLE_LABEL;
use cairn_api::database::v1::DatabaseCluster;
use cairn_e2e::real::{
    READY_TIMEOUT, Write, cluster_spec, current_primary, namespace_with_controller, node_of,
    other_real_node, psql, rows_present, start_client_on, start_ticks, stop_writer, unix_now,
    until_acknowledged_after, until_psql, until_replicas_follow, writes,
};
use cairn_testing::{Error, LocalCluster, TestNamespace, cluster, wait};
use futures::TryStreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

type Result<T = ()> = std::result::Result<T, Error>;

const CLUSTER: &str = "ledger";
const RW: &str = "ledger-rw";

#[tokio::test]
async fn a_stopped_primary_node_fails_over_and_the_old_primary_rejoins() -> Result {
    let ns = namespace_with_controller("failover").await?;
    let clusters = ns.api::<DatabaseCluster>();
    clusters
        .create(
            &PostParams::default(),
            &DatabaseCluster::new(CLUSTER, cluster_spec(3)),
        )
        .await?;
    until_ready(&clusters, |_| true).await?;
    an_instance_writes_only_its_own_lease_and_no_pod(&ns).await?;
    let old_primary = current_primary(&clusters, CLUSTER).await?;
    let node = node_of(&ns, &old_primary).await?;
    let other_node = other_real_node(&ns, CLUSTER, &node).await?;
    start_client_on(&ns, CLUSTER, Some(&other_node)).await?;
    start_ticks(&ns, RW).await?;
    a_deleted_lease_deposes_no_one(&ns, &clusters, &old_primary).await?;

    let number = LocalCluster::real_node_number(&node)
        .ok_or_else(|| Error::Setup(format!("{old_primary} is on {node}, not a real node")))?;
    cluster().stop_node(number)?;
    // Once stop-node returns, every process of the node is stopped: writes
    // begun from now on cannot reach the old primary.
    let frozen_at = unix_now();
    let frozen = Instant::now();
    let result = failover_and_rejoin(&ns, &clusters, &old_primary, number, frozen).await;
    // The node runs again whatever happened, for the suites after this one.
    cluster().start_node(number)?;
    let new_primary = result?;
    // Back to the old primary, on request: no row lost, writes resume.
    switch_over(&ns, &old_primary).await?;
    // Both replicas follow the new primary before it is cut off: a replica
    // still restarting, or forked, may not be promoted (it lacks writes).
    until_ready(&clusters, |_| true).await?;
    // Ready counts pods the kubelet last probed ready (up to 15 s ago): a
    // run once cut the primary off while the demoted one still restarted.
    until_replicas_follow(&ns, &clusters, CLUSTER, 3).await?;

    // The primary cut off from the API server alone: both replicas still
    // hear it, so it serves on and nobody is deposed. Then cut off from its
    // peers too: it fences itself before a replica may be promoted, a
    // replica takes over, and once the cuts heal it rejoins as a replica.
    let ip = |pod: Pod| pod.status.and_then(|s| s.pod_ip);
    let pods = ns.api::<Pod>();
    let pod_ip = ip(pods.get(&old_primary).await?)
        .ok_or_else(|| Error::Setup(format!("{old_primary} has no IP")))?;
    let mut replica_ips = Vec::new();
    for ordinal in 0..3 {
        let pod = format!("{CLUSTER}-{ordinal}");
        if pod != old_primary {
            replica_ips.push(
                ip(pods.get(&pod).await?)
                    .ok_or_else(|| Error::Setup(format!("{pod} has no IP")))?,
            );
        }
    }
    cluster().cut_from_apiserver(&pod_ip)?;
    let cut_at = unix_now();
    let mut result = cut_off_primary_serves_on(&ns, &clusters, &old_primary, cut_at).await;
    let mut isolated_at = f64::MAX;
    let mut isolation_began = f64::MAX;
    if result.is_ok() {
        isolation_began = unix_now();
        result = replica_ips
            .iter()
            .try_for_each(|other| cluster().cut_between(&pod_ip, other));
        isolated_at = unix_now();
    }
    let fenced = match result {
        Ok(()) => {
            partitioned_primary_fences_itself(&ns, &clusters, &old_primary, isolated_at).await
        }
        Err(e) => Err(e),
    };
    cluster().heal_from_apiserver(&pod_ip)?;
    for other in &replica_ips {
        cluster().heal_between(&pod_ip, other)?;
    }
    let fenced_at = fenced?;
    rejoins_as_replica(&ns, &old_primary).await?;
    until_ready(&clusters, |_| true).await?;
    until_replicas_follow(&ns, &clusters, CLUSTER, 3).await?;
    a_drained_node_switches_its_primary_over_first(&ns, &clusters).await?;

    stop_writer(&ns).await?;
    let writes = writes(&ns).await?;
    let present = rows_present(&ns, RW).await?;
    let acknowledged: Vec<&Write> = writes.iter().filter(|w| w.ok).collect();
    let missing: Vec<&&Write> = acknowledged
        .iter()
        .filter(|w| !present.contains(&w.id))
        .collect();
    // Write unavailability: from the node stopping to the first write that
    // began after it and was acknowledged.
    let first_after = writes
        .iter()
        .find(|w| w.ok && w.started > frozen_at)
        .map(|w| w.at - frozen_at);
    eprintln!(
        "failover: {} writes acknowledged, {} present, {} missing (asynchronous replication); \
         node stopped → first acknowledged write {:.1} s",
        acknowledged.len(),
        present.len(),
        missing.len(),
        first_after.unwrap_or(f64::NAN)
    );
    // Only a write sent to a primary before it was lost (its node stopped,
    // or cut off and not yet fenced) may be missing (it had not reached a
    // replica); one begun later would mean two primaries took writes. The
    // cuts from the replicas are made one after the other, and a commit
    // acknowledged just before the first may not have streamed yet: the
    // window opens a second before it (a run lost a row begun between the
    // first cut and the last).
    let may_be_lost = (isolation_began - 1.0)..fenced_at;
    for write in &missing {
        assert!(
            write.started < frozen_at || may_be_lost.contains(&write.started),
            "row {} begun {:.1} s after the node stopped ({:.1} s after the primary was isolated) \
             is missing",
            write.id,
            write.started - frozen_at,
            write.started - isolated_at
        );
    }
    assert!(
        first_after.is_some(),
        "no write succeeded after the failover"
    );
    // The demoted primary replays the switched-to primary's timeline: every row.
    let count = psql(&ns, RW, "SELECT count(*) FROM ticks").await?;
    let demoted = format!("{new_primary}.{CLUSTER}");
    until_psql(&ns, &demoted, "SELECT count(*) FROM ticks", &count).await?;
    Ok(())
}

/// The primary's membership Lease deleted by hand (`kubectl delete lease`):
/// the controller recreates it, the primary renews the new one before its
/// heartbeat lapses, and nobody is deposed: no failover is recorded through
/// twice the failover delay, and no write begun since the deletion fails.
async fn a_deleted_lease_deposes_no_one(
    ns: &TestNamespace,
    clusters: &Api<DatabaseCluster>,
    primary: &str,
) -> Result {
    let last_failover = |cluster: DatabaseCluster| cluster.status.and_then(|s| s.last_failover);
    let failover_before = last_failover(clusters.get(CLUSTER).await?);
    let leases = ns.api::<Lease>();
    let old_uid = leases.get(primary).await?.metadata.uid;
    leases.delete(primary, &DeleteParams::default()).await?;
    let deleted_at = unix_now();
    wait::until(
        "the primary's Lease recreated and renewed",
        Duration::from_secs(30),
        || async {
            let lease = leases.get_opt(primary).await.map_err(|e| e.to_string())?;
            let renewed = lease.as_ref().is_some_and(|l| {
                l.metadata.uid != old_uid
                    && l.spec
                        .as_ref()
                        .and_then(|s| s.renew_time.as_ref())
                        .is_some_and(|t| t.0.as_millisecond() as f64 / 1000.0 > deleted_at)
            });
            Ok(renewed.then_some(()))
        },
    )
    .await?;
    let renewed_after = unix_now() - deleted_at;
    keeps_its_primary(clusters, primary, failover_before, "its Lease was deleted").await?;
    no_write_failed_since(ns, deleted_at, "the Lease was deleted").await?;
    eprintln!("deleted Lease: recreated and renewed {renewed_after:.1} s later, no write failed");
    Ok(())
}

/// The primary cut off from the API server at `cut_at`, its database
/// network up: both replicas still hear its claims (the instances' peers),
/// so it serves on; nobody is deposed through twice the failover delay, the
/// cluster says why (`Degraded`, `PrimaryCutOffFromAPIServer`), and no write
/// begun since the cut fails.
async fn cut_off_primary_serves_on(
    ns: &TestNamespace,
    clusters: &Api<DatabaseCluster>,
    primary: &str,
    cut_at: f64,
) -> Result {
    let failover_before = clusters
        .get(CLUSTER)
        .await?
        .status
        .and_then(|s| s.last_failover);
    keeps_its_primary(
        clusters,
        primary,
        failover_before,
        "it was cut off from the API server",
    )
    .await?;
    wait::for_object(
        clusters,
        CLUSTER,
        "Degraded for a primary cut off from the API server",
        Duration::from_secs(30),
        |c| {
            c.status.as_ref().is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.type_ == "Degraded"
                        && c.status == "True"
                        && c.reason == "PrimaryCutOffFromAPIServer"
                })
            })
        },
    )
    .await?;
    no_write_failed_since(ns, cut_at, "the primary was cut off from the API server").await?;
    eprintln!(
        "partition: {primary} cut off from the API server alone served on for {:.1} s, no write failed",
        unix_now() - cut_at
    );
    Ok(())
}

/// Watched through twice the failover delay (10 s): every version of the
/// cluster keeps `primary`, and no failover is recorded.
async fn keeps_its_primary(
    clusters: &Api<DatabaseCluster>,
    primary: &str,
    failover_before: Option<cairn_api::database::v1::FailoverRecord>,
    after: &str,
) -> Result {
    let config = watcher::Config::default().fields(&format!("metadata.name={CLUSTER}"));
    let mut versions = std::pin::pin!(watcher::watcher(clusters.clone(), config).applied_objects());
    let watched = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(cluster) = versions
            .try_next()
            .await
            .map_err(|e| Error::Setup(e.to_string()))?
        {
            let current = cluster
                .status
                .as_ref()
                .and_then(|s| s.current_primary.clone());
            if current.as_deref() != Some(primary) {
                return Err(Error::Setup(format!("deposed after {after}: {current:?}")));
            }
        }
        Ok(())
    })
    .await;
    if let Ok(ended) = watched {
        ended?;
        return Err(Error::Setup("the watch of the cluster ended".into()));
    }
    let cluster = clusters.get(CLUSTER).await?;
    let status = cluster.status.unwrap_or_default();
    assert_eq!(
        status.current_primary.as_deref(),
        Some(primary),
        "deposed after {after}"
    );
    assert_eq!(
        status.last_failover, failover_before,
        "a failover was recorded after {after}"
    );
    Ok(())
}

/// The primary's node drained for maintenance (`kubectl drain`, of the
/// cluster's pods): the primary's disruption budget holds its eviction
/// while the controller switches it over to a replica on another node; the
/// old primary, relabelled a replica, is evicted then. One switchover, no
/// failover, and writes pause only for the switchover. The node is
/// uncordoned after, whatever happened, and the evicted instance returns.
async fn a_drained_node_switches_its_primary_over_first(
    ns: &TestNamespace,
    clusters: &Api<DatabaseCluster>,
) -> Result {
    let last_failover = |c: &DatabaseCluster| {
        c.status
            .as_ref()
            .and_then(|s| s.last_failover.as_ref())
            .map(|f| f.promoted_at.clone())
    };
    let failover_before = last_failover(&clusters.get(CLUSTER).await?);
    let primary = current_primary(clusters, CLUSTER).await?;
    let node = node_of(ns, &primary).await?;
    let began = unix_now();
    let selector = format!("--pod-selector=app.kubernetes.io/instance={CLUSTER}");
    let drained = cluster()
        .kubectl(&[
            "drain",
            &node,
            &selector,
            "--delete-emptydir-data",
            "--timeout=180s",
        ])
        .await;
    let ended = unix_now();
    cluster().kubectl(&["uncordon", &node]).await?;
    drained?;
    let after = clusters.get(CLUSTER).await?;
    let record = after
        .status
        .as_ref()
        .and_then(|s| s.last_switchover.clone())
        .ok_or_else(|| Error::Setup("no switchover recorded".into()))?;
    let acknowledged: Vec<f64> = writes(ns)
        .await?
        .iter()
        .filter(|w| w.ok && w.at > began - 1.0)
        .map(|w| w.at)
        .collect();
    let longest_gap = acknowledged
        .windows(2)
        .map(|w| w[1] - w[0])
        .fold(0.0, f64::max);
    eprintln!(
        "drain: {node} drained in {:.1} s; switchover {} → {}, writes unavailable {:?} s (status), \
         longest gap between acknowledged writes {longest_gap:.1} s",
        ended - began,
        record.from,
        record.to,
        record.write_unavailable_seconds
    );
    assert_eq!(record.from, primary, "the drained node's primary moved");
    assert!(
        record.started_at.0.as_second() as f64 >= began.floor() && record.completed_at.is_some(),
        "one switchover, begun by the drain and completed: {record:?}"
    );
    assert_ne!(node_of(ns, &record.to).await?, node, "to another node");
    assert_eq!(last_failover(&after), failover_before, "no failover");
    // The switchover's pause, the client's reconnect and one attempt's
    // timeout; the writer tries every 0.1 s.
    assert!(
        longest_gap <= 10.0,
        "writes paused {longest_gap:.1} s during the drain"
    );
    until_ready(clusters, |_| true).await?;
    until_replicas_follow(ns, clusters, CLUSTER, 3).await
}

/// No write begun after `since` failed.
async fn no_write_failed_since(ns: &TestNamespace, since: f64, what: &str) -> Result {
    let failed: Vec<u64> = writes(ns)
        .await?
        .iter()
        .filter(|w| !w.ok && w.started > since)
        .map(|w| w.id)
        .collect();
    assert!(failed.is_empty(), "writes failed after {what}: {failed:?}");
    Ok(())
}

/// A switchover to `to` on request (`kubectl annotate`): once completed,
/// `-rw` reaches `to` and writes go through.
async fn switch_over(ns: &TestNamespace, to: &str) -> Result {
    let record = cairn_e2e::real::switch_over(ns, CLUSTER, to).await?;
    eprintln!(
        "switchover: {} → {}, writes unavailable {:?} s (status)",
        record.from, record.to, record.write_unavailable_seconds
    );
    until_psql(
        ns,
        &format!("{to}.{CLUSTER}"),
        "SELECT pg_is_in_recovery()",
        "f",
    )
    .await?;
    until_psql(ns, RW, "SELECT pg_is_in_recovery()", "f").await?;
    until_acknowledged_after(ns, 20).await
}

/// With the token the kubelet gives pod `ledger-1`: its own Lease may be
/// updated, another instance's may not (the chart's admission policy), and no
/// pod may be written (RBAC), so no instance can move `-rw` to itself.
async fn an_instance_writes_only_its_own_lease_and_no_pod(ns: &TestNamespace) -> Result {
    let instance = cluster()
        .client_with_pod_token(&ns.name, CLUSTER, "ledger-1")
        .await?;
    let leases = Api::<Lease>::namespaced(instance.clone(), &ns.name);
    let touch = Patch::Merge(json!({ "metadata": { "annotations": { "e2e/touched": "yes" } } }));
    leases
        .patch("ledger-1", &PatchParams::default(), &touch)
        .await?;
    let other = leases
        .patch("ledger-0", &PatchParams::default(), &touch)
        .await;
    assert_eq!(status(other), 403, "ledger-1 updated ledger-0's Lease");
    let relabel = Patch::Merge(json!({ "metadata": { "labels": { ROLE_LABEL: "primary" } } }));
    let pods = Api::<Pod>::namespaced(instance, &ns.name);
    for pod in ["ledger-0", "ledger-1"] {
        let result = pods.patch(pod, &PatchParams::default(), &relabel).await;
        assert_eq!(status(result), 403, "an instance relabelled {pod}");
    }
    Ok(())
}

/// The HTTP status of a write: 200 if it succeeded.
fn status<T>(result: std::result::Result<T, kube::Error>) -> u16 {
    match result {
        Err(kube::Error::Api(status)) => status.code,
        Err(_) => 0,
        Ok(_) => 200,
    }
}

/// Waits for the promotion and the moved `-rw`, then lets the node return and
/// waits for the old primary to be a ready replica again.
async fn failover_and_rejoin(
    ns: &TestNamespace,
    clusters: &Api<DatabaseCluster>,
    old_primary: &str,
    node: u32,
    frozen: Instant,
) -> Result<String> {
    let promoted = wait::for_object(clusters, CLUSTER, "another primary", READY_TIMEOUT, |c| {
        c.status
            .as_ref()
            .and_then(|s| s.current_primary.as_deref())
            .is_some_and(|p| p != old_primary)
    })
    .await?;
    let new_primary = promoted
        .status
        .as_ref()
        .and_then(|s| s.current_primary.clone())
        .unwrap_or_default();
    eprintln!(
        "failover: {new_primary} promoted {:.1} s after the node of {old_primary} stopped ({:?})",
        frozen.elapsed().as_secs_f64(),
        promoted
            .status
            .as_ref()
            .and_then(|s| s.last_failover.as_ref()),
    );
    until_psql(ns, RW, "SELECT pg_is_in_recovery()", "f").await?;
    let pods = ns.api::<Pod>();
    let labelled = pods.get(&new_primary).await?;
    assert_eq!(
        labelled
            .metadata
            .labels
            .unwrap_or_default()
            .get(ROLE_LABEL)
            .map(String::as_str),
        Some("primary")
    );
    until_acknowledged_after(ns, 20).await?;
    cluster().start_node(node)?;
    let thawed = Instant::now();
    rejoins_as_replica(ns, old_primary).await?;
    eprintln!(
        "failover: {old_primary} a ready replica {:.1} s after its node returned",
        thawed.elapsed().as_secs_f64()
    );
    until_ready(clusters, |c| {
        c.status
            .as_ref()
            .and_then(|s| s.last_failover.as_ref())
            .is_some_and(|f| f.completed_at.is_some())
    })
    .await?;
    Ok(new_primary)
}

/// Until the primary isolated at `cut_at` (from the API server and from its
/// peers) takes no writes; it must stop within the hold of the replicas
/// that last heard it (4 s), after which one may be promoted: its peer-kept
/// writes end 2 s after the last claim they acknowledged. Then a replica
/// takes over. Returns when it stopped taking writes.
async fn partitioned_primary_fences_itself(
    ns: &TestNamespace,
    clusters: &Api<DatabaseCluster>,
    primary: &str,
    cut_at: f64,
) -> Result<f64> {
    let host = format!("{primary}.{CLUSTER}");
    wait::until(
        "the cut-off primary takes no writes",
        READY_TIMEOUT,
        || async {
            match psql(ns, &host, "SELECT pg_is_in_recovery()").await {
                Ok(out) if out == "f" => Err("still a primary".to_owned()),
                _ => Ok(Some(())),
            }
        },
    )
    .await?;
    let fenced_at = unix_now();
    eprintln!(
        "partition: {primary} stopped taking writes {:.1} s after it was cut off from its peers too",
        fenced_at - cut_at
    );
    // Fenced 2.1 s at most after the last claim acknowledged; each probe
    // (psql in the client pod) takes up to a second more.
    assert!(
        fenced_at - cut_at < 5.0,
        "the isolated primary took writes for {:.1} s, past the replicas' 4 s hold",
        fenced_at - cut_at
    );
    wait::for_object(clusters, CLUSTER, "another primary", READY_TIMEOUT, |c| {
        c.status
            .as_ref()
            .and_then(|s| s.current_primary.as_deref())
            .is_some_and(|p| p != primary)
    })
    .await?;
    until_psql(ns, RW, "SELECT pg_is_in_recovery()", "f").await?;
    until_acknowledged_after(ns, 20).await?;
    eprintln!(
        "partition: writes through -rw again {:.1} s after the cut",
        unix_now() - cut_at
    );
    Ok(fenced_at)
}

/// Until `pod` is a ready replica, labelled so, in recovery.
async fn rejoins_as_replica(ns: &TestNamespace, pod: &str) -> Result {
    wait::for_object(
        &ns.api::<Pod>(),
        pod,
        "Ready as a replica",
        READY_TIMEOUT,
        |p| {
            wait::condition_status(p, "Ready").as_deref() == Some("True")
                && p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(ROLE_LABEL))
                    .map(String::as_str)
                    == Some("replica")
        },
    )
    .await?;
    until_psql(
        ns,
        &format!("{pod}.{CLUSTER}"),
        "SELECT pg_is_in_recovery()",
        "t",
    )
    .await
}

async fn until_ready(
    clusters: &Api<DatabaseCluster>,
    and: impl Fn(&DatabaseCluster) -> bool,
) -> Result {
    wait::for_object(
        clusters,
        CLUSTER,
        "3 ready instances, Ready=True",
        READY_TIMEOUT,
        |c| {
            let status = c.status.as_ref();
            status.and_then(|s| s.ready_instances) == Some(3)
                && wait::condition_status(c, "Ready").as_deref() == Some("True")
                && and(c)
        },
    )
    .await?;
    Ok(())
}
