//! cairn-cloud-controller: manages resources outside the cluster described by
//! `ProviderConfig`, `ObjectBucket` and `DnsRecord` (group `cloud.cairn.dev`).
//!
//! The reconcile pipeline lands here with the cloud controller issue; the
//! binary is a placeholder until then.

/// The API group this controller reconciles.
pub const GROUP: &str = cairn_api::CLOUD_GROUP;

pub mod bucket;
pub mod external;
pub mod policy;
pub mod provider;
