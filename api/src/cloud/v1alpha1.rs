//! `cloud.cairn.dev/v1alpha1`: resources outside the cluster.

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{Condition, LocalObjectReference};

/// Annotation recording the id of the external resource an object manages.
pub const EXTERNAL_NAME_ANNOTATION: &str = "cloud.cairn.dev/external-name";

/// How to reach a cloud provider, and with which credentials. Namespaced: a
/// namespace can only use its own credentials.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("has(self.endpoint) || self.region.matches('^[a-z]{2}(-[a-z]+)+-[0-9]+$')")
    .message("spec.region must be an AWS region such as eu-west-1 (or set spec.endpoint for another service)"))]
#[kube(
    group = "cloud.cairn.dev",
    version = "v1alpha1",
    kind = "ProviderConfig",
    namespaced,
    derive = "PartialEq",
    status = "CloudStatus",
    shortname = "pc",
    category = "cairn",
    printcolumn(name = "Type", type_ = "string", json_path = ".spec.type"),
    printcolumn(name = "Region", type_ = "string", json_path = ".spec.region"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ProviderConfigSpec {
    /// The provider: `aws` (or any S3/Route53-compatible API with `endpoint`).
    #[serde(rename = "type")]
    pub type_: ProviderType,
    /// Default region of the resources, e.g. "eu-west-1" (any region name
    /// of the service when `endpoint` is set).
    #[schemars(regex(pattern = r"^[a-z0-9-]{1,32}$"))]
    pub region: String,
    /// URL of an S3-compatible API or emulator instead of AWS's endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048), regex(pattern = r"^https?://[^\s/]+(/\S*)?$"))]
    pub endpoint: Option<String>,
    /// Secret of this namespace with keys `AWS_ACCESS_KEY_ID` and
    /// `AWS_SECRET_ACCESS_KEY`.
    pub credentials_secret_ref: LocalObjectReference,
    /// Requests per second to the provider for all resources using this
    /// config; default 10 per second, burst 20.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
}

/// A cloud provider.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProviderType {
    Aws,
}

/// A token bucket: `qps` tokens a second, at most `burst` at once.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("self.burst >= self.qps").message("rateLimit.burst must be at least rateLimit.qps"))]
pub struct RateLimit {
    /// Sustained requests per second.
    #[schemars(range(min = 1, max = 1000))]
    pub qps: i32,
    /// Requests allowed at once after a quiet period.
    #[schemars(range(min = 1, max = 10000))]
    pub burst: i32,
}

/// Status of every cloud.cairn.dev kind.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CloudStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (the external resource exists and is usable) and `Synced`
    /// (the last reconcile with the provider succeeded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// What the provider reports about the resource (e.g. its ARN or URL).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub at_provider: BTreeMap<String, String>,
}

/// What happens to the external resource when its object is deleted.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum DeletionPolicy {
    Delete,
    Orphan,
}

fn delete() -> DeletionPolicy {
    DeletionPolicy::Delete
}

/// Whether the controller may change the external resource.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum ManagementPolicy {
    /// Create, update and delete it.
    #[default]
    Manage,
    /// Only read it and report its state.
    ObserveOnly,
}

/// An S3 bucket.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "cloud.cairn.dev",
    version = "v1alpha1",
    kind = "ObjectBucket",
    namespaced,
    derive = "PartialEq",
    status = "CloudStatus",
    shortname = "ob",
    category = "cairn",
    printcolumn(
        name = "External Name",
        type_ = "string",
        json_path = ".metadata.annotations.cloud\\.cairn\\.dev/external-name"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Synced",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Synced\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new(
    "has(self.bucketName) == has(oldSelf.bucketName) && (!has(self.bucketName) || self.bucketName == oldSelf.bucketName)"
).message("spec.bucketName is immutable: it names the bucket this object manages"))]
#[x_kube(validation = Rule::new(
    "has(self.region) == has(oldSelf.region) && (!has(self.region) || self.region == oldSelf.region)"
).message("spec.region is immutable: a bucket cannot move"))]
#[x_kube(validation = Rule::new("self.managementPolicy != 'ObserveOnly' || self.deletionPolicy == 'Orphan'")
    .message("an ObserveOnly bucket must have deletionPolicy Orphan: Cairn never deletes what it only observes"))]
#[serde(rename_all = "camelCase")]
pub struct ObjectBucketSpec {
    /// The ProviderConfig of this namespace to use.
    pub provider_config_ref: LocalObjectReference,
    /// Name of the bucket (S3 naming rules). Default: derived from the
    /// namespace, name and uid of this object. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"))]
    pub bucket_name: Option<String>,
    /// Region of the bucket; the ProviderConfig's if unset. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-z0-9-]{1,32}$"))]
    pub region: Option<String>,
    /// Keep every version of every object.
    #[serde(default)]
    pub versioning: bool,
    /// Server-side encryption of new objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<Encryption>,
    /// Block every form of public access (default true).
    #[serde(default = "default_true")]
    pub public_access_block: bool,
    /// Expiry of objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<Lifecycle>,
    /// Tags of the bucket (the controller adds its own owner tag).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 40))]
    pub tags: BTreeMap<String, String>,
    /// `Orphan` (default) keeps the bucket, and the data in it, when this
    /// object is deleted; `Delete` deletes it (S3 refuses while it holds objects).
    #[serde(default = "orphan")]
    pub deletion_policy: DeletionPolicy,
    /// `Manage` (default) or `ObserveOnly`.
    #[serde(default)]
    pub management_policy: ManagementPolicy,
    /// Secret of this namespace to write the bucket's endpoint, name,
    /// region and credentials to, for applications (and Backups) to use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_connection_secret_to_ref: Option<LocalObjectReference>,
}

fn default_true() -> bool {
    true
}

/// Buckets hold data (backups among them): never delete one by default.
fn orphan() -> DeletionPolicy {
    DeletionPolicy::Orphan
}

/// Server-side encryption.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Encryption {
    /// S3-managed keys.
    #[serde(rename = "AES256")]
    Aes256,
    /// AWS KMS keys.
    #[serde(rename = "aws:kms")]
    AwsKms,
}

/// Expiry of objects in a bucket.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    /// Days after which objects are deleted.
    #[schemars(range(min = 1, max = 36500))]
    pub expire_after_days: i32,
}

/// A DNS record set in a hosted zone (Route53).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "cloud.cairn.dev",
    version = "v1alpha1",
    kind = "DnsRecord",
    namespaced,
    derive = "PartialEq",
    status = "CloudStatus",
    shortname = "dnsr",
    category = "cairn",
    printcolumn(
        name = "External Name",
        type_ = "string",
        json_path = ".metadata.annotations.cloud\\.cairn\\.dev/external-name"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Synced",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Synced\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new("self.zone == oldSelf.zone && self.name == oldSelf.name && self.type == oldSelf.type")
    .message("spec.zone, spec.name and spec.type identify the record and are immutable"))]
#[x_kube(validation = Rule::new("self.type != 'CNAME' || size(self.values) == 1")
    .message("a CNAME record has exactly one value"))]
#[x_kube(validation = Rule::new("self.type != 'CNAME' || self.name != self.zone")
    .message("a CNAME record cannot be at the zone apex"))]
#[x_kube(validation = Rule::new("self.managementPolicy != 'ObserveOnly' || self.deletionPolicy == 'Orphan'")
    .message("an ObserveOnly record must have deletionPolicy Orphan: Cairn never deletes what it only observes"))]
#[x_kube(validation = Rule::new("self.name == self.zone || self.name.endsWith('.' + self.zone)")
    .message("spec.name must be spec.zone or a name inside it"))]
#[serde(rename_all = "camelCase")]
pub struct DnsRecordSpec {
    /// The ProviderConfig of this namespace to use.
    pub provider_config_ref: LocalObjectReference,
    /// The hosted zone's domain, e.g. "example.com".
    #[schemars(
        length(max = 253),
        regex(
            pattern = r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\.)*[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
        )
    )]
    pub zone: String,
    /// Fully qualified name of the record, inside the zone, e.g.
    /// "db.example.com"; may start with "*." for a wildcard.
    #[schemars(
        length(max = 253),
        regex(
            pattern = r"^(\*\.)?([a-z0-9_]([-a-z0-9_]{0,61}[a-z0-9])?\.)*[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
        )
    )]
    pub name: String,
    /// Record type.
    #[serde(rename = "type")]
    pub type_: RecordType,
    /// Time to live, in seconds (default 300).
    #[serde(default = "default_ttl")]
    #[schemars(range(min = 0, max = 2147483647))]
    pub ttl: i64,
    /// The record's values, e.g. IP addresses for A records.
    #[schemars(length(min = 1, max = 100))]
    pub values: Vec<String>,
    /// `Delete` (default) deletes the record with this object, `Orphan` keeps it.
    #[serde(default = "delete")]
    pub deletion_policy: DeletionPolicy,
    /// `Manage` (default) or `ObserveOnly`.
    #[serde(default)]
    pub management_policy: ManagementPolicy,
}

fn default_ttl() -> i64 {
    300
}

/// DNS record types Cairn manages.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[allow(clippy::upper_case_acronyms)]
pub enum RecordType {
    A,
    AAAA,
    CNAME,
    TXT,
    MX,
    SRV,
    CAA,
    NS,
}
