//! The `database.cairn.dev` group: `DatabaseCluster`, stored as v1 and also
//! served as the deprecated v1alpha1.

pub mod conversion;
pub mod instance;
pub mod pod;
pub mod v1;
pub mod v1alpha1;
