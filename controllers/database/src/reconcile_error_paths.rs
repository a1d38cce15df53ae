//! Reconcile against an in-process fake API ([`cairn_testing::fake_api`])
//! for what a real server seldom does on demand: a 409 on an apply, a 500 or
//! a lost connection in the middle of the children, a conflicting status
//! write. Each checks the retry class and that no status claims more than
//! was done (the real-server suites prove the happy paths). And what a new
//! cluster's first reconcile costs: each object written once, no Event.

use std::sync::Arc;
use std::time::Instant;

use cairn_api::database::instance::{FENCED_ANNOTATION, OBSERVED_ANNOTATION};
use cairn_api::database::v1::FORCED_PROMOTION_ANNOTATION;
use cairn_runtime::errors::ErrorClass;
use cairn_runtime::manager::Classify;
use cairn_testing::fake_api::{Answer, FakeApi, Fault, Recorded};
use kube::runtime::events::Recorder;
use kube::runtime::reflector::store;
use kube::runtime::watcher;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;

use super::*;
use crate::fixtures;
use crate::metrics::ClusterMetrics;

fn context(client: Client) -> Arc<Context> {
    context_with_pods(client, &[])
}

/// [`context`] with `pods` in the Pod cache, which shows no later change.
fn context_with_pods(client: Client, pods: &[Pod]) -> Arc<Context> {
    context_with(client, pods, &[])
}

/// [`context`] with `pods` and `leases` in caches that show no later change,
/// watched since each Lease's renewal.
fn context_with(client: Client, pods: &[Pod], leases: &[Lease]) -> Arc<Context> {
    context_on(client, pods, leases, &[])
}

/// [`context_with`], with `nodes` in the Node cache.
fn context_on(client: Client, pods: &[Pod], leases: &[Lease], nodes: &[Node]) -> Arc<Context> {
    let ctx = unwatched_context_on(client, pods, leases, nodes);
    ctx.watched_since_renewal(leases);
    ctx
}

/// The same, as a controller that has just started sees it.
fn unwatched_context_with(client: Client, pods: &[Pod], leases: &[Lease]) -> Arc<Context> {
    unwatched_context_on(client, pods, leases, &[])
}

fn unwatched_context_on(
    client: Client,
    pods: &[Pod],
    leases: &[Lease],
    nodes: &[Node],
) -> Arc<Context> {
    let (node_store, mut node_writer) = store();
    for node in nodes {
        node_writer.apply_watcher_event(&watcher::Event::Apply(node.clone()));
    }
    let (pod_store, mut pod_writer) = store();
    for pod in pods {
        pod_writer.apply_watcher_event(&watcher::Event::Apply(pod.clone()));
    }
    let (lease_store, mut lease_writer) = store();
    for lease in leases {
        lease_writer.apply_watcher_event(&watcher::Event::Apply(lease.clone()));
    }
    let caches = Caches {
        stateful_sets: store().0,
        services: store().0,
        config_maps: store().0,
        secrets: store().0,
        service_accounts: store().0,
        roles: store().0,
        role_bindings: store().0,
        disruption_budgets: store().0,
        pods: pod_store,
        claims: store().0,
        leases: lease_store,
        nodes: node_store,
    };
    let metrics = ClusterMetrics::register(&prometheus::Registry::new()).expect("metrics");
    Arc::new(Context::new(
        client.clone(),
        Recorder::new(client, MANAGER.into()),
        caches,
        metrics,
    ))
}

const CLUSTER_PATH: &str = "/apis/database.cairn.dev/v1/namespaces/shop/databaseclusters/orders";

/// The fake, holding `cluster` as the API server would.
fn fake_with(cluster: &DatabaseCluster) -> (FakeApi, Client) {
    let (fake, client) = FakeApi::new();
    fake.put(
        CLUSTER_PATH,
        serde_json::to_value(cluster).expect("serializes"),
    );
    (fake, client)
}

/// A new cluster reconciled once against the fake with `fault`.
async fn reconcile_with(fault: Option<Fault>) -> (Result<Recheck, Error>, Vec<Recorded>) {
    let cluster = fixtures::cluster(3, &[]);
    let (fake, client) = fake_with(&cluster);
    if let Some(fault) = fault {
        fake.inject(fault);
    }
    let result = reconcile(Arc::new(cluster), context(client)).await;
    (result, fake.requests())
}

fn fault(method: &'static str, path: &str, answer: Answer) -> Option<Fault> {
    Some(Fault {
        method,
        path: path.into(),
        answer,
        skip: 0,
        times: 1,
    })
}

fn status_writes(requests: &[Recorded]) -> Vec<&Recorded> {
    requests.iter().filter(|r| r.is_status_write()).collect()
}

/// How many status writes `fake` has answered.
fn status_writes_to(fake: &FakeApi) -> usize {
    fake.writes()
        .iter()
        .filter(|w| w.to_string().contains("/status"))
        .count()
}

/// Without faults: every child applied, then one status write (the
/// baseline the fault tests cut short).
#[tokio::test]
async fn a_new_cluster_applies_its_children_then_writes_its_status() {
    let (result, requests) = reconcile_with(None).await;
    assert!(result.is_ok(), "{result:?}");
    let writes: Vec<String> = requests
        .iter()
        .filter(|r| r.is_write())
        .map(ToString::to_string)
        .collect();
    for child in [
        "/statefulsets/orders",
        "/services/orders-rw",
        "/configmaps/orders-config",
    ] {
        assert!(
            writes.iter().any(|w| w.ends_with(child)),
            "{child} applied: {writes:#?}"
        );
    }
    let statuses = status_writes(&requests);
    assert_eq!(statuses.len(), 1, "{writes:#?}");
    assert_eq!(
        requests
            .iter()
            .rposition(|r| r.is_write() && !r.path.contains("/events")),
        requests.iter().rposition(Recorded::is_status_write),
        "the status is the last write: {writes:#?}"
    );
}

#[tokio::test]
async fn a_conflict_on_an_apply_is_retried_and_no_status_is_written() {
    let (result, requests) = reconcile_with(fault(
        "PATCH",
        "/statefulsets/orders",
        Answer::Status(409, "Conflict"),
    ))
    .await;
    let error = result.expect_err("the reconcile fails");
    assert!(
        matches!(&error, Error::Kube(kube::Error::Api(s)) if s.code == 409),
        "{error:?}"
    );
    assert_eq!(error.class(), ErrorClass::Transient);
    assert!(
        status_writes(&requests).is_empty(),
        "no status from a reconcile that did not finish: {requests:#?}"
    );
}

#[tokio::test]
async fn a_server_error_midway_stops_the_reconcile_before_the_status() {
    let (result, requests) = reconcile_with(fault(
        "PATCH",
        "/services/orders-ro",
        Answer::Status(500, "InternalError"),
    ))
    .await;
    let error = result.expect_err("the reconcile fails");
    assert_eq!(error.class(), ErrorClass::Transient, "{error:?}");
    let failed = requests
        .iter()
        .position(|r| r.path.ends_with("/services/orders-ro"))
        .expect("the failing request was made");
    let after: Vec<String> = requests[failed + 1..]
        .iter()
        .filter(|r| r.is_write() && !r.path.contains("/events"))
        .map(ToString::to_string)
        .collect();
    assert!(
        after.is_empty(),
        "nothing written after the failure: {after:#?}"
    );
    assert!(status_writes(&requests).is_empty());
}

#[tokio::test]
async fn a_lost_connection_midway_is_transient() {
    let (result, requests) = reconcile_with(fault(
        "PATCH",
        "/configmaps/orders-config",
        Answer::ConnectionLost,
    ))
    .await;
    let error = result.expect_err("the reconcile fails");
    assert_eq!(error.class(), ErrorClass::Transient, "{error:?}");
    assert!(status_writes(&requests).is_empty());
}

/// A status write that conflicts fails the reconcile (to be retried from a
/// fresh cache), never counted as done.
#[tokio::test]
async fn a_conflicting_status_write_fails_the_reconcile() {
    let (result, requests) = reconcile_with(fault(
        "PATCH",
        "/databaseclusters/orders/status",
        Answer::Status(409, "Conflict"),
    ))
    .await;
    let error = result.expect_err("the reconcile fails");
    assert_eq!(error.class(), ErrorClass::Transient, "{error:?}");
    assert_eq!(status_writes(&requests).len(), 1, "tried once");
}

/// An invalid spec is reported in the status and not retried with backoff,
/// and nothing of the cluster is built.
#[tokio::test]
async fn an_invalid_spec_is_reported_and_builds_nothing() {
    let mut cluster = fixtures::cluster(3, &[]);
    cluster.spec.resources = Some(
        serde_json::from_value(serde_json::json!({
            "requests": { "cpu": "2" }, "limits": { "cpu": "1" },
        }))
        .expect("resources"),
    );
    let (fake, client) = fake_with(&cluster);
    let result = reconcile(Arc::new(cluster), context(client)).await;
    let error = result.expect_err("refused");
    assert_eq!(error.class(), ErrorClass::InvalidSpec, "{error:?}");
    let writes: Vec<String> = fake
        .writes()
        .iter()
        .filter(|r| !r.path.contains("/events"))
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        writes,
        ["PATCH /apis/database.cairn.dev/v1/namespaces/shop/databaseclusters/orders/status"],
        "only the status saying why"
    );
    let status = &fake
        .requests()
        .into_iter()
        .find(Recorded::is_status_write)
        .expect("a status write")
        .body["status"];
    let ready = status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(ready["status"], "False", "{status}");
    assert_eq!(ready["reason"], "InvalidSpec", "{status}");
}

/// A new single-instance cluster's first reconcile writes each object once
/// and announces nothing: its first conditions (not ready yet, creating,
/// not degraded) and its first certificate are no news.
#[tokio::test]
async fn a_new_cluster_writes_each_object_once_and_no_event() {
    let cluster = fixtures::cluster(1, &[]);
    let (fake, client) = fake_with(&cluster);
    reconcile(Arc::new(cluster), context(client))
        .await
        .expect("reconciled");
    let writes: Vec<String> = fake.writes().iter().map(ToString::to_string).collect();
    assert!(
        !writes.iter().any(|w| w.contains("/events")),
        "no Event: {writes:#?}"
    );
    let mut distinct = writes.clone();
    distinct.sort();
    distinct.dedup();
    // Three Secrets are created by POST to one path: the rest once each.
    assert_eq!(writes.len(), distinct.len() + 2, "{writes:#?}");
    // No disruption budget for one instance: it would allow every eviction.
    assert!(
        !writes.iter().any(|w| w.contains("poddisruptionbudgets")),
        "{writes:#?}"
    );
    assert_eq!(writes.len(), 14, "{writes:#?}");
}

/// A cache that has not shown the status written yet (its watch lags) gets
/// no second write of the same conditions stamped a second later.
#[tokio::test]
async fn a_status_the_cache_has_not_shown_is_not_written_again_a_second_later() {
    let mut cluster = fixtures::cluster(1, &[]);
    cluster.metadata.resource_version = Some("7".into());
    let cluster = Arc::new(cluster);
    let (fake, client) = fake_with(&cluster);
    let ctx = context(client);
    reconcile(cluster.clone(), ctx.clone())
        .await
        .expect("reconciled");
    assert_eq!(status_writes_to(&fake), 1);
    // Real time: transition times have a resolution of one second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    reconcile(cluster, ctx).await.expect("reconciled again");
    assert_eq!(status_writes_to(&fake), 1, "{:#?}", fake.writes());
}

/// A Pod cache that has not shown the role label written (a new leader's
/// watch failing after an API server outage, while heartbeats keep waking
/// it) gets no second patch of the same label.
#[tokio::test]
async fn a_role_label_the_pod_cache_has_not_shown_is_not_patched_again() {
    let cluster = Arc::new(fixtures::cluster(1, &[]));
    let (fake, client) = fake_with(&cluster);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "orders-0", "namespace": "shop", "resourceVersion": "3",
            "labels": { "app.kubernetes.io/instance": "orders" },
        },
    }))
    .expect("a pod");
    fake.put(
        "/api/v1/namespaces/shop/pods/orders-0",
        serde_json::to_value(&pod).expect("serializes"),
    );
    let ctx = context_with_pods(client, &[pod]);
    let pod_patches = || {
        fake.writes()
            .iter()
            .filter(|w| w.to_string().ends_with("/pods/orders-0"))
            .count()
    };
    reconcile(cluster.clone(), ctx.clone())
        .await
        .expect("reconciled");
    assert_eq!(pod_patches(), 1, "labelled: {:#?}", fake.writes());
    reconcile(cluster, ctx).await.expect("reconciled again");
    assert_eq!(pod_patches(), 1, "{:#?}", fake.writes());
}

/// A failover that cannot be done (the only replica lacks the cluster's
/// timeline) waits, and says why in the status: once, not at every look
/// while it waits (a message counting the seconds of silence, and the
/// `Progressing` a step of the build turned off and on again, were written
/// about once a second in a real run).
#[tokio::test]
async fn a_blocked_failover_is_written_once_while_it_waits() {
    let cluster = serving_cluster();
    let cluster = Arc::new(cluster);
    let (fake, client) = fake_with(&cluster);
    let leases = [
        member_lease(
            "orders-0",
            60,
            serde_json::json!({ "ready": true, "role": "primary", "timeline": 3 }),
        ),
        member_lease(
            "orders-1",
            0,
            serde_json::json!({ "ready": true, "role": "replica", "timeline": 2 }),
        ),
    ];
    let ctx = context_with(client, &[], &leases);
    reconcile(cluster.clone(), ctx.clone())
        .await
        .expect("reconciled");
    assert_eq!(status_writes_to(&fake), 1);
    let written = ctx.applier.with_written_status(cluster.clone());
    let blocked =
        status::condition(written.status.as_ref(), status::PROGRESSING).expect("Progressing");
    assert_eq!(
        blocked.reason,
        status::reason::FAILOVER_BLOCKED,
        "{blocked:?}"
    );
    // Real time: messages and transition times have a resolution of one second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    reconcile(cluster, ctx).await.expect("reconciled again");
    assert_eq!(status_writes_to(&fake), 1, "{:#?}", fake.writes());
}

/// A cluster of two, initialised, whose primary `orders-0` serves
/// timeline 3, as the API server holds it (version 7).
fn serving_cluster() -> DatabaseCluster {
    let mut cluster = fixtures::cluster(2, &[]);
    cluster.metadata.resource_version = Some("7".into());
    cluster.status = Some(DatabaseClusterStatus {
        initialized: true,
        current_primary: Some("orders-0".into()),
        timeline: Some(3),
        ..DatabaseClusterStatus::default()
    });
    cluster
}

/// `leases` held by the fake API server, as the controller's fresh reads
/// before a promotion find them.
fn put_leases(fake: &FakeApi, leases: &[Lease]) {
    for lease in leases {
        fake.put(
            &format!(
                "/apis/coordination.k8s.io/v1/namespaces/shop/leases/{}",
                lease.name_any()
            ),
            serde_json::to_value(lease).expect("serializes"),
        );
    }
}

/// A Lease in the cluster's membership, renewed `seconds_ago`, reporting
/// `observed`. Its time in microseconds, as the API server keeps it: the
/// promotion compares the cached Lease with a fresh read.
fn member_lease(pod: &str, seconds_ago: i64, observed: serde_json::Value) -> Lease {
    let renewed = (Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(seconds_ago))
        .round(k8s_openapi::jiff::Unit::Microsecond)
        .expect("a time");
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": pod, "namespace": "shop", "resourceVersion": "5",
            "labels": {
                "app.kubernetes.io/instance": "orders",
                "app.kubernetes.io/component": "membership",
            },
            "annotations": { OBSERVED_ANNOTATION: observed.to_string() },
        },
        "spec": { "renewTime": renewed.to_string() },
    }))
    .expect("a lease")
}

/// Silence is judged on the controller's own clock: a primary whose Lease
/// says it renewed a minute ago (its node's clock a minute behind, or this
/// controller just started) is not lost until this controller has seen no
/// new renewal for the whole delay.
#[tokio::test]
async fn a_renewal_is_timed_by_the_controllers_clock_not_the_nodes() {
    let cluster = serving_cluster();
    let (fake, client) = fake_with(&cluster);
    let leases = [
        member_lease(
            "orders-0",
            60,
            serde_json::json!({ "ready": true, "role": "primary", "timeline": 3 }),
        ),
        member_lease(
            "orders-1",
            0,
            serde_json::json!({ "ready": true, "role": "replica", "timeline": 3 }),
        ),
    ];
    let ctx = unwatched_context_with(client, &[], &leases);
    reconcile(Arc::new(cluster), ctx).await.expect("reconciled");
    let requests = fake.requests();
    let deposed: Vec<String> = requests
        .iter()
        .filter(|r| {
            r.is_write()
                && r.path.ends_with("/leases/orders-0")
                && r.body["metadata"]["annotations"][FENCED_ANNOTATION] == "true"
        })
        .map(|r| format!("{r} {}", r.body))
        .collect();
    assert!(
        deposed.is_empty(),
        "a primary deposed by another node's clock: {deposed:?}"
    );
}

/// A child that cannot be written (a Service refused by a quota or a
/// webhook) does not keep a lost primary from being replaced: the
/// membership step runs first, deposes the silent primary and records the
/// promotion before any child is applied.
#[tokio::test]
async fn a_child_that_cannot_be_written_does_not_hold_up_a_failover() {
    let cluster = serving_cluster();
    let (fake, client) = fake_with(&cluster);
    let leases = [
        member_lease(
            "orders-0",
            60,
            serde_json::json!({ "ready": true, "role": "primary", "timeline": 3 }),
        ),
        member_lease(
            "orders-1",
            0,
            serde_json::json!({ "ready": true, "role": "replica", "timeline": 3 }),
        ),
    ];
    put_leases(&fake, &leases);
    fake.inject(Fault {
        method: "PATCH",
        path: "/services/orders-rw".into(),
        answer: Answer::Status(500, "InternalError"),
        skip: 0,
        times: 1,
    });
    let ctx = context_with(client, &[], &leases);
    let result = reconcile(Arc::new(cluster), ctx).await;
    let error = result.expect_err("the Service's failure fails the reconcile");
    assert_eq!(error.class(), ErrorClass::Transient, "{error:?}");
    let requests = fake.requests();
    let writes: Vec<String> = requests
        .iter()
        .filter(|r| r.is_write())
        .map(ToString::to_string)
        .collect();
    let fenced = requests.iter().any(|r| {
        r.is_write()
            && r.path.ends_with("/leases/orders-0")
            && r.body["metadata"]["annotations"][FENCED_ANNOTATION] == "true"
    });
    assert!(fenced, "the silent primary deposed: {writes:#?}");
    let promoted = requests
        .iter()
        .find(|r| r.is_status_write())
        .map(|r| r.body["status"]["currentPrimary"].clone());
    assert_eq!(
        promoted,
        Some(serde_json::json!("orders-1")),
        "the promotion recorded: {writes:#?}"
    );
    assert!(
        requests
            .iter()
            .any(|r| r.path.ends_with("/services/orders-rw")),
        "the fault was reached: {writes:#?}"
    );
}

/// A primary's membership Lease deleted (by hand, or by a restore of the
/// namespace) deposes no one: the Lease is recreated at once, and a primary
/// that renews it again keeps serving, even when the cache saw it missing
/// for longer than the failover delay.
#[tokio::test]
async fn a_deleted_primary_lease_is_recreated_and_deposes_no_one() {
    let cluster = serving_cluster();
    let cluster = Arc::new(cluster);
    let (fake, client) = fake_with(&cluster);
    let replica = member_lease(
        "orders-1",
        0,
        serde_json::json!({ "ready": true, "role": "replica", "timeline": 3 }),
    );
    let lease_path = "/apis/coordination.k8s.io/v1/namespaces/shop/leases";
    fake.put(
        &format!("{lease_path}/orders-1"),
        serde_json::to_value(&replica).expect("serializes"),
    );
    // The cache and the API server lack the primary's Lease.
    let ctx = context_with(client, &[], std::slice::from_ref(&replica));
    let deposed = |fake: &FakeApi| {
        fake.requests().iter().any(|r| {
            r.is_write()
                && r.path.ends_with("/leases/orders-0")
                && r.body["metadata"]["annotations"][FENCED_ANNOTATION] == "true"
        })
    };
    let promoted = |fake: &FakeApi| {
        fake.writes()
            .iter()
            .any(|r| r.is_status_write() && r.body["status"]["currentPrimary"] == "orders-1")
    };

    // Just missed: recreated, nobody deposed.
    let _ = reconcile(cluster.clone(), ctx.clone()).await;
    let recreated = fake
        .writes()
        .iter()
        .any(|r| r.path == format!("{lease_path}/orders-0"));
    assert!(recreated, "the Lease applied again: {:#?}", fake.writes());
    assert!(!deposed(&fake) && !promoted(&fake), "{:#?}", fake.writes());

    // Missed by the cache for a minute, but the primary renewed the new
    // Lease: the fresh read before a promotion sees it serving.
    let minute_ago = Instant::now()
        .checked_sub(Duration::from_secs(60))
        .expect("a minute of uptime");
    ctx.not_serving_since
        .lock()
        .expect("unpoisoned")
        .insert("shop/orders".into(), ("orders-0".into(), minute_ago));
    let renewed = member_lease(
        "orders-0",
        0,
        serde_json::json!({ "ready": true, "role": "primary", "timeline": 3 }),
    );
    fake.put(
        &format!("{lease_path}/orders-0"),
        serde_json::to_value(&renewed).expect("serializes"),
    );
    let _ = reconcile(cluster, ctx).await;
    assert!(
        !deposed(&fake),
        "a renewing primary deposed: {:#?}",
        fake.writes()
    );
    assert!(!promoted(&fake), "{:#?}", fake.writes());
}

/// A switchover whose target never caught up (it restarted) is given up at
/// its deadline: recorded first, then the old primary labelled primary
/// again, with an Event; no one deposed, nothing promoted.
#[tokio::test]
async fn a_stalled_switchover_is_given_up_and_the_old_primary_labelled_primary_again() {
    use crate::build::ROLE_LABEL;
    let mut cluster = serving_cluster();
    let started = Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(61);
    cluster.status.as_mut().expect("a status").last_switchover =
        Some(cairn_api::database::v1::SwitchoverRecord {
            from: "orders-0".into(),
            to: "orders-1".into(),
            started_at: Time(started),
            promoted_at: None,
            completed_at: None,
            write_unavailable_seconds: None,
            abandoned: None,
        });
    let (fake, client) = fake_with(&cluster);
    let leases = [
        member_lease(
            "orders-0",
            0,
            serde_json::json!({ "ready": true, "role": "replica", "timeline": 3,
                                "shutdownPosition": "0/3000148" }),
        ),
        member_lease("orders-1", 0, serde_json::json!({ "ready": false })),
    ];
    let mut pods = Vec::new();
    for name in ["orders-0", "orders-1"] {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name, "namespace": "shop", "resourceVersion": "3",
                "labels": { "app.kubernetes.io/instance": "orders", ROLE_LABEL: "replica" },
            },
        }))
        .expect("a pod");
        fake.put(
            &format!("/api/v1/namespaces/shop/pods/{name}"),
            serde_json::to_value(&pod).expect("serializes"),
        );
        pods.push(pod);
    }
    put_leases(&fake, &leases);
    let ctx = context_with(client, &pods, &leases);
    let _ = reconcile(Arc::new(cluster), ctx).await;
    let writes = fake.writes();
    let shown: Vec<String> = writes.iter().map(|w| format!("{w} {}", w.body)).collect();
    let given_up = writes.iter().position(|w| {
        w.is_status_write()
            && w.body["status"]["lastSwitchover"]["abandoned"]
                .as_str()
                .is_some_and(|why| why.contains("orders-0 is the primary again"))
    });
    let relabelled = |pod: &str| {
        writes.iter().position(|w| {
            w.path.ends_with(&format!("/pods/{pod}"))
                && w.body["metadata"]["labels"][ROLE_LABEL] == "primary"
        })
    };
    assert!(given_up.is_some(), "the switchover given up: {shown:#?}");
    assert!(
        relabelled("orders-0") > given_up,
        "recorded, then the old primary labelled primary: {shown:#?}"
    );
    assert_eq!(relabelled("orders-1"), None, "{shown:#?}");
    assert!(
        !writes
            .iter()
            .any(|w| w.path.contains("/leases/") && w.body.to_string().contains(FENCED_ANNOTATION)),
        "no one deposed: {shown:#?}"
    );
    assert!(
        writes
            .iter()
            .any(|w| w.path.contains("/events") && w.body["reason"] == "SwitchoverAbandoned"),
        "an Event says so: {shown:#?}"
    );
}

/// The primary's node cordoned (`kubectl drain`): the primary is switched
/// over to the replica on a node that stays, its demotion recorded first
/// and an Event naming the drain; on an uncordoned node nothing moves.
#[tokio::test]
async fn a_drain_of_the_primarys_node_switches_it_over_first() {
    use crate::build::ROLE_LABEL;
    let leases = [
        member_lease(
            "orders-0",
            0,
            serde_json::json!({ "ready": true, "role": "primary", "timeline": 3 }),
        ),
        member_lease(
            "orders-1",
            0,
            serde_json::json!({ "ready": true, "role": "replica", "timeline": 3,
                                "walPosition": "0/3000148" }),
        ),
    ];
    let pod = |name: &str, node: &str, role: &str| -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name, "namespace": "shop", "resourceVersion": "3",
                "labels": { "app.kubernetes.io/instance": "orders", ROLE_LABEL: role },
            },
            "spec": { "nodeName": node, "containers": [] },
        }))
        .expect("a pod")
    };
    let node = |name: &str, cordoned: bool| -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": name },
            "spec": { "unschedulable": cordoned },
        }))
        .expect("a node")
    };
    let pods = [
        pod("orders-0", "a", "primary"),
        pod("orders-1", "b", "replica"),
    ];
    let (pods, leases) = (&pods, &leases);
    let demoted = |cordoned: bool| async move {
        let cluster = serving_cluster();
        let (fake, client) = fake_with(&cluster);
        for pod in pods {
            fake.put(
                &format!("/api/v1/namespaces/shop/pods/{}", pod.name_any()),
                serde_json::to_value(pod).expect("serializes"),
            );
        }
        put_leases(&fake, leases);
        let nodes = [node("a", cordoned), node("b", false)];
        let ctx = context_on(client, pods, leases, &nodes);
        let _ = reconcile(Arc::new(cluster), ctx).await;
        fake.writes()
    };

    let writes = demoted(true).await;
    let shown: Vec<String> = writes.iter().map(|w| format!("{w} {}", w.body)).collect();
    let started = writes.iter().position(|w| {
        let record = &w.body["status"]["lastSwitchover"];
        w.is_status_write() && record["from"] == "orders-0" && record["to"] == "orders-1"
    });
    let relabelled = writes.iter().position(|w| {
        w.path.ends_with("/pods/orders-0") && w.body["metadata"]["labels"][ROLE_LABEL] == "replica"
    });
    assert!(started.is_some(), "a switchover started: {shown:#?}");
    assert!(
        relabelled > started,
        "recorded, then the primary demoted: {shown:#?}"
    );
    assert!(
        writes.iter().any(|w| w.path.contains("/events")
            && w.body["reason"] == "SwitchoverStarted"
            && w.body["note"]
                .as_str()
                .is_some_and(|n| n.contains("drained"))),
        "an Event names the drain: {shown:#?}"
    );

    let writes = demoted(false).await;
    let shown: Vec<String> = writes.iter().map(|w| format!("{w} {}", w.body)).collect();
    assert!(
        !writes.iter().any(|w| w.path.ends_with("/pods/orders-0")
            || w.body["status"]["lastSwitchover"].is_object()),
        "nothing moves on an uncordoned node: {shown:#?}"
    );
}

/// An instance whose pod has been unready for ten minutes (its node frozen)
/// is named in `Degraded`, and a primary that stopped reporting no longer
/// vouches for `ContinuousArchiving`: the status says what the pods and
/// the instances show now, not what they last said.
#[tokio::test]
async fn the_status_names_a_lost_instance_and_drops_a_stale_archiving_report() {
    use crate::build::ROLE_LABEL;
    let long_ago =
        (Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(600)).to_string();
    let pod = |name: &str, role: &str, ready: bool| -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name, "namespace": "shop", "resourceVersion": "3",
                "creationTimestamp": long_ago,
                "labels": { "app.kubernetes.io/instance": "orders", ROLE_LABEL: role },
            },
            "status": { "conditions": [{
                "type": "Ready", "status": if ready { "True" } else { "False" },
                "lastTransitionTime": long_ago,
            }] },
        }))
        .expect("a pod")
    };
    // The last status written, after one reconcile of a cluster that
    // archived, with the primary silent for `primary_silent` seconds and
    // the replica on `replica_timeline` with its pod ready or not.
    let status_after = |primary_silent: i64, replica_timeline: u32, replica_ready: bool| {
        let pods = [
            pod("orders-0", "primary", true),
            pod("orders-1", "replica", replica_ready),
        ];
        async move {
            let mut cluster = crate::fixtures::archiving(serving_cluster());
            let ran = cluster.status.as_mut().expect("a status");
            ran.phase = Some(cairn_api::database::v1::DatabaseClusterPhase::Running);
            ran.conditions = vec![cairn_runtime::conditions::new(
                "ContinuousArchiving",
                true,
                "WALArchiving",
                "the primary stores every completed WAL file",
                Some(1),
                Time(Timestamp::now()),
            )];
            let (fake, client) = fake_with(&cluster);
            let leases = [
                member_lease(
                    "orders-0",
                    primary_silent,
                    serde_json::json!({ "ready": true, "role": "primary", "timeline": 3 }),
                ),
                member_lease(
                    "orders-1",
                    0,
                    serde_json::json!({ "ready": true, "role": "replica",
                                        "timeline": replica_timeline }),
                ),
            ];
            put_leases(&fake, &leases);
            let ctx = context_with(client, &pods, &leases);
            let _ = reconcile(Arc::new(cluster), ctx).await;
            let writes = fake.writes();
            let shown: Vec<String> = writes.iter().map(|w| format!("{w} {}", w.body)).collect();
            writes
                .iter()
                .rev()
                .find(|w| w.is_status_write() && w.body["status"]["conditions"].is_array())
                .map(|w| w.body["status"].clone())
                .unwrap_or_else(|| panic!("a status written: {shown:#?}"))
        }
    };
    let condition = |status: &serde_json::Value, type_: &str| {
        status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == type_)
            .cloned()
            .unwrap_or_default()
    };

    let lost = status_after(0, 3, false).await;
    let degraded = condition(&lost, "Degraded");
    assert_eq!(degraded["status"], "True", "{lost:#}");
    assert!(
        degraded["message"]
            .as_str()
            .is_some_and(|m| m.contains("orders-1 not ready since")),
        "{lost:#}"
    );

    // The primary silent past the delay, its failover blocked (the replica
    // lags a timeline): archiving is no longer vouched for.
    let silent = status_after(60, 2, true).await;
    let archiving = condition(&silent, "ContinuousArchiving");
    assert_eq!(
        (archiving["status"].as_str(), archiving["reason"].as_str()),
        (Some("False"), Some("PrimaryNotReporting")),
        "{silent:#}"
    );
    let fresh = status_after(0, 3, true).await;
    assert_ne!(
        condition(&fresh, "ContinuousArchiving")["reason"],
        "PrimaryNotReporting",
        "{fresh:#}"
    );
}

/// A failover blocked by `maxLagBytes` stays blocked, and says so, until an
/// operator orders the promotion accepting the loss: then the primary is
/// deposed, the replica promoted, and the record and the Event say it was
/// forced. An order given on an earlier timeline does nothing.
#[tokio::test]
async fn a_blocked_failover_is_forced_only_by_an_order_for_its_timeline() {
    let mut cluster = serving_cluster();
    cluster.spec.failover = Some(
        serde_json::from_value(serde_json::json!({ "delaySeconds": 10, "maxLagBytes": 0 }))
            .expect("a failover spec"),
    );
    let leases = [
        member_lease(
            "orders-0",
            60,
            serde_json::json!({ "ready": true, "role": "primary", "timeline": 3,
                                "walPosition": "0/9000000" }),
        ),
        member_lease(
            "orders-1",
            0,
            serde_json::json!({ "ready": true, "role": "replica", "timeline": 3,
                                "walPosition": "0/5000000", "receivedPosition": "0/5000000" }),
        ),
    ];
    let run = |order: Option<&str>| {
        let mut cluster = cluster.clone();
        if let Some(order) = order {
            cluster.metadata.annotations =
                Some([(FORCED_PROMOTION_ANNOTATION.to_owned(), order.to_owned())].into());
        }
        let leases = leases.clone();
        async move {
            let (fake, client) = fake_with(&cluster);
            put_leases(&fake, &leases);
            let ctx = context_with(client, &[], &leases);
            let _ = reconcile(Arc::new(cluster), ctx).await;
            fake.writes()
        }
    };
    let promoted = |writes: &[Recorded]| {
        writes.iter().find_map(|w| {
            (w.is_status_write() && w.body["status"]["currentPrimary"] == "orders-1")
                .then(|| w.body["status"]["lastFailover"]["reason"].clone())
        })
    };
    let blocked = |writes: &[Recorded]| {
        writes
            .iter()
            .filter(|w| w.is_status_write())
            .flat_map(|w| {
                w.body["status"]["conditions"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .find(|c| c["reason"] == "FailoverBlocked")
            .map(|c| c["message"].as_str().unwrap_or_default().to_owned())
    };

    let writes = run(None).await;
    assert_eq!(promoted(&writes), None, "{writes:#?}");
    let message = blocked(&writes).expect("FailoverBlocked");
    assert!(message.contains("maxLagBytes"), "{message}");

    let writes = run(Some("orders-1@2")).await;
    assert_eq!(promoted(&writes), None, "{writes:#?}");
    let message = blocked(&writes).expect("FailoverBlocked");
    assert!(message.contains("given on timeline 2"), "{message}");

    let writes = run(Some("orders-1@3")).await;
    let reason = promoted(&writes).expect("promoted");
    assert!(
        reason
            .as_str()
            .is_some_and(|r| r.contains("accepting data loss") && r.contains("maxLagBytes")),
        "{reason}"
    );
    assert!(
        writes.iter().any(|w| w.path.ends_with("/leases/orders-0")
            && w.body["metadata"]["annotations"][FENCED_ANNOTATION] == "true"),
        "the lost primary deposed first: {writes:#?}"
    );
    assert!(
        writes
            .iter()
            .any(|w| w.path.contains("/events") && w.body["reason"] == "ForcedFailover"),
        "{writes:#?}"
    );
}
