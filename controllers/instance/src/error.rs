//! Why a step of the instance failed. The supervisor reports the message in
//! `/status` and retries after a backoff; the variant says what kind of
//! failure it was, for the code that decides (and for tests).

/// A failed step.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or folder could not be read, written, moved, or a program
    /// could not be started.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A server refused or failed a request, or could not be reached.
    #[error("{what}: {}", sql_message(source))]
    Sql {
        what: String,
        #[source]
        source: tokio_postgres::Error,
    },
    /// A PostgreSQL program (initdb, pg_basebackup, pg_rewind,
    /// pg_controldata) ran and failed.
    #[error("{0}")]
    Program(String),
    /// Something to wait out: no role yet, a primary still in recovery, a
    /// slot still in use, a heartbeat that forbids serving as primary.
    #[error("{0}")]
    Waiting(String),
    /// A state the instance will not act on by itself, because acting could
    /// lose data: a foreign data folder, a half-done pg_rewind, an empty
    /// folder of an initialised cluster.
    #[error("{0}")]
    Refused(String),
    /// Credentials, certificates or settings it needs are missing or invalid.
    #[error("{0}")]
    Setup(String),
    /// No answer in time.
    #[error("{0}")]
    Timeout(String),
}

/// What failed, for an error from a file, a program or a server.
pub trait Context<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, Error>;
}

impl<T> Context<T> for Result<T, std::io::Error> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, Error> {
        self.map_err(|source| Error::Io {
            what: what(),
            source,
        })
    }
}

impl<T> Context<T> for Result<T, tokio_postgres::Error> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, Error> {
        self.map_err(|source| Error::Sql {
            what: what(),
            source,
        })
    }
}

/// What the server said (tokio-postgres displays only "db error"), or why
/// no session was made (tokio-postgres displays only "error connecting to
/// server", without the "Connection refused" beneath it).
pub fn sql_message(error: &tokio_postgres::Error) -> String {
    if let Some(db) = error.as_db_error() {
        // The DETAIL of a data error may quote row values; only a server's
        // state (connections, resources, replication slots) is said.
        let class = &db.code().code()[..2];
        return match db.detail() {
            Some(detail) if ["08", "53", "55", "57"].contains(&class) => {
                format!("{}: {} ({detail})", db.severity(), db.message())
            }
            _ => format!("{}: {}", db.severity(), db.message()),
        };
    }
    match std::error::Error::source(error) {
        Some(cause) => format!("{error}: {cause}"),
        None => error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_refused_connection_says_why() {
        let refused = tokio_postgres::connect(
            "host=127.0.0.1 port=1 user=x connect_timeout=5",
            tokio_postgres::NoTls,
        )
        .await
        .err()
        .expect("nothing listens on port 1");
        let message = sql_message(&refused);
        assert!(message.contains("Connection refused"), "{message}");
    }
}
