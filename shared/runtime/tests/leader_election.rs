//! Leader election against the local API server: one leader at a time, a
//! released lease moves at once, an abandoned one after it expires.

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
    assert!(
        takeover < Duration::from_secs(3),
        "takeover took {takeover:?}"
    );

    // An abandoned lease (a killed leader) moves once it expires.
    let mut third = candidate(&ns, "replica-c").await?;
    let abandoned_at = Instant::now();
    second.abandon(); // neither renewed nor released from now on
    tokio::time::timeout(Duration::from_secs(30), third.acquired()).await??;
    let takeover = abandoned_at.elapsed();
    eprintln!("takeover after abandonment: {takeover:?}");
    assert!(
        takeover < Duration::from_secs(20),
        "takeover took {takeover:?}"
    );
    assert_eq!(holder(&ns).await.as_deref(), Some("replica-c"));
    Ok(())
}
