//! Why a step of the instance failed. The supervisor reports the message in
//! `/status` and retries after a backoff; the variant says what kind of
//! failure it was, for the code that decides (and for tests), and its
//! [`class`](Error::class) labels it in `/status` and the metrics.

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
    /// pg_controldata, pg_dump, pg_restore) ran and failed, or what it made
    /// failed its check (a restored backup that does not verify).
    #[error("{0}")]
    Program(String),
    /// The bucket refused or failed a request, or could not be reached.
    #[error("{0}")]
    Storage(String),
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

impl Error {
    /// Every [`class`](Error::class), for a metric that starts at zero.
    pub const CLASSES: [&'static str; 8] = [
        "io", "sql", "program", "storage", "waiting", "refused", "setup", "timeout",
    ];

    /// A short, stable label of the kind of failure, for `/status` and the
    /// metrics (the message varies with every file and server).
    pub fn class(&self) -> &'static str {
        match self {
            Self::Io { .. } => "io",
            Self::Sql { .. } => "sql",
            Self::Program(_) => "program",
            Self::Storage(_) => "storage",
            Self::Waiting(_) => "waiting",
            Self::Refused(_) => "refused",
            Self::Setup(_) => "setup",
            Self::Timeout(_) => "timeout",
        }
    }
}

/// A bucket's failure, said without the object's key (the same fault reads
/// the same whichever file met it).
impl From<cairn_storage::StorageError> for Error {
    fn from(error: cairn_storage::StorageError) -> Self {
        Self::Storage(error.summary())
    }
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

impl<T> Context<T> for Result<T, cairn_storage::StorageError> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, Error> {
        self.map_err(|e| Error::Storage(format!("{}: {}", what(), e.summary())))
    }
}

/// A failure said as part of a larger step ("step: failure"), of the same class.
impl<T> Context<T> for Result<T, Error> {
    fn context(self, step: impl FnOnce() -> String) -> Result<T, Error> {
        self.map_err(|error| {
            let within = |message: String| format!("{}: {message}", step());
            match error {
                Error::Io { what, source } => Error::Io {
                    what: within(what),
                    source,
                },
                Error::Sql { what, source } => Error::Sql {
                    what: within(what),
                    source,
                },
                Error::Program(m) => Error::Program(within(m)),
                Error::Storage(m) => Error::Storage(within(m)),
                Error::Waiting(m) => Error::Waiting(within(m)),
                Error::Refused(m) => Error::Refused(within(m)),
                Error::Setup(m) => Error::Setup(within(m)),
                Error::Timeout(m) => Error::Timeout(within(m)),
            }
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

    #[test]
    fn each_kind_of_failure_has_its_own_class() {
        let errors = [
            Error::Io {
                what: "a file".into(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            },
            Error::Program("initdb failed".into()),
            Error::Storage("GET: unreachable".into()),
            Error::Waiting("no role assigned yet".into()),
            Error::Refused("a foreign folder".into()),
            Error::Setup("no credentials".into()),
            Error::Timeout("no answer".into()),
        ];
        let classes: Vec<_> = errors.iter().map(Error::class).collect();
        let mut expected = Error::CLASSES.to_vec();
        expected.retain(|c| *c != "sql"); // below, with a real refusal
        assert_eq!(classes, expected);
        assert!(
            Error::CLASSES
                .iter()
                .all(|c| !c.is_empty() && c.bytes().all(|b| b.is_ascii_lowercase())),
            "snake_case labels"
        );
    }

    #[test]
    fn a_failure_within_a_step_keeps_its_class() {
        let io = std::io::Error::other("disk gone");
        let inner = Err::<(), _>(io).context(|| "pg_wal".to_owned());
        let outer = inner
            .context(|| "the backup's end".to_owned())
            .expect_err("failed");
        assert_eq!(outer.class(), "io");
        assert_eq!(outer.to_string(), "the backup's end: pg_wal: disk gone");
        let waiting = Err::<(), _>(Error::Waiting("still in recovery".into()))
            .context(|| "rewinding".to_owned())
            .expect_err("failed");
        assert_eq!(waiting.class(), "waiting");
        assert_eq!(waiting.to_string(), "rewinding: still in recovery");
    }

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
        let error = Err::<(), _>(refused).context(|| "connecting".to_owned());
        assert_eq!(error.map_err(|e| e.class()), Err("sql"));
    }
}
