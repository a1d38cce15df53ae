//! The instance's shared state: what `/status`, `/livez`, `/readyz`, the
//! metrics and the pod annotation report.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use cairn_api::database::instance::{BackupProgress, ObservedState, WalArchiveState};
use serde::Serialize;
use tokio::sync::watch;

use crate::error::Error;
use crate::metrics::Metrics;
use crate::observe::{Role, Sample};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum Phase {
    /// The role file is missing or empty.
    #[default]
    WaitingForRole,
    /// initdb or pg_basebackup is running.
    Bootstrapping,
    /// pg_rewind is running on a former primary's folder; a shutdown waits
    /// for it, since an interrupted rewind leaves the folder unusable.
    Rewinding,
    /// postgres runs (it may still be recovering).
    Running,
    /// Something failed; the next attempt is after a backoff.
    Retrying,
    Stopping,
    Stopped,
}

/// `/status`.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub phase: Phase,
    pub assigned_role: Option<Role>,
    /// The role the server reports.
    pub role: Option<Role>,
    pub ready: bool,
    /// Why not ready.
    pub reason: Option<String>,
    pub timeline: Option<u32>,
    pub wal_position: Option<String>,
    pub replication_lag_bytes: Option<i64>,
    pub replication_lag_seconds: Option<f64>,
    pub received_position: Option<String>,
    pub synchronous_standby_names: Option<String>,
    /// The shutdown checkpoint of a primary stopped for a demotion.
    pub shutdown_position: Option<String>,
    /// The member whose claim to be a writable primary this one heard
    /// within the hold time (`peers`): it refuses promotion meanwhile.
    pub hears_primary: Option<String>,
    pub streaming: Option<bool>,
    /// postgres runs but refuses connections as starting up.
    pub starting: bool,
    pub server_version: Option<String>,
    pub pending_restart: Vec<String>,
    /// Unexpected exits of postgres since this process started.
    pub postgres_restarts: u64,
    /// The last failure, kept until something succeeds again.
    pub last_error: Option<String>,
    /// The class of `last_error` when it is a failed step (`io`, `sql`,
    /// `program`, …: `Error::class`); none for a condition such as a full
    /// volume or an exit of postgres.
    pub last_error_class: Option<&'static str>,
    /// Failed attempts to prepare the data folder or start postgres since
    /// this process started.
    pub failed_starts: u64,
    /// Failed attempts to load a logical backup since this process started.
    pub dump_load_failures: u32,
    /// Free and total bytes of the filesystem that holds the data folder.
    pub data_volume_free_bytes: Option<u64>,
    pub data_volume_bytes: Option<u64>,
    /// WAL archiving, when the cluster has a backup destination.
    pub wal_archive: Option<WalArchiveState>,
    /// Where base backups go, when the cluster has a backup destination.
    pub backup_destination: Option<String>,
    /// The base backup last requested of this instance.
    pub backup: Option<BackupProgress>,
    /// A base backup is being taken: the server keeps more WAL meanwhile.
    pub base_backup_running: bool,
}

pub struct State {
    status: Mutex<Status>,
    last_answer: Mutex<Option<Instant>>,
    pub metrics: Metrics,
    observed: watch::Sender<ObservedState>,
}

impl State {
    pub fn new(metrics: Metrics) -> Self {
        Self {
            status: Mutex::default(),
            last_answer: Mutex::default(),
            metrics,
            observed: watch::Sender::new(ObservedState::default()),
        }
    }

    pub fn status(&self) -> Status {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn update(&self, change: impl FnOnce(&mut Status)) {
        let observed = {
            let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
            change(&mut status);
            ObservedState {
                ready: status.ready,
                role: status.role.map(|r| r.to_string()),
                timeline: status.timeline,
                wal_position: status.wal_position.clone(),
                received_position: status.received_position.clone(),
                synchronous_standby_names: status.synchronous_standby_names.clone(),
                starting: status.starting,
                server_version: status.server_version.clone(),
                shutdown_position: status.shutdown_position.clone(),
                hears_primary: status.hears_primary.clone(),
                problem: (!status.ready)
                    .then(|| status.last_error.clone().or_else(|| status.reason.clone()))
                    .flatten(),
                wal_archive: status.wal_archive.clone(),
                backup_destination: status.backup_destination.clone(),
                backup: status.backup.clone(),
            }
        };
        self.observed.send_if_modified(|current| {
            let changed = *current != observed;
            *current = observed;
            changed
        });
    }

    pub fn phase(&self, phase: Phase) {
        self.update(|s| {
            s.phase = phase;
            if phase != Phase::Running {
                s.ready = false;
                s.reason = Some(format!("{phase:?}"));
                // The role is what a running server reports: none now.
                s.role = None;
                s.streaming = None;
                s.starting = false;
            }
        });
        if phase != Phase::Running {
            self.metrics.observe(None, false);
        }
    }

    /// Records a failed step: logged, shown in `/status` with its class
    /// until cleared, and counted by class.
    pub fn failed(&self, error: &Error) {
        self.failed_saying(error, error);
    }

    /// [`failed`](Self::failed), said with what the error does not say
    /// (the step it failed in, a full volume).
    pub fn failed_saying(&self, error: &Error, message: impl std::fmt::Display) {
        self.metrics.step_failed(error.class());
        self.record(Some(error.class()), message.to_string());
    }

    /// Records a problem that is no failed step (a nearly full volume,
    /// fencing, an exit of postgres, which is counted on its own): logged,
    /// and shown in `/status` until cleared.
    pub fn error(&self, message: impl std::fmt::Display) {
        self.record(None, message.to_string());
    }

    fn record(&self, class: Option<&'static str>, message: String) {
        if self.status().last_error.as_ref() != Some(&message) {
            tracing::error!("{message}");
        }
        self.update(|s| {
            s.last_error = Some(message);
            s.last_error_class = class;
        });
    }

    pub fn clear_error(&self) {
        self.update(|s| {
            s.last_error = None;
            s.last_error_class = None;
        });
    }

    /// Records a sample (or none: the server did not answer queries) and the
    /// readiness concluded from it.
    pub fn observe(&self, sample: Option<&Sample>, ready: Result<(), Error>) {
        self.metrics.observe(sample, ready.is_ok());
        self.update(|s| {
            s.ready = ready.is_ok();
            s.reason = ready.err().map(|why| why.to_string());
            s.role = sample.map(|x| {
                if x.in_recovery {
                    Role::Replica
                } else {
                    Role::Primary
                }
            });
            s.timeline = sample.and_then(|x| x.timeline);
            s.wal_position = sample.and_then(|x| x.wal_position.clone());
            s.received_position = sample.and_then(|x| x.received_position.clone());
            s.synchronous_standby_names = sample.and_then(|x| x.synchronous_standby_names.clone());
            s.replication_lag_bytes = sample.and_then(|x| x.lag_bytes);
            s.replication_lag_seconds = sample.and_then(|x| x.lag_seconds);
            s.streaming = sample.filter(|x| x.in_recovery).map(|x| x.streaming);
            if let Some(x) = sample {
                s.starting = false;
                s.server_version = Some(x.server_version.clone());
                s.pending_restart = x.pending_restart.clone();
            }
        });
    }

    /// The server answered (even "starting up"): it is alive.
    pub fn answered(&self) {
        *self.last_answer.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }

    /// `/livez`: only a server that should run and has stopped answering
    /// fails it. Bootstrapping, waiting and backing off are alive: restarting
    /// the container would not help them.
    pub fn live(&self, limit: Duration) -> Result<String, Error> {
        let phase = self.status().phase;
        if phase != Phase::Running {
            return Ok(format!("{phase:?}"));
        }
        match *self.last_answer.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(at) if at.elapsed() > limit => Err(Error::Timeout(format!(
                "postgres has not answered for {}s",
                at.elapsed().as_secs()
            ))),
            _ => Ok("ok".to_owned()),
        }
    }

    pub fn observed(&self) -> watch::Receiver<ObservedState> {
        self.observed.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_step_is_shown_with_its_class_and_counted() {
        let state = State::new(Metrics::new().expect("metrics"));
        let failure = Error::Waiting("the primary is still in recovery".to_owned());
        state.failed(&failure);
        let status = serde_json::to_value(state.status()).expect("JSON");
        assert_eq!(status["lastError"], "the primary is still in recovery");
        assert_eq!(status["lastErrorClass"], "waiting");
        let metrics = state.metrics.render();
        for counted in [
            "cairn_postgres_step_failures_total{class=\"waiting\"} 1",
            "cairn_postgres_step_failures_total{class=\"io\"} 0",
        ] {
            assert!(metrics.contains(counted), "{metrics}");
        }
        // A condition that is no failed step has no class, and is not counted.
        state.error("the data volume is nearly full");
        assert_eq!(state.status().last_error_class, None);
        state.failed(&failure);
        state.clear_error();
        let status = state.status();
        assert_eq!((status.last_error, status.last_error_class), (None, None));
        assert!(state.metrics.render().contains("{class=\"waiting\"} 2"));
    }

    #[test]
    fn starting_up_is_reported_until_a_sample_or_a_stop() {
        let state = State::new(Metrics::new().expect("metrics"));
        let observed = state.observed();
        state.update(|s| s.starting = true);
        assert!(observed.borrow().starting);
        let refused = Err(Error::Waiting("not accepting connections".to_owned()));
        state.observe(None, refused);
        assert!(
            observed.borrow().starting,
            "a failed sample changes nothing"
        );
        state.observe(Some(&Sample::default()), Ok(()));
        assert!(!observed.borrow().starting, "it answered");
        state.update(|s| s.starting = true);
        state.phase(Phase::Stopping);
        assert!(!observed.borrow().starting, "stopping");
    }
}
