//! The observed state, written into the pod's annotation for the controller.

use std::time::{Duration, Instant};

use cairn_api::database::instance::{OBSERVED_ANNOTATION, ObservedState};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use tokio::sync::watch;

/// Patches the annotation whenever the observed state changes: at once when
/// readiness, role or timeline change; at most once per `interval` when only
/// the WAL position moves (it moves with every write on a primary).
pub async fn report(
    pods: Api<Pod>,
    name: String,
    mut observed: watch::Receiver<ObservedState>,
    interval: Duration,
) {
    let mut written: Option<ObservedState> = None;
    let mut written_at = Instant::now();
    loop {
        let current = observed.borrow_and_update().clone();
        if written.as_ref() != Some(&current) {
            let urgent = written.as_ref().is_none_or(|w| {
                w.ready != current.ready || w.role != current.role || w.timeline != current.timeline
            });
            let wait = interval.saturating_sub(written_at.elapsed());
            if !urgent && !wait.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    changed = observed.changed() => if changed.is_err() { return },
                }
                continue;
            }
            match patch(&pods, &name, &current).await {
                Ok(()) => {
                    written = Some(current);
                    written_at = Instant::now();
                }
                Err(e) => {
                    tracing::warn!(error = %e, pod = %name, "cannot report the observed state");
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    continue;
                }
            }
        }
        if observed.changed().await.is_err() {
            return;
        }
    }
}

async fn patch(pods: &Api<Pod>, name: &str, state: &ObservedState) -> Result<(), kube::Error> {
    let value = serde_json::to_string(state).unwrap_or_default();
    let patch =
        serde_json::json!({ "metadata": { "annotations": { OBSERVED_ANNOTATION: value } } });
    pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    tracing::debug!(pod = %name, observed = %value, "reported the observed state");
    Ok(())
}
