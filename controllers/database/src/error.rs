//! Why a reconcile failed, and how the manager retries it.

use cairn_runtime::errors::ErrorClass;
use cairn_runtime::manager::Classify;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a request; retried with backoff.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The spec cannot be acted on; reported in `Ready` and not retried until
    /// the spec changes.
    #[error("invalid spec: {0}")]
    InvalidSpec(String),
    /// Something the cluster needs is not there yet; retried with backoff.
    #[error("waiting for {0}")]
    DependencyNotReady(String),
    /// A certificate could not be made (a fault of this process, not of the
    /// spec); retried with backoff.
    #[error("making a certificate: {0}")]
    Certificate(String),
}

impl Classify for Error {
    fn class(&self) -> ErrorClass {
        match self {
            Self::Kube(_) => ErrorClass::Transient,
            Self::InvalidSpec(_) => ErrorClass::InvalidSpec,
            Self::DependencyNotReady(_) => ErrorClass::DependencyNotReady,
            Self::Certificate(_) => ErrorClass::Transient,
        }
    }
}
