//! The invariants a chaos run checks, each a named pure function of what was
//! observed (audit log entries, listed objects, buckets, rows), so that each
//! is unit-tested to fail on the state a bug would leave. The driver feeds
//! them during the run and at its end, and [`Tally`] keeps the counts and
//! the evidence for the table.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::time::{Duration, Instant};

use cairn_testing::audit::WriteRequest;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Invariant {
    /// Only the pod holding a controller's leader Lease writes for it.
    OneWriterPerController,
    /// Every object a controller made has a live owner (after garbage
    /// collection's grace), and carries an owner reference at all.
    ChildHasLiveOwner,
    /// No owner has more children of one kind and role than a converged
    /// owner has.
    NoDuplicateChild,
    /// No cloud object has more than one external resource.
    OneExternalResourcePerObject,
    /// Every external resource carries an owner tag naming a live object
    /// (after the deletion's grace).
    ExternalResourceOwned,
    /// At most one instance of a database cluster out of recovery.
    OnePrimary,
    /// Every write the database acknowledged is still there.
    NoAcknowledgedRowLost,
    /// At most one Backup per schedule slot.
    OneBackupPerSlot,
    /// Every object Ready within the bound after the chaos stops.
    Converges,
    /// No object written by a controller more often than the bound.
    BoundedWriteRate,
    /// Each controller's memory back within the bound after the churn.
    MemoryReturns,
    /// No controller write in the idle minute at the end.
    NoIdleWrites,
}

impl Invariant {
    pub const ALL: [Invariant; 12] = [
        Invariant::OneWriterPerController,
        Invariant::ChildHasLiveOwner,
        Invariant::NoDuplicateChild,
        Invariant::OneExternalResourcePerObject,
        Invariant::ExternalResourceOwned,
        Invariant::OnePrimary,
        Invariant::NoAcknowledgedRowLost,
        Invariant::OneBackupPerSlot,
        Invariant::Converges,
        Invariant::BoundedWriteRate,
        Invariant::MemoryReturns,
        Invariant::NoIdleWrites,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Invariant::OneWriterPerController => "one-writer-per-controller",
            Invariant::ChildHasLiveOwner => "child-has-live-owner",
            Invariant::NoDuplicateChild => "no-duplicate-child",
            Invariant::OneExternalResourcePerObject => "one-external-resource-per-object",
            Invariant::ExternalResourceOwned => "external-resource-owned",
            Invariant::OnePrimary => "one-primary",
            Invariant::NoAcknowledgedRowLost => "no-acknowledged-row-lost",
            Invariant::OneBackupPerSlot => "one-backup-per-slot",
            Invariant::Converges => "converges",
            Invariant::BoundedWriteRate => "bounded-write-rate",
            Invariant::MemoryReturns => "memory-returns",
            Invariant::NoIdleWrites => "no-idle-writes",
        }
    }
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How often each invariant was checked, and the evidence of each failure.
#[derive(Debug, Default)]
pub struct Tally {
    checked: BTreeMap<Invariant, u64>,
    violations: BTreeMap<Invariant, Vec<String>>,
}

impl Tally {
    /// Records one check of `invariant` and what it found wrong.
    pub fn record(&mut self, invariant: Invariant, violations: Vec<String>) {
        *self.checked.entry(invariant).or_default() += 1;
        if !violations.is_empty() {
            self.violations
                .entry(invariant)
                .or_default()
                .extend(violations);
        }
    }

    pub fn failed(&self) -> Vec<Invariant> {
        self.violations.keys().copied().collect()
    }

    /// The table: each invariant, its checks, its violations and the first
    /// few pieces of evidence.
    pub fn table(&self) -> String {
        let mut out = format!("{:<34} {:>7} {:>10}\n", "invariant", "checks", "violations");
        for invariant in Invariant::ALL {
            let found = self
                .violations
                .get(&invariant)
                .map_or(&[][..], Vec::as_slice);
            out += &format!(
                "{:<34} {:>7} {:>10}\n",
                invariant.name(),
                self.checked.get(&invariant).copied().unwrap_or(0),
                found.len()
            );
            for evidence in found.iter().take(5) {
                out += &format!("    {evidence}\n");
            }
        }
        out
    }
}

/// A controller as the audit log shows it: the user its replicas write as,
/// and its leader Lease.
#[derive(Debug, Clone)]
pub struct Controller {
    pub user: String,
    pub lease_namespace: String,
    pub lease_name: String,
}

/// Writes (that the API server accepted) by a controller's pod while
/// another pod held its Lease. The holder at a moment is the pod that last
/// wrote the Lease successfully before it; a pod that took the Lease over
/// from a frozen leader and the old leader writing after waking is exactly
/// what this finds.
pub fn writes_by_non_leaders(writes: &[WriteRequest], controller: &Controller) -> Vec<String> {
    let mut mine: Vec<&WriteRequest> = writes
        .iter()
        .filter(|w| w.user == controller.user && w.code.is_some_and(|c| c < 300))
        .collect();
    mine.sort_by(|a, b| a.received.cmp(&b.received));
    let mut holder: Option<&str> = None;
    let mut found = Vec::new();
    for write in mine {
        let is_lease = write.resource == "leases"
            && write.namespace.as_deref() == Some(&controller.lease_namespace)
            && write.name.as_deref() == Some(&controller.lease_name);
        if is_lease {
            holder = write.pod.as_deref();
        } else if holder.is_some() && write.pod.as_deref() != holder {
            found.push(format!(
                "{} {} {}/{} by {} at {} while {} held the lease",
                write.verb,
                write.resource,
                write.namespace.as_deref().unwrap_or("-"),
                write.name.as_deref().unwrap_or("-"),
                write.pod.as_deref().unwrap_or("an unknown pod"),
                write.received,
                holder.unwrap_or_default()
            ));
        }
    }
    found
}

/// An object some controller made, as listed.
#[derive(Debug, Clone)]
pub struct Child {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// The controller owner reference: kind and uid.
    pub owner: Option<(String, String)>,
    /// `app.kubernetes.io/component`, what the child is for its owner.
    pub component: Option<String>,
    /// The deletion timestamp and finalizers of a child being deleted: the
    /// evidence of an orphan that garbage collection started but never ended.
    pub deleting: Option<String>,
}

impl Child {
    pub fn key(&self) -> String {
        format!("{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// Children labelled as made by a Cairn controller with no owner reference,
/// or whose owner is not among `live_owners` (uids). The caller allows
/// garbage collection a grace before counting an orphan.
pub fn children_without_live_owner(
    children: &[Child],
    live_owners: &BTreeSet<String>,
) -> Vec<(String, String)> {
    children
        .iter()
        .filter_map(|child| match &child.owner {
            None => Some((
                child.key(),
                format!("{} has no owner reference", child.key()),
            )),
            Some((kind, uid)) if !live_owners.contains(uid) => Some((
                child.key(),
                format!(
                    "{} is owned by {kind} {uid}, which does not exist{}",
                    child.key(),
                    child
                        .deleting
                        .as_ref()
                        .map(|d| format!(" (deleting: {d})"))
                        .unwrap_or_default()
                ),
            )),
            Some(_) => None,
        })
        .collect()
}

/// How many children of each kind and component (`app.kubernetes.io/
/// component`, the child's role) one owner has at most: the census of the
/// converged workload before the chaos, the baseline for duplicates.
pub type Census = BTreeMap<(String, String), usize>;

/// The most children of each kind and component any one owner has.
pub fn census(children: &[Child]) -> Census {
    let mut census = Census::new();
    for (key, count) in per_owner_and_role(children) {
        let entry = census.entry((key.1, key.2)).or_default();
        *entry = (*entry).max(count.len());
    }
    census
}

/// Owners with more children of a kind and component than `census` allows
/// (a role the census has not seen is not judged).
pub fn duplicate_children(children: &[Child], census: &Census) -> Vec<String> {
    per_owner_and_role(children)
        .into_iter()
        .filter_map(|((uid, kind, component), names)| {
            let allowed = *census.get(&(kind.clone(), component.clone()))?;
            (names.len() > allowed).then(|| {
                format!(
                    "owner {uid} has {} {kind}s for {component} (at most {allowed}): {}",
                    names.len(),
                    names.join(", ")
                )
            })
        })
        .collect()
}

fn per_owner_and_role(children: &[Child]) -> BTreeMap<(String, String, String), Vec<&str>> {
    let mut by_role: BTreeMap<(String, String, String), Vec<&str>> = BTreeMap::new();
    for child in children {
        if let (Some((_, uid)), Some(component)) = (&child.owner, &child.component) {
            by_role
                .entry((uid.clone(), child.kind.clone(), component.clone()))
                .or_default()
                .push(&child.name);
        }
    }
    by_role
}

/// A Backup made by a schedule: its owner's uid and its slot.
#[derive(Debug, Clone)]
pub struct SlotBackup {
    pub schedule_uid: String,
    pub slot: String,
    pub name: String,
}

pub fn backups_sharing_a_slot(backups: &[SlotBackup]) -> Vec<String> {
    let mut slots: BTreeMap<(&str, &str), Vec<&str>> = BTreeMap::new();
    for backup in backups {
        slots
            .entry((&backup.schedule_uid, &backup.slot))
            .or_default()
            .push(&backup.name);
    }
    slots
        .into_iter()
        .filter(|(_, names)| names.len() > 1)
        .map(|((uid, slot), names)| {
            format!(
                "schedule {uid} has {} Backups for slot {slot}: {}",
                names.len(),
                names.join(", ")
            )
        })
        .collect()
}

/// An external resource and the owner tag it carries.
#[derive(Debug, Clone)]
pub struct External {
    pub name: String,
    pub owner_uid: Option<String>,
}

/// Live cloud objects (uid → name) with more than one external resource.
pub fn objects_with_several_externals(
    externals: &[External],
    live: &HashMap<String, String>,
) -> Vec<String> {
    let mut by_owner: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for external in externals {
        if let Some(uid) = &external.owner_uid {
            by_owner.entry(uid).or_default().push(&external.name);
        }
    }
    by_owner
        .into_iter()
        .filter(|(uid, names)| names.len() > 1 && live.contains_key(*uid))
        .map(|(uid, names)| {
            format!(
                "{} ({uid}) has {}: {}",
                live[uid],
                names.len(),
                names.join(", ")
            )
        })
        .collect()
}

/// External resources with no owner tag, or one naming no live object
/// (keyed by resource name, for the caller's grace).
pub fn externals_without_live_owner(
    externals: &[External],
    live: &HashMap<String, String>,
) -> Vec<(String, String)> {
    externals
        .iter()
        .filter_map(|external| match &external.owner_uid {
            None => Some((
                external.name.clone(),
                format!("{} has no owner tag", external.name),
            )),
            Some(uid) if !live.contains_key(uid) => Some((
                external.name.clone(),
                format!(
                    "{} is tagged for {uid}, which does not exist",
                    external.name
                ),
            )),
            Some(_) => None,
        })
        .collect()
}

/// Acknowledged ids missing from the table.
pub fn lost_rows(acknowledged: &[u64], present: &BTreeSet<u64>) -> Vec<u64> {
    acknowledged
        .iter()
        .copied()
        .filter(|id| !present.contains(id))
        .collect()
}

/// The longest stretch without an acknowledged insert, in seconds: from the
/// start of a failed attempt to the end of the next acknowledged one (or the
/// last attempt). `attempts` are `(acknowledged, started, ended)` in order.
pub fn longest_write_outage(attempts: &[(bool, f64, f64)]) -> f64 {
    let mut longest: f64 = 0.0;
    let mut failing_since = None;
    for &(acknowledged, started, ended) in attempts {
        match (acknowledged, failing_since) {
            (false, None) => failing_since = Some(started),
            (true, Some(since)) => {
                longest = longest.max(ended - since);
                failing_since = None;
            }
            _ => {}
        }
    }
    if let (Some(since), Some(&(_, _, last))) = (failing_since, attempts.last()) {
        longest = longest.max(last - since);
    }
    longest
}

/// Objects a controller wrote more than `limit` times within any
/// `window_seconds`, with the writes' times as RFC 3339 strings.
pub fn objects_written_too_often(
    writes: &[WriteRequest],
    users: &BTreeSet<String>,
    window_seconds: f64,
    limit: usize,
) -> Vec<String> {
    let mut times: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for write in writes.iter().filter(|w| users.contains(&w.user)) {
        if write.resource == "leases" || write.resource == "events" {
            continue; // renewals and Events have their own pace
        }
        let Some(at) = seconds(&write.received) else {
            continue;
        };
        let key = format!(
            "{} {}/{}",
            write.resource,
            write.namespace.as_deref().unwrap_or("-"),
            write.name.as_deref().unwrap_or("-")
        );
        times.entry(key).or_default().push(at);
    }
    times
        .into_iter()
        .filter_map(|(key, mut at)| {
            at.sort_by(f64::total_cmp);
            let most = (0..at.len())
                .map(|i| {
                    at[i..]
                        .iter()
                        .take_while(|t| **t < at[i] + window_seconds)
                        .count()
                })
                .max()
                .unwrap_or(0);
            (most > limit).then(|| format!("{key}: {most} writes within {window_seconds} s"))
        })
        .collect()
}

/// Seconds since the epoch of an audit timestamp.
fn seconds(rfc3339: &str) -> Option<f64> {
    let at: k8s_openapi::jiff::Timestamp = rfc3339.parse().ok()?;
    Some(at.as_millisecond() as f64 / 1000.0)
}

/// Problems that count only once seen in every sample for longer than a
/// grace (an orphan awaiting garbage collection), per invariant: one
/// invariant's findings never restart another's clock.
#[derive(Debug, Default)]
pub struct Grace {
    since: HashMap<Invariant, HashMap<String, Instant>>,
}

impl Grace {
    /// Of `found` (key, evidence) for `invariant` at `now`, the evidence of
    /// those found continuously for longer than `grace`. A key missing from
    /// `found` starts over.
    pub fn overdue(
        &mut self,
        invariant: Invariant,
        found: Vec<(String, String)>,
        grace: Duration,
        now: Instant,
    ) -> Vec<String> {
        let since = self.since.entry(invariant).or_default();
        since.retain(|key, _| found.iter().any(|(k, _)| k == key));
        found
            .into_iter()
            .filter_map(|(key, evidence)| {
                let for_ = now.duration_since(*since.entry(key).or_insert(now));
                (for_ > grace).then(|| format!("{evidence} (for {:.0} s)", for_.as_secs_f64()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_orphan_counts_past_the_grace_whatever_else_is_found() {
        let grace = Duration::from_secs(90);
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let orphan = || vec![("ConfigMap a/pg-config".to_owned(), "no owner".to_owned())];
        let mut seen = Grace::default();
        for s in [0, 30, 60, 90] {
            assert!(
                seen.overdue(Invariant::ChildHasLiveOwner, orphan(), grace, at(s))
                    .is_empty()
            );
            // Another invariant with nothing found, sampled in between.
            seen.overdue(Invariant::ExternalResourceOwned, vec![], grace, at(s));
        }
        assert_eq!(
            seen.overdue(Invariant::ChildHasLiveOwner, orphan(), grace, at(120)),
            vec!["no owner (for 120 s)".to_owned()]
        );
        // Gone for one sample (collected): its clock starts over.
        seen.overdue(Invariant::ChildHasLiveOwner, vec![], grace, at(125));
        assert!(
            seen.overdue(Invariant::ChildHasLiveOwner, orphan(), grace, at(150))
                .is_empty()
        );
    }

    use super::*;

    fn write(pod: &str, resource: &str, name: &str, at: &str) -> WriteRequest {
        WriteRequest {
            user: "system:serviceaccount:c:db".into(),
            verb: "update".into(),
            resource: resource.into(),
            subresource: None,
            namespace: Some("c".into()),
            name: Some(name.into()),
            code: Some(200),
            received: format!("2026-11-26T10:00:{at}.000000Z"),
            pod: Some(pod.into()),
            client: None,
        }
    }

    fn controller() -> Controller {
        Controller {
            user: "system:serviceaccount:c:db".into(),
            lease_namespace: "c".into(),
            lease_name: "cairn-database".into(),
        }
    }

    #[test]
    fn a_write_by_the_old_leader_after_a_takeover_is_a_second_writer() {
        let log = [
            write("a", "leases", "cairn-database", "01"),
            write("a", "statefulsets", "pg", "02"),
            write("b", "leases", "cairn-database", "20"),
            write("b", "services", "pg-rw", "21"),
            write("a", "statefulsets", "pg", "22"),
        ];
        let found = writes_by_non_leaders(&log, &controller());
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("by a") && found[0].contains("while b held"),
            "{}",
            found[0]
        );
        assert_eq!(
            writes_by_non_leaders(&log[..4], &controller()),
            Vec::<String>::new()
        );
    }

    fn child(kind: &str, name: &str, owner: Option<&str>, component: &str) -> Child {
        Child {
            kind: kind.into(),
            namespace: "n".into(),
            name: name.into(),
            owner: owner.map(|uid| ("DatabaseCluster".into(), uid.into())),
            component: Some(component.into()),
            deleting: None,
        }
    }

    #[test]
    fn a_child_without_owner_reference_or_with_a_dead_owner_is_found() {
        let live = BTreeSet::from(["u1".to_owned()]);
        let children = [
            child("Service", "pg-rw", Some("u1"), "rw"),
            child("Service", "pg-ro", None, "ro"),
            child("ConfigMap", "old", Some("u0"), "config"),
        ];
        let found = children_without_live_owner(&children, &live);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].1.contains("no owner reference"));
        assert!(found[1].1.contains("does not exist"));
    }

    #[test]
    fn more_children_in_one_role_than_the_census_allows_are_duplicates() {
        let converged = [
            child("StatefulSet", "pg", Some("u1"), "database"),
            child("Secret", "pg-ca", Some("u1"), "tls"),
            child("Secret", "pg-server", Some("u1"), "tls"),
        ];
        let census = census(&converged);
        assert_eq!(census[&("Secret".to_owned(), "tls".to_owned())], 2);
        assert!(duplicate_children(&converged, &census).is_empty());
        let mut children = converged.to_vec();
        children.push(child("StatefulSet", "pg-2", Some("u1"), "database"));
        children.push(child("StatefulSet", "other", Some("u2"), "database"));
        children.push(child("Job", "a", Some("u1"), "never-seen"));
        children.push(child("Job", "b", Some("u1"), "never-seen"));
        let found = duplicate_children(&children, &census);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("pg, pg-2"));
    }

    #[test]
    fn two_backups_of_one_slot_are_found() {
        let backup = |name: &str, slot: &str| SlotBackup {
            schedule_uid: "s".into(),
            slot: slot.into(),
            name: name.into(),
        };
        let backups = [
            backup("a", "2026-11-26T10:00:00Z"),
            backup("b", "2026-11-26T10:00:00Z"),
            backup("c", "2026-11-26T10:01:00Z"),
        ];
        assert_eq!(backups_sharing_a_slot(&backups).len(), 1);
        assert!(backups_sharing_a_slot(&backups[1..]).is_empty());
    }

    #[test]
    fn externals_are_one_per_object_and_owned() {
        let live = HashMap::from([("u1".to_owned(), "ns/assets".to_owned())]);
        let external = |name: &str, owner: Option<&str>| External {
            name: name.into(),
            owner_uid: owner.map(Into::into),
        };
        let externals = [
            external("b1", Some("u1")),
            external("b2", Some("u1")),
            external("b3", None),
            external("b4", Some("gone")),
        ];
        assert_eq!(objects_with_several_externals(&externals, &live).len(), 1);
        assert_eq!(externals_without_live_owner(&externals, &live).len(), 2);
        assert!(objects_with_several_externals(&externals[..1], &live).is_empty());
    }

    #[test]
    fn the_longest_write_outage_runs_from_the_first_failure_to_the_next_acknowledgement() {
        let attempts = [
            (true, 0.0, 0.1),
            (false, 1.0, 4.0),
            (false, 4.1, 7.1),
            (true, 7.2, 7.3),
            (false, 8.0, 8.5),
            (true, 8.6, 8.7),
        ];
        assert!((longest_write_outage(&attempts) - 6.3).abs() < 1e-9);
        // Still failing at the end: up to the last attempt.
        assert!((longest_write_outage(&attempts[..3]) - 6.1).abs() < 1e-9);
        assert_eq!(longest_write_outage(&attempts[..1]), 0.0);
    }

    #[test]
    fn a_missing_acknowledged_row_is_lost() {
        let present = BTreeSet::from([1, 2, 4]);
        assert_eq!(lost_rows(&[1, 2, 3, 4], &present), vec![3]);
    }

    #[test]
    fn an_object_written_in_a_loop_is_found() {
        let users = BTreeSet::from(["system:serviceaccount:c:db".to_owned()]);
        let burst: Vec<WriteRequest> = (10..40)
            .map(|s| write("a", "databaseclusters", "pg", &s.to_string()))
            .collect();
        assert_eq!(objects_written_too_often(&burst, &users, 60.0, 20).len(), 1);
        assert!(objects_written_too_often(&burst, &users, 60.0, 30).is_empty());
        assert!(objects_written_too_often(&burst, &BTreeSet::new(), 60.0, 20).is_empty());
    }
}
