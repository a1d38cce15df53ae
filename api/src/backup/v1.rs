//! `backup.cairn.dev/v1`: `Backup` and `BackupSchedule`.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{Condition, LocalObjectReference, Time};

/// One backup of a DatabaseCluster, taken by one of its instances (a ready
/// standby when there is one) and stored in object storage.
///
/// The backup controller assigns it to an instance in `status.instance`; the
/// instance, which watches the Backups of its cluster (`spec.cluster.name` is
/// a selectable field), takes it and reports progress in its membership
/// Lease, the only object it writes; the controller reports that here.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "backup.cairn.dev",
    version = "v1",
    kind = "Backup",
    namespaced,
    derive = "PartialEq",
    status = "BackupStatus",
    shortname = "bk",
    category = "cairn",
    validation = Rule::new(
        "self.spec.cluster == oldSelf.spec.cluster && self.spec.method == oldSelf.spec.method && has(self.spec.destination) == has(oldSelf.spec.destination) && (!has(self.spec.destination) || self.spec.destination == oldSelf.spec.destination) && has(self.spec.deadlineSeconds) == has(oldSelf.spec.deadlineSeconds) && (!has(self.spec.deadlineSeconds) || self.spec.deadlineSeconds == oldSelf.spec.deadlineSeconds)"
    ).message("a Backup's cluster, method, destination and deadlineSeconds are immutable: create a new Backup instead"),
    selectable = ".spec.cluster.name",
    printcolumn(name = "Cluster", type_ = "string", json_path = ".spec.cluster.name"),
    printcolumn(name = "Instance", type_ = "string", json_path = ".status.instance"),
    printcolumn(name = "Method", type_ = "string", json_path = ".spec.method"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Size", type_ = "integer", json_path = ".status.sizeBytes"),
    printcolumn(
        name = "Verified",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Verified\")].status"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct BackupSpec {
    /// The DatabaseCluster to back up, in this namespace.
    pub cluster: LocalObjectReference,
    /// `logical` (pg_dump of the application database) or `physical`
    /// (pg_basebackup of the whole instance).
    pub method: BackupMethod,
    /// Where the backup is stored; the cluster's `spec.backup.destination`
    /// when unset (the only destination supported yet: its credentials are
    /// the ones mounted in the instances).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<BackupDestination>,
    /// Seconds the backup may run before it is failed, so a stuck backup
    /// does not stay Running forever. Default 3600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60, max = 604800))]
    pub deadline_seconds: Option<i64>,
    /// What happens to the stored backup when this Backup is deleted:
    /// `Retain` (default) keeps it, `Delete` removes it. The only field that
    /// can change after creation.
    #[serde(default)]
    pub deletion_policy: BackupDeletionPolicy,
    /// Restore the backup once it completes into a throw-away instance and
    /// check it (`Verified` condition). Can be added later to verify an
    /// older backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<Verification>,
}

/// Restore verification. When the backup has completed, the backup
/// controller starts a pod of the cluster's image, with the cluster's
/// configuration, on the cluster's nodes: it restores the backup into an
/// empty folder (checking every file against the manifest), replays the
/// WAL to the end of the backup, opens the copy, reads every database, runs
/// `sql`, and reports. The pod has no Kubernetes credentials and archives
/// nothing; it is deleted once its report is recorded.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Verification {
    /// SQL run in the restored application database, in a read-only
    /// transaction. It passes if it runs without error and its first row's
    /// first column is not `false`, e.g.
    /// `SELECT count(*) > 0 FROM orders`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub sql: Option<String>,
    /// Seconds the verification may take before it is marked failed.
    /// Default 3600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60, max = 86400))]
    pub deadline_seconds: Option<i64>,
    /// Resources of the throw-away instance; the cluster's when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<k8s_openapi::api::core::v1::ResourceRequirements>,
}

/// How a backup is taken.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum BackupMethod {
    Logical,
    Physical,
}

impl BackupMethod {
    /// The folder of the cluster's bucket its backups go to.
    pub fn stored_as(self) -> super::layout::BackupKind {
        match self {
            Self::Logical => super::layout::BackupKind::Dump,
            Self::Physical => super::layout::BackupKind::Base,
        }
    }
}

/// What happens to the stored backup when its Backup object is deleted.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum BackupDeletionPolicy {
    #[default]
    Retain,
    Delete,
}

/// Object storage for a backup: an ObjectBucket, or an S3 bucket given
/// explicitly. Exactly one.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.bucketRef) != has(self.s3)")
    .message("destination: set exactly one of bucketRef and s3"))]
pub struct BackupDestination {
    /// An ObjectBucket of this namespace; its connection Secret gives the
    /// endpoint and credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket_ref: Option<LocalObjectReference>,
    /// An S3-compatible bucket given explicitly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Destination>,
}

/// Label on the Backups a schedule creates: the schedule's name.
pub const SCHEDULE_LABEL: &str = "backup.cairn.dev/schedule";
/// Annotation on the Backups a schedule creates: the slot (RFC 3339, UTC).
pub const SLOT_ANNOTATION: &str = "backup.cairn.dev/slot";
/// Finalizer on a Backup with `deletionPolicy: Delete`: the stored backup
/// is removed (and the WAL only it needed) before the object goes.
pub const ARTIFACT_FINALIZER: &str = "backup.cairn.dev/artifact";
/// Annotation (`"true"`) on a Backup that retention never deletes.
pub const PINNED_ANNOTATION: &str = "backup.cairn.dev/pinned";

/// The keys of a destination's credentials Secret (the names AWS's tools read).
pub const ACCESS_KEY_ID: &str = "AWS_ACCESS_KEY_ID";
pub const SECRET_ACCESS_KEY: &str = "AWS_SECRET_ACCESS_KEY";

/// An S3-compatible bucket.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("!has(self.region) || has(self.endpoint) || self.region.matches('^[a-z]{2}(-[a-z]+)+-[0-9]+$')")
    .message("s3.region must be an AWS region such as eu-west-1 (or set s3.endpoint for another service)"))]
#[serde(rename_all = "camelCase")]
pub struct S3Destination {
    /// URL of the S3 API; AWS's regional endpoint if unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048), regex(pattern = r"^https?://[^\s/]+(/\S*)?$"))]
    pub endpoint: Option<String>,
    /// Bucket name (S3 naming rules: 3 to 63 lowercase letters, digits, dots, hyphens).
    #[schemars(regex(pattern = r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"))]
    pub bucket: String,
    /// Region of the bucket (an AWS region unless `endpoint` names another
    /// S3-compatible service).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-z0-9-]{1,32}$"))]
    pub region: Option<String>,
    /// Key prefix under which backups are stored, e.g. `orders/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub prefix: Option<String>,
    /// Secret of this namespace with keys `AWS_ACCESS_KEY_ID` and
    /// `AWS_SECRET_ACCESS_KEY`.
    pub credentials_secret: LocalObjectReference,
}

/// Lifecycle phase of a backup.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum BackupPhase {
    Pending,
    Running,
    Completed,
    Failed,
}

/// Observed state of a backup.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Pending, Running, Completed or Failed. Completed and Failed are final.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<BackupPhase>,
    /// The instance (pod) taking the backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// The uid of that pod: a pod of the same name with another uid (the
    /// instance was replaced) fails the backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_uid: Option<String>,
    /// When the backup was handed to the instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When the backup completed or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
    /// URL of the stored backup's folder, e.g.
    /// `s3://bucket/prefix/orders/base/<id>/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// The backup's id in the bucket's catalog.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_id: Option<String>,
    /// Timeline of the backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<i64>,
    /// WAL position where the backup starts (`X/Y`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub begin_lsn: Option<String>,
    /// WAL position from which a restore of this backup is consistent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_lsn: Option<String>,
    /// Size of the stored (compressed) backup in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,
    /// Seconds from the instance's start of the backup to its manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_seconds: Option<f64>,
    /// Why the backup failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The last restore verification (`spec.verification`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<VerificationStatus>,
    /// `Ready` (the backup is complete and stored) and, with
    /// `spec.verification`, `Verified`, with a reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// How a restore verification went.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VerificationStatus {
    /// The throw-away pod (deleted once done).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// When the verification pod was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When the outcome was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
    /// Where the restored copy's WAL replay stopped (physical backups).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_lsn: Option<String>,
    /// Seconds from the start of the restore to the end of the checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_seconds: Option<f64>,
    /// What was checked, or why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Condition type of a restore verification's outcome.
pub const VERIFIED: &str = "Verified";

/// Backups of a DatabaseCluster on a cron schedule, with retention.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "backup.cairn.dev",
    version = "v1",
    kind = "BackupSchedule",
    namespaced,
    derive = "PartialEq",
    status = "BackupScheduleStatus",
    shortname = "bks",
    category = "cairn",
    printcolumn(name = "Schedule", type_ = "string", json_path = ".spec.schedule"),
    printcolumn(name = "Suspended", type_ = "boolean", json_path = ".spec.suspend"),
    printcolumn(
        name = "Last Backup",
        type_ = "date",
        json_path = ".status.lastScheduleTime"
    ),
    // A string, not a date: kubectl renders a date column as an age, and a
    // time still to come as `<invalid>`.
    printcolumn(name = "Next", type_ = "string", json_path = ".status.nextScheduleTime"),
    printcolumn(
        name = "Healthy",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"BackupsHealthy\")].status"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct BackupScheduleSpec {
    /// When to take backups, in 5-field cron syntax ("minute hour
    /// day-of-month month day-of-week"), e.g. "0 3 * * *".
    #[schemars(regex(pattern = r"^\s*(\S+\s+){4}\S+\s*$"), length(max = 128))]
    pub schedule: String,
    /// IANA time zone of the schedule, e.g. "Europe/Paris"; UTC if unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+){0,2}$"))]
    pub time_zone: Option<String>,
    /// Stop creating new Backups (running ones finish).
    #[serde(default)]
    pub suspend: bool,
    /// What to do when a slot comes while a Backup of this schedule still
    /// runs: `Forbid` (default) skips the slot, `Allow` runs both, `Replace`
    /// fails the running one and starts the new one.
    #[serde(default)]
    pub concurrency_policy: ConcurrencyPolicy,
    /// Seconds after a missed slot during which it is still taken (for
    /// example after the controller was down); missed slots older than this
    /// are skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 86400))]
    pub starting_deadline_seconds: Option<i64>,
    /// The Backup made at each slot.
    pub template: BackupTemplate,
    /// With `template.spec.verification`, which Backups are verified: the
    /// first, then each one created when none of the previous
    /// `verifyEvery - 1` was. 1 (default) verifies each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub verify_every: Option<i32>,
    /// Which completed Backups to keep; all if unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<Retention>,
}

/// What happens when a slot comes while an earlier Backup still runs.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum ConcurrencyPolicy {
    #[default]
    Forbid,
    Allow,
    Replace,
}

/// The Backup a schedule creates.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct BackupTemplate {
    /// The spec of each Backup.
    pub spec: BackupSpec,
}

/// Which completed Backups of a schedule to keep. A Backup is deleted when
/// it is outside `keepLast` or older than `maxAge`; the newest completed one is
/// always kept. Deleting a Backup removes its stored artifact only if the
/// template's `deletionPolicy` is `Delete`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Retention {
    /// Number of most recent completed Backups to keep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub keep_last: Option<i32>,
    /// Age after which completed Backups are deleted: a number and a unit,
    /// `h` (hours), `d` (days) or `w` (weeks), e.g. "30d".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[1-9][0-9]{0,4}[hdw]$"))]
    pub max_age: Option<String>,
}

/// Observed state of a schedule.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupScheduleStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The slot of the newest Backup created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,
    /// When the newest successful Backup completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_successful_time: Option<Time>,
    /// The next slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_schedule_time: Option<Time>,
    /// Backups of this schedule that are running.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub active: Vec<LocalObjectReference>,
    /// The earliest point the cluster can be restored to: when the oldest
    /// complete base backup in its folder of the bucket ended (every
    /// backup there counts, whoever took it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_recoverability_point: Option<Time>,
    /// The latest point it can be restored to, about: when the newest WAL
    /// file (or base backup) was stored. As of the schedule's last look
    /// at the bucket (each slot and each finished Backup).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_recoverability_point: Option<Time>,
    /// `Ready` and `BackupsHealthy` (False when the last success is older
    /// than two intervals, WAL archiving fails, the bucket cannot be read,
    /// or the newest restore verification failed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
