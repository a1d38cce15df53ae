//! The `backup.cairn.dev` group: `Backup` and `BackupSchedule`.

pub mod v1;
