//! The data folder: made ready to start in a role (used as it is, or
//! bootstrapped by initdb, a clone of the primary or a restore, or cloned
//! again), always in a sibling folder first so a folder that is there is
//! complete; and the space left on its volume.

use std::path::{Path, PathBuf};
use std::process::Command;

use cairn_api::database::instance as contract;

use super::upstream::Slot;
use super::wal::ControlData;
use super::{Supervisor, last_lines};
use crate::error::{Context, Error};
use crate::files::sync_parent;
use crate::membership::Bootstrap;
use crate::observe::Role;
use crate::state::Phase;

impl Supervisor {
    /// Makes the data folder ready to start in `role`; a replica's folder
    /// that cannot follow the primary any more is cloned again if `reclone`
    /// says why.
    pub(super) async fn prepare(&self, role: Role, reclone: Option<String>) -> Result<(), Error> {
        let data = &self.config.data_dir;
        std::fs::create_dir_all(&self.config.run_dir)
            .context(|| format!("run folder {}", self.config.run_dir.display()))?;
        remove_stale_lock_file(
            &self
                .config
                .run_dir
                .join(format!(".s.PGSQL.{}.lock", self.config.port)),
        );
        self.tls.install(&self.tls.read()?)?;
        if role == Role::Replica {
            self.write_passwords()?;
        }
        match data_folder(data)? {
            DataFolder::Existing => {
                tracing::info!(data = %data.display(), %role, "starting from the existing data folder");
                remove_stale_lock_file(&data.join("postmaster.pid"));
                let why = reclone.or_else(|| {
                    rewind_marker(data).exists().then(|| {
                        "pg_rewind did not finish, so the folder may be inconsistent".to_owned()
                    })
                });
                if role == Role::Replica
                    && let Some(why) = why
                {
                    self.state.phase(Phase::Bootstrapping);
                    self.reclone(&why).await?;
                } else if role == Role::Replica {
                    let control = self.control_data().await?;
                    if control.was_primary {
                        self.rewind_or_reclone(control.timeline).await?;
                    }
                } else {
                    // Never promoted from a folder pg_rewind left half done.
                    refuse_after_interrupted_rewind(data)?;
                }
            }
            DataFolder::Absent => {
                let bootstrap = self.assignment.borrow().bootstrap;
                if role == Role::Primary && bootstrap.is_none() {
                    return Err(Error::Refused(format!(
                        "the data folder {} is empty but the cluster was initialised: refusing \
                         to run initdb over it (its data lives in the replicas; the controller \
                         fails over to one)",
                        data.display()
                    )));
                }
                self.state.phase(Phase::Bootstrapping);
                match (role, bootstrap) {
                    // A dump is loaded once the new server runs (`load_dump`).
                    (Role::Primary, Some(Bootstrap::Restore)) if self.config.restore_logical => {
                        self.initdb().await?
                    }
                    (Role::Primary, Some(Bootstrap::Restore)) => self.restore().await?,
                    (Role::Primary, _) => self.initdb().await?,
                    (Role::Replica, _) => self.clone_primary().await?,
                }
            }
        }
        if role == Role::Replica
            && let Err(message) = self.reserve_slot().await
        {
            // Streaming waits for the slot; the watch loop tries again.
            tracing::warn!(%message, "no replication slot yet");
        }
        self.write_conf(role)?;
        // A primary's folder that holds standby.signal keeps it: it starts in
        // recovery and is promoted (a new timeline), never just restarted.
        if role == Role::Replica {
            std::fs::write(data.join("standby.signal"), "")
                .context(|| "standby.signal".to_owned())?;
        }
        Ok(())
    }

    /// What the folder's control file says (pg_controldata).
    pub(super) async fn control_data(&self) -> Result<ControlData, Error> {
        let data = &self.config.data_dir;
        let mut controldata = Command::new(self.config.program("pg_controldata"));
        controldata.arg(data).env("LC_ALL", "C");
        let output = self
            .children
            .run(&mut controldata)
            .await
            .context(|| "cannot run pg_controldata".to_owned())?;
        ControlData::parse(&output.output, data.join("backup_label").exists()).ok_or_else(|| {
            Error::Program(format!("pg_controldata: {}", last_lines(&output.output, 2)))
        })
    }

    /// A replica the primary can no longer feed: a new base backup into a
    /// fresh folder. The current folder is kept beside it until the new one
    /// streams (see `forget_previous_folder`).
    pub(super) async fn reclone(&self, why: &str) -> Result<(), Error> {
        tracing::warn!(
            "{why}: cloning the replica again, keeping the folder aside until the clone streams"
        );
        self.state.metrics.reclones.inc();
        self.drop_lost_slot().await?;
        if self.reserve_slot().await? == Slot::Lost {
            return Err(Error::Waiting(
                "the lost replication slot is still in use on the primary".to_owned(),
            ));
        }
        let data = &self.config.data_dir;
        let previous = sibling(data, "previous");
        let target = sibling(data, "clone");
        self.clone_into(&target).await?;
        // A kept previous folder means the current one never streamed: it
        // goes, the previous one stays until a clone works.
        if previous.exists() {
            remove_dir_if_present(data)?;
        } else {
            std::fs::rename(data, &previous)
                .context(|| format!("moving {} aside", data.display()))?;
        }
        self.move_into_place(&target, "pg_basebackup")
    }

    /// Once the folder streams, the one it replaced is not needed.
    pub(super) fn forget_previous_folder(&self) {
        let previous = sibling(&self.config.data_dir, "previous");
        if previous.exists() {
            match remove_dir_if_present(&previous) {
                Ok(()) => {
                    tracing::info!(folder = %previous.display(), "the new clone streams: removed the folder it replaced")
                }
                Err(message) => tracing::warn!(%message, "cannot remove the replaced folder"),
            }
        }
    }

    pub(super) async fn initdb(&self) -> Result<(), Error> {
        let target = sibling(&self.config.data_dir, "initdb");
        let superuser_password = self
            .config
            .credentials_dir
            .join(contract::SUPERUSER_PASSWORD_KEY);
        if !superuser_password.exists() {
            return Err(Error::Setup(format!(
                "cannot initialise a primary: no superuser password at {}",
                superuser_password.display()
            )));
        }
        tracing::info!(data = %self.config.data_dir.display(), "initialising a new primary (initdb)");
        let mut initdb = Command::new(self.config.program("initdb"));
        initdb
            .arg("--pgdata")
            .arg(&target)
            .args(["--username=postgres", "--encoding=UTF8", "--no-locale"])
            .args(["--auth-local=peer", "--auth-host=scram-sha-256"])
            .arg("--data-checksums")
            .arg("--no-instructions")
            .arg(format!("--pwfile={}", superuser_password.display()));
        self.run_in(&mut initdb, &target, "initdb").await?;
        self.move_into_place(&target, "initdb")
    }

    async fn clone_primary(&self) -> Result<(), Error> {
        let target = sibling(&self.config.data_dir, "clone");
        self.clone_into(&target).await?;
        self.move_into_place(&target, "pg_basebackup")
    }

    async fn clone_into(&self, target: &Path) -> Result<(), Error> {
        let host = self.primary_host()?;
        let user = self.credential(contract::REPLICATION_USER_KEY)?;
        tracing::info!(%host, port = self.config.primary_port, "cloning the primary (pg_basebackup)");
        let mut basebackup = Command::new(self.config.program("pg_basebackup"));
        basebackup
            .arg("--pgdata")
            .arg(target)
            .args([
                "--host",
                &host,
                "--port",
                &self.config.primary_port.to_string(),
            ])
            .args(["--username", &user, "--no-password"])
            .args(["--wal-method=stream", "--checkpoint=fast"])
            .env("PGPASSFILE", self.passfile())
            .env("PGCONNECT_TIMEOUT", "10")
            .envs(self.tls.client_settings().map(|(key, value)| match key {
                "sslmode" => ("PGSSLMODE", value),
                _ => ("PGSSLROOTCERT", value),
            }));
        self.run_in(&mut basebackup, target, "pg_basebackup").await
    }

    /// Runs a program that fills `target`, a folder beside the data folder.
    async fn run_in(&self, command: &mut Command, target: &Path, what: &str) -> Result<(), Error> {
        remove_dir_if_present(target)?;
        let output = self
            .children
            .run(command)
            .await
            .context(|| format!("cannot run {what}"))?;
        if !output.exit.success() {
            let _ = remove_dir_if_present(target);
            return Err(Error::Program(format!(
                "{what} failed ({}): {}",
                output.exit,
                last_lines(&output.output, 3)
            )));
        }
        Ok(())
    }

    /// Moves a complete `target` to the data folder: a folder that is there
    /// is always complete.
    pub(super) fn move_into_place(&self, target: &Path, what: &str) -> Result<(), Error> {
        let data = &self.config.data_dir;
        // A marker left with a folder an operator removed says nothing of this one.
        remove_if_present(&rewind_marker(data))?;
        if data.exists() {
            // An empty folder, or `data_folder` would have refused.
            std::fs::remove_dir(data).context(|| data.display().to_string())?;
        }
        std::fs::rename(target, data)
            .and_then(|()| sync_parent(data))
            .context(|| format!("moving {} to {}", target.display(), data.display()))?;
        tracing::info!(data = %data.display(), "{what} done");
        Ok(())
    }

    /// Records the data volume's space; says so when it is nearly full
    /// (less than a WAL segment, or 2 %, free).
    pub(super) fn check_volume(&self) -> Option<String> {
        let data = &self.config.data_dir;
        let folder = if data.exists() {
            data.as_path()
        } else {
            data.parent()?
        };
        let stats = nix::sys::statvfs::statvfs(folder).ok()?;
        let block = stats.fragment_size() as u64;
        let free = stats.blocks_available() as u64 * block;
        let total = stats.blocks() as u64 * block;
        self.state.metrics.volume_free.set(free as i64);
        self.state.metrics.volume_size.set(total as i64);
        self.state.update(|s| {
            s.data_volume_free_bytes = Some(free);
            s.data_volume_bytes = Some(total);
        });
        const MIB: u64 = 1024 * 1024;
        (free < (16 * MIB).max(total / 50)).then(|| {
            format!(
                "the data volume is nearly full: {} MiB free of {} MiB",
                free / MIB,
                total / MIB
            )
        })
    }
}

enum DataFolder {
    Existing,
    Absent,
}

/// An existing data folder is used as it is; an absent or empty one is
/// bootstrapped; anything else is refused, never overwritten.
fn data_folder(data: &Path) -> Result<DataFolder, Error> {
    if data.join("PG_VERSION").exists() {
        return Ok(DataFolder::Existing);
    }
    match std::fs::read_dir(data) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(DataFolder::Absent),
        Err(e) => Err(Error::Io {
            what: format!("data folder {}", data.display()),
            source: e,
        }),
        Ok(mut entries) => match entries.next() {
            None => Ok(DataFolder::Absent),
            Some(_) => Err(Error::Refused(format!(
                "data folder {} is not empty but holds no PG_VERSION: refusing to initialise over it",
                data.display()
            ))),
        },
    }
}

/// Beside the data folder (pg_rewind removes what its source lacks): there
/// while pg_rewind may be rewriting the folder.
pub(super) fn rewind_marker(data: &Path) -> PathBuf {
    sibling(data, "rewinding")
}

/// PostgreSQL: a folder whose pg_rewind failed midway "is likely not in a
/// state that can be recovered". It is kept, never started.
fn refuse_after_interrupted_rewind(data: &Path) -> Result<(), Error> {
    let marker = rewind_marker(data);
    if marker.exists() {
        return Err(Error::Refused(format!(
            "pg_rewind of {} did not finish, so the folder may be inconsistent: it is kept and \
             not started. Move it away (or delete its volume) for a new clone from the primary; \
             then remove {}",
            data.display(),
            marker.display()
        )));
    }
    Ok(())
}

/// A folder beside the data folder, on the same filesystem (so a rename moves it).
pub(super) fn sibling(data: &Path, suffix: &str) -> PathBuf {
    let mut name = data.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{suffix}"));
    data.with_file_name(name)
}

pub(super) fn remove_if_present(file: &Path) -> Result<(), Error> {
    absent_is_fine(std::fs::remove_file(file), file)
}

pub(super) fn remove_dir_if_present(dir: &Path) -> Result<(), Error> {
    absent_is_fine(std::fs::remove_dir_all(dir), dir)
}

/// A path already gone is what removing it wanted.
fn absent_is_fine(removed: std::io::Result<()>, path: &Path) -> Result<(), Error> {
    match removed {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).context(|| path.display().to_string())
        }
        _ => Ok(()),
    }
}

/// A lock file left by a postgres that no longer runs (the container
/// restarted): postmaster.pid in the data folder, or the socket's lock in the
/// run folder, which outlives the container too. The pid in its first line
/// may now belong to another process, typically one of this program's own
/// threads (a new container numbers from 1 again, and `kill(pid, 0)` answers
/// for a thread id), which makes postgres refuse to start, again and again.
/// A lock whose pid is a running postgres stays.
fn remove_stale_lock_file(path: &Path) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return;
    };
    let pid = text.lines().next().unwrap_or_default().trim();
    let running = !pid.is_empty()
        && std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|comm| comm.trim() == "postgres");
    if !running {
        tracing::info!(pid, file = %path.display(), "removing a stale lock file");
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_file_is_removed_unless_a_running_postgres_holds_it() {
        let dir = std::env::temp_dir().join(format!("cairn-instance-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_default();
        let lock = dir.join(".s.PGSQL.5432.lock");
        // This process is alive but no postgres: what a restarted container's
        // own thread looks like to postgres.
        for pid in [
            std::process::id().to_string(),
            "999999999".to_owned(),
            String::new(),
        ] {
            std::fs::write(&lock, format!("{pid}\n/var/lib/postgresql/data\n")).unwrap_or_default();
            remove_stale_lock_file(&lock);
            assert!(!lock.exists(), "a lock of pid {pid:?} stayed");
        }
        remove_stale_lock_file(&lock);
        assert!(!lock.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn new_folders_are_made_beside_the_data_folder() {
        assert_eq!(
            sibling(Path::new("/d/pgdata"), "clone"),
            Path::new("/d/pgdata.clone")
        );
    }

    #[test]
    fn a_foreign_folder_is_refused() {
        let dir = std::env::temp_dir().join(format!("cairn-instance-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(matches!(data_folder(&dir), Ok(DataFolder::Absent)));
        std::fs::create_dir_all(&dir).unwrap_or_default();
        assert!(matches!(data_folder(&dir), Ok(DataFolder::Absent)));
        std::fs::write(dir.join("notes.txt"), "mine").unwrap_or_default();
        let refused = data_folder(&dir).err();
        assert!(
            matches!(&refused, Some(Error::Refused(why)) if why.contains("refusing")),
            "{refused:?}"
        );
        std::fs::write(dir.join("PG_VERSION"), "15").unwrap_or_default();
        assert!(matches!(data_folder(&dir), Ok(DataFolder::Existing)));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
