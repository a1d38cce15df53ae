//! Entry point of cairn-backup-controller.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!(
        "cairn-backup-controller {}: reconciles {} (not implemented yet; see the project issues)",
        env!("CARGO_PKG_VERSION"),
        cairn_backup_controller::GROUP
    );
    ExitCode::FAILURE
}
