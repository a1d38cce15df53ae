//! Rolling a new pod template through the instances (pure). The StatefulSet
//! uses `OnDelete`: a pod takes the new template only when this controller
//! deletes it. Replicas go first, one at a time, each ready again before the
//! next; then a switchover makes an up-to-date replica the primary, and the
//! old primary, now a replica, is restarted last. The primary is restarted
//! in place only when it is the only instance.
//!
//! A scale-down that would remove the primary's pod (the StatefulSet removes
//! the highest ordinals) first switches over to an instance that stays; the
//! StatefulSet keeps the primary's pod until then (`build::kept_instances`).

use std::time::Duration;

use cairn_api::database::instance::{ROLE_REPLICA, parse_lsn};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use crate::failover::Member;

/// The StatefulSet controller's label on each pod: the template revision.
const REVISION_LABEL: &str = "controller-revision-hash";

/// An instance pod, as far as a rollout goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    pub pod: String,
    /// At the StatefulSet's update revision.
    pub updated: bool,
    pub ready: bool,
    /// Being deleted (a restart under way).
    pub terminating: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Every pod runs the current template.
    Done,
    /// Nothing to do until something changes; why.
    Wait(String),
    /// Delete this pod: the StatefulSet recreates it from the new template.
    Restart(String),
    /// Make this up-to-date replica the primary first.
    SwitchOver(String),
}

/// The instance pods of a StatefulSet, against its update revision; None
/// while the StatefulSet controller has not yet seen its latest template.
pub fn instances(stateful_set: &StatefulSet, pods: &[&Pod]) -> Option<Vec<Instance>> {
    let status = stateful_set.status.as_ref()?;
    let seen =
        status.observed_generation.unwrap_or(0) >= stateful_set.metadata.generation.unwrap_or(0);
    let revision = status.update_revision.as_deref().filter(|_| seen)?;
    Some(
        pods.iter()
            .map(|pod| Instance {
                pod: pod.name_any(),
                updated: pod.labels().get(REVISION_LABEL).map(String::as_str) == Some(revision),
                ready: is_ready(pod),
                terminating: pod.metadata.deletion_timestamp.is_some(),
            })
            .collect(),
    )
}

/// How long a pod at the update revision may take to be ready after it was
/// created before the cluster counts it as lost (`Degraded`) rather than
/// starting: the pod a rollout restarted last, which the StatefulSet counts
/// as updated the moment it exists.
pub const START_GRACE: Duration = Duration::from_secs(300);

/// The time left to start of the youngest pod at the update revision that
/// is not ready yet and was created less than `START_GRACE` ago, if any.
pub fn starting(stateful_set: &StatefulSet, pods: &[&Pod], now: &Time) -> Option<Duration> {
    let instances = instances(stateful_set, pods)?;
    pods.iter()
        .zip(&instances)
        .filter(|(_, i)| i.updated && !i.ready && !i.terminating)
        .filter_map(|(pod, _)| {
            let created = pod.metadata.creation_timestamp.as_ref()?;
            let age: Duration = now.0.duration_since(created.0).try_into().ok()?;
            START_GRACE.checked_sub(age).filter(|left| !left.is_zero())
        })
        .max()
}

/// How long a pod that served may be unready before it counts as lost: a
/// replica restarting after a switchover, a probe that failed twice.
pub const UNREADY_GRACE: Duration = Duration::from_secs(30);

/// The instances lost now, each with why and since when: a pod unready
/// past [`UNREADY_GRACE`] that no rollout is restarting (being deleted, or
/// at the new template within its [`START_GRACE`]), or whose instance has
/// not reported for longer than `silence` (a stalled cairn-instance, a
/// frozen node the kubelet has not yet been declared lost for). A rollout
/// under way restarts one pod at a time by design; any other unready pod
/// is lost redundancy (`Degraded`), whatever else is going on.
pub fn lost(
    stateful_set: Option<&StatefulSet>,
    pods: &[&Pod],
    members: &[Member],
    silence: Duration,
    now: &Time,
) -> Vec<String> {
    let revision = stateful_set
        .and_then(|s| s.status.as_ref())
        .and_then(|s| s.update_revision.as_deref());
    let age_of = |since: Option<&Time>| -> Duration {
        since
            .and_then(|t| now.0.duration_since(t.0).try_into().ok())
            .unwrap_or_default()
    };
    let mut lost = Vec::new();
    for pod in pods {
        let name = pod.name_any();
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let age = age_of(pod.metadata.creation_timestamp.as_ref());
        let new =
            revision.is_some() && pod.labels().get(REVISION_LABEL).map(String::as_str) == revision;
        if !is_ready(pod) {
            let ready = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
            // Since when, as a time: a message that names the seconds
            // would change at every reconcile, and so be written each time.
            let since = ready
                .and_then(|c| c.last_transition_time.as_ref())
                .into_iter()
                .chain(pod.metadata.creation_timestamp.as_ref())
                .max_by_key(|t| t.0);
            let starting = new && age < START_GRACE;
            if !starting && age_of(since) >= UNREADY_GRACE {
                let since = since.map_or_else(|| "its creation".to_owned(), |t| t.0.to_string());
                lost.push(format!("{name} not ready since {since}"));
            }
            continue;
        }
        let silent = members
            .iter()
            .find(|m| m.pod == name)
            .filter(|m| m.silent.is_some_and(|s| s > silence));
        if let Some(member) = silent {
            // Its last renewal by its own node's clock: for the message only.
            let since = member
                .last_seen
                .map_or_else(|| "it started".to_owned(), |t| t.to_string());
            lost.push(format!("{name}'s instance has not reported since {since}"));
        }
    }
    lost
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

/// The next step of the rollout. `expected` is the number of instances the
/// StatefulSet should have; `switching` says a switchover is under way.
/// Before the cluster was initialised no instance holds data: the pods are
/// restarted one at a time, the primary last, whether or not they are ready
/// (a new image may be the fix for a bootstrap that never finished).
pub fn next(
    instances: &[Instance],
    expected: usize,
    primary: &str,
    members: &[Member],
    switching: bool,
    initialized: bool,
) -> Step {
    let leaving = ordinal(primary) as usize >= expected;
    if !leaving && instances.iter().all(|i| i.updated) {
        return Step::Done;
    }
    if switching {
        return Step::Wait("a switchover is under way".to_owned());
    }
    if leaving {
        return match switchover_target(instances, expected, primary, members) {
            Some(target) => Step::SwitchOver(target),
            None => Step::Wait(format!(
                "scaling down removes {primary}, the primary: waiting for a ready replica that \
                 stays to take over"
            )),
        };
    }
    if let Some(restarting) = instances.iter().find(|i| i.terminating) {
        return Step::Wait(format!("{} is restarting", restarting.pod));
    }
    if instances.len() < expected {
        return Step::Wait(format!("{} of {expected} instances exist", instances.len()));
    }
    let mut outdated: Vec<&Instance> = instances
        .iter()
        .filter(|i| !i.updated && i.pod != primary)
        .collect();
    // A replica that is not ready serves nobody: restarting it costs nothing.
    // Otherwise the highest ordinal first, as the StatefulSet would.
    outdated.sort_by_key(|i| (i.ready, std::cmp::Reverse(ordinal(&i.pod))));
    if let Some(replica) = outdated.first() {
        if !replica.ready || !initialized {
            return Step::Restart(replica.pod.clone());
        }
        if let Some(unready) = instances.iter().find(|i| !i.ready) {
            return Step::Wait(format!("{} is not ready", unready.pod));
        }
        return Step::Restart(replica.pod.clone());
    }
    // Only the primary is left.
    if instances.len() == 1 || !initialized {
        return Step::Restart(primary.to_owned());
    }
    match switchover_target(instances, expected, primary, members) {
        Some(target) => Step::SwitchOver(target),
        None => Step::Wait(format!(
            "no up-to-date replica is ready to take over from {primary}, which keeps running \
             the previous template"
        )),
    }
}

/// The up-to-date ready replica that stays and has replayed the most WAL.
fn switchover_target(
    instances: &[Instance],
    expected: usize,
    primary: &str,
    members: &[Member],
) -> Option<String> {
    instances
        .iter()
        .filter(|i| {
            i.updated && i.ready && i.pod != primary && (ordinal(&i.pod) as usize) < expected
        })
        .filter_map(|i| {
            let member = members.iter().find(|m| m.pod == i.pod)?;
            let replica =
                member.observed.ready && member.observed.role.as_deref() == Some(ROLE_REPLICA);
            let replayed = member.observed.wal_position.as_deref().and_then(parse_lsn);
            replica.then_some((replayed, std::cmp::Reverse(ordinal(&i.pod)), &i.pod))
        })
        .max()
        .map(|(_, _, pod)| pod.clone())
}

/// A StatefulSet pod's ordinal (`orders-2` → 2).
pub fn ordinal(pod: &str) -> u32 {
    pod.rsplit_once('-')
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_api::database::instance::ObservedState;

    fn pod(name: &str, updated: bool, ready: bool) -> Instance {
        Instance {
            pod: name.to_owned(),
            updated,
            ready,
            terminating: false,
        }
    }

    fn replica(name: &str, replayed: &str) -> Member {
        Member {
            pod: name.to_owned(),
            last_seen: None,
            silent: None,
            written: None,
            observed: ObservedState {
                ready: true,
                role: Some(ROLE_REPLICA.to_owned()),
                wal_position: Some(replayed.to_owned()),
                ..ObservedState::default()
            },
            fenced: false,
            fence_after: None,
        }
    }

    /// A pod of revision `revision`, created `age` seconds before `now()`.
    fn pod_object(name: &str, revision: &str, ready: bool, age: i64) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name,
                "labels": { REVISION_LABEL: revision },
                "creationTimestamp": (now().0 - k8s_openapi::jiff::SignedDuration::from_secs(age)).to_string(),
            },
            "status": { "conditions": [{ "type": "Ready", "status": if ready { "True" } else { "False" } }] },
        }))
        .expect("a pod")
    }

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).expect("valid"))
    }

    #[test]
    fn a_pod_at_the_new_revision_starts_within_its_grace_then_is_lost() {
        let sts: StatefulSet = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "db", "generation": 2 },
            "status": { "replicas": 2, "observedGeneration": 2, "updateRevision": "new" },
        }))
        .expect("a StatefulSet");
        let ready = pod_object("db-1", "new", true, 600);
        let restarted = pod_object("db-0", "new", false, 20);
        let pods = [&restarted, &ready];
        assert_eq!(
            starting(&sts, &pods, &now()),
            Some(START_GRACE - Duration::from_secs(20))
        );
        let long_ago = pod_object("db-0", "new", false, 301);
        assert_eq!(starting(&sts, &[&long_ago, &ready], &now()), None);
        // An outdated pod that is not ready is the rollout's own business.
        let outdated = pod_object("db-0", "old", false, 20);
        assert_eq!(starting(&sts, &[&outdated, &ready], &now()), None);
    }

    #[test]
    fn an_unready_pod_no_rollout_restarts_is_lost_whatever_else_goes_on() {
        let sts: StatefulSet = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "db", "generation": 2 },
            "status": { "replicas": 3, "observedGeneration": 2, "updateRevision": "new" },
        }))
        .expect("a StatefulSet");
        // On a frozen node for ten minutes: the rollout waits on it.
        let frozen = pod_object("db-2", "old", false, 600);
        // The pod the rollout restarted 20 s ago.
        let restarting = pod_object("db-1", "new", false, 20);
        let ready = pod_object("db-0", "new", true, 600);
        let delay = Duration::from_secs(10);
        let lost_now =
            |pods: &[&Pod], members: &[Member]| lost(Some(&sts), pods, members, delay, &now());
        let ten_minutes_ago = now().0 - k8s_openapi::jiff::SignedDuration::from_secs(600);
        assert_eq!(
            lost_now(&[&frozen, &restarting, &ready], &[]),
            [format!("db-2 not ready since {ten_minutes_ago}")]
        );
        // Unready 10 s ago after serving for long (a replica restarting
        // after a switchover): not lost yet.
        let mut brief = pod_object("db-2", "old", false, 600);
        let ten_ago = now().0 - k8s_openapi::jiff::SignedDuration::from_secs(10);
        for condition in brief
            .status
            .as_mut()
            .and_then(|s| s.conditions.as_mut())
            .into_iter()
            .flatten()
        {
            condition.last_transition_time = Some(Time(ten_ago));
        }
        assert!(lost_now(&[&brief, &ready], &[]).is_empty());
        // Being deleted: the rollout's restart.
        let mut deleted = frozen.clone();
        deleted.metadata.deletion_timestamp = Some(now());
        assert!(lost_now(&[&deleted, &ready], &[]).is_empty());
        // Ready by its last probe, but its instance stopped reporting.
        let mut stalled = replica("db-0", "0/3000000");
        stalled.silent = Some(Duration::from_secs(45));
        stalled.last_seen = Some(ten_minutes_ago);
        assert_eq!(
            lost_now(&[&ready], &[stalled.clone()]),
            [format!(
                "db-0's instance has not reported since {ten_minutes_ago}"
            )]
        );
        stalled.silent = Some(Duration::from_secs(5));
        assert!(lost_now(&[&ready], &[stalled]).is_empty());
    }

    fn members() -> Vec<Member> {
        vec![replica("db-1", "0/3000000"), replica("db-2", "0/3000100")]
    }

    #[test]
    fn replicas_restart_first_highest_ordinal_first_one_at_a_time() {
        let mut pods = vec![
            pod("db-0", false, true),
            pod("db-1", false, true),
            pod("db-2", false, true),
        ];
        assert_eq!(
            next(&pods, 3, "db-0", &members(), false, true),
            Step::Restart("db-2".into())
        );
        pods[2].terminating = true;
        assert_eq!(
            next(&pods, 3, "db-0", &members(), false, true),
            Step::Wait("db-2 is restarting".into())
        );
        pods[2] = pod("db-2", true, false);
        assert_eq!(
            next(&pods, 3, "db-0", &members(), false, true),
            Step::Wait("db-2 is not ready".into())
        );
        pods[2].ready = true;
        assert_eq!(
            next(&pods, 3, "db-0", &members(), false, true),
            Step::Restart("db-1".into())
        );
    }

    #[test]
    fn an_unready_outdated_replica_goes_first_without_waiting() {
        let pods = vec![
            pod("db-0", false, true),
            pod("db-1", false, false),
            pod("db-2", false, true),
        ];
        assert_eq!(
            next(&pods, 3, "db-0", &members(), false, true),
            Step::Restart("db-1".into())
        );
    }

    #[test]
    fn the_primary_is_switched_over_to_the_most_advanced_replica_never_restarted() {
        let pods = vec![
            pod("db-0", false, true),
            pod("db-1", true, true),
            pod("db-2", true, true),
        ];
        assert_eq!(
            next(&pods, 3, "db-0", &members(), false, true),
            Step::SwitchOver("db-2".into())
        );
        assert_eq!(
            next(&pods, 3, "db-0", &members(), true, true),
            Step::Wait("a switchover is under way".into())
        );
    }

    #[test]
    fn without_a_ready_up_to_date_replica_the_primary_keeps_running() {
        let no_target =
            |step: Step| matches!(step, Step::Wait(why) if why.contains("no up-to-date replica"));
        let unready = vec![pod("db-0", false, true), pod("db-1", true, false)];
        assert!(no_target(next(
            &unready,
            2,
            "db-0",
            &members(),
            false,
            true
        )));
        let mut lagging = members();
        lagging[0].observed.ready = false;
        let ready = vec![pod("db-0", false, true), pod("db-1", true, true)];
        assert!(no_target(next(&ready, 2, "db-0", &lagging, false, true)));
    }

    #[test]
    fn a_single_instance_restarts_in_place() {
        let pods = vec![pod("db-0", false, true)];
        assert_eq!(
            next(&pods, 1, "db-0", &[], false, true),
            Step::Restart("db-0".into())
        );
    }

    #[test]
    fn the_old_primary_restarts_last_as_a_replica() {
        let pods = vec![
            pod("db-0", false, true),
            pod("db-1", true, true),
            pod("db-2", true, true),
        ];
        assert_eq!(
            next(&pods, 3, "db-2", &members(), false, true),
            Step::Restart("db-0".into())
        );
        let done = vec![
            pod("db-0", true, false),
            pod("db-1", true, true),
            pod("db-2", true, true),
        ];
        assert_eq!(next(&done, 3, "db-2", &members(), false, true), Step::Done);
    }

    #[test]
    fn a_scale_down_that_removes_the_primary_switches_over_first() {
        let pods = vec![
            pod("db-0", true, true),
            pod("db-1", true, true),
            pod("db-2", true, true),
        ];
        assert_eq!(
            next(&pods, 2, "db-2", &members(), false, true),
            Step::SwitchOver("db-1".into())
        );
        assert_eq!(next(&pods, 2, "db-1", &members(), false, true), Step::Done);
        let unready = vec![
            pod("db-0", true, false),
            pod("db-1", true, false),
            pod("db-2", true, true),
        ];
        assert!(
            matches!(next(&unready, 2, "db-2", &members(), false, true), Step::Wait(why) if why.contains("scaling down"))
        );
    }

    #[test]
    fn before_initialisation_pods_restart_in_order_ready_or_not() {
        let pods = vec![
            pod("db-0", false, false),
            pod("db-1", false, true),
            pod("db-2", true, false),
        ];
        assert_eq!(
            next(&pods, 3, "db-0", &[], false, false),
            Step::Restart("db-1".into())
        );
        let pods = vec![
            pod("db-0", false, false),
            pod("db-1", true, false),
            pod("db-2", true, false),
        ];
        assert_eq!(
            next(&pods, 3, "db-0", &[], false, false),
            Step::Restart("db-0".into())
        );
    }

    #[test]
    fn a_missing_pod_is_waited_for() {
        let pods = vec![pod("db-0", false, true), pod("db-1", false, true)];
        assert!(matches!(
            next(&pods, 3, "db-0", &members(), false, true),
            Step::Wait(_)
        ));
    }
}
