//! An S3 client for a backup destination: AWS, or any S3-compatible service
//! (MinIO, Ceph, moto) at an explicit endpoint.

use aws_credential_types::Credentials;
use aws_sdk_s3::config::{
    BehaviorVersion, Builder, Region, RequestChecksumCalculation, ResponseChecksumValidation,
};

/// The keys of a credentials Secret.
pub use cairn_api::backup::v1::{ACCESS_KEY_ID, SECRET_ACCESS_KEY};

/// The value of `key` in a credentials Secret, trimmed; `None` when it
/// is missing, empty or not UTF-8.
pub fn secret_value(secret: &k8s_openapi::api::core::v1::Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()?
        .get(key)
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// The region when none is given (S3-compatible services ignore it).
const DEFAULT_REGION: &str = "us-east-1";

/// A bucket and how to reach it.
#[derive(Clone)]
pub struct S3Settings {
    /// The S3 API's URL; AWS's regional endpoint when `None`.
    pub endpoint: Option<String>,
    pub bucket: String,
    pub region: Option<String>,
    /// Key prefix under which clusters' folders are kept.
    pub prefix: String,
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl std::fmt::Debug for S3Settings {
    // Never the secret key, whoever logs the settings.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Settings")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .field("region", &self.region)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl S3Settings {
    /// The settings of a destination given explicitly, with its
    /// credentials Secret (`None`: missing); the error says what is wrong.
    pub fn of(
        destination: &cairn_api::backup::v1::S3Destination,
        secret: Option<&k8s_openapi::api::core::v1::Secret>,
    ) -> Result<Self, String> {
        let name = &destination.credentials_secret.name;
        let secret = secret.ok_or_else(|| format!("Secret {name} does not exist"))?;
        let key = |key: &str| {
            secret_value(secret, key).ok_or_else(|| format!("Secret {name} has no key {key}"))
        };
        Ok(Self {
            endpoint: destination.endpoint.clone(),
            bucket: destination.bucket.clone(),
            region: destination.region.clone(),
            prefix: destination.prefix.clone().unwrap_or_default(),
            access_key_id: key(ACCESS_KEY_ID)?,
            secret_access_key: key(SECRET_ACCESS_KEY)?,
        })
    }

    pub fn client(&self) -> aws_sdk_s3::Client {
        let mut config = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(
                self.region.clone().unwrap_or_else(|| DEFAULT_REGION.into()),
            ))
            .credentials_provider(Credentials::new(
                self.access_key_id.clone(),
                self.secret_access_key.clone(),
                None,
                None,
                "cairn-backup-destination",
            ));
        if let Some(endpoint) = &self.endpoint {
            config = s3_compatible(config, endpoint);
        }
        aws_sdk_s3::Client::from_conf(config.build())
    }
}

/// An S3 configuration for a service at `endpoint`: one host (no DNS name
/// per bucket), and checksums only where S3 requires them (several
/// S3-compatible services reject the SDK's default CRC headers).
pub fn s3_compatible(config: Builder, endpoint: &str) -> Builder {
    config
        .endpoint_url(endpoint)
        .force_path_style(true)
        .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
        .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
}

/// The objects under `prefix`, every page of them.
pub(crate) async fn objects(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    prefix: &str,
) -> Result<Vec<aws_sdk_s3::types::Object>, crate::StorageError> {
    let mut pages = client
        .list_objects_v2()
        .bucket(bucket)
        .prefix(prefix)
        .into_paginator()
        .send();
    let mut objects = Vec::new();
    while let Some(page) = pages.next().await {
        let page = page.map_err(|e| crate::wal::s3("ListObjectsV2", prefix, e))?;
        objects.extend(page.contents().iter().cloned());
    }
    Ok(objects)
}

/// The keys under `prefix`, every page of them.
pub(crate) async fn keys(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    prefix: &str,
) -> Result<Vec<String>, crate::StorageError> {
    Ok(objects(client, bucket, prefix)
        .await?
        .into_iter()
        .filter_map(|o| o.key)
        .collect())
}

/// Deletes `keys`, a few at a time (one request each: DeleteObjects needs
/// a checksum header some S3-compatible services reject).
pub(crate) async fn delete_all(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    keys: impl IntoIterator<Item = String>,
) -> Result<usize, crate::StorageError> {
    use futures::stream::{StreamExt, TryStreamExt};
    futures::stream::iter(keys)
        .map(|key| async move {
            client
                .delete_object()
                .bucket(bucket)
                .key(&key)
                .send()
                .await
                .map_err(|e| crate::wal::s3("DeleteObject", &key, e))
        })
        .buffer_unordered(DELETES_IN_FLIGHT)
        .try_fold(0, |deleted, _| async move { Ok(deleted + 1) })
        .await
}

/// Deletions sent at once.
const DELETES_IN_FLIGHT: usize = 16;

/// Object `key`, or `None` if there is no such object.
pub(crate) async fn get_if_present(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
) -> Result<Option<aws_sdk_s3::operation::get_object::GetObjectOutput>, crate::StorageError> {
    match client.get_object().bucket(bucket).key(key).send().await {
        Ok(object) => Ok(Some(object)),
        Err(e) if e.as_service_error().is_some_and(|e| e.is_no_such_key()) => Ok(None),
        Err(e) => Err(crate::wal::s3("GetObject", key, e)),
    }
}
