//! Applying unchanged desired state makes zero write requests, counted in the
//! API server's audit log for a user of its own.

use std::time::Duration;

use cairn_runtime::apply::{Outcome, apply};
use cairn_testing::{audit, cluster, wait};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use serde_json::json;

type Result = std::result::Result<(), Box<dyn std::error::Error>>;

fn from_json<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).expect("valid manifest")
}

#[tokio::test]
async fn unchanged_state_is_not_written_again() -> Result {
    let ns = cluster().namespace("apply").await?;
    ns.create_service_account("controller").await?;
    ns.grant("controller", "configmaps", &["get", "patch", "create"])
        .await?;
    let api =
        Api::<ConfigMap>::namespaced(ns.client_as_service_account("controller").await?, &ns.name);

    let desired: ConfigMap = from_json(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "settings", "labels": {"app.kubernetes.io/managed-by": "cairn"}},
        "data": {"max_connections": "200"}
    }));
    let (created, outcome) = wait::until("the first apply", Duration::from_secs(10), || async {
        apply(&api, "cairn-test", &desired, None)
            .await
            .map(Some)
            .map_err(|e| e.to_string())
    })
    .await?;
    assert_eq!(outcome, Outcome::Applied);
    let mut current = created;
    for _ in 0..10 {
        let (seen, outcome) = apply(&api, "cairn-test", &desired, Some(&current)).await?;
        assert_eq!(outcome, Outcome::Unchanged);
        current = seen;
    }
    let mut changed = desired.clone();
    changed
        .data
        .get_or_insert_default()
        .insert("max_connections".into(), "300".into());
    let (_, outcome) = apply(&api, "cairn-test", &changed, Some(&current)).await?;
    assert_eq!(outcome, Outcome::Applied);

    // Exactly two writes: the first apply and the change.
    let user = format!("system:serviceaccount:{}:controller", ns.name);
    let log = cluster().audit_log();
    let writes = wait::until(
        "both writes in the audit log",
        Duration::from_secs(10),
        || async {
            let writes: Vec<_> = audit::write_requests(&log)
                .map_err(|e| e.to_string())?
                .into_iter()
                .filter(|w| w.user == user && w.code.is_some_and(|c| c < 300))
                .collect();
            match writes.len() {
                2 => Ok(Some(writes)),
                n => Err(format!("{n} successful writes by {user}")),
            }
        },
    )
    .await?;
    assert!(
        writes
            .iter()
            .all(|w| w.verb == "patch" && w.resource == "configmaps"),
        "{writes:?}"
    );
    // No third write shows up later either.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let later = audit::write_requests(&log)?
        .into_iter()
        .filter(|w| w.user == user && w.code.is_some_and(|c| c < 300))
        .count();
    assert_eq!(later, 2);
    Ok(())
}
