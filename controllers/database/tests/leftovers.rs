//! A pod the garbage collector missed. When a cluster's StatefulSet is
//! replaced while kube-controller-manager cannot act (here it is frozen; in
//! the chaos run its watch was down across the delete and the re-create),
//! the old StatefulSet's pod stays, and the new StatefulSet can never create
//! a pod of that name. The controller, as a process with its chart's RBAC,
//! deletes such a pod itself once the new StatefulSet is as old as the
//! collector's grace: 60 s by default, 15 s here
//! (`CAIRN_COLLECTOR_GRACE_SECONDS`); the unit tests of `leftovers.rs`
//! cover the default's decision.
//!
//! Its own test binary: freezing kube-controller-manager would stall every
//! other test running beside it.

mod support;

use std::time::{Duration, Instant};

use cairn_api::database::v1::DatabaseCluster;
use cairn_testing::{Error, cluster, wait};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams};

/// How long the collector is given: the process's
/// `CAIRN_COLLECTOR_GRACE_SECONDS`.
const COLLECTOR_GRACE: Duration = Duration::from_secs(15);

#[tokio::test]
async fn a_pod_left_by_a_replaced_stateful_set_is_deleted_after_the_collectors_grace()
-> Result<(), Error> {
    let namespace = support::namespace("leftover").await?;
    let account = support::install_rbac(&namespace, "leftover").await?;
    let _process = support::start(
        &namespace,
        "leftover",
        &account,
        &[("CAIRN_COLLECTOR_GRACE_SECONDS", "15")],
    )?;
    let clusters = namespace.api::<DatabaseCluster>();
    support::create(&clusters, &support::database_cluster("orders", 1)).await?;
    support::until_condition(
        &clusters,
        "orders",
        "Ready",
        "True",
        Duration::from_secs(90),
    )
    .await?;
    let stateful_sets = namespace.api::<StatefulSet>();
    let pods = namespace.api::<Pod>();
    let old_set = stateful_sets.get("orders").await?.uid();
    let old_pod = pods.get("orders-0").await?.uid();

    let frozen = cluster().freeze_controller_manager()?;
    stateful_sets
        .delete("orders", &DeleteParams::background())
        .await?;
    let replaced = wait::for_object(
        &stateful_sets,
        "orders",
        "the StatefulSet created again",
        Duration::from_secs(30),
        |s| s.uid() != old_set,
    )
    .await?;
    let replaced_at = Instant::now();
    // The old pod still names the old StatefulSet, and nothing collects it.
    assert_eq!(pods.get("orders-0").await?.uid(), old_pod);

    wait::until(
        "the leftover pod deleted",
        COLLECTOR_GRACE + Duration::from_secs(30),
        || async {
            match pods.get_opt("orders-0").await {
                Ok(Some(pod))
                    if pod.uid() == old_pod && pod.metadata.deletion_timestamp.is_none() =>
                {
                    Err("still there".to_owned())
                }
                Ok(_) => Ok(Some(())),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await?;
    let waited = replaced_at.elapsed();
    println!(
        "leftover pod deleted {:.1} s after the StatefulSet was created again",
        waited.as_secs_f64()
    );
    // Not before the collector's grace, counted from the new StatefulSet's
    // creation (a second of slack for the clocks' resolution).
    let created = replaced
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0)
        .ok_or_else(|| Error::Setup("no creationTimestamp".into()))?;
    let deleted_by_controller: Vec<_> =
        support::writes_by(&support::user(&namespace, &account), &namespace.name)?
            .into_iter()
            .filter(|w| {
                w.verb == "delete" && w.resource == "pods" && w.name.as_deref() == Some("orders-0")
            })
            .collect();
    assert_eq!(
        deleted_by_controller.len(),
        1,
        "the controller deleted the pod once (kube-controller-manager is frozen): {deleted_by_controller:?}"
    );
    let deleted_at: k8s_openapi::jiff::Timestamp = deleted_by_controller[0]
        .received
        .parse()
        .map_err(|e| Error::Setup(format!("{e}")))?;
    let after = deleted_at.duration_since(created);
    assert!(
        after.as_secs() + 1 >= COLLECTOR_GRACE.as_secs() as i64,
        "deleted {after:?} after the new StatefulSet's creation, before the grace"
    );
    let events = namespace
        .api::<Event>()
        .list(&ListParams::default())
        .await?;
    let said = events
        .items
        .iter()
        .find(|e| e.reason.as_deref() == Some("LeftoverPodDeleted"))
        .ok_or_else(|| Error::Setup("no LeftoverPodDeleted Event".into()))?;
    println!("Event: {}", said.note.clone().unwrap_or_default());
    assert_eq!(said.type_.as_deref(), Some("Warning"));

    // With the manager running again the new StatefulSet makes its pod.
    drop(frozen);
    let new_set = replaced.uid();
    wait::for_object(
        &pods,
        "orders-0",
        "the new StatefulSet's pod",
        Duration::from_secs(90),
        |pod| {
            pod.owner_references()
                .iter()
                .any(|o| o.controller == Some(true) && Some(&o.uid) == new_set.as_ref())
        },
    )
    .await?;
    support::until_condition(
        &clusters,
        "orders",
        "Ready",
        "True",
        Duration::from_secs(90),
    )
    .await?;
    Ok(())
}
