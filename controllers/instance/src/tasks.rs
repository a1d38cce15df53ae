//! The instance's tasks beside the supervisor, as `main` starts them: the
//! signals that stop it, the HTTP listeners and the WAL archiver's socket,
//! the membership (role, Lease, base backups on request) and a backup's
//! verification.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::archive::Archiver;
use crate::children::Children;
use crate::config::Config;
use crate::error::{Context, Error};
use crate::membership::{self, Assignment, Bootstrap, Heartbeat};
use crate::metrics::Metrics;
use crate::observe::Role;
use crate::peers::Peers;
use crate::primacy::Primacy;
use crate::restore::WalFetcher;
use crate::state::State;
use crate::{backup, server, verify};
use cairn_api::database::instance as contract;

/// Installs the handlers of SIGTERM and SIGINT now (the controllers' own,
/// from the runtime); the future completes at the first of them.
pub fn shutdown_signals() -> Result<impl Future<Output = ()>, Error> {
    cairn_runtime::manager::shutdown::signals()
        .context(|| "the SIGTERM and SIGINT handlers".to_owned())
}

/// What `/status` and the metrics report, empty.
pub fn new_state() -> Result<Arc<State>, Error> {
    let metrics = Metrics::new().map_err(|e| Error::Setup(format!("metrics: {e}")))?;
    Ok(Arc::new(State::new(metrics)))
}

/// Health and status, metrics, and the WAL archiver's socket (when the
/// cluster has a backup destination). Nothing listens until the future is
/// polled; it completes only when one of them fails.
pub fn listeners(
    config: &Config,
    state: &Arc<State>,
) -> Result<impl Future<Output = Result<(), Error>> + use<>, Error> {
    // Three missed polls and a margin before `/livez` fails.
    let live_limit = config.poll() * 3 + Duration::from_secs(5);
    let health = server::health_router(state.clone(), live_limit);
    let metrics = server::metrics_router(state.clone());
    let (http, metrics_address) = (config.http_address, config.metrics_address);
    let archiver = wal_archiver(config, state)?;
    let socket = config.wal_archive_socket();
    let archiving = async {
        match archiver {
            Some(archiver) => archiver.serve(socket).await,
            None => std::future::pending().await,
        }
    };
    Ok(async move {
        tokio::try_join!(
            async {
                server::serve(http, health)
                    .await
                    .context(|| "HTTP listener".to_owned())
            },
            async {
                server::serve(metrics_address, metrics)
                    .await
                    .context(|| "metrics listener".to_owned())
            },
            archiving
        )
        .map(|_| ())
    })
}

/// The WAL archiver, when the cluster has a backup destination; it also
/// answers `restore_command` from the source's archive on an instance
/// configured to restore (same bucket, the source cluster's folder).
fn wal_archiver(config: &Config, state: &Arc<State>) -> Result<Option<Arc<Archiver>>, Error> {
    let Some(settings) = config
        .backup_destination()
        .context(|| "backup destination credentials".to_owned())?
    else {
        return Ok(None);
    };
    if config.verify {
        let (source, _) = config.restore_source().ok_or_else(|| {
            Error::Setup("verifying needs the backup's cluster (CAIRN_RESTORE_CLUSTER)".to_owned())
        })?;
        let fetcher = WalFetcher::new(
            cairn_storage::WalArchive::new(&settings, source),
            &config.data_dir,
            config.wal_archive_parallel,
        );
        return Ok(Some(Arc::new(Archiver::restore_only(
            fetcher,
            &config.data_dir,
            state.clone(),
        ))));
    }
    let cluster = config.cluster.as_deref().ok_or_else(|| {
        Error::Setup("a backup destination needs the cluster's name (CAIRN_CLUSTER)".to_owned())
    })?;
    if config.restore_cluster.as_deref() == Some(cluster) {
        return Err(Error::Setup(
            "CAIRN_RESTORE_CLUSTER is this cluster: a restore would archive over its source"
                .to_owned(),
        ));
    }
    let mut archiver = Archiver::new(
        cairn_storage::WalArchive::new(&settings, cluster),
        &config.data_dir,
        config.wal_archive_parallel,
        config.wal_archive_max_pending_bytes,
        state.clone(),
    );
    if let Some((source, _)) = config.restore_source() {
        archiver = archiver.restoring_with(WalFetcher::new(
            cairn_storage::WalArchive::new(&settings, source),
            &config.data_dir,
            config.wal_archive_parallel,
        ));
    }
    Ok(Some(Arc::new(archiver)))
}

/// Where the role comes from, and the Lease renewal that reports this
/// instance until it stops (see `follow`).
pub struct Membership {
    /// The role (and how to bootstrap) for the supervisor.
    pub assignment: watch::Receiver<Assignment>,
    /// The heartbeat, the peers and the fence.
    pub primacy: Primacy,
    renewer: Option<JoinHandle<()>>,
    done: watch::Sender<bool>,
}

impl Membership {
    pub async fn start(
        config: &Config,
        state: &Arc<State>,
        children: &Children,
    ) -> Result<Self, Error> {
        let (done, finished) = watch::channel(false);
        let (assignment, assigned) = watch::channel(Assignment::default());
        let (primacy, renewer) = follow(config, state, children, assignment, finished).await?;
        Ok(Self {
            assignment: assigned,
            primacy,
            renewer,
            done,
        })
    }

    /// Once the supervisor has stopped: the Lease's last write says what is
    /// true now (stopped, not ready), given 5 s.
    pub async fn stop(self) {
        let _ = self.done.send(true);
        if let Some(renewer) = self.renewer {
            let _ = tokio::time::timeout(Duration::from_secs(5), renewer).await;
        }
    }
}

/// In a pod: the pod watch (the role), the Lease renewal (the heartbeat)
/// and, with a backup destination, the base backups the backup controller
/// asks for. Outside one: the role file, no heartbeat, no base backups.
async fn follow(
    config: &Config,
    state: &Arc<State>,
    children: &Children,
    assignment: watch::Sender<Assignment>,
    done: watch::Receiver<bool>,
) -> Result<(Primacy, Option<JoinHandle<()>>), Error> {
    if config.verify {
        tracing::info!("verifying a backup: restoring it as a primary, no membership");
        let _ = assignment.send(Assignment {
            role: Some(Role::Primary),
            bootstrap: Some(Bootstrap::Restore),
        });
        return Ok((Primacy::none(), None));
    }
    let in_pod = match (&config.pod_name, &config.pod_namespace) {
        (Some(name), Some(namespace)) if config.membership => {
            Some((name.clone(), namespace.clone()))
        }
        _ => None,
    };
    let Some((name, namespace)) = in_pod else {
        tracing::info!(role_file = %config.role_file.display(), "outside a pod: the role comes from a file, no heartbeat");
        let bootstrap = if config.restore_source().is_some() {
            Bootstrap::Restore
        } else {
            Bootstrap::Initdb
        };
        tokio::spawn(membership::watch_role_file(
            config.role_file.clone(),
            config.poll(),
            bootstrap,
            assignment,
        ));
        return Ok((Primacy::none(), None));
    };
    // In a pod, the API is the only source of the role: no client, no start.
    let client = kube::Client::try_default()
        .await
        .map_err(|e| Error::Setup(format!("no Kubernetes client for the membership: {e}")))?;
    let peers = start_peers(config, &name).await?;
    let heartbeat = Heartbeat::new(Duration::from_secs(config.fence_seconds), peers.clone());
    let primacy = Primacy::new(heartbeat.clone(), peers, Some(children));
    if let Some(peers) = &primacy.peers {
        let allowed = heartbeat.clone();
        let assigned = assignment.subscribe();
        tokio::spawn(peers.clone().run(
            move || allowed.forbids_primary().is_none(),
            move || assigned.borrow().role == Some(Role::Replica),
            state.clone(),
        ));
    }
    start_backups(config, state, children, &client, &namespace, &name)?;
    tokio::spawn(membership::watch_pod(
        kube::Api::<Pod>::namespaced(client.clone(), &namespace),
        name.clone(),
        assignment,
    ));
    let renewer = tokio::spawn(membership::renew(
        kube::Api::<Lease>::namespaced(client, &namespace),
        name,
        state.observed(),
        heartbeat,
        Duration::from_millis(config.heartbeat_milliseconds.max(100)),
        done,
    ));
    Ok((primacy, Some(renewer)))
}

/// The other members, reached at `<pod>.<cluster>` (the headless Service)
/// on the peer port; none without a cluster name.
async fn start_peers(config: &Config, pod: &str) -> Result<Option<Arc<Peers>>, Error> {
    let Some(cluster) = config.cluster.clone() else {
        return Ok(None);
    };
    let address = std::net::SocketAddr::from(([0, 0, 0, 0], config.peer_port));
    // Without the port the primary fences at its bound, as with no peers:
    // safe, only less available.
    let socket = match tokio::net::UdpSocket::bind(address).await {
        Ok(socket) => socket,
        Err(error) => {
            tracing::error!(%error, %address, "cannot listen for the peers: a primary will fence without its heartbeat");
            return Ok(None);
        }
    };
    let port = config.peer_port;
    let subdomain = cluster.clone();
    Ok(Some(Peers::new(
        pod.to_owned(),
        cluster,
        config.config_dir.join(contract::MEMBERS_FILE),
        config
            .credentials_dir
            .join(contract::REPLICATION_PASSWORD_KEY),
        move |member| format!("{member}.{subdomain}:{port}"),
        socket,
    )))
}

/// Base backups on request, when the cluster has a backup destination.
fn start_backups(
    config: &Config,
    state: &Arc<State>,
    children: &Children,
    client: &kube::Client,
    namespace: &str,
    pod: &str,
) -> Result<(), Error> {
    let (Some(settings), Some(cluster)) = (
        config
            .backup_destination()
            .context(|| "backup destination credentials".to_owned())?,
        config.cluster.clone(),
    ) else {
        return Ok(());
    };
    let (requests, requested) = watch::channel(None);
    tokio::spawn(backup::watch_requests(
        kube::Api::namespaced(client.clone(), namespace),
        cluster.clone(),
        pod.to_owned(),
        requests,
    ));
    let backups = cairn_storage::BaseBackups::new(&settings, &cluster);
    state.update(|s| s.backup_destination = Some(backups.destination()));
    let taker = backup::Taker {
        config: Arc::new(config.clone()),
        backups,
        dumps: cairn_storage::BaseBackups::dumps(&settings, &cluster),
        archive: cairn_storage::WalArchive::new(&settings, &cluster),
        cluster,
        state: state.clone(),
        children: children.clone(),
    };
    tokio::spawn(taker.run(requested));
    Ok(())
}

/// A backup's verification (`CAIRN_VERIFY`), beside the supervisor: its
/// verdict stops the instance and decides how it exits.
pub struct Verification {
    verdict: watch::Receiver<Option<bool>>,
    running: Option<JoinHandle<()>>,
}

impl Verification {
    /// Starts verifying when the configuration says so; else nothing.
    pub fn start(config: &Config, state: &Arc<State>) -> Self {
        let (verified, verdict) = watch::channel(None);
        let running = config.verify.then(|| {
            let (config, state) = (config.clone(), state.clone());
            let started = Instant::now();
            tokio::spawn(async move {
                let report = verify::verify(&config, &state, started).await;
                tracing::info!(verified = report.verified, reason = %report.reason, message = %report.message, "verification done");
                if let Err(message) = verify::write_report(&config.verify_report, &report) {
                    tracing::error!(%message, "cannot write the verification report");
                }
                let _ = verified.send(Some(report.verified));
            })
        });
        Self { verdict, running }
    }

    /// `shutdown`, or sooner the verdict.
    pub async fn or_verdict(&self, shutdown: impl Future<Output = ()>) {
        let mut verdict = self.verdict.clone();
        tokio::select! {
            () = shutdown => {}
            _ = verdict.wait_for(Option::is_some), if self.running.is_some() => {}
        }
    }

    /// Verifying, only a verdict of success is a success.
    pub fn outcome(&self) -> Result<(), Error> {
        match *self.verdict.borrow() {
            Some(false) => Err(Error::Program("the backup did not verify".to_owned())),
            None if self.running.is_some() => Err(Error::Program(
                "stopped before the verification ended".to_owned(),
            )),
            _ => Ok(()),
        }
    }
}
