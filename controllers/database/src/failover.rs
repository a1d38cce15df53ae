//! Who should be the primary (pure): the members' heartbeats and observed
//! states in, a decision out. Applied by `reconcile`.

use std::time::Duration;

use cairn_api::database::instance::{
    FENCED_ANNOTATION, OBSERVED_ANNOTATION, ObservedState, ROLE_PRIMARY, ROLE_REPLICA, parse_lsn,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

/// One instance as its membership Lease shows it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Member {
    pub pod: String,
    /// Its last heartbeat, or when its Lease was created if it never beat.
    pub last_seen: Option<Timestamp>,
    pub observed: ObservedState,
    /// Deposed by a failover; it must not serve as a primary.
    pub fenced: bool,
}

impl Member {
    pub fn from_lease(lease: &Lease) -> Self {
        let renewed = lease
            .spec
            .as_ref()
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| t.0);
        let created = lease.metadata.creation_timestamp.as_ref().map(|t| t.0);
        let annotations = lease.annotations();
        Self {
            pod: lease.name_any(),
            last_seen: renewed.or(created),
            observed: annotations
                .get(OBSERVED_ANNOTATION)
                .and_then(|json| serde_json::from_str(json).ok())
                .unwrap_or_default(),
            fenced: annotations.get(FENCED_ANNOTATION).map(String::as_str) == Some("true"),
        }
    }

    fn silent_for(&self, now: Timestamp) -> Option<Duration> {
        let since = now.duration_since(self.last_seen?);
        Some(Duration::try_from(since).unwrap_or_default())
    }

    /// Serving writes: postgres answers as a primary and is ready.
    pub fn serves_as_primary(&self) -> bool {
        self.observed.ready && self.observed.role.as_deref() == Some(ROLE_PRIMARY) && !self.fenced
    }

    fn received(&self) -> u64 {
        [
            &self.observed.received_position,
            &self.observed.wal_position,
        ]
        .into_iter()
        .filter_map(|p| parse_lsn(p.as_deref()?))
        .max()
        .unwrap_or(0)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Policy {
    /// How long the primary may be silent, or not serving, before it is lost.
    pub delay: Duration,
    pub max_lag_bytes: Option<u64>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// The primary serves (or may still come back): look again by `recheck`.
    Keep { recheck: Duration },
    /// The primary is lost: promote `to`.
    Promote {
        to: String,
        reason: String,
        primary_last_seen: Timestamp,
    },
    /// The primary is lost and no replica may take over; `reason` says why.
    Wait { reason: String, recheck: Duration },
}

/// Decides for a cluster whose current primary is `primary`.
/// `not_serving_for`: how long the controller has seen the primary heartbeat
/// while not serving (postgres down, bootstrap refused...).
pub fn decide(
    primary: &str,
    members: &[Member],
    not_serving_for: Option<Duration>,
    policy: Policy,
    now: Timestamp,
) -> Decision {
    let current = members.iter().find(|m| m.pod == primary);
    let lost = match current {
        None => Some("its membership Lease is missing".to_owned()),
        Some(m) => match m.silent_for(now) {
            Some(silent) if silent > policy.delay => {
                Some(format!("no heartbeat for {} s", silent.as_secs()))
            }
            _ => not_serving_for
                .filter(|d| *d > policy.delay)
                .map(|d| not_serving(m, d)),
        },
    };
    let Some(reason) = lost else {
        let silent = current.and_then(|m| m.silent_for(now)).unwrap_or_default();
        let until_stale = policy.delay.saturating_sub(silent);
        let until_unserving =
            not_serving_for.map_or(policy.delay, |d| policy.delay.saturating_sub(d));
        return Decision::Keep {
            recheck: until_stale.min(until_unserving) + Duration::from_millis(500),
        };
    };
    let recheck = Duration::from_secs(2);
    let primary_position = current.and_then(|m| parse_lsn(m.observed.wal_position.as_deref()?));
    let mut candidates: Vec<&Member> = members
        .iter()
        .filter(|m| m.pod != primary)
        .filter(|m| m.silent_for(now).is_some_and(|s| s <= policy.delay))
        .filter(|m| m.observed.role.as_deref() == Some(ROLE_REPLICA))
        .collect();
    if candidates.is_empty() {
        return Decision::Wait {
            reason: format!("primary {primary} lost ({reason}), and no replica is running"),
            recheck,
        };
    }
    if let (Some(bound), Some(position)) = (policy.max_lag_bytes, primary_position) {
        candidates.retain(|m| position.saturating_sub(m.received()) <= bound);
        if candidates.is_empty() {
            return Decision::Wait {
                reason: format!(
                    "primary {primary} lost ({reason}), and every replica is more than \
                     spec.failover.maxLagBytes ({bound}) behind it: waiting for it to return"
                ),
                recheck,
            };
        }
    }
    // The newest timeline, then the most WAL received; ties to the lowest ordinal.
    let best = candidates.into_iter().min_by_key(|m| {
        (
            std::cmp::Reverse(m.observed.timeline.unwrap_or(0)),
            std::cmp::Reverse(m.received()),
            ordinal(&m.pod),
        )
    });
    match best {
        Some(to) => Decision::Promote {
            to: to.pod.clone(),
            reason,
            primary_last_seen: current.and_then(|m| m.last_seen).unwrap_or(now),
        },
        None => Decision::Wait { reason, recheck },
    }
}

fn not_serving(member: &Member, for_: Duration) -> String {
    let why = member
        .observed
        .problem
        .clone()
        .unwrap_or_else(|| "postgres is not serving".to_owned());
    format!("not serving for {} s: {why}", for_.as_secs())
}

fn ordinal(pod: &str) -> u32 {
    pod.rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: Policy = Policy {
        delay: Duration::from_secs(10),
        max_lag_bytes: None,
    };

    fn now() -> Timestamp {
        Timestamp::from_second(1_700_000_100).expect("valid")
    }

    fn member(pod: &str, seconds_ago: i64, role: &str, timeline: u32, received: &str) -> Member {
        Member {
            pod: pod.to_owned(),
            last_seen: Some(Timestamp::from_second(1_700_000_100 - seconds_ago).expect("valid")),
            observed: ObservedState {
                ready: true,
                role: Some(role.to_owned()),
                timeline: Some(timeline),
                wal_position: Some(received.to_owned()),
                received_position: Some(received.to_owned()),
                ..ObservedState::default()
            },
            fenced: false,
        }
    }

    fn promoted(decision: &Decision) -> Option<&str> {
        match decision {
            Decision::Promote { to, .. } => Some(to),
            _ => None,
        }
    }

    #[test]
    fn a_primary_with_a_fresh_heartbeat_stays() {
        let members = [
            member("db-0", 1, "primary", 1, "0/5000000"),
            member("db-1", 1, "replica", 1, "0/5000000"),
        ];
        let decision = decide("db-0", &members, None, POLICY, now());
        assert_eq!(
            decision,
            Decision::Keep {
                recheck: Duration::from_millis(9500)
            }
        );
    }

    #[test]
    fn a_silent_primary_is_replaced_by_the_most_advanced_replica_on_the_newest_timeline() {
        let members = [
            member("db-0", 11, "primary", 2, "0/9000000"),
            member("db-1", 1, "replica", 1, "0/9000000"),
            member("db-2", 1, "replica", 2, "0/8000000"),
            member("db-3", 1, "replica", 2, "0/8800000"),
        ];
        let decision = decide("db-0", &members, None, POLICY, now());
        assert_eq!(promoted(&decision), Some("db-3"));
        let Decision::Promote { reason, .. } = decision else {
            unreachable!()
        };
        assert_eq!(reason, "no heartbeat for 11 s");
    }

    #[test]
    fn silence_within_the_delay_is_not_a_loss() {
        let members = [
            member("db-0", 9, "primary", 1, "0/1"),
            member("db-1", 1, "replica", 1, "0/1"),
        ];
        assert!(matches!(
            decide("db-0", &members, None, POLICY, now()),
            Decision::Keep { .. }
        ));
    }

    #[test]
    fn a_primary_not_serving_for_longer_than_the_delay_is_lost() {
        let mut primary = member("db-0", 1, "primary", 1, "0/1");
        primary.observed.role = None;
        primary.observed.problem = Some("refusing to run initdb".into());
        let members = [primary, member("db-1", 1, "replica", 1, "0/1")];
        let within = decide(
            "db-0",
            &members,
            Some(Duration::from_secs(5)),
            POLICY,
            now(),
        );
        assert!(matches!(within, Decision::Keep { .. }));
        let after = decide(
            "db-0",
            &members,
            Some(Duration::from_secs(11)),
            POLICY,
            now(),
        );
        assert_eq!(promoted(&after), Some("db-1"));
    }

    #[test]
    fn silent_or_stopped_replicas_are_not_candidates() {
        let mut stopped = member("db-2", 1, "replica", 1, "0/9");
        stopped.observed.role = None;
        let members = [
            member("db-0", 30, "primary", 1, "0/9"),
            member("db-1", 30, "replica", 1, "0/9"),
            stopped,
        ];
        let decision = decide("db-0", &members, None, POLICY, now());
        assert!(
            matches!(&decision, Decision::Wait { reason, .. } if reason.contains("no replica is running")),
            "{decision:?}"
        );
    }

    #[test]
    fn the_lag_bound_excludes_replicas_too_far_behind() {
        let members = [
            member("db-0", 30, "primary", 1, "0/2000000"),
            member("db-1", 1, "replica", 1, "0/1000000"),
        ];
        let bounded = Policy {
            max_lag_bytes: Some(1024),
            ..POLICY
        };
        let decision = decide("db-0", &members, None, bounded, now());
        assert!(
            matches!(&decision, Decision::Wait { reason, .. } if reason.contains("maxLagBytes")),
            "{decision:?}"
        );
        let loose = Policy {
            max_lag_bytes: Some(0x100_0000),
            ..POLICY
        };
        assert_eq!(
            promoted(&decide("db-0", &members, None, loose, now())),
            Some("db-1")
        );
    }

    #[test]
    fn a_missing_lease_is_a_lost_primary() {
        let members = [member("db-1", 1, "replica", 1, "0/1")];
        assert_eq!(
            promoted(&decide("db-0", &members, None, POLICY, now())),
            Some("db-1")
        );
    }
}
