//! The database controller's own metrics, beyond the runtime's: how many
//! clusters are in each phase, instances desired against ready, failovers and
//! how long they took. Totals only: a label per cluster would grow without
//! bound.

use std::sync::Arc;

use cairn_api::database::v1::{DatabaseCluster, DatabaseClusterPhase};
use prometheus::{Histogram, HistogramOpts, IntCounter, IntGaugeVec, Opts, Registry};

const PHASES: [DatabaseClusterPhase; 7] = [
    DatabaseClusterPhase::Creating,
    DatabaseClusterPhase::Running,
    DatabaseClusterPhase::Scaling,
    DatabaseClusterPhase::Upgrading,
    DatabaseClusterPhase::Degraded,
    DatabaseClusterPhase::Failed,
    DatabaseClusterPhase::Paused,
];

#[derive(Clone)]
pub struct ClusterMetrics {
    clusters: IntGaugeVec,
    instances: IntGaugeVec,
    /// Automated failovers (a replica promoted after its primary was lost).
    pub failovers: IntCounter,
    /// From the lost primary's last heartbeat to the new primary serving.
    pub failover_seconds: Histogram,
}

impl ClusterMetrics {
    /// Registers `cairn_database_clusters{phase}` and
    /// `cairn_database_instances{state="desired"|"ready"}` in `registry`.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let metrics = Self {
            clusters: IntGaugeVec::new(
                Opts::new(
                    "database_clusters",
                    "DatabaseClusters by phase (Unknown: no status yet).",
                ),
                &["phase"],
            )?,
            instances: IntGaugeVec::new(
                Opts::new(
                    "database_instances",
                    "PostgreSQL instances of all clusters, desired and ready.",
                ),
                &["state"],
            )?,
            failovers: IntCounter::new(
                "database_failovers_total",
                "Automated failovers: replicas promoted after their primary was lost.",
            )?,
            failover_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "database_failover_duration_seconds",
                    "From the lost primary's last heartbeat to the promoted replica serving writes.",
                )
                .buckets(vec![2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 120.0, 300.0]),
            )?,
        };
        registry.register(Box::new(metrics.clusters.clone()))?;
        registry.register(Box::new(metrics.instances.clone()))?;
        registry.register(Box::new(metrics.failovers.clone()))?;
        registry.register(Box::new(metrics.failover_seconds.clone()))?;
        Ok(metrics)
    }

    /// Sets the gauges from every cached cluster.
    pub fn refresh(&self, clusters: &[Arc<DatabaseCluster>]) {
        let phase_of = |c: &DatabaseCluster| c.status.as_ref().and_then(|s| s.phase);
        for phase in PHASES {
            let count = clusters
                .iter()
                .filter(|c| phase_of(c) == Some(phase))
                .count();
            self.clusters
                .with_label_values(&[&format!("{phase:?}")])
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        let unknown = clusters.iter().filter(|c| phase_of(c).is_none()).count();
        self.clusters
            .with_label_values(&["Unknown"])
            .set(i64::try_from(unknown).unwrap_or(i64::MAX));
        let desired: i64 = clusters.iter().map(|c| i64::from(c.spec.instances)).sum();
        let ready: i64 = clusters
            .iter()
            .filter_map(|c| c.status.as_ref()?.ready_instances)
            .map(i64::from)
            .sum();
        self.instances.with_label_values(&["desired"]).set(desired);
        self.instances.with_label_values(&["ready"]).set(ready);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_api::database::v1::{DatabaseClusterSpec, DatabaseClusterStatus};

    fn cluster(
        instances: i32,
        phase: Option<DatabaseClusterPhase>,
        ready: i32,
    ) -> Arc<DatabaseCluster> {
        let spec: DatabaseClusterSpec = serde_json::from_value(serde_json::json!({
            "instances": instances, "postgres": {"version": "17"}, "storage": {"size": "1Gi"}
        }))
        .expect("valid spec");
        let mut cluster = DatabaseCluster::new("c", spec);
        cluster.status = phase.map(|phase| DatabaseClusterStatus {
            phase: Some(phase),
            ready_instances: Some(ready),
            ..DatabaseClusterStatus::default()
        });
        Arc::new(cluster)
    }

    #[test]
    fn counts_phases_and_instances() {
        let registry = Registry::new_custom(Some("cairn".into()), None).expect("registry");
        let metrics = ClusterMetrics::register(&registry).expect("registers");
        metrics.refresh(&[
            cluster(3, Some(DatabaseClusterPhase::Running), 3),
            cluster(2, Some(DatabaseClusterPhase::Degraded), 1),
            cluster(1, None, 0),
        ]);
        let text = {
            let mut buffer = Vec::new();
            prometheus::Encoder::encode(
                &prometheus::TextEncoder::new(),
                &registry.gather(),
                &mut buffer,
            )
            .expect("encodes");
            String::from_utf8(buffer).expect("utf-8")
        };
        for line in [
            "cairn_database_clusters{phase=\"Running\"} 1",
            "cairn_database_clusters{phase=\"Degraded\"} 1",
            "cairn_database_clusters{phase=\"Unknown\"} 1",
            "cairn_database_clusters{phase=\"Failed\"} 0",
            "cairn_database_instances{state=\"desired\"} 6",
            "cairn_database_instances{state=\"ready\"} 4",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }
}
