//! Backups on request: base backups (pg_basebackup) and logical backups
//! (pg_dump of the application database). The backup controller hands a Backup to this
//! instance by naming it in the Backup's `status.instance`; the instance
//! watches its cluster's Backups (read only), takes the one assigned to it,
//! and reports progress in its membership Lease (`ObservedState.backup`), the
//! only object it writes. No connection from the controller to the pod.
//!
//! Level-triggered: the Backups as the watch shows them now decide. A
//! backup no longer assigned (failed at its deadline, deleted) is stopped;
//! one assigned again after a restart of this process is taken again from
//! the start, unless its manifest is already stored, which makes it
//! complete: the manifest is written last.

use std::io::Read;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use cairn_api::backup::v1::{Backup, BackupMethod, BackupPhase};
use cairn_api::database::instance::{self as contract, BackupProgress, BackupProgressPhase};
use cairn_storage::layout::{BASE_BACKUP_DATA, DUMP_DATA};
use cairn_storage::{BackupId, BaseBackups, Manifest};
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, ResourceExt};
use tokio::sync::watch;

use crate::children::Children;
use crate::config::Config;
use crate::state::State;

/// The Backup assigned to this instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub name: String,
    pub uid: String,
    pub method: BackupMethod,
}

/// The Running Backup assigned to `pod`, the oldest if there are several
/// (the controller runs one per cluster at a time).
pub fn assigned<'a>(backups: impl IntoIterator<Item = &'a Backup>, pod: &str) -> Option<Request> {
    backups
        .into_iter()
        .filter(|b| {
            b.status.as_ref().is_some_and(|s| {
                s.phase == Some(BackupPhase::Running) && s.instance.as_deref() == Some(pod)
            }) && b.metadata.deletion_timestamp.is_none()
        })
        .min_by_key(|b| {
            let started = b.status.as_ref().and_then(|s| s.started_at.clone());
            (started.map(|t| t.0), b.name_any())
        })
        .map(|b| Request {
            name: b.name_any(),
            uid: b.uid().unwrap_or_default(),
            method: b.spec.method,
        })
}

/// Watches the Backups of `cluster` and publishes the one assigned to `pod`.
pub async fn watch_requests(
    api: Api<Backup>,
    cluster: String,
    pod: String,
    requests: watch::Sender<Option<Request>>,
) {
    let selector = format!("spec.cluster.name={cluster}");
    let (store, writer) = reflector::store();
    let mut events = watcher(api, watcher::Config::default().fields(&selector))
        .default_backoff()
        .reflect(writer)
        .boxed();
    while let Some(event) = events.next().await {
        if let Err(e) = event {
            tracing::warn!(error = %e, "watching Backups failed; retrying");
            continue;
        }
        let backups = store.state();
        let request = assigned(backups.iter().map(|b| &**b), &pod);
        requests.send_if_modified(|current| {
            let changed = *current != request;
            *current = request;
            changed
        });
    }
}

/// Takes the requested backups, one at a time.
pub struct Taker {
    pub config: Arc<Config>,
    pub backups: BaseBackups,
    /// Where logical backups go.
    pub dumps: BaseBackups,
    pub cluster: String,
    pub state: Arc<State>,
    pub children: Children,
}

impl Taker {
    /// Runs until `requests` closes. A new request (or none) stops the
    /// backup in progress: dropping its future stops pg_basebackup.
    pub async fn run(self, mut requests: watch::Receiver<Option<Request>>) {
        loop {
            let request = requests.borrow_and_update().clone();
            let work = async {
                if let Some(request) = &request {
                    let progress = self.take(request).await;
                    self.report(progress);
                }
                std::future::pending::<()>().await;
            };
            tokio::select! {
                () = work => {}
                changed = requests.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if let Some(withdrawn) = &request {
                        self.withdrawn(withdrawn);
                    }
                }
            }
        }
    }

    /// A backup stopped because its Backup is no longer assigned here
    /// (failed at its deadline, deleted): reported Failed if it was still
    /// running, so the controller knows at once that nothing more is
    /// written for it.
    fn withdrawn(&self, request: &Request) {
        let running = self
            .state
            .status()
            .backup
            .filter(|b| b.uid == request.uid && b.phase == BackupProgressPhase::Running);
        if let Some(running) = running {
            tracing::info!(backup = %request.name, "backup withdrawn: stopped");
            self.report(failed(
                request,
                &running.id,
                "withdrawn: the Backup is no longer assigned to this instance".into(),
            ));
        }
    }

    /// Where backups of `method` go.
    fn store(&self, method: BackupMethod) -> &BaseBackups {
        match method {
            BackupMethod::Physical => &self.backups,
            BackupMethod::Logical => &self.dumps,
        }
    }

    async fn take(&self, request: &Request) -> BackupProgress {
        let started = Instant::now();
        let id = match BackupId::of_backup(&request.name, &request.uid) {
            Ok(id) => id,
            Err(e) => return failed(request, "", e.to_string()),
        };
        let store = self.store(request.method);
        let mut progress = BackupProgress {
            name: request.name.clone(),
            uid: request.uid.clone(),
            phase: BackupProgressPhase::Running,
            id: id.to_string(),
            location: Some(store.location(&id)),
            ..BackupProgress::default()
        };
        match store.manifest(&id).await {
            Ok(Some(manifest)) => return completed(progress, &manifest, None),
            Ok(None) => {}
            Err(e) => return failed(request, id.as_str(), e.summary()),
        }
        let method = request.method;
        tracing::info!(backup = %request.name, %id, ?method, "taking a backup");
        self.report(progress.clone());
        let _keeping = (method == BackupMethod::Physical).then(|| KeepingWal::start(&self.state));
        match self.stream(method, &id, &mut progress).await {
            Ok(manifest) => {
                let elapsed = started.elapsed().as_millis() as u64;
                tracing::info!(backup = %request.name, %id, bytes = manifest.stored_bytes(), milliseconds = elapsed, "backup stored");
                completed(progress, &manifest, Some(elapsed))
            }
            Err(message) => {
                tracing::warn!(backup = %request.name, %id, %message, "backup failed");
                failed(request, id.as_str(), message)
            }
        }
    }

    /// pg_basebackup's tar stream or pg_dump's archive, compressed into the
    /// bucket as it comes, then the manifest.
    async fn stream(
        &self,
        method: BackupMethod,
        id: &BackupId,
        progress: &mut BackupProgress,
    ) -> Result<Manifest, String> {
        let started_at = Timestamp::now().to_string();
        // Where a dump stands in the WAL: the position it was taken at.
        let before = self.state.status();
        let (program, mut command, file_name) = match method {
            BackupMethod::Physical => (
                "pg_basebackup",
                self.basebackup_command()?,
                BASE_BACKUP_DATA,
            ),
            BackupMethod::Logical => ("pg_dump", self.dump_command()?, DUMP_DATA),
        };
        let store = self.store(method);
        let mut child = self
            .children
            .spawn_piped(&mut command)
            .map_err(|e| format!("cannot start {program}: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut stderr = child.stderr.take().ok_or("no stderr")?;
        let log = tokio::task::spawn_blocking(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        let state = self.state.clone();
        let reported = progress.clone();
        let uploaded = store
            .upload(id, file_name, stdout, move |bytes| {
                let mut now = reported.clone();
                now.stored_bytes = bytes;
                state.update(|s| s.backup = Some(now));
            })
            .await;
        let exit = child.wait().await;
        let log = log.await.unwrap_or_default();
        // The bucket's failure first: it breaks pg_basebackup's pipe, and
        // "broken pipe" would hide the cause.
        let file = uploaded.map_err(|e| e.summary())?;
        if !exit.success() {
            // What it wrote before failing was stored (its stdout closed):
            // no manifest makes it a backup, but it is removed all the same.
            let _ = store.delete(id).await;
            return Err(format!(
                "{program} failed ({exit}): {}",
                last_lines(&log, 3)
            ));
        }
        let range = match method {
            BackupMethod::Physical => WalRange::parse(&log).ok_or_else(|| {
                format!(
                    "pg_basebackup did not report its WAL range: {}",
                    last_lines(&log, 3)
                )
            })?,
            BackupMethod::Logical => {
                let position = before.wal_position.unwrap_or_default();
                WalRange {
                    begin: position.clone(),
                    end: position,
                    timeline: before.timeline.unwrap_or_default(),
                }
            }
        };
        progress.stored_bytes = file.compressed_bytes;
        let manifest = Manifest {
            id: id.to_string(),
            cluster: self.cluster.clone(),
            backup_name: progress.name.clone(),
            backup_uid: progress.uid.clone(),
            timeline: range.timeline,
            begin_lsn: range.begin,
            end_lsn: range.end,
            started_at,
            completed_at: Timestamp::now().to_string(),
            server_version: self.state.status().server_version,
            files: vec![file],
        };
        store
            .write_manifest(&manifest)
            .await
            .map_err(|e| e.summary())?;
        Ok(manifest)
    }

    /// pg_dump of the application database, custom format uncompressed
    /// (zstd compresses it on its way to the bucket), as the superuser over
    /// loopback. On a standby it reads one snapshot of the replica; a
    /// replay conflict that cancels it fails the backup with PostgreSQL's
    /// words.
    fn dump_command(&self) -> Result<Command, String> {
        let mut command = self.config.superuser_tool("pg_dump", "cairn-backup")?;
        command.args(["--format=custom", "--compress=0"]);
        Ok(command)
    }

    /// pg_basebackup of this instance's own server, over loopback as the
    /// replication user (pg_hba lets it replicate over TLS only; the
    /// certificate names the Services, not 127.0.0.1, so it is not
    /// verified: nothing sits between a process and its own loopback).
    /// `--wal-method=fetch` puts the WAL the backup needs in the tar, so it
    /// restores without the archive: read at the end from the server's
    /// pg_wal, which keeps more meanwhile (`KeepingWal`).
    fn basebackup_command(&self) -> Result<Command, String> {
        let user = self
            .config
            .credential(contract::REPLICATION_USER_KEY)
            .map_err(|e| format!("replication credentials: {e}"))?;
        let password = self
            .config
            .credential(contract::REPLICATION_PASSWORD_KEY)
            .map_err(|e| format!("replication credentials: {e}"))?;
        let mut command = Command::new(self.config.program("pg_basebackup"));
        if let Some(rate) = &self.config.backup_max_rate {
            command.arg(format!("--max-rate={rate}"));
        }
        command
            .args(["--pgdata=-", "--format=tar", "--wal-method=fetch"])
            .args(["--checkpoint=fast", "--verbose", "--no-password"])
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                &self.config.port.to_string(),
            ])
            .args(["--username", &user])
            .env("PGPASSWORD", password)
            .env("PGSSLMODE", "require")
            .env("PGCONNECT_TIMEOUT", "10")
            .env("PGAPPNAME", "cairn-backup")
            .env("LC_ALL", "C");
        Ok(command)
    }

    fn report(&self, progress: BackupProgress) {
        self.state.update(|s| s.backup = Some(progress));
    }
}

fn completed(
    mut progress: BackupProgress,
    manifest: &Manifest,
    elapsed: Option<u64>,
) -> BackupProgress {
    progress.phase = BackupProgressPhase::Completed;
    progress.timeline = Some(manifest.timeline);
    progress.begin_lsn = Some(manifest.begin_lsn.clone());
    progress.end_lsn = Some(manifest.end_lsn.clone());
    progress.stored_bytes = manifest.stored_bytes();
    progress.duration_milliseconds = elapsed.or_else(|| {
        let begin = manifest.started_at.parse::<Timestamp>().ok()?;
        let end = manifest.completed_at.parse::<Timestamp>().ok()?;
        Some(end.duration_since(begin).as_millis().max(0) as u64)
    });
    progress
}

fn failed(request: &Request, id: &str, error: String) -> BackupProgress {
    BackupProgress {
        name: request.name.clone(),
        uid: request.uid.clone(),
        phase: BackupProgressPhase::Failed,
        id: id.to_owned(),
        error: Some(error),
        ..BackupProgress::default()
    }
}

/// While a base backup runs, the server keeps up to a tenth of its volume
/// of WAL (as replication slots may), not `wal_keep_size` alone: the WAL
/// the backup spans is read from pg_wal at its end (`--wal-method=fetch`,
/// without a slot), and a restartpoint during a long backup under writes
/// would otherwise remove it. The supervisor rewrites the configuration and
/// reloads when this changes; dropping the guard (the backup done, failed
/// or withdrawn) ends it.
struct KeepingWal(Arc<State>);

impl KeepingWal {
    fn start(state: &Arc<State>) -> Self {
        state.update(|s| s.base_backup_running = true);
        Self(state.clone())
    }
}

impl Drop for KeepingWal {
    fn drop(&mut self) {
        self.0.update(|s| s.base_backup_running = false);
    }
}

/// The WAL a backup spans, as `pg_basebackup --verbose` reports it.
#[derive(Debug, PartialEq, Eq)]
struct WalRange {
    begin: String,
    end: String,
    timeline: u32,
}

impl WalRange {
    fn parse(log: &str) -> Option<Self> {
        let after = |marker: &str| {
            log.lines()
                .find_map(|l| l.split_once(marker).map(|(_, rest)| rest.trim().to_owned()))
        };
        let start = after("write-ahead log start point:")?;
        let (begin, timeline) = start.split_once(" on timeline ")?;
        let end = after("write-ahead log end point:")?;
        contract::parse_lsn(begin)?;
        contract::parse_lsn(&end)?;
        Some(Self {
            begin: begin.to_owned(),
            end,
            timeline: timeline.trim().parse().ok()?,
        })
    }
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" / ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_wal_range_is_read_from_pg_basebackups_verbose_output() {
        let log = "pg_basebackup: initiating base backup, waiting for checkpoint to complete\n\
                   pg_basebackup: checkpoint completed\n\
                   pg_basebackup: write-ahead log start point: 0/2000028 on timeline 3\n\
                   pg_basebackup: write-ahead log end point: 0/2000138\n\
                   pg_basebackup: syncing data to disk ...\n";
        assert_eq!(
            WalRange::parse(log),
            Some(WalRange {
                begin: "0/2000028".into(),
                end: "0/2000138".into(),
                timeline: 3
            })
        );
        assert_eq!(
            WalRange::parse("pg_basebackup: error: connection refused"),
            None
        );
    }

    fn backup(name: &str, phase: &str, instance: &str, started: &str) -> Backup {
        serde_json::from_value(json!({
            "apiVersion": "backup.cairn.dev/v1", "kind": "Backup",
            "metadata": { "name": name, "uid": format!("uid-{name}") },
            "spec": { "cluster": { "name": "orders" }, "method": "physical" },
            "status": { "phase": phase, "instance": instance, "startedAt": started },
        }))
        .expect("backup")
    }

    #[test]
    fn an_instance_takes_only_a_running_backup_assigned_to_it() {
        let backups = [
            backup("done", "Completed", "orders-1", "2026-11-26T01:00:00Z"),
            backup("other", "Running", "orders-0", "2026-11-26T01:00:00Z"),
            backup("later", "Running", "orders-1", "2026-11-26T03:00:00Z"),
            backup("mine", "Running", "orders-1", "2026-11-26T02:00:00Z"),
        ];
        assert_eq!(
            assigned(&backups, "orders-1"),
            Some(Request {
                name: "mine".into(),
                uid: "uid-mine".into(),
                method: BackupMethod::Physical,
            })
        );
        assert_eq!(assigned(&backups[..1], "orders-1"), None);
        assert_eq!(assigned(&backups, "orders-2"), None);
    }
}
