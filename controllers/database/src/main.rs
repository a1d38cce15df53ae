//! Entry point of cairn-database-controller.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use cairn_database_controller::metrics::ClusterMetrics;
use cairn_database_controller::reconcile::{self, Context};
use cairn_database_controller::{MANAGER, leftovers, webhook, wiring};
use cairn_runtime::Allocator;
use cairn_runtime::config::Config;
use cairn_runtime::manager::{BuildInfo, Manager};
use kube::runtime::events::Recorder;

const INFO: BuildInfo = cairn_runtime::build_info!("database");

#[global_allocator]
static ALLOCATOR: Allocator = Allocator;

#[tokio::main]
async fn main() -> ExitCode {
    run().await.unwrap_or_else(|e| {
        eprintln!("cairn-database-controller: cannot start: {e}");
        ExitCode::FAILURE
    })
}

/// `CAIRN_COLLECTOR_GRACE_SECONDS`: how long the garbage collector gets to
/// delete a replaced StatefulSet's pods before the controller does (60 s
/// by default; see `leftovers.rs`).
fn collector_grace() -> Result<Duration, String> {
    match std::env::var("CAIRN_COLLECTOR_GRACE_SECONDS") {
        Err(_) => Ok(leftovers::COLLECTOR_GRACE),
        Ok(value) => match value.parse::<u64>() {
            Ok(seconds) if seconds > 0 => Ok(Duration::from_secs(seconds)),
            _ => Err(format!(
                "CAIRN_COLLECTOR_GRACE_SECONDS={value}: a whole number of seconds, at least 1"
            )),
        },
    }
}

async fn run() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let mut manager = Manager::start(INFO, Config::load()).await?;
    let router = webhook::router(manager.metrics.clone());
    let webhook = manager.serve_webhook(router, &[webhook::CRD]).await?;
    let metrics = ClusterMetrics::register(&manager.metrics.registry)?;
    let (controller, clusters, caches) = wiring::database_controller(&mut manager);
    let recorder = Recorder::new(manager.client.clone(), MANAGER.into());
    let context = Arc::new(
        Context::new(manager.client.clone(), recorder, caches, metrics)
            .with_collector_grace(collector_grace()?),
    );
    tokio::spawn(Context::housekeeping(
        context.clone(),
        clusters,
        Duration::from_secs(10),
    ));
    let code = manager.run(controller, reconcile::reconcile, context).await;
    if let Some(webhook) = webhook {
        webhook.shutdown();
    }
    Ok(code)
}
