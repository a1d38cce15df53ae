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

async fn run() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let mut manager = Manager::start(INFO, Config::load()).await?;
    let router = webhook::router(manager.metrics.clone());
    let webhook = manager.serve_webhook(router, &[webhook::CRD]).await?;
    let metrics = ClusterMetrics::register(&manager.metrics.registry)?;
    let (controller, clusters, caches) = wiring::database_controller(&mut manager);
    let recorder = Recorder::new(manager.client.clone(), MANAGER.into());
    let context = Arc::new(
        Context::new(manager.client.clone(), recorder, caches, metrics)
            .with_collector_grace(leftovers::collector_grace_from_env()?)
            .with_health(manager.health.clone()),
    );
    let housekeeper = context.clone();
    manager.every(Duration::from_secs(10), move || {
        housekeeper.housekeeping(&clusters)
    });
    let code = manager.run(controller, reconcile::reconcile, context).await;
    if let Some(webhook) = webhook {
        webhook.shutdown();
    }
    Ok(code)
}
