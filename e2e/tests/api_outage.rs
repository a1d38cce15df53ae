//! An API-server outage is not a write outage: on the real nodes, with the
//! controller from its chart, the API server is stopped for a minute (twelve
//! times the primary's fence bound) while a client pod commits a row through
//! `<name>-rw` every 100 ms. The primary renews no heartbeat, but both
//! replicas still acknowledge its claims, so it serves on: the longest gap
//! between acknowledged writes stays under 2 s, no failover is recorded
//! before or after the API server returns, and no acknowledged row is lost.
//!
//! Alone in its binary, after the lanes: it stops the shared API server.

use std::time::Duration;

use cairn_api::database::v1::DatabaseCluster;
use cairn_e2e::real::{
    READY_TIMEOUT, cluster_spec, current_primary, namespace_with_controller, node_of, rows_present,
    start_client_on, start_ticks, stop_writer, unix_now, until_acknowledged_after, until_ready,
    until_replicas_follow, writes,
};
use cairn_testing::{Error, cluster, wait};
use kube::api::PostParams;

type Result<T = ()> = std::result::Result<T, Error>;

const CLUSTER: &str = "steady";
const RW: &str = "steady-rw";
const OUTAGE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn writes_go_on_while_the_api_server_is_down() -> Result {
    let ns = namespace_with_controller("api-outage").await?;
    let clusters = ns.api::<DatabaseCluster>();
    clusters
        .create(
            &PostParams::default(),
            &DatabaseCluster::new(CLUSTER, cluster_spec(3)),
        )
        .await?;
    until_ready(&clusters, CLUSTER, 3).await?;
    until_replicas_follow(&ns, &clusters, CLUSTER, 3).await?;
    let primary = current_primary(&clusters, CLUSTER).await?;
    start_client_on(&ns, CLUSTER, Some(&node_of(&ns, &primary).await?)).await?;
    start_ticks(&ns, RW).await?;
    let failover_before = clusters
        .get(CLUSTER)
        .await?
        .status
        .and_then(|s| s.last_failover);

    cluster().stop_apiserver()?;
    let stopped_at = unix_now();
    // The fault's length, not a wait for something to happen: the writer's
    // record is what shows whether writes went on.
    tokio::time::sleep(OUTAGE).await;
    cluster().start_apiserver()?;
    let started_at = unix_now();
    // Back: the instances renew, the controller sees every replica hear the
    // primary, and keeps it; writes still go through.
    until_acknowledged_after(&ns, 20).await?;
    wait::for_object(
        &clusters,
        CLUSTER,
        "the primary's heartbeat seen again",
        READY_TIMEOUT,
        |c| {
            c.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
                    && !s
                        .conditions
                        .iter()
                        .any(|c| c.type_ == "Degraded" && c.status == "True")
            })
        },
    )
    .await?;
    let status = clusters.get(CLUSTER).await?.status.unwrap_or_default();
    assert_eq!(status.current_primary.as_deref(), Some(primary.as_str()));
    assert_eq!(
        status.last_failover, failover_before,
        "a failover was recorded across the outage"
    );

    stop_writer(&ns).await?;
    let writes = writes(&ns).await?;
    let acknowledged: Vec<_> = writes.iter().filter(|w| w.ok).collect();
    let during = acknowledged
        .iter()
        .filter(|w| (stopped_at..started_at).contains(&w.at))
        .count();
    let longest_gap = acknowledged
        .windows(2)
        .filter(|pair| pair[1].at > stopped_at - 5.0)
        .map(|pair| (pair[1].at - pair[0].at, pair[0].at - stopped_at))
        .fold((0.0_f64, 0.0), |longest, gap| {
            if gap.0 > longest.0 { gap } else { longest }
        });
    let failed_after: Vec<String> = writes
        .iter()
        .filter(|w| !w.ok && w.at > started_at)
        .map(|w| format!("{:+.1}", w.at - started_at))
        .collect();
    eprintln!(
        "API server stopped {} s: {during} writes acknowledged meanwhile, longest gap {:.2} s \
         ({:+.1} s from the stop); writes failed after it returned at {failed_after:?} s",
        OUTAGE.as_secs(),
        longest_gap.0,
        longest_gap.1,
    );
    let present = match rows_present(&ns, RW).await {
        Ok(present) => present,
        Err(error) => {
            eprintln!("{}", routing(&ns).await);
            return Err(error);
        }
    };
    let lost: Vec<u64> = acknowledged
        .iter()
        .filter(|w| !present.contains(&w.id))
        .map(|w| w.id)
        .collect();
    eprintln!("{} acknowledged rows lost, no failover", lost.len());
    assert!(lost.is_empty(), "acknowledged rows lost: {lost:?}");
    assert!(
        longest_gap.0 <= 2.0,
        "writes stopped for {:.2} s, {:+.1} s from the stop",
        longest_gap.0,
        longest_gap.1
    );
    assert!(
        during as f64 >= OUTAGE.as_secs_f64(),
        "only {during} writes acknowledged during the outage"
    );
    Ok(())
}

/// What routes `-rw` when it refused a connection: the pods' labels and
/// readiness, the endpoint slices, the namespace's events.
async fn routing(ns: &cairn_testing::TestNamespace) -> String {
    let mut out = String::new();
    for what in [
        &["get", "pods", "-o", "wide", "--show-labels"][..],
        &["get", "endpointslices", "-o", "wide"],
        &["get", "nodes"],
        &["get", "events", "--sort-by=.lastTimestamp"],
    ] {
        let mut args = vec!["-n", &ns.name];
        args.extend_from_slice(what);
        match cluster().kubectl(&args).await {
            Ok(o) => out.push_str(&o.stdout),
            Err(e) => out.push_str(&e.to_string()),
        }
    }
    out
}
