//! Where Cairn keeps backups. One layout of a cluster's files in an S3
//! bucket, shared by cairn-instance (which archives WAL and takes base
//! backups) and the backup controller (which reads the catalog from the
//! bucket: the bucket, not a controller's memory, is the truth).
//!
//! The layout itself is API surface ([`cairn_api::backup::layout`]).
//!
//! Every object is zstd-compressed and carries the SHA-256 of its
//! uncompressed content in its metadata (`x-amz-meta-sha256`), checked on
//! every read, so a damaged object is refused instead of replayed.

pub mod base;
pub mod s3;
pub mod wal;

pub use base::{BaseBackups, Manifest, StoredFile};
pub use cairn_api::backup::layout::{self, BackupId, Layout, WalName};
pub use s3::S3Settings;
pub use wal::{Stored, WalArchive};

/// Why a storage operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error(transparent)]
    InvalidName(#[from] cairn_api::backup::layout::InvalidWalName),
    #[error(transparent)]
    InvalidBackupId(#[from] cairn_api::backup::layout::InvalidBackupId),
    /// The bucket does not exist (deleted, or never made).
    #[error("{operation} {key}: the bucket does not exist ({message})")]
    BucketGone {
        operation: &'static str,
        key: String,
        message: String,
    },
    #[error("{operation} {key}: {message}")]
    S3 {
        operation: &'static str,
        key: String,
        message: String,
    },
    #[error(
        "{key} already holds a different file (another cluster archiving to the same place?); refusing to overwrite it"
    )]
    Conflict { key: String },
    #[error("{key} is damaged: {reason}")]
    Corrupt { key: String, reason: String },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl StorageError {
    /// The message without the object's key: the same fault reads the same
    /// whichever file met it (for a condition that should not churn).
    pub fn summary(&self) -> String {
        match self {
            Self::S3 {
                operation, message, ..
            } => format!("{operation}: {message}"),
            Self::BucketGone { operation, .. } => {
                format!("{operation}: the bucket does not exist")
            }
            Self::Conflict { .. } => "a different file is already stored under the same name \
                (another cluster archiving to the same place?)"
                .to_owned(),
            Self::Corrupt { reason, .. } => format!("a stored file is damaged: {reason}"),
            other => other.to_string(),
        }
    }

    /// A short, stable label for metrics and conditions.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidName(_) | Self::InvalidBackupId(_) => "InvalidName",
            Self::S3 { .. } => "StorageUnavailable",
            Self::BucketGone { .. } => "BucketGone",
            Self::Conflict { .. } => "Conflict",
            Self::Corrupt { .. } => "Corrupt",
            Self::Io { .. } => "LocalIO",
        }
    }
}
