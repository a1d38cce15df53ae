use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use cairn_instance::children::Children;
use cairn_instance::config::Config;
use cairn_instance::membership::{self, Assignment, Heartbeat};
use cairn_instance::metrics::Metrics;
use cairn_instance::server;
use cairn_instance::state::State;
use cairn_instance::supervisor::Supervisor;
use clap::Parser;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

/// Why the instance could not start or keep serving.
type StartError = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> ExitCode {
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
    let listeners = async {
        tokio::try_join!(
            server::serve(http, health),
            server::serve(metrics_address, metrics)
        )
    };
    let (done, finished) = watch::channel(false);
    let (assignment, assigned) = watch::channel(Assignment::default());
    let (heartbeat, renewer) = start_membership(&config, &state, assignment, finished).await?;
    let shutdown = async {
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
            _ = interrupt.recv() => tracing::info!("SIGINT: stopping"),
        }
    };
    tracing::info!(version = env!("CARGO_PKG_VERSION"), %http, metrics = %metrics_address, "cairn-instance starting");
    let supervisor = Supervisor::new(config, children, state, assigned, heartbeat);
    tokio::select! {
        served = listeners => return served.map(|_| ()).map_err(|e| format!("HTTP listener: {e}").into()),
        () = supervisor.run(shutdown) => {}
    }
    // The Lease's last write says what is true now: stopped, not ready.
    let _ = done.send(true);
    if let Some(renewer) = renewer {
        let _ = tokio::time::timeout(Duration::from_secs(5), renewer).await;
    }
    Ok(())
}

/// In a pod: the pod watch (the role) and the Lease renewal (the heartbeat).
/// Outside one: the role file, and no heartbeat.
async fn start_membership(
    config: &Config,
    state: &Arc<State>,
    assignment: watch::Sender<Assignment>,
    done: watch::Receiver<bool>,
) -> Result<(Arc<Heartbeat>, Option<tokio::task::JoinHandle<()>>), StartError> {
    let in_pod = match (&config.pod_name, &config.pod_namespace) {
        (Some(name), Some(namespace)) if config.membership => {
            Some((name.clone(), namespace.clone()))
        }
        _ => None,
    };
    let Some((name, namespace)) = in_pod else {
        tracing::info!(role_file = %config.role_file.display(), "outside a pod: the role comes from a file, no heartbeat");
        tokio::spawn(membership::watch_role_file(
            config.role_file.clone(),
            config.poll(),
            assignment,
        ));
        return Ok((Heartbeat::none(), None));
    };
    // In a pod, the API is the only source of the role: no client, no start.
    let client = kube::Client::try_default()
        .await
        .map_err(|e| format!("no Kubernetes client for the membership: {e}"))?;
    let heartbeat = Heartbeat::new(Duration::from_secs(config.fence_seconds));
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
