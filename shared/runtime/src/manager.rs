//! The leader-elected manager every controller binary runs in.
//!
//! Every replica starts its caches at once (shared reflectors), so `/readyz`
//! reports a synced, healthy standby and a takeover reconciles from warm
//! caches. Only the lease holder runs the controller. On SIGTERM or SIGINT it
//! lets in-flight reconciles finish (bounded by the shutdown grace), releases
//! the lease so a standby takes over within a second, and exits 0. A replica
//! that loses the lease stops reconciling at once and exits non-zero, so the
//! kubelet restarts it as a fresh standby.
//!
//! A controller's main reads as: [`Manager::start`], one [`Manager::cache`]
//! per kind, a kube-runtime `Controller` built from the caches' triggers, then
//! [`Manager::run`] with the reconcile function.

use std::collections::HashMap;
use std::fmt::{Debug, Display};
use std::future::Future;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, Stream, StreamExt};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::admin::{self, Health};
use crate::certs;
use crate::config::Config;
use crate::errors::{Backoff, ErrorClass};
use crate::leader::{self, Sureness, Timing};
use crate::metrics::{Metrics, RuntimeError};
use crate::telemetry::{self, Telemetry};
use crate::webhook::{self, WebhookServer};

/// What a binary tells the manager about itself.
#[derive(Debug, Clone, Copy)]
pub struct BuildInfo {
    /// Short controller name ("database"): the `controller` metric label, the
    /// default lease name `cairn-<controller>`.
    pub controller: &'static str,
    pub version: &'static str,
    pub git_commit: &'static str,
}

/// The [`BuildInfo`] of the calling binary: `controller`, its crate's
/// version, and the commit it was built from (`CAIRN_GIT_COMMIT` at build
/// time, else "unknown").
#[macro_export]
macro_rules! build_info {
    ($controller:literal) => {
        $crate::manager::BuildInfo {
            controller: $controller,
            version: env!("CARGO_PKG_VERSION"),
            git_commit: match option_env!("CAIRN_GIT_COMMIT") {
                Some(commit) => commit,
                None => "unknown",
            },
        }
    };
}

/// Why the manager could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("telemetry: {0}")]
    Telemetry(#[from] telemetry::TelemetryError),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("kubernetes client configuration: {0}")]
    Kube(#[from] kube::Error),
    #[error("admin server on {address}: {source}")]
    Admin {
        address: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error(
        "the lease namespace is unknown: set --lease-namespace (CAIRN_LEASE_NAMESPACE) or POD_NAMESPACE"
    )]
    NoLeaseNamespace,
    #[error("webhook server on {address}: {source}")]
    Webhook {
        address: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("self-managed webhook certificates: {0}")]
    WebhookCertificates(#[from] crate::certs::CertError),
    #[error(
        "CAIRN_NAMESPACES lists {0} namespaces: watch one namespace, or leave it empty for all namespaces"
    )]
    SeveralNamespaces(usize),
}

/// When a successfully reconciled object is looked at again, at the latest
/// (a change of it or its children wakes it sooner anyway).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recheck {
    /// After the resync interval: drift the watches cannot see.
    AfterResync,
    /// After this long, or after the resync interval if that is sooner.
    Within(Duration),
}

/// Errors a reconcile returns say how they should be retried.
pub trait Classify {
    fn class(&self) -> ErrorClass;
}

/// The running plumbing of one controller process.
pub struct Manager {
    pub info: BuildInfo,
    pub config: Config,
    /// The controller's client: its writes are refused unless this replica is
    /// sure it leads (see [`leader::WritesWhileSure`]).
    pub client: Client,
    /// For what every replica writes: the Lease, the webhook certificates.
    unguarded: Client,
    /// Whether this replica surely leads, once it competes for the lease.
    leading: Arc<OnceLock<Sureness>>,
    pub metrics: Metrics,
    pub health: Health,
    /// This replica's name in the lease (the pod name).
    pub identity: String,
    /// The namespace of the lease, the pod's own.
    pub namespace: String,
    telemetry: Telemetry,
    admin: JoinHandle<()>,
    stop_admin: oneshot::Sender<()>,
    caches_synced: Vec<BoxFuture<'static, ()>>,
    terminate: watch::Receiver<bool>,
}

impl Manager {
    /// Reads nothing itself: logs, metrics, the API client and the admin
    /// server come up from `config`.
    pub async fn start(info: BuildInfo, config: Config) -> Result<Self, StartError> {
        let telemetry = telemetry::init(
            &format!("cairn-{}-controller", info.controller),
            config.log_format,
            &config.log_level,
            config.otlp_endpoint.as_deref(),
        )?;
        if config.namespaces.len() > 1 {
            return Err(StartError::SeveralNamespaces(config.namespaces.len()));
        }
        let namespace = config
            .lease_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .ok_or(StartError::NoLeaseNamespace)?;
        let identity = std::env::var("POD_NAME").unwrap_or_else(|_| {
            format!(
                "{}-{}",
                std::env::var("HOSTNAME").unwrap_or_else(|_| "cairn".into()),
                std::process::id()
            )
        });
        let kube_config = kube::Config::infer()
            .await
            .map_err(kube::Error::InferConfig)?;
        let unguarded = Client::try_from(kube_config.clone())?;
        let leading = Arc::new(OnceLock::new());
        let client = kube::client::ClientBuilder::try_from(kube_config)?
            .with_layer(&tower::filter::FilterLayer::new(leader::WritesWhileSure(
                leading.clone(),
            )))
            .build();
        let metrics = Metrics::new(info.controller, info.version, info.git_commit)?;
        let health = Health::new(Duration::from_secs(config.watch_failure_limit_seconds));
        let listener = admin::listen(config.admin_address)
            .await
            .map_err(|source| StartError::Admin {
                address: config.admin_address,
                source,
            })?;
        let (stop_admin, stopped) = oneshot::channel::<()>();
        let router = admin::router(health.clone(), metrics.clone());
        let admin = tokio::spawn(async move {
            let served = admin::serve(listener, router, stopped.map(|_| ())).await;
            if let Err(e) = served {
                tracing::error!(error = %e, "the admin server stopped");
            }
        });
        tracing::info!(
            controller = info.controller,
            version = info.version,
            git_commit = info.git_commit,
            identity,
            admin_address = %config.admin_address,
            "starting"
        );
        Ok(Self {
            info,
            config,
            client,
            unguarded,
            leading,
            metrics,
            health,
            identity,
            namespace,
            telemetry,
            admin,
            stop_admin,
            caches_synced: Vec::new(),
            terminate: termination_signal(),
        })
    }

    /// Serves `router` over HTTPS on the webhook address, if one is set, on
    /// every replica. Certificates come from the mounted folder (reloaded when
    /// they change) or, without one, from a Secret the replicas share. The CA
    /// (the mounted `ca.crt`, if there is one, or the Secret's) is written into
    /// the `crds` conversion caBundle.
    pub async fn serve_webhook(
        &self,
        router: axum::Router,
        crds: &[&str],
    ) -> Result<Option<WebhookServer>, StartError> {
        let Some(address) = self.config.webhook_address else {
            return Ok(None);
        };
        let webhook_error = |source| StartError::Webhook { address, source };
        let server = match &self.config.webhook_cert_dir {
            Some(dir) => {
                // A cert-manager Secret carries its CA: the API server must
                // trust it, now and after each rotation.
                let injection = webhook::CaInjection {
                    client: self.unguarded.clone(),
                    crds: crds.iter().map(|crd| (*crd).to_owned()).collect(),
                    service: self.config.webhook_service.clone(),
                };
                webhook::start(
                    address,
                    router,
                    dir,
                    webhook::RELOAD_INTERVAL,
                    Some(injection),
                )
                .await
                .map_err(webhook_error)?
            }
            None => {
                let secret = format!("cairn-{}-webhook-certs", self.info.controller);
                let default_host = format!(
                    "cairn-{}-controller-webhook.{}.svc",
                    self.info.controller, self.namespace
                );
                let host = self
                    .config
                    .webhook_service
                    .as_deref()
                    .unwrap_or(&default_host);
                let pair = certs::ensure(self.unguarded.clone(), &self.namespace, &secret, &[host])
                    .await?;
                certs::inject_ca_bundle(
                    self.unguarded.clone(),
                    crds,
                    &pair.ca,
                    self.config.webhook_service.as_deref(),
                )
                .await
                .map_err(certs::CertError::from)?;
                webhook::start_with_pem(address, router, &pair.cert, &pair.key)
                    .await
                    .map_err(webhook_error)?
            }
        };
        tracing::info!(address = %server.address, "serving webhooks");
        Ok(Some(server))
    }

    /// An `Api` for `K` in the namespaces this controller watches.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    {
        match self.config.namespaces.first() {
            Some(namespace) => Api::namespaced(self.client.clone(), namespace),
            None => Api::all(self.client.clone()),
        }
    }

    /// Starts a cache of `K` (every replica, leader or not): it counts its
    /// objects, reports watch failures to `/livez`, and gates `/readyz` until
    /// its first list. Its [`Cache::trigger`] feeds a `Controller`.
    pub fn cache<K>(&mut self, api: Api<K>, watch: watcher::Config) -> Cache<K>
    where
        K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    {
        self.cache_trimmed(api, watch, |_| {})
    }

    /// [`Manager::cache`], with `trim` dropping the parts of each object its
    /// controller never reads before the object enters the cache (for
    /// example a pod's spec): memory is what caches cost at scale.
    pub fn cache_trimmed<K>(
        &mut self,
        api: Api<K>,
        watch: watcher::Config,
        trim: fn(&mut K),
    ) -> Cache<K>
    where
        K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
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
        let gauge = self.metrics.objects_in_cache.with_label_values(&[&kind]);
        let failures = self.metrics.watch_failures.with_label_values(&[&kind]);
        let health = self.health.clone();
        let counted = store.clone();
        let mut before_relist: Option<Vec<Arc<K>>> = None;
        let reflect = watcher(api, watch)
            .default_backoff()
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
        self.caches_synced.push(
            async move {
                let _ = synced.wait_until_ready().await;
            }
            .boxed(),
        );
        Cache::new(store, changes, self.health.clone(), self.metrics.clone())
    }

    /// Runs `controller` while this replica leads, with `reconcile` wrapped in
    /// metrics, a span, and the retry policy of its error class. Returns the
    /// process's exit code.
    pub async fn run<K, Ctx, E, F, Fut>(
        self,
        controller: Controller<K>,
        reconcile: F,
        context: Arc<Ctx>,
    ) -> ExitCode
    where
        K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
        Ctx: Send + Sync + 'static,
        E: Classify + Display + std::error::Error + Send + Sync + 'static,
        F: Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Recheck, E>> + Send + 'static,
    {
        let runnable = self.runnable(controller, reconcile, context);
        self.run_all(vec![runnable]).await
    }

    /// `controller` with `reconcile` wrapped as [`Manager::run`] does, to run
    /// with others under one lease ([`Manager::run_all`]).
    pub fn runnable<K, Ctx, E, F, Fut>(
        &self,
        controller: Controller<K>,
        reconcile: F,
        context: Arc<Ctx>,
    ) -> Runnable
    where
        K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
        Ctx: Send + Sync + 'static,
        E: Classify + Display + std::error::Error + Send + Sync + 'static,
        F: Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Recheck, E>> + Send + 'static,
    {
        // Streams are lazy: nothing of this runs (and the caches keep being
        // drained) until `lead` polls it, as the leader.
        let reconciler = Arc::new(Instrumented::new(
            reconcile,
            context,
            self.metrics.clone(),
            self.config.backoff(),
            Duration::from_secs(self.config.resync_seconds),
            self.leading.clone(),
        ));
        let forgetting = forget_deleted(reconciler.clone(), controller.store());
        let running = controller
            .with_config(
                kube::runtime::controller::Config::default()
                    .concurrency(self.config.concurrency)
                    .debounce(Duration::from_millis(100)),
            )
            .graceful_shutdown_on(terminated(self.terminate.clone()))
            .run(
                |object, instrumented: Arc<Instrumented<F, Ctx>>| {
                    let instrumented = instrumented.clone();
                    async move { instrumented.reconcile(object).await }
                },
                |object, error, instrumented| instrumented.error_policy(object, error),
                reconciler,
            )
            .for_each(|_| std::future::ready(()))
            .boxed();
        Runnable {
            running,
            forgetting,
        }
    }

    /// Runs every controller while this replica leads (one lease for all);
    /// returns the process's exit code.
    pub async fn run_all(mut self, controllers: Vec<Runnable>) -> ExitCode {
        let (running, forgetting): (Vec<_>, Vec<_>) = controllers
            .into_iter()
            .map(|r| (r.running, r.forgetting))
            .unzip();
        let code = self
            .lead(futures::future::join_all(running).map(drop).boxed())
            .await;
        forgetting.iter().for_each(JoinHandle::abort);
        let _ = self.stop_admin.send(());
        let _ = self.admin.await;
        self.telemetry.shutdown();
        code
    }

    /// Waits for the caches and the lease, then drives `running` (the
    /// controller) until SIGTERM and its grace period, or the lease's loss.
    async fn lead(&mut self, running: BoxFuture<'static, ()>) -> ExitCode {
        let synced = futures::future::join_all(std::mem::take(&mut self.caches_synced));
        tokio::select! {
            _ = synced => {
                tracing::info!("caches synced");
                self.health.set_ready(true);
            }
            () = terminated(self.terminate.clone()) => return ExitCode::SUCCESS,
        }
        let lease = self.config.lease_name(self.info.controller);
        let mut candidacy = leader::run_for(
            self.unguarded.clone(),
            &self.namespace,
            &lease,
            &self.identity,
            Timing::default(),
            self.metrics.clone(),
        );
        let _ = self.leading.set(candidacy.sureness());
        tokio::select! {
            acquired = candidacy.acquired() => if let Err(e) = acquired {
                tracing::error!(error = %e, "leader election stopped");
                return ExitCode::FAILURE;
            },
            () = terminated(self.terminate.clone()) => {
                tracing::info!("terminating as a standby");
                return ExitCode::SUCCESS;
            }
        }
        tracing::info!(lease, identity = %self.identity, "leading: reconciling");
        // After SIGTERM, in-flight reconciles get `grace` to finish.
        let grace = Duration::from_secs(self.config.shutdown_grace_seconds);
        let terminate = self.terminate.clone();
        let deadline = async move {
            terminated(terminate).await;
            tokio::time::sleep(grace).await;
        };
        tokio::select! {
            () = running => {}
            () = deadline => tracing::warn!(grace_seconds = grace.as_secs(), "reconciles still running after the shutdown grace; stopping them"),
            lost = candidacy.lost() => {
                // Another replica may be leading: stop now, write nothing more.
                tracing::error!(error = %lost, "lost the lease; exiting");
                return ExitCode::FAILURE;
            }
        }
        match candidacy.release(Duration::from_secs(5)).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::warn!(error = %e, "could not release the lease; a standby takes over when it expires");
                ExitCode::SUCCESS
            }
        }
    }
}

/// A controller ready to run: see [`Manager::runnable`].
pub struct Runnable {
    running: BoxFuture<'static, ()>,
    forgetting: JoinHandle<()>,
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

/// What a watch event, already applied to `store`, changed: the object as
/// the store now holds it, or the deleted one; after a relist, every object
/// (as kube's shared stores do) and the ones the relist lacks (deleted while
/// the watch was down).
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

    /// Changes of these annotations (written by the controller itself, e.g.
    /// a marker it sets and lifts) do not pass the spec-change triggers: a
    /// controller must not wake itself with its own bookkeeping.
    pub fn ignoring_annotations(mut self, keys: &'static [&'static str]) -> Self {
        self.ignored_annotations = keys;
        self
    }

    /// [`Cache::trigger_on_spec_change`] for two controllers: the second
    /// stream gets every object the first passes, as the first is polled
    /// (both run under one lease: see [`Manager::run_all`]).
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

/// The reconcile function wrapped in what every controller needs.
struct Instrumented<F, Ctx> {
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
    fn new(
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

    async fn reconcile<K, E, Fut>(&self, object: Arc<K>) -> Result<Action, E>
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

    fn error_policy<K, E>(&self, object: Arc<K>, error: &E) -> Action
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
fn forget_deleted<F, Ctx, K>(
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

/// Becomes true on the first SIGTERM or SIGINT.
fn termination_signal() -> watch::Receiver<bool> {
    let (sender, receiver) = watch::channel(false);
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(e) => {
                    tracing::error!(error = %e, "cannot listen for SIGTERM");
                    return;
                }
            };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
        }
        let _ = sender.send(true);
        // Keep the channel open so receivers see `true`, not a closed channel.
        std::future::pending::<()>().await;
    });
    receiver
}

/// Completes once termination was requested.
async fn terminated(mut signal: watch::Receiver<bool>) {
    let _ = signal.wait_for(|terminated| *terminated).await;
}

#[cfg(test)]
mod watch_gone;

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
}

#[cfg(test)]
mod tests {
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
