//! Switchover on request (pure): `kubectl annotate dbc NAME
//! database.cairn.dev/switchover-to=POD`. The old primary is demoted first
//! (relabelled replica: it stops, sending its last WAL to the streaming
//! replicas), the target is promoted only once it has replayed all of it, so
//! no committed transaction is lost. Applied by `reconcile`; the progress is
//! in `status.lastSwitchover`.
//!
//! A switchover leaves the cluster without a primary on purpose, and holds
//! failover off meanwhile, so it has a deadline: unpromoted after
//! [`DEADLINE`] (the target restarted, or never received the shutdown
//! checkpoint) it is given up, the old primary is labelled primary again,
//! and failover watches it as any primary. Giving up is safe at any moment,
//! so the deadline is read from wall clocks: no replica was promoted, and
//! the old primary holds every write it acknowledged.

use std::time::Duration;

use cairn_api::database::instance::{ROLE_PRIMARY, ROLE_REPLICA, parse_lsn};
pub use cairn_api::database::v1::SWITCHOVER_ANNOTATION;
use cairn_api::database::v1::SwitchoverRecord;
use k8s_openapi::jiff::Timestamp;

use crate::failover::Member;

#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Nothing requested, or done.
    None,
    /// The request cannot be carried out; why.
    Refuse(String),
    /// Start: demote `from` (no pod labelled primary until the promotion).
    Demote { from: String, to: String },
    /// The old primary is stopping, or the target has not replayed all of
    /// its WAL yet; why.
    Wait(String),
    /// The target has everything: promote it.
    Promote,
    /// Unpromoted past the deadline: give it up; why.
    Abandon(String),
}

/// How long a switchover may go without promoting its target: a fast
/// shutdown, an immediate one after it, and the target's catching up take
/// seconds.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// How long after giving up a switchover the same target is not tried
/// again: the annotation is a lasting request, and each try stops writes.
pub const RETRY_AFTER: Duration = Duration::from_secs(300);

/// The next step towards `requested`, given the current primary, the record
/// of the switchover under way (or the last one), and the members.
pub fn next(
    requested: Option<&str>,
    primary: &str,
    record: Option<&SwitchoverRecord>,
    members: &[Member],
    now: Timestamp,
) -> Step {
    if let Some(record) = under_way(record) {
        return match progress(record, members) {
            Step::Wait(why) if seconds_since(&record.started_at, now) >= DEADLINE.as_secs() => {
                Step::Abandon(format!(
                    "{} was not promoted within {} s ({why}): {} is the primary again",
                    record.to,
                    DEADLINE.as_secs(),
                    record.from
                ))
            }
            step => step,
        };
    }
    let Some(target) = requested else {
        return Step::None;
    };
    if target == primary {
        return Step::None; // done, or nothing to do
    }
    if let Some(last) = record
        && last.to == target
        && let (Some(why), Some(at)) = (&last.abandoned, &last.completed_at)
        && seconds_since(at, now) < RETRY_AFTER.as_secs()
    {
        return Step::Refuse(format!(
            "the switchover to {target} was given up {} s ago ({why}); it is tried again {} s after that",
            seconds_since(at, now),
            RETRY_AFTER.as_secs()
        ));
    }
    let Some(member) = members.iter().find(|m| m.pod == target) else {
        return Step::Refuse(format!("{target} is not an instance of this cluster"));
    };
    if !(member.observed.ready && member.observed.role.as_deref() == Some(ROLE_REPLICA)) {
        return Step::Refuse(format!("{target} is not a ready replica"));
    }
    let serving = crate::failover::serving(members, primary).is_some();
    if !serving {
        return Step::Refuse(format!(
            "the primary {primary} is not serving: a failover, not a switchover, replaces it"
        ));
    }
    Step::Demote {
        from: primary.to_owned(),
        to: target.to_owned(),
    }
}

/// The switchover recorded and not yet promoted nor given up, if there is one.
pub fn under_way(record: Option<&SwitchoverRecord>) -> Option<&SwitchoverRecord> {
    record.filter(|r| r.promoted_at.is_none() && r.abandoned.is_none())
}

fn seconds_since(
    then: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    now: Timestamp,
) -> u64 {
    u64::try_from(now.duration_since(then.0).as_secs()).unwrap_or(0)
}

fn progress(record: &SwitchoverRecord, members: &[Member]) -> Step {
    let find = |pod: &str| members.iter().find(|m| m.pod == pod);
    let Some(old) = find(&record.from) else {
        return Step::Wait(format!("{} has no membership Lease", record.from));
    };
    if old.observed.role.as_deref() == Some(ROLE_PRIMARY) {
        return Step::Wait(format!("{} is still running as the primary", record.from));
    }
    let Some(target) = find(&record.to) else {
        return Step::Wait(format!("{} has no membership Lease", record.to));
    };
    // The old primary reports its shutdown checkpoint once stopped; the
    // streaming replicas received everything up to and including it.
    let Some(last) = old
        .observed
        .shutdown_position
        .as_deref()
        .and_then(parse_lsn)
    else {
        return Step::Wait(format!("{} is stopping", record.from));
    };
    let position = |text: &Option<String>| text.as_deref().and_then(parse_lsn);
    match (
        position(&target.observed.received_position),
        position(&target.observed.wal_position),
    ) {
        (Some(received), Some(replayed)) if received > last && replayed >= received => {
            Step::Promote
        }
        _ => Step::Wait(format!(
            "{} has not replayed all of {}'s WAL yet",
            record.to, record.from
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_api::database::instance::ObservedState;

    fn member(pod: &str, role: Option<&str>, received: &str, replayed: &str) -> Member {
        Member {
            pod: pod.to_owned(),
            last_seen: None,
            silent: None,
            written: None,
            observed: ObservedState {
                ready: role.is_some(),
                role: role.map(str::to_owned),
                received_position: Some(received.to_owned()),
                wal_position: Some(replayed.to_owned()),
                ..ObservedState::default()
            },
            fenced: false,
            fence_after: None,
        }
    }

    fn record() -> SwitchoverRecord {
        SwitchoverRecord {
            from: "db-0".into(),
            to: "db-1".into(),
            started_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
            promoted_at: None,
            completed_at: None,
            write_unavailable_seconds: None,
            abandoned: None,
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).expect("valid")
    }

    #[test]
    fn a_request_for_a_ready_replica_demotes_the_primary() {
        let members = [
            member("db-0", Some("primary"), "0/5", "0/5"),
            member("db-1", Some("replica"), "0/5", "0/5"),
        ];
        assert_eq!(
            next(Some("db-1"), "db-0", None, &members, at(1)),
            Step::Demote {
                from: "db-0".into(),
                to: "db-1".into()
            }
        );
        assert_eq!(
            next(Some("db-0"), "db-0", None, &members, at(1)),
            Step::None
        );
        assert_eq!(next(None, "db-0", None, &members, at(1)), Step::None);
        assert!(matches!(
            next(Some("db-7"), "db-0", None, &members, at(1)),
            Step::Refuse(_)
        ));
    }

    #[test]
    fn the_target_is_promoted_only_after_the_old_primary_stopped_and_all_was_replayed() {
        let running = [
            member("db-0", Some("primary"), "0/9", "0/9"),
            member("db-1", Some("replica"), "0/9", "0/9"),
        ];
        assert!(matches!(
            next(Some("db-1"), "db-0", Some(&record()), &running, at(1)),
            Step::Wait(w) if w.contains("still running")
        ));
        let mut stopped = member("db-0", None, "0/0", "0/0");
        stopped.observed.shutdown_position = Some("0/98".into());
        let stopping = [
            member("db-0", None, "0/0", "0/0"),
            member("db-1", Some("replica"), "0/A0", "0/A0"),
        ];
        assert!(matches!(
            next(Some("db-1"), "db-0", Some(&record()), &stopping, at(1)),
            Step::Wait(w) if w.contains("stopping")
        ));
        let behind = [
            stopped.clone(),
            member("db-1", Some("replica"), "0/A0", "0/90"),
        ];
        assert!(matches!(
            next(Some("db-1"), "db-0", Some(&record()), &behind, at(1)),
            Step::Wait(w) if w.contains("not replayed")
        ));
        let caught_up = [stopped, member("db-1", Some("replica"), "0/A0", "0/A0")];
        assert_eq!(
            next(Some("db-1"), "db-0", Some(&record()), &caught_up, at(1)),
            Step::Promote
        );
    }

    #[test]
    fn a_switchover_not_promoted_by_its_deadline_is_given_up() {
        // The target restarted: it never reports the old primary's WAL.
        let mut stopped = member("db-0", Some("replica"), "0/0", "0/0");
        stopped.observed.shutdown_position = Some("0/98".into());
        let members = [stopped, member("db-1", None, "0/0", "0/0")];
        let deadline = i64::try_from(DEADLINE.as_secs()).expect("small");
        assert!(matches!(
            next(
                Some("db-1"),
                "db-0",
                Some(&record()),
                &members,
                at(deadline - 1)
            ),
            Step::Wait(_)
        ));
        assert!(matches!(
            next(Some("db-1"), "db-0", Some(&record()), &members, at(deadline)),
            Step::Abandon(why) if why.contains("db-0 is the primary again") && why.contains("not replayed")
        ));
    }

    #[test]
    fn a_target_given_up_is_tried_again_only_after_a_while() {
        let mut given_up = record();
        given_up.completed_at = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(60)));
        given_up.abandoned = Some("db-1 was not promoted within 60 s".into());
        assert_eq!(under_way(Some(&given_up)), None);
        let members = [
            member("db-0", Some("primary"), "0/5", "0/5"),
            member("db-1", Some("replica"), "0/5", "0/5"),
            member("db-2", Some("replica"), "0/5", "0/5"),
        ];
        let retry = 60 + i64::try_from(RETRY_AFTER.as_secs()).expect("small");
        assert!(matches!(
            next(Some("db-1"), "db-0", Some(&given_up), &members, at(retry - 1)),
            Step::Refuse(why) if why.contains("given up")
        ));
        let demote = |to: &str| Step::Demote {
            from: "db-0".into(),
            to: to.into(),
        };
        assert_eq!(
            next(Some("db-1"), "db-0", Some(&given_up), &members, at(retry)),
            demote("db-1")
        );
        assert_eq!(
            next(Some("db-2"), "db-0", Some(&given_up), &members, at(61)),
            demote("db-2")
        );
    }
}
