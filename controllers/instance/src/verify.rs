//! A throw-away instance that verifies a backup (`CAIRN_VERIFY`). The
//! supervisor restores and opens the copy as it would a new cluster's first
//! primary (each file checked against the manifest, WAL replayed to the end
//! of the backup); this waits for it to serve, then reads it: every table
//! of every database, and the user's SQL in the application database, in a
//! read-only transaction. The report goes to a file (the pod's termination
//! message), the only thing this instance writes outside its data folder.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_api::database::instance::{self as contract, VerificationReport};

use crate::config::Config;
use crate::error::{Context, Error};
use crate::observe::Role;
use crate::state::State;

/// Failed attempts of the supervisor (restore, start) before the backup is
/// reported unrestorable: a transient fault is retried, a damaged backup
/// fails every time.
const ATTEMPTS: u32 = 3;
/// A termination message holds at most 4096 bytes.
const REPORT_LIMIT: usize = 4000;
/// What is kept of a long message before it is serialized.
const MESSAGE_LIMIT: usize = 3000;

pub const VERIFIED: &str = "Verified";
pub const RESTORE_FAILED: &str = "RestoreFailed";
pub const CHECK_FAILED: &str = "CheckFailed";

/// Waits for the restored server, checks it, and says what it found.
pub async fn verify(config: &Config, state: &Arc<State>, started: Instant) -> VerificationReport {
    let report =
        |verified: bool, reason: &str, message: String, lsn: Option<String>| VerificationReport {
            verified,
            reason: reason.to_owned(),
            message: shorten(message, MESSAGE_LIMIT),
            restored_lsn: lsn,
            seconds: started.elapsed().as_secs_f64(),
        };
    if let Err(error) = serving(state, config.poll()).await {
        return report(false, RESTORE_FAILED, error.to_string(), None);
    }
    match check(config).await {
        Ok((message, lsn)) => report(true, VERIFIED, message, lsn),
        Err(error) => report(false, CHECK_FAILED, error.to_string(), None),
    }
}

/// Until the copy serves as a primary, or the supervisor failed
/// [`ATTEMPTS`] times to restore and start it, or to load a dump (the last
/// error, as the supervisor reported it).
async fn serving(state: &State, poll: Duration) -> Result<(), Error> {
    let mut last_error = None;
    loop {
        let status = state.status();
        if status.ready && status.role == Some(Role::Primary) {
            return Ok(());
        }
        last_error = status.last_error.clone().or(last_error);
        let failures = status.failed_starts + status.postgres_restarts;
        if failures >= u64::from(ATTEMPTS) || status.dump_load_failures >= ATTEMPTS {
            let why = last_error.unwrap_or_else(|| "the restored server did not start".into());
            return Err(Error::Program(why));
        }
        tokio::time::sleep(poll.min(Duration::from_millis(250))).await;
    }
}

/// Reads every table of every database and runs the user's check: what
/// was read, and where replay stopped.
async fn check(config: &Config) -> Result<(String, Option<String>), Error> {
    let postgres = connect(config, "postgres").await?;
    let lsn = postgres
        .query_one("SELECT pg_last_wal_replay_lsn()::text", &[])
        .await
        .context(|| "reading the replay position".to_owned())?
        .get::<_, Option<String>>(0);
    let databases: Vec<String> = postgres
        .query(
            "SELECT datname FROM pg_database WHERE datallowconn ORDER BY datname",
            &[],
        )
        .await
        .context(|| "listing databases".to_owned())?
        .iter()
        .map(|row| row.get(0))
        .collect();
    let (mut tables, mut rows) = (0, 0);
    for database in &databases {
        let client = connect(config, database).await?;
        let (t, r) = read_every_table(&client)
            .await
            .context(|| format!("database {database}"))?;
        (tables, rows) = (tables + t, rows + r);
    }
    let mut message = format!(
        "read {tables} tables ({rows} rows) in {} databases",
        databases.len()
    );
    if let Some(sql) = &config.verify_sql {
        let application = config
            .credential(contract::DATABASE_KEY)
            .context(|| format!("credentials ({})", contract::DATABASE_KEY))?;
        let password = checker(&postgres).await?;
        let client = connect_as(config, &application, CHECKER, &password).await?;
        let answer = run_check(&client, sql).await?;
        message.push_str(&format!("; the check returned {answer}"));
    }
    Ok((message, lsn))
}

/// The role the user's SQL runs as: it may read every table
/// (`pg_read_all_data`) and nothing else. Not the superuser, who could read
/// the server's files (the credentials mounted in the pod) or run programs.
const CHECKER: &str = "cairn_verify_check";

/// Creates [`CHECKER`] with a new random password; the password.
async fn checker(superuser: &tokio_postgres::Client) -> Result<String, Error> {
    let password: String = {
        use rand::Rng;
        rand::rng()
            .sample_iter(rand::distr::Alphanumeric)
            .take(32)
            .map(char::from)
            .collect()
    };
    let verifier = postgres_protocol::password::scram_sha_256(password.as_bytes());
    superuser
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {CHECKER}; \
             CREATE ROLE {CHECKER} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE \
             PASSWORD '{verifier}' IN ROLE pg_read_all_data"
        ))
        .await
        .context(|| "creating the role of the check".to_owned())?;
    Ok(password)
}

/// Every table read through (a sequential scan of each table's heap: a
/// page the server cannot read fails here; TOAST and indexes are not
/// read): how many, and their rows.
async fn read_every_table(client: &tokio_postgres::Client) -> Result<(u64, u64), Error> {
    let tables = client
        .query(
            "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.relkind IN ('r', 'm') AND c.relpersistence = 'p' AND c.relispopulated \
             AND n.nspname NOT IN ('pg_catalog', 'information_schema') \
             AND n.nspname NOT LIKE 'pg_toast%' ORDER BY 1",
            &[],
        )
        .await
        .context(|| "listing tables".to_owned())?;
    let mut rows = 0;
    for table in &tables {
        let name: String = table.get(0);
        let count: i64 = client
            .query_one(&format!("SELECT count(*) FROM ONLY {name}"), &[])
            .await
            .context(|| format!("reading {name}"))?
            .get(0);
        rows += u64::try_from(count).unwrap_or(0);
    }
    Ok((tables.len() as u64, rows))
}

/// The user's SQL, one statement (the extended protocol takes no more) in
/// a read-only transaction: it passes unless it fails or its first row's
/// first value is `false`. What it returned is described, never quoted
/// (the status is no place for the data).
async fn run_check(client: &tokio_postgres::Client, sql: &str) -> Result<&'static str, Error> {
    client
        .batch_execute("BEGIN READ ONLY")
        .await
        .context(|| "starting the check".to_owned())?;
    let answer = client.query(sql, &[]).await;
    let _ = client.batch_execute("ROLLBACK").await;
    let rows = answer.context(|| "the check failed".to_owned())?;
    let Some(row) = rows.first() else {
        return Ok("no rows");
    };
    let Some(column) = row.columns().first() else {
        return Ok("a row without columns");
    };
    if *column.type_() != tokio_postgres::types::Type::BOOL {
        return Ok("a value that is not a boolean");
    }
    match row.try_get::<_, Option<bool>>(0) {
        Ok(Some(true)) => Ok("true"),
        Ok(Some(false)) => Err(Error::Program("the check returned false".to_owned())),
        Ok(None) => Ok("NULL"),
        Err(e) => Err(Error::Program(format!("reading the check's answer: {e}"))),
    }
}

async fn connect(config: &Config, database: &str) -> Result<tokio_postgres::Client, Error> {
    let password = config
        .credential(contract::SUPERUSER_PASSWORD_KEY)
        .context(|| "credentials".to_owned())?;
    connect_as(config, database, "postgres", &password).await
}

/// A session on this server, with no statement timeout (a cluster's
/// `statement_timeout` must not fail the reading of a large table: the
/// pod's deadline bounds the verification).
async fn connect_as(
    config: &Config,
    database: &str,
    user: &str,
    password: &str,
) -> Result<tokio_postgres::Client, Error> {
    let mut settings = tokio_postgres::Config::new();
    settings
        .host("127.0.0.1")
        .port(config.port)
        .user(user)
        .password(password)
        .dbname(database)
        .application_name("cairn-verify")
        .options("-c statement_timeout=0")
        .connect_timeout(Duration::from_secs(10));
    let (client, connection) = settings
        .connect(tokio_postgres::NoTls)
        .await
        .context(|| format!("connecting to database {database}"))?;
    tokio::spawn(connection);
    Ok(client)
}

/// Writes the report where the backup controller reads it.
pub fn write_report(path: &Path, report: &VerificationReport) -> Result<(), Error> {
    let text = serialize(report.clone())?;
    std::fs::write(path, text).context(|| path.display().to_string())
}

/// The report as JSON within [`REPORT_LIMIT`] bytes (escaping can make the
/// JSON longer than the message): the message shortened until it fits.
fn serialize(mut report: VerificationReport) -> Result<String, Error> {
    loop {
        let text = serde_json::to_string(&report).map_err(|e| Error::Io {
            what: "the verification report".to_owned(),
            source: e.into(),
        })?;
        if text.len() <= REPORT_LIMIT || report.message.is_empty() {
            return Ok(text);
        }
        let keep = report
            .message
            .len()
            .saturating_sub(text.len() - REPORT_LIMIT + 16);
        report.message = shorten(std::mem::take(&mut report.message), keep);
    }
}

/// At most `limit` bytes and an ellipsis, cut at a character boundary.
fn shorten(mut message: String, limit: usize) -> String {
    if message.len() > limit {
        let mut end = limit;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push('…');
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_message_fits_a_termination_message() {
        let long = "é".repeat(4000);
        let short = shorten(long, MESSAGE_LIMIT);
        assert!(short.len() <= MESSAGE_LIMIT + '…'.len_utf8());
        // Quotes and control characters double or sextuple in JSON.
        for message in [short, "\"".repeat(3000), "\u{1}".repeat(3000)] {
            let report = VerificationReport {
                message,
                restored_lsn: Some("FFFFFFFF/FFFFFFFF".into()),
                reason: RESTORE_FAILED.into(),
                ..VerificationReport::default()
            };
            let json = serialize(report).expect("a report serializes");
            assert!(json.len() <= REPORT_LIMIT, "{}", json.len());
            let back: VerificationReport = serde_json::from_str(&json).expect("it parses");
            assert_eq!(back.reason, RESTORE_FAILED);
        }
    }
}
