//! The instance's shared state: what `/status`, `/livez`, `/readyz`, the
//! metrics and the pod annotation report.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use cairn_api::database::instance::{BackupProgress, ObservedState, WalArchiveState};
use serde::Serialize;
use tokio::sync::watch;

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
    /// The shutdown checkpoint of a primary stopped for a demotion.
    pub shutdown_position: Option<String>,
    pub streaming: Option<bool>,
    pub server_version: Option<String>,
    pub pending_restart: Vec<String>,
    /// Unexpected exits of postgres since this process started.
    pub postgres_restarts: u64,
    /// The last failure, kept until something succeeds again.
    pub last_error: Option<String>,
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
                server_version: status.server_version.clone(),
                shutdown_position: status.shutdown_position.clone(),
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
            }
        });
        if phase != Phase::Running {
            self.metrics.observe(None, false);
        }
    }

    /// Records a failure: logged, and shown in `/status` until cleared.
    pub fn error(&self, message: impl std::fmt::Display) {
        let message = message.to_string();
        if self.status().last_error.as_ref() != Some(&message) {
            tracing::error!("{message}");
        }
        self.update(|s| s.last_error = Some(message));
    }

    pub fn clear_error(&self) {
        self.update(|s| s.last_error = None);
    }

    /// Records a sample (or none: the server did not answer queries) and the
    /// readiness concluded from it.
    pub fn observe(&self, sample: Option<&Sample>, ready: Result<(), String>) {
        self.metrics.observe(sample, ready.is_ok());
        self.update(|s| {
            s.ready = ready.is_ok();
            s.reason = ready.err();
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
            s.replication_lag_bytes = sample.and_then(|x| x.lag_bytes);
            s.replication_lag_seconds = sample.and_then(|x| x.lag_seconds);
            s.streaming = sample.filter(|x| x.in_recovery).map(|x| x.streaming);
            if let Some(x) = sample {
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
    pub fn live(&self, limit: Duration) -> Result<String, String> {
        let phase = self.status().phase;
        if phase != Phase::Running {
            return Ok(format!("{phase:?}"));
        }
        match *self.last_answer.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(at) if at.elapsed() > limit => Err(format!(
                "postgres has not answered for {}s",
                at.elapsed().as_secs()
            )),
            _ => Ok("ok".to_owned()),
        }
    }

    pub fn observed(&self) -> watch::Receiver<ObservedState> {
        self.observed.subscribe()
    }
}
