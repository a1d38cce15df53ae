//! The membership step: who is primary. A requested switchover's next
//! step, else a failover if the primary is lost; then the role labels that
//! make `-rw` and `-ro` follow. It needs only the members, the pods and the
//! status, so it runs before any child is applied, and even while the spec
//! is invalid: a child that cannot be written must not leave a cluster
//! without a primary.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use cairn_api::database::instance::{
    BOOTSTRAP_ANNOTATION, BOOTSTRAP_INITDB, BOOTSTRAP_RESTORE, FENCED_ANNOTATION,
};
use cairn_api::database::v1::{
    DatabaseCluster, DatabaseClusterStatus, FORCED_PROMOTION_ANNOTATION, FailoverRecord,
    ForcedPromotion, SwitchoverRecord,
};
use cairn_runtime::conditions::Time;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::build::{ROLE_LABEL, ROLE_PRIMARY, ROLE_REPLICA};
use crate::context::{self, Context, Observed};
use crate::drain;
use crate::error::Error;
use crate::failover::{self, Decision, Member, Policy, Quorum};
use crate::status::{self, Switching};
use crate::switchover::{self, SWITCHOVER_ANNOTATION, Step};

/// The pod running the primary: the one recorded in the status, or ordinal 0
/// of a new cluster.
pub fn primary(cluster: &DatabaseCluster) -> String {
    cluster
        .status
        .as_ref()
        .and_then(|s| s.current_primary.clone())
        .unwrap_or_else(|| format!("{}-0", cluster.name_any()))
}

/// Who is primary after this reconcile, and what the status says of it.
pub struct Roles {
    pub primary: String,
    pub initialized: bool,
    pub switching: Switching,
    pub last_failover: Option<FailoverRecord>,
    /// Why a lost primary is not replaced yet.
    pub waiting: Option<String>,
    /// The primary renews no heartbeat but its replicas hear it serve.
    pub heard: Option<String>,
    pub recheck: Duration,
    /// The primary serves and no switchover is under way: a rollout may
    /// restart an instance.
    pub steady: bool,
    /// The timeline the serving primary reports, else the recorded one.
    pub timeline: Option<u32>,
}

/// The membership step (see the module): `rollout_target` is where a
/// rollout wants the primary moved, if it does.
pub async fn step(
    ctx: &Context,
    cluster: &DatabaseCluster,
    observed: &Observed,
    rollout_target: Option<&str>,
    policy: Policy,
    now: &Time,
) -> Result<Roles, Error> {
    let members = observed.members.as_slice();
    let mut primary = primary(cluster);
    let mut last_failover = cluster
        .status
        .as_ref()
        .and_then(|s| s.last_failover.clone());
    let switching = switch_over(
        ctx,
        cluster,
        &mut primary,
        members,
        &observed.draining,
        rollout_target,
        now,
    )
    .await?;
    let decision = match switching.demoted {
        // Between the demotion and the promotion no primary serves, by design.
        true => Decision::Keep {
            recheck: Duration::from_secs(1),
        },
        false => decide(ctx, cluster, &primary, members, policy, now.0),
    };
    let mut waiting = None;
    let mut heard = None;
    let mut steady = false;
    let recheck = match decision {
        Decision::Keep { recheck } => {
            steady = !switching.demoted;
            recheck
        }
        Decision::Wait { reason, recheck } => {
            waiting = Some(reason);
            recheck
        }
        Decision::Heard { reason, recheck } => {
            heard = Some(reason);
            recheck
        }
        Decision::Promote {
            to,
            reason,
            primary_last_seen,
            forced,
        } => {
            let record = FailoverRecord {
                from: primary.clone(),
                to: to.clone(),
                reason,
                primary_last_seen: Time(primary_last_seen),
                promoted_at: now.clone(),
                completed_at: None,
            };
            if promote(ctx, cluster, members, &record, forced).await? {
                primary = to;
                last_failover = Some(record);
            }
            Duration::from_secs(1)
        }
    };
    let initialized = is_initialized(cluster, &primary, members);
    let timeline = cluster_timeline(cluster, &primary, members);
    let labelled_primary = (!switching.demoted).then_some(primary.as_str());
    label_roles(ctx, cluster, &observed.pods, labelled_primary, initialized).await?;
    if let Some(record) = last_failover.as_mut()
        && record.completed_at.is_none()
        && failover::serving(members, &record.to).is_some()
    {
        record.completed_at = Some(now.clone());
        let took = now.0.duration_since(record.primary_last_seen.0);
        ctx.metrics
            .failover_seconds
            .observe(took.as_secs_f64().max(0.0));
    }
    Ok(Roles {
        primary,
        initialized,
        switching,
        last_failover,
        waiting,
        heard,
        recheck,
        steady,
        timeline,
    })
}

/// An invalid spec stops every change to the children, but not failover:
/// a typo in `resources` must not leave a cluster without a primary. The
/// spec's replication settings may be the invalid part, so the failover
/// policy is the cautious one (see `failover::cautious`).
pub async fn keep_serving(
    ctx: &Context,
    cluster: &DatabaseCluster,
    status: &mut DatabaseClusterStatus,
    now: &Time,
) -> Result<(), Error> {
    let observed = Observed::of(ctx, cluster);
    // The instances the running configuration lists: the StatefulSet as
    // last applied from a valid spec.
    let instances = observed
        .stateful_set
        .as_ref()
        .and_then(|sts| sts.spec.as_ref()?.replicas)
        .and_then(|replicas| usize::try_from(replicas).ok())
        .unwrap_or(observed.members.len());
    let policy = failover::cautious(policy(cluster), instances);
    let roles = step(ctx, cluster, &observed, None, policy, now).await?;
    status.current_primary = Some(roles.primary);
    status.timeline = roles.timeline;
    status::failover(status, cluster, roles.last_failover, roles.waiting, now);
    status.last_switchover = roles.switching.record;
    Ok(())
}

/// Initialised: once a primary has served, and for ever after.
fn is_initialized(cluster: &DatabaseCluster, primary: &str, members: &[Member]) -> bool {
    cluster.status.as_ref().is_some_and(|s| s.initialized)
        || failover::serving(members, primary).is_some()
}

/// The timeline the serving primary reports, else the last one recorded:
/// a promotion's new timeline is recorded once the promoted instance serves
/// on it, and kept while no primary serves.
fn cluster_timeline(cluster: &DatabaseCluster, primary: &str, members: &[Member]) -> Option<u32> {
    failover::serving(members, primary)
        .and_then(|m| m.observed.timeline)
        .or_else(|| cluster.status.as_ref().and_then(|s| s.timeline))
}

/// What to do about the primary. Nothing before the cluster was initialised:
/// there is no data yet that a replica could hold.
fn decide(
    ctx: &Context,
    cluster: &DatabaseCluster,
    primary: &str,
    members: &[Member],
    policy: Policy,
    now: Timestamp,
) -> Decision {
    let key = context::key(cluster);
    let serving = failover::serving(members, primary).is_some();
    let not_serving_for = {
        let mut since = ctx
            .not_serving_since
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if serving {
            since.remove(&key);
            None
        } else {
            let entry = since
                .entry(key)
                .or_insert_with(|| (primary.to_owned(), Instant::now()));
            if entry.0 != primary {
                *entry = (primary.to_owned(), Instant::now());
            }
            Some(entry.1.elapsed())
        }
    };
    if !cluster.status.as_ref().is_some_and(|s| s.initialized) {
        return Decision::Keep {
            recheck: Duration::from_secs(10),
        };
    }
    let timeline = cluster.status.as_ref().and_then(|s| s.timeline);
    let decision = failover::decide(primary, members, timeline, not_serving_for, policy, now);
    let Decision::Wait { reason, recheck } = decision else {
        return decision;
    };
    let Some(value) = cluster.annotations().get(FORCED_PROMOTION_ANNOTATION) else {
        return Decision::Wait { reason, recheck };
    };
    let refused = |why: String| Decision::Wait {
        reason: format!("{reason}; {FORCED_PROMOTION_ANNOTATION} is not followed: {why}"),
        recheck,
    };
    let Some(order) = ForcedPromotion::parse(value) else {
        return refused(format!("{value:?} is not <pod>@<timeline>"));
    };
    if timeline != Some(order.timeline) {
        // Given for an earlier loss: the cluster has moved on since.
        return refused(format!(
            "it was given on timeline {}, and the cluster is on another",
            order.timeline
        ));
    }
    failover::forced(primary, members, timeline, &reason, &order.pod, policy, now)
        .unwrap_or_else(refused)
}

/// The failover policy the spec asks for.
pub fn policy(cluster: &DatabaseCluster) -> Policy {
    let spec = &cluster.spec;
    Policy {
        delay: spec.failover_delay(),
        start_timeout: spec.failover_start_timeout(),
        max_lag_bytes: spec.failover_max_lag_bytes(),
        quorum: spec.synchronous_replicas().map(|synchronous| Quorum {
            synchronous,
            instances: spec.instance_count(),
        }),
    }
}

/// Deposes the old primary and records the new one, in that order, before
/// any label moves. Deposing is a write to the old primary's Lease
/// conditional on the version that showed it lost: if it renewed since, the
/// write fails and nothing is promoted. Returns whether it promoted.
async fn promote(
    ctx: &Context,
    cluster: &DatabaseCluster,
    members: &[Member],
    record: &FailoverRecord,
    forced: bool,
) -> Result<bool, Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    // Read, not cached: the last look before a promotion must not be a
    // cache a heartbeat has not reached yet.
    let leases = Api::<Lease>::namespaced(ctx.client.clone(), &namespace);
    if let Some(lease) = leases.get_opt(&record.from).await? {
        let fresh = Member::from_lease(&lease);
        // Renewed since the cache's look, or since the cache saw it missing
        // (recreated, and renewed by a primary that kept serving).
        let renewed = match members.iter().find(|m| m.pod == record.from) {
            Some(cached) => cached.last_seen != fresh.last_seen,
            None => fresh.last_seen.is_some(),
        };
        if renewed && fresh.serves_as_primary() {
            tracing::info!(primary = %record.from, "the primary renewed its heartbeat: no failover");
            return Ok(false);
        }
        let fence = json!({ "metadata": {
            "resourceVersion": lease.resource_version(),
            "annotations": { FENCED_ANNOTATION: "true" },
        }});
        match leases
            .patch(&record.from, &PatchParams::default(), &Patch::Merge(&fence))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {
                tracing::info!(primary = %record.from, "the primary's Lease changed while deposing it: deciding again");
                return Ok(false);
            }
            Err(e) => return Err(e.into()),
        }
    }
    unfence(ctx, cluster, members, &record.to).await?;
    record_decision(
        ctx,
        cluster,
        json!({ "currentPrimary": record.to, "lastFailover": record }),
    )
    .await?;
    ctx.metrics.failovers.inc();
    tracing::warn!(from = %record.from, to = %record.to, reason = %record.reason, "primary lost: promoting a replica");
    let note = format!(
        "primary {} lost ({}): promoted {}",
        record.from, record.reason, record.to
    );
    let event = if forced {
        "ForcedFailover"
    } else {
        "FailedOver"
    };
    ctx.publish(cluster, EventType::Warning, event, note).await;
    Ok(true)
}

/// Lifts an earlier deposition from the instance about to be made primary.
async fn unfence(
    ctx: &Context,
    cluster: &DatabaseCluster,
    members: &[Member],
    pod: &str,
) -> Result<(), Error> {
    if !members.iter().any(|m| m.pod == pod && m.fenced) {
        return Ok(());
    }
    let namespace = cluster.namespace().unwrap_or_default();
    let unfence = json!({ "metadata": { "annotations": { FENCED_ANNOTATION: null } } });
    Api::<Lease>::namespaced(ctx.client.clone(), &namespace)
        .patch(pod, &PatchParams::default(), &Patch::Merge(&unfence))
        .await?;
    Ok(())
}

/// Writes a decision into the status at once, before acting on it: a crash
/// in between repeats the decision, never forgets it; reconciles from a
/// cache that has not shown it yet wait for it.
async fn record_decision(
    ctx: &Context,
    cluster: &DatabaseCluster,
    fields: serde_json::Value,
) -> Result<(), Error> {
    let api = Api::<DatabaseCluster>::namespaced(
        ctx.client.clone(),
        &cluster.namespace().unwrap_or_default(),
    );
    ctx.applier.record_in_status(&api, cluster, fields).await?;
    Ok(())
}

/// Takes the next step of a requested switchover (see `switchover.rs`).
async fn switch_over(
    ctx: &Context,
    cluster: &DatabaseCluster,
    primary: &mut String,
    members: &[Member],
    draining: &BTreeSet<String>,
    rollout_target: Option<&str>,
    now: &Time,
) -> Result<Switching, Error> {
    let planned = planned_target(cluster, primary, members, draining, rollout_target);
    let mut record = cluster
        .status
        .as_ref()
        .and_then(|s| s.last_switchover.clone());
    let mut note = None;
    match switchover::next(planned.target, primary, record.as_ref(), members, now.0) {
        Step::None => note = planned.note,
        Step::Refuse(why) => note = Some((status::reason::SWITCHOVER_REFUSED, why)),
        Step::Wait(why) => note = Some((status::reason::SWITCHING_OVER, why)),
        Step::Demote { from, to } => {
            let started = SwitchoverRecord {
                from,
                to,
                started_at: now.clone(),
                promoted_at: None,
                completed_at: None,
                write_unavailable_seconds: None,
                abandoned: None,
            };
            record_decision(ctx, cluster, json!({ "lastSwitchover": started })).await?;
            let message = match planned.drained {
                true => format!(
                    "demoting {} to promote {}: its node is being drained",
                    started.from, started.to
                ),
                false => format!("demoting {} to promote {}", started.from, started.to),
            };
            ctx.publish(
                cluster,
                EventType::Normal,
                "SwitchoverStarted",
                message.clone(),
            )
            .await;
            note = Some((status::reason::SWITCHING_OVER, message));
            record = Some(started);
        }
        Step::Abandon(why) => {
            if let Some(given_up) = record.as_mut() {
                given_up.completed_at = Some(now.clone());
                given_up.abandoned = Some(why.clone());
                // Recorded first: the old primary is labelled primary again
                // below, and a crash in between must not demote it anew.
                record_decision(ctx, cluster, json!({ "lastSwitchover": given_up })).await?;
                tracing::warn!(from = %given_up.from, to = %given_up.to, %why, "switchover given up");
                ctx.publish(
                    cluster,
                    EventType::Warning,
                    "SwitchoverAbandoned",
                    why.clone(),
                )
                .await;
            }
            note = Some((status::reason::SWITCHOVER_ABANDONED, why));
        }
        Step::Promote => {
            if let Some(promoted) = record.as_mut() {
                unfence(ctx, cluster, members, &promoted.to).await?;
                promoted.promoted_at = Some(now.clone());
                record_decision(
                    ctx,
                    cluster,
                    json!({ "currentPrimary": promoted.to, "lastSwitchover": promoted }),
                )
                .await?;
                primary.clone_from(&promoted.to);
            }
        }
    }
    if let Some(done) = record.as_mut()
        && done.promoted_at.is_some()
        && done.completed_at.is_none()
        && failover::serving(members, &done.to).is_some()
    {
        let took = now.0.duration_since(done.started_at.0).as_secs_f64();
        done.completed_at = Some(now.clone());
        done.write_unavailable_seconds = Some((took * 10.0).round() / 10.0);
        let message = format!(
            "{} is the primary; writes were unavailable for {took:.1} s",
            done.to
        );
        ctx.publish(cluster, EventType::Normal, "SwitchedOver", message)
            .await;
    }
    let demoted = switchover::under_way(record.as_ref()).is_some();
    Ok(Switching {
        record,
        demoted,
        note,
    })
}

/// Where a switchover should take the primary, if anywhere, and why not.
struct Planned<'a> {
    target: Option<&'a str>,
    /// The target is where a drain moves the primary.
    drained: bool,
    /// Why no switchover starts, to show when none is under way.
    note: Option<(&'static str, String)>,
}

/// A drain of the primary's node first (its eviction waits for it), then
/// the user's request, then a rollout's. A target whose own node drains is
/// refused: it would be moved away again at once.
fn planned_target<'a>(
    cluster: &'a DatabaseCluster,
    primary: &str,
    members: &'a [Member],
    draining: &BTreeSet<String>,
    rollout_target: Option<&'a str>,
) -> Planned<'a> {
    let requested = cluster
        .annotations()
        .get(SWITCHOVER_ANNOTATION)
        .map(String::as_str)
        .filter(|target| *target != primary);
    let (target, drained, mut note) = match drain::primary_move(primary, draining, members) {
        drain::Move::To(target) => {
            let target = members
                .iter()
                .find(|m| m.pod == target)
                .map(|m| m.pod.as_str());
            (target, true, None)
        }
        drain::Move::Blocked(why) => (None, false, Some((status::reason::DRAIN_WAITING, why))),
        drain::Move::Stay => (requested.or(rollout_target), false, None),
    };
    let target = target.filter(|target| {
        let on_draining_node = draining.contains(*target);
        if on_draining_node {
            note = Some((
                status::reason::SWITCHOVER_REFUSED,
                format!("{target} is on a node being drained"),
            ));
        }
        !on_draining_node
    });
    Planned {
        target,
        drained,
        note,
    }
}

/// Sets the role label on each instance pod where it differs, replicas
/// first (so `-rw` never selects two pods; none is primary during a
/// switchover's demotion), and the bootstrap annotation on the primary of a
/// cluster not yet initialised (removed once it is).
async fn label_roles(
    ctx: &Context,
    cluster: &DatabaseCluster,
    pods: &[std::sync::Arc<Pod>],
    primary: Option<&str>,
    initialized: bool,
) -> Result<(), Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let api = Api::<Pod>::namespaced(ctx.client.clone(), &namespace);
    let restores = cluster
        .spec
        .bootstrap
        .as_ref()
        .is_some_and(|b| b.restores());
    let bootstrap_kind = if restores {
        BOOTSTRAP_RESTORE
    } else {
        BOOTSTRAP_INITDB
    };
    let mut pods = pods.to_vec();
    pods.sort_by_key(|pod| Some(pod.name_any().as_str()) == primary);
    for pod in pods {
        let is_primary = Some(pod.name_any().as_str()) == primary;
        let role = if is_primary {
            ROLE_PRIMARY
        } else {
            ROLE_REPLICA
        };
        let bootstrap = (is_primary && !initialized).then_some(bootstrap_kind);
        if pod.labels().get(ROLE_LABEL).map(String::as_str) == Some(role)
            && pod
                .annotations()
                .get(BOOTSTRAP_ANNOTATION)
                .map(String::as_str)
                == bootstrap
        {
            continue;
        }
        let patch = json!({ "metadata": {
            "labels": { ROLE_LABEL: role },
            "annotations": { BOOTSTRAP_ANNOTATION: bootstrap },
        }});
        // Through the applier: a Pod cache lagging this write (a new
        // leader's, after an API server outage) must not get it again at
        // every heartbeat.
        ctx.applier.merge_patch(&api, &*pod, &patch).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::fixtures::with_primary as cluster;

    fn switchover(from: &str, to: &str, at: i64, promoted: bool) -> SwitchoverRecord {
        let time = |s: i64| Time(Timestamp::from_second(s).expect("valid"));
        SwitchoverRecord {
            from: from.to_owned(),
            to: to.to_owned(),
            started_at: time(at),
            promoted_at: promoted.then(|| time(at + 5)),
            completed_at: promoted.then(|| time(at + 6)),
            write_unavailable_seconds: promoted.then_some(6.0),
            abandoned: None,
        }
    }

    /// What the API server makes of a recorded decision (RFC 7386).
    fn recorded(before: &DatabaseCluster, fields: serde_json::Value) -> DatabaseClusterStatus {
        let previous = serde_json::to_value(&before.status).expect("serialisable");
        let mut status = previous.clone();
        json_patch::merge(
            &mut status,
            &cairn_runtime::apply::replacing(&previous, fields),
        );
        serde_json::from_value(status).expect("a status")
    }

    #[test]
    fn a_new_switchover_replaces_a_finished_one_whole() {
        let mut before = cluster("orders-2");
        let status = before.status.as_mut().expect("status");
        status.initialized = true;
        status.last_switchover = Some(switchover("orders-0", "orders-2", 1_700_000_000, true));
        let started = switchover("orders-2", "orders-0", 1_700_000_100, false);

        let after = recorded(&before, json!({ "lastSwitchover": started }));

        assert_eq!(after.last_switchover, Some(started));
        assert!(switchover::under_way(after.last_switchover.as_ref()).is_some());
        assert_eq!(after.current_primary.as_deref(), Some("orders-2"));
        assert!(after.initialized, "fields not named are kept");
    }

    #[test]
    fn a_new_failover_is_not_completed_by_the_last_one() {
        let time = |s: i64| Time(Timestamp::from_second(s).expect("valid"));
        let failover = |from: &str, to: &str, at: i64, done: bool| FailoverRecord {
            from: from.to_owned(),
            to: to.to_owned(),
            reason: "no heartbeat for 11 s".to_owned(),
            primary_last_seen: time(at - 11),
            promoted_at: time(at),
            completed_at: done.then(|| time(at + 2)),
        };
        let mut before = cluster("orders-1");
        before.status.as_mut().expect("status").last_failover =
            Some(failover("orders-0", "orders-1", 1_700_000_000, true));
        let next = failover("orders-1", "orders-2", 1_700_000_100, false);

        let after = recorded(
            &before,
            json!({ "currentPrimary": "orders-2", "lastFailover": next }),
        );

        assert_eq!(after.last_failover, Some(next));
        assert_eq!(after.current_primary.as_deref(), Some("orders-2"));
    }

    #[test]
    fn the_clusters_timeline_is_the_one_its_serving_primary_reports() {
        use cairn_api::database::instance::ObservedState;
        let report = |pod: &str, role: &str, ready: bool, timeline: u32| Member {
            pod: pod.to_owned(),
            observed: ObservedState {
                ready,
                role: Some(role.to_owned()),
                timeline: Some(timeline),
                ..ObservedState::default()
            },
            ..Member::default()
        };
        let mut before = cluster("orders-1");
        assert_eq!(cluster_timeline(&before, "orders-1", &[]), None);
        let serving = [report("orders-1", "primary", true, 2)];
        assert_eq!(cluster_timeline(&before, "orders-1", &serving), Some(2));
        before.status.as_mut().expect("status").timeline = Some(2);
        // Promoted but still in recovery on the old timeline: not yet news.
        let promoting = [report("orders-2", "replica", true, 2)];
        assert_eq!(cluster_timeline(&before, "orders-2", &promoting), Some(2));
        let promoted = [report("orders-2", "primary", true, 3)];
        assert_eq!(cluster_timeline(&before, "orders-2", &promoted), Some(3));
        // A replica's report, however new, is not the cluster's timeline.
        let replica = [report("orders-0", "replica", true, 7)];
        assert_eq!(cluster_timeline(&before, "orders-1", &replica), Some(2));
        // Volumes restored in place: the primary's word, not the old record.
        let restored = [report("orders-1", "primary", true, 1)];
        assert_eq!(cluster_timeline(&before, "orders-1", &restored), Some(1));
    }
}
