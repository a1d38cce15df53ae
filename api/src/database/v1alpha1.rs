//! `database.cairn.dev/v1alpha1`: the first published shape of
//! `DatabaseCluster`. Served and deprecated; stored as v1 (see
//! [`super::conversion`]).

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::v1::DatabaseClusterPhase;
use crate::common::Condition;

/// A PostgreSQL cluster (deprecated shape; use database.cairn.dev/v1).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "database.cairn.dev",
    version = "v1alpha1",
    kind = "DatabaseCluster",
    namespaced,
    derive = "PartialEq",
    status = "DatabaseClusterStatus",
    shortname = "dbc",
    category = "cairn",
    storage = false,
    deprecated = "database.cairn.dev/v1alpha1 DatabaseCluster is deprecated; use database.cairn.dev/v1",
    scale(
        spec_replicas_path = ".spec.size",
        status_replicas_path = ".status.instances"
    ),
    printcolumn(name = "Size", type_ = "integer", json_path = ".spec.size"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
// The API server checks a write against the schema of the version it was
// sent in: v1's rules on the fields both versions have are repeated here.
#[x_kube(validation = Rule::new(
    "int(self.version.split('.')[0]) == int(oldSelf.version.split('.')[0])"
).message("spec.version: the major version cannot change: Cairn does not upgrade (or downgrade) a data folder between major versions yet; create a new cluster instead"))]
#[x_kube(validation = Rule::new(
    "quantity(self.storageSize).compareTo(quantity(oldSelf.storageSize)) >= 0"
).message("spec.storageSize cannot shrink: PersistentVolumeClaims can only grow"))]
#[serde(rename_all = "camelCase")]
pub struct DatabaseClusterSpec {
    /// Number of PostgreSQL instances (v1: spec.instances).
    #[schemars(range(min = 1, max = 9))]
    pub size: i32,
    /// PostgreSQL version (v1: spec.postgres.version).
    #[schemars(regex(pattern = r"^(1[3-8])(\.[0-9]{1,3})?$"))]
    pub version: String,
    /// Size of each instance's volume (v1: spec.storage.size).
    #[schemars(
        length(max = 64),
        regex(
            pattern = r"^(\+)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
        )
    )]
    #[x_kube(validation = Rule::new("quantity(self).isGreaterThan(quantity('0'))")
        .message("spec.storageSize must be a positive quantity such as 10Gi"))]
    pub storage_size: String,
}

/// Observed state of a cluster (deprecated shape).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseClusterStatus {
    /// Lifecycle phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<DatabaseClusterPhase>,
    /// `Ready`, `Progressing` and `Degraded`, with reasons.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The primary's address (v1: status.endpoints.readWrite).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Number of instance pods that exist (v1: status.instances).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instances: Option<i32>,
}
