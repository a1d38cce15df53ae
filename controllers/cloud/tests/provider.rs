//! A ProviderConfig's client against the local cluster's moto: S3 reached at
//! its endpoint with its credentials, never faster than its rate limit.

use std::time::{Duration, Instant};

use cairn_api::cloud::v1alpha1::{ProviderConfigSpec, ProviderType, RateLimit};
use cairn_api::common::LocalObjectReference;
use cairn_cloud_controller::bucket::Buckets;
use cairn_cloud_controller::external::External;
use cairn_cloud_controller::provider::{ACCESS_KEY_ID, Provider, SECRET_ACCESS_KEY};
use cairn_testing::cluster;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

#[tokio::test]
async fn calls_never_exceed_the_provider_configs_rate() -> Result {
    let spec = ProviderConfigSpec {
        type_: ProviderType::Aws,
        region: "eu-west-1".into(),
        endpoint: Some(cluster().s3_endpoint().to_owned()),
        credentials_secret_ref: LocalObjectReference { name: "aws".into() },
        rate_limit: Some(RateLimit { qps: 5, burst: 5 }),
    };
    let secret = Secret {
        data: Some(
            [(ACCESS_KEY_ID, "testing"), (SECRET_ACCESS_KEY, "testing")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Secret::default()
    };
    let provider = Provider::new(&spec, Some(&secret))?;
    let buckets = Buckets {
        s3: provider.s3(provider.region()),
        region: provider.region().to_owned(),
    };
    let name = format!("rate-{}", rand::random::<u32>());
    let spec = serde_json::from_value(serde_json::json!({
        "providerConfigRef": { "name": "aws" },
    }))?;
    let started = Instant::now();
    // 25 observations of an absent bucket: one HeadBucket each.
    for _ in 0..25 {
        buckets.observe(&spec, &name, "uid-rate").await?;
    }
    let took = started.elapsed();
    println!(
        "25 calls at 5/s with a burst of 5: {:.2} s",
        took.as_secs_f64()
    );
    // The burst goes at once, the 20 others at 5 a second.
    assert!(took >= Duration::from_millis(3900), "{took:?}");

    // The same client creates in its region, with its credentials.
    buckets.create(&spec, &name, "uid-rate").await?;
    let location = buckets
        .s3
        .get_bucket_location()
        .bucket(&name)
        .send()
        .await?
        .location_constraint
        .map(|l| l.as_str().to_owned());
    assert_eq!(location.as_deref(), Some("eu-west-1"));
    buckets.delete(&name).await?;
    Ok(())
}
