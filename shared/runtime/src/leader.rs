//! Leader election on a `coordination.k8s.io` Lease, the way client-go does
//! it: the holder renews the Lease with optimistic concurrency (so two holders
//! are impossible), standbys poll it and take it when it is free or expired,
//! and a holder that steps down clears it so a standby takes over at once.
//!
//! Three properties keep a leader from writing twice:
//! - expiry is judged from when this replica saw the Lease last change, on
//!   its own monotonic clock, never from the holder's `renewTime` (the
//!   holder's clock may be skewed);
//! - every round of requests is bounded by a timeout that ends no later than
//!   the renew deadline, so a hung request cannot keep a holder believing it
//!   leads;
//! - [`Candidacy::lost`] fires at the renew deadline itself, on a timer, even
//!   if the election task is stuck; [`Sureness`] lets every write check it.
//!
//! Own implementation rather than kube-lease-manager or kubert's lease
//! module: kube-lease-manager's standbys sleep until the holder's lease would
//! expire, so a released lease moved only after up to a full lease duration
//! (15 s measured here), not the ~1 s a graceful shutdown needs; kubert
//! judges expiry from the holder's `renewTime` against the local clock.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::metrics::Metrics;

/// Timing of the election.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// How long a lease stays valid after its last renewal: a standby takes
    /// over this long after a leader dies without releasing it.
    pub lease_duration: Duration,
    /// How often the holder renews.
    pub renew_interval: Duration,
    /// A holder that could not renew for this long steps down (before its
    /// lease expires, so it never acts after a standby may have taken over).
    pub renew_deadline: Duration,
    /// How often a standby checks the lease.
    pub retry_interval: Duration,
    /// The longest one round of Lease requests may take; a holder's round
    /// also ends at its renew deadline, whichever comes first.
    pub request_timeout: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_interval: Duration::from_secs(5),
            renew_deadline: Duration::from_secs(10),
            retry_interval: Duration::from_secs(1),
            request_timeout: Duration::from_secs(4),
        }
    }
}

/// Why this replica is no longer leading.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("lost the lease: another replica may be leading")]
    Lost,
    #[error("no renewal within the renew deadline: another replica may be leading")]
    Unsure,
    #[error("the election task ended")]
    TaskEnded,
    #[error("could not release the lease: {0}")]
    Release(kube::Error),
}

/// This replica's candidacy for a Lease. Dropping it stops renewing without
/// releasing; call [`Candidacy::release`] on a graceful shutdown.
pub struct Candidacy {
    is_leader: watch::Receiver<bool>,
    sure: Sureness,
    stop: Option<oneshot::Sender<oneshot::Sender<Result<(), kube::Error>>>>,
    task: JoinHandle<()>,
    metrics: Metrics,
}

/// Starts competing for Lease `namespace/name` as `identity` (the pod name).
pub fn run_for(
    client: Client,
    namespace: &str,
    name: &str,
    identity: &str,
    timing: Timing,
    metrics: Metrics,
) -> Candidacy {
    let (leader_tx, is_leader) = watch::channel(false);
    let (stop, stop_rx) = oneshot::channel();
    let sure = Sureness {
        renewed: Arc::default(),
        deadline: timing.renew_deadline,
    };
    let election = Election {
        api: Api::namespaced(client, namespace),
        name: name.to_owned(),
        identity: identity.to_owned(),
        timing,
        last_renewal: None,
        observed: None,
        sure: sure.clone(),
    };
    let task = tokio::spawn(election.run(leader_tx, stop_rx));
    Candidacy {
        is_leader,
        sure,
        stop: Some(stop),
        task,
        metrics,
    }
}

impl Candidacy {
    /// Waits until this replica holds the lease.
    pub async fn acquired(&mut self) -> Result<(), LeaderError> {
        self.is_leader
            .wait_for(|leader| *leader)
            .await
            .map_err(|_| LeaderError::TaskEnded)?;
        self.metrics.leader.set(1);
        self.metrics.lease_transitions.inc();
        Ok(())
    }

    /// Waits until this replica, holding the lease, loses it or stops being
    /// sure of it (no renewal within the renew deadline, whatever the election
    /// task is doing). Reconciling must stop at once.
    pub async fn lost(&mut self) -> LeaderError {
        let error = loop {
            let unsure = tokio::time::sleep(self.sure.remaining());
            tokio::select! {
                changed = self.is_leader.wait_for(|leader| !*leader) => break match changed {
                    Ok(_) => LeaderError::Lost,
                    Err(_) => LeaderError::TaskEnded,
                },
                () = unsure => if !self.sure.is_sure() {
                    break LeaderError::Unsure;
                },
            }
        };
        self.metrics.leader.set(0);
        self.metrics.lease_transitions.inc();
        error
    }

    /// Whether this replica holds the lease now.
    pub fn is_leader(&self) -> bool {
        *self.is_leader.borrow()
    }

    /// A check any task can make before it writes (see [`Sureness`]).
    pub fn sureness(&self) -> Sureness {
        self.sure.clone()
    }

    /// Steps down and clears the lease so a standby takes over within its
    /// retry interval (on SIGTERM). Waits at most `timeout`.
    pub async fn release(mut self, timeout: Duration) -> Result<(), LeaderError> {
        self.metrics.leader.set(0);
        let (done, released) = oneshot::channel();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(done);
        }
        match tokio::time::timeout(timeout, released).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(LeaderError::Release(e)),
            Ok(Err(_)) | Err(_) => Err(LeaderError::TaskEnded),
        }
    }

    /// Stops renewing without releasing, as a crash would: the lease moves
    /// only when it expires.
    pub fn abandon(self) {
        self.metrics.leader.set(0);
        self.task.abort();
    }
}

impl Drop for Candidacy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Whether this replica renewed the lease within the renew deadline, read
/// from the clock at the moment of asking. The election task updates the
/// leader flag only after its next request; a process that was frozen (a
/// stopped node, SIGSTOP) runs its queued reconciles the moment it thaws,
/// before that request, and must write nothing then.
#[derive(Clone)]
pub struct Sureness {
    renewed: Arc<Mutex<Option<Instant>>>,
    deadline: Duration,
}

impl Sureness {
    pub fn is_sure(&self) -> bool {
        !self.remaining().is_zero()
    }

    /// How long this replica stays sure without another renewal.
    pub fn remaining(&self) -> Duration {
        self.renewed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map_or(Duration::ZERO, |renewed| {
                self.deadline.saturating_sub(renewed.elapsed())
            })
    }

    /// Sure for `deadline` from now (tests of code that checks it).
    #[cfg(test)]
    pub(crate) fn renewed_now(deadline: Duration) -> Self {
        Self {
            renewed: Arc::new(Mutex::new(Some(Instant::now()))),
            deadline,
        }
    }

    fn set(&self, renewed: Option<Instant>) {
        *self.renewed.lock().unwrap_or_else(|p| p.into_inner()) = renewed;
    }
}

/// A client middleware that refuses every write (any method but GET, HEAD
/// and OPTIONS) unless this replica is sure it leads: the last line of
/// defence for a write begun before a freeze and sent after it. Until the
/// replica competes for the lease, every write is refused.
#[derive(Clone)]
pub struct WritesWhileSure(pub Arc<OnceLock<Sureness>>);

/// The error a refused write fails with.
#[derive(Debug, thiserror::Error)]
#[error("write refused: this replica is not sure it leads")]
pub struct NotSureToLead;

impl<B> tower::filter::Predicate<http::Request<B>> for WritesWhileSure {
    type Request = http::Request<B>;

    fn check(&mut self, request: http::Request<B>) -> Result<Self::Request, tower::BoxError> {
        use http::Method;
        let reads = matches!(
            *request.method(),
            Method::GET | Method::HEAD | Method::OPTIONS
        );
        if reads || self.0.get().is_some_and(Sureness::is_sure) {
            return Ok(request);
        }
        tracing::warn!(
            method = %request.method(),
            path = request.uri().path(),
            "write refused: not sure this replica still leads"
        );
        Err(Box::new(NotSureToLead))
    }
}

struct Election {
    api: Api<Lease>,
    sure: Sureness,
    name: String,
    identity: String,
    timing: Timing,
    /// When this replica last renewed (or acquired) the lease.
    last_renewal: Option<Instant>,
    /// The Lease's resourceVersion and when this replica first saw it.
    observed: Option<(String, Instant)>,
}

type StopRequest = oneshot::Sender<Result<(), kube::Error>>;

impl Election {
    async fn run(mut self, leader: watch::Sender<bool>, mut stop: oneshot::Receiver<StopRequest>) {
        loop {
            let leading = self.step().await;
            leader.send_if_modified(|current| std::mem::replace(current, leading) != leading);
            let pause = if leading {
                self.timing
                    .renew_interval
                    .min(self.timing.retry_interval * 2)
            } else {
                self.timing.retry_interval
            };
            tokio::select! {
                request = &mut stop => {
                    leader.send_replace(false);
                    let result = self.release().await;
                    if let Ok(done) = request {
                        let _ = done.send(result);
                    }
                    return;
                }
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// One look at the lease: renew it, take it, or wait. Returns whether this
    /// replica leads now.
    async fn step(&mut self) -> bool {
        // A holder must know by its renew deadline whether it still leads.
        let timeout = match self.sure.remaining() {
            Duration::ZERO => self.timing.request_timeout,
            remaining => remaining.min(self.timing.request_timeout),
        };
        match tokio::time::timeout(timeout, self.requests()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(lease = %self.name, error = %e, "leader election request failed");
            }
            Err(_) => tracing::warn!(
                lease = %self.name,
                timeout_ms = timeout.as_millis(),
                "leader election request timed out"
            ),
        }
        // Leading means having renewed recently enough that the lease cannot
        // have expired for the others.
        self.sure.is_sure()
    }

    async fn requests(&mut self) -> Result<(), kube::Error> {
        match self.api.get_opt(&self.name).await? {
            None => self.create().await,
            Some(lease) => self.renew_or_take(lease).await,
        }
    }

    async fn create(&mut self) -> Result<(), kube::Error> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(self.held_spec(None)),
        };
        let started = Instant::now();
        self.api.create(&PostParams::default(), &lease).await?;
        self.last_renewal = Some(started);
        self.sure.set(Some(started));
        Ok(())
    }

    async fn renew_or_take(&mut self, mut lease: Lease) -> Result<(), kube::Error> {
        let spec = lease.spec.clone().unwrap_or_default();
        let ours = spec.holder_identity.as_deref() == Some(self.identity.as_str());
        if !ours {
            self.last_renewal = None;
            self.sure.set(None);
            let seen_since = self.observe(&lease);
            if spec.holder_identity.is_some() && !expired(seen_since, &spec) {
                return Ok(()); // someone else leads
            }
        } else if self
            .last_renewal
            .is_some_and(|r| r.elapsed() < self.timing.renew_interval)
        {
            return Ok(()); // renewed recently
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!ours);
        let acquired = if ours {
            spec.acquire_time.clone()
        } else {
            None
        };
        let mut new_spec = self.held_spec(acquired);
        new_spec.lease_transitions = Some(transitions);
        lease.spec = Some(new_spec);
        // The resourceVersion from the read makes this a compare-and-swap:
        // of two standbys taking a free lease, one gets a conflict.
        let started = Instant::now();
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await?;
        if !ours {
            tracing::info!(lease = %self.name, identity = %self.identity, "acquired the lease");
        }
        self.last_renewal = Some(started);
        self.sure.set(Some(started));
        Ok(())
    }

    /// Since when this replica has seen the Lease unchanged.
    fn observe(&mut self, lease: &Lease) -> Instant {
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        match &self.observed {
            Some((seen, since)) if *seen == version => *since,
            _ => {
                let now = Instant::now();
                self.observed = Some((version, now));
                now
            }
        }
    }

    fn held_spec(&self, acquire_time: Option<MicroTime>) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.timing.lease_duration.as_secs()).unwrap_or(i32::MAX),
            ),
            acquire_time: Some(acquire_time.unwrap_or_else(|| now.clone())),
            renew_time: Some(now),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }
    }

    /// Clears the lease if this replica holds it.
    async fn release(&mut self) -> Result<(), kube::Error> {
        self.last_renewal = None;
        self.sure.set(None);
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await?;
        tracing::info!(lease = %self.name, identity = %self.identity, "released the lease");
        Ok(())
    }
}

/// Whether a lease's holder failed to renew within its duration, judged by
/// how long this replica has seen the Lease unchanged: the holder's clock
/// (`renewTime`) may be skewed against ours.
fn expired(unchanged_since: Instant, spec: &LeaseSpec) -> bool {
    let Some(seconds) = spec.lease_duration_seconds else {
        return true;
    };
    let duration = Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
    unchanged_since.elapsed() > duration
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::SignedDuration;

    fn spec(renewed_hours_ago: i64, duration: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some("other".into()),
            renew_time: Some(MicroTime(
                Timestamp::now() - SignedDuration::from_hours(renewed_hours_ago),
            )),
            lease_duration_seconds: Some(duration),
            ..LeaseSpec::default()
        }
    }

    fn seconds_ago(seconds: u64) -> Instant {
        Instant::now() - Duration::from_secs(seconds)
    }

    #[test]
    fn sure_only_within_the_renew_deadline_of_the_last_renewal() {
        assert!(Sureness::renewed_now(Duration::from_secs(10)).is_sure());
        assert!(!Sureness::renewed_now(Duration::ZERO).is_sure());
        let never = Sureness {
            renewed: Arc::default(),
            deadline: Duration::from_secs(10),
        };
        assert!(!never.is_sure());
    }

    #[test]
    fn a_lease_expires_its_duration_after_it_was_last_seen_changing() {
        // The holder's renewTime says an hour ago (a skewed clock): only what
        // this replica saw counts.
        assert!(!expired(seconds_ago(5), &spec(1, 15)));
        assert!(expired(seconds_ago(16), &spec(-1, 15)));
        assert!(
            expired(Instant::now(), &LeaseSpec::default()),
            "a lease without a duration is free"
        );
    }

    #[test]
    fn writes_pass_only_while_sure() {
        use tower::filter::Predicate;
        let request = |method: http::Method| {
            http::Request::builder()
                .method(method)
                .uri("/api/v1/namespaces/a/configmaps")
                .body(())
                .expect("a valid request")
        };
        let mut unset = WritesWhileSure(Arc::new(OnceLock::new()));
        assert!(unset.check(request(http::Method::GET)).is_ok());
        assert!(unset.check(request(http::Method::PATCH)).is_err());
        let lapsed = WritesWhileSure(Arc::new(OnceLock::from(Sureness::renewed_now(
            Duration::ZERO,
        ))));
        assert!(lapsed.clone().check(request(http::Method::POST)).is_err());
        let mut sure = WritesWhileSure(Arc::new(OnceLock::from(Sureness::renewed_now(
            Duration::from_secs(10),
        ))));
        assert!(sure.check(request(http::Method::DELETE)).is_ok());
    }

    #[test]
    fn sureness_counts_down_to_the_deadline() {
        let sure = Sureness::renewed_now(Duration::from_secs(10));
        let remaining = sure.remaining();
        assert!(remaining > Duration::from_secs(9) && remaining <= Duration::from_secs(10));
        sure.set(None);
        assert_eq!(sure.remaining(), Duration::ZERO);
    }
}
