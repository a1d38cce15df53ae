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
use std::time::{Duration, Instant};

use cairn_api::backup::v1::{Backup, BackupMethod, BackupPhase};
use cairn_api::database::instance::{self as contract, BackupProgress, BackupProgressPhase};
use cairn_storage::layout::{BASE_BACKUP_DATA, DUMP_DATA};
use cairn_storage::{BackupId, BaseBackups, Manifest, WalArchive, WalName};
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, ResourceExt};
use tokio::sync::watch;

use crate::children::Children;
use crate::config::Config;
use crate::error::{Context, Error};
use crate::observe::Role;
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
    /// The cluster's WAL archive: a base backup is complete once the WAL
    /// it ends in is there.
    pub archive: WalArchive,
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
                failed(request, id.as_str(), message.to_string())
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
    ) -> Result<Manifest, Error> {
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
            .context(|| format!("cannot start {program}"))?;
        let piped = |what: &str| Error::Program(format!("no {what}"));
        let stdout = child.stdout.take().ok_or_else(|| piped("stdout"))?;
        let mut stderr = child.stderr.take().ok_or_else(|| piped("stderr"))?;
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
        let file = uploaded?;
        if !exit.success() {
            // What it wrote before failing was stored (its stdout closed):
            // no manifest makes it a backup, but it is removed all the same.
            let _ = store.delete(id).await;
            return Err(Error::Program(format!(
                "{program} failed ({exit}): {}",
                last_lines(&log, 3)
            )));
        }
        let range = match method {
            BackupMethod::Physical => WalRange::parse(&log).ok_or_else(|| {
                Error::Program(format!(
                    "pg_basebackup did not report its WAL range: {}",
                    last_lines(&log, 3)
                ))
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
        if method == BackupMethod::Physical
            && let Err(message) = self.until_end_archived(id, &range).await
        {
            let _ = store.delete(id).await;
            return Err(message);
        }
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
        store.write_manifest(&manifest).await?;
        Ok(manifest)
    }

    /// Waits until the archive holds the WAL file the backup ends in and
    /// a record after its end, so that the backup restores from the bucket
    /// alone. A restore to the end of the backup (`recovery_target =
    /// immediate`) stops at the first record it reads once consistent: the
    /// tar's copy of the last WAL file ends with the backup's last record
    /// when nothing was written since (an idle primary, a backup from its
    /// standby), and that restore fails. So, as pgBackRest and Barman do,
    /// the primary writes a restore point and switches WAL files, and the
    /// manifest is written only once the files from the backup's end to
    /// that switch are archived (the Backup's deadline bounds the wait).
    async fn until_end_archived(&self, id: &BackupId, range: &WalRange) -> Result<(), Error> {
        let end = contract::parse_lsn(&range.end)
            .ok_or_else(|| Error::Program(format!("not an LSN: {}", range.end)))?;
        let mut attempt = 0;
        let switched = loop {
            match self.switch_primary_wal(id).await {
                Ok(name) => break name,
                Err(e) if attempt < SWITCH_ATTEMPTS => {
                    attempt += 1;
                    tracing::warn!(error = %e, "cannot make the primary switch WAL files; retrying");
                    tokio::time::sleep(self.config.poll().max(Duration::from_secs(1))).await;
                }
                Err(e) => {
                    return Err(e).context(|| "the backup's end cannot be archived".to_owned());
                }
            }
        };
        let mut waiting = needed_segments(range.timeline, end, &switched)?;
        let first = waiting
            .first()
            .map(|w| w.names[0].to_string())
            .unwrap_or_default();
        tracing::info!(%first, last = %switched, "waiting until the WAL the backup ends in is archived");
        while !waiting.is_empty() {
            let mut still = Vec::new();
            for segment in waiting {
                let mut archived = false;
                for name in &segment.names {
                    archived |= self.archive.contains(name).await?;
                }
                if !archived {
                    still.push(segment);
                }
            }
            waiting = still;
            if !waiting.is_empty() {
                tokio::time::sleep(self.config.poll().min(Duration::from_secs(1))).await;
            }
        }
        Ok(())
    }

    /// On the primary (this server when it is the primary): a restore
    /// point named after the backup (a record after the backup's end, even
    /// when nothing else was written), then a switch to a new WAL file.
    /// The name of the WAL file the switch completed.
    async fn switch_primary_wal(&self, id: &BackupId) -> Result<String, Error> {
        let password = self
            .config
            .credential(contract::SUPERUSER_PASSWORD_KEY)
            .context(|| "superuser credentials".to_owned())?;
        let local = self.state.status().role == Some(Role::Primary);
        let host = if local {
            "127.0.0.1".to_owned()
        } else {
            self.config
                .primary_host()
                .ok_or_else(|| Error::Setup("no primary host to switch WAL files on".to_owned()))?
        };
        let mut config = tokio_postgres::Config::new();
        config
            .host(&host)
            .port(if local {
                self.config.port
            } else {
                self.config.primary_port
            })
            .user("postgres")
            .password(password)
            .dbname("postgres")
            .application_name("cairn-backup")
            .options("-c statement_timeout=10000")
            .connect_timeout(Duration::from_secs(10));
        let client = if local {
            let (client, connection) = config
                .connect(tokio_postgres::NoTls)
                .await
                .context(|| "connecting to this server".to_owned())?;
            tokio::spawn(connection);
            client
        } else {
            let tls =
                crate::tls::Tls::new(&self.config.tls_dir, &self.config.run_dir).connector()?;
            let (client, connection) = config
                .ssl_mode(tokio_postgres::config::SslMode::Require)
                .connect(tls)
                .await
                .context(|| format!("connecting to the primary {host}"))?;
            tokio::spawn(connection);
            client
        };
        let point: String = format!("cairn-backup-{id}").chars().take(63).collect();
        client
            .execute("SELECT pg_create_restore_point($1)", &[&point])
            .await
            .context(|| format!("writing a restore point on {host}"))?;
        let row = client
            .query_one("SELECT pg_walfile_name(pg_switch_wal())", &[])
            .await
            .context(|| format!("switching WAL files on {host}"))?;
        Ok(row.get(0))
    }

    /// pg_dump of the application database, custom format uncompressed
    /// (zstd compresses it on its way to the bucket), as the superuser over
    /// loopback. On a standby it reads one snapshot of the replica; a
    /// replay conflict that cancels it fails the backup with PostgreSQL's
    /// words.
    fn dump_command(&self) -> Result<Command, Error> {
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
    fn basebackup_command(&self) -> Result<Command, Error> {
        let credential = |key: &str| {
            self.config
                .credential(key)
                .context(|| "replication credentials".to_owned())
        };
        let user = credential(contract::REPLICATION_USER_KEY)?;
        let password = credential(contract::REPLICATION_PASSWORD_KEY)?;
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

/// How many times the switch on the primary is tried again before the
/// backup fails.
const SWITCH_ATTEMPTS: u32 = 5;

/// 16 MiB WAL files: 256 per log file.
const SEGMENT_BYTES: u64 = 16 * 1024 * 1024;

/// One WAL file to wait for, under the names it may be archived as (the
/// backup's timeline, or the primary's when it is on a later one).
#[derive(Debug, PartialEq, Eq)]
struct Needed {
    names: Vec<WalName>,
}

/// The WAL files from the one holding `end` (where the next record starts)
/// to `switched`, the file the primary's switch completed (on its
/// timeline; a file before the backup's end when the primary had
/// nothing to switch).
fn needed_segments(timeline: u32, end: u64, switched: &str) -> Result<Vec<Needed>, Error> {
    let invalid = || Error::Program(format!("not a WAL file name: {switched}"));
    let part = |range: std::ops::Range<usize>| {
        switched
            .get(range)
            .and_then(|p| u64::from_str_radix(p, 16).ok())
    };
    if switched.len() != 24 {
        return Err(invalid());
    }
    let primary_timeline = part(0..8).ok_or_else(invalid)?;
    let last = part(8..16).ok_or_else(invalid)? * 256 + part(16..24).ok_or_else(invalid)?;
    let first = end / SEGMENT_BYTES;
    (first..=last.max(first))
        .map(|segment| {
            let mut timelines = vec![u64::from(timeline)];
            if primary_timeline != u64::from(timeline) {
                timelines.push(primary_timeline);
            }
            let names = timelines
                .into_iter()
                .map(|t| {
                    WalName::parse(&format!(
                        "{t:08X}{:08X}{:08X}",
                        segment / 256,
                        segment % 256
                    ))
                    .map_err(|e| Error::Program(e.to_string()))
                })
                .collect::<Result<_, _>>()?;
            Ok(Needed { names })
        })
        .collect()
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

    #[test]
    fn the_wal_to_wait_for_runs_from_the_backups_end_to_the_switched_file() {
        let names = |needed: Vec<Needed>| -> Vec<Vec<String>> {
            needed
                .into_iter()
                .map(|n| n.names.iter().map(ToString::to_string).collect())
                .collect()
        };
        // The backup ends in file 3, the switch completed file 3.
        let end = contract::parse_lsn("0/3048AE8").expect("lsn");
        assert_eq!(
            names(needed_segments(1, end, "000000010000000000000003").expect("needed")),
            [["000000010000000000000003"]]
        );
        // The primary was ahead: every file from the end's to the switched.
        assert_eq!(
            names(needed_segments(1, end, "000000010000000000000005").expect("needed")),
            [
                ["000000010000000000000003"],
                ["000000010000000000000004"],
                ["000000010000000000000005"]
            ]
        );
        // The end at a file's first byte: the next record is in that file,
        // even if the switch (nothing to switch) names the one before.
        let boundary = contract::parse_lsn("1/00000000").expect("lsn");
        assert_eq!(
            names(needed_segments(2, boundary, "0000000200000000000000FF").expect("needed")),
            [["000000020000000100000000"]]
        );
        // The primary on a later timeline: either name will do.
        assert_eq!(
            names(needed_segments(1, end, "000000020000000000000003").expect("needed")),
            [["000000010000000000000003", "000000020000000000000003"]]
        );
        assert!(needed_segments(1, end, "not a file").is_err());
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
