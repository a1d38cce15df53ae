use std::time::Duration;

/// Why a harness call failed. Messages are written to be read in a failed
/// test's output.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("local cluster: {0}")]
    Setup(String),
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("timed out after {timeout:?} waiting for {what}; last observed: {last_observed}")]
    Timeout {
        what: String,
        timeout: Duration,
        last_observed: String,
    },
}
