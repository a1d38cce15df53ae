//! A former primary's folder made to follow the current primary: pg_rewind
//! when the primary can be its source and still has the WAL the rewound
//! folder must replay, a new clone otherwise.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use cairn_api::database::instance::parse_lsn;
use tokio_postgres::Client;

use super::folder::{remove_if_present, rewind_marker};
use super::upstream::{PRIMARY_TIMEOUT, bounded};
use super::wal::{
    first_missing_segment, first_segment_after_switch, format_lsn, lacks_own_wal, latest_history,
    rewind_started, segment_number,
};
use super::{Supervisor, last_lines};
use crate::conf;
use crate::error::{Context, Error};
use crate::files::sync_parent;
use crate::state::Phase;

impl Supervisor {
    /// Makes a former primary's folder, its last checkpoint on `timeline`,
    /// follow the current primary: rewound, or cloned again when pg_rewind
    /// cannot make it follow.
    pub(super) async fn rewind_or_reclone(&self, timeline: u32) -> Result<(), Error> {
        let data = &self.config.data_dir;
        // A promotion not yet checkpointed shows only in pg_wal.
        let timeline = timeline.max(latest_history(data));
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
                self.reclone(&why).await
            }
            None => remove_if_present(&rewind_marker(data)),
        }
    }

    /// Rewinds a former primary's folder to where its history and the current
    /// primary's part, so it can follow the new timeline without a new base
    /// backup (needs wal_log_hints or checksums: the controller sets the first,
    /// initdb here the second). Writes nothing if no rewind is needed.
    /// `Some(why)` when pg_rewind cannot do it, ever: the folder is cloned
    /// again instead. After a rewind the marker is left for the caller.
    async fn rewind(&self, host: &str) -> Result<Option<String>, Error> {
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

    /// pg_rewind trusts its source: a server still in recovery (its promotion
    /// not yet seen by the Service) or on the folder's own timeline would make
    /// it report "no rewind required" over diverged histories.
    async fn check_rewind_source(&self, timeline: u32) -> Result<Source, Error> {
        // It checkpoints first, which may take a while on a busy primary.
        bounded(REWIND_CHECK_TIMEOUT, self.try_check_rewind_source(timeline)).await
    }

    async fn try_check_rewind_source(&self, timeline: u32) -> Result<Source, Error> {
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
    async fn wal_missing_after_rewind(&self) -> Option<String> {
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
}

/// What a former primary's folder can follow the current primary by.
enum Source {
    /// pg_rewind from this host.
    Rewindable(String),
    /// Only a new clone can follow; why. Both were primaries on the same
    /// timeline (pg_rewind would see one history and rewind nothing), or
    /// the primary no longer has the WAL since this folder's timeline ended.
    Unrewindable(String),
}

/// The longest the check before a rewind may take (it checkpoints the
/// primary); a source that stops answering must not hold up the retry.
const REWIND_CHECK_TIMEOUT: Duration = Duration::from_secs(120);
