//! Node drains (pure). A node that is cordoned (`kubectl drain`, an
//! upgrade), or tainted by an autoscaler for removal, is about to have its
//! pods evicted. The primary's eviction is held by its own disruption
//! budget (`build::disruption_budgets`), so a drain waits while the
//! primary is switched over, as planned, to a ready replica on a node that
//! stays; once relabelled a replica, the old primary may be evicted like
//! any replica. Without this, the eviction would stop the primary and a
//! failover (the delay, then a promotion) would replace it.

use std::collections::BTreeSet;

use cairn_api::database::instance::{ROLE_REPLICA, parse_lsn};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;

use crate::failover::Member;

/// Taints that announce a node's removal: the one `kubectl cordon` sets
/// with `spec.unschedulable`, the cluster autoscaler's, and Karpenter's
/// (v1, and the annotation-era one before it).
pub const DRAIN_TAINTS: &[&str] = &[
    "node.kubernetes.io/unschedulable",
    "ToBeDeletedByClusterAutoscaler",
    "karpenter.sh/disrupted",
    "karpenter.sh/disruption",
];

/// Cordoned, or tainted for removal.
pub fn is_draining(node: &Node) -> bool {
    let Some(spec) = node.spec.as_ref() else {
        return false;
    };
    spec.unschedulable == Some(true)
        || spec
            .taints
            .iter()
            .flatten()
            .any(|taint| DRAIN_TAINTS.contains(&taint.key.as_str()))
}

/// The instance pods scheduled on a draining node, given a lookup of nodes
/// by name (a node not found is not draining: it may not be cached yet).
pub fn pods_on_draining_nodes<'a, N>(
    pods: impl IntoIterator<Item = &'a Pod>,
    node: impl Fn(&str) -> Option<N>,
) -> BTreeSet<String>
where
    N: AsRef<Node>,
{
    pods.into_iter()
        .filter(|pod| {
            pod.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .and_then(&node)
                .is_some_and(|n| is_draining(n.as_ref()))
        })
        .map(ResourceExt::name_any)
        .collect()
}

/// What a drain asks of the primary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Move {
    /// Its node is not draining.
    Stay,
    /// Switch over to this replica first.
    To(String),
    /// Its node is draining and no replica can take over; why.
    Blocked(String),
}

/// Where the primary goes when its node drains: the ready replica on a node
/// that stays that has replayed the most WAL (the lowest ordinal on a tie).
pub fn primary_move(primary: &str, draining: &BTreeSet<String>, members: &[Member]) -> Move {
    if !draining.contains(primary) {
        return Move::Stay;
    }
    let target = members
        .iter()
        .filter(|m| m.pod != primary && !draining.contains(&m.pod))
        .filter(|m| m.observed.ready && m.observed.role.as_deref() == Some(ROLE_REPLICA))
        .map(|m| {
            let replayed = m.observed.wal_position.as_deref().and_then(parse_lsn);
            let ordinal = std::cmp::Reverse(crate::rollout::ordinal(&m.pod));
            (replayed, ordinal, &m.pod)
        })
        .max();
    match target {
        Some((_, _, pod)) => Move::To(pod.clone()),
        None => Move::Blocked(format!(
            "the node of {primary}, the primary, is being drained, and no ready replica on \
             another node can take over: its eviction waits"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_api::database::instance::{ObservedState, ROLE_PRIMARY};
    use k8s_openapi::api::core::v1::{NodeSpec, PodSpec, Taint};
    use kube::api::ObjectMeta;

    fn node(unschedulable: bool, taint: Option<&str>) -> Node {
        Node {
            spec: Some(NodeSpec {
                unschedulable: Some(unschedulable),
                taints: taint.map(|key| {
                    vec![Taint {
                        key: key.to_owned(),
                        effect: "NoSchedule".to_owned(),
                        ..Taint::default()
                    }]
                }),
                ..NodeSpec::default()
            }),
            ..Node::default()
        }
    }

    fn pod(name: &str, node: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.to_owned()),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    fn member(pod: &str, role: &str, ready: bool, replayed: &str) -> Member {
        Member {
            pod: pod.to_owned(),
            last_seen: None,
            silent: None,
            written: None,
            observed: ObservedState {
                role: Some(role.to_owned()),
                ready,
                wal_position: Some(replayed.to_owned()),
                ..ObservedState::default()
            },
            fenced: false,
            fence_after: None,
        }
    }

    fn set(pods: &[&str]) -> BTreeSet<String> {
        pods.iter().map(|p| (*p).to_owned()).collect()
    }

    #[test]
    fn a_cordoned_or_removal_tainted_node_is_draining() {
        assert!(is_draining(&node(true, None)));
        assert!(is_draining(&node(
            false,
            Some("ToBeDeletedByClusterAutoscaler")
        )));
        assert!(is_draining(&node(false, Some("karpenter.sh/disrupted"))));
        assert!(!is_draining(&node(false, None)));
        assert!(!is_draining(&node(false, Some("dedicated"))));
        assert!(!is_draining(&Node::default()));
    }

    #[test]
    fn only_the_pods_of_draining_nodes_are_named() {
        let pods = [pod("db-0", "a"), pod("db-1", "b"), pod("db-2", "unknown")];
        let nodes = |name: &str| match name {
            "a" => Some(Box::new(node(true, None))),
            "b" => Some(Box::new(node(false, None))),
            _ => None,
        };
        assert_eq!(pods_on_draining_nodes(&pods, nodes), set(&["db-0"]));
    }

    #[test]
    fn a_draining_primary_moves_to_the_most_advanced_ready_replica_that_stays() {
        let members = [
            member("db-0", ROLE_PRIMARY, true, "0/5000000"),
            member("db-1", ROLE_REPLICA, true, "0/4000000"),
            member("db-2", ROLE_REPLICA, true, "0/4800000"),
        ];
        assert_eq!(primary_move("db-0", &set(&[]), &members), Move::Stay);
        assert_eq!(
            primary_move("db-0", &set(&["db-1"]), &members),
            Move::Stay,
            "a replica's drain moves nothing"
        );
        assert_eq!(
            primary_move("db-0", &set(&["db-0"]), &members),
            Move::To("db-2".to_owned())
        );
        assert_eq!(
            primary_move("db-0", &set(&["db-0", "db-2"]), &members),
            Move::To("db-1".to_owned()),
            "never to a replica whose node drains too"
        );
    }

    #[test]
    fn without_a_ready_replica_elsewhere_the_drain_waits() {
        let members = [
            member("db-0", ROLE_PRIMARY, true, "0/5000000"),
            member("db-1", ROLE_REPLICA, false, "0/5000000"),
        ];
        let Move::Blocked(why) = primary_move("db-0", &set(&["db-0"]), &members) else {
            panic!("an unready replica was chosen");
        };
        assert!(why.contains("no ready replica"), "{why}");
    }
}
