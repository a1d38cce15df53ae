//! A replica that does not stream: whether it must restart (its slot
//! lost, its history forked off the primary's, its WAL receiver stuck) and
//! how; and ending a WAL receiver that hangs while it connects.

use std::time::{Duration, Instant};

use cairn_api::database::instance::parse_lsn;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio_postgres::Client;

use super::Supervisor;
use super::postgres::QUERY_TIMEOUT;
use super::upstream::{SLOT_LOST, Slot};
use super::wal::forked;
use crate::error::sql_message;
use crate::observe;

impl Supervisor {
    /// Why this replica, not streaming, must restart, if it must: its slot
    /// was invalidated, or (silent for `STUCK_AFTER` while the primary has
    /// answered for as long) its history forked off the primary's, or its
    /// WAL receiver is stuck. Creates a missing slot meanwhile.
    /// `answering_since` is when the primary began answering these checks
    /// without a break: a primary back from a restart gets the WAL
    /// receiver's retry interval to reconnect before anything is decided.
    pub(super) async fn stuck(
        &self,
        sample: &observe::Sample,
        silent_for: Duration,
        answering_since: &mut Option<Instant>,
    ) -> Option<Stuck> {
        match self.check_slot().await {
            Ok(Slot::Lost) => {
                return Some(Stuck::Reclone(SLOT_LOST.to_owned()));
            }
            Ok(Slot::Kept) => {}
            Ok(Slot::NotYet) => {
                *answering_since = None;
                return None;
            }
            Err(message) => {
                tracing::debug!(%message, "cannot check the replication slot");
                *answering_since = None;
                return None;
            }
        }
        let answering_for = answering_since.get_or_insert_with(Instant::now).elapsed();
        if silent_for < STUCK_AFTER || answering_for < STUCK_AFTER {
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
}

/// Why a replica that does not stream must restart, and how.
pub(super) enum Stuck {
    Reconnect(String),
    Reclone(String),
}

/// A replica that has not streamed for this long while the primary has
/// answered for as long is stuck: its history forked off the primary's (it is cloned again), or
/// its WAL receiver hangs on a connection to a frozen former primary, which
/// no PostgreSQL timeout ends while it is still connecting (postgres is
/// restarted, and the receiver connects through `-rw` again).
const STUCK_AFTER: Duration = Duration::from_secs(10);

/// A WAL receiver still connecting after this long hangs (a connection
/// takes milliseconds; a TLS handshake over a loaded node, well under this).
/// Doubled after each one ended, up to the ceiling, until the replica
/// streams: a primary slow to connect to is still reached.
pub(super) const CONNECT_HUNG_AFTER: Duration = Duration::from_secs(3);
pub(super) const CONNECT_HUNG_CEILING: Duration = Duration::from_secs(60);

/// Ends this server's WAL receiver when it has been connecting for longer
/// than `after` (`CONNECT_HUNG_AFTER` at first): a connection begun to a
/// primary whose node then stopped (through `-rw`, just before the relabel)
/// waits without limit (the receiver connects asynchronously and ignores
/// `connect_timeout`). PostgreSQL starts another `wal_retrieve_retry_interval`
/// (5 s) later, through `-rw` again, which by then may lead to a promoted
/// replica: a synchronous commit waits for no more. Unlike a restart,
/// sessions on this replica are kept. SIGTERM, as `pg_terminate_backend`
/// does not reach the receiver (not a backend). Whether one was ended; local
/// and best effort.
pub(super) async fn end_hung_receiver(client: &Client, postmaster: Pid, after: Duration) -> bool {
    let seconds = after.as_secs_f64();
    let answer = tokio::time::timeout(
        QUERY_TIMEOUT,
        client.query(
            "SELECT pid, extract(epoch FROM now() - backend_start)::float8
             FROM pg_stat_activity
             WHERE backend_type = 'walreceiver' AND wait_event = 'LibPQWalReceiverConnect'
               AND now() - backend_start > make_interval(secs => $1)",
            &[&seconds],
        ),
    )
    .await;
    let hung = match answer {
        Ok(Ok(rows)) => rows,
        Ok(Err(e)) => {
            tracing::debug!(error = %sql_message(&e), "cannot check the WAL receiver");
            return false;
        }
        Err(_) => return false,
    };
    let mut ended = false;
    for row in hung {
        let (pid, seconds): (i32, f64) = (row.get(0), row.get(1));
        let pid = Pid::from_raw(pid);
        // Its pid, not one another process took since: our postmaster's child.
        if parent_of(pid) != Some(postmaster) {
            continue;
        }
        match kill(pid, Signal::SIGTERM) {
            Ok(()) => {
                ended = true;
                tracing::warn!(
                    %pid,
                    "the WAL receiver has been connecting for {seconds:.0} s: ended it, so that it \
                     connects again"
                );
            }
            Err(e) => tracing::warn!(%pid, error = %e, "cannot end the hung WAL receiver"),
        }
    }
    ended
}

/// The parent of a process, from `/proc/<pid>/stat` ("pid (comm) state
/// ppid …"; the command may hold spaces and parentheses).
fn parent_of(pid: Pid) -> Option<Pid> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields = &stat[stat.rfind(')')? + 1..];
    fields
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
        .map(Pid::from_raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_of_a_process_is_read_from_proc() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("sleep runs");
        let pid = Pid::from_raw(i32::try_from(child.id()).expect("a pid"));
        assert_eq!(parent_of(pid), Some(nix::unistd::getpid()));
        assert_eq!(
            parent_of(nix::unistd::getpid()),
            Some(nix::unistd::getppid())
        );
        child.kill().expect("killed");
        child.wait().expect("reaped");
        assert_eq!(parent_of(pid), None, "gone");
    }
}
