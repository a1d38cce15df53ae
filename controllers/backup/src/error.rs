//! Why a reconcile failed, and how the manager retries it.

use cairn_runtime::errors::ErrorClass;
use cairn_runtime::manager::Classify;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a request; retried with backoff.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The bucket refused or failed a request; retried with backoff.
    #[error("backup storage: {0}")]
    Storage(#[from] cairn_storage::StorageError),
}

impl Classify for Error {
    fn class(&self) -> ErrorClass {
        match self {
            Self::Kube(_) | Self::Storage(_) => ErrorClass::Transient,
        }
    }
}
