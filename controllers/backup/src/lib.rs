//! cairn-backup-controller: runs `Backup`s (group `backup.cairn.dev`).
//!
//! A Backup is taken by one of its cluster's instances, never by this
//! process: the controller picks the instance and hands it the Backup in
//! `status.instance`; the instance, which watches its cluster's Backups,
//! streams the base backup to the bucket and reports in its membership
//! Lease; the controller reads those Leases from its cache and reports the
//! result here, failing a Backup whose instance is lost or whose deadline
//! passes. No network route to the pods, and the instances write nothing
//! but their own Lease.
//!
//! The reconcile: dereference (caches only) → decide (`plan`, pure) →
//! status → when to look again. A completed Backup with
//! `spec.verification` is then restored into a throw-away pod that checks
//! it (`verify`, pure, then the pod, the status, the pod's deletion).

pub mod artifact;
pub mod backup;
pub mod error;
pub mod metrics;
pub mod plan;
pub mod schedule;
pub mod schedule_plan;
pub mod verify;
pub mod wiring;

/// The API group this controller reconciles.
pub const GROUP: &str = cairn_api::BACKUP_GROUP;
/// The field manager of every write.
pub const MANAGER: &str = "cairn-backup-controller";
