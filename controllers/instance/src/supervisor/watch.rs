//! A running postgres followed until it must restart: the assigned role
//! (a demotion, fencing, a promotion), the controller's configuration, the
//! certificate and the passwords (reloaded in place), the server's health
//! and readiness, a replica that does not stream.

use std::time::{Duration, Instant};

use cairn_api::database::instance as contract;
use cairn_runtime::errors::Backoff;
use nix::sys::signal::Signal;
use tokio_postgres::Client;

use super::Supervisor;
use super::member_slots::LeavingSlots;
use super::postgres::QUERY_TIMEOUT;
use super::stuck::{CONNECT_HUNG_AFTER, CONNECT_HUNG_CEILING, Stuck, end_hung_receiver};
use crate::children::Signaller;
use crate::error::{Context, Error};
use crate::observe::{self, Limits, Role};

/// A run of postgres that must end in a restart in another role, and why.
/// A fenced primary stops at once: it must take no write the new primary
/// will not have.
pub(super) struct Restart {
    pub(super) reason: String,
    pub(super) fenced: bool,
    /// The folder cannot follow the primary any more: clone it again; why.
    pub(super) reclone: Option<String>,
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

impl Supervisor {
    /// Watches a running postgres until it must restart in another role.
    pub(super) async fn watch(&self, postgres: Signaller, started_as: Role) -> Restart {
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
        let mut promotion_held: Option<String> = None;
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
                && let Some(why) = self.primacy.forbids_primary()
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
                    Err(error) => self.state.failed(&error),
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
                    Err(error) => self.state.failed(&error),
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
                        Err(error) => self.state.failed(&error),
                    },
                    Role::Primary => credentials_seen = credentials_now,
                }
            }
            if session.is_none() {
                match self.connect().await {
                    Ok(connected) => session = Some(connected),
                    Err(reason) => {
                        self.state.observe(None, Err(reason));
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
                    let silent = Error::Timeout(format!("no answer within {QUERY_TIMEOUT:?}"));
                    self.state.observe(None, Err(silent));
                    continue;
                }
                Ok(Err(e)) => {
                    session = None;
                    let failed = Err(e).context(|| "query failed".to_owned());
                    self.state.observe(None, failed);
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
                    match self.primacy.forbids_promotion() {
                        Some(why) => {
                            if promotion_held.as_ref() != Some(&why) {
                                tracing::warn!(reason = %why, "assigned primary, waiting");
                                promotion_held = Some(why.clone());
                            }
                            self.state.update(|s| s.reason = Some(why));
                        }
                        None => promoted = self.promote(&connection.client, &postgres).await,
                    }
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

    async fn promote(&self, client: &Client, postgres: &Signaller) -> bool {
        tracing::info!("assigned primary while in recovery: promoting");
        if let Err(error) = self.write_conf(Role::Primary) {
            self.state.failed(&error);
            return false;
        }
        self.make_member_slots(client).await;
        // Claims and the fence before the first write the promotion allows.
        self.primacy.serving(postgres.clone());
        match client
            .execute("SELECT pg_promote(wait => false)", &[])
            .await
            .context(|| "promotion failed".to_owned())
        {
            Ok(_) => true,
            Err(error) => {
                self.state.failed(&error);
                false
            }
        }
    }

    /// What postgresql.conf is written from: the controller's files, and
    /// whether a base backup runs (it keeps more WAL meanwhile).
    fn config_files(&self) -> (Option<(String, String)>, bool) {
        let read = |name: &str| std::fs::read_to_string(self.config.config_dir.join(name)).ok();
        let files = read("postgresql.conf").zip(read("pg_hba.conf"));
        (files, self.state.status().base_backup_running)
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
}
