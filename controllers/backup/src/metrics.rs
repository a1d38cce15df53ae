//! The backup controller's metrics: Backups by phase, and what finished
//! Backups took. Totals only: a label per Backup or per cluster would grow
//! without bound (each Backup's status has its own figures).

use std::sync::Arc;

use cairn_api::backup::v1::{Backup, BackupPhase};
use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGaugeVec, Opts, Registry};

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
}

impl BackupMetrics {
    /// Registers `cairn_backup_backups{phase}`,
    /// `cairn_backup_finished_total{result,reason}`,
    /// `cairn_backup_duration_seconds` and `cairn_backup_size_bytes`.
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
        };
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
