//! A new cluster's first primary restored from a base backup: the backup's
//! tar downloaded from the source cluster's folder in this cluster's bucket,
//! checked against its manifest, unpacked beside the data folder, then moved
//! into place with recovery.signal. PostgreSQL then replays the source's
//! archived WAL (restore_command, through this process) up to the target
//! and promotes itself to a new timeline; this cluster archives to its own
//! folder, never the source's.

use std::os::unix::fs::PermissionsExt;

use cairn_storage::{BackupId, BaseBackups, Manifest};

use super::folder::{remove_dir_if_present, sibling};
use super::*;

impl Supervisor {
    pub(super) async fn restore(&self) -> Result<(), Error> {
        let (source, id) = self.config.restore_source().ok_or_else(|| {
            Error::Setup(
                "told to restore a backup, but no source is configured (CAIRN_RESTORE_CLUSTER)"
                    .to_owned(),
            )
        })?;
        let settings = self
            .config
            .backup_destination()
            .context(|| "backup destination credentials".to_owned())?
            .ok_or_else(|| {
                Error::Setup(
                    "a restore reads the bucket of CAIRN_BACKUP_BUCKET, which is unset".to_owned(),
                )
            })?;
        self.refuse_unless_own_folder_is_empty(&settings).await?;
        let backups = BaseBackups::new(&settings, source);
        let manifest = match id {
            Some(id) => {
                let id = BackupId::parse(id).map_err(|e| Error::Setup(e.to_string()))?;
                let location = backups.location(&id);
                backups
                    .manifest(&id)
                    .await
                    .map_err(|e| Error::Program(format!("reading the manifest of {location}: {}", e.summary())))?
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
        let wal = archive.list().await.map_err(|e| {
            Error::Program(format!("reading {}: {}", archive.location(), e.summary()))
        })?;
        let backups = BaseBackups::new(settings, own)
            .catalog()
            .await
            .map_err(|e| {
                Error::Program(format!("reading this cluster's catalog: {}", e.summary()))
            })?;
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
        let before = match self.config.restore_target().map_err(Error::Setup)? {
            conf::RecoveryTarget::Time(_) => self.config.restore_target_time.clone(),
            _ => None,
        };
        let catalog = backups.catalog().await.map_err(|e| {
            Error::Program(format!("reading the catalog of {source}: {}", e.summary()))
        })?;
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
    downloaded.map_err(|e| Error::Program(format!("downloading {}: {e}", file.name)))
}
