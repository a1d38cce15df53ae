//! The observed state, written into the pod's annotation for the controller.

use std::time::{Duration, Instant};

use cairn_api::database::instance::{OBSERVED_ANNOTATION, ObservedState};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use tokio::sync::watch;

/// Patches the annotation whenever the observed state changes: at once when
/// readiness, role or timeline change; at most once per `interval` when only
/// the WAL position moves (it moves with every write on a primary). Returns
/// once `done` is true and the last state is written (or cannot be).
pub async fn report(
    pods: Api<Pod>,
    name: String,
    mut observed: watch::Receiver<ObservedState>,
    mut done: watch::Receiver<bool>,
    interval: Duration,
) {
    let mut written: Option<ObservedState> = None;
    let mut written_at = Instant::now();
    let mut failures = 0;
    loop {
        let current = observed.borrow_and_update().clone();
        let finishing = *done.borrow_and_update();
        if written.as_ref() != Some(&current) {
            let urgent = finishing
                || written.as_ref().is_none_or(|w| {
                    w.ready != current.ready
                        || w.role != current.role
                        || w.timeline != current.timeline
                });
            let wait = interval.saturating_sub(written_at.elapsed());
            if !urgent && !wait.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = observed.changed() => {}
                    _ = done.changed() => {}
                }
                continue;
            }
            match patch(&pods, &name, &current).await {
                Ok(()) => {
                    written = Some(current);
                    written_at = Instant::now();
                    failures = 0;
                }
                Err(e) if !finishing => {
                    tracing::warn!(error = %e, pod = %name, "cannot report the observed state");
                    failures += 1;
                    // 1 s, 2 s, 4 s ... 30 s between attempts.
                    let delay =
                        Duration::from_secs(1 << failures.min(5)).min(Duration::from_secs(30));
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = done.changed() => {}
                    }
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, pod = %name, "cannot report the final observed state");
                    return;
                }
            }
        }
        if finishing {
            return;
        }
        tokio::select! {
            changed = observed.changed() => if changed.is_err() { return },
            _ = done.changed() => {}
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
