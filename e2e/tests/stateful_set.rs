//! A cluster's StatefulSet deleted after a switchover, on the real nodes,
//! with the controller installed by its chart (found by the chaos run). The
//! garbage collector deletes both instances; the controller creates the
//! StatefulSet again. Its primary is now ordinal 1: with OrderedReady pod
//! management the StatefulSet would create ordinal 0 alone and wait for it
//! to be Ready, which a replica without its primary never is, so the primary
//! would never come back. The instances start all at once instead, the
//! primary stays the primary, and no committed row is lost.

use std::time::Instant;

use cairn_api::database::v1::DatabaseCluster;
use cairn_e2e::real::{
    READY_TIMEOUT, cluster_spec, current_primary, enforce_restricted_pod_security,
    install_controller, psql, start_client, switch_over, until_psql, until_ready,
};
use cairn_testing::{Error, cluster, wait};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{DeleteParams, PostParams};

type Result<T = ()> = std::result::Result<T, Error>;

const CLUSTER: &str = "orders";
const RW: &str = "orders-rw";

#[tokio::test]
async fn a_stateful_set_deleted_after_a_switchover_brings_its_primary_back() -> Result {
    let ns = cluster().namespace_on_real_nodes("statefulset").await?;
    enforce_restricted_pod_security(&ns).await?;
    install_controller(&ns).await?;
    let clusters = ns.api::<DatabaseCluster>();
    clusters
        .create(
            &PostParams::default(),
            &DatabaseCluster::new(CLUSTER, cluster_spec(2)),
        )
        .await?;
    until_ready(&clusters, CLUSTER, 2).await?;
    let primary = format!("{CLUSTER}-1");
    switch_over(&ns, CLUSTER, &primary).await?;
    until_ready(&clusters, CLUSTER, 2).await?;
    start_client(&ns, CLUSTER).await?;
    psql(
        &ns,
        RW,
        "CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)",
    )
    .await?;

    let stateful_sets = ns.api::<StatefulSet>();
    let old_uid = stateful_sets.get(CLUSTER).await?.uid();
    stateful_sets
        .delete(CLUSTER, &DeleteParams::background())
        .await?;
    let deleted = Instant::now();
    // Both instances go with their StatefulSet (the garbage collector) and
    // come back with the new one (the status may lag behind the pods).
    let pods = ns.api::<Pod>();
    wait::until("both instances back and Ready", READY_TIMEOUT, || async {
        for name in [format!("{CLUSTER}-0"), primary.clone()] {
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
        "StatefulSet deleted: both instances back and the cluster Ready {:.1} s later",
        deleted.elapsed().as_secs_f64()
    );
    let recreated = stateful_sets.get(CLUSTER).await?;
    assert_ne!(recreated.uid(), old_uid, "a new StatefulSet");
    assert_eq!(
        recreated
            .spec
            .and_then(|s| s.pod_management_policy)
            .as_deref(),
        Some("Parallel")
    );
    assert_eq!(
        current_primary(&clusters, CLUSTER).await?,
        primary,
        "the primary came back as the primary, no failover"
    );
    until_psql(&ns, RW, "SELECT v FROM kept", "42").await?;
    Ok(())
}
