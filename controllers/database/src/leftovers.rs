//! Instance pods left behind by a StatefulSet that was replaced (pure).
//!
//! When a cluster's StatefulSet is deleted, the garbage collector deletes
//! its pods, and the StatefulSet this controller applies again creates them
//! anew. The collector can miss them for good: when the StatefulSet is
//! deleted and re-created under the same name while its watch is down (an
//! API server restart), its relist sees one StatefulSet changed, not one
//! gone, and it never looks at the old one's pods again (found by the chaos
//! run). Such a pod blocks its ordinal: the new StatefulSet cannot create a
//! pod of that name, so the cluster never converges. Once the current
//! StatefulSet is older than the collector's grace ([`COLLECTOR_GRACE`]
//! unless `CAIRN_COLLECTOR_GRACE_SECONDS` says otherwise), the controller
//! deletes what the collector should have.

use std::time::Duration;

use cairn_runtime::conditions::Time;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

/// How long the garbage collector gets, by default, to delete a replaced
/// StatefulSet's pods itself (it takes well under a second when its watches
/// are up).
pub const COLLECTOR_GRACE: Duration = Duration::from_secs(60);

/// `CAIRN_COLLECTOR_GRACE_SECONDS`, or [`COLLECTOR_GRACE`] without it: how
/// long the garbage collector gets to delete a replaced StatefulSet's pods
/// before the controller does.
pub fn collector_grace_from_env() -> Result<Duration, String> {
    match std::env::var("CAIRN_COLLECTOR_GRACE_SECONDS") {
        Err(_) => Ok(COLLECTOR_GRACE),
        Ok(value) => match value.parse::<u64>() {
            Ok(seconds) if seconds > 0 => Ok(Duration::from_secs(seconds)),
            _ => Err(format!(
                "CAIRN_COLLECTOR_GRACE_SECONDS={value}: a whole number of seconds, at least 1"
            )),
        },
    }
}

/// A pod to delete: its name and uid (the precondition of the delete).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leftover {
    pub pod: String,
    pub uid: String,
    /// The uid of the StatefulSet it still names as its controller.
    pub owner_uid: String,
}

/// What to do about the pods of earlier StatefulSets of this name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Past the grace: delete these.
    pub collect: Vec<Leftover>,
    /// Within the grace: look again after this.
    pub recheck: Option<Duration>,
}

/// The pods whose controller is a StatefulSet of the current one's name but
/// another uid, and are not being deleted already: collected once the
/// current one is `grace` old.
pub fn leftovers(
    stateful_set: &StatefulSet,
    pods: &[&Pod],
    now: &Time,
    grace: Duration,
) -> Leftovers {
    let (Some(name), Some(uid)) = (
        stateful_set.metadata.name.as_deref(),
        stateful_set.metadata.uid.as_deref(),
    ) else {
        return Leftovers::default();
    };
    let left: Vec<Leftover> = pods
        .iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .filter_map(|pod| {
            let owner = pod
                .owner_references()
                .iter()
                .find(|o| o.controller == Some(true))?;
            (owner.kind == "StatefulSet" && owner.name == name && owner.uid != uid).then(|| {
                Leftover {
                    pod: pod.name_any(),
                    uid: pod.uid().unwrap_or_default(),
                    owner_uid: owner.uid.clone(),
                }
            })
        })
        .collect();
    if left.is_empty() {
        return Leftovers::default();
    }
    let age = stateful_set
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(|created| now.0.duration_since(created.0).try_into().ok())
        .unwrap_or(Duration::ZERO);
    match grace.checked_sub(age).filter(|d| !d.is_zero()) {
        Some(remaining) => Leftovers {
            collect: Vec::new(),
            recheck: Some(remaining),
        },
        None => Leftovers {
            collect: left,
            recheck: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use k8s_openapi::jiff::{SignedDuration, Timestamp};

    fn stateful_set(uid: &str, created: Timestamp) -> StatefulSet {
        let mut sts = StatefulSet::default();
        sts.metadata.name = Some("db".into());
        sts.metadata.uid = Some(uid.into());
        sts.metadata.creation_timestamp = Some(Time(created));
        sts
    }

    fn pod(name: &str, owner_uid: &str, deleting: bool) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.metadata.uid = Some(format!("pod-{name}"));
        pod.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: "StatefulSet".into(),
            name: "db".into(),
            uid: owner_uid.into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        if deleting {
            pod.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        }
        pod
    }

    #[test]
    fn a_pod_of_a_replaced_stateful_set_is_collected_after_the_grace() {
        let created = Timestamp::now();
        let sts = stateful_set("new", created);
        let old = pod("db-0", "old", false);
        let current = pod("db-1", "new", false);
        let going = pod("db-2", "old", true);
        let pods = [&old, &current, &going];

        let young = leftovers(
            &sts,
            &pods,
            &Time(created + SignedDuration::from_secs(20)),
            COLLECTOR_GRACE,
        );
        assert_eq!(young.collect, Vec::new());
        assert_eq!(young.recheck, Some(Duration::from_secs(40)));

        let old_enough = leftovers(
            &sts,
            &pods,
            &Time(created + SignedDuration::from_secs(61)),
            COLLECTOR_GRACE,
        );
        assert_eq!(
            old_enough.collect,
            vec![Leftover {
                pod: "db-0".into(),
                uid: "pod-db-0".into(),
                owner_uid: "old".into(),
            }]
        );
        assert_eq!(old_enough.recheck, None);
    }

    #[test]
    fn pods_of_the_current_stateful_set_are_never_leftovers() {
        let created = Timestamp::now() - SignedDuration::from_secs(3600);
        let sts = stateful_set("new", created);
        let current = pod("db-0", "new", false);
        let mut unowned = pod("db-1", "new", false);
        unowned.metadata.owner_references = None;
        let found = leftovers(
            &sts,
            &[&current, &unowned],
            &Time(Timestamp::now()),
            COLLECTOR_GRACE,
        );
        assert_eq!(found, Leftovers::default());
    }
}
