use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use std::path::PathBuf;

use cairn_instance::archive::{self, Archiver};
use cairn_instance::backup;
use cairn_instance::children::Children;
use cairn_instance::config::Config;
use cairn_instance::membership::{self, Assignment, Heartbeat};
use cairn_instance::metrics::Metrics;
use cairn_instance::restore::{self, WalFetcher};
use cairn_instance::server;
use cairn_instance::state::State;
use cairn_instance::supervisor::Supervisor;
use cairn_instance::verify;
use clap::Parser;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

/// Why the instance could not start or keep serving.
type StartError = Box<dyn std::error::Error>;

/// `archive_command`'s client: `wal-archive --socket <socket> <file>`.
#[derive(Parser)]
struct WalArchive {
    #[arg(long)]
    socket: PathBuf,
    /// PostgreSQL's `%p`.
    file: PathBuf,
}

/// `restore_command`'s client: `wal-restore --socket <socket> <name> <path>`.
#[derive(Parser)]
struct WalRestore {
    #[arg(long)]
    socket: PathBuf,
    /// PostgreSQL's `%f`.
    name: String,
    /// PostgreSQL's `%p`.
    path: PathBuf,
}

fn main() -> ExitCode {
    // The clients PostgreSQL runs for each WAL file: no runtime, no telemetry.
    let subcommand = std::env::args_os().nth(1);
    if subcommand.as_ref().is_some_and(|a| a == "wal-archive") {
        let args = WalArchive::parse_from(std::env::args_os().skip(1));
        return match archive::request(&args.socket, &args.file) {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => {
                eprintln!("cairn-instance wal-archive: {message}");
                ExitCode::FAILURE
            }
        };
    }
    if subcommand.as_ref().is_some_and(|a| a == "wal-restore") {
        let args = WalRestore::parse_from(std::env::args_os().skip(1));
        return match restore::request(&args.socket, &args.name, &args.path) {
            Ok(true) => ExitCode::SUCCESS,
            // Not archived: PostgreSQL's end of the archive.
            Ok(false) => ExitCode::FAILURE,
            // Any other failure must not read as the end of the archive
            // (recovery would end early and promote): an exit code above
            // 125 stops the server, and the instance starts it again.
            Err(message) => {
                eprintln!("cairn-instance wal-restore: {message}");
                ExitCode::from(255)
            }
        };
    }
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(instance()),
        Err(e) => {
            eprintln!("cairn-instance: no runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn instance() -> ExitCode {
    let config = Config::parse();
    let telemetry = match cairn_runtime::telemetry::init(
        "cairn-instance",
        config.log_format,
        &config.log_level,
        None,
    ) {
        Ok(telemetry) => telemetry,
        Err(e) => {
            eprintln!("cairn-instance: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = match run(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            tracing::error!("{message}");
            ExitCode::FAILURE
        }
    };
    telemetry.shutdown();
    code
}

async fn run(config: Config) -> Result<(), StartError> {
    // First: as PID 1, a signal without a handler is ignored, not fatal.
    let mut terminate = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let children = Children::start().map_err(|e| format!("cannot reap children: {e}"))?;
    let metrics = Metrics::new().map_err(|e| format!("metrics: {e}"))?;
    let state = Arc::new(State::new(metrics));
    // Three missed polls and a margin before `/livez` fails.
    let live_limit = config.poll() * 3 + Duration::from_secs(5);
    let health = server::health_router(state.clone(), live_limit);
    let metrics = server::metrics_router(state.clone());
    let (http, metrics_address) = (config.http_address, config.metrics_address);
    let archiver = wal_archiver(&config, &state)?;
    let socket = config.wal_archive_socket();
    let archiving = async {
        match archiver {
            Some(archiver) => archiver.serve(socket).await.map_err(|e| e.to_string()),
            None => std::future::pending().await,
        }
    };
    let listeners = async {
        tokio::try_join!(
            async {
                server::serve(http, health)
                    .await
                    .map_err(|e| format!("HTTP listener: {e}"))
            },
            async {
                server::serve(metrics_address, metrics)
                    .await
                    .map_err(|e| format!("metrics listener: {e}"))
            },
            archiving
        )
    };
    let (done, finished) = watch::channel(false);
    let (assignment, assigned) = watch::channel(Assignment::default());
    let (heartbeat, renewer) =
        start_membership(&config, &state, &children, assignment, finished).await?;
    let shutdown = async {
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
            _ = interrupt.recv() => tracing::info!("SIGINT: stopping"),
        }
    };
    tracing::info!(version = env!("CARGO_PKG_VERSION"), %http, metrics = %metrics_address, "cairn-instance starting");
    let (verified, verification) = watch::channel(None);
    let verifying = config.verify.then(|| {
        let (config, state) = (config.clone(), state.clone());
        let started = std::time::Instant::now();
        tokio::spawn(async move {
            let report = verify::verify(&config, &state, started).await;
            tracing::info!(verified = report.verified, reason = %report.reason, message = %report.message, "verification done");
            if let Err(message) = verify::write_report(&config.verify_report, &report) {
                tracing::error!(%message, "cannot write the verification report");
            }
            let _ = verified.send(Some(report.verified));
        })
    });
    let shutdown = async {
        let mut verification = verification.clone();
        tokio::select! {
            () = shutdown => {}
            _ = verification.wait_for(Option::is_some), if verifying.is_some() => {}
        }
    };
    let supervisor = Supervisor::new(config, children, state, assigned, heartbeat);
    tokio::select! {
        served = listeners => return served.map(|_| ()).map_err(Into::into),
        () = supervisor.run(shutdown) => {}
    }
    // The Lease's last write says what is true now: stopped, not ready.
    let _ = done.send(true);
    if let Some(renewer) = renewer {
        let _ = tokio::time::timeout(Duration::from_secs(5), renewer).await;
    }
    // Verifying, only a verdict of success is a success.
    match *verification.borrow() {
        Some(false) => Err("the backup did not verify".into()),
        None if verifying.is_some() => Err("stopped before the verification ended".into()),
        _ => Ok(()),
    }
}

/// The WAL archiver, when the cluster has a backup destination; it also
/// answers `restore_command` from the source's archive on an instance
/// configured to restore (same bucket, the source cluster's folder).
fn wal_archiver(config: &Config, state: &Arc<State>) -> Result<Option<Arc<Archiver>>, StartError> {
    let Some(settings) = config
        .backup_destination()
        .map_err(|e| format!("backup destination credentials: {e}"))?
    else {
        return Ok(None);
    };
    if config.verify {
        let (source, _) = config
            .restore_source()
            .ok_or("verifying needs the backup's cluster (CAIRN_RESTORE_CLUSTER)")?;
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
    let cluster = config
        .cluster
        .as_deref()
        .ok_or("a backup destination needs the cluster's name (CAIRN_CLUSTER)")?;
    if config.restore_cluster.as_deref() == Some(cluster) {
        return Err(
            "CAIRN_RESTORE_CLUSTER is this cluster: a restore would archive over its source".into(),
        );
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

/// In a pod: the pod watch (the role), the Lease renewal (the heartbeat)
/// and, with a backup destination, the base backups the backup controller
/// asks for. Outside one: the role file, no heartbeat, no base backups.
async fn start_membership(
    config: &Config,
    state: &Arc<State>,
    children: &Children,
    assignment: watch::Sender<Assignment>,
    done: watch::Receiver<bool>,
) -> Result<(Arc<Heartbeat>, Option<tokio::task::JoinHandle<()>>), StartError> {
    if config.verify {
        tracing::info!("verifying a backup: restoring it as a primary, no membership");
        let _ = assignment.send(Assignment {
            role: Some(cairn_instance::observe::Role::Primary),
            bootstrap: Some(membership::Bootstrap::Restore),
        });
        return Ok((Heartbeat::none(), None));
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
            membership::Bootstrap::Restore
        } else {
            membership::Bootstrap::Initdb
        };
        tokio::spawn(membership::watch_role_file(
            config.role_file.clone(),
            config.poll(),
            bootstrap,
            assignment,
        ));
        return Ok((Heartbeat::none(), None));
    };
    // In a pod, the API is the only source of the role: no client, no start.
    let client = kube::Client::try_default()
        .await
        .map_err(|e| format!("no Kubernetes client for the membership: {e}"))?;
    let heartbeat = Heartbeat::new(Duration::from_secs(config.fence_seconds));
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
        heartbeat.clone(),
        Duration::from_millis(config.heartbeat_milliseconds.max(100)),
        done,
    ));
    Ok((heartbeat, Some(renewer)))
}

/// Base backups on request, when the cluster has a backup destination.
fn start_backups(
    config: &Config,
    state: &Arc<State>,
    children: &Children,
    client: &kube::Client,
    namespace: &str,
    pod: &str,
) -> Result<(), StartError> {
    let (Some(settings), Some(cluster)) = (
        config
            .backup_destination()
            .map_err(|e| format!("backup destination credentials: {e}"))?,
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
