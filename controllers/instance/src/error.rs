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
    #[error("{what}: {source}")]
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
