//! CRD types of Cairn's three API groups, one module per group and version.
//!
//! Each controller owns one group; the chart of that controller ships the
//! group's CRDs (see [`crds`] and the `crdgen` binary).

// kube's `printcolumn(type_ = ..)` repeats keys across columns, which clippy
// mistakes for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
pub mod backup;
#[allow(clippy::duplicated_attributes)]
pub mod cloud;
pub mod common;
pub mod crds;
#[allow(clippy::duplicated_attributes)]
pub mod database;
pub mod reference;
pub mod validate;

/// API group of `DatabaseCluster`, reconciled by cairn-database-controller.
pub const DATABASE_GROUP: &str = "database.cairn.dev";
/// API group of `Backup` and `BackupSchedule`, reconciled by cairn-backup-controller.
pub const BACKUP_GROUP: &str = "backup.cairn.dev";
/// API group of `ProviderConfig`, `ObjectBucket` and `DnsRecord`, reconciled by
/// cairn-cloud-controller.
pub const CLOUD_GROUP: &str = "cloud.cairn.dev";

/// The category every Cairn kind belongs to, so `kubectl get cairn` lists them all.
pub const CATEGORY: &str = "cairn";

/// Every API group Cairn defines, in the order the controllers depend on each
/// other (cloud resources first, then databases, then backups).
pub const GROUPS: [&str; 3] = [CLOUD_GROUP, DATABASE_GROUP, BACKUP_GROUP];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_distinct_subdomains_of_cairn_dev() {
        for (i, group) in GROUPS.iter().enumerate() {
            assert!(group.ends_with(".cairn.dev"), "{group}");
            assert!(!GROUPS[i + 1..].contains(group), "{group} listed twice");
        }
    }
}
