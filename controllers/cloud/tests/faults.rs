//! The cloud controller when the provider misbehaves, with a fault-injecting
//! proxy between it and moto (`cairn_testing::faults`): a create whose
//! response is lost, throttling, and an outage during the deletion of a
//! namespace full of buckets, a name taken by another account. Calls are
//! counted where the provider would see them, at the proxy.

use std::time::{Duration, Instant};

use cairn_api::cloud::v1alpha1::{EXTERNAL_NAME_ANNOTATION, ObjectBucket};
use cairn_cloud_controller::external::OWNER_TAG;
use cairn_testing::faults::{Fault, FaultProxy, Rule, Seen};
use cairn_testing::{cluster, s3, wait};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

mod support;

use support::{
    Result, TIMEOUT, bucket, controller, controller_watching, exists, provider_at, until_condition,
};

/// CreateBucket: a path-style PUT of the bucket itself (no sub-resource).
fn is_create_bucket(seen: &Seen) -> bool {
    let (path, query) = seen
        .target
        .split_once('?')
        .unwrap_or((seen.target.as_str(), ""));
    seen.method == "PUT"
        && path.trim_matches('/').split('/').count() == 1
        && (query.is_empty() || query.contains("x-id=CreateBucket"))
}

/// The response to CreateBucket is lost after moto made the bucket: the
/// controller finds it as its own (create-pending marker, then its owner
/// tag), makes no second bucket, and is Ready.
#[tokio::test]
async fn a_lost_create_response_leaves_one_bucket_and_no_stuck_object() -> Result {
    let namespace = cluster().namespace("cloud-lost").await?;
    let proxy = FaultProxy::start(cluster().s3_endpoint()).await?;
    let _controller = controller(&namespace).await?;
    provider_at(&namespace, &proxy.url(), None).await?;
    proxy.inject(Rule::first(Fault::DropResponse, 1, is_create_bucket));
    let buckets = namespace.api::<ObjectBucket>();
    buckets
        .create(&PostParams::default(), &bucket("lost", json!({}))?)
        .await?;
    let ready = until_condition(&buckets, "lost", "Ready", "True", Some("Available")).await?;
    let name = ready
        .annotations()
        .get(EXTERNAL_NAME_ANNOTATION)
        .cloned()
        .ok_or("no external name")?;
    let creates: Vec<Seen> = proxy.seen().into_iter().filter(is_create_bucket).collect();
    assert_eq!(
        creates.first().and_then(|s| s.fault),
        Some(Fault::DropResponse),
        "the first create was not the one dropped: {creates:?}"
    );
    let uid = ready.uid().unwrap_or_default();
    let owned = owned_buckets(&uid).await?;
    eprintln!(
        "lost create response: {} CreateBucket calls seen, buckets owned by the object: {owned:?}",
        creates.len()
    );
    assert_eq!(owned, [name], "exactly one bucket, tagged as the object's");
    support::tear_down(&namespace).await
}

/// Buckets in moto tagged as owned by `uid`.
async fn owned_buckets(uid: &str) -> Result<Vec<String>> {
    let s3 = s3::client(cluster().s3_endpoint());
    let mut owned = Vec::new();
    for bucket in s3.list_buckets().send().await?.buckets() {
        let Some(name) = bucket.name() else { continue };
        let Ok(tags) = s3.get_bucket_tagging().bucket(name).send().await else {
            continue;
        };
        if tags
            .tag_set()
            .iter()
            .any(|t| t.key() == OWNER_TAG && t.value() == uid)
        {
            owned.push(name.to_owned());
        }
    }
    Ok(owned)
}

/// While the provider throttles every call, the controller never calls it
/// faster than its ProviderConfig allows (5 a second, burst 5: at most 10 in
/// any second), reports `Throttled`, and converges once throttling stops.
#[tokio::test]
async fn throttling_is_met_within_the_rate_and_converges_after() -> Result {
    const BUCKETS: usize = 6;
    const THROTTLED_FOR: Duration = Duration::from_secs(15);
    let namespace = cluster().namespace("cloud-throttle").await?;
    let proxy = FaultProxy::start(cluster().s3_endpoint()).await?;
    let _controller = controller(&namespace).await?;
    proxy.inject(Rule::always(Fault::Throttle));
    let started = Instant::now();
    provider_at(
        &namespace,
        &proxy.url(),
        Some(json!({ "qps": 5, "burst": 5 })),
    )
    .await?;
    let buckets = namespace.api::<ObjectBucket>();
    for i in 0..BUCKETS {
        buckets
            .create(
                &PostParams::default(),
                &bucket(&format!("t-{i}"), json!({}))?,
            )
            .await?;
    }
    // S3 answers a throttled HEAD with a bare 503 (no body, so no code):
    // that one reads as ProviderUnavailable; either way it backs off.
    let refused = until_condition(&buckets, "t-0", "Synced", "False", None).await?;
    let reason = refused
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Synced"))
        .map(|c| c.reason.clone())
        .unwrap_or_default();
    assert!(
        ["Throttled", "ProviderUnavailable"].contains(&reason.as_str()),
        "Synced=False {reason}"
    );
    tokio::time::sleep(THROTTLED_FOR.saturating_sub(started.elapsed())).await;
    proxy.heal();
    let healed = Instant::now();
    for i in 0..BUCKETS {
        until_condition(
            &buckets,
            &format!("t-{i}"),
            "Ready",
            "True",
            Some("Available"),
        )
        .await?;
    }
    let converged = healed.elapsed();
    let throttled = proxy
        .seen()
        .iter()
        .filter(|s| s.fault == Some(Fault::Throttle))
        .count();
    let peak = proxy.peak_rate(started, Duration::from_secs(1));
    eprintln!(
        "throttling: {throttled} calls answered SlowDown in {}s, peak {peak} calls in any second \
         (allowed 10), all {BUCKETS} Ready {:.1}s after it stopped",
        THROTTLED_FOR.as_secs(),
        converged.as_secs_f64()
    );
    assert!(throttled > 0, "nothing was throttled");
    assert!(peak <= 10, "{peak} calls within one second");
    support::tear_down(&namespace).await
}

/// A namespace full of buckets (policy Delete) is deleted while the provider
/// is unreachable, one bucket already deleted out of band: the finalizers
/// hold until the provider is back, then every bucket goes and the
/// namespace with them.
#[tokio::test]
async fn a_namespace_of_buckets_is_deleted_through_an_outage() -> Result {
    const BUCKETS: usize = 8;
    const OUTAGE: Duration = Duration::from_secs(15);
    let home = cluster().namespace("cloud-home").await?;
    let doomed = cluster().namespace("cloud-doomed").await?;
    let proxy = FaultProxy::start(cluster().s3_endpoint()).await?;
    let _controller = controller_watching(&home, &doomed).await?;
    provider_at(&doomed, &proxy.url(), None).await?;
    let buckets = doomed.api::<ObjectBucket>();
    for i in 0..BUCKETS {
        buckets
            .create(
                &PostParams::default(),
                &bucket(&format!("d-{i}"), json!({}))?,
            )
            .await?;
    }
    let mut names = Vec::new();
    for i in 0..BUCKETS {
        let ready = until_condition(
            &buckets,
            &format!("d-{i}"),
            "Ready",
            "True",
            Some("Available"),
        )
        .await?;
        names.push(
            ready
                .annotations()
                .get(EXTERNAL_NAME_ANNOTATION)
                .cloned()
                .ok_or("no external name")?,
        );
    }
    s3::client(cluster().s3_endpoint())
        .delete_bucket()
        .bucket(&names[0])
        .send()
        .await?;

    proxy.inject(Rule::always(Fault::Unreachable));
    let namespaces = Api::<Namespace>::all(home.client.clone());
    let deleting = Instant::now();
    namespaces
        .delete(&doomed.name, &DeleteParams::default())
        .await?;
    // The outage lasts until the controller has tried, and failed, to reach
    // the provider for every bucket.
    let (names_, proxy_) = (&names, &proxy);
    let tried_all = wait::until(
        "a refused call for every bucket",
        OUTAGE,
        move || async move {
            let refused: Vec<String> = proxy_
                .seen()
                .into_iter()
                .filter(|s| s.fault == Some(Fault::Unreachable))
                .map(|s| s.target)
                .collect();
            let untried: Vec<&String> = names_
                .iter()
                .filter(|name| {
                    !refused
                        .iter()
                        .any(|t| t.trim_start_matches('/').starts_with(name.as_str()))
                })
                .collect();
            if untried.is_empty() {
                Ok(Some(()))
            } else {
                Err(format!("not tried yet: {untried:?}"))
            }
        },
    );
    tried_all.await?;
    // Held by the finalizers through the outage, every one of them (the
    // bucket deleted out of band too: the controller cannot know it is gone).
    let held = buckets.list(&Default::default()).await?.items;
    assert_eq!(
        held.len(),
        BUCKETS,
        "buckets went while the provider was unreachable"
    );
    assert!(held.iter().all(|b| b.metadata.deletion_timestamp.is_some()));
    let held = held.len();
    proxy.heal();
    let healed = Instant::now();
    wait::for_deletion(&namespaces, &doomed.name, TIMEOUT * 2).await?;
    eprintln!(
        "namespace of {BUCKETS} buckets deleted {:.1}s after the request ({}s outage, {held} \
         objects held through it), {:.1}s after the provider was back",
        deleting.elapsed().as_secs_f64(),
        OUTAGE.as_secs(),
        healed.elapsed().as_secs_f64()
    );
    for name in &names {
        assert!(!exists(name).await?, "{name} was left behind");
    }
    Ok(())
}

/// The bucket name is taken by another account (`BucketAlreadyExists`,
/// injected): terminal, so the controller does not call again while the
/// spec stays as it is (watched for 20 s at the proxy), and a spec change is
/// tried at once — no restart needed.
#[tokio::test]
async fn a_name_taken_elsewhere_is_terminal_until_the_spec_changes() -> Result {
    const WATCHED: Duration = Duration::from_secs(20);
    let namespace = cluster().namespace("cloud-taken").await?;
    let proxy = FaultProxy::start(cluster().s3_endpoint()).await?;
    let _controller = controller(&namespace).await?;
    provider_at(&namespace, &proxy.url(), None).await?;
    proxy.inject(Rule::every(Fault::Conflict, is_create_bucket));
    let buckets = namespace.api::<ObjectBucket>();
    buckets
        .create(&PostParams::default(), &bucket("taken", json!({}))?)
        .await?;
    until_condition(&buckets, "taken", "Synced", "False", Some("InvalidRequest")).await?;
    let creates = |proxy: &FaultProxy| proxy.seen().iter().filter(|s| is_create_bucket(s)).count();
    // A reconcile queued before the first answer (the object's creation and
    // the leader's start both ask for one) may still run once.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let refused = creates(&proxy);
    // Two poll intervals of the bucket (10 s each), watched at the proxy.
    let again = proxy.unwanted_within(WATCHED, is_create_bucket).await;
    eprintln!(
        "name taken: {refused} CreateBucket call(s) until 5 s after the terminal condition, \
         then {again:?} in the {}s after that",
        WATCHED.as_secs()
    );
    assert!(
        again.is_none(),
        "the controller kept calling with a spec that cannot succeed: {again:?}"
    );

    // The name is freed (the other account deleted it); a spec change is
    // enough for the controller to try again and succeed.
    proxy.heal();
    buckets
        .patch(
            "taken",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "tags": { "retry": "1" } } })),
        )
        .await?;
    until_condition(&buckets, "taken", "Ready", "True", Some("Available")).await?;
    support::tear_down(&namespace).await
}
