//! The WAL archive of one cluster: files PostgreSQL hands to
//! `archive_command`, stored compressed with their checksum, and fetched
//! back for `restore_command`.

use std::path::Path;

use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_s3::primitives::ByteStream;
use sha2::{Digest, Sha256};

use crate::{Layout, S3Settings, StorageError, WalName};

/// The metadata key holding the SHA-256 of an object's uncompressed content.
const SHA256: &str = "sha256";
/// zstd's default level: WAL shrinks several times at a few hundred MB/s.
const ZSTD_LEVEL: i32 = 3;

/// What `put` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    Uploaded {
        bytes: u64,
        compressed: u64,
    },
    /// The same content was already archived (a retry after a crash, or a
    /// file archived ahead of PostgreSQL's request).
    AlreadyThere,
}

/// One cluster's WAL in a bucket.
#[derive(Clone, Debug)]
pub struct WalArchive {
    client: aws_sdk_s3::Client,
    bucket: String,
    layout: Layout,
}

impl WalArchive {
    pub fn new(settings: &S3Settings, cluster: &str) -> Self {
        Self {
            client: settings.client(),
            bucket: settings.bucket.clone(),
            layout: Layout::new(&settings.prefix, cluster),
        }
    }

    /// `s3://bucket/<cluster's folder>/wal/`, for messages and status.
    pub fn location(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.layout.wal_root())
    }

    /// Stores the file at `path` as `name`; returns once S3 acknowledged it.
    /// A different file already stored under that name is never overwritten.
    pub async fn put(&self, name: &WalName, path: &Path) -> Result<Stored, StorageError> {
        let key = self.layout.wal(name);
        let content = tokio::fs::read(path)
            .await
            .map_err(|source| StorageError::Io {
                path: path.display().to_string(),
                source,
            })?;
        let bytes = content.len() as u64;
        // Hashing and compressing 16 MiB is CPU work: off the async workers.
        let (sum, compressed) = blocking(move || {
            Ok((
                sha256(&content),
                zstd::bulk::compress(&content, ZSTD_LEVEL)?,
            ))
        })
        .await
        .map_err(|e| corrupt(&key, format!("cannot compress: {e}")))?;
        if let Some(stored) = self.stored_sum(&key).await? {
            return if stored == sum {
                Ok(Stored::AlreadyThere)
            } else {
                Err(StorageError::Conflict { key })
            };
        }
        let compressed_len = compressed.len() as u64;
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(&key)
            .metadata(SHA256, sum)
            .content_length(compressed_len as i64)
            .body(ByteStream::from(compressed))
            .send()
            .await
            .map_err(|e| s3("PutObject", &key, e))?;
        Ok(Stored::Uploaded {
            bytes,
            compressed: compressed_len,
        })
    }

    /// Writes the archived `name` to `destination` (through a temporary
    /// file and a rename, so a reader never sees half a file); `false` if
    /// it was never archived. Content whose checksum does not match is
    /// refused.
    pub async fn get(&self, name: &WalName, destination: &Path) -> Result<bool, StorageError> {
        let key = self.layout.wal(name);
        let Some(object) = crate::s3::get_if_present(&self.client, &self.bucket, &key).await?
        else {
            return Ok(false);
        };
        let expected = object.metadata().and_then(|m| m.get(SHA256)).cloned();
        let compressed = object
            .body
            .collect()
            .await
            .map_err(|e| StorageError::S3 {
                operation: "GetObject",
                key: key.clone(),
                message: DisplayErrorContext(&e).to_string(),
            })?
            .into_bytes();
        let (content, sum) = blocking(move || {
            let content = zstd::stream::decode_all(compressed.as_ref())?;
            let sum = sha256(&content);
            Ok((content, sum))
        })
        .await
        .map_err(|e| corrupt(&key, format!("not zstd: {e}")))?;
        match expected {
            Some(expected) if expected == sum => {}
            Some(_) => return Err(corrupt(&key, "checksum mismatch".into())),
            None => return Err(corrupt(&key, "no checksum in its metadata".into())),
        }
        write_atomically(destination, &content).await?;
        Ok(true)
    }

    /// Whether `name` is archived.
    pub async fn contains(&self, name: &WalName) -> Result<bool, StorageError> {
        Ok(self.stored_sum(&self.layout.wal(name)).await?.is_some())
    }

    /// Every file archived, in name order (timeline, then position).
    pub async fn list(&self) -> Result<Vec<WalName>, StorageError> {
        let root = self.layout.wal_root();
        let mut names: Vec<WalName> = crate::s3::keys(&self.client, &self.bucket, &root)
            .await?
            .iter()
            .filter_map(|key| self.layout.wal_name(key))
            .collect();
        names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        Ok(names)
    }

    /// Deletes every file that belongs to a segment before segment
    /// `first_needed` ([`crate::layout::segment_number_of`]), on every
    /// timeline; timeline history files are kept (a restore reads them to
    /// follow the timelines). Returns how many were deleted.
    pub async fn delete_before(&self, first_needed: &str) -> Result<usize, StorageError> {
        let keys = crate::s3::keys(&self.client, &self.bucket, &self.layout.wal_root()).await?;
        let old = keys.into_iter().filter(|key| {
            self.layout
                .wal_name(key)
                .and_then(|name| Some(name.segment_number()? < first_needed))
                .unwrap_or(false)
        });
        crate::s3::delete_all(&self.client, &self.bucket, old).await
    }

    /// When the newest file of the archive was stored, if there is one.
    pub async fn last_stored(&self) -> Result<Option<std::time::SystemTime>, StorageError> {
        let objects =
            crate::s3::objects(&self.client, &self.bucket, &self.layout.wal_root()).await?;
        Ok(objects
            .iter()
            .filter_map(|o| std::time::SystemTime::try_from(*o.last_modified()?).ok())
            .max())
    }

    /// The checksum stored with `key`, or `None` if there is no such object.
    async fn stored_sum(&self, key: &str) -> Result<Option<String>, StorageError> {
        match self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(head) => Ok(Some(
                head.metadata()
                    .and_then(|m| m.get(SHA256))
                    .cloned()
                    .unwrap_or_default(),
            )),
            Err(e) if e.as_service_error().is_some_and(|e| e.is_not_found()) => Ok(None),
            Err(e) => Err(s3("HeadObject", key, e)),
        }
    }
}

fn sha256(content: &[u8]) -> String {
    hex::encode(Sha256::digest(content))
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(std::io::Error::other)?
}

async fn write_atomically(destination: &Path, content: &[u8]) -> Result<(), StorageError> {
    let io = |source| StorageError::Io {
        path: destination.display().to_string(),
        source,
    };
    let mut temporary = destination.as_os_str().to_owned();
    temporary.push(".cairn-partial");
    let temporary = std::path::PathBuf::from(temporary);
    tokio::fs::write(&temporary, content).await.map_err(io)?;
    tokio::fs::File::open(&temporary)
        .await
        .map_err(io)?
        .sync_all()
        .await
        .map_err(io)?;
    tokio::fs::rename(&temporary, destination).await.map_err(io)
}

pub(crate) fn s3<E>(operation: &'static str, key: &str, error: E) -> StorageError
where
    E: std::error::Error + ProvideErrorMetadata,
{
    let message = match error.code() {
        Some(code) => format!("{code}: {}", error.message().unwrap_or_default()),
        None => DisplayErrorContext(&error).to_string(),
    };
    if error.code() == Some("NoSuchBucket") {
        return StorageError::BucketGone {
            operation,
            key: key.to_owned(),
            message,
        };
    }
    StorageError::S3 {
        operation,
        key: key.to_owned(),
        message,
    }
}

pub(crate) fn corrupt(key: &str, reason: String) -> StorageError {
    StorageError::Corrupt {
        key: key.to_owned(),
        reason,
    }
}
