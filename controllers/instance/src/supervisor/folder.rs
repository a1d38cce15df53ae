//! The data folder: what it holds, and making it: initdb, a clone of the
//! primary (pg_basebackup), a rewind (pg_rewind), always into a sibling
//! folder first so a folder that is there is complete.

use std::collections::BTreeSet;

use super::upstream::history_timeline;
use super::*;

impl Supervisor {
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

    /// Rewinds a former primary's folder to where its history and the current
    /// primary's part, so it can follow the new timeline without a new base
    /// backup (needs wal_log_hints or checksums: the controller sets the first,
    /// initdb here the second). Writes nothing if no rewind is needed.
    /// `Some(why)` when pg_rewind cannot do it, ever: the folder is cloned
    /// again instead. After a rewind the marker is left for the caller.
    pub(super) async fn rewind(&self, host: &str) -> Result<Option<String>, Error> {
        let port = self.config.primary_port.to_string();
        let passfile = self.passfile().display().to_string();
        let tls = self.tls.client_settings();
        let mut pairs = vec![
            ("host", host),
            ("port", &port),
            ("user", "postgres"),
            ("dbname", "postgres"),
            ("passfile", &passfile),
            ("connect_timeout", "10"),
        ];
        pairs.extend(tls.iter().map(|(key, value)| (*key, value.as_str())));
        let source = conf::conninfo(&pairs);
        tracing::info!(%host, "the folder was a primary's: rewinding it to follow the current primary (pg_rewind)");
        self.state.phase(Phase::Rewinding);
        // pg_rewind first recovers a folder that was not shut down cleanly,
        // in single-user mode, which refuses a standby's folder.
        remove_if_present(&self.config.data_dir.join("standby.signal"))?;
        let marker = rewind_marker(&self.config.data_dir);
        std::fs::write(&marker, "")
            .and_then(|()| sync_parent(&marker))
            .context(|| marker.display().to_string())?;
        let mut rewind = Command::new(self.config.program("pg_rewind"));
        rewind
            .env("LC_ALL", "C") // `rewind_started` reads its English output
            .arg("--target-pgdata")
            .arg(&self.config.data_dir)
            .arg(format!("--source-server={source}"));
        let output = match self.children.run(&mut rewind).await {
            Ok(output) => output,
            Err(e) => {
                remove_if_present(&marker)?;
                return Err(Error::Io {
                    what: "cannot run pg_rewind".to_owned(),
                    source: e,
                });
            }
        };
        if !output.exit.success() {
            let failed = Error::Program(format!(
                "pg_rewind failed ({}): {}",
                output.exit,
                last_lines(&output.output, 3)
            ));
            // Only a failure before it changed anything may be retried.
            if !rewind_started(&output.output) {
                remove_if_present(&marker)?;
                if lacks_own_wal(&output.output) {
                    return Ok(Some(format!(
                        "pg_rewind cannot read this folder's WAL back to the last checkpoint \
                         both servers share (recycled since): {}",
                        last_lines(&output.output, 1)
                    )));
                }
            }
            return Err(failed);
        }
        // The marker stays until the caller has checked the WAL the folder
        // must replay: a folder that cannot catch up is cloned, even when
        // the process restarts meanwhile.
        tracing::info!(output = %last_lines(&output.output, 1), "pg_rewind done");
        Ok(None)
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

    pub(super) async fn clone_primary(&self) -> Result<(), Error> {
        let target = sibling(&self.config.data_dir, "clone");
        self.clone_into(&target).await?;
        self.move_into_place(&target, "pg_basebackup")
    }

    pub(super) async fn clone_into(&self, target: &Path) -> Result<(), Error> {
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
    pub(super) async fn run_in(
        &self,
        command: &mut Command,
        target: &Path,
        what: &str,
    ) -> Result<(), Error> {
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
}

pub(super) enum DataFolder {
    Existing,
    Absent,
}

/// An existing data folder is used as it is; an absent or empty one is
/// bootstrapped; anything else is refused, never overwritten.
pub(super) fn data_folder(data: &Path) -> Result<DataFolder, Error> {
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

/// A former primary's folder holds diverged WAL, unless its last run was in
/// recovery (a standby, or a folder pg_rewind has finished) or it is a fresh
/// base backup (backup_label; its control file is the primary's).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct ControlData {
    pub(super) was_primary: bool,
    pub(super) timeline: u32,
    /// `Latest checkpoint location`, as `X/Y`.
    pub(super) checkpoint: Option<String>,
    /// `Minimum recovery ending location`: where a rewound folder becomes
    /// consistent (0 when not set).
    pub(super) min_recovery_point: Option<u64>,
}

impl ControlData {
    pub(super) fn parse(output: &str, has_backup_label: bool) -> Option<Self> {
        let field = |name: &str| {
            output
                .lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        let state = field("Database cluster state")?;
        let timeline = field("Latest checkpoint's TimeLineID")?.parse().ok()?;
        let in_recovery = matches!(state, "shut down in recovery" | "in archive recovery");
        Some(Self {
            was_primary: !in_recovery && !has_backup_label,
            timeline,
            checkpoint: field("Latest checkpoint location").map(str::to_owned),
            min_recovery_point: field("Minimum recovery ending location").and_then(parse_lsn),
        })
    }
}

/// The first WAL segment (by number) from the one holding `start` to the one
/// holding `end` that neither this folder (`local`) nor the primary
/// (`primary`) has. (Which timeline's file is not checked: a miss errs
/// toward the rewind, as before this check.)
pub(super) fn first_missing_segment(
    start: u64,
    end: u64,
    segment_size: u64,
    local: &BTreeSet<u64>,
    primary: &BTreeSet<u64>,
) -> Option<u64> {
    let size = segment_size.max(1);
    (start / size..=end / size).find(|n| !local.contains(n) && !primary.contains(n))
}

/// The segment number of a WAL file name (`TTTTTTTTXXXXXXXXYYYYYYYY`).
pub(super) fn segment_number(name: &str, segment_size: u64) -> Option<u64> {
    if name.len() != 24 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let log = u64::from_str_radix(&name[8..16], 16).ok()?;
    let seg = u64::from_str_radix(&name[16..24], 16).ok()?;
    Some(log * 0x1_0000_0000u64.checked_div(segment_size)? + seg)
}

/// Beside the data folder (pg_rewind removes what its source lacks): there
/// while pg_rewind may be rewriting the folder.
pub(super) fn rewind_marker(data: &Path) -> PathBuf {
    sibling(data, "rewinding")
}

/// PostgreSQL: a folder whose pg_rewind failed midway "is likely not in a
/// state that can be recovered". It is kept, never started.
pub(super) fn refuse_after_interrupted_rewind(data: &Path) -> Result<(), Error> {
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

/// pg_rewind prints this before it changes the target folder.
pub(super) fn rewind_started(output: &str) -> bool {
    output.contains("rewinding from last common checkpoint")
}

/// pg_rewind stopped, before changing anything, on the folder's own WAL: it
/// no longer reaches back to the point both histories share, or a record
/// cannot be read. No retry brings that WAL back. (A source of another
/// system is not among these: that is the wrong server, not a clone's job.)
pub(super) fn lacks_own_wal(output: &str) -> bool {
    output.contains("could not find previous WAL record")
        || output.contains("could not read WAL record at")
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
pub(super) fn remove_stale_lock_file(path: &Path) {
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

/// The highest timeline with a history file in the folder's pg_wal (0 if none).
pub(super) fn latest_history(data: &Path) -> u32 {
    let Ok(entries) = std::fs::read_dir(data.join("pg_wal")) else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|entry| history_timeline(&entry.file_name().to_string_lossy()))
        .max()
        .unwrap_or(0)
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

    #[test]
    fn a_folder_was_a_primary_unless_its_last_run_was_in_recovery() {
        let control = |state: &str, backup_label: bool| {
            let output = format!(
                "pg_control version number:            1300\n\
                 Database cluster state:               {state}\n\
                 Latest checkpoint's TimeLineID:       3\n"
            );
            ControlData::parse(&output, backup_label).map(|c| (c.was_primary, c.timeline))
        };
        for state in [
            "in production",
            "shut down",
            "shutting down",
            "in crash recovery",
        ] {
            assert_eq!(control(state, false), Some((true, 3)), "{state}");
        }
        for state in ["shut down in recovery", "in archive recovery"] {
            assert_eq!(control(state, false), Some((false, 3)), "{state}");
        }
        // A fresh base backup carries the primary's control file.
        assert_eq!(control("in production", true), Some((false, 3)));
        assert_eq!(ControlData::parse("garbage", false), None);
    }

    #[test]
    fn a_segment_neither_side_has_is_found() {
        let mb16 = 16 * 1024 * 1024;
        assert_eq!(segment_number("000000020000000100000005", mb16), Some(261));
        assert_eq!(segment_number("00000002.history", mb16), None);
        let local: BTreeSet<u64> = [2, 3].into();
        let primary: BTreeSet<u64> = [5, 6, 7].into();
        // Replay from 0/2000028 to 0/6000100: segment 4 is nowhere.
        assert_eq!(
            first_missing_segment(0x200_0028, 0x600_0100, mb16, &local, &primary),
            Some(4)
        );
        let primary: BTreeSet<u64> = [4, 5, 6, 7].into();
        assert_eq!(
            first_missing_segment(0x200_0028, 0x600_0100, mb16, &local, &primary),
            None
        );
    }
}
