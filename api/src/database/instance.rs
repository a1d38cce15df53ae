//! The contract between the database controller and `cairn-instance`, the
//! entrypoint of every database pod: the names, paths and ports both sides
//! use, and the observed state the instance reports on its pod.

use serde::{Deserialize, Serialize};

/// The label the controller sets on each instance pod: `primary` or `replica`.
/// The `-rw` and `-ro` Services select on it; cairn-instance reads it through
/// the Downward API to learn its role.
pub const ROLE_LABEL: &str = "database.cairn.dev/role";
pub const ROLE_PRIMARY: &str = "primary";
pub const ROLE_REPLICA: &str = "replica";

/// Pod annotation cairn-instance writes: [`ObservedState`] as JSON.
pub const OBSERVED_ANNOTATION: &str = "database.cairn.dev/observed";

pub const POSTGRES_PORT: u16 = 5432;
/// `/livez`, `/readyz`, `/status`.
pub const INSTANCE_HTTP_PORT: u16 = 8000;
/// Prometheus metrics of the database (`cairn_postgres_*`).
pub const INSTANCE_METRICS_PORT: u16 = 9187;

/// Where the data volume is mounted, and PGDATA inside it (a sub-folder, so
/// the volume's root, which may hold `lost+found`, is never the data folder).
pub const DATA_MOUNT: &str = "/var/lib/postgresql/data";
pub const PGDATA: &str = "/var/lib/postgresql/data/pgdata";
/// The ConfigMap: `postgresql.conf` and `pg_hba.conf`.
pub const CONFIG_DIR: &str = "/etc/cairn/config";
/// The credentials Secret, one file per key (the `*_KEY` constants).
pub const CREDENTIALS_DIR: &str = "/etc/cairn/credentials";
/// The Downward API folder; its file `role` holds the role label.
pub const PODINFO_DIR: &str = "/etc/cairn/podinfo";
pub const ROLE_FILE: &str = "/etc/cairn/podinfo/role";
/// Sockets and the instance's password file (an emptyDir).
pub const RUN_DIR: &str = "/var/run/postgresql";

pub const DATABASE_KEY: &str = "database";
pub const OWNER_KEY: &str = "username";
pub const OWNER_PASSWORD_KEY: &str = "password";
pub const SUPERUSER_PASSWORD_KEY: &str = "superuser-password";
pub const REPLICATION_USER_KEY: &str = "replication-username";
pub const REPLICATION_PASSWORD_KEY: &str = "replication-password";

/// What cairn-instance last observed of its PostgreSQL server.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObservedState {
    /// Answers `/readyz` with 200.
    pub ready: bool,
    /// `primary` or `replica` as the server itself reports (not as assigned);
    /// absent while the server does not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<u32>,
    /// Current WAL position (primary) or last replayed (replica), as `X/Y`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_position: Option<String>,
}
