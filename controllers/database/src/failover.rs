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
    /// Its last heartbeat, or when its Lease was created if it never beat:
    /// its own node's clock, for records and messages only.
    pub last_seen: Option<Timestamp>,
    /// How long this controller has seen that heartbeat unchanged, on its
    /// own monotonic clock (`context::members`); None when not known.
    pub silent: Option<Duration>,
    /// The highest WAL position this controller saw it report on its
    /// timeline (`context::members`): kept across a report whose sample
    /// failed, so a lag bound is still checked against it.
    pub written: Option<u64>,
    pub observed: ObservedState,
    /// Deposed by a failover; it must not serve as a primary.
    pub fenced: bool,
    /// How long after its last renewal it fences itself, as it says in its
    /// Lease (`spec.leaseDurationSeconds`): the bound it runs with, which a
    /// spec changed since does not move until its pod restarts.
    pub fence_after: Option<Duration>,
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
            silent: None,
            written: None,
            observed: annotations
                .get(OBSERVED_ANNOTATION)
                .and_then(|json| serde_json::from_str(json).ok())
                .unwrap_or_default(),
            fenced: annotations.get(FENCED_ANNOTATION).map(String::as_str) == Some("true"),
            fence_after: lease
                .spec
                .as_ref()
                .and_then(|s| s.lease_duration_seconds)
                .and_then(|seconds| u64::try_from(seconds).ok())
                .map(Duration::from_secs),
        }
    }

    /// Serving writes: postgres answers as a primary and is ready.
    pub fn serves_as_primary(&self) -> bool {
        self.observed.ready && self.observed.role.as_deref() == Some(ROLE_PRIMARY) && !self.fenced
    }

    /// Heard from within the delay, running postgres as a replica: one that
    /// may be promoted.
    fn runs_as_replica(&self, delay: Duration) -> bool {
        self.silent.is_some_and(|s| s <= delay)
            && self.observed.role.as_deref() == Some(ROLE_REPLICA)
    }

    /// It hears `primary` claim writes (the instance's `peers`).
    fn hears(&self, primary: &str) -> bool {
        self.observed.hears_primary.as_deref() == Some(primary)
    }

    /// Its WAL position as reported now, or else the last one seen.
    fn last_known_position(&self) -> Option<u64> {
        let reported = self.observed.wal_position.as_deref().and_then(parse_lsn);
        reported.max(self.written)
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

/// The member `pod`, if it serves writes as the primary.
pub fn serving<'a>(members: &'a [Member], pod: &str) -> Option<&'a Member> {
    members
        .iter()
        .find(|m| m.pod == pod && m.serves_as_primary())
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Policy {
    /// How long the primary may be silent, or not serving, before it is lost.
    pub delay: Duration,
    /// How long a primary that reports postgres starting up (crash
    /// recovery) may not serve; the delay if that is longer.
    pub start_timeout: Duration,
    pub max_lag_bytes: Option<u64>,
    pub quorum: Option<Quorum>,
}

/// Synchronous replication: a commit was acknowledged once `synchronous` of
/// the instances with ordinals below `instances` (the primary excepted)
/// flushed it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Quorum {
    pub synchronous: u32,
    pub instances: u32,
}

impl Quorum {
    /// Replicas that must report so that one of them holds every
    /// acknowledged commit: any `listed - synchronous + 1` of the listed
    /// replicas meet every set of `synchronous` that confirmed a commit.
    fn needed(self, primary: &str) -> usize {
        let listed = (0..self.instances)
            .filter(|o| Some(*o) != ordinal_of(primary))
            .count();
        listed.saturating_sub(self.synchronous as usize) + 1
    }

    fn lists(self, pod: &str) -> bool {
        ordinal_of(pod).is_some_and(|o| o < self.instances)
    }
}

/// The quorum a primary ran (`synchronous_standby_names`): `FIRST n (...)`
/// or a bare list is read as any `n` of the list, since which standbys have
/// the highest priority changes as they connect.
#[derive(Clone, Debug, PartialEq)]
struct RunningQuorum {
    synchronous: usize,
    listed: Vec<String>,
}

impl RunningQuorum {
    /// None when it cannot be read or names no replica (`*`).
    fn parse(setting: &str) -> Option<Self> {
        let setting = setting.trim();
        if setting.is_empty() {
            return Some(Self {
                synchronous: 0,
                listed: Vec::new(),
            });
        }
        let (synchronous, list) = match setting.split_once('(') {
            Some((head, list)) => {
                let words: Vec<&str> = head.split_whitespace().collect();
                let count = match words.as_slice() {
                    [method, n] if ["any", "first"].contains(&method.to_lowercase().as_str()) => n,
                    [n] => n,
                    _ => return None,
                };
                (count.parse().ok()?, list.strip_suffix(')')?)
            }
            None => (1, setting),
        };
        let listed: Vec<String> = list
            .split(',')
            .map(|name| name.trim().trim_matches('"').to_owned())
            .collect();
        if listed.iter().any(|name| name.is_empty() || name == "*") {
            return None;
        }
        Some(Self {
            synchronous,
            listed,
        })
    }

    fn lists(&self, pod: &str) -> bool {
        self.listed.iter().any(|name| name == pod)
    }

    /// As `Quorum::needed`; nothing when asynchronous.
    fn needed(&self, primary: &str) -> usize {
        if self.synchronous == 0 {
            return 0;
        }
        let listed = self.listed.iter().filter(|name| *name != primary).count();
        listed.saturating_sub(self.synchronous) + 1
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// The primary serves (or may still come back): look again by `recheck`.
    Keep { recheck: Duration },
    /// The primary is lost: promote `to` (`forced` by an operator who
    /// accepts the loss of what it lacks).
    Promote {
        to: String,
        reason: String,
        primary_last_seen: Timestamp,
        forced: bool,
    },
    /// The primary is lost and no replica may take over; `reason` says why.
    Wait { reason: String, recheck: Duration },
    /// The primary renews no heartbeat, but every running replica still
    /// hears it claim to be a writable primary: it serves, cut off from the
    /// API server alone, and none would promote.
    Heard { reason: String, recheck: Duration },
}

/// The policy to fail over by when the spec cannot be trusted (it is
/// invalid, and its replication settings may be the invalid part): every
/// replica of the `instances` must report, as if each commit had waited for
/// a single replica. The most advanced of them all then holds every
/// acknowledged commit, whatever quorum the running configuration has. The
/// delay and the lag bound stay: the schema has checked them.
pub fn cautious(policy: Policy, instances: usize) -> Policy {
    Policy {
        quorum: Some(Quorum {
            synchronous: 1,
            instances: u32::try_from(instances).unwrap_or(u32::MAX),
        }),
        ..policy
    }
}

/// Decides for a cluster whose current primary is `primary`.
/// `timeline`: the cluster's, as its serving primary last reported it (the
/// status keeps it).
/// `not_serving_for`: how long the controller has seen the primary heartbeat
/// while not serving (postgres down, bootstrap refused...).
pub fn decide(
    primary: &str,
    members: &[Member],
    timeline: Option<u32>,
    not_serving_for: Option<Duration>,
    policy: Policy,
    now: Timestamp,
) -> Decision {
    let current = members.iter().find(|m| m.pod == primary);
    let delay = lost_after(policy.delay, current);
    let unserving_bound = unserving_bound(delay, policy.start_timeout, current);
    let Some(loss) = loss(current, not_serving_for, delay, unserving_bound) else {
        let silent = current.and_then(|m| m.silent).unwrap_or_default();
        let until_stale = delay.saturating_sub(silent);
        let until_unserving = not_serving_for.map_or(delay, |d| unserving_bound.saturating_sub(d));
        return Decision::Keep {
            recheck: until_stale.min(until_unserving) + Duration::from_millis(500),
        };
    };
    // Messages repeated while waiting name the loss in words that stay the
    // same from one look to the next: a status that changed every second
    // would be written every second for as long as the failover waits.
    let reason = loss.state;
    let written_ago = loss.written_ago;
    let recheck = Duration::from_secs(2);
    let primary_position = current.and_then(Member::last_known_position);
    let mut candidates: Vec<&Member> = members
        .iter()
        .filter(|m| m.pod != primary && m.runs_as_replica(policy.delay))
        .collect();
    if candidates.is_empty() {
        return Decision::Wait {
            reason: format!("primary {primary} lost ({reason}), and no replica is running"),
            recheck,
        };
    }
    // A replica that hears the primary claim writes refuses to promote (the
    // instance's `peers`); while every one does, the primary serves.
    let (hearing, not_hearing): (Vec<&Member>, Vec<&Member>) =
        candidates.iter().partition(|m| m.hears(primary));
    if not_hearing.is_empty() {
        let names: Vec<&str> = hearing.iter().map(|m| m.pod.as_str()).collect();
        return Decision::Heard {
            reason: format!(
                "primary {primary} renews no heartbeat ({reason}), but {} still hear it claim \
                 writes: it serves, cut off from the API server, and is not replaced",
                names.join(", ")
            ),
            recheck,
        };
    }
    candidates = not_hearing;
    // A replica's WAL position reaches its Lease by its next heartbeat, so a
    // report made before the primary's last write may understate what it
    // holds; promoting another replica would then leave it ahead of the new
    // timeline. Which report came after that write is judged on this
    // controller's clock, not by comparing two nodes' clocks: one first seen
    // at least a quarter of the delay after it, given that a report reaches
    // the controller within that time of being made (2.5 s by default; a
    // replica renews every 2 s). One that stays silent stops being a
    // candidate after the delay.
    let latency = delay / 4;
    let stale: Vec<&str> = candidates
        .iter()
        .filter(|m| m.silent.is_none_or(|s| s + latency > written_ago))
        .map(|m| m.pod.as_str())
        .collect();
    if !stale.is_empty() {
        return Decision::Wait {
            reason: format!(
                "primary {primary} lost ({reason}); waiting for a report from {} made after the \
                 primary's last possible write",
                stale.join(", ")
            ),
            recheck: Duration::from_secs(1),
        };
    }
    // A replica on an older timeline than the cluster's lacks every write
    // since that timeline began, however recent its report (a replica that
    // replayed the old primary's WAL past the switch cannot follow at all):
    // promoting it would lose them all, not only the last unreplicated
    // ones. It becomes a candidate once it follows the current timeline.
    let timeline = cluster_timeline(timeline, current);
    let (current_timeline, behind): (Vec<&Member>, Vec<&Member>) = candidates
        .iter()
        .partition(|m| m.observed.timeline >= timeline);
    if current_timeline.is_empty() {
        let behind = behind
            .iter()
            .map(|m| format!("{} on {}", m.pod, timeline_name(m.observed.timeline)))
            .collect::<Vec<_>>()
            .join(", ");
        return Decision::Wait {
            reason: format!(
                "primary {primary} lost ({reason}); no running replica follows the cluster's {} \
                 ({behind}): promoting one would lose every write since that timeline began; \
                 waiting for the primary or for a replica to follow it",
                timeline_name(timeline)
            ),
            recheck,
        };
    }
    candidates = current_timeline;
    if let Some(quorum) = policy.quorum {
        let needed = quorum.needed(primary);
        let reporting = candidates.iter().filter(|m| quorum.lists(&m.pod)).count();
        if reporting < needed {
            return Decision::Wait {
                reason: format!(
                    "primary {primary} lost ({reason}); with commits acknowledged by {} \
                     replica(s), {needed} replicas must report to be sure the promoted one holds \
                     every acknowledged commit, and {reporting} do: waiting for them or the primary",
                    quorum.synchronous
                ),
                recheck,
            };
        }
    }
    // The quorum the primary ran may differ from the spec's (a change that
    // had not reached its pod): both must be met, so the stricter holds.
    if let Some(setting) = current.and_then(|m| m.observed.synchronous_standby_names.as_deref()) {
        match RunningQuorum::parse(setting) {
            Some(running) => {
                let needed = running.needed(primary);
                let reporting = candidates.iter().filter(|m| running.lists(&m.pod)).count();
                if reporting < needed {
                    return Decision::Wait {
                        reason: format!(
                            "primary {primary} lost ({reason}); it ran synchronous_standby_names \
                             '{setting}', so {needed} of those replicas must report to be sure \
                             the promoted one holds every acknowledged commit, and {reporting} \
                             do: waiting for them or the primary"
                        ),
                        recheck,
                    };
                }
            }
            None => {
                return Decision::Wait {
                    reason: format!(
                        "primary {primary} lost ({reason}); it ran synchronous_standby_names \
                         '{setting}', which does not name the replicas that acknowledged its \
                         commits: waiting for the primary"
                    ),
                    recheck,
                };
            }
        }
    }
    if let Some(bound) = policy.max_lag_bytes {
        // A bound on the loss needs the primary's position: with none ever
        // reported (this controller restarted while its samples failed), no
        // replica can be shown to be within it.
        let Some(position) = primary_position else {
            return Decision::Wait {
                reason: format!(
                    "primary {primary} lost ({reason}), and its last WAL position is unknown: \
                     no replica can be shown within spec.failover.maxLagBytes ({bound}); \
                     waiting for it to return"
                ),
                recheck,
            };
        };
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
            reason: loss.record,
            primary_last_seen: current.and_then(|m| m.last_seen).unwrap_or(now),
            forced: false,
        },
        None => Decision::Wait { reason, recheck },
    }
}

/// An operator's forced promotion of `target` while a failover is blocked
/// (`blocked`, the reason `decide` waits): the quorum, the lag bound and the
/// freshness of the reports are waived, which is the data loss accepted.
/// What stays: the primary is lost (only a `Wait` is overridden), no replica
/// hears it claim writes, and the target runs as a replica on the cluster's
/// timeline (an older one would also take a timeline ID the lost primary may
/// have used). An error says why it is refused.
pub fn forced(
    primary: &str,
    members: &[Member],
    timeline: Option<u32>,
    blocked: &str,
    target: &str,
    policy: Policy,
    now: Timestamp,
) -> Result<Decision, String> {
    if target == primary {
        return Err(format!("{target} is the primary"));
    }
    let Some(member) = members.iter().find(|m| m.pod == target) else {
        return Err(format!("{target} has no membership Lease"));
    };
    if !member.runs_as_replica(policy.delay) {
        return Err(format!("{target} is not running as a replica"));
    }
    let hearing: Vec<&str> = members
        .iter()
        .filter(|m| m.hears(primary))
        .map(|m| m.pod.as_str())
        .collect();
    if !hearing.is_empty() {
        return Err(format!(
            "{} still hear {primary} claim writes: it may be serving",
            hearing.join(", ")
        ));
    }
    let current = members.iter().find(|m| m.pod == primary);
    let timeline = cluster_timeline(timeline, current);
    if member.observed.timeline < timeline {
        return Err(format!(
            "{target} is on {}, behind the cluster's {}",
            timeline_name(member.observed.timeline),
            timeline_name(timeline)
        ));
    }
    Ok(Decision::Promote {
        to: target.to_owned(),
        reason: format!("forced, accepting data loss, while {blocked}"),
        primary_last_seen: current.and_then(|m| m.last_seen).unwrap_or(now),
        forced: true,
    })
}

/// Why the primary is lost.
struct Loss {
    /// For the failover record, written once: how long it has been lost.
    record: String,
    /// For status messages, the same at every look while it stays lost.
    state: String,
    /// How long ago, at the latest, the primary can have written WAL: half
    /// the delay after this controller first saw its last heartbeat
    /// (fencing stops it then), or when it first saw it not serving.
    written_ago: Duration,
}

/// How long the primary must be silent to be lost: the failover delay, or
/// twice the fence bound the primary runs with if that is longer. A delay
/// lowered in the spec (60 → 10 s) reaches the controller at once but the
/// running primary only when its pod restarts, last in a rollout; until
/// then it would still write for 30 s after its last renewal, and a
/// failover after 10 s would make two primaries.
fn lost_after(delay: Duration, primary: Option<&Member>) -> Duration {
    primary
        .and_then(|m| m.fence_after)
        .map_or(delay, |fence| delay.max(fence * 2))
}

/// How long the primary may not serve: the delay, or the start timeout
/// while it reports postgres starting up (crash recovery replays WAL the
/// replicas may lack; Patroni's `primary_start_timeout`). Only a primary that
/// renews its heartbeat can report that: a silent one is lost after the
/// delay whatever it said last.
fn unserving_bound(delay: Duration, start_timeout: Duration, primary: Option<&Member>) -> Duration {
    match primary {
        Some(member) if member.observed.starting => delay.max(start_timeout),
        _ => delay,
    }
}

/// The primary's loss, if it is lost: silent, or without a membership
/// Lease, for longer than `delay`; or not serving for longer than
/// `unserving_bound`.
fn loss(
    current: Option<&Member>,
    not_serving_for: Option<Duration>,
    delay: Duration,
    unserving_bound: Duration,
) -> Option<Loss> {
    let Some(member) = current else {
        // A deleted Lease (by hand, or a restore of the namespace) says
        // nothing of the primary, which may still be writing: the
        // controller recreates the Lease and the primary renews it again.
        // Only a primary that renews nothing for the whole delay is lost;
        // it stopped writing half the delay after its last renewal, which
        // came before the controller first missed the Lease.
        let missing_for = not_serving_for.filter(|d| *d > delay)?;
        return Some(Loss {
            record: format!(
                "its membership Lease missing for {} s",
                missing_for.as_secs()
            ),
            state: "its membership Lease is missing".to_owned(),
            written_ago: missing_for.saturating_sub(delay / 2),
        });
    };
    if let Some(silent) = member.silent
        && silent > delay
    {
        let since = member.last_seen.map_or_else(
            || "its Lease was first seen".to_owned(),
            |seen| seen.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        );
        return Some(Loss {
            record: format!("no heartbeat for {} s", silent.as_secs()),
            state: format!("no heartbeat since {since}"),
            written_ago: silent - delay / 2,
        });
    }
    let for_ = not_serving_for.filter(|d| *d > unserving_bound)?;
    let why = member
        .observed
        .problem
        .clone()
        .unwrap_or_else(|| "postgres is not serving".to_owned());
    Some(Loss {
        record: format!("not serving for {} s: {why}", for_.as_secs()),
        state: format!("not serving: {why}"),
        written_ago: for_,
    })
}

/// The cluster's timeline: the recorded one, or the lost primary's own
/// last report if newer.
fn cluster_timeline(recorded: Option<u32>, primary: Option<&Member>) -> Option<u32> {
    recorded.max(primary.and_then(|m| m.observed.timeline))
}

fn timeline_name(timeline: Option<u32>) -> String {
    timeline.map_or_else(
        || "an unknown timeline".to_owned(),
        |t| format!("timeline {t}"),
    )
}

fn ordinal(pod: &str) -> u32 {
    ordinal_of(pod).unwrap_or(u32::MAX)
}

fn ordinal_of(pod: &str) -> Option<u32> {
    pod.rsplit('-').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: Policy = Policy {
        delay: Duration::from_secs(10),
        start_timeout: Duration::from_secs(300),
        max_lag_bytes: None,
        quorum: None,
    };

    fn quorum(synchronous: u32, instances: u32) -> Policy {
        Policy {
            quorum: Some(Quorum {
                synchronous,
                instances,
            }),
            ..POLICY
        }
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_700_000_100).expect("valid")
    }

    fn member(pod: &str, seconds_ago: i64, role: &str, timeline: u32, received: &str) -> Member {
        Member {
            pod: pod.to_owned(),
            last_seen: Some(Timestamp::from_second(1_700_000_100 - seconds_ago).expect("valid")),
            silent: u64::try_from(seconds_ago).ok().map(Duration::from_secs),
            written: None,
            observed: ObservedState {
                ready: true,
                role: Some(role.to_owned()),
                timeline: Some(timeline),
                wal_position: Some(received.to_owned()),
                received_position: Some(received.to_owned()),
                ..ObservedState::default()
            },
            fenced: false,
            fence_after: None,
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
        let decision = decide("db-0", &members, None, None, POLICY, now());
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
        let decision = decide("db-0", &members, None, None, POLICY, now());
        assert_eq!(promoted(&decision), Some("db-3"));
        let Decision::Promote { reason, .. } = decision else {
            unreachable!()
        };
        assert_eq!(reason, "no heartbeat for 11 s");
    }

    #[test]
    fn a_renewal_stamped_by_a_clock_behind_the_controllers_is_no_silence() {
        // db-0's node clock runs a minute behind: its renewTime looks a
        // minute old, but this controller saw it renew a second ago.
        let mut primary = member("db-0", 60, "primary", 1, "0/9");
        primary.silent = Some(Duration::from_secs(1));
        let members = [primary, member("db-1", 1, "replica", 1, "0/9")];
        assert!(matches!(
            decide("db-0", &members, None, None, POLICY, now()),
            Decision::Keep { .. }
        ));
    }

    fn hearing(mut member: Member, primary: &str) -> Member {
        member.observed.hears_primary = Some(primary.to_owned());
        member
    }

    #[test]
    fn a_silent_primary_every_replica_hears_serves_on_and_is_not_replaced() {
        let members = [
            member("db-0", 30, "primary", 1, "0/9000000"),
            hearing(member("db-1", 1, "replica", 1, "0/9000000"), "db-0"),
            hearing(member("db-2", 1, "replica", 1, "0/9000000"), "db-0"),
        ];
        let decision = decide("db-0", &members, None, None, POLICY, now());
        let Decision::Heard { reason, .. } = decision else {
            panic!("expected the primary kept, heard: {decision:?}");
        };
        assert!(reason.contains("db-1, db-2 still hear it"), "{reason}");
    }

    #[test]
    fn a_replica_that_hears_the_primary_is_not_chosen() {
        // db-1 is ahead but still hears db-0 (it would refuse): db-2 is
        // promoted, which hears nothing.
        let members = [
            member("db-0", 30, "primary", 1, "0/9000000"),
            hearing(member("db-1", 1, "replica", 1, "0/9000000"), "db-0"),
            member("db-2", 1, "replica", 1, "0/8000000"),
        ];
        let decision = decide("db-0", &members, None, None, POLICY, now());
        assert_eq!(promoted(&decision), Some("db-2"));
        // Hearing another member (a former primary) does not count.
        let members = [
            member("db-0", 30, "primary", 1, "0/9000000"),
            hearing(member("db-1", 1, "replica", 1, "0/9000000"), "db-2"),
        ];
        let decision = decide("db-0", &members, None, None, POLICY, now());
        assert_eq!(promoted(&decision), Some("db-1"));
    }

    #[test]
    fn with_synchronous_replicas_one_that_hears_the_primary_holds_the_failover() {
        // Commits wait for one of two: db-1, which still hears db-0, may
        // hold the last ones; db-2 alone is not enough.
        let members = [
            member("db-0", 30, "primary", 1, "0/9000000"),
            hearing(member("db-1", 1, "replica", 1, "0/9000000"), "db-0"),
            member("db-2", 1, "replica", 1, "0/8000000"),
        ];
        let decision = decide("db-0", &members, None, None, quorum(1, 3), now());
        assert!(
            matches!(&decision, Decision::Wait { reason, .. } if reason.contains("2 replicas must report")),
            "{decision:?}"
        );
    }

    #[test]
    fn silence_within_the_delay_is_not_a_loss() {
        let members = [
            member("db-0", 9, "primary", 1, "0/1"),
            member("db-1", 1, "replica", 1, "0/1"),
        ];
        assert!(matches!(
            decide("db-0", &members, None, None, POLICY, now()),
            Decision::Keep { .. }
        ));
    }

    /// The decision after the primary has been seen not serving `seconds`.
    fn not_serving_for(members: &[Member], seconds: u64) -> Decision {
        decide(
            "db-0",
            members,
            None,
            Some(Duration::from_secs(seconds)),
            POLICY,
            now(),
        )
    }

    #[test]
    fn a_primary_not_serving_for_longer_than_the_delay_is_lost() {
        let mut primary = member("db-0", 1, "primary", 1, "0/1");
        primary.observed.role = None;
        primary.observed.problem = Some("refusing to run initdb".into());
        let members = [primary, member("db-1", 1, "replica", 1, "0/1")];
        assert!(matches!(
            not_serving_for(&members, 5),
            Decision::Keep { .. }
        ));
        assert_eq!(promoted(&not_serving_for(&members, 11)), Some("db-1"));
    }

    #[test]
    fn a_primary_in_crash_recovery_has_the_start_timeout() {
        let mut primary = member("db-0", 1, "primary", 1, "0/9");
        primary.observed.role = None;
        primary.observed.ready = false;
        primary.observed.starting = true;
        let members = [primary.clone(), member("db-1", 1, "replica", 1, "0/1")];
        let after = |seconds| not_serving_for(&members, seconds);
        assert!(matches!(after(60), Decision::Keep { .. }));
        assert!(matches!(after(299), Decision::Keep { .. }));
        assert_eq!(promoted(&after(301)), Some("db-1"));
        // Silent while starting: lost after the delay, as any silent primary.
        let mut silent = primary;
        silent.silent = Some(Duration::from_secs(11));
        let members = [silent, member("db-1", 1, "replica", 1, "0/1")];
        assert_eq!(promoted(&not_serving_for(&members, 11)), Some("db-1"));
    }

    #[test]
    fn a_forced_promotion_waives_the_quorum_but_not_the_loss() {
        // Synchronous, one of two replicas reporting: blocked.
        let members = [
            member("db-0", 30, "primary", 3, "0/9"),
            member("db-1", 1, "replica", 3, "0/5"),
            member("db-2", 40, "replica", 3, "0/9"),
        ];
        let policy = quorum(1, 3);
        let Decision::Wait { reason, .. } = decide("db-0", &members, Some(3), None, policy, now())
        else {
            panic!("blocked");
        };
        let forced = |members: &[Member], target: &str| {
            forced("db-0", members, Some(3), &reason, target, policy, now())
        };
        let decision = forced(&members, "db-1").expect("forced");
        assert_eq!(promoted(&decision), Some("db-1"));
        assert!(
            matches!(&decision, Decision::Promote { reason, .. } if reason.contains("accepting data loss"))
        );
        assert!(forced(&members, "db-0").is_err(), "the primary itself");
        assert!(forced(&members, "db-2").is_err(), "a silent replica");
        assert!(forced(&members, "db-7").is_err(), "no such member");
        let mut hearing = members.clone();
        hearing[2].observed.hears_primary = Some("db-0".into());
        let refusal = |members: &[Member]| forced(members, "db-1").err().unwrap_or_default();
        assert!(refusal(&hearing).contains("may be serving"));
        let mut behind = members.clone();
        behind[1].observed.timeline = Some(2);
        assert!(refusal(&behind).contains("behind"));
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
        let decision = decide("db-0", &members, None, None, POLICY, now());
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
        let decision = decide("db-0", &members, None, None, bounded, now());
        assert!(
            matches!(&decision, Decision::Wait { reason, .. } if reason.contains("maxLagBytes")),
            "{decision:?}"
        );
        let loose = Policy {
            max_lag_bytes: Some(0x100_0000),
            ..POLICY
        };
        assert_eq!(
            promoted(&decide("db-0", &members, None, None, loose, now())),
            Some("db-1")
        );
    }

    #[test]
    fn the_lag_bound_holds_across_a_failed_sample_of_the_primary() {
        // The primary's last report has no position (its sample failed):
        // the position seen before still bounds the loss, and with none
        // seen at all no replica is promoted.
        let mut members = vec![
            member("db-0", 30, "primary", 1, "0/9000000"),
            member("db-1", 1, "replica", 1, "0/1000000"),
        ];
        members[0].observed.wal_position = None;
        let bounded = Policy {
            max_lag_bytes: Some(1024),
            ..POLICY
        };
        let decision = decide("db-0", &members, None, None, bounded, now());
        assert!(
            matches!(&decision, Decision::Wait { reason, .. } if reason.contains("position is unknown")),
            "{decision:?}"
        );
        members[0].written = Some(0x900_0000);
        let decision = decide("db-0", &members, None, None, bounded, now());
        assert!(
            matches!(&decision, Decision::Wait { reason, .. } if reason.contains("more than")),
            "{decision:?}"
        );
        members[0].written = Some(0x100_0000);
        assert_eq!(
            promoted(&decide("db-0", &members, None, None, bounded, now())),
            Some("db-1")
        );
    }

    #[test]
    fn the_quorum_the_primary_ran_holds_when_the_spec_asks_less() {
        // The spec was made asynchronous, but the primary still ran ANY 2 of
        // four replicas: three must report, as under its old spec.
        let mut members = vec![
            member("db-0", 30, "primary", 1, "0/9"),
            member("db-1", 1, "replica", 1, "0/7"),
            member("db-2", 1, "replica", 1, "0/8"),
            member("db-3", 30, "replica", 1, "0/9"),
            member("db-4", 30, "replica", 1, "0/9"),
        ];
        members[0].observed.synchronous_standby_names =
            Some(r#"ANY 2 ("db-0", "db-1", "db-2", "db-3", "db-4")"#.to_owned());
        let decision = decide("db-0", &members, None, None, POLICY, now());
        assert!(
            matches!(&decision, Decision::Wait { reason, .. }
                if reason.contains("3 of those replicas must report") && reason.contains("2 do")),
            "{decision:?}"
        );
        members[3].silent = Some(Duration::from_secs(1));
        assert_eq!(
            promoted(&decide("db-0", &members, None, None, POLICY, now())),
            Some("db-3")
        );
        // Asynchronous as it ran: nothing more is asked than the spec asks.
        members[3].silent = Some(Duration::from_secs(30));
        members[0].observed.synchronous_standby_names = Some(String::new());
        assert_eq!(
            promoted(&decide("db-0", &members, None, None, POLICY, now())),
            Some("db-2")
        );
    }

    #[test]
    fn a_quorum_that_names_no_replica_holds_the_failover() {
        let mut members = vec![
            member("db-0", 30, "primary", 1, "0/9"),
            member("db-1", 1, "replica", 1, "0/9"),
        ];
        members[0].observed.synchronous_standby_names = Some("ANY 1 (*)".to_owned());
        let decision = decide("db-0", &members, None, None, POLICY, now());
        assert!(
            matches!(&decision, Decision::Wait { reason, .. } if reason.contains("does not name")),
            "{decision:?}"
        );
    }

    #[test]
    fn a_running_quorum_reads_as_any_n_of_its_list() {
        let any = RunningQuorum::parse(r#"ANY 1 ("db-0", "db-1", "db-2")"#).expect("parses");
        assert_eq!((any.synchronous, any.needed("db-0")), (1, 2));
        let first = RunningQuorum::parse("FIRST 2 (db-1, db-2, db-3)").expect("parses");
        assert_eq!((first.synchronous, first.needed("db-0")), (2, 2));
        let bare = RunningQuorum::parse("db-1, db-2").expect("parses");
        assert_eq!((bare.synchronous, bare.needed("db-0")), (1, 2));
        let off = RunningQuorum::parse("").expect("parses");
        assert_eq!(off.needed("db-0"), 0);
        assert_eq!(RunningQuorum::parse("ANY x (db-1)"), None);
        assert_eq!(RunningQuorum::parse("ANY 1 (db-1"), None);
    }

    #[test]
    fn with_synchronous_replicas_enough_replicas_must_report() {
        // 5 instances, commits confirmed by any 2 of the 4 replicas: 3 must
        // report, so one of them confirmed every acknowledged commit.
        let quorum = quorum(2, 5);
        let mut members = vec![
            member("db-0", 30, "primary", 1, "0/9"),
            member("db-1", 1, "replica", 1, "0/7"),
            member("db-2", 1, "replica", 1, "0/8"),
            member("db-3", 30, "replica", 1, "0/9"),
            member("db-4", 30, "replica", 1, "0/9"),
        ];
        let decision = decide("db-0", &members, None, None, quorum, now());
        assert!(
            matches!(&decision, Decision::Wait { reason, .. }
                if reason.contains("3 replicas must report") && reason.contains("2 do")),
            "{decision:?}"
        );
        members[3] = member("db-3", 1, "replica", 1, "0/6");
        assert_eq!(
            promoted(&decide("db-0", &members, None, None, quorum, now())),
            Some("db-2")
        );
        // Without the quorum, two reporting replicas are enough.
        members[3] = member("db-3", 30, "replica", 1, "0/9");
        assert_eq!(
            promoted(&decide("db-0", &members, None, None, POLICY, now())),
            Some("db-2")
        );
    }

    #[test]
    fn a_report_older_than_the_primarys_last_possible_write_is_waited_for() {
        // The primary beat 12 s ago and may have written until 7 s ago; db-2
        // last reported 8 s ago, possibly before WAL that db-1 lacks. A
        // report counts once first seen a quarter of the delay (2.5 s) after
        // that write: one seen 4 s ago does.
        let members = [
            member("db-0", 12, "primary", 1, "0/9"),
            member("db-1", 1, "replica", 1, "0/8"),
            member("db-2", 8, "replica", 1, "0/7"),
        ];
        let decision = decide("db-0", &members, None, None, POLICY, now());
        assert!(
            matches!(&decision, Decision::Wait { reason, .. } if reason.contains("from db-2")),
            "{decision:?}"
        );
        let members = [
            member("db-0", 12, "primary", 1, "0/9"),
            member("db-1", 1, "replica", 1, "0/8"),
            member("db-2", 5, "replica", 1, "0/9"),
        ];
        assert!(matches!(
            decide("db-0", &members, None, None, POLICY, now()),
            Decision::Wait { .. }
        ));
        let members = [
            member("db-0", 12, "primary", 1, "0/9"),
            member("db-1", 1, "replica", 1, "0/8"),
            member("db-2", 4, "replica", 1, "0/9"),
        ];
        assert_eq!(
            promoted(&decide("db-0", &members, None, None, POLICY, now())),
            Some("db-2")
        );
    }

    #[test]
    fn with_synchronous_replicas_a_primary_not_serving_is_replaced() {
        let quorum = quorum(1, 3);
        let mut primary = member("db-0", 1, "primary", 1, "0/9");
        primary.observed.role = None;
        let members = [
            primary,
            member("db-1", 1, "replica", 1, "0/9"),
            member("db-2", 1, "replica", 1, "0/8"),
        ];
        let not_serving = Some(Duration::from_secs(11));
        assert_eq!(
            promoted(&decide("db-0", &members, None, not_serving, quorum, now())),
            Some("db-1")
        );
    }

    #[test]
    fn a_replica_outside_the_quorum_list_does_not_count() {
        // Scaled down from 3 to 2: db-2 still runs but is no longer listed.
        let quorum = quorum(1, 2);
        let members = [
            member("db-0", 30, "primary", 1, "0/9"),
            member("db-1", 30, "replica", 1, "0/9"),
            member("db-2", 1, "replica", 1, "0/9"),
        ];
        assert!(matches!(
            decide("db-0", &members, None, None, quorum, now()),
            Decision::Wait { .. }
        ));
    }

    #[test]
    fn the_cautious_policy_waits_for_every_replica() {
        // Whatever the running quorum, the most advanced of all replicas
        // holds every acknowledged commit: all of them must report.
        let cautious = cautious(POLICY, 3);
        let members = [
            member("db-0", 30, "primary", 1, "0/9"),
            member("db-1", 1, "replica", 1, "0/8"),
            member("db-2", 30, "replica", 1, "0/9"),
        ];
        let decision = decide("db-0", &members, None, None, cautious, now());
        assert!(
            matches!(&decision, Decision::Wait { reason, .. }
                if reason.contains("2 replicas must report") && reason.contains("1 do")),
            "{decision:?}"
        );
        assert_eq!(
            promoted(&decide("db-0", &members, None, None, POLICY, now())),
            Some("db-1"),
            "the spec's asynchronous policy would not wait"
        );
        let members = [
            member("db-0", 30, "primary", 1, "0/9"),
            member("db-1", 1, "replica", 1, "0/8"),
            member("db-2", 1, "replica", 1, "0/9"),
        ];
        assert_eq!(
            promoted(&decide("db-0", &members, None, None, cautious, now())),
            Some("db-2")
        );
        assert_eq!(cautious.delay, POLICY.delay);
    }

    #[test]
    fn a_replica_on_an_older_timeline_than_the_clusters_is_never_promoted() {
        // As seen in a test run: db-2 replayed the old primary's shutdown
        // checkpoint past timeline 2's switch and stayed on timeline 1,
        // while db-1 (demoted by a switchover) was restarting. Promoting db-2
        // would have lost every write of timelines 2 and 3.
        let mut restarting = member("db-1", 1, "replica", 2, "0/40274C0");
        restarting.observed.role = None;
        restarting.observed.timeline = None;
        let members = [
            member("db-0", 11, "primary", 3, "0/4030000"),
            restarting,
            member("db-2", 1, "replica", 1, "0/4022B78"),
        ];
        let decision = decide("db-0", &members, Some(3), None, POLICY, now());
        assert!(
            matches!(&decision, Decision::Wait { reason, .. }
                if reason.contains("cluster's timeline 3 (db-2 on timeline 1)")),
            "{decision:?}"
        );
        // The status remembers the timeline when the lost primary's Lease
        // no longer reports one.
        let mut silent = members.clone();
        silent[0].observed.timeline = None;
        assert!(matches!(
            decide("db-0", &silent, Some(3), None, POLICY, now()),
            Decision::Wait { .. }
        ));
        // Once db-1 follows timeline 3, it is promoted, though db-2 reports more WAL.
        let mut following = members.clone();
        following[1] = member("db-1", 1, "replica", 3, "0/4020000");
        assert_eq!(
            promoted(&decide("db-0", &following, Some(3), None, POLICY, now())),
            Some("db-1")
        );
    }

    #[test]
    fn a_failover_that_waits_says_so_in_the_same_words_at_every_look() {
        // Each look writes the message into the status: one that counted
        // the seconds of silence was written every second while it waited.
        let mut members = [
            member("db-0", 30, "primary", 2, "0/9"),
            member("db-1", 1, "replica", 1, "0/9"),
        ];
        members[0].observed.problem = Some("disk full".into());
        let wait_reason = |members: &[Member], later: i64, not_serving: Option<u64>| {
            let at = now() + k8s_openapi::jiff::SignedDuration::from_secs(later);
            let mut members = members.to_vec();
            // The replica keeps beating; the primary stays silent.
            members[1].last_seen = Some(at);
            members[1].silent = Some(Duration::ZERO);
            members[0].silent = members[0]
                .silent
                .map(|s| s + Duration::from_secs(later.unsigned_abs()));
            let serving = not_serving.map(Duration::from_secs);
            match decide("db-0", &members, Some(2), serving, POLICY, at) {
                Decision::Wait { reason, .. } => reason,
                other => panic!("expected to wait, got {other:?}"),
            }
        };
        let silent = wait_reason(&members, 0, None);
        assert!(
            silent.contains("no heartbeat since 2023-11-14T22:14:30Z"),
            "{silent}"
        );
        assert_eq!(wait_reason(&members, 1, None), silent);
        assert_eq!(wait_reason(&members, 60, None), silent);
        members[0].last_seen = Some(now());
        members[0].silent = Some(Duration::ZERO);
        let not_serving = wait_reason(&members, 0, Some(20));
        assert!(
            not_serving.contains("not serving: disk full"),
            "{not_serving}"
        );
        assert_eq!(wait_reason(&members, 1, Some(21)), not_serving);
        // The failover record, written once, says for how long.
        let lost = [
            member("db-0", 30, "primary", 2, "0/9"),
            member("db-1", 1, "replica", 2, "0/9"),
        ];
        let Decision::Promote { reason, .. } = decide("db-0", &lost, Some(2), None, POLICY, now())
        else {
            panic!("expected a promotion");
        };
        assert_eq!(reason, "no heartbeat for 30 s");
    }

    #[test]
    fn a_primary_running_a_longer_fence_is_lost_only_after_twice_that_fence() {
        // The spec lowered the delay to 10 s; the primary still runs with
        // the fence of the 60 s before (30 s), until its pod restarts.
        let with_fence = |seconds_ago| Member {
            fence_after: Some(Duration::from_secs(30)),
            ..member("db-0", seconds_ago, "primary", 1, "0/9")
        };
        let replica = member("db-1", 1, "replica", 1, "0/9");
        let members = [with_fence(15), replica.clone()];
        let Decision::Keep { recheck } = decide("db-0", &members, Some(1), None, POLICY, now())
        else {
            panic!("deposed while it may still write");
        };
        assert!(recheck >= Duration::from_secs(45), "{recheck:?}");
        let members = [with_fence(61), replica];
        assert_eq!(
            promoted(&decide("db-0", &members, Some(1), None, POLICY, now())),
            Some("db-1")
        );
        // A fence shorter than half the delay changes nothing.
        let short = Member {
            fence_after: Some(Duration::from_secs(3)),
            ..member("db-0", 11, "primary", 1, "0/9")
        };
        let members = [short, member("db-1", 1, "replica", 1, "0/9")];
        assert_eq!(
            promoted(&decide("db-0", &members, Some(1), None, POLICY, now())),
            Some("db-1")
        );
    }

    #[test]
    fn a_missing_lease_is_a_lost_primary_only_after_the_delay() {
        let members = [member("db-1", 1, "replica", 1, "0/1")];
        let missing_for = |seconds| Some(Duration::from_secs(seconds));
        let Decision::Keep { recheck } =
            decide("db-0", &members, None, missing_for(2), POLICY, now())
        else {
            panic!("a Lease just deleted deposes no one");
        };
        assert!(
            recheck <= POLICY.delay,
            "looked at again by the delay: {recheck:?}"
        );
        assert_eq!(
            promoted(&decide(
                "db-0",
                &members,
                None,
                missing_for(11),
                POLICY,
                now()
            )),
            Some("db-1")
        );
        // The replica's report must postdate the primary's last possible
        // write: half the delay after the Lease was first missed.
        let stale = [member("db-1", 9, "replica", 1, "0/1")];
        assert!(matches!(
            decide("db-0", &stale, None, missing_for(11), POLICY, now()),
            Decision::Wait { .. }
        ));
    }
}
