//! One reconcile of a `DatabaseCluster`, as a pipeline of named steps:
//!
//! 1. **validate** the spec (an invalid one stops every change to the
//!    children, not failover) and wait for a restore's source;
//! 2. **observe**: read the caches once ([`Observed`]);
//! 3. **membership**: who is primary, before anything can fail for an
//!    unrelated child ([`membership`]);
//! 4. **secrets**: the credentials, CA and server certificate ([`secrets`]);
//! 5. **build** every desired child in one pure call ([`desired`]) and
//!    **apply** them in one loop ([`children`]);
//! 6. **pods**: the deletions the rollout and the clean-ups call for
//!    ([`pods`]), and storage growth ([`storage`]);
//! 7. **status**, derived without I/O ([`status`]) and written once.
//!
//! A write happens only where the cache differs from the desired state, so
//! an unchanged cluster costs no request at all.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cairn_api::database::v1::{DatabaseCluster, DatabaseClusterStatus};
use cairn_api::validate;
use cairn_runtime::conditions::{self, Condition, Time};
use cairn_runtime::events;
use cairn_runtime::manager::Recheck;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::Event;
use kube::{Api, Resource, ResourceExt};

use crate::MANAGER;
pub use crate::context::{Caches, Context, Observed};
use crate::desired::{self, Inputs};
use crate::error::Error;
use crate::membership::{self, Roles};
use crate::restore;
use crate::rollout;
use crate::status::{self, CONTINUOUS_ARCHIVING, DEGRADED, Instances, PROGRESSING, READY};
use crate::{children, pods, secrets, storage, tls};

pub async fn reconcile(cluster: Arc<DatabaseCluster>, ctx: Arc<Context>) -> Result<Recheck, Error> {
    if cluster.metadata.deletion_timestamp.is_some() {
        // Owner references hand the children to the garbage collector.
        return Ok(Recheck::AfterResync);
    }
    if ctx.applier.is_behind_record(&*cluster) {
        // The watch delivers the recorded decision within moments.
        return Ok(Recheck::Within(Duration::from_millis(200)));
    }
    let cluster = ctx.applier.with_written_status(cluster);
    let now = Time(Timestamp::now());
    if let Some(stop) = validate_spec(&ctx, &cluster, &now).await? {
        return stop;
    }
    let observed = Observed::of(&ctx, &cluster);
    let rolling = pods::roll_out(&cluster, &observed);
    let rollout_target = match &rolling {
        rollout::Step::SwitchOver(to) => Some(to.as_str()),
        _ => None,
    };
    let policy = membership::policy(&cluster);
    let roles = membership::step(&ctx, &cluster, &observed, rollout_target, policy, &now).await?;
    let secrets = secrets::ensure(&ctx, &cluster).await?;
    let inputs = Inputs {
        stateful_set: observed.stateful_set.as_deref(),
        authority: &secrets.authority,
    };
    let stateful_set =
        children::apply(&ctx, &cluster, desired::children(&cluster, &inputs)).await?;
    let leftovers = pods::collect_leftovers(&ctx, &cluster, &stateful_set, &observed, &now).await?;
    pods::restart_void_tokens(&ctx, &cluster, &observed).await?;
    if let rollout::Step::Restart(pod) = &rolling
        && roles.steady
    {
        pods::restart(&ctx, &cluster, &observed, pod).await?;
    }
    let blocked_storage = storage::grow(&ctx, &cluster).await?;
    let starting = rollout::starting(&stateful_set, &observed.pod_refs(), &now);
    let recheck = next_look(&roles, secrets.renew_at, [leftovers, starting]);
    let outcome = Outcome {
        stateful_set: &stateful_set,
        starting: starting.is_some(),
        rolling: &rolling,
        roles,
        observed: &observed,
        blocked_storage,
    };
    write_status(&ctx, &cluster, status_of(&cluster, outcome, &now)).await?;
    Ok(Recheck::Within(recheck))
}

/// The steps before anything is built: the spec's validation and a
/// restore's source. `Some` stops the reconcile there with its result.
async fn validate_spec(
    ctx: &Context,
    cluster: &DatabaseCluster,
    now: &Time,
) -> Result<Option<Result<Recheck, Error>>, Error> {
    let problems = validate::database_cluster(&cluster.spec);
    if !problems.is_empty() {
        let message = problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        let mut refused = status::invalid(cluster, &message, now);
        if cluster.status.as_ref().is_some_and(|s| s.initialized) && !cluster.spec.paused {
            membership::keep_serving(ctx, cluster, &mut refused, now).await?;
        }
        write_status(ctx, cluster, refused).await?;
        return Ok(Some(Err(Error::InvalidSpec(message))));
    }
    let waiting = match restore::source(ctx, cluster).await? {
        restore::Source::Recorded => None,
        // Recorded first: the children are built from the status's record.
        restore::Source::Found(source) => {
            let mut found = status::waiting(
                cluster,
                status::reason::CREATING,
                &format!("restoring {}", source.location),
                now,
            );
            found.restored_from = Some(source);
            Some((found, Recheck::Within(Duration::from_millis(100))))
        }
        restore::Source::Waiting { reason, message } => Some((
            status::waiting(cluster, reason, &message, now),
            Recheck::Within(Duration::from_secs(10)),
        )),
        restore::Source::Refused { reason, message } => Some((
            status::refused(cluster, reason, &message, now),
            Recheck::AfterResync,
        )),
    };
    let stop = waiting.or_else(|| {
        cluster
            .spec
            .paused
            .then(|| (status::paused(cluster, now), Recheck::AfterResync))
    });
    let Some((status, recheck)) = stop else {
        return Ok(None);
    };
    write_status(ctx, cluster, status).await?;
    Ok(Some(Ok(recheck)))
}

/// What the steps found, for the status.
struct Outcome<'a> {
    stateful_set: &'a StatefulSet,
    /// A pod at the new template is within its grace to start.
    starting: bool,
    rolling: &'a rollout::Step,
    roles: Roles,
    observed: &'a Observed,
    /// The StorageClass that refuses a requested growth.
    blocked_storage: Option<String>,
}

/// The status the steps' outcome shows (pure).
fn status_of(cluster: &DatabaseCluster, outcome: Outcome, now: &Time) -> DatabaseClusterStatus {
    let roles = outcome.roles;
    let observed = outcome.observed;
    let instances = Instances {
        starting: outcome.starting,
        ..Instances::of(Some(outcome.stateful_set))
    };
    let mut status = status::observe(cluster, instances, &roles.primary, now);
    let delay = cluster.spec.failover_delay();
    let lost = rollout::lost(
        Some(outcome.stateful_set),
        &observed.pod_refs(),
        &observed.members,
        delay,
        now,
    );
    status.initialized = roles.initialized;
    status.timeline = roles.timeline;
    let primary_member = observed.members.iter().find(|m| m.pod == roles.primary);
    let primary_report = primary_member.map(|m| &m.observed);
    let reporting = primary_member.is_some_and(|m| m.silent.is_some_and(|s| s <= delay));
    status.postgres_version = primary_report
        .and_then(|report| report.server_version.clone())
        .or(status.postgres_version);
    if let rollout::Step::Wait(why) = outcome.rolling {
        status::rolling_out(&mut status, cluster, why, now);
    }
    status::failover(
        &mut status,
        cluster,
        roles.last_failover,
        roles.waiting,
        now,
    );
    if let Some(heard) = &roles.heard {
        status::primary_heard(&mut status, cluster, heard, now);
    }
    status::switchover(&mut status, cluster, roles.switching, now);
    status::lost_instances(&mut status, cluster, &lost, now);
    match reporting {
        true => {
            let archive = primary_report.and_then(|report| report.wal_archive.as_ref());
            status::archiving(&mut status, cluster, archive, now);
        }
        false => status::archiving_unreported(&mut status, cluster, &roles.primary, now),
    }
    if let Some(class) = &outcome.blocked_storage {
        status::storage_not_expandable(&mut status, cluster, class, now);
    }
    status
}

/// When to look again: heartbeats trigger reconciles, silence does not; a
/// certificate falls due; a pod that does not start within its grace is
/// then lost; a replaced StatefulSet's leftovers are due for collection.
fn next_look(roles: &Roles, renew_at: SystemTime, due: [Option<Duration>; 2]) -> Duration {
    let renew_in = tls::until(renew_at, SystemTime::now());
    let recheck = if roles.initialized {
        roles.recheck.min(renew_in)
    } else {
        renew_in
    };
    due.into_iter().flatten().fold(recheck, Duration::min)
}

/// Writes `status` through the status subresource unless it is what the
/// cluster already reports, and announces condition transitions as Events.
async fn write_status(
    ctx: &Context,
    cluster: &DatabaseCluster,
    mut status: DatabaseClusterStatus,
) -> Result<(), Error> {
    let previous = cluster.status.as_ref();
    if let Some(previous) = previous {
        conditions::keep_transition_times(&mut status.conditions, &previous.conditions);
    }
    if previous == Some(&status) {
        return Ok(());
    }
    let api = Api::<DatabaseCluster>::namespaced(
        ctx.client.clone(),
        &cluster.namespace().unwrap_or_default(),
    );
    let written = ctx
        .applier
        .apply_status(&api, MANAGER, cluster, &status)
        .await?;
    // None: written already over the version the cache shows (it lags).
    if written.is_some() {
        let reference = cluster.object_ref(&());
        for event in transition_events(previous, &status) {
            events::publish_event(&ctx.recorder, &reference, &event).await;
        }
    }
    Ok(())
}

/// The Events announcing what changed from `previous` to `status`: one per
/// real transition (every Event is a write).
fn transition_events(
    previous: Option<&DatabaseClusterStatus>,
    status: &DatabaseClusterStatus,
) -> Vec<Event> {
    let changed = |type_: &str| {
        let current = status::condition(Some(status), type_)?;
        let before = status::condition(previous, type_);
        // A new cluster's instances are not ready yet: expected, no Warning.
        if before.is_none() && current.reason == status::reason::INSTANCES_NOT_READY {
            return None;
        }
        events::on_transition(before, current).map(|event| (current, event))
    };
    let ready = changed(READY);
    // When Ready changes, its Event announces the transition: progress that
    // converged and health that came back are part of it (progress that
    // ended otherwise, `SwitchoverRefused`, is not). A condition turning for
    // the reason, or with the message, of one announced already is the same
    // news.
    let ready_changed = ready.is_some();
    let part_of_ready = |current: &Condition| {
        let back_to_normal = match current.type_.as_str() {
            PROGRESSING => current.status == "False" && current.reason == status::reason::CONVERGED,
            DEGRADED => current.status == "False",
            _ => false,
        };
        ready_changed && back_to_normal
    };
    let mut announced: Vec<Event> = Vec::new();
    for (current, event) in [
        ready,
        changed(PROGRESSING),
        changed(DEGRADED),
        changed(CONTINUOUS_ARCHIVING),
    ]
    .into_iter()
    .flatten()
    {
        let same_news = announced
            .iter()
            .any(|e| e.reason == event.reason || (e.note.is_some() && e.note == event.note));
        if !part_of_ready(current) && !same_news {
            announced.push(event);
        }
    }
    announced
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::events::EventType;

    fn with_conditions(conditions: &[(&str, bool, &str)]) -> DatabaseClusterStatus {
        let now = Time(Timestamp::from_second(1).expect("valid"));
        DatabaseClusterStatus {
            conditions: conditions
                .iter()
                .map(|(type_, ok, reason)| {
                    cairn_runtime::conditions::new(type_, *ok, reason, "", Some(1), now.clone())
                })
                .collect(),
            ..DatabaseClusterStatus::default()
        }
    }

    #[test]
    fn a_new_cluster_that_becomes_ready_is_announced_by_one_event() {
        use status::reason::{ALL_INSTANCES_READY, CONVERGED, CREATING, INSTANCES_NOT_READY};
        let creating = with_conditions(&[
            (READY, false, INSTANCES_NOT_READY),
            (PROGRESSING, true, CREATING),
            (DEGRADED, false, status::reason::HEALTHY),
        ]);
        assert!(transition_events(None, &creating).is_empty());
        let ready = with_conditions(&[
            (READY, true, ALL_INSTANCES_READY),
            (PROGRESSING, false, CONVERGED),
            (DEGRADED, false, status::reason::HEALTHY),
        ]);
        let events = transition_events(Some(&creating), &ready);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].reason, ALL_INSTANCES_READY);
        assert_eq!(events[0].type_, EventType::Normal);

        // A rollout that ends while the cluster stays Ready is its own news.
        let rolling = with_conditions(&[
            (READY, true, ALL_INSTANCES_READY),
            (PROGRESSING, true, status::reason::ROLLING_OUT),
            (DEGRADED, false, status::reason::HEALTHY),
        ]);
        let events = transition_events(Some(&rolling), &ready);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].reason, CONVERGED);
        assert_eq!(events[0].type_, EventType::Normal);
    }

    /// The reasons of the Events announcing `previous` → `status`.
    fn reasons(previous: &DatabaseClusterStatus, status: &DatabaseClusterStatus) -> Vec<String> {
        transition_events(Some(previous), status)
            .into_iter()
            .map(|e| e.reason)
            .collect()
    }

    #[test]
    fn a_transition_of_several_conditions_is_one_event_per_news() {
        use status::reason::{
            ALL_INSTANCES_READY, CONVERGED, FAILOVER_BLOCKED, HEALTHY, INSTANCES_NOT_READY,
            INSTANCES_UNAVAILABLE, SCALING, SWITCHOVER_REFUSED,
        };
        let ready = with_conditions(&[
            (READY, true, ALL_INSTANCES_READY),
            (PROGRESSING, false, CONVERGED),
            (DEGRADED, false, HEALTHY),
        ]);
        // The primary lost with no replica: three conditions, one reason.
        let blocked = with_conditions(&[
            (READY, false, FAILOVER_BLOCKED),
            (PROGRESSING, false, FAILOVER_BLOCKED),
            (DEGRADED, true, FAILOVER_BLOCKED),
        ]);
        let events = transition_events(Some(&ready), &blocked);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].reason, FAILOVER_BLOCKED);
        assert_eq!(events[0].type_, EventType::Warning);

        // Then both instances are recreated: Ready says why it is not, the
        // new progress is news, Degraded going back to False is not.
        let scaling = with_conditions(&[
            (READY, false, INSTANCES_NOT_READY),
            (PROGRESSING, true, SCALING),
            (DEGRADED, false, HEALTHY),
        ]);
        assert_eq!(reasons(&blocked, &scaling), [INSTANCES_NOT_READY, SCALING]);

        // Progress that ended otherwise than converged is news of its own.
        let refused = with_conditions(&[
            (READY, true, ALL_INSTANCES_READY),
            (PROGRESSING, false, SWITCHOVER_REFUSED),
            (DEGRADED, false, HEALTHY),
        ]);
        assert_eq!(
            reasons(&blocked, &refused),
            [ALL_INSTANCES_READY, SWITCHOVER_REFUSED]
        );

        // Health back while Ready stays as it was is news of its own.
        let degraded = with_conditions(&[
            (READY, true, ALL_INSTANCES_READY),
            (PROGRESSING, false, CONVERGED),
            (DEGRADED, true, INSTANCES_UNAVAILABLE),
        ]);
        assert_eq!(reasons(&degraded, &ready), [HEALTHY]);
    }
}

#[cfg(test)]
#[path = "reconcile_error_paths.rs"]
mod error_paths;
