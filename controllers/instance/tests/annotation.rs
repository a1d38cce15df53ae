//! The observed state reaches the instance's pod through the API server,
//! under the Role the database controller builds for a cluster's instances.

mod support;

use std::time::{Duration, Instant};

use cairn_api::database::instance::{OBSERVED_ANNOTATION, ObservedState};
use cairn_database_controller::build;
use cairn_testing::audit;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Resource};
use support::{Fixture, Result};

#[tokio::test]
async fn the_observed_state_is_written_on_the_pod_only_when_it_changes() -> Result {
    let cluster = cairn_testing::cluster();
    let ns = cluster.namespace("instance-report").await?;
    // The controller's ServiceAccount, Role and RoleBinding for cluster
    // `orders`, moved into the test namespace without their owner (there is
    // no DatabaseCluster here for the garbage collector to find).
    let database = support::cluster(&[])?;
    let post = PostParams::default();
    let mut account = build::service_account(&database);
    let mut role = build::instance_role(&database);
    let mut binding = build::instance_role_binding(&database);
    for meta in [account.meta_mut(), role.meta_mut(), binding.meta_mut()] {
        meta.namespace = Some(ns.name.clone());
        meta.owner_references = None;
    }
    for subject in binding.subjects.iter_mut().flatten() {
        subject.namespace = Some(ns.name.clone());
    }
    ns.api::<ServiceAccount>().create(&post, &account).await?;
    ns.api::<Role>().create(&post, &role).await?;
    ns.api::<RoleBinding>().create(&post, &binding).await?;
    let pods: Api<Pod> = ns.api();
    for name in ["orders-0", "intruder"] {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name },
            "spec": { "containers": [{ "name": "postgres", "image": "postgres:15" }] },
        }))?;
        pods.create(&post, &pod).await?;
    }

    let mut fixture = Fixture::new("report", &[])?;
    let kubeconfig = fixture.root.join("kubeconfig");
    std::fs::copy(
        cluster.service_account_kubeconfig(&ns.name, "orders")?,
        &kubeconfig,
    )?;
    fixture.own(&kubeconfig)?;
    let spec = fixture
        .instance("orders-0", "primary")?
        .env("KUBECONFIG", &kubeconfig.display().to_string())
        .env("POD_NAMESPACE", &ns.name)
        .env("CAIRN_REPORT_INTERVAL_SECONDS", "5");
    let primary = fixture.start(&spec)?;
    primary.wait_ready(Duration::from_secs(60)).await?;

    let start = Instant::now();
    let observed = loop {
        if let Some(state) = observed_state(&pods, "orders-0").await?
            && state.ready
        {
            break state;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no ready state on the pod"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(observed.role.as_deref(), Some("primary"));
    assert_eq!(observed.timeline, Some(1));
    assert!(observed.wal_position.is_some());

    // The account may patch its cluster's pods, no other.
    let as_instance = ns.client_as_service_account("orders").await?;
    let patch = serde_json::json!({ "metadata": { "annotations": { "x": "y" } } });
    let denied = Api::<Pod>::namespaced(as_instance, &ns.name)
        .patch("intruder", &PatchParams::default(), &Patch::Merge(&patch))
        .await;
    assert!(
        matches!(&denied, Err(kube::Error::Api(status)) if status.code == 403),
        "{denied:?}"
    );

    // Idle: no writes. The window starts once the WAL position has stood
    // still for 30 s: after activity the background writer logs one standby
    // snapshot, at most every 15 s and up to 10 s late when it hibernates,
    // which moves the position (a change, rightly reported).
    let session = primary.sql().await?;
    let wal_position = || async {
        let row = session
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await?;
        Result::<String>::Ok(row.get(0))
    };
    let (mut position, mut since) = (wal_position().await?, Instant::now());
    while since.elapsed() < Duration::from_secs(30) {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the WAL never settles"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = wal_position().await?;
        if now != position {
            (position, since) = (now, Instant::now());
        }
    }
    let user = format!("system:serviceaccount:{}:orders", ns.name);
    let count = || -> Result<usize> {
        Ok(audit::write_requests(&cluster.audit_log())?
            .iter()
            .filter(|w| w.user == user && w.verb == "patch")
            .count())
    };
    let before = count()?;
    tokio::time::sleep(Duration::from_secs(15)).await;
    let idle_writes = count()? - before;
    println!("annotation writes: {before} until idle, {idle_writes} in 15 idle seconds");
    assert_eq!(wal_position().await?, position, "the WAL moved: not idle");
    assert_eq!(idle_writes, 0);

    // A change of readiness is written at once: the primary's server stops.
    let mut primary = primary;
    primary.terminate(Duration::from_secs(60)).await?;
    let last = observed_state(&pods, "orders-0")
        .await?
        .ok_or("no observed state on the pod")?;
    assert!(
        !last.ready,
        "the last report before exit says not ready: {last:?}"
    );
    fixture.passed()
}

/// The state the instance reported on its pod, if any.
async fn observed_state(pods: &Api<Pod>, name: &str) -> Result<Option<ObservedState>> {
    let pod = pods.get(name).await?;
    let text = pod
        .metadata
        .annotations
        .unwrap_or_default()
        .remove(OBSERVED_ANNOTATION);
    Ok(text.map(|t| serde_json::from_str(&t)).transpose()?)
}
