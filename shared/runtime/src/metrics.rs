//! The standard metrics of every controller, prefixed `cairn_` and labelled
//! with the controller's name. Labels hold kinds and error classes, never an
//! object's name, so cardinality stays fixed however many objects there are.

use std::collections::HashMap;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use crate::errors::ErrorClass;

/// A failure outside a reconcile: the `reason` label of
/// `cairn_runtime_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeError {
    /// The task draining a cache for a standby ended: no change reaches the
    /// controller any more.
    CacheTaskEnded,
    /// An object could not be serialised to compare or send it.
    Serialization,
    /// A conversion between API versions could not carry a field.
    Conversion,
}

impl RuntimeError {
    pub const ALL: [Self; 3] = [Self::CacheTaskEnded, Self::Serialization, Self::Conversion];

    pub fn label(self) -> &'static str {
        match self {
            Self::CacheTaskEnded => "cache_task_ended",
            Self::Serialization => "serialization",
            Self::Conversion => "conversion",
        }
    }
}

/// The standard metrics, registered in [`Metrics::registry`], where a
/// controller registers its own domain metrics too.
#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    /// The standard `process_*` metrics, which dashboards expect unprefixed.
    process_registry: Registry,
    /// `cairn_reconcile_total{kind}`: reconciles run.
    pub reconciles: IntCounterVec,
    /// `cairn_reconcile_errors_total{kind, reason}`: failed reconciles by error class.
    pub reconcile_errors: IntCounterVec,
    /// `cairn_reconcile_duration_seconds{kind}`.
    pub reconcile_duration: HistogramVec,
    /// `cairn_reconciles_in_flight{kind}`.
    pub reconciles_in_flight: IntGaugeVec,
    /// `cairn_objects_in_cache{kind}`: objects in the controller's caches.
    pub objects_in_cache: IntGaugeVec,
    /// `cairn_watch_failures_total{kind}`: failed watch and list requests
    /// of a cache (each retried with backoff).
    pub watch_failures: IntCounterVec,
    /// `cairn_leader`: 1 while this replica holds the lease.
    pub leader: IntGauge,
    /// `cairn_lease_transitions_total`: times this replica gained or lost the lease.
    pub lease_transitions: IntCounter,
    /// `cairn_runtime_errors_total{reason}`: failures outside a reconcile.
    pub runtime_errors: IntCounterVec,
}

impl Metrics {
    /// The metrics of controller `controller` (e.g. `database`), with
    /// `cairn_build_info{version, git_commit}` set to 1 and, on Linux, the
    /// process metrics (`process_resident_memory_bytes`, CPU, open fds).
    pub fn new(
        controller: &str,
        version: &str,
        git_commit: &str,
    ) -> Result<Self, prometheus::Error> {
        let labels = HashMap::from([("controller".to_owned(), controller.to_owned())]);
        let registry = Registry::new_custom(Some("cairn".to_owned()), Some(labels.clone()))?;
        let process_registry = Registry::new_custom(None, Some(labels))?;
        let metrics = Self {
            reconciles: IntCounterVec::new(
                Opts::new("reconcile_total", "Reconciles run."),
                &["kind"],
            )?,
            reconcile_errors: IntCounterVec::new(
                Opts::new(
                    "reconcile_errors_total",
                    "Failed reconciles, by error class.",
                ),
                &["kind", "reason"],
            )?,
            reconcile_duration: HistogramVec::new(
                HistogramOpts::new("reconcile_duration_seconds", "Time a reconcile took.").buckets(
                    vec![
                        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                    ],
                ),
                &["kind"],
            )?,
            reconciles_in_flight: IntGaugeVec::new(
                Opts::new("reconciles_in_flight", "Reconciles running now."),
                &["kind"],
            )?,
            objects_in_cache: IntGaugeVec::new(
                Opts::new("objects_in_cache", "Objects in the controller's caches."),
                &["kind"],
            )?,
            watch_failures: IntCounterVec::new(
                Opts::new(
                    "watch_failures_total",
                    "Failed watch and list requests of a cache, each retried.",
                ),
                &["kind"],
            )?,
            leader: IntGauge::new("leader", "1 while this replica holds the leader lease.")?,
            lease_transitions: IntCounter::new(
                "lease_transitions_total",
                "Times this replica gained or lost the leader lease.",
            )?,
            runtime_errors: IntCounterVec::new(
                Opts::new(
                    "runtime_errors_total",
                    "Failures outside a reconcile, by reason.",
                ),
                &["reason"],
            )?,
            registry,
            process_registry,
        };
        for reason in RuntimeError::ALL {
            metrics.runtime_errors.with_label_values(&[reason.label()]);
        }
        let build_info = IntGaugeVec::new(
            Opts::new(
                "build_info",
                "Version and git commit of the running binary.",
            ),
            &["version", "git_commit"],
        )?;
        build_info.with_label_values(&[version, git_commit]).set(1);
        let r = &metrics.registry;
        r.register(Box::new(metrics.reconciles.clone()))?;
        r.register(Box::new(metrics.reconcile_errors.clone()))?;
        r.register(Box::new(metrics.reconcile_duration.clone()))?;
        r.register(Box::new(metrics.reconciles_in_flight.clone()))?;
        r.register(Box::new(metrics.objects_in_cache.clone()))?;
        r.register(Box::new(metrics.watch_failures.clone()))?;
        r.register(Box::new(metrics.leader.clone()))?;
        r.register(Box::new(metrics.lease_transitions.clone()))?;
        r.register(Box::new(metrics.runtime_errors.clone()))?;
        r.register(Box::new(build_info))?;
        #[cfg(target_os = "linux")]
        metrics.process_registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        Ok(metrics)
    }

    /// Records a failed reconcile of `kind`.
    pub fn record_error(&self, kind: &str, class: ErrorClass) {
        self.reconcile_errors
            .with_label_values(&[kind, class.label()])
            .inc();
    }

    /// Records a failure outside a reconcile.
    pub fn record_runtime_error(&self, error: RuntimeError) {
        self.runtime_errors
            .with_label_values(&[error.label()])
            .inc();
    }

    /// Everything registered, in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        let mut families = self.registry.gather();
        families.extend(self.process_registry.gather());
        // Only a malformed family fails; the scrape still gets what encoded.
        if let Err(e) = TextEncoder::new().encode(&families, &mut buffer) {
            tracing::error!(error = %e, "cannot encode the metrics");
            self.record_runtime_error(RuntimeError::Serialization);
        }
        String::from_utf8_lossy(&buffer).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_standard_metric_with_the_controller_label() {
        let metrics = Metrics::new("database", "0.1.0", "abc123").expect("valid metrics");
        metrics
            .reconciles
            .with_label_values(&["DatabaseCluster"])
            .inc();
        metrics.record_error("DatabaseCluster", ErrorClass::InvalidSpec);
        metrics
            .reconcile_duration
            .with_label_values(&["DatabaseCluster"])
            .observe(0.2);
        metrics
            .reconciles_in_flight
            .with_label_values(&["DatabaseCluster"])
            .set(0);
        metrics
            .objects_in_cache
            .with_label_values(&["DatabaseCluster"])
            .set(3);
        metrics.watch_failures.with_label_values(&["Pod"]).inc();
        metrics.leader.set(1);
        metrics.lease_transitions.inc();
        let text = metrics.render();
        for expected in [
            r#"cairn_reconcile_total{kind="DatabaseCluster",controller="database"} 1"#,
            r#"cairn_reconcile_errors_total{kind="DatabaseCluster",reason="invalid_spec",controller="database"} 1"#,
            r#"cairn_reconcile_duration_seconds_count{kind="DatabaseCluster",controller="database"} 1"#,
            r#"cairn_reconciles_in_flight{kind="DatabaseCluster",controller="database"} 0"#,
            r#"cairn_objects_in_cache{kind="DatabaseCluster",controller="database"} 3"#,
            r#"cairn_watch_failures_total{kind="Pod",controller="database"} 1"#,
            r#"cairn_leader{controller="database"} 1"#,
            r#"cairn_lease_transitions_total{controller="database"} 1"#,
            r#"cairn_build_info{git_commit="abc123",version="0.1.0",controller="database"} 1"#,
        ] {
            assert!(text.contains(expected), "missing {expected} in:\n{text}");
        }
        #[cfg(target_os = "linux")]
        assert!(
            text.contains("\nprocess_resident_memory_bytes{controller=\"database\"}"),
            "{text}"
        );
    }
}
