//! `database.cairn.dev/v1`: the storage version of `DatabaseCluster`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, ResourceRequirements, Toleration};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{Condition, Time};

/// The annotation a user sets on a DatabaseCluster to the pod that should
/// become the primary: `kubectl annotate dbc NAME database.cairn.dev/switchover-to=POD`.
pub const SWITCHOVER_ANNOTATION: &str = "database.cairn.dev/switchover-to";

/// An operator's order, for a failover that is blocked, to promote a replica
/// whatever acknowledged writes it lacks: `<pod>@<timeline>`, the cluster's
/// `status.timeline` when it was given (`kubectl cairn promote
/// --accept-data-loss` writes it). Once a promotion moved the cluster to a
/// newer timeline it names the past and does nothing.
pub const FORCED_PROMOTION_ANNOTATION: &str = "database.cairn.dev/promote-accepting-data-loss";

/// A forced promotion as [`FORCED_PROMOTION_ANNOTATION`] writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForcedPromotion {
    pub pod: String,
    pub timeline: u32,
}

impl ForcedPromotion {
    pub fn parse(value: &str) -> Option<Self> {
        let (pod, timeline) = value.trim().rsplit_once('@')?;
        Some(Self {
            pod: pod.to_owned(),
            timeline: timeline.parse().ok()?,
        })
        .filter(|forced| !forced.pod.is_empty())
    }
}

impl std::fmt::Display for ForcedPromotion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.pod, self.timeline)
    }
}

/// The annotation a user sets on a DatabaseCluster to an RFC 3339 time to
/// restart every instance, as `kubectl rollout restart` does for a
/// Deployment: the controller copies it into the pod template, so a new
/// value rolls the pods the way any template change does (replicas first,
/// one switchover, the old primary last). `kubectl cairn restart NAME` sets it.
pub const RESTARTED_AT_ANNOTATION: &str = "database.cairn.dev/restartedAt";

/// postgresql.conf settings Cairn sets itself: replication, paths, listening
/// and TLS depend on them, so a user value would break the cluster.
/// PostgreSQL matches parameter names case-insensitively, and so does the rule.
pub const MANAGED_PARAMETERS: &[&str] = &[
    "archive_command",
    "archive_library",
    "archive_mode",
    "config_file",
    "data_directory",
    "hba_file",
    "hot_standby",
    "ident_file",
    "include",
    "include_dir",
    "include_if_exists",
    "listen_addresses",
    "max_replication_slots",
    "max_wal_senders",
    "port",
    "primary_conninfo",
    "primary_slot_name",
    "recovery_target",
    "recovery_target_action",
    "recovery_target_inclusive",
    "recovery_target_lsn",
    "recovery_target_name",
    "recovery_target_time",
    "recovery_target_timeline",
    "recovery_target_xid",
    "restore_command",
    "ssl",
    "ssl_ca_file",
    "ssl_cert_file",
    "ssl_key_file",
    "ssl_passphrase_command",
    "synchronous_standby_names",
    "unix_socket_directories",
    "wal_level",
    "wal_log_hints",
];

/// Settings PostgreSQL reads only at server start (context "postmaster"),
/// PostgreSQL 15 to 17, but for the managed ones: changing one in
/// `spec.postgres.parameters` rolls the pods; every other setting is
/// reloaded in place. cairn-instance's tests tie this list to `pg_settings`
/// of a real server, both ways.
pub const RESTART_PARAMETERS: &[&str] = &[
    "autovacuum_freeze_max_age",
    "autovacuum_max_workers",
    "autovacuum_multixact_freeze_max_age",
    "bonjour",
    "bonjour_name",
    "cluster_name",
    "commit_timestamp_buffers",
    "data_sync_retry",
    "debug_io_direct",
    "dynamic_shared_memory_type",
    "event_source",
    "external_pid_file",
    "huge_page_size",
    "huge_pages",
    "ignore_invalid_pages",
    "jit_provider",
    "logging_collector",
    "max_connections",
    "max_files_per_process",
    "max_locks_per_transaction",
    "max_logical_replication_workers",
    "max_pred_locks_per_transaction",
    "max_prepared_transactions",
    "max_worker_processes",
    "min_dynamic_shared_memory",
    "multixact_member_buffers",
    "multixact_offset_buffers",
    "notify_buffers",
    "old_snapshot_threshold",
    "reserved_connections",
    "serializable_buffers",
    "shared_buffers",
    "shared_memory_type",
    "shared_preload_libraries",
    "subtransaction_buffers",
    "superuser_reserved_connections",
    "track_activity_query_size",
    "track_commit_timestamp",
    "transaction_buffers",
    "unix_socket_group",
    "unix_socket_permissions",
    "wal_buffers",
    "wal_decode_buffer_size",
];

/// The [`RESTART_PARAMETERS`] that PostgreSQL 15 lacks (added in 16 or 17).
pub const RESTART_PARAMETERS_SINCE_16: &[&str] = &[
    "commit_timestamp_buffers",
    "debug_io_direct",
    "multixact_member_buffers",
    "multixact_offset_buffers",
    "notify_buffers",
    "reserved_connections",
    "serializable_buffers",
    "subtransaction_buffers",
    "transaction_buffers",
];

/// The role cairn-instance replicates with; users cannot take its name.
pub const REPLICATION_USER: &str = "streaming_replica";

/// A PostgreSQL cluster: one primary and streaming replicas, with the
/// Services, credentials and configuration to use it.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "database.cairn.dev",
    version = "v1",
    kind = "DatabaseCluster",
    namespaced,
    derive = "PartialEq",
    status = "DatabaseClusterStatus",
    shortname = "dbc",
    category = "cairn",
    scale(
        spec_replicas_path = ".spec.instances",
        status_replicas_path = ".status.instances",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "Instances", type_ = "integer", json_path = ".spec.instances"),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        json_path = ".status.readyInstances"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Primary",
        type_ = "string",
        json_path = ".status.currentPrimary"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new(
    "!has(self.replication) || self.replication.synchronousReplicas < self.instances"
).message("spec.replication.synchronousReplicas must be below spec.instances: each commit waits for that many replicas, and the primary is not one"))]
#[x_kube(validation = Rule::new(
    "has(self.bootstrap) == has(oldSelf.bootstrap) && (!has(self.bootstrap) || self.bootstrap == oldSelf.bootstrap)"
).message("spec.bootstrap is immutable: it only applies when the cluster is created"))]
#[serde(rename_all = "camelCase")]
pub struct DatabaseClusterSpec {
    /// Number of PostgreSQL instances: one primary and instances - 1
    /// streaming replicas. Also set by `kubectl scale dbc/NAME --replicas=N`.
    #[schemars(range(min = 1, max = 9))]
    pub instances: i32,
    /// The PostgreSQL server: version, image and configuration.
    pub postgres: PostgresSpec,
    /// Persistent storage of each instance's data directory.
    pub storage: StorageSpec,
    /// CPU and memory of each instance's PostgreSQL container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Where the instances' pods may run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling: Option<SchedulingSpec>,
    /// How the first instance gets its data: a new database (initdb, the
    /// default) or a restore from a Backup. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<BootstrapSpec>,
    /// When a replica takes over from a lost primary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover: Option<FailoverSpec>,
    /// Synchronous replication: commits wait for replicas to confirm them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication: Option<ReplicationSpec>,
    /// Continuous backup: where the primary archives WAL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<ClusterBackupSpec>,
    /// Stop changing the cluster's child objects (for maintenance by hand).
    /// The status says so while it is set.
    #[serde(default, skip_serializing_if = "is_false")]
    pub paused: bool,
}

fn is_false(value: &bool) -> bool {
    !value
}

/// The one reading of each setting the controller and its instances act
/// on: the schema bounds them, so the conversions here cannot fail on an
/// admitted object; what one refused would be is said at each.
impl DatabaseClusterSpec {
    /// How many instances the cluster runs (the schema admits 1 to 9).
    pub fn instance_count(&self) -> u32 {
        u32::try_from(self.instances).unwrap_or(1)
    }

    /// How many replicas must confirm each commit; `None` without
    /// synchronous replication (the schema admits 1 to 8).
    pub fn synchronous_replicas(&self) -> Option<u32> {
        let replicas = self.replication.as_ref()?.synchronous_replicas;
        Some(u32::try_from(replicas).unwrap_or(1))
    }

    /// The failover settings, the defaults where the spec has none.
    pub fn failover_settings(&self) -> FailoverSpec {
        self.failover.clone().unwrap_or_default()
    }

    /// How long a primary may be silent before a replica is promoted.
    pub fn failover_delay(&self) -> std::time::Duration {
        let seconds = self.failover_settings().delay_seconds;
        std::time::Duration::from_secs(
            u64::try_from(seconds).unwrap_or(DEFAULT_FAILOVER_DELAY_SECONDS as u64),
        )
    }

    /// How long a primary starting up (crash recovery) may take before it is
    /// replaced.
    pub fn failover_start_timeout(&self) -> std::time::Duration {
        let seconds = self.failover_settings().start_timeout_seconds;
        std::time::Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
    }

    /// How far behind the lost primary a promoted replica may be; `None`:
    /// any replica.
    pub fn failover_max_lag_bytes(&self) -> Option<u64> {
        self.failover_settings()
            .max_lag_bytes
            .and_then(|bytes| u64::try_from(bytes).ok())
    }
}

/// Continuous backup of a cluster.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterBackupSpec {
    /// The bucket the primary archives every WAL file to (under
    /// `<prefix>/<cluster name>/wal/`), as soon as PostgreSQL completes it.
    /// Changing it restarts the instances.
    pub destination: crate::backup::v1::BackupDestination,
    /// The guard against a destination that stays unreachable: once more
    /// than this much WAL waits to be archived, the oldest waiting files are
    /// acknowledged without being stored, so the data volume does not fill
    /// and stop the database. The archive then has a gap that point-in-time
    /// recovery cannot cross (`ContinuousArchiving` says where). Unset: WAL
    /// is kept until it is stored, however long that takes (the volume may
    /// fill).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "maxPendingWALSize"
    )]
    #[schemars(
        length(max = 64),
        regex(
            pattern = r"^(\+)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
        )
    )]
    #[x_kube(validation = Rule::new("quantity(self).isGreaterThan(quantity('0'))")
        .message("spec.backup.maxPendingWALSize must be a positive quantity such as 10Gi"))]
    pub max_pending_wal_size: Option<String>,
}

/// The PostgreSQL server.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[x_kube(validation = Rule::new(
    "int(self.version.split('.')[0]) == int(oldSelf.version.split('.')[0])"
).message("spec.postgres.version: the major version cannot change: Cairn does not upgrade (or downgrade) a data folder between major versions yet; create a new cluster instead"))]
pub struct PostgresSpec {
    /// PostgreSQL version: a major ("17") or major.minor ("17.2"), 13 to 18.
    /// The minor version can change; the major cannot (no major upgrades yet).
    #[schemars(regex(pattern = r"^(1[3-8])(\.[0-9]{1,3})?$"))]
    pub version: String,
    /// Container image to run instead of the default one for `version`. It
    /// must contain the same PostgreSQL major version and cairn-instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512), regex(pattern = r"^\S+$"))]
    pub image: Option<String>,
    /// postgresql.conf settings, by name. Settings Cairn manages itself
    /// (listening, paths, replication, TLS) are rejected.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(validation = Rule::new(managed_parameters_rule())
        .message("spec.postgres.parameters: a parameter Cairn manages cannot be set"))]
    #[schemars(extend("maxProperties" = 200))]
    pub parameters: BTreeMap<String, String>,
}

/// The CEL rule rejecting `MANAGED_PARAMETERS` as keys.
fn managed_parameters_rule() -> String {
    let names: Vec<String> = MANAGED_PARAMETERS
        .iter()
        .map(|p| format!("'{p}'"))
        .collect();
    format!("self.all(k, !(k.lowerAscii() in [{}]))", names.join(", "))
}

/// Storage of each instance.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "quantity(self.size).compareTo(quantity(oldSelf.size)) >= 0"
).message("spec.storage.size cannot shrink: PersistentVolumeClaims can only grow"))]
#[x_kube(validation = Rule::new(
    "has(self.storageClassName) == has(oldSelf.storageClassName) && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)"
).message("spec.storage.storageClassName is immutable"))]
pub struct StorageSpec {
    /// Size of each instance's volume, e.g. "10Gi". It can grow (when the
    /// StorageClass allows volume expansion), never shrink.
    #[schemars(
        length(max = 64),
        regex(
            pattern = r"^(\+)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
        )
    )]
    #[x_kube(validation = Rule::new("quantity(self).isGreaterThan(quantity('0'))")
        .message("spec.storage.size must be a positive quantity such as 10Gi"))]
    pub size: String,
    /// StorageClass of the volumes; the cluster's default class if unset. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub storage_class_name: Option<String>,
}

/// Automated failover.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailoverSpec {
    /// Seconds the primary may go without a heartbeat, or without serving,
    /// before the most advanced replica is promoted. The primary itself stops
    /// taking writes after half this time without a heartbeat, so it never
    /// takes writes once a replica may have been promoted.
    #[serde(default = "default_failover_delay")]
    #[schemars(range(min = 6, max = 600))]
    pub delay_seconds: i32,
    /// Promote only a replica that received WAL up to at most this many bytes
    /// before the lost primary's last reported position; unset: any replica.
    /// While none qualifies, the cluster waits for the primary to return.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_lag_bytes: Option<i64>,
    /// Seconds a primary that renews its heartbeat while its postgres is
    /// starting up (crash recovery, after a crash or an immediate stop) has
    /// before it is replaced; `delaySeconds` if that is longer. A replica
    /// promoted instead lacks what the primary had not streamed.
    #[serde(default = "default_start_timeout")]
    #[schemars(range(min = 0, max = 3600))]
    pub start_timeout_seconds: i32,
}

pub const DEFAULT_FAILOVER_DELAY_SECONDS: i32 = 10;
/// Patroni's `primary_start_timeout` default.
pub const DEFAULT_START_TIMEOUT_SECONDS: i32 = 300;

fn default_start_timeout() -> i32 {
    DEFAULT_START_TIMEOUT_SECONDS
}

fn default_failover_delay() -> i32 {
    DEFAULT_FAILOVER_DELAY_SECONDS
}

impl Default for FailoverSpec {
    fn default() -> Self {
        Self {
            delay_seconds: DEFAULT_FAILOVER_DELAY_SECONDS,
            max_lag_bytes: None,
            start_timeout_seconds: DEFAULT_START_TIMEOUT_SECONDS,
        }
    }
}

/// Synchronous replication, as a quorum: a commit is acknowledged once
/// `synchronousReplicas` replicas, any of them, have flushed it
/// (`synchronous_standby_names = 'ANY n (...)'`). A failover then promotes a
/// replica only while enough replicas report that one of them must hold every
/// acknowledged commit, and picks the most advanced. The price is
/// availability: while fewer than `synchronousReplicas` replicas stream,
/// commits wait.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicationSpec {
    /// How many replicas must confirm each commit before it is acknowledged;
    /// below `instances`.
    #[schemars(range(min = 1, max = 8))]
    pub synchronous_replicas: i32,
}

/// Where the instances' pods may run.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SchedulingSpec {
    /// Labels a node must have to run an instance.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Node and pod affinity of the instances' pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Taints the instances' pods tolerate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// PriorityClass of the instances' pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
}

/// How the first instance gets its data. Exactly one of `initdb` and
/// `fromBackup` (and `fromBucket`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("[has(self.initdb), has(self.fromBackup), has(self.fromBucket)].filter(x, x).size() == 1")
    .message("spec.bootstrap: set exactly one of initdb, fromBackup and fromBucket"))]
pub struct BootstrapSpec {
    /// Create a new, empty database.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initdb: Option<InitdbSpec>,
    /// Restore a completed Backup of this namespace, then replay its
    /// cluster's archived WAL up to a recovery target. The backup and the WAL
    /// are read from this cluster's `spec.backup.destination` (the same
    /// bucket and prefix as the source's, with the same credentials); the
    /// restored cluster starts a new timeline and archives to its own folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_backup: Option<FromBackupSpec>,
    /// Restore from the bucket alone, without a Backup object (disaster
    /// recovery: the Kubernetes cluster that made the backups is gone): the
    /// folder of cluster `cluster` in this cluster's
    /// `spec.backup.destination`, its newest complete backup (the newest
    /// completed before the target time, with one) unless `backupId` names
    /// one, then its archived WAL up to the recovery target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_bucket: Option<FromBucketSpec>,
}

impl BootstrapSpec {
    /// Whether the first primary restores a backup instead of initdb.
    pub fn restores(&self) -> bool {
        self.from_backup.is_some() || self.from_bucket.is_some()
    }

    /// Where a restore's replay stops, if it says.
    pub fn recovery_target(&self) -> Option<&RecoveryTarget> {
        self.from_backup
            .as_ref()
            .and_then(|f| f.recovery_target.as_ref())
            .or_else(|| self.from_bucket.as_ref()?.recovery_target.as_ref())
    }
}

/// Which cluster's backups to restore from a bucket.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FromBucketSpec {
    /// The name of the cluster whose folder holds the backups and WAL.
    #[schemars(length(min = 1, max = 63))]
    pub cluster: String,
    /// A backup's id in that folder (`<Backup name>-<8 hex digits>`); the
    /// newest suitable one when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-z0-9][a-z0-9.-]{0,252}$"))]
    pub backup_id: Option<String>,
    /// Where replay stops; all the archived WAL when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_target: Option<RecoveryTarget>,
}

/// Which Backup to restore, and how far to replay the WAL after it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FromBackupSpec {
    /// The Backup (of this namespace, phase Completed).
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Where replay stops; all the archived WAL when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_target: Option<RecoveryTarget>,
}

/// A point to recover to: at most one of these.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("[has(self.time), has(self.lsn), has(self.name), has(self.endOfBackup) && self.endOfBackup].filter(x, x).size() <= 1")
    .message("recoveryTarget: set at most one of time, lsn, name and endOfBackup"))]
pub struct RecoveryTarget {
    /// Commits up to this time (RFC 3339, e.g. "2026-11-26T03:00:00Z") are
    /// restored, none after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
    /// Replay up to this WAL position, e.g. "0/3000060".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$"))]
    pub lsn: Option<String>,
    /// Replay up to a restore point made with `pg_create_restore_point`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub name: Option<String>,
    /// Stop as soon as the backup is consistent (its end), replaying no
    /// more of the archive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_of_backup: Option<bool>,
}

/// A new database, created by initdb.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("!(self.database in ['postgres', 'template0', 'template1'])")
    .message("spec.bootstrap.initdb.database: postgres, template0 and template1 are PostgreSQL's own databases"))]
#[x_kube(validation = Rule::new("!(self.owner in ['postgres', 'streaming_replica']) && !self.owner.startsWith('pg_')")
    .message("spec.bootstrap.initdb.owner: postgres, streaming_replica and pg_* are reserved roles"))]
pub struct InitdbSpec {
    /// Name of the application database to create.
    #[schemars(regex(pattern = r"^[a-z_][a-z0-9_]{0,62}$"))]
    pub database: String,
    /// Role that owns the application database; its password is in the
    /// credentials Secret.
    #[schemars(regex(pattern = r"^[a-z_][a-z0-9_]{0,62}$"))]
    pub owner: String,
}

/// Lifecycle phase of a cluster, for humans; conditions are for automation.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum DatabaseClusterPhase {
    Creating,
    Running,
    Scaling,
    Upgrading,
    Degraded,
    Failed,
    Paused,
}

/// Observed state of a cluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseClusterStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Lifecycle phase, for humans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<DatabaseClusterPhase>,
    /// `Ready`, `Progressing` and `Degraded`, with reasons.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Number of instance pods that exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instances: Option<i32>,
    /// Number of instances that accept connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_instances: Option<i32>,
    /// Label selector of the instance pods (for the scale subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Name of the pod that runs the primary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_primary: Option<String>,
    /// Where applications connect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<Endpoints>,
    /// Name of the Secret with the generated credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<String>,
    /// PostgreSQL version the primary reports running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres_version: Option<String>,
    /// Set once the first primary served: from then on no instance runs
    /// initdb, whatever happens to its volume.
    #[serde(default, skip_serializing_if = "is_false")]
    pub initialized: bool,
    /// The PostgreSQL timeline the serving primary reports (kept while none
    /// serves). A failover promotes no replica on an older timeline: it
    /// lacks every write since this one began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<u32>,
    /// The last automated failover.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failover: Option<FailoverRecord>,
    /// The switchover under way, or the last one (requested with the
    /// annotation `database.cairn.dev/switchover-to: <pod>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_switchover: Option<SwitchoverRecord>,
    /// For a cluster bootstrapped from a backup: the backup it restores,
    /// recorded before anything is created and kept for good (the Backup
    /// object may go afterwards).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_from: Option<RestoredFrom>,
}

/// The backup a cluster was restored from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoredFrom {
    /// The Backup object (`fromBackup`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<String>,
    /// The cluster it was taken of: its folder holds the backup and the WAL
    /// replayed after it.
    pub cluster: String,
    /// The backup's id in that folder's catalog; unset when the instance
    /// chooses the newest suitable one (`fromBucket` without `backupId`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_id: Option<String>,
    /// `s3://` URL of the backup, or of the cluster's folder when the
    /// instance chooses the backup.
    pub location: String,
    /// `logical` when the backup is a dump (pg_dump), loaded into a new
    /// database; unset for a base backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<crate::backup::v1::BackupMethod>,
}

/// A switchover: the primary demoted, then the target promoted once it
/// replayed all of the old primary's WAL.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SwitchoverRecord {
    /// The pod that was the primary.
    pub from: String,
    /// The pod requested as the new primary.
    pub to: String,
    /// When the old primary was told to stop taking writes.
    pub started_at: Time,
    /// When the target was promoted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promoted_at: Option<Time>,
    /// When the new primary first reported serving writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
    /// Seconds without a primary taking writes, from `startedAt` to `completedAt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_unavailable_seconds: Option<f64>,
    /// Why the switchover was given up unpromoted at `completedAt`: the old
    /// primary was made primary again (or, if it cannot serve, replaced by a
    /// failover).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abandoned: Option<String>,
}

/// An automated failover: which pod lost the primary role, which got it, and when.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailoverRecord {
    /// The pod that was the primary.
    pub from: String,
    /// The replica's pod that was promoted.
    pub to: String,
    /// Why the old primary was declared lost.
    pub reason: String,
    /// When the old primary last showed it was serving (its last heartbeat).
    pub primary_last_seen: Time,
    /// When the replica was promoted.
    pub promoted_at: Time,
    /// When the new primary first reported serving writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
}

/// Service addresses of a cluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Endpoints {
    /// The primary: `<name>-rw.<namespace>.svc:5432`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_write: Option<String>,
    /// The replicas: `<name>-ro.<namespace>.svc:5432`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn managed_parameters_rule_lists_every_managed_name() {
        let rule = managed_parameters_rule();
        for name in MANAGED_PARAMETERS {
            assert!(rule.contains(&format!("'{name}'")), "{name}");
        }
    }

    #[test]
    fn a_forced_promotion_reads_back_as_written() {
        let forced = ForcedPromotion {
            pod: "orders-1".into(),
            timeline: 3,
        };
        assert_eq!(ForcedPromotion::parse(&forced.to_string()), Some(forced));
        for bad in ["orders-1", "orders-1@", "@3", "orders-1@three", ""] {
            assert_eq!(ForcedPromotion::parse(bad), None, "{bad}");
        }
    }
}
