//! No address the cluster hands out leads off this machine: this machine's
//! default route goes to an outside network, so a kwok pod's address, a real
//! pod's and a ClusterIP must be routed locally or blackholed
//! (`hack/nodes.sh`), never sent to the default gateway.

use std::time::Duration;

use cairn_testing::{Error, TestNamespace, cluster, wait};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::PostParams;
use serde_json::json;

type Result<T = ()> = std::result::Result<T, Error>;

/// The real nodes' smallest image (hack/images.sh node), never pulled.
const BUSYBOX: &str = "cairn.local/busybox:1";

#[tokio::test]
async fn cluster_addresses_never_route_to_the_default_gateway() -> Result {
    let gateway = ip(&["route", "show", "default"]).map_err(Error::Setup)?;
    let gateway = gateway
        .split_whitespace()
        .skip_while(|word| *word != "via")
        .nth(1)
        .map(str::to_owned);

    let kwok = cluster().namespace("route-kwok").await?;
    let real = cluster().namespace_on_real_nodes("route-real").await?;
    let kwok_pod = pod_ip(&kwok).await?;
    let real_pod = pod_ip(&real).await?;
    let service = cluster_ip(&real).await?;

    for (what, address) in [
        ("kwok pod", kwok_pod),
        ("real pod", real_pod),
        ("ClusterIP", service),
    ] {
        let route = ip(&["route", "get", &address]);
        eprintln!("{what} {address}: {route:?}");
        if let (Ok(route), Some(gateway)) = (&route, &gateway) {
            assert!(
                !route.contains(&format!("via {gateway}")),
                "{what} {address} is routed to the default gateway: {route}"
            );
        }
        match what {
            // Nothing runs behind a kwok pod's address: a blackhole.
            "kwok pod" => assert!(route.is_err(), "{address} is routed: {route:?}"),
            "real pod" => assert!(
                route.as_ref().is_ok_and(|r| r.contains("dev cairn-br")),
                "{address} is not on a node bridge: {route:?}"
            ),
            _ => assert!(
                route.as_ref().is_ok_and(|r| r.contains("dev cairn0")),
                "{address} is not on the host bridge: {route:?}"
            ),
        }
    }
    Ok(())
}

fn ip(args: &[&str]) -> std::result::Result<String, String> {
    let output = std::process::Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    match output.status.success() {
        true => Ok(String::from_utf8_lossy(&output.stdout).into_owned()),
        false => Err(String::from_utf8_lossy(&output.stderr).trim().to_owned()),
    }
}

async fn pod_ip(ns: &TestNamespace) -> Result<String> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": "sleeper" },
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "sleep", "image": BUSYBOX, "imagePullPolicy": "Never",
                "command": ["sleep", "3600"]
            }]
        }
    }))
    .map_err(|e| Error::Setup(e.to_string()))?;
    let pods = ns.api::<Pod>();
    pods.create(&PostParams::default(), &pod).await?;
    let pod = wait::for_object(
        &pods,
        "sleeper",
        "Running with an address",
        Duration::from_secs(60),
        |p| {
            p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        },
    )
    .await?;
    Ok(pod.status.and_then(|s| s.pod_ip).unwrap_or_default())
}

async fn cluster_ip(ns: &TestNamespace) -> Result<String> {
    let service: Service = serde_json::from_value(json!({
        "metadata": { "name": "sleeper" },
        "spec": { "selector": { "app": "none" }, "ports": [{ "port": 80 }] }
    }))
    .map_err(|e| Error::Setup(e.to_string()))?;
    let service = ns
        .api::<Service>()
        .create(&PostParams::default(), &service)
        .await?;
    Ok(service.spec.and_then(|s| s.cluster_ip).unwrap_or_default())
}
