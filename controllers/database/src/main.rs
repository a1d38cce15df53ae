//! Entry point of cairn-database-controller.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!(
        "cairn-database-controller {}: reconciles {} (not implemented yet; see the project issues)",
        env!("CARGO_PKG_VERSION"),
        cairn_database_controller::GROUP
    );
    ExitCode::FAILURE
}
