//! The reconcile of one Backup: dereference from the caches, decide
//! (`plan`), write the status the decision gives, say when to look again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cairn_api::backup::v1::{
    ARTIFACT_FINALIZER, Backup, BackupDeletionPolicy, BackupMethod, BackupPhase,
};
use cairn_api::database::instance::{CLUSTER_LABEL, OBSERVED_ANNOTATION, ObservedState};
use cairn_api::database::v1::{DatabaseCluster, DatabaseClusterPhase};
use cairn_runtime::admin::{Health, Sight};
use cairn_runtime::apply;
use cairn_runtime::events::publish;
use cairn_runtime::finalizers;
use cairn_runtime::heartbeat::Heartbeat;
use cairn_runtime::manager::Recheck;
use cairn_storage::StorageError;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};

use crate::MANAGER;
use crate::artifact::{self, Cleanup, Holds};
use crate::error::Error;
use crate::metrics::BackupMetrics;
use crate::plan::{self, Decision, Instance, World};
use crate::verify::{self, Step};

/// What the reconcile reads: the controller's caches.
#[derive(Clone)]
pub struct Caches {
    pub backups: Store<Backup>,
    pub schedules: Store<cairn_api::backup::v1::BackupSchedule>,
    pub clusters: Store<DatabaseCluster>,
    /// The database instances' pods and membership Leases.
    pub pods: Store<Pod>,
    /// The pods verifying backups (`verify.rs`).
    pub verification_pods: Store<Pod>,
    pub leases: Store<Lease>,
}

pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub caches: Caches,
    pub metrics: BackupMetrics,
    /// Every status write, remembered against a lagging cache.
    pub applier: cairn_runtime::apply::Applier,
    /// The caches' watches, to know when the Lease cache can have missed
    /// renewals (None: never broken, as in tests).
    pub health: Option<Health>,
    /// Each instance's heartbeat as this process saw it (`namespace/pod`).
    pub heartbeats: Mutex<HashMap<String, Heartbeat>>,
}

impl Context {
    /// The gauges refreshed from the caches (every few seconds).
    pub fn housekeeping(&self) {
        let backups = self.caches.backups.state();
        self.metrics.refresh(&backups);
        self.metrics
            .refresh_schedules(&self.caches.schedules.state(), &backups);
        self.forget_missing_pods();
    }

    /// Drops the heartbeats of pods that are gone, so memory stays bounded
    /// however many instances come and go.
    fn forget_missing_pods(&self) {
        let pods = &self.caches.pods;
        self.heartbeats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|key, _| {
                key.split_once('/').is_some_and(|(namespace, pod)| {
                    pods.get(&ObjectRef::new(pod).within(namespace)).is_some()
                })
            });
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
                    && b.metadata.deletion_timestamp.is_none()
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

    /// What holds a deleted Backup's files back besides its instance: its
    /// schedule gone or going, new clusters restoring from its cluster's
    /// folder (not yet initialised, not failed).
    fn holds(&self, backup: &Backup) -> Holds {
        let namespace = backup.namespace();
        let schedule_gone = backup.owner_references().iter().any(|owner| {
            owner.kind == "BackupSchedule"
                && self
                    .caches
                    .schedules
                    .get(&ObjectRef::new(&owner.name).within(namespace.as_deref().unwrap_or("")))
                    .is_none_or(|s| {
                        s.metadata.deletion_timestamp.is_some()
                            || s.uid() != Some(owner.uid.clone())
                    })
        });
        let restoring = self
            .caches
            .clusters
            .state()
            .iter()
            .filter(|c| c.namespace() == namespace)
            .filter(|c| {
                c.status.as_ref().is_some_and(|s| {
                    !s.initialized
                        && s.phase != Some(DatabaseClusterPhase::Failed)
                        && s.restored_from
                            .as_ref()
                            .is_some_and(|from| from.cluster == backup.spec.cluster.name)
                })
            })
            .map(|c| c.name_any())
            .collect();
        Holds {
            schedule_gone,
            restoring,
        }
    }

    /// Whether another base backup of `backup`'s cluster is running.
    fn backup_running(&self, backup: &Backup) -> bool {
        self.caches.backups.state().iter().any(|other| {
            other.uid() != backup.uid()
                && other.namespace() == backup.namespace()
                && other.spec.cluster.name == backup.spec.cluster.name
                && other.spec.method == BackupMethod::Physical
                && other.status.as_ref().and_then(|s| s.phase) == Some(BackupPhase::Running)
        })
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
        let now = Instant::now();
        let sight = self
            .health
            .as_ref()
            .map_or(Sight::Unbroken, |health| health.sight(&Lease::kind(&())));
        let mut heartbeats = self.heartbeats.lock().unwrap_or_else(|p| p.into_inner());
        let key = format!("{namespace}/{}", pod.name_any());
        let heartbeat = Heartbeat::seen(heartbeats.get(&key), renewed, now);
        let instance = Instance {
            pod: pod.name_any(),
            uid: pod.uid().unwrap_or_default(),
            observed,
            silent: heartbeat.silence(sight, now),
            beat_seen: heartbeat.beat_seen(),
        };
        heartbeats.insert(key, heartbeat);
        instance
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
    let api: Api<Backup> =
        Api::namespaced(ctx.client.clone(), &backup.namespace().unwrap_or_default());
    if backup.metadata.deletion_timestamp.is_some() {
        return release(&backup, &ctx, &api, now).await;
    }
    // Before any instance can write a file: the finalizer that removes it.
    if backup.spec.deletion_policy == BackupDeletionPolicy::Delete {
        finalizers::add(&api, &*backup, ARTIFACT_FINALIZER).await?;
    } else {
        finalizers::remove(&api, &*backup, ARTIFACT_FINALIZER).await?;
    }
    let world = ctx.world(&backup, now);
    let decision = plan::decide(&backup, &world);
    let mut current = (*backup).clone();
    if let Some(status) = plan::status(&backup, &decision, now) {
        // Conditioned on the version read: a status decided from a cache
        // that lags another write is refused (409, retried once the cache
        // caught up) rather than undoing that write.
        let written = ctx
            .applier
            .apply_status_at_version(&api, MANAGER, &*backup, &status)
            .await?;
        let Some(written) = written else {
            // Written already over the version the cache shows: it lags.
            return Ok(Recheck::Within(std::time::Duration::from_millis(500)));
        };
        current = written;
        ctx.metrics.finished(&decision);
        announce(&ctx.recorder, &backup, &decision).await;
    }
    let verifying = verification(&current, world.cluster.as_deref(), &ctx, &api, now).await?;
    Ok(
        match [plan::recheck(&backup, &decision, now), verifying]
            .into_iter()
            .flatten()
            .min()
        {
            Some(within) => Recheck::Within(within),
            None => Recheck::AfterResync,
        },
    )
}

/// A completed Backup's restore verification (`verify.rs`): its pod
/// started, its outcome recorded, then the pod deleted. When to look again.
async fn verification(
    backup: &Backup,
    cluster: Option<&DatabaseCluster>,
    ctx: &Context,
    api: &Api<Backup>,
    now: Timestamp,
) -> Result<Option<std::time::Duration>, Error> {
    let namespace = backup.namespace().unwrap_or_default();
    let name = verify::pod_name(backup);
    let pod = ctx
        .caches
        .verification_pods
        .get(&ObjectRef::new(&name).within(&namespace));
    let step = verify::plan(backup, cluster, pod.as_deref(), now);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    // The status first: a verification started is recorded (its start, for
    // the deadline) before its pod exists, and an outcome before its pod
    // goes; a stale cache fails the write and starts or deletes nothing.
    if let Some(status) = verify::status(backup, &step, now) {
        let written = ctx
            .applier
            .apply_status_at_version(api, MANAGER, backup, &status)
            .await?;
        if written.is_none() {
            // Written already over the version the cache shows: it lags.
            return Ok(Some(std::time::Duration::from_millis(500)));
        }
        let object = backup.object_ref(&());
        match &step {
            Step::Start(_) => {
                let note = format!("pod {name} restores the backup and checks it");
                publish(&ctx.recorder, &object, EventType::Normal, "Verifying", note).await;
            }
            Step::Record(outcome) => {
                ctx.metrics.verified(outcome.verified);
                let type_ = if outcome.verified {
                    EventType::Normal
                } else {
                    EventType::Warning
                };
                let summary = status.verification.as_ref().map(verify::summary);
                let note = summary.unwrap_or_else(|| outcome.message.clone());
                publish(&ctx.recorder, &object, type_, &outcome.reason, note).await;
            }
            _ => {}
        }
    }
    let ours = pod.as_deref().is_some_and(|p| verify::owned_by(p, backup));
    match &step {
        Step::Start(pod) => match pods.create(&PostParams::default(), pod).await {
            // The cache has not seen it yet.
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            created => {
                created?;
            }
        },
        // Only this Backup's own pod, never one that took its name.
        Step::Record(_) | Step::Clean | Step::Withdraw if ours => {
            let uid = pod.as_deref().and_then(|p| p.uid());
            let background = Some(kube::api::PropagationPolicy::Background);
            apply::delete_exactly(&pods, &name, uid, background).await?;
        }
        _ => {}
    }
    Ok(verify::recheck(backup, &step))
}

/// A deleted Backup holding our finalizer: its files removed (`Delete`),
/// once its instance stopped writing them, then the finalizer.
async fn release(
    backup: &Backup,
    ctx: &Context,
    api: &Api<Backup>,
    now: Timestamp,
) -> Result<Recheck, Error> {
    if !backup.finalizers().iter().any(|f| f == ARTIFACT_FINALIZER) {
        return Ok(Recheck::AfterResync);
    }
    let world = ctx.world(backup, now);
    match artifact::cleanup(backup, &world, &ctx.holds(backup)) {
        Cleanup::WaitForInstance(pod) => {
            tracing::debug!(backup = %backup.name_any(), %pod, "waiting for the instance to stop");
            return Ok(Recheck::Within(plan::POLL));
        }
        Cleanup::WaitForRestore(cluster) => {
            tracing::info!(backup = %backup.name_any(), %cluster, "kept while a restore reads its cluster's folder");
            return Ok(Recheck::Within(plan::POLL * 6));
        }
        Cleanup::Release => {}
        Cleanup::Keep(why) => {
            ctx.metrics.artifact("ArtifactKept");
            let note = format!("the stored backup is not removed: {why}");
            let object = backup.object_ref(&());
            publish(
                &ctx.recorder,
                &object,
                EventType::Warning,
                "ArtifactKept",
                note,
            )
            .await;
        }
        Cleanup::Remove => match remove(backup, ctx, world.cluster.as_deref()).await {
            Ok((type_, reason, note)) => {
                ctx.metrics.artifact(reason);
                publish(&ctx.recorder, &backup.object_ref(&()), type_, reason, note).await;
            }
            Err(e) if given_up(backup, now) => {
                ctx.metrics.artifact("ArtifactLeaked");
                let note = format!(
                    "the stored backup could not be removed for {} minutes and is left in the \
                     bucket: {e}",
                    artifact::GIVE_UP_AFTER.as_secs() / 60
                );
                let object = backup.object_ref(&());
                publish(
                    &ctx.recorder,
                    &object,
                    EventType::Warning,
                    "ArtifactLeaked",
                    note,
                )
                .await;
            }
            Err(e) => return Err(e),
        },
    }
    finalizers::remove(api, backup, ARTIFACT_FINALIZER).await?;
    Ok(Recheck::AfterResync)
}

/// Removes a Backup's files: the Event that says what happened, or an
/// error worth retrying.
async fn remove(
    backup: &Backup,
    ctx: &Context,
    cluster: Option<&DatabaseCluster>,
) -> Result<(EventType, &'static str, String), Error> {
    let kept = |why: String| {
        Ok((
            EventType::Warning,
            "ArtifactKept",
            format!("the stored backup is not removed: {why}"),
        ))
    };
    let Some(destination) = artifact::destination(&backup.spec, cluster) else {
        return kept(
            "its cluster is gone and the Backup has no spec.destination, so where it is stored \
             is unknown"
                .into(),
        );
    };
    let namespace = backup.namespace().unwrap_or_default();
    let settings = match artifact::settings(&ctx.client, &namespace, destination).await? {
        Ok(settings) => settings,
        Err(why) => return kept(why),
    };
    let here = artifact::location(&settings, backup)?;
    let recorded = backup.status.as_ref().and_then(|s| s.location.clone());
    if let Some(recorded) = recorded.filter(|recorded| *recorded != here) {
        return kept(format!(
            "it is stored at {recorded}, and the cluster's destination now points elsewhere"
        ));
    }
    // Another base backup of the cluster in progress has no manifest yet:
    // the WAL it needs is kept, and deleted at a later deletion.
    let prune_wal = !ctx.backup_running(backup);
    match artifact::remove(&settings, backup, prune_wal).await {
        Ok(removed) => Ok((
            EventType::Normal,
            "ArtifactDeleted",
            format!(
                "removed {} and {} WAL files no other backup needs",
                removed.location, removed.wal_files
            ),
        )),
        Err(StorageError::BucketGone { .. }) => Ok((
            EventType::Normal,
            "BucketGone",
            format!(
                "bucket {} no longer exists: nothing to remove",
                settings.bucket
            ),
        )),
        Err(e) => Err(e.into()),
    }
}

/// Whether a failing clean-up has been tried for long enough.
fn given_up(backup: &Backup, now: Timestamp) -> bool {
    backup
        .metadata
        .deletion_timestamp
        .as_ref()
        .is_some_and(|at| {
            now.duration_since(at.0).as_secs() >= artifact::GIVE_UP_AFTER.as_secs() as i64
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

#[cfg(test)]
#[path = "backup_error_paths.rs"]
mod error_paths;
