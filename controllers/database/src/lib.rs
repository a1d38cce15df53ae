//! cairn-database-controller: runs PostgreSQL clusters described by
//! `DatabaseCluster` objects (group `database.cairn.dev`).
//!
//! Each reconcile is a pipeline ([`reconcile`]): validate, then the
//! [`membership`] step (failover, switchover, role labels), then every
//! child built in one pure call ([`desired`], from [`build`]) and applied in
//! one loop ([`children`]), then the status [`status`] derives.

pub mod build;
pub mod children;
pub mod context;
pub mod desired;
pub mod drain;
pub mod error;
pub mod failover;
#[cfg(test)]
mod fixtures;
pub mod leftovers;
pub mod membership;
pub mod metrics;
pub mod pods;
pub mod reconcile;
pub mod restore;
pub mod rollout;
pub mod secrets;
pub mod status;
pub mod storage;
pub mod switchover;
pub mod tls;
pub mod tokens;
pub mod webhook;
pub mod wiring;

/// The API group this controller reconciles.
pub const GROUP: &str = cairn_api::DATABASE_GROUP;

/// The field manager of every write, and the Events' reporting controller.
pub const MANAGER: &str = "cairn-database-controller";
