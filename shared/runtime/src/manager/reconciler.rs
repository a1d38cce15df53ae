//! The reconcile function as the manager runs it: skipped unless this
//! replica is sure it leads, measured, traced, and retried by the class of
//! its error, with the backoff state of deleted objects dropped.

use std::collections::HashMap;
use std::fmt::Display;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::{Classify, Recheck};
use crate::errors::{Backoff, ErrorClass};
use crate::leader::Sureness;
use crate::metrics::Metrics;

/// The reconcile function wrapped in what every controller needs.
pub(super) struct Instrumented<F, Ctx> {
    reconcile: F,
    context: Arc<Ctx>,
    metrics: Metrics,
    backoff: Backoff,
    resync: Duration,
    /// Consecutive failures per object, for the backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// Whether this replica surely leads, once it competes for the lease.
    leading: Arc<OnceLock<Sureness>>,
}

impl<F, Ctx> Instrumented<F, Ctx> {
    pub(super) fn new(
        reconcile: F,
        context: Arc<Ctx>,
        metrics: Metrics,
        backoff: Backoff,
        resync: Duration,
        leading: Arc<OnceLock<Sureness>>,
    ) -> Self {
        Self {
            reconcile,
            context,
            metrics,
            backoff,
            resync,
            failures: Mutex::new(HashMap::new()),
            leading,
        }
    }

    pub(super) async fn reconcile<K, E, Fut>(&self, object: Arc<K>) -> Result<Action, E>
    where
        K: Resource<DynamicType = ()>,
        E: Classify + Display,
        F: Fn(Arc<K>, Arc<Ctx>) -> Fut,
        Fut: Future<Output = Result<Recheck, E>>,
    {
        let kind = K::kind(&());
        let reference = ObjectRef::from_obj(&*object).to_string();
        if !self.leading.get().is_some_and(Sureness::is_sure) {
            // Frozen past the renew deadline, say: another replica may lead
            // by now. Write nothing; the election settles it within moments.
            tracing::warn!(object = %reference, "not sure this replica still leads: reconcile skipped");
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        let span = tracing::info_span!(
            "reconcile",
            kind = %kind,
            object = %reference,
            trace_id = tracing::field::Empty
        );
        record_trace_id(&span);
        let in_flight = self
            .metrics
            .reconciles_in_flight
            .with_label_values(&[&kind]);
        in_flight.inc();
        let started = Instant::now();
        let result = (self.reconcile)(object, self.context.clone())
            .instrument(span.clone())
            .await;
        in_flight.dec();
        self.metrics
            .reconcile_duration
            .with_label_values(&[&kind])
            .observe(started.elapsed().as_secs_f64());
        self.metrics.reconciles.with_label_values(&[&kind]).inc();
        match &result {
            Ok(_) => {
                self.lock_failures().remove(&reference);
            }
            Err(e) => {
                self.metrics.record_error(&kind, e.class());
                span.in_scope(
                    || tracing::warn!(reason = e.class().label(), error = %e, "reconcile failed"),
                );
            }
        }
        // A successful reconcile is checked again after the resync interval
        // (drift the watches cannot see), or sooner if it asked.
        result.map(|recheck| match recheck {
            Recheck::AfterResync => Action::requeue(self.resync),
            Recheck::Within(delay) => Action::requeue(delay.min(self.resync)),
        })
    }

    pub(super) fn error_policy<K, E>(&self, object: Arc<K>, error: &E) -> Action
    where
        K: Resource<DynamicType = ()>,
        E: Classify,
    {
        let reference = ObjectRef::from_obj(&*object).to_string();
        match self.retry_delay(reference, error.class()) {
            Some(delay) => Action::requeue(delay),
            None => Action::await_change(),
        }
    }

    /// When to retry a failed object; `None`: when its spec changes.
    fn retry_delay(&self, reference: String, class: ErrorClass) -> Option<Duration> {
        let mut failures = self.lock_failures();
        match class {
            // The reconcile recorded the problem in a condition; retrying
            // cannot help until the user changes the spec.
            ErrorClass::InvalidSpec => {
                failures.remove(&reference);
                None
            }
            ErrorClass::Transient | ErrorClass::DependencyNotReady => {
                let count = failures.entry(reference).or_insert(0);
                *count = count.saturating_add(1);
                Some(self.backoff.delay(*count))
            }
        }
    }

    /// Forgets the failures of objects `store` no longer holds.
    fn forget_missing<K>(&self, store: &Store<K>)
    where
        K: Resource<DynamicType = ()> + Clone,
    {
        let mut failures = self.lock_failures();
        if failures.is_empty() {
            return;
        }
        let present: std::collections::HashSet<String> = store
            .state()
            .iter()
            .map(|object| ObjectRef::from_obj(&**object).to_string())
            .collect();
        failures.retain(|reference, _| present.contains(reference));
    }

    fn lock_failures(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.failures.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How often per-object state of deleted objects is dropped.
const FORGET_INTERVAL: Duration = Duration::from_secs(60);

/// Drops the backoff state of objects no longer in `store` (deleted while
/// failing), so memory stays bounded however many objects come and go.
pub(super) fn forget_deleted<F, Ctx, K>(
    instrumented: Arc<Instrumented<F, Ctx>>,
    store: Store<K>,
) -> JoinHandle<()>
where
    F: Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    tokio::spawn(async move {
        let mut every = tokio::time::interval(FORGET_INTERVAL);
        loop {
            every.tick().await;
            instrumented.forget_missing(&store);
        }
    })
}

/// Logs carry the trace id when traces are exported.
fn record_trace_id(span: &tracing::Span) {
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let context = span.context();
    let trace = context.span().span_context().trace_id();
    if trace != opentelemetry::trace::TraceId::INVALID {
        span.record("trace_id", tracing::field::display(trace));
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::{reflector, watcher};

    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{0:?}")]
    struct Failure(ErrorClass);

    impl Classify for Failure {
        fn class(&self) -> ErrorClass {
            self.0
        }
    }

    type Reconcile = fn(
        Arc<k8s_openapi::api::core::v1::ConfigMap>,
        Arc<()>,
    ) -> futures::future::Ready<Result<Recheck, Failure>>;

    fn instrumented() -> Instrumented<Reconcile, ()> {
        let metrics = Metrics::new("test", "0", "none").expect("valid metrics");
        Instrumented::new(
            |_, _| futures::future::ready(Ok(Recheck::Within(Duration::from_secs(86_400)))),
            Arc::new(()),
            metrics,
            Backoff::default(),
            Duration::from_secs(300),
            Arc::new(OnceLock::from(Sureness::renewed_now(Duration::from_secs(
                60,
            )))),
        )
    }

    fn config_map(name: &str) -> Arc<k8s_openapi::api::core::v1::ConfigMap> {
        let mut object = k8s_openapi::api::core::v1::ConfigMap::default();
        object.metadata.name = Some(name.into());
        object.metadata.namespace = Some("ns".into());
        Arc::new(object)
    }

    #[test]
    fn an_invalid_spec_waits_for_a_change() {
        let policy =
            instrumented().error_policy(config_map("a"), &Failure(ErrorClass::InvalidSpec));
        assert_eq!(policy, Action::await_change());
    }

    #[test]
    fn transient_failures_back_off_per_object() {
        let instrumented = instrumented();
        for ceiling in [5, 10, 20] {
            let delay = instrumented
                .retry_delay("ns/a".into(), ErrorClass::DependencyNotReady)
                .expect("retried");
            let ceiling = Duration::from_secs(ceiling);
            assert!(
                delay >= ceiling / 2 && delay <= ceiling,
                "{delay:?} for {ceiling:?}"
            );
        }
        // Another object starts from the first step.
        let other = instrumented
            .retry_delay("ns/b".into(), ErrorClass::Transient)
            .expect("retried");
        assert!(other <= Duration::from_secs(5), "{other:?}");
    }

    #[test]
    fn failures_of_deleted_objects_are_forgotten() {
        let instrumented = instrumented();
        let (store, mut writer) = reflector::store::<k8s_openapi::api::core::v1::ConfigMap>();
        let kept = config_map("kept");
        writer.apply_watcher_event(&watcher::Event::Apply((*kept).clone()));
        instrumented.error_policy(kept, &Failure(ErrorClass::Transient));
        instrumented.error_policy(config_map("deleted"), &Failure(ErrorClass::Transient));
        assert_eq!(instrumented.lock_failures().len(), 2);
        instrumented.forget_missing(&store);
        let left: Vec<String> = instrumented.lock_failures().keys().cloned().collect();
        assert_eq!(left.len(), 1);
        assert!(left[0].contains("kept"), "{left:?}");
    }

    #[tokio::test]
    async fn success_resets_the_backoff_and_resyncs() {
        let instrumented = instrumented();
        let object = config_map("a");
        instrumented.error_policy(object.clone(), &Failure(ErrorClass::Transient));
        assert_eq!(instrumented.lock_failures().len(), 1);
        // It asked to be looked at again in a day: the resync comes first.
        let action = instrumented.reconcile(object).await.expect("succeeds");
        assert_eq!(action, Action::requeue(Duration::from_secs(300)));
        assert!(instrumented.lock_failures().is_empty());
        let text = instrumented.metrics.render();
        assert!(
            text.contains(r#"cairn_reconcile_total{kind="ConfigMap",controller="test"} 1"#),
            "{text}"
        );
    }
}
