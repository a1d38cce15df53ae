//! `kubectl-cairn`, the kubectl plugin for Cairn (`kubectl cairn ...` once
//! the binary is on PATH): a DatabaseCluster at a glance, backups,
//! switchovers, forced promotions, rolling restarts, pause and resume, and support bundles.
//!
//! What the commands decide is computed by pure functions from API objects
//! (`view`, `switchover::candidate`, `redact`, `report::readme`), unit-tested
//! here; the Kubernetes calls are kept in thin functions around them.

mod args;
mod backup;
mod client;
mod cluster;
mod promote;
mod redact;
mod report;
mod status;
mod switchover;
mod view;

#[cfg(test)]
mod fixtures;

use std::process::ExitCode;

use clap::{CommandFactory, Parser};

use crate::args::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Completion { shell } => {
            let mut command = Cli::command();
            clap_complete::generate(shell, &mut command, "kubectl-cairn", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::Version => {
            println!("kubectl-cairn {}", env!("CARGO_PKG_VERSION"));
            Ok(ExitCode::SUCCESS)
        }
        Command::Status { cluster, output } => {
            let target = client::connect(&cli.global).await?;
            status::run(&target, &cluster, output).await
        }
        Command::Backup(backup) => {
            let target = client::connect(&cli.global).await?;
            backup::run(&target, &backup).await
        }
        Command::Switchover(request) => {
            let target = client::connect(&cli.global).await?;
            switchover::run(&target, &request).await
        }
        Command::Promote(request) => {
            let target = client::connect(&cli.global).await?;
            promote::run(&target, &request).await
        }
        Command::Restart(request) => {
            let target = client::connect(&cli.global).await?;
            cluster::restart(&target, &request).await
        }
        Command::Pause { cluster } => {
            let target = client::connect(&cli.global).await?;
            cluster::set_paused(&target, &cluster, true).await
        }
        Command::Resume { cluster } => {
            let target = client::connect(&cli.global).await?;
            cluster::set_paused(&target, &cluster, false).await
        }
        Command::Report(request) => {
            let target = client::connect(&cli.global).await?;
            report::run(&target, &request).await
        }
    }
}
