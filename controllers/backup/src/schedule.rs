//! The reconcile of one BackupSchedule: its Backups and its cluster from
//! the caches, the plan (`schedule_plan`, pure), then its writes: the slot's
//! Backup created (a 409 is the same Backup made before a restart), running
//! ones failed under `Replace`, retention's deletions, the status.

use std::sync::Arc;

use cairn_api::backup::v1::{Backup, BackupSchedule, SCHEDULE_LABEL};
use cairn_api::database::v1::DatabaseCluster;
use cairn_runtime::conditions;
use cairn_runtime::manager::Recheck;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};

use crate::MANAGER;
use crate::artifact::{self, Window};
use crate::backup::Context;
use crate::error::Error;
use crate::plan::{self, Decision};
use crate::schedule_plan::{self, Storage, Timing};

pub async fn reconcile(schedule: Arc<BackupSchedule>, ctx: Arc<Context>) -> Result<Recheck, Error> {
    // A cache lagging this process's last status write would plan from the
    // slot before it, and take that slot again.
    let schedule = ctx.applier.with_written_status(schedule);
    let now = Timestamp::now();
    let namespace = schedule.namespace().unwrap_or_default();
    let schedules: Api<BackupSchedule> = Api::namespaced(ctx.client.clone(), &namespace);
    let timing = match Timing::parse(&schedule) {
        Ok(timing) => timing,
        Err(message) => {
            let mut status = schedule.status.clone().unwrap_or_default();
            let condition = conditions::new(
                "Ready",
                false,
                "InvalidSchedule",
                message,
                schedule.metadata.generation,
                cairn_api::common::Time(now),
            );
            conditions::set(&mut status.conditions, condition);
            status.observed_generation = schedule.metadata.generation;
            write_status(&ctx, &schedules, &schedule, status).await?;
            return Ok(Recheck::AfterResync);
        }
    };
    let name = schedule.name_any();
    let backups: Vec<Arc<Backup>> = ctx
        .caches
        .backups
        .state()
        .into_iter()
        // One being deleted is gone already for retention and concurrency
        // (its finalizer may hold it a while).
        .filter(|b| {
            b.namespace().as_deref() == Some(namespace.as_str())
                && b.labels().get(SCHEDULE_LABEL) == Some(&name)
                && b.metadata.deletion_timestamp.is_none()
        })
        .collect();
    let cluster = ctx.caches.clusters.get(
        &ObjectRef::<DatabaseCluster>::new(&schedule.spec.template.spec.cluster.name)
            .within(&namespace),
    );
    let storage = Storage {
        archiving: archiving(cluster.as_deref()),
        window: window(&ctx, &schedule, cluster.as_deref()).await,
    };
    let plan = schedule_plan::plan(&schedule, &timing, &backups, storage, now);
    let api: Api<Backup> = Api::namespaced(ctx.client.clone(), &namespace);
    for running in &plan.replace {
        let Some(backup) = backups.iter().find(|b| b.name_any() == *running) else {
            continue;
        };
        let replaced = Decision::Failed {
            reason: "Replaced",
            message: "replaced by the schedule's next slot (concurrencyPolicy Replace)".into(),
        };
        if let Some(status) = plan::status(backup, &replaced, now) {
            ctx.applier
                .apply_status(&api, MANAGER, backup, &status)
                .await?;
        }
    }
    if let Some(backup) = &plan.create {
        match api.create(&PostParams::default(), backup).await {
            Ok(_) => {
                announce(
                    &ctx,
                    &schedule,
                    EventType::Normal,
                    "Scheduled",
                    format!("created Backup {}", backup.name_any()),
                )
                .await
            }
            // Made before a restart that lost the status write: the same slot.
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    if let Some(why) = &plan.skipped {
        tracing::debug!(schedule = %name, %why, "slot not taken");
    }
    for old in &plan.delete {
        match api.delete(old, &DeleteParams::background()).await {
            Ok(_) => {
                announce(
                    &ctx,
                    &schedule,
                    EventType::Normal,
                    "Retention",
                    format!("deleted Backup {old}"),
                )
                .await
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    if Some(&plan.status) != schedule.status.as_ref() {
        write_status(&ctx, &schedules, &schedule, plan.status.clone()).await?;
    }
    Ok(plan.recheck.map_or(Recheck::AfterResync, Recheck::Within))
}

/// Whether the schedule's cluster archives its WAL, as its
/// `ContinuousArchiving` condition says (a cluster without the condition
/// archives nothing to fail).
fn archiving(cluster: Option<&DatabaseCluster>) -> Result<(), (&'static str, String)> {
    let failing = cluster.and_then(|c| {
        let condition = conditions::find(&c.status.as_ref()?.conditions, "ContinuousArchiving")?;
        (condition.status == "False")
            .then(|| format!("{}: {}", condition.reason, condition.message))
    });
    failing.map_or(Ok(()), |why| Err(("WALArchivingFailing", why)))
}

/// The cluster's recoverability window, read from its folder of the
/// bucket; `None` without a destination. Any failure (the Secret, the
/// bucket, no answer within [`BUCKET_TIMEOUT`]) is an `Err` for
/// `BackupsHealthy`, never a failed reconcile: the slots come first.
async fn window(
    ctx: &Context,
    schedule: &BackupSchedule,
    cluster: Option<&DatabaseCluster>,
) -> Result<Option<Window>, String> {
    let Some(destination) = artifact::destination(&schedule.spec.template.spec, cluster) else {
        return Ok(None);
    };
    let namespace = schedule.namespace().unwrap_or_default();
    let cluster_name = &schedule.spec.template.spec.cluster.name;
    let read = async {
        let settings = artifact::settings(&ctx.client, &namespace, destination)
            .await
            .map_err(|e| format!("reading the credentials Secret: {e}"))??;
        artifact::window(&settings, cluster_name)
            .await
            .map_err(|e| e.summary())
    };
    match tokio::time::timeout(BUCKET_TIMEOUT, read).await {
        Ok(window) => window.map(Some),
        Err(_) => Err(format!(
            "the bucket did not answer within {} s",
            BUCKET_TIMEOUT.as_secs()
        )),
    }
}

/// How long a schedule's look at the bucket may take.
const BUCKET_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

async fn write_status(
    ctx: &Context,
    api: &Api<BackupSchedule>,
    schedule: &BackupSchedule,
    status: cairn_api::backup::v1::BackupScheduleStatus,
) -> Result<(), kube::Error> {
    ctx.applier
        .apply_status(api, MANAGER, schedule, &status)
        .await?;
    Ok(())
}

async fn announce(
    ctx: &Context,
    schedule: &BackupSchedule,
    type_: EventType,
    reason: &str,
    note: String,
) {
    cairn_runtime::events::publish(
        &ctx.recorder,
        &schedule.object_ref(&()),
        type_,
        reason,
        note,
    )
    .await;
}
