//! cairn-cloud-controller: manages resources outside the cluster described by
//! `ProviderConfig`, `ObjectBucket` and `DnsRecord` (group `cloud.cairn.dev`).
//!
//! One generic driver (`driver`, in the order `policy` decides) runs every
//! external kind (`external`); `bucket` is the first. See
//! docs/cloud-controller.md.

/// The API group this controller reconciles.
pub const GROUP: &str = cairn_api::CLOUD_GROUP;

pub mod bucket;
pub mod dns;
pub mod driver;
pub mod external;
pub mod metrics;
pub mod policy;
pub mod provider;
pub mod provider_config;
pub mod wiring;
