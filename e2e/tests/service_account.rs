//! A cluster's ServiceAccount deleted, on the real nodes, with the controller
//! installed by its chart. The controller creates the account again, but
//! each running instance's token names the deleted one: the API server
//! answers it 401, so no instance can report its heartbeat (the primary
//! looks lost and no replica can take over) until the kubelet refreshes the
//! token, up to 48 minutes later. The controller restarts those pods instead,
//! the replica before the primary, and the cluster is Ready again.

use std::collections::BTreeMap;
use std::time::Instant;

use cairn_api::database::v1::DatabaseCluster;
use cairn_e2e::real::{
    READY_TIMEOUT, cluster_spec, current_primary, namespace_with_controller, until_ready,
};
use cairn_testing::{Error, wait};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};

type Result<T = ()> = std::result::Result<T, Error>;

const CLUSTER: &str = "ledger";

#[tokio::test]
async fn instances_whose_service_account_was_replaced_are_restarted_replica_first() -> Result {
    let ns = namespace_with_controller("account").await?;
    let clusters = ns.api::<DatabaseCluster>();
    clusters
        .create(
            &PostParams::default(),
            &DatabaseCluster::new(CLUSTER, cluster_spec(2)),
        )
        .await?;
    until_ready(&clusters, CLUSTER, 2).await?;
    let primary = current_primary(&clusters, CLUSTER).await?;
    let pods = ns.api::<Pod>();
    let before = instance_uids(&pods).await?;
    assert_eq!(before.len(), 2, "{before:?}");

    ns.api::<ServiceAccount>()
        .delete(CLUSTER, &DeleteParams::default())
        .await?;
    let deleted = Instant::now();
    wait::until("both instances restarted", READY_TIMEOUT, || async {
        let now = instance_uids(&pods).await.map_err(|e| e.to_string())?;
        let restarted = before
            .iter()
            .filter(|(name, uid)| now.get(*name).is_some_and(|new| new != *uid))
            .count();
        match restarted {
            2 => Ok(Some(())),
            n => Err(format!("{n} of 2 restarted")),
        }
    })
    .await?;
    until_ready(&clusters, CLUSTER, 2).await?;
    println!(
        "ServiceAccount deleted: both instances restarted and the cluster Ready {:.1} s later",
        deleted.elapsed().as_secs_f64()
    );
    assert_eq!(
        current_primary(&clusters, CLUSTER).await?,
        primary,
        "the primary restarted in place, no failover"
    );

    // One Event each; the recorder folds the second into the first's series,
    // whose note stays the first's: the replica's.
    let mut events: Vec<Event> = ns
        .api::<Event>()
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("ServiceAccountReplaced"))
        .collect();
    events.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    let announced: i32 = events
        .iter()
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum();
    assert_eq!(announced, 2, "once per restarted pod: {events:?}");
    let replica = before
        .keys()
        .find(|name| **name != primary)
        .cloned()
        .unwrap_or_default();
    let first = events
        .first()
        .and_then(|e| e.note.clone())
        .unwrap_or_default();
    assert!(
        first.starts_with(&format!("deleted pod {replica}:")),
        "the replica first: {first}"
    );
    Ok(())
}

/// The instance pods' uids by name.
async fn instance_uids(pods: &Api<Pod>) -> Result<BTreeMap<String, String>> {
    let selector = format!("app.kubernetes.io/instance={CLUSTER}");
    Ok(pods
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| Some((p.name_any(), p.uid()?)))
        .collect())
}
