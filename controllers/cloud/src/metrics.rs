//! The cloud controller's own metrics, registered next to the standard ones
//! (`cairn_` prefix, `controller="cloud"`). Labels hold kinds, services and
//! operations, never an object's or a resource's name.

use aws_sdk_s3::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::FinalizerInterceptorContextRef;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use std::collections::BTreeMap;
use std::time::Duration;

use kube::runtime::reflector::Store;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

use crate::driver::Managed;

#[derive(Clone, Debug)]
pub struct CloudMetrics {
    /// `cairn_provider_calls_total{service, operation, outcome}`: attempts
    /// on the wire (the SDK's retries each count); `outcome` is the HTTP
    /// status class (`2xx`, `3xx`, `4xx`, `5xx`) or `error` (no response).
    pub calls: IntCounterVec,
    /// `cairn_drift_corrections_total{kind}`: updates that put a drifted
    /// external resource back to its spec.
    pub drift_corrections: IntCounterVec,
    /// `cairn_time_to_ready_seconds{kind}`: from the object's creation to
    /// the resource it had created being Ready.
    pub time_to_ready: HistogramVec,
    /// `cairn_managed_resources{kind, ready}`: objects by the status of
    /// their Ready condition (`True`, `False`, `Unknown` before the first),
    /// counted from the caches every few seconds.
    pub resources: IntGaugeVec,
}

impl CloudMetrics {
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let metrics = Self {
            calls: IntCounterVec::new(
                Opts::new(
                    "provider_calls_total",
                    "Calls to the cloud provider, by service, operation and outcome.",
                ),
                &["service", "operation", "outcome"],
            )?,
            drift_corrections: IntCounterVec::new(
                Opts::new(
                    "drift_corrections_total",
                    "External resources put back to their spec after they drifted.",
                ),
                &["kind"],
            )?,
            time_to_ready: HistogramVec::new(
                HistogramOpts::new(
                    "time_to_ready_seconds",
                    "From an object's creation to its external resource being Ready.",
                )
                .buckets(vec![1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0]),
                &["kind"],
            )?,
            resources: IntGaugeVec::new(
                Opts::new(
                    "managed_resources",
                    "Objects of each managed kind by the status of their Ready condition.",
                ),
                &["kind", "ready"],
            )?,
        };
        registry.register(Box::new(metrics.resources.clone()))?;
        registry.register(Box::new(metrics.calls.clone()))?;
        registry.register(Box::new(metrics.drift_corrections.clone()))?;
        registry.register(Box::new(metrics.time_to_ready.clone()))?;
        Ok(metrics)
    }
}

/// The task that keeps `cairn_managed_resources` current for the objects
/// in `store`, run every [`COUNT_INTERVAL`] by the manager.
pub fn count_by_ready<M: Managed>(gauge: IntGaugeVec, store: Store<M>) -> impl FnMut() + Send {
    let kind = M::kind(&());
    move || {
        let mut counts = BTreeMap::from([("True", 0), ("False", 0), ("Unknown", 0)]);
        for object in store.state() {
            *counts.entry(ready_status(&*object)).or_default() += 1;
        }
        for (ready, count) in counts {
            gauge.with_label_values(&[&kind, ready]).set(count);
        }
    }
}

pub const COUNT_INTERVAL: Duration = Duration::from_secs(10);

fn ready_status(object: &impl Managed) -> &'static str {
    let ready = object
        .cloud_status()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
    match ready.map(|c| c.status.as_str()) {
        Some("True") => "True",
        Some("False") => "False",
        _ => "Unknown",
    }
}

/// Counts every attempt of an SDK client in `cairn_provider_calls_total`.
#[derive(Debug)]
pub struct CallCounter(pub IntCounterVec);

impl Intercept for CallCounter {
    fn name(&self) -> &'static str {
        "CallCounter"
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let (service, operation) = cfg
            .load::<Metadata>()
            .map_or(("unknown", "unknown"), |m| (m.service(), m.name()));
        let outcome = context
            .response()
            .map_or("error", |r| status_class(r.status().as_u16()));
        self.0
            .with_label_values(&[service, operation, outcome])
            .inc();
        Ok(())
    }
}

fn status_class(status: u16) -> &'static str {
    match status {
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}
