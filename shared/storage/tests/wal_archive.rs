//! The WAL archive against the local cluster's moto (the real S3 wire
//! protocol): what is stored comes back byte for byte, a name is never
//! overwritten with other content, and a damaged object is refused.

use cairn_storage::{S3Settings, StorageError, Stored, WalArchive, WalName};
use cairn_testing::{cluster, s3};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

async fn archive(prefix: &str) -> Result<(WalArchive, aws_sdk_s3::Client, String)> {
    let endpoint = cluster().s3_endpoint().to_owned();
    let bucket = format!("wal-{}", rand::random::<u32>());
    let client = s3::client(&endpoint);
    client.create_bucket().bucket(&bucket).send().await?;
    let settings = S3Settings {
        endpoint: Some(endpoint),
        bucket: bucket.clone(),
        region: None,
        prefix: prefix.into(),
        access_key_id: "testing".into(),
        secret_access_key: "testing".into(),
    };
    Ok((WalArchive::new(&settings, "orders"), client, bucket))
}

/// 16 MiB of WAL-like content: mostly zeros, some varying bytes.
fn segment(seed: u8) -> Vec<u8> {
    let mut content = vec![0u8; 16 << 20];
    for (i, byte) in content.iter_mut().enumerate().step_by(97) {
        *byte = (i as u8).wrapping_mul(seed);
    }
    content
}

#[tokio::test]
async fn stored_files_come_back_byte_for_byte_and_are_listed_in_order() -> Result {
    let (archive, client, bucket) = archive("backups/").await?;
    let dir = tempdir()?;
    let names = [
        "000000010000000000000002",
        "000000010000000000000001",
        "00000002.history",
    ];
    for (i, name) in names.iter().enumerate() {
        let content = if name.ends_with("history") {
            b"1\t0/3000000\tno recovery target specified\n".to_vec()
        } else {
            segment(i as u8 + 1)
        };
        let path = dir.join(name);
        std::fs::write(&path, &content)?;
        let stored = archive.put(&WalName::parse(name)?, &path).await?;
        let Stored::Uploaded { bytes, compressed } = stored else {
            panic!("{name} was not uploaded: {stored:?}");
        };
        assert_eq!(bytes, content.len() as u64);
        if bytes > 1 << 20 {
            assert!(
                compressed * 4 < bytes,
                "{name}: {compressed} of {bytes} bytes"
            );
        }
        let back = dir.join(format!("{name}.back"));
        assert!(archive.get(&WalName::parse(name)?, &back).await?);
        assert!(
            std::fs::read(&back)? == content,
            "{name} changed on the way"
        );
    }
    let listed: Vec<String> = archive
        .list()
        .await?
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(
        listed,
        [
            "000000010000000000000001",
            "000000010000000000000002",
            "00000002.history"
        ]
    );
    let keys = client.list_objects_v2().bucket(&bucket).send().await?;
    let keys: Vec<&str> = keys.contents().iter().filter_map(|o| o.key()).collect();
    assert!(
        keys.contains(&"backups/orders/wal/00000001/000000010000000000000001.zst"),
        "{keys:?}"
    );
    assert!(
        !archive
            .get(&WalName::parse("000000010000000000000009")?, &dir.join("x"))
            .await?
    );
    Ok(())
}

#[tokio::test]
async fn a_name_is_never_overwritten_with_other_content() -> Result {
    let (archive, _, _) = archive("").await?;
    let dir = tempdir()?;
    let name = WalName::parse("000000010000000000000001")?;
    let path = dir.join(name.as_str());
    std::fs::write(&path, segment(1))?;
    assert!(matches!(
        archive.put(&name, &path).await?,
        Stored::Uploaded { .. }
    ));
    // PostgreSQL retries a segment whose acknowledgement was lost.
    assert_eq!(archive.put(&name, &path).await?, Stored::AlreadyThere);
    std::fs::write(&path, segment(2))?;
    let refused = archive.put(&name, &path).await;
    assert!(
        matches!(refused, Err(StorageError::Conflict { .. })),
        "{refused:?}"
    );
    let back = dir.join("back");
    archive.get(&name, &back).await?;
    assert!(
        std::fs::read(&back)? == segment(1),
        "the first content was replaced"
    );
    Ok(())
}

#[tokio::test]
async fn a_damaged_object_is_refused() -> Result {
    let (archive, client, bucket) = archive("").await?;
    let dir = tempdir()?;
    let name = WalName::parse("000000010000000000000001")?;
    let path = dir.join(name.as_str());
    std::fs::write(&path, segment(1))?;
    archive.put(&name, &path).await?;
    let key = "orders/wal/00000001/000000010000000000000001.zst";
    let head = client.head_object().bucket(&bucket).key(key).send().await?;
    let sum = head
        .metadata()
        .and_then(|m| m.get("sha256"))
        .cloned()
        .unwrap_or_default();
    // Valid zstd, other content, the old checksum: bit rot or a bad copy.
    let other = zstd::bulk::compress(&segment(3), 3)?;
    client
        .put_object()
        .bucket(&bucket)
        .key(key)
        .metadata("sha256", sum)
        .body(other.into())
        .send()
        .await?;
    let back = dir.join("back");
    let refused = archive.get(&name, &back).await;
    assert!(
        matches!(refused, Err(StorageError::Corrupt { .. })),
        "{refused:?}"
    );
    assert!(!back.exists(), "a damaged file was handed to PostgreSQL");
    Ok(())
}

/// A folder of the test's own, removed when the test ends.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn join(&self, name: impl AsRef<std::path::Path>) -> std::path::PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir() -> Result<TempDir> {
    let dir = std::env::temp_dir().join(format!("cairn-storage-{}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir)?;
    Ok(TempDir(dir))
}

#[tokio::test]
async fn files_before_a_segment_are_deleted_on_every_timeline_and_history_is_kept() -> Result {
    let (archive, client, bucket) = archive("").await?;
    let dir = tempdir()?;
    let names = [
        "000000010000000000000001",
        "000000010000000000000002.00000028.backup",
        "000000010000000000000003.partial",
        "00000002.history",
        "000000020000000000000003",
        "000000020000000000000004",
    ];
    for name in names {
        let path = dir.join(name);
        std::fs::write(&path, name.as_bytes())?;
        archive.put(&WalName::parse(name)?, &path).await?;
    }
    let before = archive.last_stored().await?.expect("a time");
    assert!(before <= std::time::SystemTime::now() + std::time::Duration::from_secs(5));

    let deleted = archive.delete_before("0000000000000003").await?;
    assert_eq!(deleted, 2, "segment 1 and the label of segment 2");
    let left: Vec<String> = archive
        .list()
        .await?
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(
        left,
        [
            "000000010000000000000003.partial",
            "00000002.history",
            "000000020000000000000003",
            "000000020000000000000004",
        ]
    );

    // The bucket gone: said as such, so a caller can tell it from an outage.
    s3::delete_bucket(&client, &bucket).await?;
    let gone = archive.delete_before("0000000000000009").await;
    assert!(
        matches!(gone, Err(StorageError::BucketGone { .. })),
        "{gone:?}"
    );
    Ok(())
}
