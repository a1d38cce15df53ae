//! `cairn_postgres_*`: the database as the instance last read it.

use prometheus::{
    Encoder, Gauge, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::error::Error;
use crate::observe::{Role, Sample};

pub struct Metrics {
    registry: Registry,
    up: IntGauge,
    ready: IntGauge,
    role: IntGaugeVec,
    timeline: IntGauge,
    wal_position: IntGauge,
    lag_bytes: IntGauge,
    lag_seconds: Gauge,
    connections: IntGaugeVec,
    database_size: IntGaugeVec,
    last_checkpoint: Gauge,
    pending_restart: IntGauge,
    pub restarts: IntCounter,
    pub reclones: IntCounter,
    step_failures: IntCounterVec,
    pub volume_free: IntGauge,
    pub volume_size: IntGauge,
    pub archive_pending: IntGauge,
    pub archived: IntCounter,
    pub archive_failures: IntCounter,
    pub archive_dropped: IntCounter,
    pub archive_last_success: Gauge,
    pub archive_last_failure: Gauge,
}

impl Metrics {
    pub fn new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        let name = |n: &str, help: &str| Opts::new(format!("cairn_postgres_{n}"), help);
        let metrics = Self {
            up: IntGauge::with_opts(name("up", "1 when the server answers queries"))?,
            ready: IntGauge::with_opts(name(
                "ready",
                "1 when the instance serves its assigned role",
            ))?,
            role: IntGaugeVec::new(
                name(
                    "role",
                    "1 for the role the server reports (primary or replica)",
                ),
                &["role"],
            )?,
            timeline: IntGauge::with_opts(name("timeline", "Current timeline"))?,
            wal_position: IntGauge::with_opts(name(
                "wal_position_bytes",
                "Current WAL position (primary) or last replayed (replica), in bytes",
            ))?,
            lag_bytes: IntGauge::with_opts(name(
                "replication_lag_bytes",
                "Bytes of WAL the primary reported that this replica has not replayed",
            ))?,
            lag_seconds: Gauge::with_opts(name(
                "replication_lag_seconds",
                "Age of the last replayed transaction while WAL waits to be replayed",
            ))?,
            connections: IntGaugeVec::new(
                name("connections", "Client sessions by state"),
                &["state"],
            )?,
            database_size: IntGaugeVec::new(
                name("database_size_bytes", "Size of each database"),
                &["database"],
            )?,
            last_checkpoint: Gauge::with_opts(name(
                "last_checkpoint_timestamp_seconds",
                "Time of the last completed checkpoint (restartpoint on a replica)",
            ))?,
            pending_restart: IntGauge::with_opts(name(
                "pending_restart_settings",
                "Changed settings that take effect only after a restart",
            ))?,
            restarts: IntCounter::with_opts(name(
                "restarts_total",
                "Times postgres exited unexpectedly and was started again",
            ))?,
            reclones: IntCounter::with_opts(name(
                "reclones_total",
                "Times this replica was cloned again because the primary no longer had the WAL it needed",
            ))?,
            step_failures: IntCounterVec::new(
                name(
                    "step_failures_total",
                    "Failed steps of the instance (preparing the data folder, starting, \
                     reconfiguring or promoting postgres, its roles, loading a dump), by class",
                ),
                &["class"],
            )?,
            volume_free: IntGauge::with_opts(name(
                "data_volume_free_bytes",
                "Free bytes on the filesystem of the data folder",
            ))?,
            volume_size: IntGauge::with_opts(name(
                "data_volume_size_bytes",
                "Size of the filesystem of the data folder",
            ))?,
            archive_pending: IntGauge::with_opts(name(
                "wal_archive_pending_files",
                "WAL files PostgreSQL has marked ready that are not archived yet",
            ))?,
            archived: IntCounter::with_opts(name(
                "wal_archived_files_total",
                "WAL files stored in the backup destination",
            ))?,
            archive_failures: IntCounter::with_opts(name(
                "wal_archive_failures_total",
                "Failed attempts to store a WAL file in the backup destination",
            ))?,
            archive_dropped: IntCounter::with_opts(name(
                "wal_archive_dropped_files_total",
                "WAL files acknowledged without being stored, by the pending-size guard",
            ))?,
            archive_last_success: Gauge::with_opts(name(
                "wal_archive_last_success_timestamp_seconds",
                "When a WAL file was last stored (0: never since the instance started)",
            ))?,
            archive_last_failure: Gauge::with_opts(name(
                "wal_archive_last_failure_timestamp_seconds",
                "When storing a WAL file last failed (0: never since the instance started)",
            ))?,
            registry,
        };
        let r = &metrics.registry;
        r.register(Box::new(metrics.up.clone()))?;
        r.register(Box::new(metrics.ready.clone()))?;
        r.register(Box::new(metrics.role.clone()))?;
        r.register(Box::new(metrics.timeline.clone()))?;
        r.register(Box::new(metrics.wal_position.clone()))?;
        r.register(Box::new(metrics.lag_bytes.clone()))?;
        r.register(Box::new(metrics.lag_seconds.clone()))?;
        r.register(Box::new(metrics.connections.clone()))?;
        r.register(Box::new(metrics.database_size.clone()))?;
        r.register(Box::new(metrics.last_checkpoint.clone()))?;
        r.register(Box::new(metrics.pending_restart.clone()))?;
        r.register(Box::new(metrics.restarts.clone()))?;
        r.register(Box::new(metrics.reclones.clone()))?;
        r.register(Box::new(metrics.step_failures.clone()))?;
        r.register(Box::new(metrics.volume_free.clone()))?;
        r.register(Box::new(metrics.volume_size.clone()))?;
        r.register(Box::new(metrics.archive_pending.clone()))?;
        r.register(Box::new(metrics.archived.clone()))?;
        r.register(Box::new(metrics.archive_failures.clone()))?;
        r.register(Box::new(metrics.archive_dropped.clone()))?;
        r.register(Box::new(metrics.archive_last_success.clone()))?;
        r.register(Box::new(metrics.archive_last_failure.clone()))?;
        // Every class from zero: a rate over a series that appears only
        // with its first failure misses that failure.
        for class in Error::CLASSES {
            metrics.step_failures.with_label_values(&[class]);
        }
        Ok(metrics)
    }

    /// Records a sample, or the server's absence (`None`).
    pub fn observe(&self, sample: Option<&Sample>, ready: bool) {
        self.ready.set(i64::from(ready));
        let Some(sample) = sample else {
            self.up.set(0);
            return;
        };
        self.up.set(1);
        let role = if sample.in_recovery {
            Role::Replica
        } else {
            Role::Primary
        };
        for r in [Role::Primary, Role::Replica] {
            self.role
                .with_label_values(&[&r.to_string()])
                .set(i64::from(r == role));
        }
        self.timeline.set(sample.timeline.map_or(0, i64::from));
        self.wal_position.set(sample.wal_bytes.unwrap_or(0));
        self.lag_bytes.set(sample.lag_bytes.unwrap_or(0));
        self.lag_seconds.set(sample.lag_seconds.unwrap_or(0.0));
        self.last_checkpoint
            .set(sample.last_checkpoint.unwrap_or(0.0));
        self.pending_restart
            .set(sample.pending_restart.len() as i64);
        self.connections.reset();
        for (state, count) in &sample.connections {
            self.connections.with_label_values(&[state]).set(*count);
        }
    }

    /// Counts a failed step of `class` (`Error::class`).
    pub fn step_failed(&self, class: &str) {
        self.step_failures.with_label_values(&[class]).inc();
    }

    pub fn database_sizes(&self, sizes: &[(String, i64)]) {
        self.database_size.reset();
        for (database, size) in sizes {
            self.database_size.with_label_values(&[database]).set(*size);
        }
    }

    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metrics.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buffer);
        String::from_utf8(buffer).unwrap_or_default()
    }
}
