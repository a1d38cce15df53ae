//! Entry point of cairn-cloud-controller.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!(
        "cairn-cloud-controller {}: reconciles {} (not implemented yet; see the project issues)",
        env!("CARGO_PKG_VERSION"),
        cairn_cloud_controller::GROUP
    );
    ExitCode::FAILURE
}
