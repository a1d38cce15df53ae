//! Entry point of cairn-backup-controller.

use std::process::ExitCode;

use cairn_backup_controller::wiring;
use cairn_runtime::Allocator;
use cairn_runtime::config::Config;
use cairn_runtime::manager::{BuildInfo, Manager};

#[global_allocator]
static ALLOCATOR: Allocator = Allocator;

const INFO: BuildInfo = cairn_runtime::build_info!("backup");

#[tokio::main]
async fn main() -> ExitCode {
    run().await.unwrap_or_else(|e| {
        eprintln!("cairn-backup-controller: cannot start: {e}");
        ExitCode::FAILURE
    })
}

async fn run() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let mut manager = Manager::start(INFO, Config::load()).await?;
    let controllers = wiring::controllers(&mut manager)?;
    Ok(manager.run_all(controllers).await)
}
