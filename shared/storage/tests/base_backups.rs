//! Base backups against the local cluster's moto (the real S3 wire
//! protocol): a stream larger than a part comes back byte for byte, only a
//! backup with a manifest is in the catalog, an altered object is refused,
//! and a deletion leaves nothing that looks complete.

use cairn_storage::{BackupId, BaseBackups, Manifest, S3Settings, StorageError};
use cairn_testing::{cluster, s3};
use rand::RngCore;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

async fn backups() -> Result<(BaseBackups, aws_sdk_s3::Client, String)> {
    let endpoint = cluster().s3_endpoint().to_owned();
    let bucket = format!("base-{}", rand::random::<u32>());
    let client = s3::client(&endpoint);
    client.create_bucket().bucket(&bucket).send().await?;
    let settings = S3Settings {
        endpoint: Some(endpoint),
        bucket: bucket.clone(),
        region: None,
        prefix: "backups".into(),
        access_key_id: "testing".into(),
        secret_access_key: "testing".into(),
    };
    Ok((BaseBackups::new(&settings, "orders"), client, bucket))
}

fn manifest(id: &BackupId, files: Vec<cairn_storage::StoredFile>) -> Manifest {
    Manifest {
        id: id.to_string(),
        cluster: "orders".into(),
        backup_name: "nightly".into(),
        backup_uid: "0d9e".into(),
        timeline: 1,
        begin_lsn: "0/2000028".into(),
        end_lsn: "0/2000138".into(),
        started_at: "2026-11-26T03:00:00Z".into(),
        completed_at: "2026-11-26T03:00:09Z".into(),
        server_version: Some("17.6".into()),
        files,
    }
}

#[tokio::test]
async fn a_backup_is_in_the_catalog_once_its_manifest_is_and_comes_back_byte_for_byte() -> Result {
    let (backups, client, bucket) = backups().await?;
    // 20 MiB that does not compress: three parts of a multipart upload.
    let mut content = vec![0u8; 20 << 20];
    rand::rng().fill_bytes(&mut content);
    let id = BackupId::parse("nightly-0d9e0000")?;
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let progress = seen.clone();
    let file = backups
        .upload(
            &id,
            "data.tar.zst",
            std::io::Cursor::new(content.clone()),
            move |n| progress.store(n, std::sync::atomic::Ordering::Relaxed),
        )
        .await?;
    assert_eq!(file.bytes, content.len() as u64);
    assert_eq!(
        seen.load(std::sync::atomic::Ordering::Relaxed),
        file.compressed_bytes
    );
    assert!(
        backups.catalog().await?.is_empty(),
        "listed before its manifest"
    );
    assert_eq!(backups.manifest(&id).await?, None);

    let written = manifest(&id, vec![file.clone()]);
    backups.write_manifest(&written).await?;
    assert_eq!(backups.catalog().await?, vec![written.clone()]);
    assert_eq!(
        backups.location(&id),
        format!("s3://{bucket}/backups/orders/base/nightly-0d9e0000/")
    );

    let (tx, rx) = std::sync::mpsc::channel();
    backups.download(&id, &file, Sink(Vec::new(), tx)).await?;
    assert!(rx.recv()? == content, "downloaded content differs");

    // An object altered in the bucket is refused.
    let key = "backups/orders/base/nightly-0d9e0000/data.tar.zst";
    let other = zstd::bulk::compress(b"not the backup", 3)?;
    client
        .put_object()
        .bucket(&bucket)
        .key(key)
        .body(other.into())
        .send()
        .await?;
    let (tx, _rx) = std::sync::mpsc::channel();
    let refused = backups.download(&id, &file, Sink(Vec::new(), tx)).await;
    assert!(
        matches!(refused, Err(StorageError::Corrupt { .. })),
        "{refused:?}"
    );

    backups.delete(&id).await?;
    assert!(backups.catalog().await?.is_empty());
    let left = client
        .list_objects_v2()
        .bucket(&bucket)
        .prefix("backups/orders/base/")
        .send()
        .await?;
    assert_eq!(left.key_count(), Some(0), "{:?}", left.contents());
    Ok(())
}

#[tokio::test]
async fn a_stream_that_fails_midway_leaves_no_object() -> Result {
    let (backups, client, bucket) = backups().await?;
    let id = BackupId::parse("broken-00000000")?;
    let failed = backups
        .upload(&id, "data.tar.zst", Failing(30 << 20), |_| {})
        .await;
    assert!(matches!(failed, Err(StorageError::Io { .. })), "{failed:?}");
    let left = client
        .list_objects_v2()
        .bucket(&bucket)
        .prefix("backups/orders/")
        .send()
        .await?;
    assert_eq!(left.key_count(), Some(0), "{:?}", left.contents());
    let uploads = client
        .list_multipart_uploads()
        .bucket(&bucket)
        .send()
        .await?;
    assert!(
        uploads.uploads().is_empty(),
        "not aborted: {:?}",
        uploads.uploads()
    );
    Ok(())
}

/// Collects what is written and hands it over when dropped.
struct Sink(Vec<u8>, std::sync::mpsc::Sender<Vec<u8>>);

impl std::io::Write for Sink {
    fn write(&mut self, buffer: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buffer);
        Ok(buffer.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        let _ = self.1.send(std::mem::take(&mut self.0));
    }
}

/// Yields random bytes, then fails after `n` of them (a pg_basebackup that
/// died midway).
struct Failing(usize);

impl std::io::Read for Failing {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        if self.0 == 0 {
            return Err(std::io::Error::other("pg_basebackup died"));
        }
        let n = buffer.len().min(self.0);
        rand::rng().fill_bytes(&mut buffer[..n]);
        self.0 -= n;
        Ok(n)
    }
}
