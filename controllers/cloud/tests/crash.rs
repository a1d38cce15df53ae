//! The crash test: 25 ObjectBuckets and 25 DnsRecords while the controller
//! is SIGKILLed again and again — at random moments and right after a create
//! reached moto, before the controller could record anything. Afterwards
//! every object has exactly one external resource, tagged as its own; none
//! is left without an owner; and deleting the objects leaves nothing behind.
//! Calls are seen at a proxy in front of moto.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cairn_api::cloud::v1alpha1::{DnsRecord, EXTERNAL_NAME_ANNOTATION, ObjectBucket};
use cairn_cloud_controller::external::OWNER_TAG;
use cairn_testing::faults::{FaultProxy, Seen};
use cairn_testing::{cluster, s3, wait};
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

mod support;

use support::{
    Result, TIMEOUT, bucket, controller_as, hosted_zone, provider_at, record, record_values,
    route53, tear_down, until_condition,
};

const EACH: usize = 25;
const KILLS: usize = 24;

#[tokio::test]
async fn killed_at_any_moment_it_neither_leaks_nor_duplicates() -> Result {
    let namespace = cluster().namespace("cloud-crash").await?;
    let proxy = FaultProxy::start(cluster().s3_endpoint()).await?;
    provider_at(
        &namespace,
        &proxy.url(),
        Some(json!({ "qps": 20, "burst": 20 })),
    )
    .await?;
    let route53 = route53();
    let (zone, zone_id) = hosted_zone(&route53, &namespace).await?;

    let buckets = namespace.api::<ObjectBucket>();
    let records = namespace.api::<DnsRecord>();
    for i in 0..EACH {
        buckets
            .create(
                &PostParams::default(),
                &bucket(&format!("b-{i}"), json!({}))?,
            )
            .await?;
        let spec = json!({
            "zone": zone, "name": format!("r-{i}.{zone}"), "values": [format!("10.0.0.{i}")],
            "deletionPolicy": "Delete",
        });
        records
            .create(&PostParams::default(), &record(&format!("r-{i}"), spec)?)
            .await?;
    }

    // Every other kill right after a create reached moto; the others at a
    // random moment of a life of up to 3 s.
    let started = Instant::now();
    let mut after_create = 0;
    for kill in 0..KILLS {
        let lease = format!("crash-{kill}");
        let process = controller_as(
            &namespace,
            &format!("cloud-{kill}"),
            &[("CAIRN_LEASE_NAME", lease.as_str())],
        )
        .await?;
        let seen_before = proxy.seen().iter().filter(|s| is_create(s)).count();
        if kill % 2 == 0 {
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline
                && proxy.seen().iter().filter(|s| is_create(s)).count() == seen_before
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            after_create += usize::from(Instant::now() < deadline);
        } else {
            let life = rand::random_range(200..3000);
            tokio::time::sleep(Duration::from_millis(life)).await;
        }
        process.kill()?;
    }
    let killing = started.elapsed();

    let _survivor = controller_as(&namespace, "cloud-last", &[]).await?;
    for i in 0..EACH {
        until_condition(
            &buckets,
            &format!("b-{i}"),
            "Ready",
            "True",
            Some("Available"),
        )
        .await?;
        until_record(&records, &format!("r-{i}")).await?;
    }
    let creates = proxy.seen().iter().filter(|s| is_create(s)).count();

    // Exactly one bucket per object, tagged as its own; none unowned.
    let prefix = format!("{}-", namespace.name);
    let owners = bucket_owners(&prefix).await?;
    let mut duplicates = 0;
    for object in buckets.list(&ListParams::default()).await? {
        let uid = object.uid().unwrap_or_default();
        let theirs = owners
            .values()
            .filter(|o| o.as_deref() == Some(&uid))
            .count();
        duplicates += theirs.saturating_sub(1);
        assert_eq!(theirs, 1, "{} has {theirs} buckets", object.name_any());
    }
    let orphans: Vec<&String> = owners
        .iter()
        .filter(|(_, owner)| owner.is_none())
        .map(|(name, _)| name)
        .collect();
    // Every record, with its owner record naming its object.
    for object in records.list(&ListParams::default()).await? {
        let name = &object.spec.name;
        assert_eq!(record_values(&route53, &zone_id, name, "A").await?.len(), 1);
        assert_eq!(
            record_values(&route53, &zone_id, &format!("_cairn-owner-a.{name}"), "TXT").await?,
            [format!(
                "\"{OWNER_TAG}={}\"",
                object.uid().unwrap_or_default()
            )]
        );
    }
    eprintln!(
        "crash test: {KILLS} kills in {:.0}s ({after_create} right after a create reached moto), \
         {creates} creates seen by moto for {} objects, duplicates {duplicates}, orphans {}",
        killing.as_secs_f64(),
        2 * EACH,
        orphans.len()
    );
    assert!(orphans.is_empty(), "buckets without an owner: {orphans:?}");
    assert!(
        after_create >= KILLS / 4,
        "too few kills right after a create"
    );

    // Deleting every object leaves nothing behind.
    tear_down(&namespace).await?;
    assert!(
        bucket_owners(&prefix).await?.is_empty(),
        "buckets left behind"
    );
    let left = route53
        .list_resource_record_sets()
        .hosted_zone_id(&zone_id)
        .send()
        .await?
        .resource_record_sets()
        .iter()
        .filter(|s| !matches!(s.r#type().as_str(), "SOA" | "NS"))
        .count();
    assert_eq!(left, 0, "record sets left behind");
    Ok(())
}

/// A create reached moto: CreateBucket, or a Route53 change batch (a create
/// is one; so are updates and deletes, which this test makes only at the
/// end).
fn is_create(seen: &Seen) -> bool {
    let (path, query) = seen
        .target
        .split_once('?')
        .unwrap_or((seen.target.as_str(), ""));
    let create_bucket = seen.method == "PUT"
        && seen.service == "s3"
        && path.trim_matches('/').split('/').count() == 1
        && (query.is_empty() || query.contains("x-id=CreateBucket"));
    let change_batch =
        seen.method == "POST" && (path.ends_with("/rrset") || path.ends_with("/rrset/"));
    create_bucket || change_batch
}

/// Buckets in moto whose name starts with `prefix`, and their owner tag.
async fn bucket_owners(prefix: &str) -> Result<BTreeMap<String, Option<String>>> {
    let s3 = s3::client(cluster().s3_endpoint());
    let mut owners = BTreeMap::new();
    for bucket in s3.list_buckets().send().await?.buckets() {
        let Some(name) = bucket.name().filter(|n| n.starts_with(prefix)) else {
            continue;
        };
        let owner = match s3.get_bucket_tagging().bucket(name).send().await {
            Ok(tags) => tags
                .tag_set()
                .iter()
                .find(|t| t.key() == OWNER_TAG)
                .map(|t| t.value().to_owned()),
            Err(_) => None,
        };
        owners.insert(name.to_owned(), owner);
    }
    Ok(owners)
}

async fn until_record(api: &Api<DnsRecord>, name: &str) -> Result {
    wait::for_object(api, name, "Ready=True", TIMEOUT, |r| {
        r.annotations().contains_key(EXTERNAL_NAME_ANNOTATION)
            && r.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
    })
    .await?;
    Ok(())
}
