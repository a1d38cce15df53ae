//! What the instance reads from its server, and what it concludes: readiness
//! is a pure function of a sample, unit-tested here.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use cairn_api::database::instance::{ROLE_PRIMARY, ROLE_REPLICA};
use serde::Serialize;
use tokio_postgres::{Client, Statement};

use crate::error::Error;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Primary,
    Replica,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Primary => ROLE_PRIMARY,
            Role::Replica => ROLE_REPLICA,
        })
    }
}

impl FromStr for Role {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s.trim() {
            ROLE_PRIMARY => Ok(Role::Primary),
            ROLE_REPLICA => Ok(Role::Replica),
            "" => Err(Error::Waiting("no role assigned yet".to_owned())),
            other => Err(Error::Setup(format!("unknown role {other:?}"))),
        }
    }
}

/// One reading of the server.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    pub in_recovery: bool,
    pub server_version: String,
    /// A primary's: the timeline it writes (its last checkpoint's names the
    /// one before a promotion until the spread checkpoint after it ends,
    /// minutes on a busy server). A replica's: the timeline it receives, or,
    /// with no WAL receiver (its primary restarting), the latest of its WAL
    /// files up to its replay position whose files begin at that timeline's
    /// switch point (it streamed that timeline from the switch, as a
    /// follower does; a forked replica's receiver may have written a file of
    /// the new timeline past the switch only), else its last restartpoint's.
    /// That restartpoint's timeline alone can be one behind after a
    /// switchover, which would read as a history forked off the primary's
    /// and clone the replica again for nothing.
    pub timeline: Option<u32>,
    /// `X/Y`: current (primary) or last replayed (replica).
    pub wal_position: Option<String>,
    pub wal_bytes: Option<i64>,
    /// Seconds since the epoch.
    pub last_checkpoint: Option<f64>,
    /// A replica's WAL receiver is connected and streaming.
    pub streaming: bool,
    /// How far replay is behind the primary's last reported WAL end.
    pub lag_bytes: Option<i64>,
    /// Age of the last replayed transaction, 0 when all received WAL is replayed.
    pub lag_seconds: Option<f64>,
    /// Client sessions by state.
    pub connections: Vec<(String, i64)>,
    /// Settings changed in the configuration that wait for a restart.
    pub pending_restart: Vec<String>,
    /// A replica's last WAL position received (`X/Y`); None on a primary.
    pub received_position: Option<String>,
    /// A primary's running `synchronous_standby_names`; None on a replica.
    pub synchronous_standby_names: Option<String>,
}

/// Everything a poll reads, in one statement (prepared once per session, so
/// a poll is one round trip and one transaction).
const SAMPLE: &str = "
WITH position AS (
    SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                ELSE pg_current_wal_lsn() END AS lsn
), segment AS (
    SELECT setting::numeric AS size FROM pg_settings WHERE name = 'wal_segment_size'
), sessions AS (
    SELECT coalesce(state, 'unknown') AS state, count(*) AS n
    FROM pg_stat_activity WHERE backend_type = 'client backend' GROUP BY 1
)
SELECT pg_is_in_recovery(),
       current_setting('server_version'),
       CASE WHEN pg_is_in_recovery()
            THEN coalesce((SELECT received_tli FROM pg_stat_wal_receiver),
                          greatest((SELECT timeline_id FROM pg_control_checkpoint()),
                                   (SELECT max(tl) FROM (
                                        SELECT tl, min(segno) AS first FROM (
                                            SELECT ('x' || substr(name, 1, 8))::bit(32)::int AS tl,
                                                   ('x' || substr(name, 9, 8))::bit(32)::bigint
                                                   * (4294967296 / segment.size)
                                                   + ('x' || substr(name, 17, 8))::bit(32)::bigint AS segno,
                                                   floor((lsn - '0/0') / segment.size) AS replayed
                                            FROM pg_ls_waldir(), segment
                                            WHERE name ~ '^[0-9A-F]{24}$') AS files
                                        WHERE segno <= replayed
                                        GROUP BY tl) AS timelines, segment
                                    WHERE first <= floor((substring(rtrim(
                                              pg_read_file('pg_wal/' || lpad(upper(to_hex(tl)), 8, '0')
                                                           || '.history', 0, 1048576, true), E'\\n')
                                              FROM E'([0-9A-F]+/[0-9A-F]+)\\t[^\\n]*$')::pg_lsn - '0/0')
                                          / segment.size))))
            ELSE ('x' || substr(pg_walfile_name(lsn), 1, 8))::bit(32)::int END,
       lsn::text,
       (lsn - '0/0')::bigint,
       extract(epoch FROM (SELECT checkpoint_time FROM pg_control_checkpoint()))::float8,
       coalesce((SELECT status = 'streaming' FROM pg_stat_wal_receiver), false),
       (SELECT greatest(latest_end_lsn - lsn, 0)::bigint FROM pg_stat_wal_receiver),
       CASE WHEN NOT pg_is_in_recovery() THEN NULL
            WHEN pg_last_wal_receive_lsn() IS NOT DISTINCT FROM lsn THEN 0::float8
            ELSE coalesce(extract(epoch FROM now() - pg_last_xact_replay_timestamp())::float8, 0) END,
       ARRAY(SELECT state FROM sessions ORDER BY state),
       ARRAY(SELECT n FROM sessions ORDER BY state),
       ARRAY(SELECT name::text FROM pg_settings WHERE pending_restart ORDER BY name),
       pg_last_wal_receive_lsn()::text,
       CASE WHEN pg_is_in_recovery() THEN NULL
            ELSE current_setting('synchronous_standby_names') END
FROM position";

const DATABASE_SIZES: &str =
    "SELECT datname::text, pg_database_size(oid) FROM pg_database WHERE datallowconn ORDER BY 1";

/// The instance's session with its server.
pub struct Session {
    pub client: Client,
    sample: Statement,
}

impl Session {
    pub async fn new(client: Client) -> Result<Self, tokio_postgres::Error> {
        let sample = client.prepare(SAMPLE).await?;
        Ok(Self { client, sample })
    }

    pub async fn sample(&self) -> Result<Sample, tokio_postgres::Error> {
        let row = self.client.query_one(&self.sample, &[]).await?;
        let states: Vec<String> = row.get(9);
        let counts: Vec<i64> = row.get(10);
        Ok(Sample {
            in_recovery: row.get(0),
            server_version: row.get(1),
            timeline: row.get::<_, Option<i32>>(2).map(|t| t as u32),
            wal_position: row.get(3),
            wal_bytes: row.get(4),
            last_checkpoint: row.get(5),
            streaming: row.get(6),
            lag_bytes: row.get(7),
            lag_seconds: row.get(8),
            connections: states.into_iter().zip(counts).collect(),
            pending_restart: row.get(11),
            received_position: row.get(12),
            synchronous_standby_names: row.get(13),
        })
    }

    /// Sizes of the databases that accept connections (walks their folders,
    /// so it is read less often than the rest).
    pub async fn database_sizes(&self) -> Result<Vec<(String, i64)>, tokio_postgres::Error> {
        let rows = self.client.query(DATABASE_SIZES, &[]).await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }
}

/// Limits on a replica's distance from its primary.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_lag_bytes: u64,
    pub max_silence: Duration,
}

/// Whether the server serves its assigned role; `Err` says why not (what to
/// wait out: a promotion, streaming, lag).
/// `upstream_silence` is how long a replica has not been streaming (zero
/// while it streams, `None` if it never has since it started); `setting_up`
/// what a primary still does before it serves (its roles, a dump to load).
pub fn readiness(
    assigned: Role,
    sample: &Sample,
    upstream_silence: Option<Duration>,
    setting_up: Option<&str>,
    limits: Limits,
) -> Result<(), Error> {
    let not_yet = |why: String| Err(Error::Waiting(why));
    match assigned {
        Role::Primary if sample.in_recovery => not_yet("promoting: still in recovery".to_owned()),
        Role::Primary => setting_up.map_or(Ok(()), |what| not_yet(what.to_owned())),
        Role::Replica if !sample.in_recovery => {
            not_yet("assigned replica but running as a primary".to_owned())
        }
        Role::Replica => {
            let Some(silence) = upstream_silence else {
                return not_yet("not streaming from the primary yet".to_owned());
            };
            if silence > limits.max_silence {
                return not_yet(format!(
                    "not streaming from the primary for {}s (limit {}s)",
                    silence.as_secs(),
                    limits.max_silence.as_secs()
                ));
            }
            match sample.lag_bytes {
                Some(lag) if lag > limits.max_lag_bytes as i64 => not_yet(format!(
                    "{lag} bytes behind the primary (limit {})",
                    limits.max_lag_bytes
                )),
                _ => Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_lag_bytes: 1000,
        max_silence: Duration::from_secs(10),
    };

    fn replica(lag_bytes: i64) -> Sample {
        Sample {
            in_recovery: true,
            streaming: true,
            lag_bytes: Some(lag_bytes),
            ..Sample::default()
        }
    }

    #[test]
    fn a_primary_is_ready_out_of_recovery_with_its_roles() {
        let primary = Sample::default();
        assert!(readiness(Role::Primary, &primary, None, None, LIMITS).is_ok());
        assert!(
            readiness(
                Role::Primary,
                &primary,
                None,
                Some("creating roles"),
                LIMITS
            )
            .is_err()
        );
        assert!(readiness(Role::Primary, &replica(0), None, None, LIMITS).is_err());
    }

    #[test]
    fn a_replica_is_ready_while_it_streams_within_the_limits() {
        let zero = Some(Duration::ZERO);
        assert!(readiness(Role::Replica, &replica(0), zero, None, LIMITS).is_ok());
        assert!(readiness(Role::Replica, &replica(1000), zero, None, LIMITS).is_ok());
        let behind = readiness(Role::Replica, &replica(1001), zero, None, LIMITS);
        assert_eq!(
            behind.map_err(|e| (e.class(), e.to_string())),
            Err((
                "waiting",
                "1001 bytes behind the primary (limit 1000)".to_owned()
            ))
        );
    }

    #[test]
    fn a_replica_cut_from_its_primary_stays_ready_until_the_silence_limit() {
        let sample = replica(0);
        let within = Some(Duration::from_secs(10));
        assert!(readiness(Role::Replica, &sample, within, None, LIMITS).is_ok());
        let past = Some(Duration::from_secs(11));
        assert!(readiness(Role::Replica, &sample, past, None, LIMITS).is_err());
        assert!(readiness(Role::Replica, &sample, None, None, LIMITS).is_err());
    }

    #[test]
    fn a_primary_assigned_replica_is_not_ready() {
        let primary = Sample::default();
        let zero = Some(Duration::ZERO);
        assert!(readiness(Role::Replica, &primary, zero, None, LIMITS).is_err());
    }

    #[test]
    fn roles_parse_from_the_label_file() {
        assert_eq!("primary\n".parse::<Role>().ok(), Some(Role::Primary));
        assert_eq!("replica".parse::<Role>().ok(), Some(Role::Replica));
        assert!("".parse::<Role>().is_err());
        assert!("leader".parse::<Role>().is_err());
    }
}
