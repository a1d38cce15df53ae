//! Synchronous replication on the real nodes, with the controller installed
//! by its chart: a 3-instance cluster where every commit waits for one of the
//! two replicas (`spec.replication.synchronousReplicas: 1`). The primary's
//! node stops while a client pod commits rows through `<name>-rw`; after the
//! failover the old primary rejoins; then the new primary's cairn-instance and
//! postgres are killed (SIGKILL) and writes resume. Every acknowledged row is
//! present at the end.

use std::time::Instant;

use cairn_api::database::v1::{DatabaseCluster, ReplicationSpec};
use cairn_e2e::real::{
    READY_TIMEOUT, as_superuser, cluster_spec, current_primary, namespace_with_controller, node_of,
    other_real_node, psql, rows_present, start_client_on, start_writer, stop_writer, unix_now,
    until_acknowledged, until_acknowledged_after, until_psql, until_ready, writes,
};
use cairn_testing::{Error, LocalCluster, TestNamespace, cluster, wait};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;

type Result<T = ()> = std::result::Result<T, Error>;

const CLUSTER: &str = "quorum";
const RW: &str = "quorum-rw";

#[tokio::test]
async fn with_synchronous_replication_a_failover_loses_no_acknowledged_row() -> Result {
    let ns = namespace_with_controller("synchronous").await?;
    let clusters = ns.api::<DatabaseCluster>();
    let mut spec = cluster_spec(3);
    spec.replication = Some(ReplicationSpec {
        synchronous_replicas: 1,
    });
    clusters
        .create(&PostParams::default(), &DatabaseCluster::new(CLUSTER, spec))
        .await?;
    until_ready(&clusters, CLUSTER, 3).await?;
    let old_primary = current_primary(&clusters, CLUSTER).await?;
    let node = node_of(&ns, &old_primary).await?;
    let other_node = other_real_node(&ns, CLUSTER, &node).await?;
    start_client_on(&ns, CLUSTER, Some(&other_node)).await?;

    // The primary asks for a quorum of one among the instances, and both
    // replicas stream as quorum candidates.
    let names = psql(&ns, RW, "SHOW synchronous_standby_names").await?;
    assert_eq!(names, r#"ANY 1 ("quorum-0", "quorum-1", "quorum-2")"#);
    // (Only a superuser sees a standby's sync_state.)
    wait::until("both replicas quorum candidates", READY_TIMEOUT, || async {
        let states = as_superuser(
            &ns,
            &old_primary,
            "SELECT string_agg(sync_state, ',') FROM pg_stat_replication",
        )
        .await
        .map_err(|e| e.to_string())?;
        match states.as_str() {
            "quorum,quorum" => Ok(Some(())),
            _ => Err(states),
        }
    })
    .await?;

    psql(&ns, RW, "CREATE TABLE ticks (id bigint PRIMARY KEY)").await?;
    start_writer(&ns, RW).await?;
    until_acknowledged(&ns, 20).await?;
    let number = LocalCluster::real_node_number(&node)
        .ok_or_else(|| Error::Setup(format!("{old_primary} is on {node}, not a real node")))?;
    cluster().stop_node(number)?;
    let frozen_at = unix_now();
    let frozen = Instant::now();
    let result = fail_over(&ns, &clusters, &old_primary, frozen).await;
    cluster().start_node(number)?;
    let new_primary = result?;

    // Then the new primary crashes: SIGKILL of its cairn-instance and
    // postgres. Writes resume (on it, restarted in place, or on a replica
    // promoted if it stays down past the failover delay).
    until_ready(&clusters, CLUSTER, 3).await?;
    until_acknowledged_after(&ns, 10).await?;
    let restarts = |pod: &Pod| {
        pod.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.iter().find(|c| c.name == "postgres"))
            .map_or(0, |c| c.restart_count)
    };
    let pods = ns.api::<Pod>();
    let restarted_before = restarts(&pods.get(&new_primary).await?);
    let killed_at = unix_now();
    cluster().kill_container(&ns.name, &new_primary, "postgres")?;
    // The kubelet saw the container die: the kill happened.
    wait::for_object(
        &pods,
        &new_primary,
        "its container restarted",
        READY_TIMEOUT,
        |p| restarts(p) > restarted_before,
    )
    .await?;
    until_acknowledged_after(&ns, 20).await?;
    // Unavailability: from the kill to the first acknowledged write begun
    // after the first write the kill made fail.
    let writes_now = writes(&ns).await?;
    let first_failed = writes_now
        .iter()
        .find(|w| !w.ok && w.started > killed_at)
        .map(|w| w.started);
    let resumed = writes_now
        .iter()
        .find(|w| w.ok && w.started > first_failed.unwrap_or(killed_at))
        .map(|w| w.at - killed_at);
    let serving = current_primary(&clusters, CLUSTER).await?;
    eprintln!(
        "SIGKILL of {new_primary}'s cairn-instance and postgres → first acknowledged write \
         {:.1} s (first failed write begun {:.1} s after the kill); primary now {serving} ({})",
        resumed.unwrap_or(f64::NAN),
        first_failed.map_or(f64::NAN, |at| at - killed_at),
        if serving == new_primary {
            "restarted in place"
        } else {
            "failed over"
        }
    );
    assert!(resumed.is_some(), "no write succeeded after the kill");

    stop_writer(&ns).await?;
    let writes = writes(&ns).await?;
    let present = rows_present(&ns, RW).await?;
    let acknowledged: Vec<u64> = writes.iter().filter(|w| w.ok).map(|w| w.id).collect();
    let missing: Vec<u64> = acknowledged
        .iter()
        .copied()
        .filter(|id| !present.contains(id))
        .collect();
    let first_after = writes
        .iter()
        .find(|w| w.ok && w.started > frozen_at)
        .map(|w| w.at - frozen_at);
    eprintln!(
        "synchronous failover: {old_primary} → {new_primary}; {} writes acknowledged, {} present, \
         {} missing; node stopped → first acknowledged write {:.1} s",
        acknowledged.len(),
        present.len(),
        missing.len(),
        first_after.unwrap_or(f64::NAN)
    );
    assert!(
        missing.is_empty(),
        "acknowledged rows lost with synchronous replication: {missing:?}"
    );
    assert!(
        first_after.is_some(),
        "no write succeeded after the failover"
    );

    // The old primary rejoins as a replica and holds exactly the new
    // primary's rows.
    until_ready(&clusters, CLUSTER, 3).await?;
    let count = psql(&ns, RW, "SELECT count(*) FROM ticks").await?;
    let old_host = format!("{old_primary}.{CLUSTER}");
    until_psql(&ns, &old_host, "SELECT pg_is_in_recovery()", "t").await?;
    until_psql(&ns, &old_host, "SELECT count(*) FROM ticks", &count).await?;
    Ok(())
}

/// Waits for another primary, `-rw` reaching it and writes going through.
async fn fail_over(
    ns: &TestNamespace,
    clusters: &Api<DatabaseCluster>,
    old_primary: &str,
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
        .and_then(|s| s.current_primary)
        .unwrap_or_default();
    eprintln!(
        "synchronous failover: {new_primary} promoted {:.1} s after the node stopped",
        frozen.elapsed().as_secs_f64()
    );
    until_psql(ns, RW, "SELECT pg_is_in_recovery()", "f").await?;
    // With one replica left streaming, commits are confirmed by it.
    until_acknowledged_after(ns, 20).await?;
    Ok(new_primary)
}
