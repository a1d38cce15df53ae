//! Two replicas of the controller, real processes with the chart's RBAC,
//! competing for one Lease: exactly one reconciles; a standby takes over
//! within 3 s of a SIGTERM and within 20 s of a SIGKILL; a replica never
//! writes once another has taken over, not even a leader frozen past its
//! lease that thaws with work queued.

mod support;

use std::time::{Duration, Instant};

use cairn_api::database::v1::DatabaseCluster;
use cairn_runtime::leader::Timing;
use cairn_testing::process::ControllerProcess;
use cairn_testing::wait;
use cairn_testing::{Error, TestNamespace, audit, cluster};
use kube::Api;

const LEADER: &str = "cairn_leader{controller=\"database\"}";

async fn leader_metric(process: &ControllerProcess) -> Result<f64, Error> {
    Ok(process.metric(LEADER).await?.unwrap_or(-1.0))
}

/// A starts first and leads; B stands by, ready with warm caches.
async fn leader_and_standby(
    namespace: &TestNamespace,
    account_a: &str,
    account_b: &str,
) -> Result<(ControllerProcess, ControllerProcess), Error> {
    let a = support::start(namespace, "a", account_a, &[])?;
    support::until_status(&a, "/readyz", 200, Duration::from_secs(30)).await?;
    wait::until("a leads", Duration::from_secs(10), || async {
        Ok((leader_metric(&a).await.map_err(|e| e.to_string())? == 1.0).then_some(()))
    })
    .await?;
    let b = support::start(namespace, "b", account_b, &[])?;
    support::until_status(&b, "/readyz", 200, Duration::from_secs(30)).await?;
    Ok((a, b))
}

/// Waits until `cluster` has a status written for its current generation.
async fn until_reconciled(
    api: &Api<DatabaseCluster>,
    name: &str,
    timeout: Duration,
) -> Result<(), Error> {
    wait::for_object(api, name, &format!("{name} reconciled"), timeout, |c| {
        c.status.as_ref().and_then(|s| s.observed_generation) == c.metadata.generation
    })
    .await
    .map(drop)
}

#[tokio::test]
async fn one_replica_leads_and_a_standby_takes_over() -> Result<(), Error> {
    let namespace = support::namespace("replicas").await?;
    let account_a = support::install_rbac(&namespace, "replica-a").await?;
    let account_b = support::install_rbac(&namespace, "replica-b").await?;
    let (user_a, user_b) = (
        support::user(&namespace, &account_a),
        support::user(&namespace, &account_b),
    );
    let clusters = namespace.api::<DatabaseCluster>();

    let (mut a, mut b) = leader_and_standby(&namespace, &account_a, &account_b).await?;

    support::create(&clusters, &support::database_cluster("one", 1)).await?;
    support::until_condition(&clusters, "one", "Ready", "True", Duration::from_secs(60)).await?;
    assert_eq!(leader_metric(&a).await?, 1.0, "a leads");
    assert_eq!(leader_metric(&b).await?, 0.0, "b stands by");
    assert!(
        !support::writes_by(&user_a, &namespace.name)?.is_empty(),
        "the leader reconciled"
    );
    assert_eq!(
        support::writes_by(&user_b, &namespace.name)?,
        vec![],
        "the standby wrote nothing"
    );

    // SIGTERM: A finishes, releases the lease and exits 0; B takes over.
    let terminated = Instant::now();
    a.terminate()?;
    let status = a.wait(Duration::from_secs(30)).await?;
    assert!(
        status.success(),
        "a graceful shutdown exits 0: {status}\n{}",
        a.log_tail(20)
    );
    support::create(&clusters, &support::database_cluster("two", 1)).await?;
    until_reconciled(&clusters, "two", Duration::from_secs(10)).await?;
    let after_term = terminated.elapsed();
    println!("takeover after SIGTERM: {} ms", after_term.as_millis());
    // Released, not expired: B took over before the lease could have run
    // out (the figure itself is hack/bench.sh's).
    let timing = Timing::default();
    assert!(
        after_term < timing.lease_duration - timing.renew_interval,
        "B took over only {after_term:?} after A's SIGTERM: as if A had not released the lease"
    );
    assert_eq!(leader_metric(&b).await?, 1.0);

    // A comes back as a standby; SIGKILL B: A takes over when the lease expires.
    let a_again = support::start(&namespace, "a-again", &account_a, &[])?;
    support::until_status(&a_again, "/readyz", 200, Duration::from_secs(30)).await?;
    assert_eq!(leader_metric(&a_again).await?, 0.0, "b still leads");
    let killed = Instant::now();
    b.kill()?;
    b.wait(Duration::from_secs(10)).await?;
    support::create(&clusters, &support::database_cluster("three", 1)).await?;
    until_reconciled(&clusters, "three", Duration::from_secs(30)).await?;
    let after_kill = killed.elapsed();
    println!("takeover after SIGKILL: {} ms", after_kill.as_millis());
    // Safety: A never led before B's lease could have expired (B last
    // renewed at most one renew interval before its death); the wait above
    // bounds the liveness.
    assert!(
        after_kill >= timing.lease_duration - timing.renew_interval,
        "A reconciled {after_kill:?} after B's SIGKILL: before B's lease expired"
    );

    // The terms never overlap: every write of A's first term precedes B's
    // first, and B's last precedes A's second term.
    let term_start = |user: &str, after: &str| -> Result<Option<String>, Error> {
        Ok(support::writes_by(user, &namespace.name)?
            .into_iter()
            .map(|w| w.received)
            .filter(|t| t.as_str() > after)
            .min())
    };
    let b_first = term_start(&user_b, "")?.expect("b wrote");
    let a_first_term_last = support::writes_by(&user_a, &namespace.name)?
        .into_iter()
        .map(|w| w.received)
        .filter(|t| *t < b_first)
        .max()
        .expect("a wrote before b");
    let b_last = support::writes_by(&user_b, &namespace.name)?
        .into_iter()
        .map(|w| w.received)
        .max()
        .expect("b wrote");
    let a_second_term_first = term_start(&user_a, &b_first)?.expect("a wrote again");
    assert!(
        a_first_term_last < b_first,
        "{a_first_term_last} < {b_first}"
    );
    assert!(
        b_last < a_second_term_first,
        "b wrote at {b_last} after a took over at {a_second_term_first}"
    );
    Ok(())
}

#[tokio::test]
async fn a_leader_frozen_past_its_lease_writes_nothing_when_it_thaws() -> Result<(), Error> {
    let namespace = support::namespace("frozen").await?;
    let account_a = support::install_rbac(&namespace, "frozen-a").await?;
    let account_b = support::install_rbac(&namespace, "frozen-b").await?;
    let user_a = support::user(&namespace, &account_a);
    let clusters = namespace.api::<DatabaseCluster>();

    let (mut a, b) = leader_and_standby(&namespace, &account_a, &account_b).await?;
    support::create(&clusters, &support::database_cluster("one", 1)).await?;
    support::until_condition(&clusters, "one", "Ready", "True", Duration::from_secs(60)).await?;

    // A stops dead holding the lease, its watches and connections open.
    let frozen = Instant::now();
    a.freeze()?;
    // Work for A to find when it thaws: a new cluster and a changed one.
    support::create(&clusters, &support::database_cluster("two", 1)).await?;
    until_reconciled(&clusters, "two", Duration::from_secs(40)).await?;
    let takeover = frozen.elapsed();
    println!("takeover from a frozen leader: {} ms", takeover.as_millis());
    assert_eq!(leader_metric(&b).await?, 1.0, "b leads");
    let resized = serde_json::json!({"spec": {"instances": 2}});
    clusters
        .patch(
            "one",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&resized),
        )
        .await?;
    until_reconciled(&clusters, "one", Duration::from_secs(20)).await?;
    // A's last writes were made before the freeze, long before now.
    let mut audit = audit::Tail::from_now(&cluster().audit_log())?;

    a.thaw()?;
    let status = a.wait(Duration::from_secs(20)).await?;
    assert!(
        !status.success(),
        "a replica that lost the lease exits non-zero: {status}"
    );
    // Watched until the API server has logged all A could have sent.
    let after_thaw = audit
        .unwanted_within(Duration::ZERO, |w| {
            w.user == user_a && w.namespace.as_deref() == Some(namespace.name.as_str())
        })
        .await?;
    assert_eq!(after_thaw, vec![], "the thawed replica wrote");
    println!("writes by the thawed replica: {}", after_thaw.len());
    assert!(
        a.log_tail(200).contains("another replica may be leading"),
        "the thawed replica says why it stopped:\n{}",
        a.log_tail(40)
    );
    Ok(())
}
