//! The status a cluster reports, derived from what its children show (pure).

use cairn_api::backup::layout::Layout;
use cairn_api::database::instance::WalArchiveState;
use cairn_api::database::v1::{
    DatabaseCluster, DatabaseClusterPhase, DatabaseClusterStatus, Endpoints, FailoverRecord,
    SwitchoverRecord,
};
use cairn_runtime::conditions::{self, Condition, Time};
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::ResourceExt;

use crate::build::{self, Names};

/// Condition types.
pub const READY: &str = "Ready";
pub const PROGRESSING: &str = "Progressing";
pub const DEGRADED: &str = "Degraded";
/// On a cluster with a backup destination: every completed WAL file reaches it.
pub const CONTINUOUS_ARCHIVING: &str = "ContinuousArchiving";

/// Reasons, stable strings an on-call engineer can search for.
pub mod reason {
    pub const ALL_INSTANCES_READY: &str = "AllInstancesReady";
    pub const INSTANCES_NOT_READY: &str = "InstancesNotReady";
    pub const CREATING: &str = "Creating";
    pub const SCALING: &str = "Scaling";
    pub const ROLLING_OUT: &str = "RollingOut";
    pub const CONVERGED: &str = cairn_runtime::events::CONVERGED;
    pub const INSTANCES_UNAVAILABLE: &str = "InstancesUnavailable";
    pub const HEALTHY: &str = "Healthy";
    pub const INVALID_SPEC: &str = "InvalidSpec";
    pub const PAUSED: &str = "Paused";
    pub const FAILING_OVER: &str = "FailingOver";
    pub const FAILOVER_BLOCKED: &str = "FailoverBlocked";
    pub const PRIMARY_CUT_OFF: &str = "PrimaryCutOffFromAPIServer";
    pub const SWITCHING_OVER: &str = "SwitchingOver";
    pub const SWITCHOVER_REFUSED: &str = "SwitchoverRefused";
    pub const SWITCHOVER_ABANDONED: &str = "SwitchoverAbandoned";
    /// The primary's node drains and no replica can take over.
    pub const DRAIN_WAITING: &str = "DrainWaitingForReplica";
    pub const STORAGE_EXPANSION_NOT_SUPPORTED: &str = "StorageExpansionNotSupported";
    pub const WAL_ARCHIVING: &str = "WALArchiving";
    pub const WAL_ARCHIVING_FAILING: &str = "WALArchivingFailing";
    pub const WAL_ARCHIVE_GAP: &str = "WALArchiveGap";
    pub const DESTINATION_NOT_SUPPORTED: &str = "DestinationNotSupported";
    /// The primary's reports stopped: archiving is not known to go on.
    pub const PRIMARY_NOT_REPORTING: &str = "PrimaryNotReporting";
}

/// What the StatefulSet reports, reduced to what the status needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Instances {
    /// Pods that exist.
    pub current: i32,
    pub ready: i32,
    /// Pods at the current pod template.
    pub updated: i32,
    /// Whether the StatefulSet controller has seen its latest spec.
    pub observed: bool,
    /// Not every pod is at the update revision. `observe` keeps a rollout
    /// going while the pod it restarted last is `starting`.
    pub rolling: bool,
    /// A pod at the update revision is not ready yet, within its
    /// `rollout::START_GRACE` (set by the reconcile, from the pods).
    pub starting: bool,
}

impl Instances {
    pub fn of(sts: Option<&StatefulSet>) -> Self {
        let Some(sts) = sts else {
            return Self::default();
        };
        let status = sts.status.clone().unwrap_or_default();
        Self {
            current: status.replicas,
            ready: status.ready_replicas.unwrap_or(0),
            updated: status.updated_replicas.unwrap_or(0),
            observed: status.observed_generation.unwrap_or(0)
                >= sts.metadata.generation.unwrap_or(0),
            // OnDelete: currentRevision never moves; count the pods instead.
            rolling: status.update_revision.is_some()
                && status.updated_replicas.unwrap_or(0) < status.replicas,
            starting: false,
        }
    }
}

/// The status of a healthy-spec cluster, given its instances and the primary.
pub fn observe(
    cluster: &DatabaseCluster,
    instances: Instances,
    primary: &str,
    now: &Time,
) -> DatabaseClusterStatus {
    let mut status = base(cluster);
    let desired = cluster.spec.instances;
    let was_running = cluster
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .is_some_and(|p| p != DatabaseClusterPhase::Creating);
    let all_ready = instances.observed
        && instances.ready == desired
        && instances.updated == desired
        && instances.current == desired;
    // The StatefulSet counts the last pod a rollout restarts as updated the
    // moment it is recreated: the rollout lasts while that pod starts, for
    // a bounded time (a pod that never starts is lost: Degraded).
    let previous = cluster.status.as_ref();
    let upgrading = previous.and_then(|s| s.phase) == Some(DatabaseClusterPhase::Upgrading);
    let rolling = instances.rolling || (upgrading && instances.starting && !all_ready);
    let (phase, progressing) = if all_ready {
        (DatabaseClusterPhase::Running, None)
    } else if !was_running {
        (DatabaseClusterPhase::Creating, Some(reason::CREATING))
    } else if instances.current != desired || !instances.observed {
        (DatabaseClusterPhase::Scaling, Some(reason::SCALING))
    } else if instances.updated < desired || rolling {
        (DatabaseClusterPhase::Upgrading, Some(reason::ROLLING_OUT))
    } else {
        (DatabaseClusterPhase::Degraded, None)
    };
    let generation = cluster.metadata.generation;
    let mut set = |type_: &str, ok: bool, reason: &str, message: String| {
        conditions::set(
            &mut status.conditions,
            conditions::new(type_, ok, reason, message, generation, now.clone()),
        );
    };
    let counted = format!("{}/{desired} instances ready", instances.ready);
    if all_ready {
        set(READY, true, reason::ALL_INSTANCES_READY, counted.clone());
    } else {
        set(READY, false, reason::INSTANCES_NOT_READY, counted.clone());
    }
    match progressing {
        Some(why) => set(PROGRESSING, true, why, format!("{why}: {counted}")),
        None => set(PROGRESSING, false, reason::CONVERGED, counted.clone()),
    }
    // Degraded: a cluster that ran lost a ready instance, outside a scale or
    // a rollout (where instances are unready by design: that is Progressing).
    let was_degraded = condition(previous, DEGRADED).is_some_and(|c| c.status == "True");
    let previously_ready = previous.and_then(|s| s.ready_instances).unwrap_or(0);
    let changing = rolling || instances.current != desired || !instances.observed;
    // A rollout that ends short of ready instances lost one (the count it
    // recorded meanwhile was already the lower one).
    let degraded = was_running
        && !changing
        && instances.ready < desired
        && (instances.ready < previously_ready || was_degraded || upgrading);
    if degraded {
        set(DEGRADED, true, reason::INSTANCES_UNAVAILABLE, counted);
    } else {
        set(DEGRADED, false, reason::HEALTHY, counted);
    }
    status.phase = Some(if degraded {
        DatabaseClusterPhase::Degraded
    } else {
        phase
    });
    status.instances = Some(instances.current);
    status.ready_instances = Some(instances.ready);
    status.current_primary = Some(primary.to_owned());
    status
}

/// Instances lost now (`rollout::lost`), whatever a rollout, a scale or a
/// switchover is doing: `Degraded`, naming each and since when. Not before
/// the cluster was initialised (nothing was lost: no primary ever served),
/// and not over a more specific `Degraded` (a failover, a primary cut off).
pub fn lost_instances(
    status: &mut DatabaseClusterStatus,
    cluster: &DatabaseCluster,
    lost: &[String],
    now: &Time,
) {
    let specific = condition(Some(status), DEGRADED)
        .is_some_and(|c| c.status == "True" && c.reason != reason::INSTANCES_UNAVAILABLE);
    if lost.is_empty() || specific || !status.initialized {
        return;
    }
    let ready = status.ready_instances.unwrap_or(0);
    let message = format!(
        "{ready}/{} instances ready; lost: {}",
        cluster.spec.instances,
        lost.join("; ")
    );
    conditions::set(
        &mut status.conditions,
        conditions::new(
            DEGRADED,
            true,
            reason::INSTANCES_UNAVAILABLE,
            message,
            cluster.metadata.generation,
            now.clone(),
        ),
    );
    status.phase = Some(DatabaseClusterPhase::Degraded);
}

/// The status of a cluster whose spec cannot be acted on.
pub fn invalid(cluster: &DatabaseCluster, message: &str, now: &Time) -> DatabaseClusterStatus {
    let mut status = base(cluster);
    let generation = cluster.metadata.generation;
    conditions::set(
        &mut status.conditions,
        conditions::new(
            READY,
            false,
            reason::INVALID_SPEC,
            message,
            generation,
            now.clone(),
        ),
    );
    conditions::set(
        &mut status.conditions,
        conditions::new(
            PROGRESSING,
            false,
            reason::INVALID_SPEC,
            "fix the spec to continue",
            generation,
            now.clone(),
        ),
    );
    status.phase = Some(DatabaseClusterPhase::Failed);
    status
}

/// Marks a requested storage growth the StorageClass `class` cannot do:
/// `Progressing=False` with the reason, until the class allows expansion.
/// The size cannot be set back (the schema lets it only grow, as claims
/// do), so the message names the one way out the API allows.
pub fn storage_not_expandable(
    status: &mut DatabaseClusterStatus,
    cluster: &DatabaseCluster,
    class: &str,
    now: &Time,
) {
    conditions::set(
        &mut status.conditions,
        conditions::new(
            PROGRESSING,
            false,
            reason::STORAGE_EXPANSION_NOT_SUPPORTED,
            format!(
                "spec.storage.size is {}, but StorageClass {class:?} does not allow volume expansion: the volumes keep their size until it does (if its provisioner can expand volumes: kubectl patch storageclass {class} -p '{{\"allowVolumeExpansion\":true}}')",
                cluster.spec.storage.size
            ),
            cluster.metadata.generation,
            now.clone(),
        ),
    );
}

/// The status of a cluster the controller refuses to create (`reason` says
/// why): nothing is created, and nothing will be until the spec changes.
pub fn refused(
    cluster: &DatabaseCluster,
    reason: &str,
    message: &str,
    now: &Time,
) -> DatabaseClusterStatus {
    let mut status = base(cluster);
    let generation = cluster.metadata.generation;
    for type_ in [READY, PROGRESSING] {
        conditions::set(
            &mut status.conditions,
            conditions::new(type_, false, reason, message, generation, now.clone()),
        );
    }
    status.phase = Some(DatabaseClusterPhase::Failed);
    status
}

/// A cluster not created yet for a reason that passes (a restore waiting
/// for its Backup): Creating, with the reason in `Ready` and `Progressing`.
pub fn waiting(
    cluster: &DatabaseCluster,
    reason: &str,
    message: &str,
    now: &Time,
) -> DatabaseClusterStatus {
    let mut status = base(cluster);
    let generation = cluster.metadata.generation;
    for (type_, value) in [(READY, false), (PROGRESSING, true)] {
        conditions::set(
            &mut status.conditions,
            conditions::new(type_, value, reason, message, generation, now.clone()),
        );
    }
    status.phase = Some(DatabaseClusterPhase::Creating);
    status
}

/// Records the last failover, and while one is under way (or cannot be
/// done: `blocked` says why) says so in `Degraded` and `Progressing`.
pub fn failover(
    status: &mut DatabaseClusterStatus,
    cluster: &DatabaseCluster,
    last: Option<FailoverRecord>,
    blocked: Option<String>,
    now: &Time,
) {
    let generation = cluster.metadata.generation;
    let under_way = last.as_ref().filter(|r| r.completed_at.is_none()).map(|r| {
        format!(
            "primary {} lost ({}): {} promoted, not serving yet",
            r.from, r.reason, r.to
        )
    });
    status.last_failover = last;
    let (reason, message) = match (blocked, under_way) {
        (Some(blocked), _) => (reason::FAILOVER_BLOCKED, blocked),
        (None, Some(under_way)) => (reason::FAILING_OVER, under_way),
        (None, None) => return,
    };
    for (type_, value) in [(DEGRADED, true), (PROGRESSING, true), (READY, false)] {
        conditions::set(
            &mut status.conditions,
            conditions::new(type_, value, reason, &message, generation, now.clone()),
        );
    }
    status.phase = Some(DatabaseClusterPhase::Degraded);
}

/// The primary renews no heartbeat while its replicas hear it serve: the
/// database takes writes, but the controller cannot see it, and a fault of
/// its peers now would stop them (`Degraded`; `Ready` stays as the
/// instances' probes say).
pub fn primary_heard(
    status: &mut DatabaseClusterStatus,
    cluster: &DatabaseCluster,
    message: &str,
    now: &Time,
) {
    conditions::set(
        &mut status.conditions,
        conditions::new(
            DEGRADED,
            true,
            reason::PRIMARY_CUT_OFF,
            message,
            cluster.metadata.generation,
            now.clone(),
        ),
    );
}

/// The status of a paused cluster: conditions say so, nothing else changes.
pub fn paused(cluster: &DatabaseCluster, now: &Time) -> DatabaseClusterStatus {
    let mut status = base(cluster);
    conditions::set(
        &mut status.conditions,
        conditions::new(
            PROGRESSING,
            false,
            reason::PAUSED,
            "spec.paused is set: the controller changes no child object",
            cluster.metadata.generation,
            now.clone(),
        ),
    );
    status.phase = Some(DatabaseClusterPhase::Paused);
    status
}

/// The previous status with what never depends on the instances refreshed.
fn base(cluster: &DatabaseCluster) -> DatabaseClusterStatus {
    let names = Names::of(cluster);
    let namespace = cluster.namespace().unwrap_or_default();
    let mut status = cluster.status.clone().unwrap_or_default();
    status.observed_generation = cluster.metadata.generation;
    status.selector = Some(build::selector_string(cluster));
    status.credentials_secret = Some(names.credentials.clone());
    status.endpoints = Some(Endpoints {
        read_write: Some(format!(
            "{}.{namespace}.svc:{}",
            names.read_write,
            build::POSTGRES_PORT
        )),
        read_only: Some(format!(
            "{}.{namespace}.svc:{}",
            names.read_only,
            build::POSTGRES_PORT
        )),
    });
    status
}

/// `ContinuousArchiving` from the primary's report of its last attempt (the
/// primary is the one that archives). Left as it was while the primary has
/// not reported (starting, or lost: the failover conditions say so), and
/// removed with `spec.backup`.
/// The primary has not reported within the failover delay (silent, or its
/// Lease gone): what it last said of archiving is no longer known to hold,
/// so `ContinuousArchiving` says so instead of repeating it. Nothing is
/// said of a cluster that never reported archiving.
pub fn archiving_unreported(
    status: &mut DatabaseClusterStatus,
    cluster: &DatabaseCluster,
    primary: &str,
    now: &Time,
) {
    let s3 = cluster
        .spec
        .backup
        .as_ref()
        .and_then(|b| b.destination.s3.as_ref());
    if s3.is_none() || condition(Some(status), CONTINUOUS_ARCHIVING).is_none() {
        return;
    }
    conditions::set(
        &mut status.conditions,
        conditions::new(
            CONTINUOUS_ARCHIVING,
            false,
            reason::PRIMARY_NOT_REPORTING,
            format!(
                "the primary {primary} has not reported within the failover delay: no WAL is \
                 known to be archived"
            ),
            cluster.metadata.generation,
            now.clone(),
        ),
    );
}

pub fn archiving(
    status: &mut DatabaseClusterStatus,
    cluster: &DatabaseCluster,
    report: Option<&WalArchiveState>,
    now: &Time,
) {
    let Some(backup) = &cluster.spec.backup else {
        status
            .conditions
            .retain(|c| c.type_ != CONTINUOUS_ARCHIVING);
        return;
    };
    let (ok, reason, message) = match (&backup.destination.s3, report) {
        (None, _) => (
            false,
            reason::DESTINATION_NOT_SUPPORTED,
            "spec.backup.destination.bucketRef: archiving to an ObjectBucket by reference is not \
             supported yet, so no WAL is archived; give the bucket as s3 (the ObjectBucket's \
             connection Secret holds its endpoint, bucket and credentials)"
                .to_owned(),
        ),
        (Some(_), None) => return,
        (Some(s3), Some(report)) => {
            let place = format!(
                "s3://{}/{}",
                s3.bucket,
                Layout::new(
                    s3.prefix.as_deref().unwrap_or_default(),
                    &cluster.name_any()
                )
                .wal_root()
            );
            match &report.failing {
                Some(error) => (
                    false,
                    reason::WAL_ARCHIVING_FAILING,
                    format!(
                        "WAL cannot be stored in {place} and waits in pg_wal (last stored: {}): {error}",
                        report
                            .last_stored
                            .as_deref()
                            .unwrap_or("none since the primary started")
                    ),
                ),
                None => match &report.gap {
                    Some(first) => (
                        false,
                        reason::WAL_ARCHIVE_GAP,
                        format!(
                            "WAL from {first} on was dropped without being stored in {place} \
                             (more waited than spec.backup.maxPendingWALSize allows): \
                             point-in-time recovery cannot cross it"
                        ),
                    ),
                    None => (
                        true,
                        reason::WAL_ARCHIVING,
                        format!("the primary stores every completed WAL file in {place}"),
                    ),
                },
            }
        }
    };
    conditions::set(
        &mut status.conditions,
        conditions::new(
            CONTINUOUS_ARCHIVING,
            ok,
            reason,
            message,
            cluster.metadata.generation,
            now.clone(),
        ),
    );
}

/// Where a requested switchover stands after a reconcile.
pub struct Switching {
    pub record: Option<SwitchoverRecord>,
    /// Between the demotion and the promotion: no primary on purpose.
    pub demoted: bool,
    /// A condition reason and message to show, if any.
    pub note: Option<(&'static str, String)>,
}

/// A rollout or scale-down that waits says on what, in `Progressing`.
pub fn rolling_out(
    status: &mut DatabaseClusterStatus,
    cluster: &DatabaseCluster,
    why: &str,
    now: &Time,
) {
    let (reason, message) = match condition(Some(status), PROGRESSING) {
        Some(c) if c.status == "True" => (c.reason.clone(), format!("{}; {why}", c.message)),
        _ => (reason::ROLLING_OUT.to_owned(), why.to_owned()),
    };
    conditions::set(
        &mut status.conditions,
        conditions::new(
            PROGRESSING,
            true,
            &reason,
            message,
            cluster.metadata.generation,
            now.clone(),
        ),
    );
}

/// Records the switchover; while one is under way it is `Progressing`
/// (planned: not `Degraded`), and a refused request says why.
pub fn switchover(
    status: &mut DatabaseClusterStatus,
    cluster: &DatabaseCluster,
    switching: Switching,
    now: &Time,
) {
    let generation = cluster.metadata.generation;
    // Under way until the target serves, unless a failover replaced it first.
    let under_way = switching.record.as_ref().is_some_and(|r| {
        r.completed_at.is_none()
            && (r.promoted_at.is_none() || status.current_primary.as_deref() == Some(&r.to))
    });
    status.last_switchover = switching.record;
    let mut set = |type_: &str, value: bool, reason: &str, message: &str| {
        conditions::set(
            &mut status.conditions,
            conditions::new(type_, value, reason, message, generation, now.clone()),
        );
    };
    match switching.note {
        Some((
            why @ (reason::SWITCHOVER_REFUSED
            | reason::SWITCHOVER_ABANDONED
            | reason::DRAIN_WAITING),
            message,
        )) => {
            set(PROGRESSING, false, why, &message);
        }
        Some((why, message)) => set(PROGRESSING, true, why, &message),
        None if under_way => set(
            PROGRESSING,
            true,
            reason::SWITCHING_OVER,
            "waiting for the new primary to serve",
        ),
        None => return,
    }
    if under_way {
        set(
            DEGRADED,
            false,
            reason::SWITCHING_OVER,
            "a planned switchover",
        );
    }
}

/// The condition of `type_` in `status`, if any.
pub fn condition<'a>(
    status: Option<&'a DatabaseClusterStatus>,
    type_: &str,
) -> Option<&'a Condition> {
    status.and_then(|s| conditions::find(&s.conditions, type_))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(instances: i32, phase: Option<DatabaseClusterPhase>) -> DatabaseCluster {
        let mut cluster = crate::fixtures::cluster(instances, &[]);
        cluster.status = phase.map(|phase| DatabaseClusterStatus {
            phase: Some(phase),
            ..DatabaseClusterStatus::default()
        });
        cluster
    }

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).expect("valid"))
    }

    fn instances(current: i32, ready: i32, updated: i32) -> Instances {
        Instances {
            current,
            ready,
            updated,
            observed: true,
            rolling: updated < current,
            starting: false,
        }
    }

    fn running_with(instances: i32, ready: i32) -> DatabaseCluster {
        let mut cluster = cluster(instances, Some(DatabaseClusterPhase::Running));
        if let Some(status) = cluster.status.as_mut() {
            status.ready_instances = Some(ready);
        }
        cluster
    }

    fn reason_of(status: &DatabaseClusterStatus, type_: &str) -> (String, String) {
        let c = conditions::find(&status.conditions, type_).expect("condition set");
        (c.status.clone(), c.reason.clone())
    }

    #[test]
    fn all_instances_ready_is_running() {
        let status = observe(&cluster(3, None), instances(3, 3, 3), "orders-0", &now());
        assert_eq!(status.phase, Some(DatabaseClusterPhase::Running));
        assert_eq!(
            reason_of(&status, READY),
            ("True".into(), reason::ALL_INSTANCES_READY.into())
        );
        assert_eq!(reason_of(&status, PROGRESSING).0, "False");
        assert_eq!(reason_of(&status, DEGRADED).0, "False");
        assert_eq!(
            status.endpoints.and_then(|e| e.read_write).as_deref(),
            Some("orders-rw.shop.svc:5432")
        );
    }

    /// Each count and name comes from its own source: values that differ
    /// from one another catch a field filled from the wrong one.
    #[test]
    fn each_field_comes_from_its_own_source() {
        let mut cluster = cluster(5, None);
        cluster.metadata.generation = Some(7);
        let status = observe(&cluster, instances(4, 2, 3), "orders-3", &now());
        assert_eq!(status.instances, Some(4), "pods that exist");
        assert_eq!(status.ready_instances, Some(2), "pods that are ready");
        assert_eq!(status.observed_generation, Some(7));
        assert_eq!(status.current_primary.as_deref(), Some("orders-3"));
    }

    #[test]
    fn a_new_cluster_is_creating_until_ready() {
        let status = observe(&cluster(3, None), instances(1, 0, 1), "orders-0", &now());
        assert_eq!(status.phase, Some(DatabaseClusterPhase::Creating));
        assert_eq!(
            reason_of(&status, PROGRESSING),
            ("True".into(), reason::CREATING.into())
        );
        assert_eq!(
            reason_of(&status, DEGRADED).0,
            "False",
            "not degraded while creating"
        );
    }

    #[test]
    fn growing_a_running_cluster_is_scaling_not_degraded() {
        let status = observe(
            &cluster(5, Some(DatabaseClusterPhase::Running)),
            instances(3, 3, 3),
            "orders-0",
            &now(),
        );
        assert_eq!(status.phase, Some(DatabaseClusterPhase::Scaling));
        assert_eq!(reason_of(&status, DEGRADED).0, "False");
    }

    #[test]
    fn the_last_new_instance_of_a_scale_up_is_not_degraded_while_it_starts() {
        let status = observe(&running_with(5, 4), instances(5, 4, 5), "orders-0", &now());
        assert_eq!(reason_of(&status, DEGRADED).0, "False");
    }

    #[test]
    fn a_restarting_instance_of_a_rollout_is_progressing_not_degraded() {
        let mut rolling = instances(3, 2, 3);
        rolling.rolling = true;
        let status = observe(&running_with(3, 3), rolling, "orders-0", &now());
        assert_eq!(reason_of(&status, DEGRADED).0, "False");
        assert_eq!(
            reason_of(&status, PROGRESSING),
            ("True".into(), reason::ROLLING_OUT.into())
        );
    }

    #[test]
    fn the_last_restarted_instance_of_a_rollout_is_progressing_until_ready() {
        // The old primary, restarted last: the StatefulSet already counts
        // its new pod as updated; the status last written saw 3 ready.
        let mut upgrading = running_with(3, 3);
        if let Some(status) = upgrading.status.as_mut() {
            status.phase = Some(DatabaseClusterPhase::Upgrading);
        }
        let restarted = Instances {
            starting: true,
            ..instances(3, 2, 3)
        };
        let starting = observe(&upgrading, restarted, "orders-1", &now());
        assert_eq!(starting.phase, Some(DatabaseClusterPhase::Upgrading));
        assert_eq!(reason_of(&starting, DEGRADED).0, "False");
        assert_eq!(
            reason_of(&starting, PROGRESSING),
            ("True".into(), reason::ROLLING_OUT.into())
        );
        // A pod that does not start within its grace is lost.
        let mut still = upgrading.clone();
        still.status = Some(starting.clone());
        let lost = observe(&still, instances(3, 2, 3), "orders-1", &now());
        assert_eq!(reason_of(&lost, DEGRADED).0, "True");
        upgrading.status = Some(starting);
        let done = observe(&upgrading, instances(3, 3, 3), "orders-1", &now());
        assert_eq!(done.phase, Some(DatabaseClusterPhase::Running));
        // Once the rollout is over, losing that pod is Degraded again.
        let mut ran = running_with(3, 3);
        ran.status = Some(done);
        let lost = observe(&ran, instances(3, 2, 3), "orders-1", &now());
        assert_eq!(reason_of(&lost, DEGRADED).0, "True");
    }

    #[test]
    fn degraded_stays_until_every_instance_is_ready_again() {
        let lost = observe(&running_with(3, 3), instances(3, 2, 3), "orders-0", &now());
        assert_eq!(reason_of(&lost, DEGRADED).0, "True");
        let mut again = running_with(3, 2);
        again.status = Some(lost);
        let still = observe(&again, instances(3, 2, 3), "orders-0", &now());
        assert_eq!(reason_of(&still, DEGRADED).0, "True", "sticky");
        again.status = Some(still);
        let healed = observe(&again, instances(3, 3, 3), "orders-0", &now());
        assert_eq!(reason_of(&healed, DEGRADED).0, "False");
    }

    #[test]
    fn a_running_cluster_losing_an_instance_is_degraded() {
        let status = observe(&running_with(3, 3), instances(3, 2, 3), "orders-0", &now());
        assert_eq!(status.phase, Some(DatabaseClusterPhase::Degraded));
        assert_eq!(
            reason_of(&status, DEGRADED),
            ("True".into(), reason::INSTANCES_UNAVAILABLE.into())
        );
        assert_eq!(reason_of(&status, READY).0, "False");
    }

    #[test]
    fn an_instance_lost_during_a_rollout_is_degraded_with_its_name_and_age() {
        let rolling = Instances {
            rolling: true,
            ..instances(3, 2, 2)
        };
        let mut status = observe(&running_with(3, 3), rolling, "orders-0", &now());
        status.initialized = true;
        assert_eq!(reason_of(&status, DEGRADED).0, "False", "the rollout's own");
        let lost = ["orders-2 not ready since 2026-12-04T04:00:00Z".to_owned()];
        lost_instances(&mut status, &running_with(3, 3), &lost, &now());
        let degraded = condition(Some(&status), DEGRADED).expect("Degraded");
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", reason::INSTANCES_UNAVAILABLE)
        );
        assert!(
            degraded.message.contains("orders-2 not ready since"),
            "{}",
            degraded.message
        );
        assert_eq!(status.phase, Some(DatabaseClusterPhase::Degraded));
        assert_eq!(
            reason_of(&status, PROGRESSING).1,
            reason::ROLLING_OUT,
            "and still rolling"
        );

        // A failover's own reason stays; a new cluster lost nothing.
        let mut failing = observe(&running_with(3, 3), instances(3, 2, 3), "orders-0", &now());
        failing.initialized = true;
        failover(
            &mut failing,
            &running_with(3, 3),
            None,
            Some("blocked".into()),
            &now(),
        );
        lost_instances(&mut failing, &running_with(3, 3), &lost, &now());
        assert_eq!(reason_of(&failing, DEGRADED).1, reason::FAILOVER_BLOCKED);
        let mut creating = observe(&cluster(3, None), instances(3, 1, 3), "orders-0", &now());
        lost_instances(&mut creating, &cluster(3, None), &lost, &now());
        assert_eq!(
            reason_of(&creating, DEGRADED).0,
            "False",
            "never initialised: nothing lost"
        );
    }

    #[test]
    fn archiving_is_not_repeated_once_the_primary_stops_reporting() {
        let cluster = crate::fixtures::archiving(running_with(3, 3));
        let mut status = observe(&cluster, instances(3, 3, 3), "orders-0", &now());
        archiving_unreported(&mut status, &cluster, "orders-0", &now());
        assert!(
            condition(Some(&status), CONTINUOUS_ARCHIVING).is_none(),
            "never reported: nothing said"
        );
        let working = WalArchiveState {
            pending: 0,
            last_stored: Some("2026-11-25T23:00:00Z".into()),
            failing: None,
            gap: None,
        };
        archiving(&mut status, &cluster, Some(&working), &now());
        archiving_unreported(&mut status, &cluster, "orders-0", &now());
        let c = condition(Some(&status), CONTINUOUS_ARCHIVING).expect("condition");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reason::PRIMARY_NOT_REPORTING)
        );
        assert!(c.message.contains("orders-0"), "{}", c.message);
    }

    #[test]
    fn a_rollout_is_upgrading() {
        let status = observe(
            &cluster(3, Some(DatabaseClusterPhase::Running)),
            instances(3, 3, 1),
            "orders-0",
            &now(),
        );
        assert_eq!(status.phase, Some(DatabaseClusterPhase::Upgrading));
        assert_eq!(reason_of(&status, PROGRESSING).1, reason::ROLLING_OUT);
    }

    #[test]
    fn an_invalid_spec_says_why() {
        let status = invalid(&cluster(3, None), "spec.resources: too much", &now());
        let ready = conditions::find(&status.conditions, READY).expect("ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", reason::INVALID_SPEC)
        );
        assert_eq!(ready.message, "spec.resources: too much");
        assert_eq!(status.phase, Some(DatabaseClusterPhase::Failed));
    }

    #[test]
    fn archiving_follows_the_primarys_last_attempt() {
        let cluster = crate::fixtures::archiving(running_with(3, 3));
        let mut status = observe(&cluster, instances(3, 3, 3), "orders-0", &now());
        archiving(&mut status, &cluster, None, &now());
        assert!(
            condition(Some(&status), CONTINUOUS_ARCHIVING).is_none(),
            "nothing reported yet: nothing said"
        );
        let working = WalArchiveState {
            pending: 2,
            last_stored: Some("2026-11-25T23:00:00Z".into()),
            failing: None,
            gap: None,
        };
        archiving(&mut status, &cluster, Some(&working), &now());
        assert_eq!(
            reason_of(&status, CONTINUOUS_ARCHIVING),
            ("True".into(), reason::WAL_ARCHIVING.into())
        );
        let failing = WalArchiveState {
            failing: Some("PutObject: connection refused".into()),
            ..working.clone()
        };
        archiving(&mut status, &cluster, Some(&failing), &now());
        let c = condition(Some(&status), CONTINUOUS_ARCHIVING).expect("condition");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reason::WAL_ARCHIVING_FAILING)
        );
        assert!(
            c.message.contains("s3://wal/shop/orders/wal/"),
            "{}",
            c.message
        );
        assert!(c.message.contains("connection refused"), "{}", c.message);
        assert!(c.message.contains("2026-11-25T23:00:00Z"), "{}", c.message);

        let gap = WalArchiveState {
            gap: Some("000000010000000000000009".into()),
            ..working.clone()
        };
        archiving(&mut status, &cluster, Some(&gap), &now());
        let c = condition(Some(&status), CONTINUOUS_ARCHIVING).expect("condition");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reason::WAL_ARCHIVE_GAP)
        );
        assert!(
            c.message.contains("000000010000000000000009"),
            "{}",
            c.message
        );

        let mut without = cluster.clone();
        without.spec.backup = None;
        archiving(&mut status, &without, Some(&working), &now());
        assert!(condition(Some(&status), CONTINUOUS_ARCHIVING).is_none());
    }

    #[test]
    fn an_objectbucket_reference_is_refused_not_ignored() {
        let mut cluster = crate::fixtures::archiving(running_with(3, 3));
        if let Some(backup) = cluster.spec.backup.as_mut() {
            backup.destination =
                serde_json::from_value(serde_json::json!({ "bucketRef": { "name": "backups" } }))
                    .expect("destination");
        }
        let mut status = observe(&cluster, instances(3, 3, 3), "orders-0", &now());
        archiving(&mut status, &cluster, None, &now());
        assert_eq!(
            reason_of(&status, CONTINUOUS_ARCHIVING),
            ("False".into(), reason::DESTINATION_NOT_SUPPORTED.into())
        );
        let pod = build::stateful_set(&cluster, None)
            .spec
            .and_then(|s| s.template.spec)
            .expect("pod");
        let env = pod.containers[0].env.clone().unwrap_or_default();
        assert!(!env.iter().any(|e| e.name.starts_with("CAIRN_BACKUP")));
    }
}
