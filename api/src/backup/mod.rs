//! The `backup.cairn.dev` group: `Backup` and `BackupSchedule`.

pub mod layout;
pub mod v1;
