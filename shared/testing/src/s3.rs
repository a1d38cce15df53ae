//! S3 and Route53 clients for the moto server, the fake AWS of the local
//! cluster.

use aws_credential_types::Credentials;
use aws_sdk_s3::config::{BehaviorVersion, Region};

/// An S3 client for `endpoint` (see [`crate::LocalCluster::s3_endpoint`]) with
/// moto's dummy credentials and path-style addressing (no DNS per bucket).
pub fn client(endpoint: &str) -> aws_sdk_s3::Client {
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(
            "testing",
            "testing",
            None,
            None,
            "cairn-testing",
        ))
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

/// A Route53 client for `endpoint` (moto serves every AWS service there),
/// with moto's dummy credentials.
pub fn route53(endpoint: &str) -> aws_sdk_route53::Client {
    let config = aws_sdk_route53::Config::builder()
        .behavior_version(aws_sdk_route53::config::BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(aws_sdk_route53::config::Region::new("us-east-1"))
        .credentials_provider(Credentials::new(
            "testing",
            "testing",
            None,
            None,
            "cairn-testing",
        ))
        .build();
    aws_sdk_route53::Client::from_conf(config)
}

/// Every key of `bucket` (under `prefix`), for tests that check what is stored.
pub async fn keys(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    prefix: &str,
) -> Result<Vec<String>, aws_sdk_s3::Error> {
    let mut pages = client
        .list_objects_v2()
        .bucket(bucket)
        .prefix(prefix)
        .into_paginator()
        .send();
    let mut keys = Vec::new();
    while let Some(page) = pages.next().await {
        keys.extend(
            page?
                .contents()
                .iter()
                .filter_map(|o| o.key().map(str::to_owned)),
        );
    }
    Ok(keys)
}

/// Empties and deletes `bucket`: the bucket gone, as when its owner removed it.
pub async fn delete_bucket(
    client: &aws_sdk_s3::Client,
    bucket: &str,
) -> Result<(), aws_sdk_s3::Error> {
    for key in keys(client, bucket, "").await? {
        client
            .delete_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await?;
    }
    client.delete_bucket().bucket(bucket).send().await?;
    Ok(())
}
