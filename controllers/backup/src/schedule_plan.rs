//! What a BackupSchedule does now, decided without I/O: the slot due (if
//! any) and the Backup it creates, what concurrency and retention remove,
//! and the status. Exactly one Backup per slot comes from its name: derived
//! from the schedule and the slot, so a create repeated after a restart of
//! the controller meets the first one (409) instead of making a second.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cairn_api::backup::v1::{
    Backup, BackupPhase, BackupSchedule, BackupScheduleStatus, ConcurrencyPolicy,
    PINNED_ANNOTATION, SCHEDULE_LABEL, SLOT_ANNOTATION, VERIFIED,
};
use cairn_api::common::{LocalObjectReference, Time};
use cairn_runtime::conditions;
use chrono::{DateTime, TimeZone, Utc};
use croner::Cron;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::{Resource, ResourceExt};

use crate::artifact::Window;

/// How long failed Backups of a schedule stay: the newest one only.
const FAILED_KEPT: usize = 1;
/// While a schedule's Backup runs, its status (last success, retention) is
/// looked at this often.
const WHILE_ACTIVE: Duration = Duration::from_secs(30);

#[derive(Debug, PartialEq)]
pub struct Plan {
    /// A Backup to create for the slot due.
    pub create: Option<Backup>,
    /// Running Backups to fail (`Replace`).
    pub replace: Vec<String>,
    /// Backups retention removes.
    pub delete: Vec<String>,
    /// Why the slot due is not taken, if it is not.
    pub skipped: Option<String>,
    pub status: BackupScheduleStatus,
    pub recheck: Option<Duration>,
}

/// The cron expression and time zone of a schedule.
pub struct Timing {
    cron: Cron,
    zone: chrono_tz::Tz,
}

impl Timing {
    pub fn parse(schedule: &BackupSchedule) -> Result<Self, String> {
        let cron: Cron = schedule
            .spec
            .schedule
            .trim()
            .parse()
            .map_err(|e| format!("spec.schedule {:?}: {e}", schedule.spec.schedule))?;
        let zone = match &schedule.spec.time_zone {
            Some(name) => name
                .parse::<chrono_tz::Tz>()
                .map_err(|_| format!("spec.timeZone {name:?} is not an IANA time zone"))?,
            None => chrono_tz::UTC,
        };
        Ok(Self { cron, zone })
    }

    /// The newest slot at or before `now`.
    fn latest(&self, now: Timestamp) -> Option<Timestamp> {
        let now = self.zone.from_utc_datetime(&utc(now)?.naive_utc());
        let slot = self.cron.find_previous_occurrence(&now, true).ok()?;
        Timestamp::from_second(slot.timestamp()).ok()
    }

    /// The first slot after `now`.
    fn next(&self, now: Timestamp) -> Option<Timestamp> {
        let now = self.zone.from_utc_datetime(&utc(now)?.naive_utc());
        let slot = self.cron.find_next_occurrence(&now, false).ok()?;
        Timestamp::from_second(slot.timestamp()).ok()
    }
}

fn utc(at: Timestamp) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(at.as_second(), 0)
}

/// The name of the Backup of `schedule` for `slot`.
pub fn backup_name(schedule: &str, slot: Timestamp) -> String {
    format!("{schedule}-{}", slot.strftime("%Y%m%d%H%M"))
}

/// What `schedule` does at `now`, given its Backups (those labelled with
/// its name) and whether its cluster's WAL archiving works (`Err` says why
/// not).
/// What the plan reads about the cluster's storage, besides the Backups.
#[derive(Clone, Debug)]
pub struct Storage {
    /// WAL archiving, as the cluster's `ContinuousArchiving` condition says.
    pub archiving: Result<(), (&'static str, String)>,
    /// The recoverability window from the cluster's folder of the bucket;
    /// `Ok(None)` when there is no destination to read, `Err` when the
    /// bucket cannot be read (the last window read is kept).
    pub window: Result<Option<Window>, String>,
}

impl Storage {
    /// Archiving fine, nothing to read.
    pub fn healthy() -> Self {
        Self {
            archiving: Ok(()),
            window: Ok(None),
        }
    }
}

pub fn plan(
    schedule: &BackupSchedule,
    timing: &Timing,
    backups: &[Arc<Backup>],
    storage: Storage,
    now: Timestamp,
) -> Plan {
    let mut status = schedule.status.clone().unwrap_or_default();
    let since = status
        .last_schedule_time
        .as_ref()
        .map(|t| t.0)
        .or_else(|| schedule.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .unwrap_or(now);
    let active: Vec<&Arc<Backup>> = backups
        .iter()
        .filter(|b| !matches!(phase(b), Some(BackupPhase::Completed | BackupPhase::Failed)))
        .collect();
    let mut create = None;
    let mut replace = Vec::new();
    let mut skipped = None;
    if let Some(slot) = timing.latest(now).filter(|slot| *slot > since) {
        let late = now.duration_since(slot);
        let deadline = schedule
            .spec
            .starting_deadline_seconds
            .map(SignedDuration::from_secs);
        if schedule.spec.suspend {
            skipped = Some("the schedule is suspended".to_owned());
        } else if deadline.is_some_and(|d| late > d) {
            skipped = Some(format!(
                "the slot {slot} was missed by more than startingDeadlineSeconds"
            ));
        } else if active
            .iter()
            .any(|b| b.name_any() != backup_name(&schedule.name_any(), slot))
            && schedule.spec.concurrency_policy == ConcurrencyPolicy::Forbid
        {
            skipped = Some(format!(
                "Backup {} still runs (concurrencyPolicy Forbid)",
                active[0].name_any()
            ));
        } else {
            // This slot's Backup may exist already (made before a restart
            // that lost the status write): it is neither replaced nor made
            // again.
            let name = backup_name(&schedule.name_any(), slot);
            if schedule.spec.concurrency_policy == ConcurrencyPolicy::Replace {
                replace = active
                    .iter()
                    .map(|b| b.name_any())
                    .filter(|other| *other != name)
                    .collect();
            }
            if !backups.iter().any(|b| b.name_any() == name) {
                create = Some(new_backup(schedule, slot, backups));
            }
            status.last_schedule_time = Some(Time(slot));
        }
    }
    let delete = retention(schedule, backups, now);
    let newest_success = backups
        .iter()
        .filter(|b| phase(b) == Some(BackupPhase::Completed))
        .filter_map(|b| b.status.as_ref()?.completed_at.as_ref().map(|t| t.0))
        .max();
    status.last_successful_time = newest_success.map(Time).or(status.last_successful_time);
    let next = (!schedule.spec.suspend).then(|| timing.next(now)).flatten();
    status.next_schedule_time = next.map(Time);
    status.active = active
        .iter()
        .filter(|b| !replace.contains(&b.name_any()))
        .map(|b| LocalObjectReference { name: b.name_any() })
        .chain(
            create
                .iter()
                .map(|b| LocalObjectReference { name: b.name_any() }),
        )
        .collect();
    status.observed_generation = schedule.metadata.generation;
    let bucket = match storage.window {
        Ok(window) => {
            let window = window.unwrap_or_default();
            status.first_recoverability_point = window.first.map(conditions::stored_time);
            status.last_recoverability_point = window.last.map(conditions::stored_time);
            Ok(())
        }
        Err(why) => Err(why),
    };
    let generation = schedule.metadata.generation;
    let mut set = |type_: &str, ok: bool, reason: &str, message: String| {
        let condition = conditions::new(type_, ok, reason, message, generation, Time(now));
        conditions::set(&mut status.conditions, condition);
    };
    set(
        "Ready",
        true,
        if schedule.spec.suspend {
            "Suspended"
        } else {
            "Scheduled"
        },
        match next {
            Some(next) => format!("next Backup at {next}"),
            None => "no Backup is scheduled".to_owned(),
        },
    );
    let (healthy, reason, message) = health(
        timing,
        since_creation(schedule),
        newest_success,
        storage
            .archiving
            .and(bucket.map_err(|why| ("BucketUnreadable", why)))
            .and(last_verification(backups)),
        now,
    );
    set("BackupsHealthy", healthy, reason, message);
    // A verification's outcome comes after its Backup completed.
    let verifying = backups.iter().any(|b| verification_pending(b));
    // A running Backup's end changes the status, suspended or not, and
    // nothing watched announces it.
    let busy = (!status.active.is_empty() || verifying).then_some(WHILE_ACTIVE);
    // Staleness comes with time alone: looked at again when it is due, not
    // a resync (or, for a daily schedule, a day) later.
    let until = |at: Timestamp| Duration::from_secs(at.duration_since(now).as_secs().max(1) as u64);
    let going_stale = stale_at(timing, since_creation(schedule), newest_success, now)
        .filter(|at| *at > now)
        .map(until);
    let recheck = next
        .map(until)
        .into_iter()
        .chain(busy)
        .chain(going_stale)
        .min();
    Plan {
        create,
        replace,
        delete,
        skipped,
        status,
        recheck,
    }
}

/// The newest verification's outcome among the schedule's Backups: a
/// backup that did not restore makes the schedule unhealthy until a newer
/// one verifies.
fn last_verification(backups: &[Arc<Backup>]) -> Result<(), (&'static str, String)> {
    let newest = backups
        .iter()
        .filter_map(|b| {
            let status = b.status.as_ref()?;
            let condition = conditions::find(&status.conditions, VERIFIED)?;
            let at = status.verification.as_ref()?.completed_at.as_ref()?.0;
            (condition.status != "Unknown").then_some((at, b, condition))
        })
        .max_by_key(|(at, _, _)| *at);
    match newest {
        Some((_, backup, condition)) if condition.status == "False" => Err((
            "VerificationFailed",
            format!(
                "Backup {} did not verify ({}): {}",
                backup.name_any(),
                condition.reason,
                condition.message
            ),
        )),
        _ => Ok(()),
    }
}

/// A completed Backup whose verification has no outcome yet.
fn verification_pending(backup: &Backup) -> bool {
    backup.spec.verification.is_some()
        && phase(backup) == Some(BackupPhase::Completed)
        && backup.status.as_ref().is_none_or(|s| {
            conditions::find(&s.conditions, VERIFIED).is_none_or(|c| c.status == "Unknown")
        })
}

fn since_creation(schedule: &BackupSchedule) -> Option<Timestamp> {
    schedule.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

/// `BackupsHealthy`: False when WAL archiving fails or the bucket cannot
/// be read (`storage`'s reason and message), or when the newest successful
/// Backup (or, without one, the schedule's creation) is older than two
/// intervals of the schedule.
fn health(
    timing: &Timing,
    created: Option<Timestamp>,
    newest_success: Option<Timestamp>,
    storage: Result<(), (&'static str, String)>,
    now: Timestamp,
) -> (bool, &'static str, String) {
    if let Err((reason, why)) = storage {
        return (false, reason, why);
    }
    let Some(stale_at) = stale_at(timing, created, newest_success, now) else {
        return (true, "NoSchedule", "the schedule has no slot".into());
    };
    match newest_success {
        Some(success) if now > stale_at => (
            false,
            "BackupsStale",
            format!(
                "the newest successful Backup completed at {success}, more than two intervals ago"
            ),
        ),
        Some(success) => (
            true,
            "BackupsRecent",
            format!("the newest successful Backup completed at {success}"),
        ),
        None if created.is_some() && now > stale_at => (
            false,
            "NoSuccessfulBackup",
            "no Backup of this schedule completed in two intervals".into(),
        ),
        None => (true, "BackupsRecent", "no slot has come yet".into()),
    }
}

/// When the backups turn stale: two intervals of the schedule after the
/// newest success (or, without one, the schedule's creation; `now` without
/// either). `None` for a schedule without slots.
fn stale_at(
    timing: &Timing,
    created: Option<Timestamp>,
    newest_success: Option<Timestamp>,
    now: Timestamp,
) -> Option<Timestamp> {
    let interval = timing.next(now)?.duration_since(timing.latest(now)?);
    newest_success
        .or(created)
        .unwrap_or(now)
        .checked_add(interval * 2)
        .ok()
}

/// The Backup for `slot`: the template's spec, owned by the schedule (the
/// garbage collector removes it with the schedule; its stored backup stays
/// unless its deletionPolicy is Delete). Verified unless one of the
/// schedule's `verifyEvery - 1` newest Backups not failed (`backups`)
/// already is.
fn new_backup(schedule: &BackupSchedule, slot: Timestamp, backups: &[Arc<Backup>]) -> Backup {
    let mut spec = schedule.spec.template.spec.clone();
    let every = usize::try_from(schedule.spec.verify_every.unwrap_or(1)).unwrap_or(1);
    // A failed Backup is never verified: it does not count.
    let mut newest: Vec<&Arc<Backup>> = backups
        .iter()
        .filter(|b| phase(b) != Some(BackupPhase::Failed))
        .collect();
    newest.sort_by_key(|b| std::cmp::Reverse(b.annotations().get(SLOT_ANNOTATION).cloned()));
    if newest
        .iter()
        .take(every.saturating_sub(1))
        .any(|b| b.spec.verification.is_some())
    {
        spec.verification = None;
    }
    let mut backup = Backup::new(&backup_name(&schedule.name_any(), slot), spec);
    backup.metadata.namespace = schedule.namespace();
    backup.metadata.labels = Some(BTreeMap::from([(
        SCHEDULE_LABEL.to_owned(),
        schedule.name_any(),
    )]));
    backup.metadata.annotations = Some(BTreeMap::from([(
        SLOT_ANNOTATION.to_owned(),
        slot.to_string(),
    )]));
    backup.metadata.owner_references = Some(vec![OwnerReference {
        api_version: BackupSchedule::api_version(&()).into_owned(),
        kind: BackupSchedule::kind(&()).into_owned(),
        name: schedule.name_any(),
        uid: schedule.uid().unwrap_or_default(),
        controller: Some(true),
        // Not blocking the schedule's deletion: that would need `update` on
        // backupschedules/finalizers where owner references are enforced.
        block_owner_deletion: None,
    }]);
    backup
}

/// The Backups retention removes: completed ones outside `keepLast` or
/// older than `maxAge`, never the newest completed one nor a pinned one;
/// failed ones but the newest.
pub fn retention(
    schedule: &BackupSchedule,
    backups: &[Arc<Backup>],
    now: Timestamp,
) -> Vec<String> {
    let completed_at = |b: &Backup| {
        b.status
            .as_ref()
            .and_then(|s| s.completed_at.as_ref())
            .map(|t| t.0)
    };
    let pinned =
        |b: &Backup| b.annotations().get(PINNED_ANNOTATION).map(String::as_str) == Some("true");
    let newest_first = |phase_wanted: BackupPhase| {
        let mut of_phase: Vec<&Arc<Backup>> = backups
            .iter()
            .filter(|b| phase(b) == Some(phase_wanted))
            .collect();
        of_phase.sort_by_key(|b| std::cmp::Reverse(completed_at(b)));
        of_phase
    };
    let mut delete = Vec::new();
    if let Some(rules) = &schedule.spec.retention {
        let keep_last = rules.keep_last.and_then(|n| usize::try_from(n).ok());
        let max_age = rules.max_age.as_deref().and_then(parse_age);
        for (index, backup) in newest_first(BackupPhase::Completed).into_iter().enumerate() {
            let too_many = keep_last.is_some_and(|n| index >= n);
            let too_old = max_age
                .zip(completed_at(backup))
                .is_some_and(|(age, at)| now.duration_since(at) > age);
            if index > 0 && !pinned(backup) && (too_many || too_old) {
                delete.push(backup.name_any());
            }
        }
    }
    for backup in newest_first(BackupPhase::Failed)
        .into_iter()
        .skip(FAILED_KEPT)
    {
        if !pinned(backup) {
            delete.push(backup.name_any());
        }
    }
    delete
}

/// `30d`, `12h`, `2w`.
fn parse_age(text: &str) -> Option<SignedDuration> {
    let (number, unit) = text.split_at(text.len().checked_sub(1)?);
    let number: i64 = number.parse().ok()?;
    let hours = match unit {
        "h" => 1,
        "d" => 24,
        "w" => 24 * 7,
        _ => return None,
    };
    Some(SignedDuration::from_hours(number.checked_mul(hours)?))
}

fn phase(backup: &Backup) -> Option<BackupPhase> {
    backup.status.as_ref().and_then(|s| s.phase)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(text: &str) -> Timestamp {
        text.parse().expect("time")
    }

    fn schedule(spec: serde_json::Value, status: serde_json::Value) -> BackupSchedule {
        let mut full = json!({ "schedule": "0 3 * * *",
            "template": { "spec": { "cluster": { "name": "orders" }, "method": "physical" } } });
        if let (Some(full), Some(extra)) = (full.as_object_mut(), spec.as_object()) {
            full.extend(extra.clone());
        }
        serde_json::from_value(json!({
            "apiVersion": "backup.cairn.dev/v1", "kind": "BackupSchedule",
            "metadata": { "name": "nightly", "namespace": "shop", "uid": "s-1", "generation": 1,
                          "creationTimestamp": "2026-11-20T00:00:00Z" },
            "spec": full, "status": status,
        }))
        .expect("schedule")
    }

    fn backup(name: &str, phase: &str, completed: &str) -> Arc<Backup> {
        let mut status = json!({ "phase": phase });
        if !completed.is_empty() {
            status["completedAt"] = json!(completed);
        }
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "backup.cairn.dev/v1", "kind": "Backup",
                "metadata": { "name": name },
                "spec": { "cluster": { "name": "orders" }, "method": "physical" },
                "status": status,
            }))
            .expect("backup"),
        )
    }

    fn plan_at(schedule: &BackupSchedule, backups: &[Arc<Backup>], now: &str) -> Plan {
        let timing = Timing::parse(schedule).expect("timing");
        plan(schedule, &timing, backups, Storage::healthy(), at(now))
    }

    #[test]
    fn every_nth_backup_is_verified() {
        let template = json!({ "spec": { "cluster": { "name": "orders" }, "method": "physical",
            "verification": { "sql": "SELECT true" } } });
        let every_third = schedule(json!({ "template": template, "verifyEvery": 3 }), json!({}));
        let made = |slot: &str, verified: bool| {
            let mut backup = (*backup(slot, "Completed", "")).clone();
            backup.metadata.annotations = Some(BTreeMap::from([(
                SLOT_ANNOTATION.to_owned(),
                format!("2026-11-{slot}T02:00:00Z"),
            )]));
            if verified {
                backup.spec.verification = Some(Default::default());
            }
            Arc::new(backup)
        };
        let verified = |backups: &[Arc<Backup>]| {
            let created = plan_at(&every_third, backups, "2026-11-26T02:30:00Z").create;
            created.expect("a Backup").spec.verification.is_some()
        };
        assert!(verified(&[]), "the first is verified");
        assert!(!verified(&[made("25", true)]));
        assert!(!verified(&[made("24", true), made("25", false)]));
        assert!(verified(&[
            made("23", true),
            made("24", false),
            made("25", false)
        ]));
        // Retention took the older ones: verified again, the safe side.
        assert!(verified(&[made("25", false), made("24", false)]));
        let each = schedule(json!({ "template": template }), json!({}));
        let created = plan_at(&each, &[made("25", true)], "2026-11-26T02:30:00Z").create;
        assert!(created.expect("a Backup").spec.verification.is_some());
    }

    #[test]
    fn the_slot_due_makes_one_backup_named_after_it_and_only_once() {
        let nightly = schedule(json!({ "timeZone": "Europe/Paris" }), json!({}));
        let due = plan_at(&nightly, &[], "2026-11-26T02:30:00Z");
        let backup = due.create.expect("a Backup");
        // 03:00 in Paris is 02:00 UTC in November.
        assert_eq!(backup.name_any(), "nightly-202611260200");
        assert_eq!(
            backup.annotations()[SLOT_ANNOTATION],
            "2026-11-26T02:00:00Z"
        );
        assert_eq!(backup.labels()[SCHEDULE_LABEL], "nightly");
        assert_eq!(backup.owner_references()[0].uid, "s-1");
        assert_eq!(
            due.status.last_schedule_time,
            Some(Time(at("2026-11-26T02:00:00Z")))
        );
        assert_eq!(
            due.status.next_schedule_time,
            Some(Time(at("2026-11-27T02:00:00Z")))
        );
        // Once recorded, the same slot makes nothing more.
        let mut taken = nightly.clone();
        taken.status = Some(due.status.clone());
        assert_eq!(plan_at(&taken, &[], "2026-11-26T02:45:00Z").create, None);
    }

    #[test]
    fn suspension_a_missed_deadline_and_forbid_skip_the_slot() {
        let running = [backup("nightly-202611250300", "Running", "")];
        let suspended = schedule(json!({ "suspend": true }), json!({}));
        let idle = plan_at(&suspended, &[], "2026-11-26T03:10:00Z");
        assert!(idle.skipped.is_some());
        assert_eq!(idle.recheck, None, "nothing to look at until resumed");
        // Suspended with a Backup still running: looked at again until it
        // ends, so that `active` stops naming it.
        let winding_down = plan_at(&suspended, &running, "2026-11-26T03:10:00Z");
        assert_eq!(winding_down.recheck, Some(WHILE_ACTIVE));
        let done = [backup(
            "nightly-202611250300",
            "Completed",
            "2026-11-25T03:20:00Z",
        )];
        assert!(
            plan_at(&suspended, &done, "2026-11-26T03:10:00Z")
                .status
                .active
                .is_empty()
        );
        let strict = schedule(json!({ "startingDeadlineSeconds": 300 }), json!({}));
        assert!(
            plan_at(&strict, &[], "2026-11-26T03:10:00Z")
                .create
                .is_none()
        );
        assert!(
            plan_at(&strict, &[], "2026-11-26T03:04:00Z")
                .create
                .is_some()
        );
        let forbid = schedule(json!({}), json!({}));
        let skipped = plan_at(&forbid, &running, "2026-11-26T03:10:00Z");
        assert!(skipped.create.is_none() && skipped.skipped.is_some());
        let replace = schedule(json!({ "concurrencyPolicy": "Replace" }), json!({}));
        let replaced = plan_at(&replace, &running, "2026-11-26T03:10:00Z");
        assert_eq!(replaced.replace, vec!["nightly-202611250300".to_owned()]);
        assert!(replaced.create.is_some());
        // The slot's own Backup, made before a restart lost the status
        // write: recorded, neither replaced nor made again.
        let own = [backup("nightly-202611260300", "Running", "")];
        let again = plan_at(&replace, &own, "2026-11-26T03:10:00Z");
        assert!(
            again.replace.is_empty() && again.create.is_none(),
            "{again:?}"
        );
        assert_eq!(
            again.status.last_schedule_time,
            Some(Time(at("2026-11-26T03:00:00Z")))
        );
        let allow = schedule(json!({ "concurrencyPolicy": "Allow" }), json!({}));
        let both = plan_at(&allow, &running, "2026-11-26T03:10:00Z");
        assert!(both.create.is_some() && both.replace.is_empty());
        assert_eq!(both.status.active.len(), 2);
    }

    #[test]
    fn retention_keeps_the_newest_the_pinned_and_what_count_and_age_allow() {
        let kept = schedule(
            json!({ "retention": { "keepLast": 2, "maxAge": "3d" } }),
            json!({}),
        );
        let mut pinned = (*backup("b1", "Completed", "2026-11-21T03:00:00Z")).clone();
        pinned.metadata.annotations = Some(BTreeMap::from([(
            PINNED_ANNOTATION.to_owned(),
            "true".to_owned(),
        )]));
        let backups = [
            Arc::new(pinned),
            backup("b2", "Completed", "2026-11-22T03:00:00Z"),
            backup("b3", "Completed", "2026-11-24T03:00:00Z"),
            backup("b4", "Completed", "2026-11-25T03:00:00Z"),
            backup("b5", "Completed", "2026-11-26T03:00:00Z"),
            backup("f1", "Failed", "2026-11-23T03:00:00Z"),
            backup("f2", "Failed", "2026-11-24T04:00:00Z"),
        ];
        let mut deleted = retention(&kept, &backups, at("2026-11-26T04:00:00Z"));
        deleted.sort();
        assert_eq!(deleted, ["b2", "b3", "f1"]);
        // The newest completed is kept even past every rule.
        let strict = schedule(json!({ "retention": { "maxAge": "1h" } }), json!({}));
        assert_eq!(
            retention(&strict, &backups[4..5], at("2026-12-26T00:00:00Z")),
            Vec::<String>::new()
        );
    }

    #[test]
    fn backups_turn_unhealthy_after_two_intervals_without_success_or_with_archiving_failing() {
        let nightly = schedule(json!({}), json!({}));
        let healthy = |plan: &Plan| {
            let c = conditions::find(&plan.status.conditions, "BackupsHealthy").expect("set");
            (c.status.clone(), c.reason.clone())
        };
        let recent = [backup("b", "Completed", "2026-11-25T03:10:00Z")];
        assert_eq!(
            healthy(&plan_at(&nightly, &recent, "2026-11-26T12:00:00Z")),
            ("True".into(), "BackupsRecent".into())
        );
        assert_eq!(
            healthy(&plan_at(&nightly, &recent, "2026-11-27T04:00:00Z")),
            ("False".into(), "BackupsStale".into())
        );
        assert_eq!(
            healthy(&plan_at(&nightly, &[], "2026-11-26T12:00:00Z")),
            ("False".into(), "NoSuccessfulBackup".into())
        );
        // Suspended, nothing running: no slot to wait for, and still looked
        // at again when the newest success turns two intervals old (then
        // only at the resync).
        let suspended = schedule(json!({ "suspend": true }), json!({}));
        let waiting = plan_at(&suspended, &recent, "2026-11-26T12:00:00Z");
        assert_eq!(waiting.recheck, Some(Duration::from_secs(15 * 3600 + 600)));
        let stale = plan_at(&suspended, &recent, "2026-11-27T04:00:00Z");
        assert_eq!(stale.recheck, None);
        let timing = Timing::parse(&nightly).expect("timing");
        let archiving = Storage {
            archiving: Err(("WALArchivingFailing", "bucket unreachable".into())),
            ..Storage::healthy()
        };
        let failing = plan(
            &nightly,
            &timing,
            &recent,
            archiving,
            at("2026-11-26T12:00:00Z"),
        );
        assert_eq!(
            healthy(&failing),
            ("False".into(), "WALArchivingFailing".into())
        );
        let unreadable = Storage {
            window: Err("ListObjectsV2: AccessDenied".into()),
            ..Storage::healthy()
        };
        let blind = plan(
            &nightly,
            &timing,
            &recent,
            unreadable,
            at("2026-11-26T12:00:00Z"),
        );
        assert_eq!(healthy(&blind), ("False".into(), "BucketUnreadable".into()));

        // The newest verification failed: unhealthy until a newer one passes.
        let verified = |name: &str, ok: bool, at: &str| {
            let mut b = (*backup(name, "Completed", "2026-11-26T03:10:00Z")).clone();
            b.spec.verification = Some(Default::default());
            let status = b.status.as_mut().expect("status");
            status.verification = Some(cairn_api::backup::v1::VerificationStatus {
                completed_at: Some(Time(at.parse().expect("time"))),
                ..Default::default()
            });
            let reason = if ok { "Verified" } else { "RestoreFailed" };
            let condition = conditions::new(
                VERIFIED,
                ok,
                reason,
                "",
                None,
                Time(at.parse().expect("time")),
            );
            conditions::set(&mut status.conditions, condition);
            Arc::new(b)
        };
        let bad = [verified("b1", false, "2026-11-26T03:20:00Z")];
        let plan = plan_at(&nightly, &bad, "2026-11-26T12:00:00Z");
        assert_eq!(
            healthy(&plan),
            ("False".into(), "VerificationFailed".into())
        );
        let fixed = [
            verified("b1", false, "2026-11-26T03:20:00Z"),
            verified("b2", true, "2026-11-26T04:20:00Z"),
        ];
        let plan = plan_at(&nightly, &fixed, "2026-11-26T12:00:00Z");
        assert_eq!(healthy(&plan), ("True".into(), "BackupsRecent".into()));
        // Pending: looked at again soon, not at the next slot.
        let mut pending = (*backup("b3", "Completed", "2026-11-26T03:10:00Z")).clone();
        pending.spec.verification = Some(Default::default());
        let plan = plan_at(&nightly, &[Arc::new(pending)], "2026-11-26T12:00:00Z");
        assert_eq!(plan.recheck, Some(WHILE_ACTIVE));
    }

    #[test]
    fn the_window_read_from_the_bucket_is_reported_and_kept_while_unreadable() {
        let nightly = schedule(json!({}), json!({}));
        let timing = Timing::parse(&nightly).expect("timing");
        let window = Window {
            first: Some(at("2026-11-20T02:05:00Z")),
            last: Some(at("2026-11-26T11:59:00Z")),
        };
        let read = Storage {
            window: Ok(Some(window)),
            ..Storage::healthy()
        };
        let plan_read = plan(&nightly, &timing, &[], read, at("2026-11-26T12:00:00Z"));
        let status = &plan_read.status;
        assert_eq!(
            status.first_recoverability_point,
            Some(Time(at("2026-11-20T02:05:00Z")))
        );
        assert_eq!(
            status.last_recoverability_point,
            Some(Time(at("2026-11-26T11:59:00Z")))
        );
        let mut seen = nightly.clone();
        seen.status = Some(plan_read.status.clone());
        let unreadable = Storage {
            window: Err("timeout".into()),
            ..Storage::healthy()
        };
        let kept = plan(&seen, &timing, &[], unreadable, at("2026-11-26T12:01:00Z"));
        assert_eq!(
            kept.status.first_recoverability_point,
            status.first_recoverability_point
        );
    }

    #[test]
    fn a_planned_status_is_what_the_api_server_stores_so_the_next_look_writes_nothing() {
        // The bucket's times carry milliseconds; a Time is stored in whole
        // seconds. Planned from its own stored copy, nothing changes (the
        // day's slot taken already).
        let nightly = schedule(
            json!({}),
            json!({ "lastScheduleTime": "2026-11-26T03:00:00Z" }),
        );
        let timing = Timing::parse(&nightly).expect("timing");
        let storage = || Storage {
            window: Ok(Some(Window {
                first: Some(at("2026-11-20T02:05:00.250Z")),
                last: Some(at("2026-11-26T11:59:41.731Z")),
            })),
            ..Storage::healthy()
        };
        let recent = [backup("b", "Completed", "2026-11-26T03:10:00Z")];
        let now = at("2026-11-26T12:00:00.5Z");
        let planned = plan(&nightly, &timing, &recent, storage(), now).status;
        let stored: BackupScheduleStatus =
            serde_json::from_value(serde_json::to_value(&planned).expect("json")).expect("status");
        assert_eq!(stored, planned, "the status as stored");
        let mut seen = nightly.clone();
        seen.status = Some(stored.clone());
        assert_eq!(plan(&seen, &timing, &recent, storage(), now).status, stored);
    }

    #[test]
    fn a_bad_expression_or_zone_is_reported() {
        let bad = schedule(json!({ "schedule": "61 * * * *" }), json!({}));
        assert!(Timing::parse(&bad).is_err());
        let zone = schedule(json!({ "timeZone": "Mars/Olympus" }), json!({}));
        assert!(
            Timing::parse(&zone)
                .err()
                .is_some_and(|e| e.contains("Mars/Olympus"))
        );
    }
}
