//! The Helm chart: it renders, the API server accepts every object, and its
//! Deployment's pods are admitted under the `restricted` Pod Security level
//! and become available (kwok runs the containers).

mod support;

use std::time::Duration;

use cairn_testing::{Error, cluster, wait};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

async fn render(namespace: &str, extra: &[&str]) -> Result<std::path::PathBuf, Error> {
    cluster()
        .helm_template(support::CHART, "chart-test", namespace, extra)
        .await
}

#[tokio::test]
async fn the_chart_installs_under_the_restricted_pod_security_level() -> Result<(), Error> {
    let namespace = support::namespace("chart").await?;
    Api::<Namespace>::all(namespace.client.clone())
        .patch(
            &namespace.name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
            } } })),
        )
        .await?;
    // Every optional object on, so the server validates them all.
    let all_on = render(
        &namespace.name,
        &[
            "--set",
            "networkPolicy.enabled=true",
            "--set",
            "watchNamespace=default",
        ],
    )
    .await?;
    cluster()
        .kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--dry-run=server",
            "-f",
            &all_on.to_string_lossy(),
        ])
        .await?;

    // Everything but the CRD: the shared test cluster keeps the CRD the
    // tests install (the chart's serves v1alpha1 through a webhook Service
    // that does not run here).
    let file = render(
        &namespace.name,
        &[
            "--show-only",
            "templates/serviceaccount.yaml",
            "--show-only",
            "templates/rbac.yaml",
            "--show-only",
            "templates/service.yaml",
            "--show-only",
            "templates/poddisruptionbudget.yaml",
            "--show-only",
            "templates/deployment.yaml",
        ],
    )
    .await?;
    cluster()
        .kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &file.to_string_lossy(),
        ])
        .await?;
    let deployments = namespace.api::<Deployment>();
    wait::for_object(
        &deployments,
        "chart-test-cairn-database-controller",
        "2 available replicas",
        Duration::from_secs(60),
        |d| d.status.as_ref().and_then(|s| s.available_replicas) == Some(2),
    )
    .await?;
    Ok(())
}
