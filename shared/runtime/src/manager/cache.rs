//! The caches every replica keeps warm: one per kind, fed by a watch,
//! trimmed of what no controller reads, and handing each change to the
//! controllers as a trigger once this replica leads.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, Stream, StreamExt};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::utils::{Backoff, ResetTimerBackoff};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::admin::Health;
use crate::metrics::{Metrics, RuntimeError};

/// The delays between a failed watch's retries: kube's default shape
/// (doubling, jittered, reset only after 120 s without an error, since the
/// watcher reports a success before each relist) but at most 5 s apart
/// instead of 30. A cache is blind until its watch resumes, and the database
/// controller judges its members' silence from its Lease cache: after an API
/// server outage a 30 s delay left every member looking silent for half a
/// minute. An outage costs a list per kind every 5 s.
fn watch_backoff() -> ResetTimerBackoff<WatchBackoff> {
    ResetTimerBackoff::new(WatchBackoff::default(), Duration::from_secs(120))
}

struct WatchBackoff {
    delay: Duration,
}

impl WatchBackoff {
    const FIRST: Duration = Duration::from_millis(500);
    const LONGEST: Duration = Duration::from_secs(5);
}

impl Default for WatchBackoff {
    fn default() -> Self {
        Self { delay: Self::FIRST }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let delay = self.delay;
        self.delay = (delay * 2).min(Self::LONGEST);
        // Up to a quarter less, so the replicas' retries spread.
        Some(delay.mul_f64(1.0 - rand::random::<f64>() / 4.0))
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.delay = Self::FIRST;
    }
}

/// A cache of one kind, shared by every controller of the process.
pub struct Cache<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store: Store<K>,
    subscription: SubscriptionGate<K>,
    health: Health,
    metrics: Metrics,
    ignored_annotations: &'static [&'static str],
}

/// What a cache saw happen to one object.
enum Change<K> {
    /// Created or changed: the object as it is now.
    Applied(Arc<K>),
    /// Deleted: the object as it was last seen.
    Deleted(Arc<K>),
}

impl<K> Change<K> {
    fn object(self) -> Arc<K> {
        match self {
            Self::Applied(object) | Self::Deleted(object) => object,
        }
    }
}

/// Until a controller polls the subscription (this replica leads), a task
/// drains it so the watch never waits for a standby.
struct SubscriptionGate<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    stop_draining: oneshot::Sender<()>,
    drained: JoinHandle<BoxStream<'static, Change<K>>>,
}

impl<K> Cache<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
{
    /// Starts the watch of `api` that fills a new cache, with `trim`
    /// applied to each object after [`trim_for_cache`]. Returns the cache and
    /// what completes once its first list is in (see
    /// [`Manager::cache_trimmed`](super::Manager::cache_trimmed)).
    pub(super) fn start(
        api: Api<K>,
        watch: watcher::Config,
        trim: fn(&mut K),
        health: Health,
        metrics: Metrics,
    ) -> (Self, BoxFuture<'static, ()>)
    where
        K: DeserializeOwned,
    {
        // Not kube's shared store: its subscription looks each changed
        // object up in the store when it is read, and when the object was
        // deleted in between it answers Pending without waking the reader
        // again, so that stream, then (its buffer full) the watch, stalls
        // for good — seen under churn as a Pod cache frozen with 166 deleted
        // pods. The changes are taken here, with the objects as the store
        // holds them at that moment, in watch order, deletions included.
        let (store, writer) = reflector::store();
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel::<Change<K>>();
        let kind = K::kind(&()).into_owned();
        let gauge = metrics.objects_in_cache.with_label_values(&[&kind]);
        let failures = metrics.watch_failures.with_label_values(&[&kind]);
        let cache_health = health.clone();
        let counted = store.clone();
        let mut before_relist: Option<Vec<Arc<K>>> = None;
        let reflect = watcher(api, watch)
            .backoff(watch_backoff())
            .modify(move |object| {
                trim_for_cache(object);
                trim(object);
            })
            .reflect(writer)
            .for_each(move |event| {
                match event {
                    Ok(event) => {
                        // `Init` is the watcher's own step before it lists
                        // again, no request answered yet: counted as a
                        // success, it reset a run of failing relists each
                        // time, so /livez never failed however long they did.
                        if !matches!(event, watcher::Event::Init) {
                            health.watch_ok(&kind);
                        }
                        for change in changes_of(&event, &counted, &mut before_relist) {
                            let _ = sender.send(change);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(kind, error = %e, "watch failed; retrying");
                        health.watch_failed(&kind);
                        failures.inc();
                    }
                }
                gauge.set(i64::try_from(counted.len()).unwrap_or(i64::MAX));
                std::future::ready(())
            });
        tokio::spawn(reflect);
        let changes = futures::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|change| (change, receiver))
        })
        .boxed();
        let synced = store.clone();
        let synced = async move {
            let _ = synced.wait_until_ready().await;
        }
        .boxed();
        (Cache::new(store, changes, cache_health, metrics), synced)
    }

    fn new(
        store: Store<K>,
        mut subscription: BoxStream<'static, Change<K>>,
        health: Health,
        metrics: Metrics,
    ) -> Self {
        let (stop_draining, mut stop) = oneshot::channel();
        let drained = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = &mut stop => return subscription,
                    next = subscription.next() => if next.is_none() { return subscription },
                }
            }
        });
        Self {
            store,
            subscription: SubscriptionGate {
                stop_draining,
                drained,
            },
            health,
            metrics,
            ignored_annotations: &[],
        }
    }

    /// A read handle on the cached objects.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// The cache alone, for a kind whose changes wake no controller (the
    /// reconcile only reads it); its changes keep being drained so the watch
    /// never waits for a consumer.
    pub fn without_trigger(self) -> Store<K> {
        let store = self.store.clone();
        tokio::spawn(self.changes().for_each(|_| std::future::ready(())));
        store
    }

    /// Every change of the cached objects, from the moment it is polled.
    pub fn trigger(self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        self.changes().map(Change::object)
    }

    /// Like [`Cache::trigger`], but only when an object's `metadata.generation`
    /// changes (its spec, not its status: a controller's own status writes do
    /// not wake it again), its annotations change (requests such as a
    /// switchover, an adoption or a pause are annotations), or it is deleted. For kinds with a status
    /// subresource. What it remembers of an object goes with the object.
    ///
    /// Own filter rather than kube-runtime's `predicates::generation`: that
    /// one never sees a deletion, so it forgets objects only after a TTL (an
    /// hour by default) and a recreated object with the same name and
    /// generation 1 would be filtered out within it; this one keys by UID and
    /// forgets on deletion.
    pub fn trigger_on_spec_change(self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        let ignored = self.ignored_annotations;
        spec_changes(self.changes(), ignored)
    }

    /// Like [`Cache::trigger`], but only when `key` of an object differs
    /// from the last one seen (its first sight included), or it is deleted:
    /// for a kind whose frequent updates (a node's status) would otherwise
    /// wake reconciles that find nothing new.
    pub fn trigger_on_change_of<V: std::hash::Hash + 'static>(
        self,
        key: fn(&K) -> V,
    ) -> impl Stream<Item = Arc<K>> + Send + 'static {
        changes_of_key(self.changes(), key)
    }

    /// Changes of these annotations (written by the controller itself, e.g.
    /// a marker it sets and lifts) do not pass the spec-change triggers: a
    /// controller must not wake itself with its own bookkeeping.
    pub fn ignoring_annotations(mut self, keys: &'static [&'static str]) -> Self {
        self.ignored_annotations = keys;
        self
    }

    /// [`Cache::trigger_on_spec_change`] for two controllers: the second
    /// stream gets every object the first passes, as the first is polled
    /// (both run under one lease: see
    /// [`Manager::run_all`](super::Manager::run_all)).
    pub fn trigger_on_spec_change_for_two(
        self,
    ) -> (
        impl Stream<Item = Arc<K>> + Send + 'static,
        impl Stream<Item = Arc<K>> + Send + 'static,
    ) {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        let ignored = self.ignored_annotations;
        let first = spec_changes(self.changes(), ignored).inspect(move |object| {
            let _ = sender.send(object.clone());
        });
        let second = futures::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|object| (object, receiver))
        });
        (first, second)
    }

    /// Every cached object, then every change from then on. The objects
    /// first: a change the draining task dropped just before it stopped
    /// (an object created as this replica took the lease) would otherwise
    /// wake nothing until the resync. The store is read once the draining
    /// has stopped, and the watch writes the store before it sends the
    /// change, so every dropped change is in it.
    fn changes(self) -> impl Stream<Item = Change<K>> + Send + 'static {
        let SubscriptionGate {
            stop_draining,
            drained,
        } = self.subscription;
        let (store, health, metrics) = (self.store, self.health, self.metrics);
        async move {
            let _ = stop_draining.send(());
            match drained.await {
                Ok(subscription) => {
                    let cached = store.state().into_iter().map(Change::Applied);
                    futures::stream::iter(cached)
                        .chain(subscription)
                        .left_stream()
                }
                Err(e) => {
                    // No change would ever reach the controller: fail
                    // liveness so the kubelet restarts the process.
                    let kind = K::kind(&());
                    tracing::error!(%kind, error = %e, "the task draining a cache ended");
                    metrics.record_runtime_error(RuntimeError::CacheTaskEnded);
                    health.broken(format!("the task draining the {kind} cache ended: {e}"));
                    futures::stream::empty().right_stream()
                }
            }
        }
        .flatten_stream()
    }
}

fn hash(value: &impl std::hash::Hash) -> u64 {
    use std::hash::{BuildHasher, RandomState};
    static STATE: std::sync::OnceLock<RandomState> = std::sync::OnceLock::new();
    STATE.get_or_init(RandomState::new).hash_one(value)
}

/// The changes that carry a new generation or new annotations, and
/// deletions (see [`Cache::trigger_on_spec_change`]).
/// Annotations in `ignored` (a controller's own bookkeeping) wake nothing.
fn spec_changes<K>(
    changes: impl Stream<Item = Change<K>> + Send + 'static,
    ignored: &'static [&'static str],
) -> impl Stream<Item = Arc<K>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Send + Sync + 'static,
{
    let mut seen: HashMap<String, (Option<i64>, u64)> = HashMap::new();
    changes.filter_map(move |change| {
        let passed = match change {
            Change::Applied(object) => {
                let meta = object.meta();
                let key = meta.uid.clone().unwrap_or_default();
                let requests: Vec<_> = meta
                    .annotations
                    .iter()
                    .flatten()
                    .filter(|(k, _)| !ignored.contains(&k.as_str()))
                    .collect();
                let desired = (meta.generation, hash(&requests));
                let changed = seen.insert(key, desired) != Some(desired);
                changed.then_some(object)
            }
            Change::Deleted(object) => {
                seen.remove(object.meta().uid.as_deref().unwrap_or_default());
                Some(object)
            }
        };
        std::future::ready(passed)
    })
}

/// The changes whose `key` differs from the one last seen of the object,
/// and deletions (see [`Cache::trigger_on_change_of`]).
fn changes_of_key<K, V>(
    changes: impl Stream<Item = Change<K>> + Send + 'static,
    key: fn(&K) -> V,
) -> impl Stream<Item = Arc<K>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Send + Sync + 'static,
    V: std::hash::Hash + 'static,
{
    let mut seen: HashMap<String, u64> = HashMap::new();
    changes.filter_map(move |change| {
        let passed = match change {
            Change::Applied(object) => {
                let uid = object.meta().uid.clone().unwrap_or_default();
                let value = hash(&key(&object));
                (seen.insert(uid, value) != Some(value)).then_some(object)
            }
            Change::Deleted(object) => {
                seen.remove(object.meta().uid.as_deref().unwrap_or_default());
                Some(object)
            }
        };
        std::future::ready(passed)
    })
}

/// The annotation `kubectl apply` keeps a copy of the whole object in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops what no controller reads before an object enters a cache: its
/// managedFields (often larger than the rest of the object) and kubectl's
/// copy of what was last applied. The controllers apply with server-side
/// apply and never look at either.
fn trim_for_cache<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

/// What a watch event, already applied to `store`, changed: the object as
/// the store now holds it, or the deleted one; after a relist, every object
/// (as kube's shared stores do) and the ones the relist lacks (deleted while
/// the watch was down).
fn changes_of<K>(
    event: &watcher::Event<K>,
    store: &Store<K>,
    before_relist: &mut Option<Vec<Arc<K>>>,
) -> Vec<Change<K>>
where
    K: Resource<DynamicType = ()> + Clone,
{
    match event {
        watcher::Event::Apply(object) => store
            .get(&ObjectRef::from_obj(object))
            .map(Change::Applied)
            .into_iter()
            .collect(),
        watcher::Event::Delete(object) => vec![Change::Deleted(Arc::new(object.clone()))],
        // The store keeps its old content until the relist is done.
        watcher::Event::Init => {
            *before_relist = Some(store.state());
            Vec::new()
        }
        watcher::Event::InitApply(_) => Vec::new(),
        // A relist announces what it changed, not every object again: the
        // first list announces everything; a relist after a watch gap (an
        // API server outage, a 410) only the objects created or changed
        // meanwhile and those deleted. Announcing every child again woke
        // every owner after each gap.
        watcher::Event::InitDone => {
            let before = before_relist.take().unwrap_or_default();
            let versions: HashMap<ObjectRef<K>, Option<String>> = before
                .iter()
                .map(|o| (ObjectRef::from_obj(&**o), o.meta().resource_version.clone()))
                .collect();
            let gone = gone_after_relist(before, store)
                .into_iter()
                .map(Change::Deleted);
            store
                .state()
                .into_iter()
                .filter(|o| {
                    versions.get(&ObjectRef::from_obj(&**o)) != Some(&o.meta().resource_version)
                })
                .map(Change::Applied)
                .chain(gone)
                .collect()
        }
    }
}

/// The objects of `before` (the cache before a relist) that the relisted
/// `store` no longer holds: deleted while the watch was down.
fn gone_after_relist<K>(before: Vec<Arc<K>>, store: &Store<K>) -> Vec<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone,
{
    before
        .into_iter()
        .filter(|object| store.get(&ObjectRef::from_obj(&**object)).is_none())
        .collect()
}

#[cfg(test)]
mod trim_tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    #[test]
    fn a_cached_object_keeps_everything_but_managed_fields_and_last_applied() {
        let mut map: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "a",
                "annotations": { LAST_APPLIED: "{...}", "team": "data" },
                "labels": { "app": "x" },
                "managedFields": [{ "manager": "kubectl", "operation": "Apply" }],
            },
            "data": { "key": "value" },
        }))
        .expect("a ConfigMap");
        let mut expected = map.clone();
        expected.metadata = ObjectMeta {
            managed_fields: None,
            annotations: Some([("team".to_owned(), "data".to_owned())].into()),
            ..map.metadata.clone()
        };
        trim_for_cache(&mut map);
        assert_eq!(map, expected);
    }

    #[test]
    fn a_failed_watch_is_retried_at_most_five_seconds_apart() {
        let mut backoff = WatchBackoff::default();
        let delays: Vec<Duration> = backoff.by_ref().take(8).collect();
        assert!(delays[0] <= Duration::from_millis(500), "{delays:?}");
        assert!(delays[0] >= Duration::from_millis(375), "{delays:?}");
        assert!(
            delays.iter().all(|d| *d <= Duration::from_secs(5)),
            "{delays:?}"
        );
        assert!(delays[7] >= Duration::from_millis(3750), "{delays:?}");
        backoff.reset();
        assert!(
            backoff
                .next()
                .is_some_and(|d| d <= Duration::from_millis(500))
        );
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn config_map(name: &str) -> Arc<k8s_openapi::api::core::v1::ConfigMap> {
        let mut object = k8s_openapi::api::core::v1::ConfigMap::default();
        object.metadata.name = Some(name.into());
        object.metadata.namespace = Some("ns".into());
        Arc::new(object)
    }

    #[tokio::test]
    async fn the_spec_filter_passes_new_generations_and_annotations_and_forgets_deleted_objects() {
        let object = |generation: i64| {
            let mut object = (*config_map("a")).clone();
            object.metadata.uid = Some("uid-a".into());
            object.metadata.generation = Some(generation);
            Arc::new(object)
        };
        let annotated = |generation: i64| {
            let mut object = (*object(generation)).clone();
            object.metadata.annotations = Some([("adopt".to_owned(), "true".to_owned())].into());
            Arc::new(object)
        };
        let changes = futures::stream::iter(vec![
            Change::Applied(object(1)),
            Change::Applied(object(1)), // a status write: same generation
            Change::Applied(object(2)),
            Change::Applied(annotated(2)), // a request made by annotation
            Change::Applied(annotated(2)),
            Change::Deleted(annotated(2)),
            Change::Applied(object(2)), // forgotten: passes again
        ]);
        let passed: Vec<i64> = spec_changes(changes, &[])
            .map(|o| o.metadata.generation.unwrap_or_default())
            .collect()
            .await;
        assert_eq!(passed, vec![1, 2, 2, 2, 2]);
    }

    #[tokio::test]
    async fn the_key_filter_passes_a_changed_key_and_deletions_only() {
        let object = |data: &str| {
            let mut object = (*config_map("a")).clone();
            object.metadata.uid = Some("uid-a".into());
            object.data = Some([("k".to_owned(), data.to_owned())].into());
            object.metadata.resource_version = Some(format!("{data}-{}", rand_suffix()));
            Arc::new(object)
        };
        let changes = futures::stream::iter(vec![
            Change::Applied(object("x")),
            Change::Applied(object("x")), // another update, same key
            Change::Applied(object("y")),
            Change::Deleted(object("y")),
            Change::Applied(object("y")), // forgotten: passes again
        ]);
        let key = |map: &k8s_openapi::api::core::v1::ConfigMap| map.data.clone();
        let passed: Vec<String> = changes_of_key(changes, key)
            .map(|o| o.data.as_ref().map(|d| d["k"].clone()).unwrap_or_default())
            .collect()
            .await;
        assert_eq!(passed, vec!["x", "y", "y", "y"]);
    }

    fn rand_suffix() -> u32 {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed)
    }

    #[tokio::test]
    async fn the_controllers_own_annotations_wake_nothing() {
        let annotated = |annotations: &[(&str, &str)]| {
            let mut object = (*config_map("a")).clone();
            object.metadata.uid = Some("uid-a".into());
            object.metadata.generation = Some(1);
            object.metadata.annotations = Some(
                annotations
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            );
            Arc::new(object)
        };
        let changes = futures::stream::iter(vec![
            Change::Applied(annotated(&[])),
            Change::Applied(annotated(&[("marker", "set")])), // its own: ignored
            Change::Applied(annotated(&[])),                  // lifted: ignored
            Change::Applied(annotated(&[("adopt", "true")])), // a request
        ]);
        let passed: Vec<usize> = spec_changes(changes, &["marker"])
            .map(|o| o.metadata.annotations.as_ref().map_or(0, |a| a.len()))
            .collect()
            .await;
        assert_eq!(passed, vec![0, 1]);
    }

    /// Each change as (applied, name).
    fn applied_or_deleted(
        changes: Vec<Change<k8s_openapi::api::core::v1::ConfigMap>>,
    ) -> Vec<(bool, String)> {
        changes
            .into_iter()
            .map(|change| match change {
                Change::Applied(o) => (true, o.metadata.name.clone().unwrap_or_default()),
                Change::Deleted(o) => (false, o.metadata.name.clone().unwrap_or_default()),
            })
            .collect()
    }

    #[tokio::test]
    async fn a_change_dropped_while_standing_by_still_wakes_the_controller() {
        // An object created as the replica takes the lease: its change is
        // drained (dropped) before the controller subscribes. Seen as an
        // ObjectBucket no reconcile ever touched until the resync.
        let (store, mut writer) = reflector::store::<k8s_openapi::api::core::v1::ConfigMap>();
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        let subscription = futures::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|change| (change, receiver))
        })
        .boxed();
        let cache = Cache::new(
            store,
            subscription,
            Health::new(Duration::from_secs(60)),
            Metrics::new("test", "0", "none").expect("metrics"),
        );
        let created = config_map("created-while-standing-by");
        writer.apply_watcher_event(&watcher::Event::Apply((*created).clone()));
        sender.send(Change::Applied(created)).expect("sent");
        tokio::time::sleep(Duration::from_millis(50)).await; // drained: dropped
        let mut trigger = std::pin::pin!(cache.trigger());
        let woken = tokio::time::timeout(Duration::from_secs(1), trigger.next())
            .await
            .expect("the controller is woken")
            .expect("an object");
        assert_eq!(
            woken.metadata.name.as_deref(),
            Some("created-while-standing-by")
        );
        // Later changes still come through.
        sender
            .send(Change::Applied(config_map("later")))
            .expect("sent");
        let later = tokio::time::timeout(Duration::from_secs(1), trigger.next())
            .await
            .expect("a later change")
            .expect("an object");
        assert_eq!(later.metadata.name.as_deref(), Some("later"));
    }

    #[test]
    fn a_change_carries_its_object_even_when_it_is_deleted_before_it_is_read() {
        // kube's shared-store subscription looked the object up when read,
        // found nothing after a deletion, and stalled for good.
        let (store, mut writer) = reflector::store::<k8s_openapi::api::core::v1::ConfigMap>();
        let mut before_relist = None;
        let mut changes = Vec::new();
        for event in [
            watcher::Event::Apply((*config_map("a")).clone()),
            watcher::Event::Delete((*config_map("a")).clone()),
            watcher::Event::Apply((*config_map("b")).clone()),
        ] {
            writer.apply_watcher_event(&event);
            changes.extend(changes_of(&event, &store, &mut before_relist));
        }
        let seen = applied_or_deleted(changes);
        assert_eq!(
            seen,
            vec![
                (true, "a".to_owned()),
                (false, "a".to_owned()),
                (true, "b".to_owned())
            ],
            "in watch order, none lost"
        );
    }

    fn config_map_at(name: &str, version: &str) -> k8s_openapi::api::core::v1::ConfigMap {
        let mut object = (*config_map(name)).clone();
        object.metadata.resource_version = Some(version.into());
        object
    }

    #[test]
    fn the_first_list_announces_every_object() {
        let (store, mut writer) = reflector::store::<k8s_openapi::api::core::v1::ConfigMap>();
        let mut before_relist = None;
        let mut changes = Vec::new();
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(config_map_at("a", "1")),
            watcher::Event::InitApply(config_map_at("b", "2")),
            watcher::Event::InitDone,
        ] {
            writer.apply_watcher_event(&event);
            changes.extend(changes_of(&event, &store, &mut before_relist));
        }
        let mut seen = applied_or_deleted(changes);
        seen.sort();
        assert_eq!(seen, vec![(true, "a".to_owned()), (true, "b".to_owned())]);
    }

    #[test]
    fn a_relist_announces_what_changed_during_the_gap_and_the_missed_deletions_only() {
        let (store, mut writer) = reflector::store::<k8s_openapi::api::core::v1::ConfigMap>();
        let mut before_relist = None;
        for (name, version) in [("kept", "1"), ("changed", "2"), ("deleted", "3")] {
            writer.apply_watcher_event(&watcher::Event::Apply(config_map_at(name, version)));
        }
        let mut changes = Vec::new();
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(config_map_at("kept", "1")),
            watcher::Event::InitApply(config_map_at("changed", "7")),
            watcher::Event::InitApply(config_map_at("created", "8")),
            watcher::Event::InitDone,
        ] {
            writer.apply_watcher_event(&event);
            changes.extend(changes_of(&event, &store, &mut before_relist));
        }
        let mut seen = applied_or_deleted(changes);
        seen.sort();
        assert_eq!(
            seen,
            vec![
                (false, "deleted".to_owned()),
                (true, "changed".to_owned()),
                (true, "created".to_owned()),
            ],
            "the unchanged object is no news"
        );
    }

    #[test]
    fn a_relist_reveals_the_deletions_the_watch_missed() {
        let (store, mut writer) = reflector::store::<k8s_openapi::api::core::v1::ConfigMap>();
        for name in ["kept", "deleted"] {
            writer.apply_watcher_event(&watcher::Event::Apply((*config_map(name)).clone()));
        }
        let before = store.state();
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply((*config_map("kept")).clone()));
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let gone: Vec<String> = gone_after_relist(before, &store)
            .iter()
            .map(|o| o.metadata.name.clone().unwrap_or_default())
            .collect();
        assert_eq!(gone, vec!["deleted".to_owned()]);
    }
}
