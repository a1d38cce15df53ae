//! The instance's side of membership (`cairn_api::database::instance`): it
//! learns its assigned role by watching its own pod, and renews its Lease —
//! the heartbeat — with its observed state. Outside a pod (process-level
//! tests) the role comes from a file and there is no heartbeat.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_api::database::instance::{
    BOOTSTRAP_ANNOTATION, BOOTSTRAP_INITDB, BOOTSTRAP_RESTORE, FENCED_ANNOTATION,
    OBSERVED_ANNOTATION, ObservedState, ROLE_LABEL,
};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio::sync::watch;

use crate::observe::Role;
use crate::peers::{ACK_WINDOW, Peers};

/// What the controller assigned this instance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assignment {
    /// None until the controller labels the pod.
    pub role: Option<Role>,
    /// How an empty data folder may be filled as a primary: only a new
    /// cluster's first primary may (by initdb, or by restoring a backup).
    pub bootstrap: Option<Bootstrap>,
}

/// How a new cluster's first primary makes its data folder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bootstrap {
    Initdb,
    Restore,
}

/// Whether this instance may act as a writable primary, as far as its
/// heartbeat goes.
pub struct Heartbeat {
    /// None outside a pod: no heartbeat, no fencing.
    state: Option<Mutex<Renewal>>,
    fence_after: Duration,
    /// The other members, which keep a primary serving past the fence
    /// while every one of them acknowledges its claims.
    peers: Option<Arc<Peers>>,
}

#[derive(Default)]
struct Renewal {
    /// When the last successful renewal was sent.
    last_renewed: Option<Instant>,
    /// The controller deposed this instance.
    fenced: bool,
}

impl Heartbeat {
    /// No heartbeat: the instance runs outside a pod.
    pub fn none() -> Arc<Self> {
        Arc::new(Self {
            state: None,
            fence_after: Duration::ZERO,
            peers: None,
        })
    }

    pub fn new(fence_after: Duration, peers: Option<Arc<Peers>>) -> Arc<Self> {
        Arc::new(Self {
            state: Some(Mutex::default()),
            fence_after,
            peers,
        })
    }

    /// Why this instance must not serve writes now, if it must not: fenced
    /// by the controller, or no successful renewal within the fence time
    /// (the controller may promote a replica once the failover delay passes,
    /// which is at least twice as long) while not every other member
    /// acknowledged a recent claim (`peers`: a primary cut off from the API
    /// server alone keeps serving, since no replica would promote).
    pub fn forbids_primary(&self) -> Option<String> {
        // One rule, `writable_for`'s; this only says why.
        self.writable_for()
            .is_none()
            .then(|| self.why_not_writable())
    }

    fn why_not_writable(&self) -> String {
        let Some(state) = &self.state else {
            return "fenced".to_owned();
        };
        let renewal = state.lock().unwrap_or_else(|p| p.into_inner());
        if renewal.fenced {
            return "fenced: the controller promoted another instance".to_owned();
        }
        if renewal.last_renewed.is_none() {
            return "no heartbeat renewed yet".to_owned();
        }
        drop(renewal);
        let bound = self.fence_after.as_secs();
        match self
            .peers
            .as_ref()
            .map(|p| p.all_acknowledged_within(ACK_WINDOW))
        {
            Some(Err(why)) => format!("fenced: no heartbeat renewed within {bound} s, and {why}"),
            _ => format!("fenced: no heartbeat renewed within {bound} s"),
        }
    }

    /// How much longer writes stay allowed if nothing new happens (no
    /// renewal, no acknowledgement): what the fence's watchdog is told.
    /// None when they are not allowed now; the longest wait outside a pod.
    pub fn writable_for(&self) -> Option<Duration> {
        let Some(state) = &self.state else {
            return Some(Duration::MAX);
        };
        let renewal = state.lock().unwrap_or_else(|p| p.into_inner());
        if renewal.fenced {
            return None;
        }
        let by_heartbeat = self
            .fence_after
            .checked_sub(renewal.last_renewed?.elapsed());
        drop(renewal);
        let by_peers = self
            .peers
            .as_ref()
            .and_then(|p| p.acknowledged_for(ACK_WINDOW));
        by_heartbeat.max(by_peers)
    }

    fn record(&self, sent: Instant, fenced: bool) {
        if let Some(state) = &self.state {
            let mut renewal = state.lock().unwrap_or_else(|p| p.into_inner());
            renewal.last_renewed = Some(sent);
            renewal.fenced = fenced;
        }
    }

    fn set_fenced(&self, fenced: bool) {
        if let Some(state) = &self.state {
            state.lock().unwrap_or_else(|p| p.into_inner()).fenced = fenced;
        }
    }
}

/// Keeps `assignment` current from the pod's labels and annotations.
pub async fn watch_pod(pods: Api<Pod>, name: String, assignment: watch::Sender<Assignment>) {
    // RBAC allows list and watch only with this field selector.
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut updates = std::pin::pin!(watcher(pods, config).default_backoff().applied_objects());
    let mut logged_error = false;
    while let Some(update) = updates.next().await {
        match update {
            Ok(pod) => {
                logged_error = false;
                let role = pod
                    .labels()
                    .get(ROLE_LABEL)
                    .and_then(|r| r.parse::<Role>().ok());
                let bootstrap = match pod
                    .annotations()
                    .get(BOOTSTRAP_ANNOTATION)
                    .map(String::as_str)
                {
                    Some(BOOTSTRAP_INITDB) => Some(Bootstrap::Initdb),
                    Some(BOOTSTRAP_RESTORE) => Some(Bootstrap::Restore),
                    _ => None,
                };
                assignment.send_if_modified(|current| {
                    let next = Assignment { role, bootstrap };
                    let changed = *current != next;
                    if changed {
                        tracing::info!(role = ?next.role, ?bootstrap, "assignment from the pod");
                    }
                    *current = next;
                    changed
                });
            }
            Err(e) if !logged_error => {
                tracing::warn!(error = %e, pod = %name, "cannot watch the pod; retrying");
                logged_error = true;
            }
            Err(_) => {}
        }
    }
}

/// Keeps `assignment` current from a role file (outside a pod, where the
/// configuration says how to bootstrap).
pub async fn watch_role_file(
    path: PathBuf,
    poll: Duration,
    bootstrap: Bootstrap,
    assignment: watch::Sender<Assignment>,
) {
    loop {
        let role = std::fs::read_to_string(&path)
            .ok()
            .and_then(|text| text.parse::<Role>().ok());
        assignment.send_if_modified(|current| {
            let next = Assignment {
                role,
                bootstrap: Some(bootstrap),
            };
            let changed = *current != next;
            *current = next;
            changed
        });
        tokio::time::sleep(poll).await;
    }
}

/// Renews Lease `name` every `period` with the observed state, until `done`;
/// then writes the last state once. Each write carries the resourceVersion
/// last seen, so it fails if the controller changed the Lease meanwhile (a
/// deposition): the Lease is read again and the fencing it shows recorded.
pub async fn renew(
    leases: Api<Lease>,
    name: String,
    mut observed: watch::Receiver<ObservedState>,
    heartbeat: Arc<Heartbeat>,
    period: Duration,
    mut done: watch::Receiver<bool>,
) {
    let mut version: Option<String> = None;
    let mut failing = false;
    let mut written = ObservedState::default();
    loop {
        let finishing = *done.borrow_and_update();
        let sent = Instant::now();
        let state = observed.borrow_and_update().clone();
        let result = match &version {
            None => read(&leases, &name).await,
            Some(current) => write(&leases, &name, current, &state, &heartbeat).await,
        };
        match result {
            Ok(lease) => {
                let fenced = is_fenced(&lease);
                if version.is_some() {
                    heartbeat.record(sent, fenced);
                } else {
                    heartbeat.set_fenced(fenced);
                }
                let renewed = version.is_some();
                if renewed {
                    written = state;
                }
                version = lease.resource_version();
                if failing {
                    tracing::info!(lease = %name, "heartbeat renewed again");
                    failing = false;
                }
                if !renewed {
                    continue; // read: renew at once
                }
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                tracing::info!(lease = %name, "the Lease changed meanwhile: reading it again");
                version = None;
                continue;
            }
            // Deleted (the controller recreates it at once): read it again
            // now rather than a period later, to renew the new one before
            // the heartbeat lapses. A read that finds none waits the period.
            Err(kube::Error::Api(status)) if status.code == 404 && version.is_some() => {
                tracing::info!(lease = %name, "the Lease is gone: reading it again");
                version = None;
                continue;
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, lease = %name, "cannot renew the heartbeat");
                    failing = true;
                }
            }
        }
        if finishing {
            return;
        }
        let next = tokio::time::Instant::now() + period;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(next) => break,
                _ = done.changed() => break,
                changed = observed.changed() => {
                    // A change the controller acts on goes out at once (a
                    // switchover waits for it); WAL positions wait the period.
                    if changed.is_err() {
                        tokio::time::sleep_until(next).await;
                        break;
                    }
                    if urgent(&written, &observed.borrow()) {
                        break;
                    }
                }
            }
        }
    }
}

/// Whether `now` differs from what was written in what the controller decides on.
fn urgent(written: &ObservedState, now: &ObservedState) -> bool {
    written.ready != now.ready
        || written.role != now.role
        || written.hears_primary != now.hears_primary
        || written.timeline != now.timeline
        || written.shutdown_position != now.shutdown_position
}

async fn read(leases: &Api<Lease>, name: &str) -> Result<Lease, kube::Error> {
    leases.get(name).await
}

async fn write(
    leases: &Api<Lease>,
    name: &str,
    version: &str,
    observed: &ObservedState,
    heartbeat: &Heartbeat,
) -> Result<Lease, kube::Error> {
    let patch = json!({
        "metadata": {
            "resourceVersion": version,
            "annotations": { OBSERVED_ANNOTATION: serde_json::to_string(observed).unwrap_or_default() },
        },
        "spec": {
            "holderIdentity": name,
            "renewTime": MicroTime(Timestamp::now()),
            "leaseDurationSeconds": heartbeat.fence_after.as_secs().max(1),
        },
    });
    leases
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

fn is_fenced(lease: &Lease) -> bool {
    lease
        .annotations()
        .get(FENCED_ANNOTATION)
        .map(String::as_str)
        == Some("true")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_heartbeat_nothing_forbids_a_primary() {
        assert_eq!(Heartbeat::none().forbids_primary(), None);
    }

    #[test]
    fn a_primary_needs_a_recent_renewal_and_no_fencing() {
        let heartbeat = Heartbeat::new(Duration::from_secs(5), None);
        assert!(heartbeat.forbids_primary().is_some(), "never renewed");
        heartbeat.record(Instant::now(), false);
        assert_eq!(heartbeat.forbids_primary(), None);
        heartbeat.record(Instant::now() - Duration::from_secs(6), false);
        let stale = heartbeat.forbids_primary().unwrap_or_default();
        assert!(stale.contains("no heartbeat renewed within 5 s"), "{stale}");
        heartbeat.record(Instant::now(), true);
        let fenced = heartbeat.forbids_primary().unwrap_or_default();
        assert!(fenced.contains("promoted another instance"), "{fenced}");
        assert_eq!(heartbeat.writable_for(), None);
        heartbeat.record(Instant::now() - Duration::from_secs(2), false);
        let left = heartbeat.writable_for().expect("writable");
        assert!(
            left <= Duration::from_secs(3) && left > Duration::from_secs(2),
            "{left:?}"
        );
        heartbeat.record(Instant::now() - Duration::from_secs(6), false);
        assert_eq!(heartbeat.writable_for(), None);
    }
}
