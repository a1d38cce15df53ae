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
use crate::error::{Context, Error, sql_message};
use crate::files::{sync_parent, write_atomically};
use crate::membership::{Assignment, Bootstrap, Heartbeat};
use crate::observe::{self, Limits, Role};
use crate::scram;
use crate::state::{Phase, State};
use crate::tls::Tls;

mod folder;
mod restore;
mod roles;
mod upstream;

use folder::{
    DataFolder, data_folder, latest_history, refuse_after_interrupted_rewind, remove_if_present,
    remove_stale_lock_file, rewind_marker,
};
use upstream::{
    CONNECT_HUNG_AFTER, CONNECT_HUNG_CEILING, LeavingSlots, Slot, Source, Stuck, end_hung_receiver,
};

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
            if let Err(error) = prepared {
                self.state.update(|s| s.failed_starts += 1);
                let mut message = error.to_string();
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
                    self.state.update(|s| s.failed_starts += 1);
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
                    // A restart asked for is no failure, and postgres did
                    // start: the failures before it are over. Otherwise a
                    // demoted primary that cannot reach its new primary yet
                    // waited up to 30 s between attempts, counting the
                    // failed clones of its first start.
                    backoff.reset();
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

    fn read_role(&self) -> Result<Role, Error> {
        self.assignment
            .borrow()
            .role
            .ok_or_else(|| Error::Waiting("no role assigned yet".to_owned()))
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
                    Some(why) => Err(Error::Waiting(why)),
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
                    let reason = reason.to_string();
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
    async fn prepare(&self, role: Role, reclone: Option<String>) -> Result<(), Error> {
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
                        // A promotion not yet checkpointed shows only in pg_wal.
                        let timeline = control.timeline.max(latest_history(data));
                        let unrewindable = match self.check_rewind_source(timeline).await? {
                            Source::Rewindable(host) => match self.rewind(&host).await? {
                                None => self.wal_missing_after_rewind().await,
                                refused => refused,
                            },
                            Source::Unrewindable(why) => Some(why),
                        };
                        match unrewindable {
                            Some(why) => {
                                self.state.phase(Phase::Bootstrapping);
                                self.reclone(&why).await?;
                            }
                            None => remove_if_present(&rewind_marker(data))?,
                        }
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

    /// `archive_command` when the cluster has a backup destination: this
    /// program as a client of the archiver in this process.
    fn archive_command(&self) -> Result<Option<String>, Error> {
        if self.config.backup_bucket.is_none() || self.config.verify {
            return Ok(None);
        }
        let program = std::env::current_exe()
            .context(|| "finding this program for archive_command".to_owned())?;
        Ok(Some(conf::archive_command(
            &program,
            &self.config.wal_archive_socket(),
        )))
    }

    /// Whether this folder is a restore still replaying the source's WAL
    /// (PostgreSQL removes recovery.signal when it promotes at the end).
    fn restoring(&self) -> bool {
        self.config.data_dir.join("recovery.signal").exists()
    }

    /// A restore's recovery settings, while it replays.
    fn recovery(&self) -> Result<Option<conf::Recovery>, Error> {
        if !self.restoring() {
            return Ok(None);
        }
        let program = std::env::current_exe()
            .context(|| "finding this program for restore_command".to_owned())?;
        Ok(Some(conf::Recovery {
            restore_command: conf::restore_command(&program, &self.config.wal_archive_socket()),
            target: self.config.restore_target().map_err(Error::Setup)?,
        }))
    }

    /// postgresql.conf in the data folder: the controller's, then this instance's.
    fn write_conf(&self, role: Role) -> Result<(), Error> {
        let source = self.config.config_dir.join("postgresql.conf");
        let controller_conf = std::fs::read_to_string(&source)
            .context(|| format!("configuration {}", source.display()))?;
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
                archive_command: self.archive_command()?,
                recovery: self.recovery()?,
                alone: self.config.verify,
                wal_keep_for_backup_mb: self.wal_keep_for_backup_mb(),
            },
        );
        write_atomically(&self.config.data_dir.join("postgresql.conf"), &text, 0o600)
    }

    /// The password file a replica uses towards its primary: the replication
    /// user (streaming, cloning) and the superuser (pg_rewind).
    fn write_passwords(&self) -> Result<(), Error> {
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

    fn start_postgres(&self) -> Result<Child, Error> {
        let mut postgres = Command::new(self.config.program("postgres"));
        postgres
            .arg("-D")
            .arg(&self.config.data_dir)
            .stdin(Stdio::null());
        let child = self
            .children
            .spawn(&mut postgres)
            .context(|| "cannot start postgres".to_owned())?;
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
        // A logical restore's dump loaded (or none to load): readiness
        // waits for it, so an empty database is never served as restored.
        let mut dump_loaded = !self.dump_pending();
        let (mut next_load, mut load_failures) = (Instant::now(), 0);
        let mut promoted = false;
        let mut last_streaming: Option<Instant> = None;
        let mut primary_answering_since: Option<Instant> = None;
        let started = Instant::now();
        let mut pending_logged: Vec<String> = Vec::new();
        let mut leaving_slots = LeavingSlots::default();
        let mut hung_after = CONNECT_HUNG_AFTER;
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
                        self.state.observe(None, Err(reason.to_string()));
                        // A rewound replica accepts connections only once it
                        // has streamed up to its consistency point, and it
                        // streams only through its slot: make the slot even
                        // while this server does not answer.
                        if assigned == Role::Replica
                            && tick.is_multiple_of(5)
                            && let Some(reason) = self.try_make_slot().await
                        {
                            return Restart {
                                reclone: Some(reason.clone()),
                                ..Restart::new(reason)
                            };
                        }
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
                    self.state
                        .observe(None, Err(format!("query failed: {}", sql_message(&e))));
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
                // A restore's recovery ends by itself, at its target.
                (Role::Primary, true) if !promoted && !self.restoring() => {
                    promoted = self.promote(&connection.client).await;
                }
                (Role::Primary, false) if !roles_current => {
                    roles_current = self.ensure_roles(&connection.client).await;
                    roles_ready |= roles_current;
                }
                (Role::Primary, false) if !dump_loaded && Instant::now() >= next_load => {
                    dump_loaded = self.load_dump().await;
                    if !dump_loaded {
                        load_failures += 1;
                        self.state.update(|s| s.dump_load_failures = load_failures);
                        next_load = Instant::now() + Backoff::default().ceiling(load_failures);
                    }
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
                primary_answering_since = None;
                hung_after = CONNECT_HUNG_AFTER;
            } else if assigned == Role::Replica && !tick.is_multiple_of(5) {
                // Four polls of five look at the local WAL receiver; the
                // fifth asks the primary (below).
                if end_hung_receiver(&connection.client, postgres.pid(), hung_after).await {
                    // A primary that is merely slow to connect to gets longer.
                    hung_after = (hung_after * 2).min(CONNECT_HUNG_CEILING);
                }
            } else if assigned == Role::Replica {
                let silent_for = last_streaming.unwrap_or(started).elapsed();
                match self
                    .stuck(&sample, silent_for, &mut primary_answering_since)
                    .await
                {
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
            let setting_up = if !roles_ready {
                Some("creating the application database and roles")
            } else if !dump_loaded {
                Some("loading the logical backup restored")
            } else {
                None
            };
            let ready = observe::readiness(assigned, &sample, silence, setting_up, limits);
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
        self.make_member_slots(client).await;
        match client
            .execute("SELECT pg_promote(wait => false)", &[])
            .await
        {
            Ok(_) => true,
            Err(e) => {
                self.state
                    .error(format!("promotion failed: {}", sql_message(&e)));
                false
            }
        }
    }

    /// The superuser's connection settings for a server.
    fn superuser(&self, host: &str, port: u16) -> Result<tokio_postgres::Config, Error> {
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
    async fn connect(&self) -> Result<observe::Session, Error> {
        let mut config = self.superuser("127.0.0.1", self.config.port)?;
        config
            .options(format!(
                "-c statement_timeout={}",
                QUERY_TIMEOUT.as_millis()
            ))
            .connect_timeout(Duration::from_secs(3));
        let refused = match config.connect(tokio_postgres::NoTls).await {
            Ok((client, connection)) => {
                tokio::spawn(connection);
                return observe::Session::new(client)
                    .await
                    .context(|| "preparing the monitoring query".to_owned());
            }
            Err(e) => {
                let code = e.code();
                if code.is_some() {
                    // It answered, with a refusal: alive.
                    self.state.answered();
                }
                if code != Some(&SqlState::INVALID_PASSWORD)
                    && code != Some(&SqlState::INVALID_AUTHORIZATION_SPECIFICATION)
                {
                    return Err(Error::Sql {
                        what: "not accepting connections".to_owned(),
                        source: e,
                    });
                }
                e
            }
        };
        // The server holds another superuser password (a restored backup's,
        // or one rotated in the Secret): over the socket, as the OS user
        // `postgres` (peer authentication, in the pod's image), until the
        // primary sets the Secret's password (`ensure_roles`).
        let mut peer = tokio_postgres::Config::new();
        peer.host_path(&self.config.run_dir)
            .port(self.config.port)
            .user("postgres")
            .dbname("postgres")
            .application_name("cairn-instance")
            .options(format!(
                "-c statement_timeout={}",
                QUERY_TIMEOUT.as_millis()
            ))
            .connect_timeout(Duration::from_secs(3));
        match peer.connect(tokio_postgres::NoTls).await {
            Ok((client, connection)) => {
                tokio::spawn(connection);
                observe::Session::new(client)
                    .await
                    .context(|| "preparing the monitoring query".to_owned())
            }
            Err(_) => {
                let error = Error::Setup(format!(
                    "postgres refused the superuser's credentials: {refused}"
                ));
                self.state.error(error.to_string());
                Err(error)
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

    /// What postgresql.conf is written from: the controller's files, and
    /// whether a base backup runs (it keeps more WAL meanwhile).
    fn config_files(&self) -> (Option<(String, String)>, bool) {
        let read = |name: &str| std::fs::read_to_string(self.config.config_dir.join(name)).ok();
        let files = read("postgresql.conf").zip(read("pg_hba.conf"));
        (files, self.state.status().base_backup_running)
    }

    /// While a base backup runs: a tenth of the data volume (what
    /// replication slots may hold), at least the usual 256 MB.
    fn wal_keep_for_backup_mb(&self) -> Option<u64> {
        let status = self.state.status();
        status
            .base_backup_running
            .then(|| (status.data_volume_bytes.unwrap_or(0) / 10 / (1024 * 1024)).max(256))
    }

    fn primary_host(&self) -> Result<String, Error> {
        self.config.primary_host().ok_or_else(|| {
            Error::Setup("no primary to follow: set CAIRN_CLUSTER or CAIRN_PRIMARY_HOST".to_owned())
        })
    }

    fn credential(&self, key: &str) -> Result<String, Error> {
        self.config
            .credential(key)
            .context(|| "credentials".to_owned())
    }

    fn passfile(&self) -> PathBuf {
        self.config.run_dir.join("pgpass")
    }
}

fn last_lines(text: &str, count: usize) -> String {
    let lines: Vec<_> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(count)..].join(" | ")
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
}
