//! The primary as a replica asks it: a superuser session there, every
//! question bounded in time; this replica's replication slot on it; its
//! timeline history.

use std::time::Duration;

use tokio_postgres::Client;

use super::Supervisor;
use crate::conf;
use crate::error::{Context, Error};

impl Supervisor {
    /// A superuser session on the primary whose every query is bounded by
    /// `PRIMARY_TIMEOUT` (statement_timeout covers a slow query; the
    /// callers bound the whole exchange for a server that does not answer).
    pub(super) async fn primary_superuser(&self) -> Result<(Client, String), Error> {
        let host = self.primary_host()?;
        let (client, connection) = self
            .superuser(&host, self.config.primary_port)?
            .connect_timeout(PRIMARY_TIMEOUT)
            .ssl_mode(tokio_postgres::config::SslMode::Require)
            .connect(self.tls.connector()?)
            .await
            .context(|| format!("cannot reach the primary {host}"))?;
        tokio::spawn(connection);
        Ok((client, host))
    }

    pub(super) fn slot_name(&self) -> String {
        conf::slot_name(self.config.pod_name.as_deref().unwrap_or("cairn-instance"))
    }

    /// Makes sure the primary keeps this replica's replication slot, so it
    /// keeps the WAL this replica has not received (up to the controller's
    /// `max_slot_wal_keep_size`). Slots are not replicated: after a failover
    /// each replica creates its slot on the new primary this way.
    pub(super) async fn check_slot(&self) -> Result<Slot, Error> {
        bounded(PRIMARY_TIMEOUT, self.try_check_slot(false)).await
    }

    /// `check_slot`, and a slot that reserves no WAL yet (one made before
    /// the promotion, unused) is made again reserving WAL from now: before a
    /// clone or a rewind, whose WAL must be kept until the replica streams.
    pub(super) async fn reserve_slot(&self) -> Result<Slot, Error> {
        bounded(PRIMARY_TIMEOUT, self.try_check_slot(true)).await
    }

    pub(super) async fn try_check_slot(&self, reserve: bool) -> Result<Slot, Error> {
        let (client, host) = self.primary_superuser().await?;
        let slot = self.slot_name();
        let row = client
            .query_one(
                "SELECT pg_is_in_recovery(),
                        (SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1)",
                &[&slot],
            )
            .await
            .context(|| format!("replication slot {slot} on {host}"))?;
        let (standby, wal_status): (bool, Option<String>) = (row.get(0), row.get(1));
        match wal_status.as_deref() {
            // Not promoted yet: whatever slots it holds (made for its
            // promotion, or stale, even lost, from when it was a primary)
            // say nothing of the one this replica will stream through.
            _ if standby => return Ok(Slot::NotYet),
            Some("lost") => return Ok(Slot::Lost),
            Some(_) => return Ok(Slot::Kept),
            None => {}
        }
        if reserve {
            client
                .execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
                     WHERE slot_name = $1 AND restart_lsn IS NULL AND wal_status IS NULL
                       AND NOT active",
                    &[&slot],
                )
                .await
                .context(|| format!("replication slot {slot} on {host}"))?;
        }
        client
            .execute(
                "SELECT pg_create_physical_replication_slot($1, true)
                 WHERE NOT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1)",
                &[&slot],
            )
            .await
            .context(|| format!("replication slot {slot} on {host}"))?;
        tracing::info!(%slot, %host, "created this replica's replication slot on the primary");
        Ok(Slot::Kept)
    }

    /// One attempt at this replica's slot while its own server does not
    /// answer (`stuck` needs a sample): `Some(reason)` when the slot was
    /// invalidated, so the WAL it needs to reach consistency is gone and it
    /// must be cloned again. A failure (the primary restarting, no free
    /// slot) is left to the caller's next attempt; it waits at most
    /// `PRIMARY_TIMEOUT`.
    pub(super) async fn try_make_slot(&self) -> Option<String> {
        match self.check_slot().await {
            Ok(Slot::Lost) => Some(SLOT_LOST.to_owned()),
            Ok(Slot::Kept | Slot::NotYet) => None,
            Err(message) => {
                tracing::debug!(%message, "no replication slot yet");
                None
            }
        }
    }

    /// A lost slot reserves nothing: it is dropped so `check_slot` creates
    /// it again, reserving WAL from now, before a new base backup starts.
    pub(super) async fn drop_lost_slot(&self) -> Result<(), Error> {
        bounded(PRIMARY_TIMEOUT, self.try_drop_lost_slot()).await
    }

    async fn try_drop_lost_slot(&self) -> Result<(), Error> {
        let (client, host) = self.primary_superuser().await?;
        let slot = self.slot_name();
        client
            .execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
                 WHERE slot_name = $1 AND wal_status = 'lost' AND NOT active",
                &[&slot],
            )
            .await
            .context(|| format!("dropping the lost replication slot {slot} on {host}"))?;
        Ok(())
    }

    /// The primary's timeline and its history file, when it is on a later
    /// timeline than `timeline`.
    pub(super) async fn primary_history(
        &self,
        timeline: u32,
    ) -> Result<Option<(u32, String)>, Error> {
        bounded(PRIMARY_TIMEOUT, self.try_primary_history(timeline)).await
    }

    async fn try_primary_history(&self, timeline: u32) -> Result<Option<(u32, String)>, Error> {
        let (client, host) = self.primary_superuser().await?;
        let row = client
            .query_one(
                "SELECT CASE WHEN pg_is_in_recovery() THEN NULL
                        ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int8 END",
                &[],
            )
            .await
            .context(|| format!("the timeline of {host}"))?;
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
            .context(|| format!("the history of timeline {current} on {host}"))?
            .get(0);
        Ok(Some((current, history)))
    }
}

/// A question to the primary, given up after `limit`.
pub(super) async fn bounded<T>(
    limit: Duration,
    question: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    tokio::time::timeout(limit, question)
        .await
        .unwrap_or_else(|_| {
            Err(Error::Timeout(format!(
                "the primary did not answer within {limit:?}"
            )))
        })
}

/// The longest a question to the primary may take: the watch loop waits
/// for it, and `/livez` fails after three missed polls and 5 s. (A frozen
/// primary accepts the TCP connection and then answers nothing.)
pub(super) const PRIMARY_TIMEOUT: Duration = Duration::from_secs(3);

/// This replica's slot on the primary, as far as following goes.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Slot {
    Kept,
    /// The server behind `-rw` is still in recovery: it streams nobody yet.
    NotYet,
    /// Invalidated past `max_slot_wal_keep_size`: the WAL this replica
    /// needs is gone from the primary.
    Lost,
}

pub(super) const SLOT_LOST: &str = "the primary invalidated this replica's slot (max_slot_wal_keep_size): the WAL it needs is gone";
