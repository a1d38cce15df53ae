//! cairn-instance: the WAL clients PostgreSQL runs, or the instance itself,
//! PID 1 of a database pod: its tasks, in the order they start.

use std::process::ExitCode;

use cairn_instance::children::Children;
use cairn_instance::config::Config;
use cairn_instance::error::{Context, Error};
use cairn_instance::fence;
use cairn_instance::supervisor::Supervisor;
use cairn_instance::tasks::{self, Membership, Verification};
use cairn_instance::wal_clients;
use clap::Parser;

fn main() -> ExitCode {
    // The clients PostgreSQL runs for each WAL file: no runtime, no telemetry.
    let subcommand = std::env::args_os().nth(1);
    if subcommand.as_ref().is_some_and(|a| a == "wal-archive") {
        return wal_clients::archive(std::env::args_os().skip(1));
    }
    if subcommand.as_ref().is_some_and(|a| a == "wal-restore") {
        return wal_clients::restore(std::env::args_os().skip(1));
    }
    if subcommand
        .as_ref()
        .is_some_and(|a| a == fence::WATCHDOG_COMMAND)
    {
        return fence::watchdog();
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

async fn run(config: Config) -> Result<(), Error> {
    // First: as PID 1, a signal without a handler is ignored, not fatal.
    let shutdown = tasks::shutdown_signals()?;
    let children = Children::start().context(|| "cannot reap children".to_owned())?;
    let state = tasks::new_state()?;
    // Health, metrics and the WAL archiver's socket: they listen once polled.
    let listeners = tasks::listeners(&config, &state)?;
    let membership = Membership::start(&config, &state, &children).await?;
    tracing::info!(version = env!("CARGO_PKG_VERSION"), http = %config.http_address, metrics = %config.metrics_address, "cairn-instance starting");
    let verification = Verification::start(&config, &state);
    let (assignment, primacy) = (membership.assignment.clone(), membership.primacy.clone());
    let supervisor = Supervisor::new(config, children, state, assignment, primacy);
    tokio::select! {
        served = listeners => return served,
        () = supervisor.run(verification.or_verdict(shutdown)) => {}
    }
    // The Lease's last write, after the supervisor stopped postgres.
    membership.stop().await;
    verification.outcome()
}
