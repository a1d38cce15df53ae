//! cairn-database-controller: runs PostgreSQL clusters described by
//! `DatabaseCluster` objects (group `database.cairn.dev`).
//!
//! The reconcile pipeline (validate → build → apply → status) lands here with
//! the database controller issue; the binary is a placeholder until then.

/// The API group this controller reconciles.
pub const GROUP: &str = cairn_api::DATABASE_GROUP;
