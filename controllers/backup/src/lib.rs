//! cairn-backup-controller: runs `Backup`s and `BackupSchedule`s
//! (group `backup.cairn.dev`).
//!
//! The reconcile pipeline lands here with the backup controller issue; the
//! binary is a placeholder until then.

/// The API group this controller reconciles.
pub const GROUP: &str = cairn_api::BACKUP_GROUP;
