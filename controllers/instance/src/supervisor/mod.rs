//! The instance's life: wait for a role, bootstrap the data folder if it is
//! new, run postgres, watch it (configuration, role, health), and stop it
//! cleanly. An unexpected exit of postgres starts it again after a backoff,
//! in this process: the data folder is never removed or rewritten.
//!
//! This file is that loop; each step has its own: `folder` (the data folder
//! made ready for a role), `rewind` (a former primary's folder made to
//! follow), `restore` (a backup restored), `postgres` (its configuration and
//! process), `watch` (following it while it runs), `roles`, the primary as a
//! replica asks it (`upstream`, `stuck`), the other members' slots
//! (`member_slots`), and what WAL and timeline files say (`wal`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_api::database::instance as contract;
use cairn_runtime::errors::{Backoff, Retries};

use crate::children::Children;
use crate::config::Config;
use crate::error::{Context, Error};
use crate::membership::Assignment;
use crate::observe::Role;
use crate::primacy::Primacy;
use crate::state::{Phase, State};
use crate::tls::Tls;

mod folder;
mod member_slots;
mod postgres;
mod restore;
mod rewind;
mod roles;
mod stuck;
mod upstream;
mod wal;
mod watch;

pub struct Supervisor {
    config: Config,
    tls: Tls,
    children: Children,
    state: Arc<State>,
    assignment: tokio::sync::watch::Receiver<Assignment>,
    primacy: Primacy,
}

impl Supervisor {
    pub fn new(
        config: Config,
        children: Children,
        state: Arc<State>,
        assignment: tokio::sync::watch::Receiver<Assignment>,
        primacy: Primacy,
    ) -> Self {
        Self {
            tls: Tls::new(&config.tls_dir, &config.run_dir),
            config,
            children,
            state,
            assignment,
            primacy,
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
                self.state.failed_saying(&error, message);
                self.state.phase(Phase::Retrying);
                tokio::select! {
                    () = tokio::time::sleep(backoff.next_delay()) => continue,
                    () = &mut shutdown => break,
                }
            }
            let mut postgres = match self.start_postgres() {
                Ok(child) => child,
                Err(error) => {
                    self.state.update(|s| s.failed_starts += 1);
                    self.state.failed(&error);
                    self.state.phase(Phase::Retrying);
                    tokio::select! {
                        () = tokio::time::sleep(backoff.next_delay()) => continue,
                        () = &mut shutdown => break,
                    }
                }
            };
            let started = Instant::now();
            let signaller = postgres.signaller();
            if role == Role::Primary {
                self.primacy.serving(signaller.clone());
            }
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
                    self.primacy.stopped().await;
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
                    self.primacy.stopped().await;
                    break;
                }
            };
            self.primacy.stopped().await;
            // Stopped by the fence: no failure; it waits for a role it may take.
            if role == Role::Primary
                && let Some(why) = self.primacy.forbids_primary()
            {
                tracing::warn!(%exit, reason = %why, "postgres stopped by the fence");
                self.state.error(why);
                backoff.reset();
                continue;
            }
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
    /// primary also needs a fresh heartbeat, no fencing, and no other
    /// member claiming to be a writable primary.
    async fn wait_for_role(&self) -> Role {
        let mut assignment = self.assignment.clone();
        let mut logged = None;
        loop {
            let waiting = match self.read_role() {
                Ok(Role::Primary) => match self
                    .primacy
                    .forbids_primary()
                    .or_else(|| self.primacy.forbids_promotion())
                {
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
