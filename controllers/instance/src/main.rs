use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use cairn_instance::children::Children;
use cairn_instance::config::Config;
use cairn_instance::metrics::Metrics;
use cairn_instance::state::State;
use cairn_instance::supervisor::Supervisor;
use cairn_instance::{report, server};
use clap::Parser;
use k8s_openapi::api::core::v1::Pod;
use tokio::signal::unix::{SignalKind, signal};

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

async fn run(config: Config) -> Result<(), String> {
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
    let (done, finished) = tokio::sync::watch::channel(false);
    let reporter = match config.report_to_pod {
        true => start_reporting(&config, &state, finished).await,
        false => None,
    };
    let shutdown = async {
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
            _ = interrupt.recv() => tracing::info!("SIGINT: stopping"),
        }
    };
    tracing::info!(version = env!("CARGO_PKG_VERSION"), %http, metrics = %metrics_address, "cairn-instance starting");
    let supervisor = Supervisor::new(config, children, state);
    tokio::select! {
        served = listeners => return served.map(|_| ()).map_err(|e| format!("HTTP listener: {e}")),
        () = supervisor.run(shutdown) => {}
    }
    // The pod's last report says what is true now: stopped, not ready.
    let _ = done.send(true);
    if let Some(reporter) = reporter {
        let _ = tokio::time::timeout(Duration::from_secs(5), reporter).await;
    }
    Ok(())
}

/// Starts the pod annotation reporter when this runs in a pod it can reach.
async fn start_reporting(
    config: &Config,
    state: &Arc<State>,
    done: tokio::sync::watch::Receiver<bool>,
) -> Option<tokio::task::JoinHandle<()>> {
    let (Some(name), Some(namespace)) = (config.pod_name.clone(), config.pod_namespace.clone())
    else {
        tracing::info!("POD_NAME or POD_NAMESPACE unset: the observed state stays in /status");
        return None;
    };
    match kube::Client::try_default().await {
        Ok(client) => {
            let pods = kube::Api::<Pod>::namespaced(client, &namespace);
            let interval = Duration::from_secs(config.report_interval_seconds);
            let observed = state.observed();
            Some(tokio::spawn(report::report(
                pods, name, observed, done, interval,
            )))
        }
        Err(e) => {
            tracing::warn!(error = %e, "no Kubernetes client: the observed state stays in /status");
            None
        }
    }
}
