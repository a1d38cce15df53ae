//! Provider clients from a ProviderConfig: its credentials (a Secret of the
//! same namespace), region and endpoint, and one token bucket shared by every
//! call made through it. The bucket sits in the HTTP connector, so every
//! attempt on the wire counts, the SDK's own retries included: the provider
//! never sees more than the configured rate.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use aws_credential_types::Credentials;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{BehaviorVersion, Region};
use aws_smithy_http_client::tls::{Provider as Tls, rustls_provider::CryptoMode};
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::HttpRequest;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use cairn_api::cloud::v1alpha1::ProviderConfigSpec;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use k8s_openapi::api::core::v1::Secret;
use prometheus::IntCounterVec;

use crate::metrics::CallCounter;

/// The keys of the credentials Secret.
pub use cairn_storage::s3::{ACCESS_KEY_ID, SECRET_ACCESS_KEY};

/// Rate when `spec.rateLimit` is unset.
const DEFAULT_QPS: u32 = 10;
const DEFAULT_BURST: u32 = 20;

/// How long a call waits for a connection, and then for the provider's
/// answer once its request is sent (a wait for the token bucket is not
/// counted). A provider, or a proxy on the way, that takes a request and
/// never answers would otherwise hold the reconcile, and with it its
/// object, for ever; past these the call fails as a provider fault and is
/// retried with backoff.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// What a client needs from a ProviderConfig and its Secret.
#[derive(Clone)]
pub struct Provider {
    region: String,
    endpoint: Option<String>,
    credentials: Credentials,
    http: SharedHttpClient,
    timeouts: TimeoutConfig,
    /// Where every attempt is counted, if anywhere.
    calls: Option<IntCounterVec>,
}

/// Why a ProviderConfig cannot be used: the condition message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unusable(pub String);

impl Provider {
    /// A provider from `spec` and its credentials Secret (`None`: missing).
    pub fn new(spec: &ProviderConfigSpec, secret: Option<&Secret>) -> Result<Self, Unusable> {
        let secret_name = &spec.credentials_secret_ref.name;
        let secret = secret.ok_or_else(|| {
            Unusable(format!(
                "Secret {secret_name} (spec.credentialsSecretRef) does not exist in this namespace"
            ))
        })?;
        let key = |key: &str| {
            cairn_storage::s3::secret_value(secret, key)
                .ok_or_else(|| Unusable(format!("Secret {secret_name} has no key {key}")))
        };
        let credentials = Credentials::new(
            key(ACCESS_KEY_ID)?,
            key(SECRET_ACCESS_KEY)?,
            None,
            None,
            "cairn-provider-config",
        );
        let (qps, burst) = spec
            .rate_limit
            .as_ref()
            .map_or((DEFAULT_QPS, DEFAULT_BURST), |r| {
                (
                    u32::try_from(r.qps).unwrap_or(1),
                    u32::try_from(r.burst).unwrap_or(1),
                )
            });
        Ok(Self {
            region: spec.region.clone(),
            endpoint: spec.endpoint.clone(),
            credentials,
            http: limited_http_client(qps, burst),
            timeouts: TimeoutConfig::builder()
                .connect_timeout(CONNECT_TIMEOUT)
                .read_timeout(ANSWER_TIMEOUT)
                .build(),
            calls: None,
        })
    }

    /// Counts every call of its clients in `calls` (see [`CallCounter`]).
    pub fn counting(mut self, calls: IntCounterVec) -> Self {
        self.calls = Some(calls);
        self
    }

    /// The default region of its resources.
    pub fn region(&self) -> &str {
        &self.region
    }

    /// What a consumer needs to reach S3 in `region` with these credentials
    /// (the keys of a connection Secret).
    pub fn s3_connection(&self, region: &str) -> BTreeMap<String, String> {
        let endpoint = self
            .endpoint
            .clone()
            .unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com"));
        BTreeMap::from([
            ("endpoint".to_owned(), endpoint),
            ("region".to_owned(), region.to_owned()),
            (
                ACCESS_KEY_ID.to_owned(),
                self.credentials.access_key_id().to_owned(),
            ),
            (
                SECRET_ACCESS_KEY.to_owned(),
                self.credentials.secret_access_key().to_owned(),
            ),
        ])
    }

    /// An S3 client for `region`, through this provider's token bucket.
    pub fn s3(&self, region: &str) -> aws_sdk_s3::Client {
        let mut config = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(region.to_owned()))
            .credentials_provider(self.credentials.clone())
            .http_client(self.http.clone())
            .timeout_config(self.timeouts.clone());
        if let Some(calls) = &self.calls {
            config = config.interceptor(CallCounter(calls.clone()));
        }
        if let Some(endpoint) = &self.endpoint {
            config = cairn_storage::s3::s3_compatible(config, endpoint);
        }
        aws_sdk_s3::Client::from_conf(config.build())
    }

    /// A Route53 client (a global service: signed for us-east-1), through
    /// this provider's token bucket.
    pub fn route53(&self) -> aws_sdk_route53::Client {
        plain_client!(aws_sdk_route53, self, "us-east-1".to_owned())
    }

    /// An STS client (the identity check), through this provider's token
    /// bucket.
    pub fn sts(&self) -> aws_sdk_sts::Client {
        plain_client!(aws_sdk_sts, self, self.region.clone())
    }
}

/// A client of AWS service crate `$sdk` for `$provider` in `$region`: its
/// credentials, token bucket, call counter and endpoint. (The services'
/// config builders are distinct types with the same methods.)
macro_rules! plain_client {
    ($sdk:ident, $provider:expr, $region:expr) => {{
        let provider = $provider;
        let mut config = $sdk::Config::builder()
            .behavior_version($sdk::config::BehaviorVersion::latest())
            .region($sdk::config::Region::new($region))
            .credentials_provider(provider.credentials.clone())
            .http_client(provider.http.clone())
            .timeout_config(provider.timeouts.clone());
        if let Some(calls) = &provider.calls {
            config = config.interceptor(CallCounter(calls.clone()));
        }
        if let Some(endpoint) = &provider.endpoint {
            config = config.endpoint_url(endpoint);
        }
        $sdk::Client::from_conf(config.build())
    }};
}
use plain_client;

/// The SDK's HTTPS client (rustls on aws-lc, as kube's) behind a token bucket
/// of `qps` a second and `burst` at once.
pub fn limited_http_client(qps: u32, burst: u32) -> SharedHttpClient {
    let quota = Quota::per_second(NonZeroU32::new(qps).unwrap_or(NonZeroU32::MIN))
        .allow_burst(NonZeroU32::new(burst.max(qps)).unwrap_or(NonZeroU32::MIN));
    SharedHttpClient::new(Limited {
        inner: aws_smithy_http_client::Builder::new()
            .tls_provider(Tls::Rustls(CryptoMode::AwsLc))
            .build_https(),
        bucket: Arc::new(RateLimiter::direct(quota)),
    })
}

#[derive(Debug)]
struct Limited {
    inner: SharedHttpClient,
    bucket: Arc<DefaultDirectRateLimiter>,
}

impl HttpClient for Limited {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(LimitedConnector {
            inner: self.inner.http_connector(settings, components),
            bucket: self.bucket.clone(),
        })
    }
}

#[derive(Debug)]
struct LimitedConnector {
    inner: SharedHttpConnector,
    bucket: Arc<DefaultDirectRateLimiter>,
}

impl HttpConnector for LimitedConnector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let inner = self.inner.clone();
        let bucket = self.bucket.clone();
        HttpConnectorFuture::new(async move {
            bucket.until_ready().await;
            inner.call(request).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_api::cloud::v1alpha1::ProviderType;
    use cairn_api::common::LocalObjectReference;
    use k8s_openapi::ByteString;

    fn spec() -> ProviderConfigSpec {
        ProviderConfigSpec {
            type_: ProviderType::Aws,
            region: "eu-west-1".into(),
            endpoint: None,
            credentials_secret_ref: LocalObjectReference {
                name: "aws-credentials".into(),
            },
            rate_limit: None,
        }
    }

    fn secret(pairs: &[(&str, &str)]) -> Secret {
        Secret {
            data: Some(
                pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Secret::default()
        }
    }

    #[test]
    fn unusable_credentials_are_named_precisely() {
        let missing = Provider::new(&spec(), None).err();
        assert_eq!(
            missing.map(|e| e.0),
            Some(
                "Secret aws-credentials (spec.credentialsSecretRef) does not exist in this namespace"
                    .into()
            )
        );
        let no_secret_key = Provider::new(&spec(), Some(&secret(&[(ACCESS_KEY_ID, "AK")]))).err();
        assert_eq!(
            no_secret_key.map(|e| e.0),
            Some("Secret aws-credentials has no key AWS_SECRET_ACCESS_KEY".into())
        );
        let blank = secret(&[(ACCESS_KEY_ID, " "), (SECRET_ACCESS_KEY, "s")]);
        assert!(Provider::new(&spec(), Some(&blank)).is_err());
        let good = secret(&[(ACCESS_KEY_ID, "AK"), (SECRET_ACCESS_KEY, "s")]);
        assert!(Provider::new(&spec(), Some(&good)).is_ok());
    }

    /// A provider that takes the request and never answers fails the call
    /// (each attempt at the answer timeout), rather than holding it.
    #[tokio::test]
    async fn a_provider_that_never_answers_fails_the_call() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let endpoint = format!("http://{}", silent.local_addr().expect("bound"));
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((connection, _)) = silent.accept().await {
                open.push(connection); // read nothing, answer nothing
            }
        });
        let mut spec = spec();
        spec.endpoint = Some(endpoint);
        let good = secret(&[(ACCESS_KEY_ID, "AK"), (SECRET_ACCESS_KEY, "s")]);
        let mut provider = Provider::new(&spec, Some(&good)).expect("usable");
        assert_eq!(provider.timeouts.read_timeout(), Some(ANSWER_TIMEOUT));
        assert_eq!(provider.timeouts.connect_timeout(), Some(CONNECT_TIMEOUT));
        provider.timeouts = TimeoutConfig::builder()
            .read_timeout(Duration::from_millis(200))
            .build();
        let call = provider.s3("eu-west-1").head_bucket().bucket("b").send();
        let answer = tokio::time::timeout(Duration::from_secs(10), call).await;
        held.abort();
        let error = answer
            .expect("the call ended within 10 s")
            .expect_err("no answer is an error");
        let described = format!("{error:?}").to_lowercase();
        assert!(described.contains("timeout"), "{described}");
    }
}
