//! A cluster's StatefulSet deleted after a failover, on the real nodes, with
//! the controller installed by its chart (found by the chaos run). The
//! primary's node stops and the replica at ordinal 1 is promoted; then the
//! StatefulSet is deleted, the garbage collector deletes both instances, the
//! node comes back and the controller creates the StatefulSet again. With
//! OrderedReady pod management it would create ordinal 0 alone and wait for
//! it to be Ready, which the old primary never is: it must ask the new
//! primary, never created, whether to rewind. The instances start all at
//! once instead, the new primary stays the primary, the old one rejoins,
//! and no committed row is lost.

use std::time::Instant;

use cairn_api::database::v1::DatabaseCluster;
use cairn_e2e::real::{
    READY_TIMEOUT, cluster_spec, current_primary, namespace_with_controller, node_of,
    other_real_node, psql, start_client_on, until_psql, until_ready,
};
use cairn_testing::{Error, LocalCluster, TestNamespace, cluster, wait};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};

type Result<T = ()> = std::result::Result<T, Error>;

const CLUSTER: &str = "orders";
const RW: &str = "orders-rw";

#[tokio::test]
async fn a_stateful_set_deleted_after_a_failover_brings_both_instances_back() -> Result {
    let ns = namespace_with_controller("statefulset").await?;
    let clusters = ns.api::<DatabaseCluster>();
    clusters
        .create(
            &PostParams::default(),
            &DatabaseCluster::new(CLUSTER, cluster_spec(2)),
        )
        .await?;
    until_ready(&clusters, CLUSTER, 2).await?;
    let old_primary = current_primary(&clusters, CLUSTER).await?;
    assert_eq!(
        old_primary,
        format!("{CLUSTER}-0"),
        "a new cluster's primary"
    );
    let node = node_of(&ns, &old_primary).await?;
    let other_node = other_real_node(&ns, CLUSTER, &node).await?;
    start_client_on(&ns, CLUSTER, Some(&other_node)).await?;
    psql(
        &ns,
        RW,
        "CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)",
    )
    .await?;

    let number = LocalCluster::real_node_number(&node)
        .ok_or_else(|| Error::Setup(format!("{old_primary} is on {node}, not a real node")))?;
    cluster().stop_node(number)?;
    let result = fail_over_and_delete_the_stateful_set(&ns, &clusters, &old_primary).await;
    // The node runs again whatever happened, for the suites after this one.
    cluster().start_node(number)?;
    let (new_primary, old_uid) = result?;
    let restarted = Instant::now();

    // Both instances go with their StatefulSet (the garbage collector; the
    // old primary's once its node runs) and come back with the new one.
    let pods = ns.api::<Pod>();
    wait::until("both instances back and Ready", READY_TIMEOUT, || async {
        for name in [old_primary.clone(), new_primary.clone()] {
            let pod = pods.get_opt(&name).await.map_err(|e| e.to_string())?;
            let Some(pod) = pod else {
                return Err(format!("no pod {name}"));
            };
            let owners = pod.metadata.owner_references.unwrap_or_default();
            if owners.iter().any(|r| Some(&r.uid) == old_uid.as_ref()) {
                return Err(format!("{name} still belongs to the old StatefulSet"));
            }
            let ready = pod
                .status
                .and_then(|s| s.conditions)
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if !ready {
                return Err(format!("{name} not Ready"));
            }
        }
        Ok(Some(()))
    })
    .await?;
    until_ready(&clusters, CLUSTER, 2).await?;
    println!(
        "StatefulSet deleted after a failover: both instances back and the cluster Ready {:.1} s after the node returned",
        restarted.elapsed().as_secs_f64()
    );
    assert_eq!(
        current_primary(&clusters, CLUSTER).await?,
        new_primary,
        "the new primary stays the primary"
    );
    until_psql(&ns, RW, "SELECT v FROM kept", "42").await?;
    Ok(())
}

/// Waits for the replica's promotion, then deletes the StatefulSet; the
/// new primary and the deleted StatefulSet's uid.
async fn fail_over_and_delete_the_stateful_set(
    ns: &TestNamespace,
    clusters: &Api<DatabaseCluster>,
    old_primary: &str,
) -> Result<(String, Option<String>)> {
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
    until_psql(ns, RW, "SELECT pg_is_in_recovery()", "f").await?;
    let stateful_sets = ns.api::<StatefulSet>();
    let old_uid = stateful_sets.get(CLUSTER).await?.uid();
    stateful_sets
        .delete(CLUSTER, &DeleteParams::background())
        .await?;
    Ok((new_primary, old_uid))
}
