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
//!
//! The caches live in `cache`, the reconcile wrapper (leadership check,
//! metrics, tracing, retries) in `reconciler`, housekeeping run every few
//! seconds ([`Manager::every`]) in `periodic`, and SIGTERM/SIGINT handling
//! in [`shutdown`].

mod cache;
mod periodic;
mod reconciler;
pub mod shutdown;
#[cfg(test)]
mod watch_gone;

pub use cache::Cache;

use std::fmt::{Debug, Display};
use std::future::Future;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use kube::runtime::controller::Controller;
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::admin::{self, Health};
use crate::certs;
use crate::config::Config;
use crate::errors::ErrorClass;
use crate::leader::{self, Sureness, Timing};
use crate::metrics::Metrics;
use crate::telemetry::{self, Telemetry};
use crate::webhook::{self, WebhookServer};
use periodic::Periodic;
use reconciler::{Instrumented, forget_deleted};
use shutdown::{terminated, termination_signal};

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
    /// Housekeeping to start once the caches are synced, then running.
    housekeeping: Vec<Periodic>,
    housekeeping_running: Vec<JoinHandle<()>>,
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
            housekeeping: Vec::new(),
            housekeeping_running: Vec::new(),
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

    /// An `Api` for a cluster-scoped `K` (nodes), whatever the watched
    /// namespaces.
    pub fn cluster_api<K>(&self) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>,
    {
        Api::all(self.client.clone())
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
        let (cache, synced) =
            Cache::start(api, watch, trim, self.health.clone(), self.metrics.clone());
        self.caches_synced.push(synced);
        cache
    }

    /// Runs `task` every `period` from the caches' sync until the manager
    /// stops, on every replica (a standby's gauges are read too): a
    /// controller's housekeeping.
    pub fn every(&mut self, period: Duration, task: impl FnMut() + Send + 'static) {
        self.housekeeping.push(Periodic {
            period,
            task: Box::new(task),
        });
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
        self.housekeeping_running.iter().for_each(JoinHandle::abort);
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
                self.housekeeping_running = std::mem::take(&mut self.housekeeping)
                    .into_iter()
                    .map(Periodic::start)
                    .collect();
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
