//! Leader election against the local API server: one leader at a time, a
//! released lease moves at once, an abandoned one after it expires, a holder
//! with a skewed clock keeps it while it renews.

use std::time::{Duration, Instant};

use cairn_runtime::leader::{self, Candidacy, Timing};
use cairn_runtime::metrics::Metrics;
use cairn_testing::{TestNamespace, cluster};
use k8s_openapi::api::coordination::v1::Lease;

type Result = std::result::Result<(), Box<dyn std::error::Error>>;

async fn candidate(
    ns: &TestNamespace,
    identity: &str,
) -> std::result::Result<Candidacy, Box<dyn std::error::Error>> {
    let metrics = Metrics::new("test", "0.0.0", "none")?;
    Ok(leader::run_for(
        ns.client.clone(),
        &ns.name,
        "cairn-test",
        identity,
        Timing::default(),
        metrics,
    ))
}

async fn holder(ns: &TestNamespace) -> Option<String> {
    let lease = ns.api::<Lease>().get_opt("cairn-test").await.ok()??;
    lease.spec?.holder_identity
}

#[tokio::test]
async fn one_leader_then_release_then_expiry() -> Result {
    let ns = cluster().namespace("leader").await?;
    let mut first = candidate(&ns, "replica-a").await?;
    tokio::time::timeout(Duration::from_secs(20), first.acquired()).await??;
    let mut second = candidate(&ns, "replica-b").await?;
    // The standby must not take the lease while it is held and renewed.
    assert!(
        tokio::time::timeout(Duration::from_secs(3), second.acquired())
            .await
            .is_err()
    );
    assert!(first.is_leader() && !second.is_leader());
    assert_eq!(holder(&ns).await.as_deref(), Some("replica-a"));

    // A released lease (SIGTERM) moves to the standby within seconds.
    let released_at = Instant::now();
    first.release(Duration::from_secs(5)).await?;
    tokio::time::timeout(Duration::from_secs(5), second.acquired()).await??;
    let takeover = released_at.elapsed();
    assert_eq!(holder(&ns).await.as_deref(), Some("replica-b"));
    eprintln!("takeover after release: {takeover:?}");
    // Released, not expired: the standby takes it at its next look (one
    // retry interval, one round of requests), well before the lease could
    // have run out. The figure itself is a benchmark's.
    let timing = Timing::default();
    assert!(
        takeover < timing.retry_interval + timing.request_timeout
            && takeover < timing.lease_duration - timing.renew_interval,
        "a released lease was taken only after {takeover:?}: as if it had expired"
    );

    // An abandoned lease (a killed leader) moves once it expires.
    let mut third = candidate(&ns, "replica-c").await?;
    let abandoned_at = Instant::now();
    second.abandon(); // neither renewed nor released from now on
    tokio::time::timeout(Duration::from_secs(30), third.acquired()).await??;
    let takeover = abandoned_at.elapsed();
    eprintln!("takeover after abandonment: {takeover:?}");
    // Safety: never before the lease could have expired (its last renewal
    // was at most one renew interval before the abandonment). Liveness: by
    // the expiry plus the standby's next look.
    assert!(
        takeover >= timing.lease_duration - timing.renew_interval,
        "an abandoned lease was taken {takeover:?} after its holder stopped: before it expired"
    );
    assert!(
        takeover <= timing.lease_duration + timing.retry_interval + timing.request_timeout,
        "an expired lease was taken only after {takeover:?}"
    );
    assert_eq!(holder(&ns).await.as_deref(), Some("replica-c"));
    Ok(())
}

/// A holder whose clock is an hour behind keeps renewing: a standby must not
/// take the lease (its `renewTime` looks an hour old), and takes it once the
/// renewals stop and it has seen the Lease unchanged for its duration.
#[tokio::test]
async fn a_holder_with_a_skewed_clock_keeps_the_lease_while_it_renews() -> Result {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::{SignedDuration, Timestamp};
    use kube::api::{ObjectMeta, PostParams};

    let ns = cluster().namespace("skew").await?;
    let leases = ns.api::<Lease>();
    let skewed_now = || MicroTime(Timestamp::now() - SignedDuration::from_hours(1));
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("cairn-test".into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("skewed".into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(skewed_now()),
            renew_time: Some(skewed_now()),
            ..LeaseSpec::default()
        }),
    };
    leases.create(&PostParams::default(), &lease).await?;
    let renewing = {
        let leases = leases.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                let Ok(mut lease) = leases.get("cairn-test").await else {
                    continue;
                };
                if let Some(spec) = lease.spec.as_mut() {
                    spec.renew_time = Some(skewed_now());
                }
                let _ = leases
                    .replace("cairn-test", &PostParams::default(), &lease)
                    .await;
            }
        })
    };

    let mut standby = candidate(&ns, "standby").await?;
    assert!(
        tokio::time::timeout(Duration::from_secs(20), standby.acquired())
            .await
            .is_err(),
        "the standby took a lease its holder kept renewing"
    );
    assert_eq!(holder(&ns).await.as_deref(), Some("skewed"));

    renewing.abort();
    let stopped = Instant::now();
    tokio::time::timeout(Duration::from_secs(30), standby.acquired()).await??;
    let takeover = stopped.elapsed();
    eprintln!("takeover after the skewed holder stopped renewing: {takeover:?}");
    assert!(
        takeover >= Duration::from_secs(10),
        "taken before the lease could expire: {takeover:?}"
    );
    assert_eq!(holder(&ns).await.as_deref(), Some("standby"));
    Ok(())
}
