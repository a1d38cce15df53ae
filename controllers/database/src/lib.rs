//! cairn-database-controller: runs PostgreSQL clusters described by
//! `DatabaseCluster` objects (group `database.cairn.dev`).
//!
//! Each reconcile is validate → build → apply → status: [`build`] computes
//! the children without I/O, [`reconcile`] applies what differs from the
//! caches and writes the status [`status`] derives.

pub mod build;
pub mod error;
pub mod failover;
#[cfg(test)]
mod fixtures;
pub mod leftovers;
pub mod metrics;
pub mod reconcile;
pub mod restore;
pub mod rollout;
pub mod status;
pub mod switchover;
pub mod tls;
pub mod tokens;
pub mod webhook;
pub mod wiring;

/// The API group this controller reconciles.
pub const GROUP: &str = cairn_api::DATABASE_GROUP;

/// The field manager of every write, and the Events' reporting controller.
pub const MANAGER: &str = "cairn-database-controller";
