//! The instance's life: wait for a role, bootstrap the data folder if it is
//! new, run postgres, watch it (configuration, role, health), and stop it
//! cleanly. An unexpected exit of postgres starts it again after a backoff,
//! in this process: the data folder is never removed or rewritten.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_api::database::instance::{self as contract, parse_lsn};
use cairn_runtime::errors::{Backoff, Retries};
use nix::sys::signal::Signal;
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use crate::children::{Child, Children, Signaller};
use crate::conf;
use crate::config::Config;
use crate::files::{sync_parent, write_atomically};
use crate::membership::{Assignment, Heartbeat};
use crate::observe::{self, Limits, Role};
use crate::scram;
use crate::state::{Phase, State};
use crate::tls::Tls;

/// The longest a query of this process may take (also its statement_timeout).
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// A run of postgres that must end in a restart in another role, and why.
/// A fenced primary stops at once: it must take no write the new primary
/// will not have.
struct Restart {
    reason: String,
    fenced: bool,
    /// The folder cannot follow the primary any more: clone it again; why.
    reclone: Option<String>,
}

impl Restart {
    fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            fenced: false,
            reclone: None,
        }
    }
}

/// This replica's slot on the primary, as far as following goes.
#[derive(Debug, PartialEq, Eq)]
enum Slot {
    Kept,
    /// The server behind `-rw` is still in recovery: no slot there yet.
    NotYet,
    /// Invalidated past `max_slot_wal_keep_size`: the WAL this replica
    /// needs is gone from the primary.
    Lost,
}

/// What a former primary's folder can follow the current primary by.
enum Source {
    /// pg_rewind from this host.
    Rewindable(String),
    /// Both were primaries on the same timeline: pg_rewind would see one
    /// history and rewind nothing. Only a new clone follows; why.
    Forked(String),
}

/// The longest a question to the primary may take: the watch loop waits
/// for it, and `/livez` fails after three missed polls and 5 s. (A frozen
/// primary accepts the TCP connection and then answers nothing.)
const PRIMARY_TIMEOUT: Duration = Duration::from_secs(3);

/// The longest the check before a rewind may take (it checkpoints the
/// primary); a source that stops answering must not hold up the retry.
const REWIND_CHECK_TIMEOUT: Duration = Duration::from_secs(120);

/// A replica that has not streamed for this long while the primary answers
/// is stuck: its history forked off the primary's (it is cloned again), or
/// its WAL receiver hangs on a connection to a frozen former primary, which
/// no PostgreSQL timeout ends while it is still connecting (postgres is
/// restarted, and the receiver connects through `-rw` again).
const STUCK_AFTER: Duration = Duration::from_secs(10);

/// Why a replica that does not stream must restart, and how.
enum Stuck {
    Reconnect(String),
    Reclone(String),
}

pub struct Supervisor {
    config: Config,
    tls: Tls,
    children: Children,
    state: Arc<State>,
    assignment: tokio::sync::watch::Receiver<Assignment>,
    heartbeat: Arc<Heartbeat>,
}

impl Supervisor {
    pub fn new(
        config: Config,
        children: Children,
        state: Arc<State>,
        assignment: tokio::sync::watch::Receiver<Assignment>,
        heartbeat: Arc<Heartbeat>,
    ) -> Self {
        Self {
            tls: Tls::new(&config.tls_dir, &config.run_dir),
            config,
            children,
            state,
            assignment,
            heartbeat,
        }
    }

    /// Runs until `shutdown` completes, then stops postgres cleanly.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut backoff = Retries::new(RESTART_BACKOFF);
        let mut reclone = None;
        loop {
            let role = tokio::select! {
                role = self.wait_for_role() => role,
                () = &mut shutdown => break,
            };
            let mut prepare = std::pin::pin!(self.prepare(role, std::mem::take(&mut reclone)));
            let prepared = tokio::select! {
                prepared = &mut prepare => prepared,
                () = &mut shutdown => {
                    // initdb and pg_basebackup fill a sibling folder: they
                    // may stop anywhere. pg_rewind may not.
                    if self.state.status().phase == Phase::Rewinding {
                        tracing::info!("stopping once pg_rewind has finished");
                        let _ = prepare.await;
                    }
                    break;
                }
            };
            if let Err(mut message) = prepared {
                if let Some(low) = self.check_volume() {
                    message = format!("{message}; {low}");
                }
                self.state.error(message);
                self.state.phase(Phase::Retrying);
                tokio::select! {
                    () = tokio::time::sleep(backoff.next_delay()) => continue,
                    () = &mut shutdown => break,
                }
            }
            let mut postgres = match self.start_postgres() {
                Ok(child) => child,
                Err(message) => {
                    self.state.error(message);
                    self.state.phase(Phase::Retrying);
                    tokio::select! {
                        () = tokio::time::sleep(backoff.next_delay()) => continue,
                        () = &mut shutdown => break,
                    }
                }
            };
            let started = Instant::now();
            let signaller = postgres.signaller();
            let exit = tokio::select! {
                exit = postgres.wait() => exit,
                restart = self.watch(signaller, role) => {
                    // A demotion: writes must stop now, not when sessions end;
                    // and no restart here is a failure, so no backoff.
                    tracing::warn!(reason = %restart.reason, "stopping postgres to restart it");
                    if restart.fenced {
                        self.stop_now(&mut postgres).await;
                    } else {
                        self.stop(&mut postgres, false).await;
                        if restart.reclone.is_none() {
                            self.report_shutdown_position().await;
                        }
                    }
                    reclone = restart.reclone;
                    continue;
                }
                () = &mut shutdown => {
                    self.stop(&mut postgres, true).await;
                    break;
                }
            };
            self.state.metrics.restarts.inc();
            self.state.update(|s| s.postgres_restarts += 1);
            let mut message = format!("postgres exited unexpectedly ({exit}); starting it again");
            if let Some(low) = self.check_volume() {
                message = format!("{message}; {low}");
            }
            self.state.error(message);
            self.state.phase(Phase::Retrying);
            if started.elapsed() > Duration::from_secs(60) {
                backoff.reset();
            }
            tokio::select! {
                () = tokio::time::sleep(backoff.next_delay()) => {}
                () = &mut shutdown => break,
            }
        }
        self.state.phase(Phase::Stopped);
    }

    fn read_role(&self) -> Result<Role, String> {
        self.assignment
            .borrow()
            .role
            .ok_or_else(|| "no role assigned yet".to_owned())
    }

    /// The assigned role, once there is one this instance may take: a
    /// primary also needs a fresh heartbeat and no fencing.
    async fn wait_for_role(&self) -> Role {
        let mut assignment = self.assignment.clone();
        let mut logged = None;
        loop {
            let waiting = match self.read_role() {
                Ok(Role::Primary) => match self.heartbeat.forbids_primary() {
                    None => Ok(Role::Primary),
                    Some(why) => Err(why),
                },
                other => other,
            };
            match waiting {
                Ok(role) => {
                    self.state.update(|s| s.assigned_role = Some(role));
                    self.state.clear_error();
                    return role;
                }
                Err(reason) => {
                    if logged.as_ref() != Some(&reason) {
                        tracing::info!(%reason, "waiting before starting postgres");
                        logged = Some(reason.clone());
                    }
                    self.state.phase(Phase::WaitingForRole);
                    self.state.update(|s| s.reason = Some(reason));
                }
            }
            tokio::select! {
                _ = assignment.changed() => {}
                () = tokio::time::sleep(self.config.poll()) => {}
            }
        }
    }

    /// Makes the data folder ready to start in `role`; a replica's folder
    /// that cannot follow the primary any more is cloned again if `reclone`
    /// says why.
    async fn prepare(&self, role: Role, reclone: Option<String>) -> Result<(), String> {
        let data = &self.config.data_dir;
        std::fs::create_dir_all(&self.config.run_dir)
            .map_err(|e| format!("run folder {}: {e}", self.config.run_dir.display()))?;
        self.tls.install(&self.tls.read()?)?;
        if role == Role::Replica {
            self.write_passwords()?;
        }
        match data_folder(data)? {
            DataFolder::Existing => {
                tracing::info!(data = %data.display(), %role, "starting from the existing data folder");
                remove_stale_pid_file(data);
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
                        // A promotion not yet checkpointed shows only in pg_wal.
                        let timeline = control.timeline.max(latest_history(data));
                        match self.check_rewind_source(timeline).await? {
                            Source::Rewindable(host) => self.rewind(&host).await?,
                            Source::Forked(why) => {
                                self.state.phase(Phase::Bootstrapping);
                                self.reclone(&why).await?;
                            }
                        }
                    }
                } else {
                    // Never promoted from a folder pg_rewind left half done.
                    refuse_after_interrupted_rewind(data)?;
                }
            }
            DataFolder::Absent => {
                if role == Role::Primary && !self.assignment.borrow().may_initdb {
                    return Err(format!(
                        "the data folder {} is empty but the cluster was initialised: refusing \
                         to run initdb over it (its data lives in the replicas; the controller \
                         fails over to one)",
                        data.display()
                    ));
                }
                self.state.phase(Phase::Bootstrapping);
                match role {
                    Role::Primary => self.initdb().await?,
                    Role::Replica => self.clone_primary().await?,
                }
            }
        }
        if role == Role::Replica
            && let Err(message) = self.check_slot().await
        {
            // Streaming waits for the slot; the watch loop tries again.
            tracing::warn!(%message, "no replication slot yet");
        }
        self.write_conf(role)?;
        // A primary's folder that holds standby.signal keeps it: it starts in
        // recovery and is promoted (a new timeline), never just restarted.
        if role == Role::Replica {
            std::fs::write(data.join("standby.signal"), "")
                .map_err(|e| format!("standby.signal: {e}"))?;
        }
        Ok(())
    }

    /// After a demotion: where the shutdown checkpoint is, so the controller
    /// promotes a replica only once it has received everything up to it.
    async fn report_shutdown_position(&self) {
        match self.control_data().await {
            Ok(control) => {
                tracing::info!(position = ?control.checkpoint, "stopped as a primary");
                self.state
                    .update(|s| s.shutdown_position = control.checkpoint);
            }
            Err(message) => tracing::warn!(%message, "cannot read the shutdown checkpoint"),
        }
    }

    /// What the folder's control file says (pg_controldata).
    async fn control_data(&self) -> Result<ControlData, String> {
        let data = &self.config.data_dir;
        let mut controldata = Command::new(self.config.program("pg_controldata"));
        controldata.arg(data).env("LC_ALL", "C");
        let output = self
            .children
            .run(&mut controldata)
            .await
            .map_err(|e| format!("cannot run pg_controldata: {e}"))?;
        ControlData::parse(&output.output, data.join("backup_label").exists())
            .ok_or_else(|| format!("pg_controldata: {}", last_lines(&output.output, 2)))
    }

    /// Rewinds a former primary's folder to where its history and the current
    /// primary's part, so it can follow the new timeline without a new base
    /// backup (needs wal_log_hints or checksums: the controller sets the first,
    /// initdb here the second). Writes nothing if no rewind is needed.
    async fn rewind(&self, host: &str) -> Result<(), String> {
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
            .map_err(|e| format!("{}: {e}", marker.display()))?;
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
                return Err(format!("cannot run pg_rewind: {e}"));
            }
        };
        if !output.exit.success() {
            let failed = format!(
                "pg_rewind failed ({}): {}",
                output.exit,
                last_lines(&output.output, 3)
            );
            // Only a failure before it changed anything may be retried.
            if !rewind_started(&output.output) {
                remove_if_present(&marker)?;
            }
            return Err(failed);
        }
        std::fs::remove_file(&marker).map_err(|e| format!("{}: {e}", marker.display()))?;
        tracing::info!(output = %last_lines(&output.output, 1), "pg_rewind done");
        Ok(())
    }

    /// pg_rewind trusts its source: a server still in recovery (its promotion
    /// not yet seen by the Service) or on the folder's own timeline would make
    /// it report "no rewind required" over diverged histories.
    async fn check_rewind_source(&self, timeline: u32) -> Result<Source, String> {
        // It checkpoints first, which may take a while on a busy primary.
        bounded(REWIND_CHECK_TIMEOUT, self.try_check_rewind_source(timeline)).await
    }

    async fn try_check_rewind_source(&self, timeline: u32) -> Result<Source, String> {
        let (client, host) = self
            .primary_superuser()
            .await
            .map_err(|e| format!("{e} (to rewind from)"))?;
        let sql = |e: tokio_postgres::Error| format!("the primary {host}: {e}");
        let in_recovery: bool = client
            .query_one("SELECT pg_is_in_recovery()", &[])
            .await
            .map_err(sql)?
            .get(0);
        if in_recovery {
            return Err(format!(
                "the primary {host} is still in recovery: rewinding once it is promoted"
            ));
        }
        // After a promotion the control file names the new timeline only
        // after a checkpoint; pg_rewind reads it there.
        client.batch_execute("CHECKPOINT").await.map_err(sql)?;
        let source: i32 = client
            .query_one("SELECT timeline_id FROM pg_control_checkpoint()", &[])
            .await
            .map_err(sql)?
            .get(0);
        // On the same timeline, two histories cannot be told apart: pg_rewind
        // would say "no rewind required" over a fork. (A source on an earlier
        // timeline is fine: pg_rewind compares both histories.)
        if u32::try_from(source) == Ok(timeline) {
            return Ok(Source::Forked(format!(
                "the primary {host} is on this folder's timeline {source}, with another history: \
                 refusing to rewind over it"
            )));
        }
        Ok(Source::Rewindable(host))
    }

    fn slot_name(&self) -> String {
        conf::slot_name(self.config.pod_name.as_deref().unwrap_or("cairn-instance"))
    }

    /// Makes sure the primary keeps this replica's replication slot, so it
    /// keeps the WAL this replica has not received (up to the controller's
    /// `max_slot_wal_keep_size`). Slots are not replicated: after a failover
    /// each replica creates its slot on the new primary this way.
    async fn check_slot(&self) -> Result<Slot, String> {
        bounded(PRIMARY_TIMEOUT, self.try_check_slot()).await
    }

    async fn try_check_slot(&self) -> Result<Slot, String> {
        let (client, host) = self.primary_superuser().await?;
        let slot = self.slot_name();
        let row = client
            .query_one(
                "SELECT pg_is_in_recovery(),
                        (SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1)",
                &[&slot],
            )
            .await
            .map_err(|e| format!("replication slot {slot} on {host}: {e}"))?;
        let (standby, wal_status): (bool, Option<String>) = (row.get(0), row.get(1));
        match wal_status.as_deref() {
            Some("lost") => return Ok(Slot::Lost),
            Some(_) => return Ok(Slot::Kept),
            None if standby => return Ok(Slot::NotYet), // created once it is promoted
            None => {}
        }
        client
            .execute(
                "SELECT pg_create_physical_replication_slot($1, true)
                 WHERE NOT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1)",
                &[&slot],
            )
            .await
            .map_err(|e| format!("replication slot {slot} on {host}: {e}"))?;
        tracing::info!(%slot, %host, "created this replica's replication slot on the primary");
        Ok(Slot::Kept)
    }

    /// A lost slot reserves nothing: it is dropped so `check_slot` creates
    /// it again, reserving WAL from now, before a new base backup starts.
    async fn drop_lost_slot(&self) -> Result<(), String> {
        bounded(PRIMARY_TIMEOUT, self.try_drop_lost_slot()).await
    }

    async fn try_drop_lost_slot(&self) -> Result<(), String> {
        let (client, host) = self.primary_superuser().await?;
        let slot = self.slot_name();
        client
            .execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
                 WHERE slot_name = $1 AND wal_status = 'lost' AND NOT active",
                &[&slot],
            )
            .await
            .map_err(|e| format!("dropping the lost replication slot {slot} on {host}: {e}"))?;
        Ok(())
    }

    /// On the primary: drops the slot of each pod the cluster no longer has
    /// (a scale-down), once it has been unused for the grace period, so it
    /// stops holding WAL. Slots other tools made (other names) are not
    /// touched. Best effort: a failure is logged and tried again later.
    async fn drop_slots_of_removed_pods(&self, client: &Client, leaving: &mut LeavingSlots) {
        let (Some(cluster), Some(members)) = (&self.config.cluster, self.members()) else {
            return;
        };
        let prefix = conf::slot_name(&format!("{cluster}-"));
        let unused = match client
            .query(
                "SELECT slot_name::text FROM pg_replication_slots
                 WHERE slot_type = 'physical' AND NOT active AND starts_with(slot_name::text, $1)",
                &[&prefix],
            )
            .await
        {
            Ok(rows) => rows.iter().map(|row| row.get::<_, String>(0)).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the replication slots");
                return;
            }
        };
        let kept: Vec<String> = members.iter().map(|pod| conf::slot_name(pod)).collect();
        let grace = Duration::from_secs(self.config.slot_grace_seconds);
        for slot in leaving.due(&prefix, unused, &kept, grace) {
            match client
                .execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
                     WHERE slot_name = $1 AND NOT active",
                    &[&slot],
                )
                .await
            {
                Ok(_) => {
                    tracing::info!(%slot, "dropped the replication slot of a pod the cluster no longer has")
                }
                Err(e) => tracing::warn!(%slot, error = %e, "cannot drop a replication slot"),
            }
        }
    }

    /// Why this replica, not streaming, must restart, if it must: its slot
    /// was invalidated, or (after `STUCK_AFTER`, the primary answering) its
    /// history forked off the primary's, or its WAL receiver is stuck.
    /// Creates a missing slot meanwhile.
    async fn stuck(&self, sample: &observe::Sample, silent_for: Duration) -> Option<Stuck> {
        match self.check_slot().await {
            Ok(Slot::Lost) => {
                return Some(Stuck::Reclone(
                    "the primary invalidated this replica's slot (max_slot_wal_keep_size): the \
                     WAL it needs is gone"
                        .to_owned(),
                ));
            }
            Ok(Slot::Kept) => {}
            Ok(Slot::NotYet) => return None,
            Err(message) => {
                tracing::debug!(%message, "cannot check the replication slot");
                return None;
            }
        }
        if silent_for < STUCK_AFTER {
            return None;
        }
        let timeline = sample.timeline?;
        let position = sample.wal_position.as_deref().and_then(parse_lsn)?;
        match self.primary_history(timeline).await {
            Ok(Some((primary_timeline, history))) => {
                if let Some(why) = forked(&history, timeline, position) {
                    return Some(Stuck::Reclone(format!(
                        "this replica's history forked off the primary's (timeline \
                         {primary_timeline}): {why}"
                    )));
                }
            }
            Ok(None) => {}
            Err(message) => {
                tracing::debug!(%message, "cannot read the primary's timeline history");
                return None;
            }
        }
        Some(Stuck::Reconnect(format!(
            "not streaming for {}s although the primary answers: restarting postgres so that \
             its WAL receiver connects again",
            silent_for.as_secs()
        )))
    }

    /// The primary's timeline and its history file, when it is on a later
    /// timeline than `timeline`.
    async fn primary_history(&self, timeline: u32) -> Result<Option<(u32, String)>, String> {
        bounded(PRIMARY_TIMEOUT, self.try_primary_history(timeline)).await
    }

    async fn try_primary_history(&self, timeline: u32) -> Result<Option<(u32, String)>, String> {
        let (client, host) = self.primary_superuser().await?;
        let row = client
            .query_one(
                "SELECT CASE WHEN pg_is_in_recovery() THEN NULL
                        ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int8 END",
                &[],
            )
            .await
            .map_err(|e| format!("the timeline of {host}: {e}"))?;
        let Some(current) = row
            .get::<_, Option<i64>>(0)
            .and_then(|t| u32::try_from(t).ok())
        else {
            return Ok(None); // not a primary (yet)
        };
        if current <= timeline {
            return Ok(None);
        }
        let history: String = client
            .query_one(
                "SELECT pg_read_file('pg_wal/' || $1 || '.history')",
                &[&format!("{current:08X}")],
            )
            .await
            .map_err(|e| format!("the history of timeline {current} on {host}: {e}"))?
            .get(0);
        Ok(Some((current, history)))
    }

    /// A superuser session on the primary whose every query is bounded by
    /// `PRIMARY_TIMEOUT` (statement_timeout covers a slow query; the
    /// callers bound the whole exchange for a server that does not answer).
    async fn primary_superuser(&self) -> Result<(Client, String), String> {
        let host = self.primary_host()?;
        let (client, connection) = self
            .superuser(&host, self.config.primary_port)?
            .connect_timeout(PRIMARY_TIMEOUT)
            .ssl_mode(tokio_postgres::config::SslMode::Require)
            .connect(self.tls.connector()?)
            .await
            .map_err(|e| format!("cannot reach the primary {host}: {e}"))?;
        tokio::spawn(connection);
        Ok((client, host))
    }

    /// A replica the primary can no longer feed: a new base backup into a
    /// fresh folder. The current folder is kept beside it until the new one
    /// streams (see `forget_previous_folder`).
    async fn reclone(&self, why: &str) -> Result<(), String> {
        tracing::warn!(
            "{why}: cloning the replica again, keeping the folder aside until the clone streams"
        );
        self.state.metrics.reclones.inc();
        self.drop_lost_slot().await?;
        if self.check_slot().await? == Slot::Lost {
            return Err("the lost replication slot is still in use on the primary".to_owned());
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
                .map_err(|e| format!("moving {} aside: {e}", data.display()))?;
        }
        self.move_into_place(&target, "pg_basebackup")
    }

    /// Once the folder streams, the one it replaced is not needed.
    fn forget_previous_folder(&self) {
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

    async fn initdb(&self) -> Result<(), String> {
        let target = sibling(&self.config.data_dir, "initdb");
        let superuser_password = self
            .config
            .credentials_dir
            .join(contract::SUPERUSER_PASSWORD_KEY);
        if !superuser_password.exists() {
            return Err(format!(
                "cannot initialise a primary: no superuser password at {}",
                superuser_password.display()
            ));
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

    async fn clone_primary(&self) -> Result<(), String> {
        let target = sibling(&self.config.data_dir, "clone");
        self.clone_into(&target).await?;
        self.move_into_place(&target, "pg_basebackup")
    }

    async fn clone_into(&self, target: &Path) -> Result<(), String> {
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
    async fn run_in(&self, command: &mut Command, target: &Path, what: &str) -> Result<(), String> {
        remove_dir_if_present(target)?;
        let output = self
            .children
            .run(command)
            .await
            .map_err(|e| format!("cannot run {what}: {e}"))?;
        if !output.exit.success() {
            let _ = remove_dir_if_present(target);
            return Err(format!(
                "{what} failed ({}): {}",
                output.exit,
                last_lines(&output.output, 3)
            ));
        }
        Ok(())
    }

    /// Moves a complete `target` to the data folder: a folder that is there
    /// is always complete.
    fn move_into_place(&self, target: &Path, what: &str) -> Result<(), String> {
        let data = &self.config.data_dir;
        // A marker left with a folder an operator removed says nothing of this one.
        remove_if_present(&rewind_marker(data))?;
        if data.exists() {
            // An empty folder, or `data_folder` would have refused.
            std::fs::remove_dir(data).map_err(|e| format!("{}: {e}", data.display()))?;
        }
        std::fs::rename(target, data)
            .and_then(|()| sync_parent(data))
            .map_err(|e| format!("moving {} to {}: {e}", target.display(), data.display()))?;
        tracing::info!(data = %data.display(), "{what} done");
        Ok(())
    }

    /// postgresql.conf in the data folder: the controller's, then this instance's.
    fn write_conf(&self, role: Role) -> Result<(), String> {
        let source = self.config.config_dir.join("postgresql.conf");
        let controller_conf = std::fs::read_to_string(&source)
            .map_err(|e| format!("configuration {}: {e}", source.display()))?;
        let primary_conninfo = match role {
            Role::Primary => None,
            Role::Replica => Some(conf::primary_conninfo(
                &self.primary_host()?,
                self.config.primary_port,
                &self.credential(contract::REPLICATION_USER_KEY)?,
                &self.passfile(),
                self.config.pod_name.as_deref().unwrap_or("cairn-instance"),
                &self.tls.client_settings(),
            )),
        };
        let hba_file = self.config.config_dir.join("pg_hba.conf");
        let primary_slot_name = (role == Role::Replica).then(|| self.slot_name());
        let text = conf::postgresql_conf(
            &controller_conf,
            &conf::InstanceSettings {
                port: self.config.port,
                listen_addresses: &self.config.listen_addresses,
                socket_dir: &self.config.run_dir,
                hba_file: &hba_file,
                primary_conninfo,
                primary_slot_name,
                ssl_cert_file: &self.tls.cert_file(),
                ssl_key_file: &self.tls.key_file(),
            },
        );
        write_atomically(&self.config.data_dir.join("postgresql.conf"), &text, 0o600)
    }

    /// The password file a replica uses towards its primary: the replication
    /// user (streaming, cloning) and the superuser (pg_rewind).
    fn write_passwords(&self) -> Result<(), String> {
        let port = self.config.primary_port;
        let mut lines = conf::pgpass(
            "*",
            port,
            &self.credential(contract::REPLICATION_USER_KEY)?,
            &self.credential(contract::REPLICATION_PASSWORD_KEY)?,
        );
        let superuser = self.credential(contract::SUPERUSER_PASSWORD_KEY)?;
        lines.push_str(&conf::pgpass("*", port, "postgres", &superuser));
        write_atomically(&self.passfile(), &lines, 0o600)
    }

    fn start_postgres(&self) -> Result<Child, String> {
        let mut postgres = Command::new(self.config.program("postgres"));
        postgres
            .arg("-D")
            .arg(&self.config.data_dir)
            .stdin(Stdio::null());
        let child = self
            .children
            .spawn(&mut postgres)
            .map_err(|e| format!("cannot start postgres: {e}"))?;
        tracing::info!(pid = child.pid.as_raw(), "postgres started");
        self.state.update(|s| s.shutdown_position = None);
        self.state.answered();
        self.state.phase(Phase::Running);
        Ok(child)
    }

    /// Smart shutdown (waits for sessions; skipped unless `smart`), then fast
    /// (disconnects them, clean checkpoint), then immediate (crash recovery at
    /// the next start).
    async fn stop(&self, postgres: &mut Child, smart: bool) {
        self.state.phase(Phase::Stopping);
        let steps = [
            (Signal::SIGTERM, "smart", self.config.smart_shutdown_seconds),
            (Signal::SIGINT, "fast", self.config.fast_shutdown_seconds),
            (Signal::SIGQUIT, "immediate", 5),
        ];
        for (signal, mode, seconds) in steps.into_iter().skip(usize::from(!smart)) {
            tracing::info!(mode, "stopping postgres");
            postgres.signal(signal);
            let limit = Duration::from_secs(seconds);
            if let Ok(exit) = tokio::time::timeout(limit, postgres.wait()).await {
                tracing::info!(%exit, mode, "postgres stopped");
                return;
            }
        }
        tracing::error!("postgres did not stop; killing it");
        postgres.signal(Signal::SIGKILL);
        postgres.wait().await;
    }

    /// Fencing: fast shutdown (no new transaction commits once it starts),
    /// immediate after 2 s, killed after 2 s more.
    async fn stop_now(&self, postgres: &mut Child) {
        self.state.phase(Phase::Stopping);
        for (signal, mode) in [(Signal::SIGINT, "fast"), (Signal::SIGQUIT, "immediate")] {
            tracing::warn!(mode, "fencing: stopping postgres");
            postgres.signal(signal);
            if let Ok(exit) = tokio::time::timeout(Duration::from_secs(2), postgres.wait()).await {
                tracing::info!(%exit, mode, "postgres stopped");
                return;
            }
        }
        postgres.signal(Signal::SIGKILL);
        postgres.wait().await;
    }

    /// Watches a running postgres until it must restart in another role.
    async fn watch(&self, postgres: Signaller, started_as: Role) -> Restart {
        let limits = Limits {
            max_lag_bytes: self.config.max_lag_bytes,
            max_silence: Duration::from_secs(self.config.max_lag_seconds),
        };
        let mut session: Option<observe::Session> = None;
        let mut config_seen = self.config_files();
        let mut tls_seen = self.tls.read().ok();
        let mut credentials_seen = self.credentials();
        let mut assigned = started_as;
        // Roles created (readiness needs them) and roles up to date with the
        // Secret (a rotation pending does not take a primary out of service).
        let mut roles_ready = false;
        let mut roles_current = false;
        let mut promoted = false;
        let mut last_streaming: Option<Instant> = None;
        let started = Instant::now();
        let mut pending_logged: Vec<String> = Vec::new();
        let mut leaving_slots = LeavingSlots::default();
        let mut tick: u64 = 0;
        loop {
            tick += 1;
            if tick > 1 {
                tokio::time::sleep(self.config.poll()).await;
            }
            match self.read_role() {
                Ok(role) => assigned = role,
                Err(reason) => tracing::warn!(%reason, role = %assigned, "keeping the last role"),
            }
            self.state.update(|s| s.assigned_role = Some(assigned));
            // A server that runs as a primary stops taking writes when told,
            // whether or not it answers this process's queries.
            if assigned == Role::Replica && (started_as == Role::Primary || promoted) {
                return Restart::new(
                    "assigned replica while running as a primary: restarting as a standby",
                );
            }
            if assigned == Role::Primary
                && let Some(why) = self.heartbeat.forbids_primary()
            {
                self.state.error(why.clone());
                return Restart {
                    fenced: true,
                    ..Restart::new(why)
                };
            }
            let config_now = self.config_files();
            if config_now != config_seen {
                match self.write_conf(assigned) {
                    Ok(()) => {
                        postgres.signal(Signal::SIGHUP);
                        tracing::info!("configuration changed: postgres reloaded");
                        config_seen = config_now;
                    }
                    Err(message) => self.state.error(message),
                }
            }
            let tls_now = self.tls.read().ok();
            if tls_now != tls_seen
                && let Some(files) = &tls_now
            {
                // A renewed certificate: postgres reloads its TLS files, and
                // sessions from now on get the new one; none is cut.
                match self.tls.install(files) {
                    Ok(()) => {
                        postgres.signal(Signal::SIGHUP);
                        tracing::info!("server certificate changed: postgres reloaded");
                        tls_seen = tls_now;
                    }
                    Err(message) => self.state.error(message),
                }
            }
            let credentials_now = self.credentials();
            if credentials_now != credentials_seen {
                // The Secret changed (a rotation): a primary sets the new
                // passwords on its roles, a replica uses them from now on.
                tracing::info!("credentials changed");
                roles_current = false;
                match assigned {
                    Role::Replica => match self.write_passwords() {
                        Ok(()) => credentials_seen = credentials_now,
                        Err(message) => self.state.error(message),
                    },
                    Role::Primary => credentials_seen = credentials_now,
                }
            }
            if session.is_none() {
                match self.connect().await {
                    Ok(connected) => session = Some(connected),
                    Err(reason) => {
                        self.state.observe(None, Err(reason));
                        continue;
                    }
                }
            }
            let Some(connection) = session.as_ref() else {
                continue;
            };
            let sample = match tokio::time::timeout(QUERY_TIMEOUT, connection.sample()).await {
                Ok(Ok(sample)) => sample,
                Err(_) => {
                    session = None;
                    self.state
                        .observe(None, Err(format!("no answer within {QUERY_TIMEOUT:?}")));
                    continue;
                }
                Ok(Err(e)) => {
                    session = None;
                    self.state.observe(None, Err(format!("query failed: {e}")));
                    continue;
                }
            };
            self.state.answered();
            match (assigned, sample.in_recovery) {
                (Role::Replica, false) => {
                    return Restart::new(
                        "assigned replica while running as a primary: restarting as a standby",
                    );
                }
                (Role::Primary, true) if !promoted => {
                    promoted = self.promote(&connection.client).await;
                }
                (Role::Primary, false) if !roles_current => {
                    roles_current = self.ensure_roles(&connection.client).await;
                    roles_ready |= roles_current;
                }
                (Role::Primary, false) if tick.is_multiple_of(10) => {
                    self.drop_slots_of_removed_pods(&connection.client, &mut leaving_slots)
                        .await;
                }
                _ => {}
            }
            if sample.streaming {
                if last_streaming.is_none() {
                    self.forget_previous_folder();
                }
                last_streaming = Some(Instant::now());
            } else if assigned == Role::Replica && tick.is_multiple_of(5) {
                let silent_for = last_streaming.unwrap_or(started).elapsed();
                match self.stuck(&sample, silent_for).await {
                    Some(Stuck::Reclone(reason)) => {
                        return Restart {
                            reclone: Some(reason.clone()),
                            ..Restart::new(reason)
                        };
                    }
                    Some(Stuck::Reconnect(reason)) => return Restart::new(reason),
                    None => {}
                }
            }
            let silence = last_streaming.map(|at| at.elapsed());
            let ready = observe::readiness(assigned, &sample, silence, roles_ready, limits);
            match self.check_volume() {
                Some(low) => self.state.error(low),
                None if ready.is_ok() => self.state.clear_error(),
                None => {}
            }
            if sample.pending_restart != pending_logged {
                if !sample.pending_restart.is_empty() {
                    tracing::warn!(settings = ?sample.pending_restart, "settings changed that take effect only after a restart");
                }
                pending_logged = sample.pending_restart.clone();
            }
            self.state.observe(Some(&sample), ready);
            if tick % 30 == 1
                && let Ok(sizes) = connection.database_sizes().await
            {
                self.state.metrics.database_sizes(&sizes);
            }
        }
    }

    async fn promote(&self, client: &Client) -> bool {
        tracing::info!("assigned primary while in recovery: promoting");
        if let Err(message) = self.write_conf(Role::Primary) {
            self.state.error(message);
            return false;
        }
        match client
            .execute("SELECT pg_promote(wait => false)", &[])
            .await
        {
            Ok(_) => true,
            Err(e) => {
                self.state.error(format!("promotion failed: {e}"));
                false
            }
        }
    }

    /// The application database, its owner and the replication user, created
    /// when missing; a role's password set again when the Secret's differs
    /// (a rotation). Passwords travel as SCRAM verifiers, never in clear.
    async fn ensure_roles(&self, client: &Client) -> bool {
        match self.try_ensure_roles(client).await {
            Ok(()) => true,
            Err(message) => {
                self.state
                    .error(format!("the application's roles: {message}"));
                false
            }
        }
    }

    async fn try_ensure_roles(&self, client: &Client) -> Result<(), String> {
        let owner = self.credential(contract::OWNER_KEY)?;
        let database = self.credential(contract::DATABASE_KEY)?;
        let users = [
            (owner.clone(), contract::OWNER_PASSWORD_KEY, "LOGIN"),
            (
                self.credential(contract::REPLICATION_USER_KEY)?,
                contract::REPLICATION_PASSWORD_KEY,
                "LOGIN REPLICATION",
            ),
        ];
        let sql = |e: tokio_postgres::Error| e.to_string();
        // With synchronous replication, these commits would wait for replicas
        // that cannot clone this primary before it is ready (the roles are
        // part of ready): they need no replica's confirmation. A primary
        // promoted after losing them creates them again from the Secret.
        client
            .batch_execute("SET synchronous_commit = local")
            .await
            .map_err(sql)?;
        for (user, password_key, attributes) in users {
            let password = self.credential(password_key)?;
            let stored: Option<Option<String>> = client
                .query_opt(
                    "SELECT rolpassword FROM pg_authid WHERE rolname = $1",
                    &[&user],
                )
                .await
                .map_err(sql)?
                .map(|row| row.get(0));
            let create = match stored {
                None => true,
                Some(Some(verifier)) if scram::verifies(&password, &verifier) => continue,
                Some(_) => false,
            };
            let name = identifier(&user);
            let verifier = literal(&postgres_protocol::password::scram_sha_256(
                password.as_bytes(),
            ));
            let statement = match create {
                true => format!("CREATE ROLE {name} {attributes} PASSWORD {verifier}"),
                false => format!("ALTER ROLE {name} PASSWORD {verifier}"),
            };
            // The verifier is no secret, but it is what a brute force needs:
            // keep the statement out of the server's log, even if it fails.
            // (A query string is logged whole before it runs: the settings
            // go first, in a query of their own.)
            client
                .batch_execute(
                    "BEGIN; SET LOCAL log_statement = 'none'; \
                     SET LOCAL log_min_error_statement = 'panic'",
                )
                .await
                .map_err(sql)?;
            let done = client.batch_execute(&statement).await;
            let end = if done.is_ok() { "COMMIT" } else { "ROLLBACK" };
            let ended = client.batch_execute(end).await;
            done.and(ended).map_err(sql)?;
            match create {
                true => tracing::info!(role = %user, "created role"),
                false => tracing::info!(role = %user, "set the role's password from the Secret"),
            }
        }
        let exists = client
            .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&database])
            .await
            .map_err(sql)?;
        if exists.is_none() {
            client
                .batch_execute(&format!(
                    "CREATE DATABASE {} OWNER {}",
                    identifier(&database),
                    identifier(&owner)
                ))
                .await
                .map_err(sql)?;
            tracing::info!(%database, %owner, "created the application database");
        }
        Ok(())
    }

    /// The superuser's connection settings for a server.
    fn superuser(&self, host: &str, port: u16) -> Result<tokio_postgres::Config, String> {
        let mut config = tokio_postgres::Config::new();
        config
            .host(host)
            .port(port)
            .user("postgres")
            .password(self.credential(contract::SUPERUSER_PASSWORD_KEY)?)
            .dbname("postgres")
            .application_name("cairn-instance");
        Ok(config)
    }

    /// A session as the superuser over loopback (pg_hba's `local` line is
    /// peer authentication, which needs the OS user to be `postgres`).
    async fn connect(&self) -> Result<observe::Session, String> {
        let mut config = self.superuser("127.0.0.1", self.config.port)?;
        config
            .options(format!(
                "-c statement_timeout={}",
                QUERY_TIMEOUT.as_millis()
            ))
            .connect_timeout(Duration::from_secs(3));
        match config.connect(tokio_postgres::NoTls).await {
            Ok((client, connection)) => {
                tokio::spawn(connection);
                observe::Session::new(client)
                    .await
                    .map_err(|e| format!("preparing the monitoring query: {e}"))
            }
            Err(e) => {
                let code = e.code();
                if code.is_some() {
                    // It answered, with a refusal: alive.
                    self.state.answered();
                }
                if code == Some(&SqlState::INVALID_PASSWORD)
                    || code == Some(&SqlState::INVALID_AUTHORIZATION_SPECIFICATION)
                {
                    let message = format!("postgres refused the superuser's credentials: {e}");
                    self.state.error(message.clone());
                    return Err(message);
                }
                Err(format!("not accepting connections: {e}"))
            }
        }
    }

    /// Records the data volume's space; says so when it is nearly full
    /// (less than a WAL segment, or 2 %, free).
    fn check_volume(&self) -> Option<String> {
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

    /// The rotatable passwords as mounted now; compared, never logged. (User
    /// names are fixed once their roles exist; the superuser's password is
    /// what this process logs in with, so it is not rotated.)
    fn credentials(&self) -> Vec<Option<String>> {
        [
            contract::OWNER_PASSWORD_KEY,
            contract::REPLICATION_PASSWORD_KEY,
        ]
        .into_iter()
        .map(|key| self.config.credential(key).ok())
        .collect()
    }

    /// The cluster's pods as the controller lists them; `None` without the file.
    fn members(&self) -> Option<Vec<String>> {
        let text =
            std::fs::read_to_string(self.config.config_dir.join(contract::MEMBERS_FILE)).ok()?;
        Some(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect(),
        )
    }

    fn config_files(&self) -> Option<(String, String)> {
        let read = |name: &str| std::fs::read_to_string(self.config.config_dir.join(name)).ok();
        Some((read("postgresql.conf")?, read("pg_hba.conf")?))
    }

    fn primary_host(&self) -> Result<String, String> {
        self.config.primary_host().ok_or_else(|| {
            "no primary to follow: set CAIRN_CLUSTER or CAIRN_PRIMARY_HOST".to_owned()
        })
    }

    fn credential(&self, key: &str) -> Result<String, String> {
        self.config
            .credential(key)
            .map_err(|e| format!("credentials: {e}"))
    }

    fn passfile(&self) -> PathBuf {
        self.config.run_dir.join("pgpass")
    }
}

/// Unused slots of pods no longer in the cluster, and since when each has
/// been seen so.
#[derive(Default)]
struct LeavingSlots(std::collections::HashMap<String, Instant>);

impl LeavingSlots {
    /// Of the `unused` slots, those named `<prefix><ordinal>` for a pod not
    /// in `kept` that have been seen so for `grace`; forgets the others.
    fn due(
        &mut self,
        prefix: &str,
        unused: Vec<String>,
        kept: &[String],
        grace: Duration,
    ) -> Vec<String> {
        let leaving: Vec<String> = unused
            .into_iter()
            .filter(|slot| {
                slot.strip_prefix(prefix)
                    .is_some_and(|o| !o.is_empty() && o.bytes().all(|b| b.is_ascii_digit()))
                    && !kept.contains(slot)
            })
            .collect();
        self.0.retain(|slot, _| leaving.contains(slot));
        let now = Instant::now();
        leaving
            .into_iter()
            .filter(|slot| now.duration_since(*self.0.entry(slot.clone()).or_insert(now)) >= grace)
            .collect()
    }
}

enum DataFolder {
    Existing,
    Absent,
}

/// An existing data folder is used as it is; an absent or empty one is
/// bootstrapped; anything else is refused, never overwritten.
fn data_folder(data: &Path) -> Result<DataFolder, String> {
    if data.join("PG_VERSION").exists() {
        return Ok(DataFolder::Existing);
    }
    match std::fs::read_dir(data) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(DataFolder::Absent),
        Err(e) => Err(format!("data folder {}: {e}", data.display())),
        Ok(mut entries) => match entries.next() {
            None => Ok(DataFolder::Absent),
            Some(_) => Err(format!(
                "data folder {} is not empty but holds no PG_VERSION: refusing to initialise over it",
                data.display()
            )),
        },
    }
}

/// A former primary's folder holds diverged WAL, unless its last run was in
/// recovery (a standby, or a folder pg_rewind has finished) or it is a fresh
/// base backup (backup_label; its control file is the primary's).
#[derive(Debug, PartialEq, Eq)]
struct ControlData {
    was_primary: bool,
    timeline: u32,
    /// `Latest checkpoint location`, as `X/Y`.
    checkpoint: Option<String>,
}

impl ControlData {
    fn parse(output: &str, has_backup_label: bool) -> Option<Self> {
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
        })
    }
}

/// Beside the data folder (pg_rewind removes what its source lacks): there
/// while pg_rewind may be rewriting the folder.
fn rewind_marker(data: &Path) -> PathBuf {
    sibling(data, "rewinding")
}

/// PostgreSQL: a folder whose pg_rewind failed midway "is likely not in a
/// state that can be recovered". It is kept, never started.
fn refuse_after_interrupted_rewind(data: &Path) -> Result<(), String> {
    let marker = rewind_marker(data);
    if marker.exists() {
        return Err(format!(
            "pg_rewind of {} did not finish, so the folder may be inconsistent: it is kept and \
             not started. Move it away (or delete its volume) for a new clone from the primary; \
             then remove {}",
            data.display(),
            marker.display()
        ));
    }
    Ok(())
}

/// pg_rewind prints this before it changes the target folder.
fn rewind_started(output: &str) -> bool {
    output.contains("rewinding from last common checkpoint")
}

/// A folder beside the data folder, on the same filesystem (so a rename moves it).
fn sibling(data: &Path, suffix: &str) -> PathBuf {
    let mut name = data.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{suffix}"));
    data.with_file_name(name)
}

fn remove_if_present(file: &Path) -> Result<(), String> {
    match std::fs::remove_file(file) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(format!("{}: {e}", file.display()))
        }
        _ => Ok(()),
    }
}

fn remove_dir_if_present(dir: &Path) -> Result<(), String> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(format!("{}: {e}", dir.display()))
        }
        _ => Ok(()),
    }
}

/// A postmaster.pid left by a postgres that no longer runs (the container
/// restarted): its pid may now belong to another process, which would make
/// postgres refuse to start.
fn remove_stale_pid_file(data: &Path) {
    let path = data.join("postmaster.pid");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return;
    };
    let pid = text.lines().next().unwrap_or_default().trim();
    let running = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|cmdline| String::from_utf8_lossy(&cmdline).contains("postgres"))
        .unwrap_or(false);
    if !running {
        tracing::info!(pid, "removing a stale postmaster.pid");
        let _ = std::fs::remove_file(&path);
    }
}

/// The highest timeline with a history file in the folder's pg_wal (0 if none).
fn latest_history(data: &Path) -> u32 {
    let Ok(entries) = std::fs::read_dir(data.join("pg_wal")) else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|entry| history_timeline(&entry.file_name().to_string_lossy()))
        .max()
        .unwrap_or(0)
}

/// `0000000A.history` → 10.
/// A question to the primary, given up after `limit`.
async fn bounded<T>(
    limit: Duration,
    question: impl Future<Output = Result<T, String>>,
) -> Result<T, String> {
    tokio::time::timeout(limit, question)
        .await
        .unwrap_or_else(|_| Err(format!("the primary did not answer within {limit:?}")))
}

/// Whether a server on `timeline`, replayed up to `position`, diverged from
/// the history a `.history` file describes: its timeline is not an ancestor,
/// or it replayed WAL past the point where the history left it.
fn forked(history: &str, timeline: u32, position: u64) -> Option<String> {
    let switch = history.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let parent: u32 = fields.next()?.parse().ok()?;
        let at = parse_lsn(fields.next()?)?;
        (parent == timeline).then_some(at)
    });
    match switch {
        None => Some(format!("timeline {timeline} is not in its history")),
        Some(at) if position > at => Some(format!(
            "it replayed timeline {timeline} up to {}, past the switch at {}",
            format_lsn(position),
            format_lsn(at)
        )),
        Some(_) => None,
    }
}

fn format_lsn(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xFFFF_FFFF)
}

fn history_timeline(name: &str) -> Option<u32> {
    let hex = name.strip_suffix(".history")?;
    (hex.len() == 8).then_some(())?;
    u32::from_str_radix(hex, 16).ok()
}

fn last_lines(text: &str, count: usize) -> String {
    let lines: Vec<_> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(count)..].join(" | ")
}

fn identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// Restarts of postgres after an unexpected exit: 1 s, doubling to 30 s.
const RESTART_BACKOFF: Backoff = Backoff {
    initial: Duration::from_secs(1),
    max: Duration::from_secs(30),
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_back_off_from_one_second_to_thirty() {
        let ceilings: Vec<_> = (1..=7)
            .map(|n| RESTART_BACKOFF.ceiling(n).as_secs())
            .collect();
        assert_eq!(ceilings, [1, 2, 4, 8, 16, 30, 30]);
        let mut retries = Retries::new(RESTART_BACKOFF);
        assert!(retries.next_delay() <= Duration::from_secs(1));
    }

    #[test]
    fn a_foreign_folder_is_refused() {
        let dir = std::env::temp_dir().join(format!("cairn-instance-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(matches!(data_folder(&dir), Ok(DataFolder::Absent)));
        std::fs::create_dir_all(&dir).unwrap_or_default();
        assert!(matches!(data_folder(&dir), Ok(DataFolder::Absent)));
        std::fs::write(dir.join("notes.txt"), "mine").unwrap_or_default();
        let refused = data_folder(&dir).err().unwrap_or_default();
        assert!(refused.contains("refusing"), "{refused}");
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
    fn a_history_shows_whether_a_replica_forked() {
        let history = "1\t0/3000148\tno recovery target specified\n\n2\t0/5000000\tno recovery target specified\n";
        assert_eq!(forked(history, 1, 0x300_0148), None);
        assert_eq!(forked(history, 1, 0x300_0000), None);
        assert_eq!(
            forked(history, 1, 0x300_0200).as_deref(),
            Some("it replayed timeline 1 up to 0/3000200, past the switch at 0/3000148")
        );
        assert_eq!(forked(history, 2, 0x500_0000), None);
        assert_eq!(
            forked(history, 4, 0x100).as_deref(),
            Some("timeline 4 is not in its history")
        );
    }

    #[test]
    fn only_unused_slots_of_removed_pods_are_dropped_after_the_grace() {
        let mut leaving = LeavingSlots::default();
        let kept = ["orders_0".to_owned(), "orders_1".to_owned()];
        let unused = || {
            ["orders_1", "orders_3", "orders_extra", "other_4", "orders_"]
                .map(str::to_owned)
                .to_vec()
        };
        let grace = Duration::from_millis(50);
        assert!(leaving.due("orders_", unused(), &kept, grace).is_empty());
        std::thread::sleep(grace);
        assert_eq!(leaving.due("orders_", unused(), &kept, grace), ["orders_3"]);
        // Seen in use again (or back in the members): the wait starts over.
        assert!(leaving.due("orders_", vec![], &kept, grace).is_empty());
        assert!(leaving.due("orders_", unused(), &kept, grace).is_empty());
    }

    #[test]
    fn history_file_names() {
        assert_eq!(history_timeline("00000002.history"), Some(2));
        assert_eq!(history_timeline("0000000A.history"), Some(10));
        assert_eq!(history_timeline("000000010000000000000001"), None);
        assert_eq!(history_timeline("2.history"), None);
    }

    #[test]
    fn quoting() {
        assert_eq!(identifier("a\"b"), "\"a\"\"b\"");
        assert_eq!(literal("it's"), "'it''s'");
        assert_eq!(
            sibling(Path::new("/d/pgdata"), "clone"),
            Path::new("/d/pgdata.clone")
        );
    }
}
