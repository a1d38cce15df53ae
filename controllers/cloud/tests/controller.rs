//! The cloud controller as a process, with its chart's RBAC, against the
//! local cluster and its moto server: ObjectBuckets created, corrected,
//! refused, adopted, orphaned and deleted as their policies say; S3 read back
//! with the AWS SDK.

use std::collections::BTreeMap;
use std::time::Duration;

use cairn_api::cloud::v1alpha1::{
    DnsRecord, EXTERNAL_NAME_ANNOTATION, ObjectBucket, ProviderConfig,
};
use cairn_cloud_controller::driver::FINALIZER;
use cairn_cloud_controller::external::OWNER_TAG;
use cairn_cloud_controller::policy::ADOPT_ANNOTATION;
use cairn_cloud_controller::provider_config::{CREDENTIALS_FINALIZER, IN_USE_FINALIZER};
use cairn_testing::faults::FaultProxy;
use cairn_testing::{Error, audit, cluster, s3, wait};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
    ValidationDirective,
};
use kube::{Api, ResourceExt};
use serde_json::json;

mod support;

use support::{
    CHART, Result, TIMEOUT, bucket, controller, exists, hosted_zone, provider, provider_at, record,
    record_values, route53, until_condition,
};

#[tokio::test]
async fn object_buckets_follow_their_policies() -> Result {
    let namespace = cluster().namespace("cloud").await?;
    let _controller = controller(&namespace).await?;
    provider(&namespace).await?;
    let buckets = namespace.api::<ObjectBucket>();
    let s3 = s3::client(cluster().s3_endpoint());

    // Created as specified, recorded, held by the finalizer (policy Delete).
    buckets
        .create(
            &PostParams::default(),
            &bucket(
                "data",
                json!({
                    "versioning": true,
                    "lifecycle": { "expireAfterDays": 7 },
                    "writeConnectionSecretToRef": { "name": "data-bucket" },
                }),
            )?,
        )
        .await?;
    let ready = until_condition(&buckets, "data", "Ready", "True", Some("Available")).await?;
    let name = ready
        .annotations()
        .get(EXTERNAL_NAME_ANNOTATION)
        .cloned()
        .ok_or("no external name")?;
    assert!(ready.finalizers().iter().any(|f| f == FINALIZER));
    // Its becoming available is announced, with the chart's RBAC; its
    // creation under way is no news.
    let events = namespace.api::<Event>();
    let announced = wait::until("the Available Event", TIMEOUT, || async {
        let list = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let about_data: Vec<(String, String)> = list
            .items
            .iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("data"))
            .map(|e| {
                (
                    e.type_.clone().unwrap_or_default(),
                    e.reason.clone().unwrap_or_default(),
                )
            })
            .collect();
        Ok(about_data
            .iter()
            .any(|(_, reason)| reason == "Available")
            .then_some(about_data))
    })
    .await?;
    assert_eq!(
        announced,
        [("Normal".to_owned(), "Available".to_owned())],
        "one Event, Normal"
    );
    let tags = s3.get_bucket_tagging().bucket(&name).send().await?.tag_set;
    assert!(
        tags.iter()
            .any(|t| t.key == OWNER_TAG && Some(t.value.as_str()) == ready.uid().as_deref()),
        "{tags:?}"
    );

    // How to reach it, for applications (and Backups), owned by the object.
    let connection = namespace.api::<Secret>().get("data-bucket").await?;
    let data = connection.data.clone().unwrap_or_default();
    let text = |key: &str| {
        data.get(key)
            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
            .unwrap_or_default()
    };
    assert_eq!(text("bucket"), name);
    assert_eq!(text("endpoint"), cluster().s3_endpoint());
    assert_eq!(text("region"), "us-east-1");
    assert_eq!(text("AWS_ACCESS_KEY_ID"), "testing");
    assert!(
        connection
            .owner_references()
            .iter()
            .any(|o| Some(&o.uid) == ready.uid().as_ref())
    );

    // Drift made by hand is corrected within the object's poll interval.
    s3.delete_bucket_lifecycle().bucket(&name).send().await?;
    wait::until("the lifecycle rule restored", TIMEOUT, || async {
        let rules = s3
            .get_bucket_lifecycle_configuration()
            .bucket(&name)
            .send()
            .await
            .ok()
            .and_then(|out| out.rules);
        Ok(rules.filter(|r| !r.is_empty()).map(|_| ()))
    })
    .await?;

    // Policy Delete: the bucket goes with its object.
    buckets.delete("data", &DeleteParams::default()).await?;
    wait::for_deletion(&buckets, "data", TIMEOUT).await?;
    assert!(!exists(&name).await?, "{name} was deleted");
    wait::for_deletion(&namespace.api::<Secret>(), "data-bucket", TIMEOUT).await?;

    // Policy Orphan: the bucket stays, and no finalizer was needed.
    buckets
        .create(
            &PostParams::default(),
            &bucket("kept", json!({ "deletionPolicy": "Orphan" }))?,
        )
        .await?;
    let kept = until_condition(&buckets, "kept", "Ready", "True", None).await?;
    assert!(kept.finalizers().is_empty());
    let kept_name = kept
        .annotations()
        .get(EXTERNAL_NAME_ANNOTATION)
        .cloned()
        .ok_or("no external name")?;
    buckets.delete("kept", &DeleteParams::default()).await?;
    wait::for_deletion(&buckets, "kept", TIMEOUT).await?;
    assert!(exists(&kept_name).await?, "{kept_name} was orphaned");

    // A bucket made by hand: refused until adoption is asked, then managed.
    let manual = format!("manual-{}", rand::random::<u32>());
    s3.create_bucket().bucket(&manual).send().await?;
    buckets
        .create(
            &PostParams::default(),
            &bucket("theirs", json!({ "bucketName": manual }))?,
        )
        .await?;
    let refused = until_condition(&buckets, "theirs", "Ready", "False", Some("NotOwned")).await?;
    let message = refused
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(message.contains(ADOPT_ANNOTATION), "{message}");
    buckets
        .patch(
            "theirs",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { ADOPT_ANNOTATION: "true" } } })),
        )
        .await?;
    until_condition(&buckets, "theirs", "Ready", "True", Some("Available")).await?;
    // Adopted with policy Delete: it is now deleted with its object (while
    // the controller runs, which the finalizer waits for).
    buckets.delete("theirs", &DeleteParams::default()).await?;
    wait::for_deletion(&buckets, "theirs", TIMEOUT).await?;
    assert!(!exists(&manual).await?, "{manual} was deleted");

    // A deletion S3 refuses (the bucket holds objects) is reported, not
    // hung silently; orphaning the bucket is a way out.
    buckets
        .create(&PostParams::default(), &bucket("full", json!({}))?)
        .await?;
    let full = until_condition(&buckets, "full", "Ready", "True", None).await?;
    let full_name = full
        .annotations()
        .get(EXTERNAL_NAME_ANNOTATION)
        .cloned()
        .ok_or("no external name")?;
    s3.put_object()
        .bucket(&full_name)
        .key("kept")
        .body(aws_sdk_s3::primitives::ByteStream::from_static(b"data"))
        .send()
        .await?;
    buckets.delete("full", &DeleteParams::default()).await?;
    until_condition(
        &buckets,
        "full",
        "Synced",
        "False",
        Some("DependencyNotReady"),
    )
    .await?;
    buckets
        .patch(
            "full",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "deletionPolicy": "Orphan" } })),
        )
        .await?;
    wait::for_deletion(&buckets, "full", TIMEOUT).await?;
    assert!(exists(&full_name).await?, "{full_name} was orphaned");

    // A connection Secret that is not the object's (here the credentials)
    // is never written, and so never owned and collected with it.
    buckets
        .create(
            &PostParams::default(),
            &bucket(
                "clash",
                json!({ "writeConnectionSecretToRef": { "name": "moto-credentials" } }),
            )?,
        )
        .await?;
    until_condition(
        &buckets,
        "clash",
        "Synced",
        "False",
        Some("ConnectionSecretConflict"),
    )
    .await?;
    let credentials = namespace.api::<Secret>().get("moto-credentials").await?;
    assert!(credentials.owner_references().is_empty());
    assert!(
        credentials
            .data
            .as_ref()
            .is_some_and(|d| !d.contains_key("bucket")),
        "the credentials were overwritten"
    );
    buckets.delete("clash", &DeleteParams::default()).await?;
    wait::for_deletion(&buckets, "clash", TIMEOUT).await?;

    // A ProviderConfig that does not exist: said, not hidden.
    buckets
        .create(
            &PostParams::default(),
            &bucket(
                "lost",
                json!({ "providerConfigRef": { "name": "nowhere" } }),
            )?,
        )
        .await?;
    until_condition(
        &buckets,
        "lost",
        "Synced",
        "False",
        Some("ProviderConfigUnusable"),
    )
    .await?;
    support::tear_down(&namespace).await
}

/// A ProviderConfig says whether its credentials work (an STS identity call
/// to moto) and who uses it; its deletion waits until no object does, so the
/// objects can still delete what they made.
#[tokio::test]
async fn provider_configs_check_credentials_and_outlive_their_users() -> Result {
    let namespace = cluster().namespace("cloud-pc").await?;
    let _controller = controller(&namespace).await?;
    provider(&namespace).await?;
    let configs = namespace.api::<ProviderConfig>();
    let buckets = namespace.api::<ObjectBucket>();

    let checked = until_config(&configs, "moto", |c| {
        condition(c, "Ready", "True", "CredentialsValid")
            && condition(c, "InUse", "False", "Unused")
    })
    .await?;
    assert!(checked.finalizers().iter().any(|f| f == IN_USE_FINALIZER));
    // Its credentials are held too: deleting the namespace must not take
    // them before the objects have deleted what they made.
    let secrets = namespace.api::<Secret>();
    let credentials = secrets.get("moto-credentials").await?;
    assert!(
        credentials
            .finalizers()
            .iter()
            .any(|f| f == CREDENTIALS_FINALIZER)
    );

    // Credentials that cannot be read: said, with the Secret's name.
    let broken: ProviderConfig = serde_json::from_value(json!({
        "apiVersion": "cloud.cairn.dev/v1alpha1", "kind": "ProviderConfig",
        "metadata": { "name": "broken" },
        "spec": {
            "type": "aws", "region": "us-east-1", "endpoint": cluster().s3_endpoint(),
            "credentialsSecretRef": { "name": "missing" },
        },
    }))?;
    configs.create(&PostParams::default(), &broken).await?;
    let refused = until_config(&configs, "broken", |c| {
        condition(c, "Ready", "False", "ProviderConfigUnusable")
    })
    .await?;
    assert!(message(&refused, "Ready").contains("missing"));

    // In use: named, and its deletion held until the user is gone.
    buckets
        .create(&PostParams::default(), &bucket("user", json!({}))?)
        .await?;
    let ready = until_condition(&buckets, "user", "Ready", "True", Some("Available")).await?;
    let name = ready
        .annotations()
        .get(EXTERNAL_NAME_ANNOTATION)
        .cloned()
        .ok_or("no external name")?;
    until_config(&configs, "moto", |c| condition(c, "InUse", "True", "InUse")).await?;
    configs.delete("moto", &DeleteParams::default()).await?;
    let held = until_config(&configs, "moto", |c| {
        c.metadata.deletion_timestamp.is_some() && condition(c, "InUse", "True", "InUse")
    })
    .await?;
    assert!(message(&held, "InUse").contains("ObjectBucket/user"));

    // The user still deletes its bucket through it; then it goes.
    buckets.delete("user", &DeleteParams::default()).await?;
    wait::for_deletion(&buckets, "user", TIMEOUT).await?;
    assert!(!exists(&name).await?, "{name} was left behind");
    wait::for_deletion(&configs, "moto", TIMEOUT).await?;
    let released = secrets.get("moto-credentials").await?;
    assert!(
        released.finalizers().is_empty(),
        "the credentials are still held"
    );
    support::tear_down(&namespace).await
}

async fn until_config(
    api: &Api<ProviderConfig>,
    name: &str,
    test: impl Fn(&ProviderConfig) -> bool,
) -> std::result::Result<ProviderConfig, Error> {
    wait::for_object(api, name, "its status", TIMEOUT, test).await
}

fn condition(config: &ProviderConfig, type_: &str, status: &str, reason: &str) -> bool {
    config.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == type_ && c.status == status && c.reason == reason)
    })
}

fn message(config: &ProviderConfig, type_: &str) -> String {
    config
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

/// Converged, the controller writes nothing to the API server, and calls the
/// provider only to observe, at each bucket's poll interval (10 s here).
#[tokio::test]
async fn at_steady_state_it_writes_nothing_and_only_observes() -> Result {
    const BUCKETS: usize = 3;
    const WINDOW: Duration = Duration::from_secs(30);
    let namespace = cluster().namespace("cloud-idle").await?;
    let controller = controller(&namespace).await?;
    provider(&namespace).await?;
    let buckets = namespace.api::<ObjectBucket>();
    for i in 0..BUCKETS {
        let spec = json!({
            "versioning": true,
            "lifecycle": { "expireAfterDays": 7 },
            "writeConnectionSecretToRef": { "name": format!("idle-{i}-bucket") },
        });
        buckets
            .create(&PostParams::default(), &bucket(&format!("idle-{i}"), spec)?)
            .await?;
    }
    for i in 0..BUCKETS {
        until_condition(
            &buckets,
            &format!("idle-{i}"),
            "Ready",
            "True",
            Some("Available"),
        )
        .await?;
    }
    until_config(&namespace.api::<ProviderConfig>(), "moto", |c| {
        condition(c, "Ready", "True", "CredentialsValid")
    })
    .await?;

    let before = provider_calls(&controller.metrics().await?);
    let user = format!(
        "system:serviceaccount:{0}:{0}-cloud-{CHART}",
        namespace.name
    );
    let writes = audit::Tail::from_now(&cluster().audit_log())?
        .unwanted_within(WINDOW, |w| {
            w.user == user
                && w.namespace.as_deref() == Some(&namespace.name)
                && w.resource != "leases"
        })
        .await?;
    assert!(writes.is_empty(), "writes at steady state: {writes:?}");
    let after = provider_calls(&controller.metrics().await?);
    let calls: BTreeMap<&String, f64> = after
        .iter()
        .map(|(series, n)| (series, n - before.get(series).copied().unwrap_or(0.0)))
        .filter(|(_, n)| *n > 0.0)
        .collect();
    eprintln!(
        "provider calls in {}s idle, {BUCKETS} buckets: {calls:?}",
        WINDOW.as_secs()
    );
    for series in calls.keys() {
        assert!(
            ["operation=\"Head", "operation=\"Get", "operation=\"List"]
                .iter()
                .any(|read| series.contains(read)),
            "a call that is not an observation at steady state: {series}"
        );
    }
    // Each bucket is observed every 9 to 11 s: 2 to 4 times in the window.
    let heads: f64 = calls
        .iter()
        .filter(|(series, _)| series.contains("operation=\"HeadBucket\""))
        .map(|(_, n)| n)
        .sum();
    let per_bucket = heads / BUCKETS as f64;
    assert!(
        (2.0..=4.0).contains(&per_bucket),
        "{heads} HeadBucket calls for {BUCKETS} buckets polled every 10 s in {}s",
        WINDOW.as_secs()
    );
    support::tear_down(&namespace).await
}

/// `cairn_provider_calls_total` by its labels.
fn provider_calls(metrics: &str) -> BTreeMap<String, f64> {
    metrics
        .lines()
        .filter_map(|line| line.strip_prefix("cairn_provider_calls_total{"))
        .filter_map(|rest| {
            let (labels, value) = rest.split_once("} ")?;
            Some((labels.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

/// Sets record `name`/`type_` by hand (UPSERT), as someone outside Cairn.
async fn set_by_hand(
    route53: &aws_sdk_route53::Client,
    zone_id: &str,
    name: &str,
    values: &[&str],
) -> Result {
    use aws_sdk_route53::types::{
        Change, ChangeAction, ChangeBatch, ResourceRecord, ResourceRecordSet, RrType,
    };
    let records = values
        .iter()
        .map(|v| ResourceRecord::builder().value(*v).build())
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let set = ResourceRecordSet::builder()
        .name(name)
        .r#type(RrType::A)
        .ttl(60)
        .set_resource_records(Some(records))
        .build()?;
    let change = Change::builder()
        .action(ChangeAction::Upsert)
        .resource_record_set(set)
        .build()?;
    route53
        .change_resource_record_sets()
        .hosted_zone_id(zone_id)
        .change_batch(ChangeBatch::builder().changes(change).build()?)
        .send()
        .await?;
    Ok(())
}

async fn until_record(
    api: &Api<DnsRecord>,
    name: &str,
    type_: &str,
    status: &str,
    reason: &str,
) -> std::result::Result<DnsRecord, Error> {
    wait::for_object(
        api,
        name,
        &format!("{type_}={status} {reason}"),
        TIMEOUT,
        |r| {
            r.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == type_ && c.status == status && c.reason == reason)
            })
        },
    )
    .await
}

/// DnsRecords as Route53 record sets in moto: created with their owner
/// record, drift corrected, spec changes applied, another's record refused,
/// a missing zone terminal, deleted and created again under the same name,
/// deleted (Delete) or kept (Orphan).
#[tokio::test]
async fn dns_records_follow_their_policies() -> Result {
    let namespace = cluster().namespace("cloud-dns").await?;
    let _controller = controller(&namespace).await?;
    provider(&namespace).await?;
    let route53 = route53();
    let (zone, zone_id) = hosted_zone(&route53, &namespace).await?;
    let records = namespace.api::<DnsRecord>();
    let web = format!("web.{zone}");

    // Created with its owner record, in one batch.
    records
        .create(
            &PostParams::default(),
            &record(
                "web",
                json!({ "zone": zone, "name": web, "values": ["10.0.0.2", "10.0.0.1"], "deletionPolicy": "Delete" }),
            )?,
        )
        .await?;
    let ready = until_record(&records, "web", "Ready", "True", "Available").await?;
    assert_eq!(
        ready
            .annotations()
            .get(EXTERNAL_NAME_ANNOTATION)
            .map(String::as_str),
        Some(format!("{web}/A").as_str())
    );
    assert_eq!(
        record_values(&route53, &zone_id, &web, "A").await?,
        ["10.0.0.1", "10.0.0.2"]
    );
    let owner = record_values(&route53, &zone_id, &format!("_cairn-owner-a.{web}"), "TXT").await?;
    assert_eq!(
        owner,
        [format!(
            "\"{OWNER_TAG}={}\"",
            ready.uid().unwrap_or_default()
        )]
    );

    // Drift made by hand is corrected within the poll interval.
    set_by_hand(&route53, &zone_id, &web, &["10.9.9.9"]).await?;
    let corrected = wait::until("the drift corrected", TIMEOUT, || async {
        match record_values(&route53, &zone_id, &web, "A").await {
            Ok(values) if values == ["10.0.0.1", "10.0.0.2"] => Ok(Some(())),
            Ok(values) => Err(format!("{values:?}")),
            Err(e) => Err(e.to_string()),
        }
    });
    corrected.await?;

    // A spec change is applied.
    records
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "values": ["10.0.0.3"] } })),
        )
        .await?;
    wait::until("the new values", TIMEOUT, || async {
        match record_values(&route53, &zone_id, &web, "A").await {
            Ok(values) if values == ["10.0.0.3"] => Ok(Some(())),
            Ok(values) => Err(format!("{values:?}")),
            Err(e) => Err(e.to_string()),
        }
    })
    .await?;

    // A record made by hand is not taken over.
    let manual = format!("manual.{zone}");
    set_by_hand(&route53, &zone_id, &manual, &["10.1.1.1"]).await?;
    records
        .create(
            &PostParams::default(),
            &record(
                "clash",
                json!({ "zone": zone, "name": manual, "values": ["10.2.2.2"] }),
            )?,
        )
        .await?;
    until_record(&records, "clash", "Ready", "False", "NotOwned").await?;
    assert_eq!(
        record_values(&route53, &zone_id, &manual, "A").await?,
        ["10.1.1.1"]
    );

    // A zone that does not exist: terminal, said.
    records
        .create(
            &PostParams::default(),
            &record(
                "lost",
                json!({ "zone": "nowhere.cairn.test", "name": "a.nowhere.cairn.test", "values": ["10.3.3.3"] }),
            )?,
        )
        .await?;
    until_record(&records, "lost", "Synced", "False", "InvalidRequest").await?;

    // Deleted and created again under the same name and values: created
    // again (record sets sorting after it in the zone must not matter).
    let again = format!("again.{zone}");
    let again_spec =
        json!({ "zone": zone, "name": again, "values": ["10.5.5.5"], "deletionPolicy": "Delete" });
    for round in ["first", "second"] {
        records
            .create(
                &PostParams::default(),
                &record("again", again_spec.clone())?,
            )
            .await?;
        until_record(&records, "again", "Ready", "True", "Available").await?;
        assert_eq!(
            record_values(&route53, &zone_id, &again, "A").await?,
            ["10.5.5.5"],
            "{round} create"
        );
        records.delete("again", &DeleteParams::default()).await?;
        wait::for_deletion(&records, "again", TIMEOUT).await?;
    }
    assert!(
        record_values(&route53, &zone_id, &again, "A")
            .await?
            .is_empty()
    );

    // Orphan keeps the record; Delete removes it and its owner record.
    let kept = format!("kept.{zone}");
    records
        .create(
            &PostParams::default(),
            &record(
                "kept",
                json!({ "zone": zone, "name": kept, "values": ["10.4.4.4"], "deletionPolicy": "Orphan" }),
            )?,
        )
        .await?;
    until_record(&records, "kept", "Ready", "True", "Available").await?;
    records.delete("kept", &DeleteParams::default()).await?;
    wait::for_deletion(&records, "kept", TIMEOUT).await?;
    assert_eq!(
        record_values(&route53, &zone_id, &kept, "A").await?,
        ["10.4.4.4"]
    );

    records.delete("web", &DeleteParams::default()).await?;
    wait::for_deletion(&records, "web", TIMEOUT).await?;
    assert!(
        record_values(&route53, &zone_id, &web, "A")
            .await?
            .is_empty()
    );
    assert!(
        record_values(&route53, &zone_id, &format!("_cairn-owner-a.{web}"), "TXT")
            .await?
            .is_empty()
    );
    support::tear_down(&namespace).await
}

/// ObserveOnly: a bucket made by hand is read and reported, never written
/// (every S3 call the proxy sees is a read); one that does not exist is
/// reported and never created; deleting the objects leaves the bucket.
#[tokio::test]
async fn observe_only_reads_and_never_writes() -> Result {
    let namespace = cluster().namespace("cloud-observe").await?;
    let proxy = FaultProxy::start(cluster().s3_endpoint()).await?;
    let _controller = controller(&namespace).await?;
    provider_at(&namespace, &proxy.url(), None).await?;
    let s3 = s3::client(cluster().s3_endpoint());
    let watched = format!("{}-watched", namespace.name);
    let absent = format!("{}-absent", namespace.name);
    s3.create_bucket().bucket(&watched).send().await?;
    let buckets = namespace.api::<ObjectBucket>();
    for (object, name) in [("watched", &watched), ("absent", &absent)] {
        let spec = json!({
            "bucketName": name, "managementPolicy": "ObserveOnly", "deletionPolicy": "Orphan",
            "versioning": true, "tags": { "team": "data" },
        });
        buckets
            .create(&PostParams::default(), &bucket(object, spec)?)
            .await?;
    }
    let observed = until_condition(&buckets, "watched", "Ready", "True", Some("Observed")).await?;
    assert!(
        observed.finalizers().is_empty(),
        "an observed bucket needs no finalizer"
    );
    until_condition(&buckets, "absent", "Ready", "False", Some("NotFound")).await?;
    for object in ["watched", "absent"] {
        buckets.delete(object, &DeleteParams::default()).await?;
        wait::for_deletion(&buckets, object, TIMEOUT).await?;
    }
    assert!(exists(&watched).await?, "the observed bucket was deleted");
    assert!(
        !exists(&absent).await?,
        "a bucket was created for an observe-only object"
    );
    let writes: Vec<String> = proxy
        .seen()
        .into_iter()
        .filter(|s| s.service == "s3" && !matches!(s.method.as_str(), "GET" | "HEAD"))
        .map(|s| format!("{} {}", s.method, s.target))
        .collect();
    assert!(writes.is_empty(), "observe-only wrote: {writes:?}");
    support::tear_down(&namespace).await
}

/// A namespace uses only its own ProviderConfigs, so only its own
/// credentials: one of another namespace is not found, and the API has no
/// field that names another namespace's Secret.
#[tokio::test]
async fn credentials_of_another_namespace_cannot_be_used() -> Result {
    let namespace = cluster().namespace("cloud-own").await?;
    let other = cluster().namespace("cloud-other").await?;
    let _controller = controller(&namespace).await?;
    provider(&other).await?;
    let buckets = namespace.api::<ObjectBucket>();
    buckets
        .create(&PostParams::default(), &bucket("borrowed", json!({}))?)
        .await?;
    let refused = until_condition(
        &buckets,
        "borrowed",
        "Synced",
        "False",
        Some("ProviderConfigUnusable"),
    )
    .await?;
    assert!(refused.finalizers().is_empty(), "nothing was made");

    let resource = ApiResource::erase::<ProviderConfig>(&());
    let configs =
        Api::<DynamicObject>::namespaced_with(namespace.client.clone(), &namespace.name, &resource);
    let reaching_out = json!({
        "apiVersion": "cloud.cairn.dev/v1alpha1", "kind": "ProviderConfig",
        "metadata": { "name": "reaching-out" },
        "spec": {
            "type": "aws", "region": "us-east-1",
            "credentialsSecretRef": { "name": "moto-credentials", "namespace": other.name },
        },
    });
    let refused = configs
        .patch(
            "reaching-out",
            &PatchParams::apply("cairn-test").validation(ValidationDirective::Strict),
            &Patch::Apply(&reaching_out),
        )
        .await;
    match refused {
        Err(kube::Error::Api(status)) => assert!(
            status.message.contains("namespace"),
            "refused for another reason: {}",
            status.message
        ),
        other => panic!("a Secret of another namespace was accepted: {other:?}"),
    }
    support::tear_down(&namespace).await
}
