//! A new cluster's first primary restored from a base backup: the backup's
//! tar downloaded from the source cluster's folder in this cluster's bucket,
//! checked against its manifest, unpacked beside the data folder, then moved
//! into place with recovery.signal. PostgreSQL then replays the source's
//! archived WAL (restore_command, through this process) up to the target
//! and promotes itself to a new timeline; this cluster archives to its own
//! folder, never the source's.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use cairn_api::database::instance as contract;
use cairn_storage::{BackupId, BaseBackups, Manifest};

use super::Supervisor;
use super::folder::{remove_dir_if_present, sibling};
use crate::conf;
use crate::error::{Context, Error};
use crate::files::write_atomically;

impl Supervisor {
    /// The bucket a restore reads (the source cluster's folder in it).
    fn restore_bucket(&self) -> Result<cairn_storage::S3Settings, Error> {
        self.config
            .backup_destination()
            .context(|| "backup destination credentials".to_owned())?
            .ok_or_else(|| {
                Error::Setup(
                    "a restore reads the bucket of CAIRN_BACKUP_BUCKET, which is unset".to_owned(),
                )
            })
    }

    pub(super) async fn restore(&self) -> Result<(), Error> {
        let (source, id) = self.config.restore_source().ok_or_else(|| {
            Error::Setup(
                "told to restore a backup, but no source is configured (CAIRN_RESTORE_CLUSTER)"
                    .to_owned(),
            )
        })?;
        let settings = self.restore_bucket()?;
        // A verifying instance has no folder of its own: it archives nothing.
        if !self.config.verify {
            self.refuse_unless_own_folder_is_empty(&settings).await?;
        }
        let backups = BaseBackups::new(&settings, source);
        let manifest = match id {
            Some(id) => {
                let id = BackupId::parse(id).map_err(|e| Error::Setup(e.to_string()))?;
                let location = backups.location(&id);
                backups
                    .manifest(&id)
                    .await
                    .context(|| format!("reading the manifest of {location}"))?
                    .ok_or_else(|| {
                        Error::Refused(format!(
                            "{location} has no manifest: not a complete backup; refusing to start anything else in its place"
                        ))
                    })?
            }
            None => self.newest_backup(&backups, source).await?,
        };
        let id = BackupId::parse(&manifest.id).map_err(|e| Error::Setup(e.to_string()))?;
        let location = backups.location(&id);
        let target = sibling(&self.config.data_dir, "restore");
        remove_dir_if_present(&target)?;
        std::fs::create_dir_all(&target)
            .and_then(|()| {
                std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700))
            })
            .context(|| target.display().to_string())?;
        tracing::info!(%location, timeline = manifest.timeline, end = %manifest.end_lsn, "restoring a base backup");
        let started = Instant::now();
        for file in &manifest.files {
            if let Err(e) = unpack(&backups, &id, file, &target).await {
                let _ = remove_dir_if_present(&target);
                return Err(e);
            }
        }
        // Whatever the source was, this folder recovers, then is promoted.
        for signal in ["standby.signal", "recovery.signal"] {
            let _ = std::fs::remove_file(target.join(signal));
        }
        std::fs::write(target.join("recovery.signal"), "")
            .context(|| "recovery.signal".to_owned())?;
        // Durable before it is moved into place: once there, a folder is
        // never restored again, so a crash must not leave it torn.
        let mut sync = Command::new(self.config.program("initdb"));
        sync.arg("--sync-only").arg("--pgdata").arg(&target);
        let synced = self
            .children
            .run(&mut sync)
            .await
            .context(|| "cannot run initdb --sync-only".to_owned())?;
        if !synced.exit.success() {
            let _ = remove_dir_if_present(&target);
            return Err(Error::Program(format!(
                "syncing the restored folder failed ({}): {}",
                synced.exit,
                synced.output.trim()
            )));
        }
        tracing::info!(
            seconds = started.elapsed().as_secs_f64(),
            bytes = manifest.stored_bytes(),
            "base backup downloaded and unpacked"
        );
        self.move_into_place(&target, "restore")
    }

    /// A restored cluster archives into its own folder: one that already
    /// holds WAL or backups (a cluster of the same name restored before, or
    /// deleted) would mix two histories, and its history files would
    /// conflict for ever.
    async fn refuse_unless_own_folder_is_empty(
        &self,
        settings: &cairn_storage::S3Settings,
    ) -> Result<(), Error> {
        let own = self.config.cluster.as_deref().ok_or_else(|| {
            Error::Setup("a restore needs this cluster's name (CAIRN_CLUSTER)".to_owned())
        })?;
        let archive = cairn_storage::WalArchive::new(settings, own);
        let wal = archive
            .list()
            .await
            .context(|| format!("reading {}", archive.location()))?;
        let backups = BaseBackups::new(settings, own)
            .catalog()
            .await
            .context(|| "reading this cluster's catalog".to_owned())?;
        if !wal.is_empty() || !backups.is_empty() {
            return Err(Error::Refused(format!(
                "this cluster's folder already holds {} WAL files and {} backups (a cluster of \
                 the same name, restored or running before): restoring would mix two histories; \
                 give the new cluster another name or another prefix",
                wal.len(),
                backups.len()
            )));
        }
        Ok(())
    }

    /// The newest complete backup of `source` from the bucket's catalog
    /// (with a target time, the newest that completed before it; with a
    /// target LSN, the newest that ends at or before it).
    async fn newest_backup(&self, backups: &BaseBackups, source: &str) -> Result<Manifest, Error> {
        let before = match self.config.restore_target()? {
            conf::RecoveryTarget::Time(_) => self.config.restore_target_time.clone(),
            _ => None,
        };
        let catalog = backups
            .catalog()
            .await
            .context(|| format!("reading the catalog of {source}"))?;
        let up_to = self
            .config
            .restore_target_lsn
            .as_deref()
            .and_then(contract::parse_lsn);
        let ends_in_time = |m: &Manifest| {
            up_to.is_none_or(|lsn| contract::parse_lsn(&m.end_lsn).is_some_and(|end| end <= lsn))
        };
        let suitable = |m: &Manifest| {
            ends_in_time(m)
                && before.as_ref().is_none_or(|time| {
                    let (Ok(done), Ok(target)) = (
                        m.completed_at.parse::<k8s_openapi::jiff::Timestamp>(),
                        time.parse::<k8s_openapi::jiff::Timestamp>(),
                    ) else {
                        return false;
                    };
                    done <= target
                })
        };
        catalog.into_iter().rev().find(suitable).ok_or_else(|| {
            Error::Refused(format!(
                "no complete backup of cluster {source} in the bucket{}: nothing to restore, and \
                 nothing else is started in its place",
                before.map(|t| format!(" before {t}")).unwrap_or_default()
            ))
        })
    }
}

/// Streams one file of the backup through zstd and tar into `target`; an
/// error of the download (a checksum that differs from the manifest's) or
/// of the unpacking fails the restore.
async fn unpack(
    backups: &BaseBackups,
    id: &BackupId,
    file: &cairn_storage::StoredFile,
    target: &Path,
) -> Result<(), Error> {
    let (reader, writer) = std::io::pipe().context(|| "a pipe for the backup's tar".to_owned())?;
    let folder = target.to_path_buf();
    let unpacking = tokio::task::spawn_blocking(move || {
        let mut archive = tar::Archive::new(reader);
        archive.set_preserve_permissions(true);
        archive.set_overwrite(false);
        archive.unpack(&folder)
    });
    let downloaded = backups.download(id, file, writer).await;
    let unpacked = unpacking
        .await
        .map_err(std::io::Error::other)
        .and_then(|result| result);
    // The unpacking's error says more than the broken pipe it causes.
    unpacked.context(|| format!("unpacking {}", file.name))?;
    downloaded.map_err(|e| Error::Storage(format!("downloading {}: {e}", file.name)))
}

/// A file in the data folder that says the dump of a logical restore is
/// loaded (its content: the backup's id), so a restart never loads it again.
const DUMP_LOADED: &str = "cairn-dump-loaded";

impl Supervisor {
    /// Whether this primary restores a logical backup it has not loaded yet.
    pub(super) fn dump_pending(&self) -> bool {
        self.config.restore_logical && !self.config.data_dir.join(DUMP_LOADED).exists()
    }

    /// Loads the logical backup into the application database, once its
    /// roles exist: `true` once done. A failure is reported and tried again
    /// later (the caller backs off); the load is one transaction, committed
    /// only once the whole dump passed its checksum, so a failed one leaves
    /// nothing behind. The instance counts as alive while it loads (its
    /// server is busy restoring, not stuck).
    pub(super) async fn load_dump(&self) -> bool {
        let load = self.try_load_dump();
        tokio::pin!(load);
        let mut alive = tokio::time::interval(self.config.poll());
        let result = loop {
            tokio::select! {
                result = &mut load => break result,
                _ = alive.tick() => self.state.answered(),
            }
        };
        match result {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(message = %error, "cannot load the logical backup");
                self.state
                    .failed_saying(&error, format!("loading the logical backup: {error}"));
                false
            }
        }
    }

    async fn try_load_dump(&self) -> Result<(), Error> {
        let Some((source, Some(id))) = self.config.restore_source() else {
            return Err(Error::Setup(
                "a logical restore needs the source cluster and the backup's id \
                 (CAIRN_RESTORE_CLUSTER, CAIRN_RESTORE_BACKUP_ID)"
                    .into(),
            ));
        };
        let id = BackupId::parse(id).map_err(|e| Error::Setup(e.to_string()))?;
        if self.app_database_has_relations().await? {
            // A load committed before the process could record it: the
            // database is never written otherwise until it is ready.
            tracing::info!("the logical backup was loaded before a restart: recording it");
            return self.record_dump_loaded(&id);
        }
        let settings = self.restore_bucket()?;
        let dumps = BaseBackups::dumps(&settings, source);
        let location = dumps.location(&id);
        let manifest = dumps
            .manifest(&id)
            .await
            .context(|| format!("reading the manifest of {location}"))?
            .ok_or_else(|| {
                Error::Refused(format!(
                    "{location} has no manifest: not a complete logical backup"
                ))
            })?;
        let file = manifest
            .files
            .iter()
            .find(|f| f.name == cairn_storage::layout::DUMP_DATA)
            .ok_or_else(|| Error::Refused(format!("the manifest of {location} lists no dump")))?;
        tracing::info!(%location, bytes = file.bytes, "loading a logical backup");
        let mut command = self.restore_command()?;
        let mut child = self
            .children
            .spawn_fed(&mut command)
            .context(|| "cannot start pg_restore".to_owned())?;
        let stdin = Arc::new(std::sync::Mutex::new(child.stdin.take()));
        let mut stderr = child
            .stderr
            .take()
            .ok_or_else(|| Error::Program("pg_restore has no stderr".to_owned()))?;
        let log = tokio::task::spawn_blocking(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
            text
        });
        // pg_restore commits at the end of its input: its stdin is held
        // open until the download passed its size and checksum, and a
        // damaged dump stops pg_restore before its input ends.
        let downloaded = dumps.download(&id, file, Held(stdin.clone())).await;
        if let Err(e) = downloaded {
            child.stop().await;
            drop(stdin);
            let log = log.await.unwrap_or_default();
            return Err(Error::Storage(format!(
                "{location}: {} {}",
                e.summary(),
                restore_errors(&log)
            )));
        }
        drop(stdin.lock().map(|mut held| held.take()));
        let exit = child.wait().await;
        let log = log.await.unwrap_or_default();
        if !exit.success() {
            return Err(Error::Program(format!(
                "pg_restore failed ({exit}): {}",
                restore_errors(&log)
            )));
        }
        self.record_dump_loaded(&id)?;
        tracing::info!(%location, "logical backup loaded");
        Ok(())
    }

    fn record_dump_loaded(&self, id: &BackupId) -> Result<(), Error> {
        write_atomically(&self.config.data_dir.join(DUMP_LOADED), id.as_str(), 0o600)
    }

    /// Whether the application database holds any relation of its own.
    async fn app_database_has_relations(&self) -> Result<bool, Error> {
        let database = self
            .config
            .credential(contract::DATABASE_KEY)
            .context(|| format!("credentials ({})", contract::DATABASE_KEY))?;
        let mut config = self.superuser("127.0.0.1", self.config.port)?;
        config.dbname(&database);
        let (client, connection) = config
            .connect(tokio_postgres::NoTls)
            .await
            .context(|| format!("connecting to database {database}"))?;
        tokio::spawn(connection);
        let row = client
            .query_one(
                "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') \
                 AND n.nspname NOT LIKE 'pg_toast%'",
                &[],
            )
            .await
            .context(|| format!("looking into database {database}"))?;
        Ok(row.get::<_, i64>(0) > 0)
    }

    /// pg_restore into the application database, as the superuser over
    /// loopback, in one transaction; every object owned by the database's
    /// owner (the source's owners and grants name roles this cluster may
    /// not have).
    fn restore_command(&self) -> Result<Command, Error> {
        let owner = self
            .config
            .credential(contract::OWNER_KEY)
            .context(|| format!("credentials ({})", contract::OWNER_KEY))?;
        let mut command = self.config.superuser_tool("pg_restore", "cairn-restore")?;
        command
            .args(["--single-transaction", "--exit-on-error"])
            .args(["--no-owner", "--no-privileges", "--role", &owner]);
        Ok(command)
    }
}

/// pg_restore's stdin, shared so that dropping the writer given to the
/// download does not close it (which would let pg_restore commit).
struct Held(Arc<std::sync::Mutex<Option<std::process::ChildStdin>>>);

impl std::io::Write for Held {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut held = self
            .0
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?;
        match held.as_mut() {
            Some(stdin) => stdin.write(buf),
            None => Err(std::io::ErrorKind::BrokenPipe.into()),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let mut held = self
            .0
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?;
        held.as_mut().map_or(Ok(()), std::io::Write::flush)
    }
}

/// The last lines of pg_restore's errors, without the lines that quote
/// the data or the command that failed (they end up in Events and the
/// Lease).
fn restore_errors(log: &str) -> String {
    let lines: Vec<&str> = log
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .filter(|l| {
            !["DETAIL:", "CONTEXT:", "Command was:", "LINE "]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .collect();
    lines[lines.len().saturating_sub(3)..].join(" / ")
}
