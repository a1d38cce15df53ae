//! postgres itself: its configuration (postgresql.conf, and the password
//! file a replica uses towards its primary), the process started and
//! stopped, and this process's session on it.

use std::process::{Command, Stdio};
use std::time::Duration;

use cairn_api::database::instance as contract;
use nix::sys::signal::Signal;
use tokio_postgres::error::SqlState;

use super::Supervisor;
use crate::children::Child;
use crate::conf;
use crate::error::{Context, Error};
use crate::files::write_atomically;
use crate::observe::{self, Role};
use crate::state::Phase;

/// The longest a query of this process may take (also its statement_timeout).
pub(super) const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

impl Supervisor {
    /// postgresql.conf in the data folder: the controller's, then this instance's.
    pub(super) fn write_conf(&self, role: Role) -> Result<(), Error> {
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
    pub(super) fn restoring(&self) -> bool {
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
            target: self.config.restore_target()?,
        }))
    }

    /// While a base backup runs: a tenth of the data volume (what
    /// replication slots may hold), at least the usual 256 MB.
    fn wal_keep_for_backup_mb(&self) -> Option<u64> {
        let status = self.state.status();
        status
            .base_backup_running
            .then(|| (status.data_volume_bytes.unwrap_or(0) / 10 / (1024 * 1024)).max(256))
    }

    /// The password file a replica uses towards its primary: the replication
    /// user (streaming, cloning) and the superuser (pg_rewind).
    pub(super) fn write_passwords(&self) -> Result<(), Error> {
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

    pub(super) fn start_postgres(&self) -> Result<Child, Error> {
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
    pub(super) async fn stop(&self, postgres: &mut Child, smart: bool) {
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
    pub(super) async fn stop_now(&self, postgres: &mut Child) {
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

    /// After a demotion: where the shutdown checkpoint is, so the controller
    /// promotes a replica only once it has received everything up to it.
    pub(super) async fn report_shutdown_position(&self) {
        match self.control_data().await {
            Ok(control) => match control.shutdown_checkpoint() {
                Some(position) => {
                    tracing::info!(position, "stopped as a primary");
                    let position = position.to_owned();
                    self.state.update(|s| s.shutdown_position = Some(position));
                }
                // A switchover then waits for its deadline and gives up.
                None => tracing::warn!(
                    "stopped without a shutdown checkpoint (an immediate stop): no position to report"
                ),
            },
            Err(message) => tracing::warn!(%message, "cannot read the shutdown checkpoint"),
        }
    }

    /// A session as the superuser over loopback (pg_hba's `local` line is
    /// peer authentication, which needs the OS user to be `postgres`).
    pub(super) async fn connect(&self) -> Result<observe::Session, Error> {
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
                // "the database system is starting up": crash recovery,
                // which the controller gives a start timeout.
                let starting = code == Some(&SqlState::CANNOT_CONNECT_NOW);
                self.state.update(|s| s.starting = starting);
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
                self.state.failed(&error);
                Err(error)
            }
        }
    }
}
