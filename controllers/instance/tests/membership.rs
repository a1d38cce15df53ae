//! Membership through the API server, under the Role the database controller
//! builds for a cluster's instances: the instance learns its role from its pod
//! (which it may not write), renews its Lease with what it observes, stops
//! taking writes when relabelled, when its heartbeat cannot be renewed, or
//! when cairn-instance itself is frozen, and never runs initdb without the
//! controller's bootstrap annotation.

mod support;

use std::time::Duration;

use cairn_api::database::instance::{ObservedState, ROLE_LABEL};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::{Fixture, Result};

#[tokio::test]
async fn an_instance_follows_its_pod_renews_its_lease_and_fences_itself() -> Result {
    let cluster = cairn_testing::cluster();
    let ns = cluster.namespace("instance-membership").await?;
    let pods: Api<Pod> = ns.api();
    let binding = support::membership_objects(&ns).await?;
    support::instance_pods(
        &pods,
        &[
            ("orders-0", "primary", true),
            ("orders-1", "primary", false),
        ],
    )
    .await?;
    let post = PostParams::default();

    let mut fixture = Fixture::new("membership", &[])?;
    let kubeconfig = fixture.service_account_kubeconfig(&ns)?;
    let in_pod = |name: &str| -> Result<_> {
        Ok(fixture
            .in_pod(name, &ns, &kubeconfig)?
            .env("CAIRN_HEARTBEAT_MILLISECONDS", "500")
            .env("CAIRN_FENCE_SECONDS", "3"))
    };

    // A new cluster's primary (bootstrap annotation): initialised, serving,
    // its Lease renewed with what it observes.
    let primary = fixture.start(&in_pod("orders-0")?)?;
    primary.wait_ready(Duration::from_secs(60)).await?;
    let lease_api: Api<Lease> = ns.api();
    let observed = support::until_observed(&lease_api, "orders-0", |o| o.ready).await?;
    assert_eq!(observed.role.as_deref(), Some("primary"));
    assert_eq!(observed.timeline, Some(1));
    assert!(observed.server_version.is_some_and(|v| v.starts_with("15")));
    let lease = lease_api.get("orders-0").await?;
    let spec = lease.spec.unwrap_or_default();
    assert_eq!(spec.holder_identity.as_deref(), Some("orders-0"));
    assert!(spec.renew_time.is_some());

    // No pod can be written by the instances' account, not even its own.
    let as_instance = ns.client_as_service_account("orders").await?;
    let relabel = json!({ "metadata": { "labels": { ROLE_LABEL: "primary" } } });
    for pod in ["orders-0", "orders-1"] {
        let denied = Api::<Pod>::namespaced(as_instance.clone(), &ns.name)
            .patch(pod, &PatchParams::default(), &Patch::Merge(&relabel))
            .await;
        assert!(
            matches!(&denied, Err(kube::Error::Api(status)) if status.code == 403),
            "{pod}: {denied:?}"
        );
    }

    // Relabelled replica: the primary stops taking writes within about a
    // second of the label (it watches its pod; no kubelet in between).
    set_role(&pods, "orders-0", "replica").await?;
    let took = primary
        .wait_status("not a writable primary", Duration::from_secs(10), |s| {
            !writable(s)
        })
        .await?;
    println!("relabelled replica → no longer writable: {took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    set_role(&pods, "orders-0", "primary").await?;
    primary
        .wait_status("writable again", Duration::from_secs(60), writable)
        .await?;

    // Fencing: the heartbeat cannot be renewed (its RoleBinding is gone), so
    // within the fence time (3 s) plus the stop (2 s) it takes no writes.
    ns.api::<RoleBinding>()
        .delete("orders", &DeleteParams::default())
        .await?;
    let took = primary
        .wait_status("fenced", Duration::from_secs(20), |s| !writable(s))
        .await?;
    println!("heartbeat refused → no longer writable: {took:?}");
    assert!(took < Duration::from_secs(3 + 2 + 2), "{took:?}");
    let status = primary.status().await?;
    assert!(status.to_string().contains("fenced"), "says why: {status}");
    ns.api::<RoleBinding>().create(&post, &binding).await?;
    primary
        .wait_status(
            "writable after the heartbeat returns",
            Duration::from_secs(60),
            writable,
        )
        .await?;

    // cairn-instance frozen (SIGSTOP): its fence's thread stops with it,
    // and its watchdog, a process of its own, stops postgres once the
    // allowance it was last told runs out (the fence time, 3 s, plus 0.5 s).
    primary.signal(nix::sys::signal::Signal::SIGSTOP)?;
    let frozen = std::time::Instant::now();
    let stopped = loop {
        if primary.sql().await.is_err() {
            break frozen.elapsed();
        }
        if frozen.elapsed() > Duration::from_secs(20) {
            break frozen.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    primary.signal(nix::sys::signal::Signal::SIGCONT)?;
    println!("cairn-instance frozen → postgres takes no connection: {stopped:?}");
    assert!(stopped < Duration::from_secs(3 + 1 + 2), "{stopped:?}");
    primary
        .wait_status(
            "writable once cairn-instance runs again",
            Duration::from_secs(60),
            writable,
        )
        .await?;

    // An initialised cluster's primary with an empty folder (no bootstrap
    // annotation) refuses initdb, and says why.
    let second = fixture.start(&in_pod("orders-1")?)?;
    second
        .wait_status("initdb refused", Duration::from_secs(30), |s| {
            s.to_string().contains("refusing to run initdb")
        })
        .await?;
    assert!(!second.spec.data_dir().join("PG_VERSION").exists());
    refused_is_reported(&lease_api).await?;
    drop(second);
    drop(primary);
    fixture.passed()
}

fn writable(status: &Value) -> bool {
    status["role"] == "primary" && status["ready"] == true
}

async fn set_role(pods: &Api<Pod>, name: &str, role: &str) -> Result {
    let patch = json!({ "metadata": { "labels": { ROLE_LABEL: role } } });
    pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

async fn refused_is_reported(leases: &Api<Lease>) -> Result {
    let refused = |o: &ObservedState| {
        o.problem
            .as_deref()
            .is_some_and(|p| p.contains("refusing to run initdb"))
    };
    let observed = support::until_observed(leases, "orders-1", refused).await?;
    assert!(!observed.ready);
    Ok(())
}
