//! A replica and its primary: the replication slot it keeps there, whether
//! its history forked off the primary's, whether the primary can be a
//! rewind's source. Every question to the primary is bounded in time.

use std::collections::BTreeSet;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::folder::{first_missing_segment, segment_number};
use super::*;

impl Supervisor {
    /// pg_rewind trusts its source: a server still in recovery (its promotion
    /// not yet seen by the Service) or on the folder's own timeline would make
    /// it report "no rewind required" over diverged histories.
    pub(super) async fn check_rewind_source(&self, timeline: u32) -> Result<Source, Error> {
        // It checkpoints first, which may take a while on a busy primary.
        bounded(REWIND_CHECK_TIMEOUT, self.try_check_rewind_source(timeline)).await
    }

    pub(super) async fn try_check_rewind_source(&self, timeline: u32) -> Result<Source, Error> {
        let (client, host) = self.primary_superuser().await?;
        let sql = || format!("the primary {host} (to rewind from)");
        let in_recovery: bool = client
            .query_one("SELECT pg_is_in_recovery()", &[])
            .await
            .context(sql)?
            .get(0);
        if in_recovery {
            return Err(Error::Waiting(format!(
                "the primary {host} is still in recovery: rewinding once it is promoted"
            )));
        }
        // The slot first, so that the WAL written from the rewind's copy
        // on is kept until the rewound server streams it.
        if let Err(message) = self.try_check_slot(true).await {
            tracing::warn!(%message, "no replication slot yet");
        }
        // After a promotion the control file names the new timeline only
        // after a checkpoint; pg_rewind reads it there.
        client.batch_execute("CHECKPOINT").await.context(sql)?;
        let source: i32 = client
            .query_one("SELECT timeline_id FROM pg_control_checkpoint()", &[])
            .await
            .context(sql)?
            .get(0);
        // On the same timeline, two histories cannot be told apart: pg_rewind
        // would say "no rewind required" over a fork. (A source on an earlier
        // timeline is fine: pg_rewind compares both histories.)
        if u32::try_from(source) == Ok(timeline) {
            return Ok(Source::Unrewindable(format!(
                "the primary {host} is on this folder's timeline {source}, with another history: \
                 refusing to rewind over it"
            )));
        }
        let source = u32::try_from(source).unwrap_or_default();
        if source > timeline
            && let Some(segment) = self.wal_since_switch(&client, timeline, source).await?
        {
            let kept: bool = client
                .query_one(
                    "SELECT EXISTS (SELECT FROM pg_ls_waldir() WHERE name = $1)",
                    &[&segment],
                )
                .await
                .context(sql)?
                .get(0);
            if !kept {
                return Ok(Source::Unrewindable(format!(
                    "the WAL since timeline {timeline} ended ({segment} on) is gone from the \
                     primary {host}: a rewound folder could never catch up"
                )));
            }
        }
        Ok(Source::Rewindable(host))
    }

    /// After a rewind: whether each WAL segment the folder must replay,
    /// from the start its `backup_label` names (the last checkpoint both
    /// servers shared, whose redo can lie well before the switch) to its
    /// minimum recovery point, is in its pg_wal or still on the primary.
    /// pg_rewind does not check it, and a folder missing one never reaches
    /// consistency. `Some(why)` to clone instead. Best effort: a primary
    /// that does not answer leaves it to the slot checks.
    pub(super) async fn wal_missing_after_rewind(&self) -> Option<String> {
        match bounded(PRIMARY_TIMEOUT, self.try_wal_missing_after_rewind()).await {
            Ok(missing) => missing,
            Err(message) => {
                tracing::warn!(%message, "cannot check the WAL the rewound folder needs");
                None
            }
        }
    }

    async fn try_wal_missing_after_rewind(&self) -> Result<Option<String>, Error> {
        let data = &self.config.data_dir;
        let label = data.join("backup_label");
        if !label.exists() {
            return Ok(None); // "no rewind required": nothing to replay
        }
        let label = std::fs::read_to_string(&label)
            .context(|| "the backup_label pg_rewind wrote".to_owned())?;
        let start = label.lines().find_map(|line| {
            parse_lsn(
                line.strip_prefix("START WAL LOCATION: ")?
                    .split(' ')
                    .next()?,
            )
        });
        let end = self.control_data().await?.min_recovery_point;
        let (Some(start), Some(end)) = (start, end.filter(|lsn| *lsn > 0)) else {
            return Ok(None);
        };
        let (client, host) = self.primary_superuser().await?;
        let sql = || format!("the WAL files of {host}");
        let size: i64 = client
            .query_one(
                "SELECT setting::int8 FROM pg_settings WHERE name = 'wal_segment_size'",
                &[],
            )
            .await
            .context(sql)?
            .get(0);
        let size = u64::try_from(size).unwrap_or_default();
        let primary: BTreeSet<u64> = client
            .query("SELECT name FROM pg_ls_waldir()", &[])
            .await
            .context(sql)?
            .iter()
            .filter_map(|row| segment_number(row.get(0), size))
            .collect();
        let local: BTreeSet<u64> = std::fs::read_dir(data.join("pg_wal"))
            .context(|| "pg_wal".to_owned())?
            .flatten()
            .filter_map(|entry| segment_number(entry.file_name().to_str()?, size))
            .collect();
        Ok(
            first_missing_segment(start, end, size, &local, &primary).map(|segment| {
                format!(
                    "the rewound folder must replay WAL from {} to {}, and segment {segment} of \
                     it is neither in its pg_wal nor on the primary {host}: it could never catch up",
                    format_lsn(start),
                    format_lsn(end)
                )
            }),
        )
    }

    /// The first WAL segment a folder rewound from timeline `timeline` must
    /// replay from the primary (on `source`, a later timeline): where its
    /// timeline ended. pg_rewind does not check that the primary still has
    /// it, and replicas have no archive to fetch it from. `None` when the
    /// history does not name `timeline` (pg_rewind then refuses by itself).
    async fn wal_since_switch(
        &self,
        client: &Client,
        timeline: u32,
        source: u32,
    ) -> Result<Option<String>, Error> {
        let row = client
            .query_one(
                "SELECT pg_read_file('pg_wal/' || $1 || '.history'),
                        (SELECT setting::int8 FROM pg_settings WHERE name = 'wal_segment_size')",
                &[&format!("{source:08X}")],
            )
            .await
            .context(|| format!("the history of timeline {source}"))?;
        let (history, segment_size): (String, i64) = (row.get(0), row.get(1));
        let segment_size = u64::try_from(segment_size).unwrap_or_default();
        Ok(first_segment_after_switch(
            &history,
            timeline,
            source,
            segment_size,
        ))
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

    pub(super) async fn try_drop_lost_slot(&self) -> Result<(), Error> {
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

    /// Before a promotion: the slot of every other member, so that each
    /// replica finds its slot on its first try to follow this server. Slots
    /// are not replicated, and without one the new primary refuses a
    /// replica's WAL receiver, which then waits `wal_retrieve_retry_interval`
    /// (5 s) before it tries again: 5 s more without a synchronous commit.
    /// Made on the standby, they outlive the promotion. They reserve no WAL
    /// (`restart_lsn` NULL) until a replica streams through one, so a member
    /// that never comes back costs no disk and its slot is never lost to
    /// `max_slot_wal_keep_size`; a replica about to clone or rewind makes
    /// its own again, reserving (`reserve_slot`). A member's slot left lost
    /// from when this server was a primary is dropped first. Best effort: a
    /// failure is logged, and each replica makes its own slot anyway.
    pub(super) async fn make_member_slots(&self, client: &Client) {
        let Some(members) = self.members() else {
            return;
        };
        let own = self.slot_name();
        let slots: Vec<String> = members
            .iter()
            .map(|pod| conf::slot_name(pod))
            .filter(|slot| *slot != own)
            .collect();
        if let Err(e) = client
            .execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
                 WHERE slot_name = ANY($1) AND wal_status = 'lost' AND NOT active",
                &[&slots],
            )
            .await
        {
            tracing::warn!(error = %sql_message(&e), "cannot drop the members' lost replication slots");
        }
        match client
            .query(
                "SELECT (pg_create_physical_replication_slot(slot)).slot_name::text
                 FROM unnest($1::text[]) AS slot
                 WHERE NOT EXISTS (SELECT FROM pg_replication_slots s WHERE s.slot_name = slot)",
                &[&slots],
            )
            .await
        {
            Ok(rows) if rows.is_empty() => {}
            Ok(rows) => {
                let made: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
                tracing::info!(?made, "made the other members' replication slots");
            }
            Err(e) => {
                tracing::warn!(error = %sql_message(&e), "cannot make the other members' replication slots");
            }
        }
    }

    /// On the primary: drops the slot of each pod the cluster no longer has
    /// (a scale-down), once it has been unused for the grace period, so it
    /// stops holding WAL. Slots other tools made (other names) are not
    /// touched. Best effort: a failure is logged and tried again later.
    pub(super) async fn drop_slots_of_removed_pods(
        &self,
        client: &Client,
        leaving: &mut LeavingSlots,
    ) {
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

    /// The primary's timeline and its history file, when it is on a later
    /// timeline than `timeline`.
    pub(super) async fn primary_history(
        &self,
        timeline: u32,
    ) -> Result<Option<(u32, String)>, Error> {
        bounded(PRIMARY_TIMEOUT, self.try_primary_history(timeline)).await
    }

    pub(super) async fn try_primary_history(
        &self,
        timeline: u32,
    ) -> Result<Option<(u32, String)>, Error> {
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
}

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

/// What a former primary's folder can follow the current primary by.
pub(super) enum Source {
    /// pg_rewind from this host.
    Rewindable(String),
    /// Only a new clone can follow; why. Both were primaries on the same
    /// timeline (pg_rewind would see one history and rewind nothing), or
    /// the primary no longer has the WAL since this folder's timeline ended.
    Unrewindable(String),
}

/// The longest a question to the primary may take: the watch loop waits
/// for it, and `/livez` fails after three missed polls and 5 s. (A frozen
/// primary accepts the TCP connection and then answers nothing.)
pub(super) const PRIMARY_TIMEOUT: Duration = Duration::from_secs(3);

/// The longest the check before a rewind may take (it checkpoints the
/// primary); a source that stops answering must not hold up the retry.
pub(super) const REWIND_CHECK_TIMEOUT: Duration = Duration::from_secs(120);

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

/// A WAL receiver still connecting after this long hangs (a connection
/// takes milliseconds; a TLS handshake over a loaded node, well under this).
/// Doubled after each one ended, up to the ceiling, until the replica
/// streams: a primary slow to connect to is still reached.
pub(super) const CONNECT_HUNG_AFTER: Duration = Duration::from_secs(3);
pub(super) const CONNECT_HUNG_CEILING: Duration = Duration::from_secs(60);

/// A replica that has not streamed for this long while the primary has
/// answered for as long is stuck: its history forked off the primary's (it is cloned again), or
/// its WAL receiver hangs on a connection to a frozen former primary, which
/// no PostgreSQL timeout ends while it is still connecting (postgres is
/// restarted, and the receiver connects through `-rw` again).
pub(super) const STUCK_AFTER: Duration = Duration::from_secs(10);

const SLOT_LOST: &str = "the primary invalidated this replica's slot (max_slot_wal_keep_size): the WAL it needs is gone";

/// Why a replica that does not stream must restart, and how.
pub(super) enum Stuck {
    Reconnect(String),
    Reclone(String),
}

/// Unused slots of pods no longer in the cluster, and since when each has
/// been seen so.
#[derive(Default)]
pub(super) struct LeavingSlots(std::collections::HashMap<String, Instant>);

impl LeavingSlots {
    /// Of the `unused` slots, those named `<prefix><ordinal>` for a pod not
    /// in `kept` that have been seen so for `grace`; forgets the others.
    pub(super) fn due(
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

/// Whether a server on `timeline`, replayed up to `position`, diverged from
/// the history a `.history` file describes: its timeline is not an ancestor,
/// or it replayed WAL past the point where the history left it.
pub(super) fn forked(history: &str, timeline: u32, position: u64) -> Option<String> {
    let switch = switches(history).find_map(|(parent, at)| (parent == timeline).then_some(at));
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

/// The name of the WAL segment holding the switch away from `timeline`, as
/// recovery reads it (from the newest timeline that began in or before
/// that segment: a second switch in the same segment names it after the
/// later timeline) given `history`, the history file of `current`: the
/// first segment a folder of `timeline` needs from the primary.
pub(super) fn first_segment_after_switch(
    history: &str,
    timeline: u32,
    current: u32,
    segment_size: u64,
) -> Option<String> {
    let lines: Vec<(u32, u64)> = switches(history).collect();
    let later = &lines[lines.iter().position(|(parent, _)| *parent == timeline)?..];
    let per_log = 0x1_0000_0000u64
        .checked_div(segment_size)
        .filter(|n| *n > 0)?;
    let segment = later[0].1 / segment_size;
    // The timeline begun by line i is the parent on line i + 1.
    let last = later
        .iter()
        .rposition(|(_, at)| at / segment_size == segment)?;
    let reader = later.get(last + 1).map_or(current, |(parent, _)| *parent);
    Some(format!(
        "{reader:08X}{:08X}{:08X}",
        segment / per_log,
        segment % per_log
    ))
}

/// The lines of a timeline history file: each timeline and where it
/// switched to the next one.
fn switches(history: &str) -> impl Iterator<Item = (u32, u64)> + '_ {
    history.lines().filter_map(|line| {
        let mut fields = line.split_whitespace();
        let parent: u32 = fields.next()?.parse().ok()?;
        Some((parent, parse_lsn(fields.next()?)?))
    })
}

pub(super) fn format_lsn(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xFFFF_FFFF)
}

/// `0000000A.history` → 10.
pub(super) fn history_timeline(name: &str) -> Option<u32> {
    let hex = name.strip_suffix(".history")?;
    (hex.len() == 8).then_some(())?;
    u32::from_str_radix(hex, 16).ok()
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

    #[test]
    fn the_first_segment_after_a_switch_is_on_the_next_timeline() {
        let history = "1\t0/3000148\tno recovery target specified\n\n2\t1/5000000\tno recovery target specified\n";
        let mb16 = 16 * 1024 * 1024;
        assert_eq!(
            first_segment_after_switch(history, 1, 3, mb16).as_deref(),
            Some("000000020000000000000003")
        );
        // A switch on a segment boundary: the segment that starts there.
        assert_eq!(
            first_segment_after_switch(history, 2, 3, mb16).as_deref(),
            Some("000000030000000100000005")
        );
        assert_eq!(
            first_segment_after_switch(history, 2, 3, 64 * 1024 * 1024).as_deref(),
            Some("000000030000000100000001")
        );
        assert_eq!(first_segment_after_switch(history, 4, 5, mb16), None);
        // Two switches in one segment: the file of the later timeline.
        let quick = "1\t0/3000148\tx\n2\t0/3000200\tx\n3\t0/9000000\tx\n";
        assert_eq!(
            first_segment_after_switch(quick, 1, 4, mb16).as_deref(),
            Some("000000030000000000000003")
        );
        assert_eq!(
            first_segment_after_switch(quick, 2, 4, mb16).as_deref(),
            Some("000000030000000000000003")
        );
        assert_eq!(first_segment_after_switch(history, 1, 3, 0), None);
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
}
