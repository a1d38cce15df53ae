//! The reconcile of one Backup: dereference from the caches, decide
//! (`plan`), write the status the decision gives, say when to look again.

use std::sync::Arc;

use cairn_api::backup::v1::{Backup, BackupPhase};
use cairn_api::database::instance::{CLUSTER_LABEL, OBSERVED_ANNOTATION, ObservedState};
use cairn_api::database::v1::DatabaseCluster;
use cairn_runtime::manager::Recheck;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use crate::MANAGER;
use crate::error::Error;
use crate::metrics::BackupMetrics;
use crate::plan::{self, Decision, Instance, World};

/// What the reconcile reads: the controller's caches.
#[derive(Clone)]
pub struct Caches {
    pub backups: Store<Backup>,
    pub clusters: Store<DatabaseCluster>,
    /// The database instances' pods and membership Leases.
    pub pods: Store<Pod>,
    pub leases: Store<Lease>,
}

pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub caches: Caches,
    pub metrics: BackupMetrics,
}

impl Context {
    /// Every `period`, the phase gauge from the cache.
    pub async fn housekeeping(context: Arc<Self>, period: std::time::Duration) {
        let mut every = tokio::time::interval(period);
        loop {
            every.tick().await;
            context.metrics.refresh(&context.caches.backups.state());
        }
    }

    /// The Backup's cluster, its instances and its other running Backups,
    /// as the caches show them now.
    fn world(&self, backup: &Backup, now: Timestamp) -> World {
        let namespace = backup.namespace().unwrap_or_default();
        let cluster_name = &backup.spec.cluster.name;
        let cluster = self
            .caches
            .clusters
            .get(&ObjectRef::new(cluster_name).within(&namespace));
        let instances = self
            .caches
            .pods
            .state()
            .iter()
            .filter(|p| p.namespace().as_deref() == Some(namespace.as_str()))
            .filter(|p| p.labels().get(CLUSTER_LABEL) == Some(cluster_name))
            .map(|pod| self.instance(pod, &namespace))
            .collect();
        let running = self
            .caches
            .backups
            .state()
            .iter()
            .filter(|b| {
                b.namespace().as_deref() == Some(namespace.as_str())
                    && &b.spec.cluster.name == cluster_name
                    && b.uid() != backup.uid()
                    && ahead_of(b, backup)
            })
            .map(|b| b.name_any())
            .collect();
        World {
            cluster,
            instances,
            running,
            now,
        }
    }

    fn instance(&self, pod: &Pod, namespace: &str) -> Instance {
        let lease = self
            .caches
            .leases
            .get(&ObjectRef::new(&pod.name_any()).within(namespace));
        let observed = lease.as_ref().and_then(|l| {
            l.annotations()
                .get(OBSERVED_ANNOTATION)
                .and_then(|text| serde_json::from_str::<ObservedState>(text).ok())
        });
        let renewed = lease
            .as_ref()
            .and_then(|l| l.spec.as_ref()?.renew_time.as_ref())
            .map(|t| t.0);
        Instance {
            pod: pod.name_any(),
            uid: pod.uid().unwrap_or_default(),
            observed,
            renewed,
        }
    }
}

/// Whether `other`, a Backup of the same cluster, goes before `backup`:
/// it runs, or it waits and is older (creation, then name). Backups are
/// handed out oldest first, so two reconciles running at once, each reading
/// a cache without the other's assignment, never both assign.
fn ahead_of(other: &Backup, backup: &Backup) -> bool {
    let key = |b: &Backup| {
        (
            b.metadata.creation_timestamp.clone().map(|t| t.0),
            b.name_any(),
        )
    };
    match other.status.as_ref().and_then(|s| s.phase) {
        Some(BackupPhase::Running) => true,
        Some(BackupPhase::Completed | BackupPhase::Failed) => false,
        _ => {
            backup.status.as_ref().and_then(|s| s.phase) != Some(BackupPhase::Running)
                && key(other) < key(backup)
        }
    }
}

pub async fn reconcile(backup: Arc<Backup>, ctx: Arc<Context>) -> Result<Recheck, Error> {
    let now = Timestamp::now();
    let decision = plan::decide(&backup, &ctx.world(&backup, now));
    if let Some(status) = plan::status(&backup, &decision, now) {
        let api: Api<Backup> =
            Api::namespaced(ctx.client.clone(), &backup.namespace().unwrap_or_default());
        let patch = json!({
            "apiVersion": "backup.cairn.dev/v1",
            "kind": "Backup",
            "status": status,
        });
        api.patch_status(
            &backup.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
        ctx.metrics.finished(&decision);
        announce(&ctx.recorder, &backup, &decision).await;
    }
    Ok(match plan::recheck(&backup, &decision, now) {
        Some(within) => Recheck::Within(within),
        None => Recheck::AfterResync,
    })
}

/// An Event when a Backup starts, completes or fails.
async fn announce(recorder: &Recorder, backup: &Backup, decision: &Decision) {
    let (type_, reason, note) = match decision {
        Decision::Assign { pod, .. } => (
            EventType::Normal,
            "Started".to_owned(),
            format!("instance {pod} is taking the backup"),
        ),
        Decision::Completed(report) => (
            EventType::Normal,
            "Completed".to_owned(),
            format!(
                "stored {} bytes at {}",
                report.stored_bytes,
                report.location.as_deref().unwrap_or("?")
            ),
        ),
        Decision::Failed { reason, message } => {
            (EventType::Warning, (*reason).to_owned(), message.clone())
        }
        _ => return,
    };
    publish(recorder, &backup.object_ref(&()), type_, &reason, note).await;
}

/// Publishes an Event on `object` (a failure to is logged, never fatal).
pub async fn publish(
    recorder: &Recorder,
    object: &ObjectReference,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: "Backup".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, object).await {
        tracing::warn!(error = %e, "cannot publish an Event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn backup(name: &str, created: &str, phase: Option<&str>) -> Backup {
        serde_json::from_value(json!({
            "apiVersion": "backup.cairn.dev/v1", "kind": "Backup",
            "metadata": { "name": name, "creationTimestamp": created },
            "spec": { "cluster": { "name": "orders" }, "method": "physical" },
            "status": phase.map(|p| json!({ "phase": p })).unwrap_or(json!({})),
        }))
        .expect("backup")
    }

    #[test]
    fn backups_of_a_cluster_are_handed_out_oldest_first() {
        let hourly = backup("hourly", "2026-11-26T00:00:00Z", None);
        let daily = backup("daily", "2026-11-26T00:00:00Z", None);
        let later = backup("later", "2026-11-26T00:00:05Z", Some("Pending"));
        // Same second: by name; the other one waits.
        assert!(ahead_of(&daily, &hourly) && !ahead_of(&hourly, &daily));
        assert!(ahead_of(&hourly, &later) && !ahead_of(&later, &hourly));
        let running = backup("later", "2026-11-26T00:00:05Z", Some("Running"));
        assert!(ahead_of(&running, &hourly), "a running one goes first");
        let done = backup("old", "2026-11-25T00:00:00Z", Some("Completed"));
        assert!(!ahead_of(&done, &hourly));
    }
}
