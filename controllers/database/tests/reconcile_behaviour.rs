//! What the runtime promises every reconcile, shown through the database
//! controller as a real process with its chart's RBAC: reconcile spans
//! exported over OTLP/HTTP, standard metrics with
//! bounded labels, zero writes when nothing changed (every optional field set,
//! in notations the API server normalises), and an invalid spec
//! reported once and not retried until the spec changes.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use cairn_api::database::v1::DatabaseCluster;
use cairn_testing::process::{ControllerProcess, sample};
use cairn_testing::{Error, wait};
use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Patch, PatchParams};
use serde_json::json;

const RECONCILES: &str = "cairn_reconcile_total{kind=\"DatabaseCluster\",controller=\"database\"}";

async fn reconciles(process: &ControllerProcess) -> Result<f64, Error> {
    Ok(process.metric(RECONCILES).await?.unwrap_or(0.0))
}

/// Every label value of the `cairn_` series in `metrics`.
fn label_values(metrics: &str) -> Vec<String> {
    metrics
        .lines()
        .filter(|line| line.starts_with("cairn_"))
        .filter_map(|line| Some(line.split_once('{')?.1.split_once('}')?.0.to_owned()))
        .flat_map(|labels| {
            labels
                .split("\",")
                .filter_map(|pair| Some(pair.split_once("=\"")?.1.trim_end_matches('"').to_owned()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// A cluster with every optional field set, in the notations most likely to
/// be normalised by the API server: quantities not in canonical form,
/// parameters, scheduling with a toleration, a node selector and affinity.
fn every_optional_field_set(name: &str) -> DatabaseCluster {
    let mut cluster = support::database_cluster(name, 2);
    let spec = serde_json::from_value(json!({
        "instances": 2,
        "postgres": {
            "version": "17",
            "image": "cairn-postgres:17",
            "parameters": {"max_connections": "150", "work_mem": "8MB"}
        },
        "storage": {"size": "1024Mi"},
        "resources": {
            "requests": {"cpu": "0.5", "memory": "1024Mi"},
            "limits": {"cpu": "1000m", "memory": "2048Mi"}
        },
        "scheduling": {
            "nodeSelector": {"type": "kwok"},
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 100,
                "podAffinityTerm": {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": name}}
                }
            }]}}
        },
        "bootstrap": {"initdb": {"database": "payments", "owner": "payments"}},
        "failover": {"delaySeconds": 20, "maxLagBytes": 16777216},
        "replication": {"synchronousReplicas": 1}
    }))
    .expect("a valid spec");
    cluster.spec = spec;
    cluster
}

#[tokio::test]
async fn steady_state_writes_nothing_and_metrics_name_no_object() -> Result<(), Error> {
    let namespace = support::namespace("steady").await?;
    let account = support::install_rbac(&namespace, "steady").await?;
    // Resync every 10 s: the idle window below sees several full reconciles.
    let process = support::start(
        &namespace,
        "steady",
        &account,
        &[("CAIRN_RESYNC_SECONDS", "10")],
    )?;
    let clusters = namespace.api::<DatabaseCluster>();
    support::create(&clusters, &support::database_cluster("inventory", 1)).await?;
    support::create(&clusters, &every_optional_field_set("payments")).await?;
    for name in ["inventory", "payments"] {
        support::until_condition(&clusters, name, "Ready", "True", Duration::from_secs(90)).await?;
    }

    // Let the last status write and its echo settle (two reconciles after
    // both were Ready), then watch idle for more than two resyncs: each
    // cluster is reconciled at least twice, and nothing is written.
    const IDLE: Duration = Duration::from_secs(25);
    let settled = reconciles(&process).await?;
    support::reconciled(&process, settled, 2.0, Duration::from_secs(30)).await?;
    let user = support::user(&namespace, &account);
    let reconciles_before = reconciles(&process).await?;
    let idle_writes = support::writes_within(&user, &namespace.name, IDLE).await?;
    assert_eq!(idle_writes, vec![], "an unchanged cluster costs no write");
    let idle_reconciles = reconciles(&process).await? - reconciles_before;
    println!(
        "idle {} s: {idle_reconciles} reconciles, 0 writes",
        IDLE.as_secs()
    );
    assert!(
        idle_reconciles >= 4.0,
        "both clusters resynced twice: {idle_reconciles}"
    );

    let metrics = process.metrics().await?;
    for series in [
        "cairn_reconcile_total{kind=\"DatabaseCluster\",controller=\"database\"}",
        "cairn_reconcile_duration_seconds_count{kind=\"DatabaseCluster\",controller=\"database\"}",
        "cairn_reconciles_in_flight{kind=\"DatabaseCluster\",controller=\"database\"}",
        "cairn_objects_in_cache{kind=\"DatabaseCluster\",controller=\"database\"}",
        "cairn_objects_in_cache{kind=\"StatefulSet\",controller=\"database\"}",
        "cairn_leader{controller=\"database\"}",
        "cairn_lease_transitions_total{controller=\"database\"}",
    ] {
        assert!(
            sample(&metrics, series).is_some(),
            "missing {series}:\n{metrics}"
        );
    }
    assert_eq!(
        sample(
            &metrics,
            "cairn_objects_in_cache{kind=\"DatabaseCluster\",controller=\"database\"}"
        ),
        Some(2.0)
    );
    assert!(
        metrics.contains("cairn_build_info{git_commit="),
        "{metrics}"
    );
    assert!(
        metrics.contains("\nprocess_resident_memory_bytes{controller=\"database\"}"),
        "{metrics}"
    );
    for value in label_values(&metrics) {
        assert!(
            !["inventory", "payments", namespace.name.as_str()].contains(&value.as_str()),
            "a label holds an object name: {value}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn an_invalid_spec_is_reported_and_waits_for_a_change() -> Result<(), Error> {
    let namespace = support::namespace("invalid").await?;
    let account = support::install_rbac(&namespace, "invalid").await?;
    // Short resync and backoff: a wrongly retried error would show at once.
    let process = support::start(
        &namespace,
        "invalid",
        &account,
        &[
            ("CAIRN_RESYNC_SECONDS", "10"),
            ("CAIRN_BACKOFF_INITIAL_SECONDS", "1"),
        ],
    )?;
    let clusters = namespace.api::<DatabaseCluster>();
    let mut cluster = support::database_cluster("greedy", 1);
    // Requests above limits: the schema cannot compare quantities.
    cluster.spec.resources = Some(ResourceRequirements {
        requests: Some(BTreeMap::from([("cpu".to_owned(), Quantity("2".into()))])),
        limits: Some(BTreeMap::from([("cpu".to_owned(), Quantity("1".into()))])),
        ..ResourceRequirements::default()
    });
    support::create(&clusters, &cluster).await?;
    let reported = support::until_condition(
        &clusters,
        "greedy",
        "Ready",
        "False",
        Duration::from_secs(30),
    )
    .await?;
    let ready = reported
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .cloned()
        .expect("Ready is set");
    assert_eq!(ready.reason, "InvalidSpec");
    assert!(
        ready.message.contains("exceeds its limit"),
        "{}",
        ready.message
    );

    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = reconciles(&process).await?;
    // Watched for 30 s, ending at the first retry.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut retried = 0.0;
    while retried == 0.0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        retried = reconciles(&process).await? - before;
    }
    println!("reconciles of an invalid cluster in 30 s: {retried}");
    assert_eq!(retried, 0.0, "an invalid spec is not retried");
    let errors = process
        .metric("cairn_reconcile_errors_total{kind=\"DatabaseCluster\",reason=\"invalid_spec\",controller=\"database\"}")
        .await?;
    assert!(errors.is_some_and(|n| n >= 1.0), "{errors:?}");

    // Fixing the spec wakes it up.
    clusters
        .patch(
            "greedy",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "resources": null } })),
        )
        .await?;
    support::until_condition(
        &clusters,
        "greedy",
        "Ready",
        "True",
        Duration::from_secs(60),
    )
    .await?;
    Ok(())
}

/// A stand-in OTLP/HTTP collector: its endpoint and every body it received.
async fn collector() -> Result<(String, Arc<Mutex<Vec<Bytes>>>), Error> {
    let received: Arc<Mutex<Vec<Bytes>>> = Arc::default();
    let sink = received.clone();
    let router = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: Bytes| {
            let sink = sink.clone();
            async move {
                sink.lock().unwrap_or_else(|p| p.into_inner()).push(body);
                ""
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| Error::Setup(e.to_string()))?;
    let address = listener
        .local_addr()
        .map_err(|e| Error::Setup(e.to_string()))?;
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok((format!("http://{address}"), received))
}

#[tokio::test]
async fn a_running_controller_exports_its_reconcile_spans() -> Result<(), Error> {
    let (endpoint, received) = collector().await?;
    let namespace = support::namespace("traces").await?;
    let account = support::install_rbac(&namespace, "traces").await?;
    let _process = support::start(
        &namespace,
        "traces",
        &account,
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())],
    )?;
    let clusters = namespace.api::<DatabaseCluster>();
    support::create(&clusters, &support::database_cluster("traced", 1)).await?;
    // The batch exporter sends every few seconds while the process runs.
    wait::until(
        "a reconcile span of the cluster at the collector",
        Duration::from_secs(60),
        || async {
            let bodies = received.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let found = bodies.iter().any(|body| {
                let contains = |needle: &[u8]| body.windows(needle.len()).any(|w| w == needle);
                contains(b"reconcile")
                    && contains(b"traced")
                    && contains(b"cairn-database-controller")
            });
            Ok(found.then_some(()))
        },
    )
    .await
}
