//! An S3 client for the moto server, the fake AWS of the local cluster.

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
