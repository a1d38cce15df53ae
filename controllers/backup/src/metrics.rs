//! The backup controller's metrics: Backups by phase, what finished
//! Backups took, what their deletion did to the bucket, and per schedule
//! (the one label that follows objects: a schedule is what an alert is
//! about, and there are few) its last success, last verified backup and
//! recoverability window.
//! No label per Backup: each Backup's status has its own figures.

use std::sync::Arc;

use cairn_api::backup::v1::{Backup, BackupPhase, BackupSchedule, BackupStatus, VERIFIED};
use cairn_api::common::Time;
use cairn_runtime::conditions;
use kube::ResourceExt;
use prometheus::{GaugeVec, Histogram, HistogramOpts, IntCounterVec, IntGaugeVec, Opts, Registry};

use crate::plan::Decision;

const PHASES: [BackupPhase; 4] = [
    BackupPhase::Pending,
    BackupPhase::Running,
    BackupPhase::Completed,
    BackupPhase::Failed,
];

#[derive(Clone)]
pub struct BackupMetrics {
    backups: IntGaugeVec,
    finished: IntCounterVec,
    duration: Histogram,
    size: Histogram,
    artifacts: IntCounterVec,
    verifications: IntCounterVec,
    schedule_times: GaugeVec,
    schedule_healthy: IntGaugeVec,
}

/// The times `cairn_backup_schedule_timestamp_seconds` reports, by label.
const SCHEDULE_TIMES: [&str; 5] = [
    "last_success",
    "last_failure",
    "last_verified",
    "first_recoverability_point",
    "last_recoverability_point",
];

impl BackupMetrics {
    /// Registers `cairn_backup_backups{phase}`,
    /// `cairn_backup_finished_total{result,reason}`,
    /// `cairn_backup_duration_seconds`, `cairn_backup_size_bytes`,
    /// `cairn_backup_artifact_deletions_total{result}`,
    /// `cairn_backup_verifications_total{result}`,
    /// `cairn_backup_schedule_healthy{namespace,schedule,reason}` and
    /// `cairn_backup_schedule_timestamp_seconds{namespace,schedule,time}`.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let metrics = Self {
            backups: IntGaugeVec::new(
                Opts::new(
                    "backup_backups",
                    "Backups by phase (Unknown: no status yet).",
                ),
                &["phase"],
            )?,
            finished: IntCounterVec::new(
                Opts::new(
                    "backup_finished_total",
                    "Backups that completed or failed, by result and reason.",
                ),
                &["result", "reason"],
            )?,
            duration: Histogram::with_opts(
                HistogramOpts::new(
                    "backup_duration_seconds",
                    "Completed base backups: from the instance's start to the stored manifest.",
                )
                .buckets(prometheus::exponential_buckets(1.0, 2.0, 16)?),
            )?,
            size: Histogram::with_opts(
                HistogramOpts::new(
                    "backup_size_bytes",
                    "Completed base backups: compressed bytes stored.",
                )
                .buckets(prometheus::exponential_buckets(
                    1024.0 * 1024.0,
                    4.0,
                    12,
                )?),
            )?,
            artifacts: IntCounterVec::new(
                Opts::new(
                    "backup_artifact_deletions_total",
                    "Deleted Backups with deletionPolicy Delete, by what became of the stored \
                     backup: ArtifactDeleted, BucketGone, ArtifactKept (destination unknown or \
                     unusable), ArtifactLeaked (removal failed until the controller gave up).",
                ),
                &["result"],
            )?,
            verifications: IntCounterVec::new(
                Opts::new(
                    "backup_verifications_total",
                    "Restore verifications recorded, by result: verified or failed.",
                ),
                &["result"],
            )?,
            schedule_healthy: IntGaugeVec::new(
                Opts::new(
                    "backup_schedule_healthy",
                    "Per BackupSchedule: 1 when its BackupsHealthy condition is True, 0 when \
                     False; reason is the condition's (BackupsStale, WALArchivingFailing, \
                     VerificationFailed, ...).",
                ),
                &["namespace", "schedule", "reason"],
            )?,
            schedule_times: GaugeVec::new(
                Opts::new(
                    "backup_schedule_timestamp_seconds",
                    "Per BackupSchedule: when its newest successful Backup completed \
                     (time=last_success), its newest failed Backup failed (last_failure) and \
                     its newest verified Backup was verified (last_verified), among the Backups \
                     retention kept, and the cluster's recoverability window \
                     (first_recoverability_point, last_recoverability_point), in Unix seconds.",
                ),
                &["namespace", "schedule", "time"],
            )?,
        };
        registry.register(Box::new(metrics.artifacts.clone()))?;
        registry.register(Box::new(metrics.verifications.clone()))?;
        registry.register(Box::new(metrics.schedule_times.clone()))?;
        registry.register(Box::new(metrics.schedule_healthy.clone()))?;
        registry.register(Box::new(metrics.backups.clone()))?;
        registry.register(Box::new(metrics.finished.clone()))?;
        registry.register(Box::new(metrics.duration.clone()))?;
        registry.register(Box::new(metrics.size.clone()))?;
        Ok(metrics)
    }

    /// A Backup's final status was written.
    pub fn finished(&self, decision: &Decision) {
        match decision {
            Decision::Completed(report) => {
                self.finished
                    .with_label_values(&["Completed", "Completed"])
                    .inc();
                if let Some(ms) = report.duration_milliseconds {
                    self.duration.observe(ms as f64 / 1000.0);
                }
                self.size.observe(report.stored_bytes as f64);
            }
            Decision::Failed { reason, .. } => {
                self.finished.with_label_values(&["Failed", reason]).inc();
            }
            _ => {}
        }
    }

    /// A deleted Backup's stored backup was dealt with (`result` as above).
    pub fn artifact(&self, result: &str) {
        self.artifacts.with_label_values(&[result]).inc();
    }

    /// A restore verification's outcome was recorded.
    pub fn verified(&self, verified: bool) {
        let result = if verified { "verified" } else { "failed" };
        self.verifications.with_label_values(&[result]).inc();
    }

    /// Sets the schedules' times from every cached schedule and Backup (a
    /// schedule deleted loses its series).
    pub fn refresh_schedules(&self, schedules: &[Arc<BackupSchedule>], backups: &[Arc<Backup>]) {
        self.schedule_times.reset();
        self.schedule_healthy.reset();
        for schedule in schedules {
            let Some(status) = &schedule.status else {
                continue;
            };
            let namespace = schedule.namespace().unwrap_or_default();
            if let Some(health) = conditions::find(&status.conditions, "BackupsHealthy") {
                self.schedule_healthy
                    .with_label_values(&[namespace.as_str(), &schedule.name_any(), &health.reason])
                    .set(i64::from(health.status == "True"));
            }
            let last_failure = newest(schedule, backups, |status| {
                (status.phase == Some(BackupPhase::Failed)).then(|| status.completed_at.clone())?
            });
            let last_verified = newest(schedule, backups, |status| {
                conditions::is_true(&status.conditions, VERIFIED)
                    .then(|| status.verification.as_ref()?.completed_at.clone())?
            });
            let times = [
                &status.last_successful_time,
                &last_failure,
                &last_verified,
                &status.first_recoverability_point,
                &status.last_recoverability_point,
            ];
            for (label, time) in SCHEDULE_TIMES.iter().zip(times) {
                if let Some(time) = time {
                    self.schedule_times
                        .with_label_values(&[namespace.as_str(), &schedule.name_any(), label])
                        .set(time.0.as_millisecond() as f64 / 1000.0);
                }
            }
        }
    }

    /// Sets the phase gauge from every cached Backup.
    pub fn refresh(&self, backups: &[Arc<Backup>]) {
        let phase_of = |b: &Backup| b.status.as_ref().and_then(|s| s.phase);
        for phase in PHASES {
            let count = backups
                .iter()
                .filter(|b| phase_of(b) == Some(phase))
                .count();
            self.backups
                .with_label_values(&[&format!("{phase:?}")])
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        let unknown = backups.iter().filter(|b| phase_of(b).is_none()).count();
        self.backups
            .with_label_values(&["Unknown"])
            .set(i64::try_from(unknown).unwrap_or(i64::MAX));
    }
}

/// The newest of the times `time` gives for the Backups of `schedule`.
fn newest(
    schedule: &BackupSchedule,
    backups: &[Arc<Backup>],
    time: impl Fn(&BackupStatus) -> Option<Time>,
) -> Option<Time> {
    let name = schedule.name_any();
    backups
        .iter()
        .filter(|b| b.namespace() == schedule.namespace())
        .filter(|b| b.labels().get(cairn_api::backup::v1::SCHEDULE_LABEL) == Some(&name))
        .filter_map(|b| time(b.status.as_ref()?))
        .max_by_key(|t| t.0)
}
