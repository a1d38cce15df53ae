//! S3 buckets through the real AWS wire protocol (the local cluster's moto
//! server): each step of the managed-resource policy on a real bucket, read
//! back with the AWS SDK as a user would.

use std::collections::BTreeMap;

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{
    BucketLifecycleConfiguration, BucketVersioningStatus, ExpirationStatus, LifecycleExpiration,
    LifecycleRule, LifecycleRuleFilter, VersioningConfiguration,
};
use cairn_api::cloud::v1alpha1::{
    DeletionPolicy, Encryption, Lifecycle, ManagementPolicy, ObjectBucketSpec,
};
use cairn_api::common::LocalObjectReference;
use cairn_cloud_controller::bucket::Buckets;
use cairn_cloud_controller::external::{External, OWNER_TAG};
use cairn_cloud_controller::policy::{self, Intent, Observed, Refusal, Step};
use cairn_testing::{Error, cluster, s3};
use k8s_openapi::jiff::Timestamp;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

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

fn buckets() -> Buckets {
    Buckets {
        s3: s3::client(cluster().s3_endpoint()),
        region: "us-east-1".into(),
    }
}

fn intent(uid: &str) -> Intent {
    Intent {
        deleting: false,
        paused: false,
        deletion: DeletionPolicy::Delete,
        management: ManagementPolicy::Manage,
        adopt: false,
        create_pending_since: None,
        uid: uid.to_owned(),
        now: Timestamp::now(),
    }
}

/// A bucket name no other test run uses.
fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", rand::random::<u32>())
}

async fn step(buckets: &Buckets, intent: &Intent, name: &str) -> Result<Step> {
    let observation = buckets.observe(&spec(), name, &intent.uid).await?;
    Ok(policy::decide(intent, &observation.observed))
}

#[tokio::test]
async fn a_bucket_is_created_as_specified_corrected_when_it_drifts_and_deleted() -> Result {
    let buckets = buckets();
    let name = unique("life");
    let ours = intent("uid-life");
    assert_eq!(step(&buckets, &ours, &name).await?, Step::Create);
    buckets.create(&spec(), &name, &ours.uid).await?;
    assert_eq!(step(&buckets, &ours, &name).await?, Step::UpToDate);

    // As S3 itself reports it.
    let s3 = &buckets.s3;
    // Versioned: a key written twice keeps both versions. (moto 5.2's
    // GetBucketVersioning answer is not one the SDK parses.)
    for body in [&b"one"[..], &b"two"[..]] {
        s3.put_object()
            .bucket(&name)
            .key("twice")
            .body(ByteStream::from_static(body))
            .send()
            .await?;
    }
    let versions = s3.list_object_versions().bucket(&name).send().await?;
    assert_eq!(versions.versions().len(), 2, "versioning is on");
    let tags: BTreeMap<_, _> = s3
        .get_bucket_tagging()
        .bucket(&name)
        .send()
        .await?
        .tag_set
        .into_iter()
        .map(|t| (t.key, t.value))
        .collect();
    assert_eq!(tags.get(OWNER_TAG).map(String::as_str), Some("uid-life"));
    assert_eq!(tags.get("team").map(String::as_str), Some("payments"));
    let block = s3
        .get_public_access_block()
        .bucket(&name)
        .send()
        .await?
        .public_access_block_configuration
        .ok_or("no public access block")?;
    assert_eq!(block.block_public_acls, Some(true));
    assert_eq!(block.restrict_public_buckets, Some(true));
    let rules = s3
        .get_bucket_lifecycle_configuration()
        .bucket(&name)
        .send()
        .await?
        .rules
        .unwrap_or_default();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].expiration.as_ref().and_then(|e| e.days), Some(30));
    // Versioned: replaced versions expire too, or their data stays for ever.
    assert_eq!(
        rules[0]
            .noncurrent_version_expiration
            .as_ref()
            .and_then(|e| e.noncurrent_days),
        Some(30)
    );

    // Drift made by hand is seen and corrected.
    s3.put_bucket_versioning()
        .bucket(&name)
        .versioning_configuration(
            VersioningConfiguration::builder()
                .status(BucketVersioningStatus::Suspended)
                .build(),
        )
        .send()
        .await?;
    // Someone replaces the lifecycle configuration with a rule of theirs.
    let theirs = LifecycleRule::builder()
        .id("theirs")
        .status(ExpirationStatus::Enabled)
        .filter(LifecycleRuleFilter::builder().prefix("tmp/").build())
        .expiration(LifecycleExpiration::builder().days(1).build())
        .build()?;
    s3.put_bucket_lifecycle_configuration()
        .bucket(&name)
        .lifecycle_configuration(
            BucketLifecycleConfiguration::builder()
                .rules(theirs)
                .build()?,
        )
        .send()
        .await?;
    let drifted = buckets.observe(&spec(), &name, &ours.uid).await?;
    assert_eq!(drifted.drift, ["versioning", "lifecycle"]);
    assert_eq!(policy::decide(&ours, &drifted.observed), Step::Update);
    buckets.update(&spec(), &name, &ours.uid).await?;
    assert_eq!(step(&buckets, &ours, &name).await?, Step::UpToDate);
    // Ours is back, theirs is kept.
    let mut ids: Vec<String> = s3
        .get_bucket_lifecycle_configuration()
        .bucket(&name)
        .send()
        .await?
        .rules
        .unwrap_or_default()
        .into_iter()
        .filter_map(|r| r.id)
        .collect();
    ids.sort();
    assert_eq!(ids, ["cairn-expiry", "theirs"]);

    // A bucket that holds objects cannot go: a dependency, retried, not terminal.
    let refused = buckets
        .delete(&name)
        .await
        .err()
        .ok_or("deleted a full bucket")?;
    assert_eq!(refused.reason(), "DependencyNotReady", "{refused}");
    assert!(!refused.is_terminal());
    empty(&buckets, &name).await?;

    let deleting = Intent {
        deleting: true,
        ..ours
    };
    assert_eq!(step(&buckets, &deleting, &name).await?, Step::Delete);
    buckets.delete(&name).await?;
    assert_eq!(step(&buckets, &deleting, &name).await?, Step::Release);
    // Deleting what is already gone succeeds.
    buckets.delete(&name).await?;
    Ok(())
}

#[tokio::test]
async fn an_interrupted_create_is_claimed_and_a_foreign_bucket_is_never_touched() -> Result {
    let buckets = buckets();
    let s3 = &buckets.s3;
    // A create that reached S3 before the controller died: the bucket
    // exists, untagged, made after the create-pending marker.
    let name = unique("crash");
    let marker = Timestamp::now();
    s3.create_bucket().bucket(&name).send().await?;
    let ours = Intent {
        create_pending_since: Some(marker),
        ..intent("uid-crash")
    };
    assert_eq!(step(&buckets, &ours, &name).await?, Step::Claim);
    buckets.update(&spec(), &name, &ours.uid).await?;
    assert_eq!(step(&buckets, &ours, &name).await?, Step::UpToDate);
    // Creating it again (a retried create) is no error and no second bucket.
    buckets.create(&spec(), &name, &ours.uid).await?;

    // The same bucket seen by another object: refused, untouched.
    let other = intent("uid-other");
    assert_eq!(
        step(&buckets, &other, &name).await?,
        Step::Refuse(Refusal::OwnedByAnother("uid-crash".into()))
    );
    // Even a racing create of the same name cannot take it over.
    let taken = buckets
        .update(&spec(), &name, "uid-other")
        .await
        .err()
        .ok_or("re-tagged another object's bucket")?;
    assert!(taken.is_terminal(), "{taken}");
    let deleting_other = Intent {
        deleting: true,
        ..other
    };
    assert_eq!(step(&buckets, &deleting_other, &name).await?, Step::Release);

    // A bucket someone made by hand: not ours without adoption.
    let manual = unique("manual");
    s3.create_bucket().bucket(&manual).send().await?;
    let observed = buckets.observe(&spec(), &manual, "uid-late").await?;
    assert!(
        matches!(
            observed.observed,
            Observed::Present {
                owner: None,
                created: Some(_),
                ..
            }
        ),
        "{observed:?}"
    );
    let late = Intent {
        create_pending_since: Some(Timestamp::now() + std::time::Duration::from_secs(3600)),
        ..intent("uid-late")
    };
    assert_eq!(
        policy::decide(&late, &observed.observed),
        Step::Refuse(Refusal::NotOwned),
        "made an hour before the marker: not our create"
    );
    let adopting = Intent {
        adopt: true,
        ..intent("uid-late")
    };
    assert_eq!(policy::decide(&adopting, &observed.observed), Step::Claim);

    for bucket in [&name, &manual] {
        buckets.delete(bucket).await?;
    }
    Ok(())
}

#[tokio::test]
async fn a_bucket_in_another_region_gets_its_location() -> Result {
    let buckets = Buckets {
        region: "eu-west-1".into(),
        ..self::buckets()
    };
    let name = unique("region");
    buckets.create(&spec(), &name, "uid-region").await?;
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

async fn empty(buckets: &Buckets, name: &str) -> std::result::Result<(), Error> {
    let versions = buckets
        .s3
        .list_object_versions()
        .bucket(name)
        .send()
        .await
        .map_err(|e| Error::Setup(format!("{e:?}")))?;
    for version in versions.versions() {
        buckets
            .s3
            .delete_object()
            .bucket(name)
            .key(version.key().unwrap_or_default())
            .set_version_id(version.version_id().map(str::to_owned))
            .send()
            .await
            .map_err(|e| Error::Setup(format!("{e:?}")))?;
    }
    Ok(())
}
