//! ObjectBucket → an S3 bucket. Reading the bucket's settings is kept apart
//! from judging them: `Settings` is what S3 holds, `drift` (pure) says what
//! differs from the spec, `Buckets` makes the calls.

use std::collections::BTreeMap;

use aws_sdk_s3::Client;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::types::{
    BucketLifecycleConfiguration, BucketLocationConstraint, BucketVersioningStatus,
    CreateBucketConfiguration, ExpirationStatus, LifecycleExpiration, LifecycleRule,
    LifecycleRuleFilter, NoncurrentVersionExpiration, PublicAccessBlockConfiguration,
    ServerSideEncryption, ServerSideEncryptionByDefault, ServerSideEncryptionConfiguration,
    ServerSideEncryptionRule, Tag, Tagging, VersioningConfiguration,
};
use cairn_api::cloud::v1alpha1::{CloudStatus, Encryption, ObjectBucket, ObjectBucketSpec};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::driver::Managed;
use crate::external::{
    CloudError, External, OWNER_TAG, Observation, Response, fail, http_status as status,
};
use crate::policy::Observed;
use crate::provider::Provider;

/// The id of the lifecycle rule Cairn keeps (`spec.lifecycle`).
const EXPIRY_RULE: &str = "cairn-expiry";

/// The bucket an ObjectBucket manages: `spec.bucketName`, or one derived from
/// its namespace, name and UID (S3 rules: 3–63 of `a-z0-9-`), so the same
/// object always names the same bucket.
pub fn bucket_name(spec: &ObjectBucketSpec, namespace: &str, name: &str, uid: &str) -> String {
    if let Some(name) = &spec.bucket_name {
        return name.clone();
    }
    let suffix: String = uid
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect::<String>()
        .to_ascii_lowercase();
    let mut base: String = format!("{namespace}-{name}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(63 - 1 - suffix.len())
        .collect();
    while base.ends_with('-') {
        base.pop();
    }
    format!("{base}-{suffix}")
}

/// What S3 holds for a bucket, as far as the spec is concerned.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Settings {
    pub tags: BTreeMap<String, String>,
    pub versioning: Option<String>,
    pub encryption: Option<String>,
    /// The four public-access-block switches, if a block is set.
    pub public_access_block: Option<[bool; 4]>,
    /// Cairn's lifecycle rule, if there is one.
    pub expiry: Option<Expiry>,
    /// The lifecycle rules of others, kept as they are.
    pub other_rules: Vec<LifecycleRule>,
}

/// Cairn's lifecycle rule (`cairn-expiry`) as S3 holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expiry {
    pub enabled: bool,
    /// Days after which current objects expire.
    pub days: Option<i32>,
    /// Days after which replaced versions expire (versioned buckets).
    pub noncurrent_days: Option<i32>,
}

/// The rule the spec asks for: objects expire after `expireAfterDays`, and
/// in a versioned bucket so do replaced versions (expiring a current object
/// only adds a delete marker there; its data would be kept for ever).
fn wanted_expiry(spec: &ObjectBucketSpec) -> Option<Expiry> {
    spec.lifecycle.as_ref().map(|l| Expiry {
        enabled: true,
        days: Some(l.expire_after_days),
        noncurrent_days: spec.versioning.then_some(l.expire_after_days),
    })
}

/// Tags AWS sets itself (`aws:…`, e.g. CloudFormation's): neither drift nor
/// removable.
fn is_system_tag(key: &str) -> bool {
    key.starts_with("aws:")
}

/// The tags a bucket must carry: the spec's and the owner tag.
fn wanted_tags(spec: &ObjectBucketSpec, owner: &str) -> BTreeMap<String, String> {
    let mut tags = spec.tags.clone();
    tags.insert(OWNER_TAG.to_owned(), owner.to_owned());
    tags
}

fn encryption_name(encryption: Encryption) -> &'static str {
    match encryption {
        Encryption::Aes256 => "AES256",
        Encryption::AwsKms => "aws:kms",
    }
}

/// What differs from the spec (empty: up to date).
pub fn drift(spec: &ObjectBucketSpec, owner: &str, actual: &Settings) -> Vec<String> {
    let mut drift = Vec::new();
    let own_tags: BTreeMap<String, String> = actual
        .tags
        .iter()
        .filter(|(key, _)| !is_system_tag(key))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if own_tags != wanted_tags(spec, owner) {
        drift.push("tags".to_owned());
    }
    let versioned = actual.versioning.as_deref() == Some("Enabled");
    if spec.versioning != versioned {
        drift.push("versioning".to_owned());
    }
    if let Some(wanted) = spec.encryption
        && actual.encryption.as_deref() != Some(encryption_name(wanted))
    {
        drift.push("encryption".to_owned());
    }
    let blocked = actual.public_access_block == Some([true; 4]);
    let unblocked = actual.public_access_block.is_none_or(|b| b == [false; 4]);
    if (spec.public_access_block && !blocked) || (!spec.public_access_block && !unblocked) {
        drift.push("public access block".to_owned());
    }
    if actual.expiry != wanted_expiry(spec) {
        drift.push("lifecycle".to_owned());
    }
    drift
}

/// S3 buckets, through one client (one ProviderConfig and region).
pub struct Buckets {
    pub s3: Client,
    pub region: String,
}

impl Buckets {
    /// The settings of bucket `name`, whose tags were just read.
    async fn settings(
        &self,
        spec: &ObjectBucketSpec,
        name: &str,
        tags: BTreeMap<String, String>,
    ) -> Result<Settings, CloudError> {
        let versioning = match self.s3.get_bucket_versioning().bucket(name).send().await {
            Ok(out) => out.status.map(|s| s.as_str().to_owned()),
            Err(e) => {
                versioning_of_compatible_answer(&e).ok_or_else(|| fail("GetBucketVersioning", e))?
            }
        };
        let encryption = match spec.encryption {
            None => None,
            Some(_) => absent_if(
                self.s3.get_bucket_encryption().bucket(name).send().await,
                "GetBucketEncryption",
                &["ServerSideEncryptionConfigurationNotFoundError"],
            )?
            .and_then(|out| {
                let rule = out
                    .server_side_encryption_configuration?
                    .rules
                    .into_iter()
                    .next()?;
                Some(
                    rule.apply_server_side_encryption_by_default?
                        .sse_algorithm
                        .as_str()
                        .to_owned(),
                )
            }),
        };
        let block = absent_if(
            self.s3.get_public_access_block().bucket(name).send().await,
            "GetPublicAccessBlock",
            &["NoSuchPublicAccessBlockConfiguration"],
        )?
        .and_then(|out| out.public_access_block_configuration)
        .map(|c| {
            [
                c.block_public_acls.unwrap_or(false),
                c.ignore_public_acls.unwrap_or(false),
                c.block_public_policy.unwrap_or(false),
                c.restrict_public_buckets.unwrap_or(false),
            ]
        });
        let rules = absent_if(
            self.s3
                .get_bucket_lifecycle_configuration()
                .bucket(name)
                .send()
                .await,
            "GetBucketLifecycleConfiguration",
            &["NoSuchLifecycleConfiguration"],
        )?
        .map(|out| out.rules.unwrap_or_default())
        .unwrap_or_default();
        let (ours, other_rules): (Vec<LifecycleRule>, Vec<LifecycleRule>) = rules
            .into_iter()
            .partition(|r| r.id.as_deref() == Some(EXPIRY_RULE));
        Ok(Settings {
            tags,
            versioning,
            encryption,
            public_access_block: block,
            expiry: ours.first().map(|r| Expiry {
                enabled: r.status == ExpirationStatus::Enabled,
                days: r.expiration.as_ref().and_then(|e| e.days),
                noncurrent_days: r
                    .noncurrent_version_expiration
                    .as_ref()
                    .and_then(|e| e.noncurrent_days),
            }),
            other_rules,
        })
    }

    async fn tags(&self, name: &str) -> Result<BTreeMap<String, String>, CloudError> {
        Ok(absent_if(
            self.s3.get_bucket_tagging().bucket(name).send().await,
            "GetBucketTagging",
            &["NoSuchTagSet"],
        )?
        .map(|out| out.tag_set.into_iter().map(|t| (t.key, t.value)).collect())
        .unwrap_or_default())
    }

    /// When S3 says the bucket was created (one listing).
    async fn created(&self, name: &str) -> Result<Option<Timestamp>, CloudError> {
        let listed = self
            .s3
            .list_buckets()
            .prefix(name)
            .send()
            .await
            .map_err(|e| fail("ListBuckets", e))?;
        Ok(listed
            .buckets()
            .iter()
            .find(|b| b.name() == Some(name))
            .and_then(|b| b.creation_date())
            .and_then(|d| Timestamp::from_second(d.secs()).ok()))
    }
}

impl External for Buckets {
    type Spec = ObjectBucketSpec;

    async fn observe(
        &self,
        spec: &ObjectBucketSpec,
        name: &str,
        owner: &str,
    ) -> Result<Observation, CloudError> {
        match self.s3.head_bucket().bucket(name).send().await {
            Ok(_) => {}
            Err(e) if status(&e) == Some(404) => return Ok(Observation::absent()),
            // HeadBucket answers without a body: a missing permission and
            // a bucket of another account look the same. Retried; a name
            // taken elsewhere is refused for certain by CreateBucket.
            Err(e) if status(&e) == Some(403) => {
                return Err(CloudError::Denied {
                    operation: "HeadBucket",
                    code: "Forbidden".into(),
                    message: format!(
                        "{name}: these credentials may not read it, or it belongs to another account (bucket names are global)"
                    ),
                });
            }
            Err(e) => return Err(fail("HeadBucket", e)),
        }
        let tags = self.tags(name).await?;
        let tagged = tags.get(OWNER_TAG).cloned();
        let mut at_provider = BTreeMap::from([
            ("arn".to_owned(), format!("arn:aws:s3:::{name}")),
            ("bucket".to_owned(), name.to_owned()),
        ]);
        let (created, drift) = if tagged.as_deref() == Some(owner) {
            let settings = self.settings(spec, name, tags).await?;
            if let Some(versioning) = &settings.versioning {
                at_provider.insert("versioning".to_owned(), versioning.clone());
            }
            (None, drift(spec, owner, &settings))
        } else {
            // Not tagged as ours: only when it was made matters.
            (self.created(name).await?, Vec::new())
        };
        Ok(Observation {
            observed: Observed::Present {
                owner: tagged,
                created,
                up_to_date: drift.is_empty(),
            },
            at_provider,
            drift,
        })
    }

    async fn create(
        &self,
        spec: &ObjectBucketSpec,
        name: &str,
        owner: &str,
    ) -> Result<(), CloudError> {
        let mut request = self.s3.create_bucket().bucket(name);
        // us-east-1 is the one region S3 wants no location constraint for.
        if self.region != "us-east-1" {
            request = request.create_bucket_configuration(
                CreateBucketConfiguration::builder()
                    .location_constraint(BucketLocationConstraint::from(self.region.as_str()))
                    .build(),
            );
        }
        match request.send().await {
            Ok(_) => {}
            Err(e) if e.code() == Some("BucketAlreadyOwnedByYou") => {}
            Err(e) => return Err(fail("CreateBucket", e)),
        }
        self.update(spec, name, owner).await
    }

    async fn update(
        &self,
        spec: &ObjectBucketSpec,
        name: &str,
        owner: &str,
    ) -> Result<(), CloudError> {
        // Never take a bucket tagged for another object (two objects naming
        // one bucket, created at the same time: the second create succeeds
        // on a bucket this account owns).
        let current = self.tags(name).await?;
        if let Some(other) = current.get(OWNER_TAG).filter(|o| *o != owner) {
            return Err(CloudError::Invalid {
                operation: "PutBucketTagging",
                code: "OwnedByAnother".into(),
                message: format!(
                    "{name} belongs to another object (owner tag {other}): choose another name"
                ),
            });
        }
        // The owner tag first: from then on the bucket is known as ours.
        let mut wanted = wanted_tags(spec, owner);
        wanted.extend(
            current
                .iter()
                .filter(|(key, _)| is_system_tag(key))
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        let tags = wanted
            .into_iter()
            .map(|(key, value)| Tag::builder().key(key).value(value).build())
            .collect::<Result<Vec<_>, _>>()
            .map_err(built)?;
        let tagging = Tagging::builder()
            .set_tag_set(Some(tags))
            .build()
            .map_err(built)?;
        self.s3
            .put_bucket_tagging()
            .bucket(name)
            .tagging(tagging)
            .send()
            .await
            .map_err(|e| fail("PutBucketTagging", e))?;
        let actual = self.settings(spec, name, BTreeMap::new()).await?;
        let versioned = actual.versioning.as_deref() == Some("Enabled");
        if spec.versioning != versioned && (spec.versioning || actual.versioning.is_some()) {
            // A bucket once versioned can only be suspended.
            let status = if spec.versioning {
                BucketVersioningStatus::Enabled
            } else {
                BucketVersioningStatus::Suspended
            };
            self.s3
                .put_bucket_versioning()
                .bucket(name)
                .versioning_configuration(VersioningConfiguration::builder().status(status).build())
                .send()
                .await
                .map_err(|e| fail("PutBucketVersioning", e))?;
        }
        if let Some(wanted) = spec.encryption
            && actual.encryption.as_deref() != Some(encryption_name(wanted))
        {
            let rule = ServerSideEncryptionRule::builder()
                .apply_server_side_encryption_by_default(
                    ServerSideEncryptionByDefault::builder()
                        .sse_algorithm(ServerSideEncryption::from(encryption_name(wanted)))
                        .build()
                        .map_err(built)?,
                )
                .build();
            let configuration = ServerSideEncryptionConfiguration::builder()
                .rules(rule)
                .build()
                .map_err(built)?;
            self.s3
                .put_bucket_encryption()
                .bucket(name)
                .server_side_encryption_configuration(configuration)
                .send()
                .await
                .map_err(|e| fail("PutBucketEncryption", e))?;
        }
        if spec.public_access_block && actual.public_access_block != Some([true; 4]) {
            let block = PublicAccessBlockConfiguration::builder()
                .block_public_acls(true)
                .ignore_public_acls(true)
                .block_public_policy(true)
                .restrict_public_buckets(true)
                .build();
            self.s3
                .put_public_access_block()
                .bucket(name)
                .public_access_block_configuration(block)
                .send()
                .await
                .map_err(|e| fail("PutPublicAccessBlock", e))?;
        } else if !spec.public_access_block && actual.public_access_block.is_some() {
            self.s3
                .delete_public_access_block()
                .bucket(name)
                .send()
                .await
                .map_err(|e| fail("DeletePublicAccessBlock", e))?;
        }
        let expiry = wanted_expiry(spec);
        if actual.expiry != expiry {
            self.put_lifecycle(name, expiry, actual.other_rules).await?;
        }
        Ok(())
    }

    async fn delete(&self, name: &str) -> Result<(), CloudError> {
        match self.s3.delete_bucket().bucket(name).send().await {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("NoSuchBucket") || status(&e) == Some(404) => Ok(()),
            Err(e) => Err(fail("DeleteBucket", e)),
        }
    }
}

impl Buckets {
    /// Cairn's expiry rule as the spec asks (or none), beside the rules of
    /// others, which are kept.
    async fn put_lifecycle(
        &self,
        name: &str,
        expiry: Option<Expiry>,
        mut rules: Vec<LifecycleRule>,
    ) -> Result<(), CloudError> {
        if let Some(days) = expiry.and_then(|e| e.days) {
            let mut rule = LifecycleRule::builder()
                .id(EXPIRY_RULE)
                .status(ExpirationStatus::Enabled)
                .filter(LifecycleRuleFilter::builder().prefix("").build())
                .expiration(LifecycleExpiration::builder().days(days).build());
            if let Some(noncurrent) = expiry.and_then(|e| e.noncurrent_days) {
                rule = rule.noncurrent_version_expiration(
                    NoncurrentVersionExpiration::builder()
                        .noncurrent_days(noncurrent)
                        .build(),
                );
            }
            rules.push(rule.build().map_err(built)?);
        }
        if rules.is_empty() {
            return self
                .s3
                .delete_bucket_lifecycle()
                .bucket(name)
                .send()
                .await
                .map(|_| ())
                .map_err(|e| fail("DeleteBucketLifecycle", e));
        }
        let configuration = BucketLifecycleConfiguration::builder()
            .set_rules(Some(rules))
            .build()
            .map_err(built)?;
        self.s3
            .put_bucket_lifecycle_configuration()
            .bucket(name)
            .lifecycle_configuration(configuration)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| fail("PutBucketLifecycleConfiguration", e))
    }
}

impl Managed for ObjectBucket {
    type External = Buckets;

    fn desired(&self) -> &ObjectBucketSpec {
        &self.spec
    }

    fn derived_name(&self) -> String {
        bucket_name(
            &self.spec,
            &self.namespace().unwrap_or_default(),
            &self.name_any(),
            &self.uid().unwrap_or_default(),
        )
    }

    fn cloud_status(&self) -> Option<&CloudStatus> {
        self.status.as_ref()
    }

    fn external(&self, provider: &Provider) -> Buckets {
        let region = self
            .spec
            .region
            .clone()
            .unwrap_or_else(|| provider.region().to_owned());
        Buckets {
            s3: provider.s3(&region),
            region,
        }
    }

    fn connection(
        &self,
        provider: &Provider,
        name: &str,
    ) -> Option<(String, BTreeMap<String, String>)> {
        let secret = self.spec.write_connection_secret_to_ref.as_ref()?;
        let region = self.spec.region.as_deref().unwrap_or(provider.region());
        let mut data = provider.s3_connection(region);
        data.insert("bucket".to_owned(), name.to_owned());
        Some((secret.name.clone(), data))
    }
}

/// Some S3-compatible services (moto 5.2) answer GetBucketVersioning with
/// the root element `GetBucketVersioningResponse` where S3 has
/// `VersioningConfiguration`, which the SDK refuses to parse: the status is
/// read from such an answer's body.
fn versioning_of_compatible_answer<E>(error: &SdkError<E, Response>) -> Option<Option<String>> {
    let response = error.raw_response()?;
    let body = std::str::from_utf8(response.body().bytes()?).ok()?;
    if response.status().as_u16() != 200 || !body.contains("<GetBucketVersioningResponse") {
        return None;
    }
    let status = body
        .split_once("<Status>")
        .and_then(|(_, rest)| rest.split_once("</Status>"))
        .map(|(status, _)| status.to_owned());
    Some(status)
}

/// `None` when S3 answers that the thing asked for is not set.
fn absent_if<T, E: ProvideErrorMetadata + std::error::Error + 'static>(
    result: Result<T, SdkError<E, Response>>,
    operation: &'static str,
    absent: &[&str],
) -> Result<Option<T>, CloudError> {
    match result {
        Ok(out) => Ok(Some(out)),
        Err(e) if e.code().is_some_and(|c| absent.contains(&c)) => Ok(None),
        Err(e) => Err(fail(operation, e)),
    }
}

/// A request this code built without a required field: a bug, reported as
/// such rather than a panic.
fn built(error: aws_sdk_s3::error::BuildError) -> CloudError {
    CloudError::Invalid {
        operation: "build request",
        code: "BuildError".into(),
        message: error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_api::cloud::v1alpha1::{DeletionPolicy, Lifecycle, ManagementPolicy};
    use cairn_api::common::LocalObjectReference;

    fn spec() -> ObjectBucketSpec {
        ObjectBucketSpec {
            provider_config_ref: LocalObjectReference { name: "aws".into() },
            bucket_name: None,
            region: None,
            versioning: true,
            encryption: Some(Encryption::Aes256),
            public_access_block: true,
            lifecycle: Some(Lifecycle {
                expire_after_days: 30,
            }),
            tags: BTreeMap::from([("team".to_owned(), "payments".to_owned())]),
            deletion_policy: DeletionPolicy::Delete,
            management_policy: ManagementPolicy::Manage,
            write_connection_secret_to_ref: None,
        }
    }

    fn as_specified() -> Settings {
        Settings {
            tags: wanted_tags(&spec(), "uid-1"),
            versioning: Some("Enabled".into()),
            encryption: Some("AES256".into()),
            public_access_block: Some([true; 4]),
            expiry: Some(Expiry {
                enabled: true,
                days: Some(30),
                noncurrent_days: Some(30),
            }),
            other_rules: Vec::new(),
        }
    }

    #[test]
    fn a_bucket_as_specified_has_no_drift_and_each_difference_is_named() {
        assert_eq!(
            drift(&spec(), "uid-1", &as_specified()),
            Vec::<String>::new()
        );
        let changed = Settings {
            tags: BTreeMap::new(),
            versioning: Some("Suspended".into()),
            encryption: Some("aws:kms".into()),
            public_access_block: Some([true, true, false, true]),
            expiry: Some(Expiry {
                enabled: true,
                days: Some(30),
                noncurrent_days: None,
            }),
            other_rules: Vec::new(),
        };
        assert_eq!(
            drift(&spec(), "uid-1", &changed),
            [
                "tags",
                "versioning",
                "encryption",
                "public access block",
                "lifecycle"
            ]
        );
        let disabled = Settings {
            expiry: Some(Expiry {
                enabled: false,
                ..as_specified().expiry.unwrap_or(Expiry {
                    enabled: true,
                    days: None,
                    noncurrent_days: None,
                })
            }),
            ..as_specified()
        };
        assert_eq!(drift(&spec(), "uid-1", &disabled), ["lifecycle"]);
    }

    #[test]
    fn what_others_set_is_not_drift() {
        let mut tags = wanted_tags(&spec(), "uid-1");
        tags.insert("aws:cloudformation:stack-name".into(), "s".into());
        let others = Settings {
            tags,
            other_rules: vec![
                LifecycleRule::builder()
                    .id("theirs")
                    .status(ExpirationStatus::Enabled)
                    .build()
                    .unwrap_or_else(|_| unreachable!("status is set")),
            ],
            ..as_specified()
        };
        assert_eq!(drift(&spec(), "uid-1", &others), Vec::<String>::new());
    }

    #[test]
    fn settings_left_open_by_the_spec_are_not_drift() {
        let open = ObjectBucketSpec {
            versioning: false,
            encryption: None,
            public_access_block: false,
            lifecycle: None,
            ..spec()
        };
        let bare = Settings {
            tags: wanted_tags(&open, "uid-1"),
            encryption: Some("AES256".into()), // S3's default encryption
            ..Settings::default()
        };
        assert_eq!(drift(&open, "uid-1", &bare), Vec::<String>::new());
        let suspended = Settings {
            versioning: Some("Suspended".into()),
            ..bare
        };
        assert_eq!(drift(&open, "uid-1", &suspended), Vec::<String>::new());
    }

    #[test]
    fn a_derived_name_is_stable_valid_and_unique_per_object() {
        let name = bucket_name(&spec(), "payments", "ledger.backups", "7f3c9a2e-1111-2222");
        assert_eq!(name, "payments-ledger-backups-7f3c9a2e");
        let long = bucket_name(&spec(), &"n".repeat(63), &"o".repeat(253), "ABCDEF12-3456");
        assert_eq!(long.len(), 63);
        assert!(long.ends_with("-abcdef12"));
        assert!(
            long.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        );
        let named = ObjectBucketSpec {
            bucket_name: Some("chosen".into()),
            ..spec()
        };
        assert_eq!(bucket_name(&named, "a", "b", "c"), "chosen");
    }
}
