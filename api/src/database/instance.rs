//! The contract between the database controller and `cairn-instance`, the
//! entrypoint of every database pod: the names, paths and ports both sides
//! use, and the membership each instance keeps.
//!
//! Membership: the controller creates a `coordination.k8s.io` Lease per
//! instance, named after its pod. The instance alone renews it (the heartbeat:
//! `spec.renewTime`) and writes its [`ObservedState`] into it; it may not write
//! any pod. The controller alone assigns roles, with [`ROLE_LABEL`] on the pods,
//! which the instance watches. To depose a primary, the controller sets
//! [`FENCED_ANNOTATION`] on its Lease with a resourceVersion precondition: a
//! renewal and a deposition cannot both succeed, so exactly one side wins.

use serde::{Deserialize, Serialize};

/// `app.kubernetes.io/name` of every object the database controller makes
/// for a cluster (pods and membership Leases included), with
/// `app.kubernetes.io/instance` the cluster's name.
pub const APP_NAME: &str = "postgresql";
/// `app.kubernetes.io/component` of the membership Leases.
pub const MEMBERSHIP_COMPONENT: &str = "membership";
/// The label giving the cluster an instance's pod and Lease belong to.
pub const CLUSTER_LABEL: &str = "app.kubernetes.io/instance";

/// The label the controller sets on each instance pod: `primary` or `replica`.
/// The `-rw` and `-ro` Services select on it; cairn-instance watches its own
/// pod to learn its role.
pub const ROLE_LABEL: &str = "database.cairn.dev/role";
pub const ROLE_PRIMARY: &str = "primary";
pub const ROLE_REPLICA: &str = "replica";

/// Membership Lease annotation cairn-instance writes: [`ObservedState`] as JSON.
pub const OBSERVED_ANNOTATION: &str = "database.cairn.dev/observed";
/// Membership Lease annotation the controller sets (to `"true"`) when it deposes
/// the primary; the instance then never runs as a primary until the
/// controller assigns it the role again (and removes the annotation).
pub const FENCED_ANNOTATION: &str = "database.cairn.dev/fenced";
/// Pod annotation (`"initdb"`, or `"restore"` for a cluster bootstrapped from
/// a backup) the controller sets on the first primary of a cluster that was
/// never initialised. Without it, an instance assigned the primary role with
/// an empty data folder refuses to run initdb: the data
/// lives on in the replicas, and the controller fails over to one of them.
pub const BOOTSTRAP_ANNOTATION: &str = "database.cairn.dev/bootstrap";
pub const BOOTSTRAP_INITDB: &str = "initdb";
/// The bootstrap annotation's value on the first primary of a cluster
/// bootstrapped from a backup: it restores the backup (never initdb).
pub const BOOTSTRAP_RESTORE: &str = "restore";
/// How often an instance renews its membership Lease (its heartbeat).
pub const HEARTBEAT_MILLISECONDS: u64 = 2000;
/// Environment of the instance container: a primary that could not renew its
/// heartbeat for this many seconds stops taking writes (restarts read-only).
/// The controller sets it to half the failover delay.
pub const FENCE_SECONDS_ENV: &str = "CAIRN_FENCE_SECONDS";

pub const POSTGRES_PORT: u16 = 5432;
/// `/livez`, `/readyz`, `/status`.
pub const INSTANCE_HTTP_PORT: u16 = 8000;
/// Prometheus metrics of the database (`cairn_postgres_*`).
pub const INSTANCE_METRICS_PORT: u16 = 9187;
/// UDP: a primary's claims to the other members and their acknowledgements
/// (the instance's `peers` module), which keep it serving while it cannot
/// reach the API server and keep a replica that hears it from promoting.
pub const INSTANCE_PEER_PORT: u16 = 8001;

/// Where the data volume is mounted, and PGDATA inside it (a sub-folder, so
/// the volume's root, which may hold `lost+found`, is never the data folder).
pub const DATA_MOUNT: &str = "/var/lib/postgresql/data";
pub const PGDATA: &str = "/var/lib/postgresql/data/pgdata";
/// The ConfigMap: `postgresql.conf`, `pg_hba.conf` and [`MEMBERS_FILE`].
pub const CONFIG_DIR: &str = "/etc/cairn/config";
/// The ConfigMap's list of the cluster's pods, one per line: the primary
/// drops the replication slots of pods no longer in it.
pub const MEMBERS_FILE: &str = "members";
/// The credentials Secret, one file per key (the `*_KEY` constants).
pub const CREDENTIALS_DIR: &str = "/etc/cairn/credentials";
/// The server certificate Secret (`tls.crt`, `tls.key`, `ca.crt`): the
/// certificate postgres serves, and the CA replicas verify their primary with.
pub const TLS_DIR: &str = "/etc/cairn/tls";
/// The backup destination's credentials Secret (`AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`), when the cluster has a backup destination.
pub const BACKUP_CREDENTIALS_DIR: &str = "/etc/cairn/backup-credentials";
/// The socket in RUN_DIR on which the instance takes `archive_command`'s
/// requests.
pub const WAL_ARCHIVE_SOCKET: &str = "wal-archive.sock";
/// Outside a pod (process-level tests), the assigned role is read from a file.
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
    /// A replica's last WAL position received from its primary, as `X/Y`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received_position: Option<String>,
    /// A primary's running `synchronous_standby_names` (empty when
    /// asynchronous): the quorum its acknowledged commits met, which the
    /// configuration reaches only at the kubelet's next sync.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synchronous_standby_names: Option<String>,
    /// postgres runs but refuses connections as starting up (crash
    /// recovery): a primary doing so is given `failover.startTimeoutSeconds`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub starting: bool,
    /// `server_version` of the running server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_version: Option<String>,
    /// After a clean stop as a primary (a demotion): its shutdown checkpoint's
    /// position, which every streaming replica received. Absent while running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_position: Option<String>,
    /// A replica that heard another member claim to be a writable primary
    /// within its hold time: that member's pod. Such a replica refuses to
    /// be promoted, and the controller does not choose it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hears_primary: Option<String>,
    /// Why the server is not serving in its assigned role, when it is not
    /// (bootstrap refused, fenced, crash-looping...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// WAL archiving, on an instance that archives (a primary of a cluster
    /// with a backup destination).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_archive: Option<WalArchiveState>,
    /// Where this instance stores backups (`s3://<bucket>/<cluster's
    /// folder>`), when it has a backup destination: the backup controller
    /// hands a backup only to an instance whose destination is the
    /// cluster's current one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_destination: Option<String>,
    /// The base backup this instance was last asked to take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupProgress>,
}

/// A base backup as the instance taking it reports it. The backup
/// controller copies it into the Backup's status; `Completed` is reported
/// only once the backup's manifest is stored (the manifest is written last).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupProgress {
    /// The Backup object's name and uid.
    pub name: String,
    pub uid: String,
    pub phase: BackupProgressPhase,
    /// The backup's id in the bucket's catalog.
    pub id: String,
    /// `s3://` URL of the backup's folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub begin_lsn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_lsn: Option<String>,
    /// Compressed bytes stored so far (all of them once Completed).
    #[serde(default)]
    pub stored_bytes: u64,
    /// From the start of the backup to its manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_milliseconds: Option<u64>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Where an instance's backup stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum BackupProgressPhase {
    #[default]
    Running,
    Completed,
    Failed,
}

/// WAL archiving as the instance last saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WalArchiveState {
    /// Files PostgreSQL has marked ready that are not stored yet.
    pub pending: u32,
    /// When a file was last stored (RFC 3339), since the instance started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_stored: Option<String>,
    /// The error of the last attempt, while the last attempt failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing: Option<String>,
    /// The first WAL file the guard (`spec.backup.maxPendingWALSize`)
    /// acknowledged without storing it: the archive has a gap there, and
    /// point-in-time recovery cannot cross it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gap: Option<String>,
}

/// Set (`true`) on a throw-away instance that verifies a backup: it
/// restores the backup named by the restore settings into an empty data
/// folder, archives nothing, checks the copy, writes a
/// [`VerificationReport`] to [`VERIFY_REPORT_ENV`]'s file (the pod's
/// termination message by default) and exits.
pub const VERIFY_ENV: &str = "CAIRN_VERIFY";
/// SQL the verification runs in the application database.
pub const VERIFY_SQL_ENV: &str = "CAIRN_VERIFY_SQL";
/// Where the report goes.
pub const VERIFY_REPORT_ENV: &str = "CAIRN_VERIFY_REPORT";
pub const VERIFY_REPORT_PATH: &str = "/dev/termination-log";

/// What a verifying instance found (JSON, under the 4 KiB a termination
/// message may hold).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct VerificationReport {
    pub verified: bool,
    /// `Verified`, or why not: `RestoreFailed`, `CheckFailed`.
    pub reason: String,
    /// What was checked, or what failed.
    pub message: String,
    /// Where WAL replay stopped (physical backups).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_lsn: Option<String>,
    /// From the start of the restore to the end of the checks.
    pub seconds: f64,
}

/// `X/Y` (hexadecimal halves) as a byte position.
pub fn parse_lsn(text: &str) -> Option<u64> {
    let (high, low) = text.split_once('/')?;
    Some((u64::from_str_radix(high, 16).ok()? << 32) | u64::from_str_radix(low, 16).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsn() {
        assert_eq!(parse_lsn("0/3000060"), Some(0x300_0060));
        assert_eq!(parse_lsn("1/0"), Some(1 << 32));
        assert_eq!(parse_lsn("junk"), None);
    }
}
