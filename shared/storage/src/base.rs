//! Base backups of one cluster: a tar stream uploaded zstd-compressed as a
//! multipart upload, then a manifest with every file's size and checksum,
//! written last. A backup is complete when, and only when, its manifest
//! exists: the catalog is the list of manifests, read from the bucket.

use std::io::{Read, Write};

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use futures::stream::{FuturesUnordered, StreamExt};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::layout::{BASE_BACKUP_MANIFEST, BackupId, BackupKind};
use crate::wal::{corrupt, s3};
use crate::{Layout, S3Settings, StorageError};

/// zstd level of base backups: a data folder compresses well at level 3,
/// and a higher level costs more CPU than the network saves.
const ZSTD_LEVEL: i32 = 3;
/// Parts of a multipart upload: S3 takes at most 10,000, so the size grows
/// by steps: 8 MiB for the first 8 GB of compressed data, then 16, 32, and
/// 64 MiB from 56 GB (about 490 GB in all).
const FIRST_PART: usize = 8 << 20;
const LARGEST_PART_STEP: usize = 3;
/// Parts compressed ahead of the upload.
const PARTS_QUEUED: usize = 1;
/// Downloaded chunks (a few KiB to a MiB each) waiting for the decoder.
const CHUNKS_QUEUED: usize = 16;
/// Bytes of parts in flight (at least one part): with the part being
/// compressed and the one queued, memory stays under 48 MiB up to 8 GB
/// compressed, and under 192 MiB with the largest parts.
const BYTES_IN_FLIGHT: usize = 32 << 20;

/// What a backup's manifest records: enough to restore it, verify it and
/// list it without reading anything else.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub id: String,
    pub cluster: String,
    /// The Backup object it was taken for.
    pub backup_name: String,
    pub backup_uid: String,
    pub timeline: u32,
    /// WAL position where the backup starts, and where a restore of it
    /// becomes consistent (`X/Y`).
    pub begin_lsn: String,
    pub end_lsn: String,
    /// RFC 3339.
    pub started_at: String,
    pub completed_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_version: Option<String>,
    pub files: Vec<StoredFile>,
}

impl Manifest {
    /// Compressed bytes stored.
    pub fn stored_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.compressed_bytes).sum()
    }
}

/// One file of a backup's folder.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredFile {
    /// Its name in the folder (`data.tar.zst`).
    pub name: String,
    /// Uncompressed size and SHA-256 of the uncompressed content.
    pub bytes: u64,
    pub sha256: String,
    pub compressed_bytes: u64,
}

/// One cluster's base backups in a bucket (or, made with
/// [`BaseBackups::dumps`], its logical backups: the same files, manifest
/// and catalog, in their own folder).
#[derive(Clone, Debug)]
pub struct BaseBackups {
    client: aws_sdk_s3::Client,
    bucket: String,
    layout: Layout,
    kind: BackupKind,
}

impl BaseBackups {
    pub fn new(settings: &S3Settings, cluster: &str) -> Self {
        Self::of_kind(settings, cluster, BackupKind::Base)
    }

    /// The cluster's logical backups (pg_dump).
    pub fn dumps(settings: &S3Settings, cluster: &str) -> Self {
        Self::of_kind(settings, cluster, BackupKind::Dump)
    }

    pub fn of_kind(settings: &S3Settings, cluster: &str, kind: BackupKind) -> Self {
        Self {
            client: settings.client(),
            bucket: settings.bucket.clone(),
            layout: Layout::new(&settings.prefix, cluster),
            kind,
        }
    }

    fn folder(&self, id: &BackupId) -> String {
        self.layout.backup(self.kind, id)
    }

    /// `s3://bucket/<cluster's folder>`: where this cluster's backups go.
    pub fn destination(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.layout.root())
    }

    /// `s3://bucket/<cluster's folder>/base/<id>/` (`dumps/<id>/`).
    pub fn location(&self, id: &BackupId) -> String {
        format!("s3://{}/{}", self.bucket, self.folder(id))
    }

    /// Uploads everything `source` yields as file `name` of backup `id`,
    /// compressed, while `source` is still being produced (a pipe from
    /// pg_basebackup); `progress` hears the compressed bytes stored so far.
    /// Nothing is visible under the key until the whole stream is stored.
    pub async fn upload(
        &self,
        id: &BackupId,
        name: &str,
        source: impl Read + Send + 'static,
        progress: impl Fn(u64) + Send,
    ) -> Result<StoredFile, StorageError> {
        let key = format!("{}{name}", self.folder(id));
        let upload = self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(&key)
            .send()
            .await
            .map_err(|e| s3("CreateMultipartUpload", &key, e))?;
        let upload_id = upload.upload_id().unwrap_or_default().to_owned();
        // Aborted however this ends before completing: an error, or the
        // future dropped (the backup cancelled). An upload left incomplete
        // is invisible, but billed until a lifecycle rule removes it.
        let mut abort = AbortOnDrop {
            client: self.client.clone(),
            bucket: self.bucket.clone(),
            key: key.clone(),
            upload_id: upload_id.clone(),
            armed: true,
        };
        let (parts, file) = match self.upload_parts(&key, &upload_id, source, progress).await {
            Ok(stored) => stored,
            Err(e) => {
                abort.now().await;
                return Err(e);
            }
        };
        self.client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(&key)
            .upload_id(&upload_id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(parts))
                    .build(),
            )
            .send()
            .await
            .map_err(|e| s3("CompleteMultipartUpload", &key, e))?;
        abort.armed = false;
        Ok(StoredFile {
            name: name.to_owned(),
            ..file
        })
    }

    /// Compresses `source` on a blocking thread into parts, uploaded a few
    /// at a time as they come.
    async fn upload_parts(
        &self,
        key: &str,
        upload_id: &str,
        source: impl Read + Send + 'static,
        progress: impl Fn(u64) + Send,
    ) -> Result<(Vec<CompletedPart>, StoredFile), StorageError> {
        let (parts_tx, mut parts_rx) = mpsc::channel::<Vec<u8>>(PARTS_QUEUED);
        let compressing =
            tokio::task::spawn_blocking(move || compress_into_parts(source, parts_tx));
        let mut in_flight = FuturesUnordered::new();
        let mut completed = Vec::new();
        let (mut number, mut stored) = (0, 0u64);
        loop {
            tokio::select! {
                part = parts_rx.recv(), if in_flight.len() < in_flight_limit(number) => {
                    let Some(part) = part else { break };
                    number += 1;
                    in_flight.push(self.upload_part(key, upload_id, number, part));
                }
                Some(done) = in_flight.next() => {
                    let (part, bytes): (CompletedPart, u64) = done?;
                    stored += bytes;
                    progress(stored);
                    completed.push(part);
                }
            }
        }
        while let Some(done) = in_flight.next().await {
            let (part, bytes) = done?;
            stored += bytes;
            progress(stored);
            completed.push(part);
        }
        let (bytes, sha256) = compressing
            .await
            .map_err(|e| io(key, std::io::Error::other(e)))?
            .map_err(|e| io(key, e))?;
        completed.sort_by_key(|p| p.part_number());
        Ok((
            completed,
            StoredFile {
                name: String::new(),
                bytes,
                sha256,
                compressed_bytes: stored,
            },
        ))
    }

    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        number: i32,
        part: Vec<u8>,
    ) -> Result<(CompletedPart, u64), StorageError> {
        let bytes = part.len() as u64;
        let uploaded = self
            .client
            .upload_part()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .part_number(number)
            .content_length(bytes as i64)
            .body(ByteStream::from(part))
            .send()
            .await
            .map_err(|e| s3("UploadPart", key, e))?;
        let part = CompletedPart::builder()
            .part_number(number)
            .set_e_tag(uploaded.e_tag().map(str::to_owned))
            .build();
        Ok((part, bytes))
    }

    /// Stores the manifest: from now on the backup is complete.
    pub async fn write_manifest(&self, manifest: &Manifest) -> Result<(), StorageError> {
        let id = BackupId::parse(&manifest.id)?;
        let key = format!("{}{BASE_BACKUP_MANIFEST}", self.folder(&id));
        let body = serde_json::to_vec_pretty(manifest).map_err(|e| corrupt(&key, e.to_string()))?;
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(&key)
            .content_type("application/json")
            .body(ByteStream::from(body))
            .send()
            .await
            .map_err(|e| s3("PutObject", &key, e))?;
        Ok(())
    }

    /// The manifest of backup `id`; `None` while the backup is not complete.
    pub async fn manifest(&self, id: &BackupId) -> Result<Option<Manifest>, StorageError> {
        let key = format!("{}{BASE_BACKUP_MANIFEST}", self.folder(id));
        let Some(object) = crate::s3::get_if_present(&self.client, &self.bucket, &key).await?
        else {
            return Ok(None);
        };
        let body = object
            .body
            .collect()
            .await
            .map_err(|e| corrupt(&key, e.to_string()))?
            .into_bytes();
        serde_json::from_slice(&body)
            .map(Some)
            .map_err(|e| corrupt(&key, format!("not a manifest: {e}")))
    }

    /// Every complete backup of the cluster, oldest first.
    pub async fn catalog(&self) -> Result<Vec<Manifest>, StorageError> {
        let root = self.layout.backups_root(self.kind);
        let ids: Vec<BackupId> = crate::s3::keys(&self.client, &self.bucket, &root)
            .await?
            .iter()
            .filter_map(|key| self.layout.manifest_in(self.kind, key))
            .collect();
        let mut manifests = Vec::with_capacity(ids.len());
        for id in ids {
            manifests.extend(self.manifest(&id).await?);
        }
        manifests.sort_by(|a, b| a.completed_at.cmp(&b.completed_at));
        Ok(manifests)
    }

    /// Writes the uncompressed content of a backup's file to `sink`,
    /// refusing it (after the fact: the sink must be thrown away) when its
    /// size or checksum differs from the manifest's.
    pub async fn download(
        &self,
        id: &BackupId,
        file: &StoredFile,
        sink: impl Write + Send + 'static,
    ) -> Result<(), StorageError> {
        let key = format!("{}{}", self.folder(id), file.name);
        let object = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(&key)
            .send()
            .await
            .map_err(|e| s3("GetObject", &key, e))?;
        let (chunks_tx, chunks_rx) = mpsc::channel::<Vec<u8>>(CHUNKS_QUEUED);
        let decoding = tokio::task::spawn_blocking(move || decompress(chunks_rx, sink));
        let mut body = object.body;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| corrupt(&key, e.to_string()))?;
            if chunks_tx.send(chunk.to_vec()).await.is_err() {
                break; // the decoder stopped: its error says why
            }
        }
        drop(chunks_tx);
        let (bytes, sha256) = decoding
            .await
            .map_err(|e| io(&key, std::io::Error::other(e)))?
            .map_err(|e| corrupt(&key, format!("cannot decompress: {e}")))?;
        if bytes != file.bytes || sha256 != file.sha256 {
            return Err(corrupt(
                &key,
                format!(
                    "content differs from the manifest ({bytes} bytes, sha256 {sha256}; the manifest says {} bytes, sha256 {})",
                    file.bytes, file.sha256
                ),
            ));
        }
        Ok(())
    }

    /// Removes backup `id`: the manifest first, so a deletion cut short
    /// leaves an incomplete backup, never a complete-looking one.
    pub async fn delete(&self, id: &BackupId) -> Result<(), StorageError> {
        let folder = self.folder(id);
        let manifest = format!("{folder}{BASE_BACKUP_MANIFEST}");
        crate::s3::delete_all(&self.client, &self.bucket, [manifest]).await?;
        let rest = crate::s3::keys(&self.client, &self.bucket, &folder).await?;
        crate::s3::delete_all(&self.client, &self.bucket, rest).await?;
        Ok(())
    }
}

/// Reads `source` to its end, compressing it into parts of growing size
/// sent to `parts`; returns the uncompressed size and SHA-256.
fn compress_into_parts(
    mut source: impl Read,
    parts: mpsc::Sender<Vec<u8>>,
) -> std::io::Result<(u64, String)> {
    let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), ZSTD_LEVEL)?;
    let mut hash = Sha256::new();
    let (mut bytes, mut sent) = (0u64, 0usize);
    let mut buffer = vec![0; 1 << 20];
    let gone = || std::io::Error::other("the upload stopped");
    loop {
        let read = match source.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hash.update(&buffer[..read]);
        bytes += read as u64;
        encoder.write_all(&buffer[..read])?;
        if encoder.get_ref().len() >= part_size(sent) {
            let part = std::mem::take(encoder.get_mut());
            parts.blocking_send(part).map_err(|_| gone())?;
            sent += 1;
        }
    }
    let last = encoder.finish()?;
    parts.blocking_send(last).map_err(|_| gone())?;
    Ok((bytes, hex::encode(hash.finalize())))
}

/// The size of part `index` (from 0): 8 MiB, doubled every 1,000 parts up
/// to 64 MiB.
fn part_size(index: usize) -> usize {
    FIRST_PART << (index / 1000).min(LARGEST_PART_STEP)
}

/// Parts in flight once `sent` parts were started.
fn in_flight_limit(sent: i32) -> usize {
    let size = part_size(usize::try_from(sent).unwrap_or(0));
    (BYTES_IN_FLIGHT / size).max(1)
}

/// Aborts a multipart upload when dropped armed.
struct AbortOnDrop {
    client: aws_sdk_s3::Client,
    bucket: String,
    key: String,
    upload_id: String,
    armed: bool,
}

impl AbortOnDrop {
    /// Aborts now, waiting for S3's answer (best effort).
    async fn now(&mut self) {
        self.armed = false;
        let _ = self
            .client
            .abort_multipart_upload()
            .bucket(&self.bucket)
            .key(&self.key)
            .upload_id(&self.upload_id)
            .send()
            .await;
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if !self.armed {
            return;
        }
        let request = self
            .client
            .abort_multipart_upload()
            .bucket(&self.bucket)
            .key(&self.key)
            .upload_id(&self.upload_id);
        runtime.spawn(async move {
            let _ = request.send().await;
        });
    }
}

fn decompress(
    mut chunks: mpsc::Receiver<Vec<u8>>,
    sink: impl Write,
) -> std::io::Result<(u64, String)> {
    let mut counted = Hashing {
        inner: sink,
        hash: Sha256::new(),
        bytes: 0,
    };
    let mut decoder = zstd::stream::write::Decoder::new(&mut counted)?;
    while let Some(chunk) = chunks.blocking_recv() {
        decoder.write_all(&chunk)?;
    }
    decoder.flush()?;
    drop(decoder);
    counted.inner.flush()?;
    Ok((counted.bytes, hex::encode(counted.hash.finalize())))
}

/// A writer that hashes and counts what passes through.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
    bytes: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buffer: &[u8]) -> std::io::Result<usize> {
        let written = self.inner.write(buffer)?;
        self.hash.update(&buffer[..written]);
        self.bytes += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn io(key: &str, source: std::io::Error) -> StorageError {
    StorageError::Io {
        path: key.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_grow_so_that_ten_thousand_hold_480_gigabytes_compressed() {
        assert_eq!(part_size(0), 8 << 20);
        assert_eq!(part_size(999), 8 << 20);
        assert_eq!(part_size(1000), 16 << 20);
        assert_eq!(part_size(9999), 64 << 20);
        let capacity: u64 = (0..10_000).map(|i| part_size(i) as u64).sum();
        assert!(capacity > 480 << 30, "{capacity}");
        assert_eq!((in_flight_limit(0), in_flight_limit(5000)), (4, 1));
    }

    #[test]
    fn compressed_parts_decompress_to_the_source_and_its_checksum() {
        let source: Vec<u8> = (0..(3 << 20)).map(|i: u32| (i % 251) as u8).collect();
        let (tx, mut rx) = mpsc::channel(100);
        let (bytes, sum) = compress_into_parts(source.as_slice(), tx).expect("compress");
        assert_eq!(bytes, source.len() as u64);
        assert_eq!(sum, hex::encode(Sha256::digest(&source)));
        let (chunks_tx, chunks_rx) = mpsc::channel(100);
        while let Ok(part) = rx.try_recv() {
            chunks_tx.try_send(part).expect("send");
        }
        drop(chunks_tx);
        let mut out = Vec::new();
        let (n, sum2) = decompress(chunks_rx, &mut out).expect("decompress");
        assert_eq!((n, sum2), (bytes, sum));
        assert_eq!(out, source);
    }
}
