//! The `database.cairn.dev` group: `DatabaseCluster`.

pub mod v1;
