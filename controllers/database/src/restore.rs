//! `bootstrap.fromBackup` and `fromBucket`: which backup a new cluster
//! restores, checked before anything is created. The backup and the WAL after it are read from
//! this cluster's own backup destination (its instances hold only those
//! credentials), in the source cluster's folder; the restored cluster
//! archives to its own folder, so its name must differ from the source's.

use cairn_api::backup::layout::{BackupId, Layout};
use cairn_api::backup::v1::{Backup, BackupMethod, BackupPhase};
use cairn_api::database::v1::{DatabaseCluster, FromBucketSpec, RestoredFrom};
use kube::{Api, ResourceExt};

use crate::build;
use crate::context::Context;
use crate::error::Error;

/// What the bootstrap needs now.
#[derive(Debug, PartialEq)]
pub enum Source {
    /// Not a restore, or one already recorded in the status.
    Recorded,
    /// A restore checked and to record before anything is created.
    Found(RestoredFrom),
    /// Not possible yet (the Backup missing or still running): retried.
    Waiting {
        reason: &'static str,
        message: String,
    },
    /// Not possible as specified: nothing is created until the cluster is
    /// deleted and created again.
    Refused {
        reason: &'static str,
        message: String,
    },
}

pub mod reason {
    pub const BACKUP_NOT_FOUND: &str = "BackupNotFound";
    pub const BACKUP_NOT_COMPLETED: &str = "BackupNotCompleted";
    pub const BACKUP_FAILED: &str = "BackupFailed";
    pub const NO_DESTINATION: &str = "RestoreNeedsDestination";
    pub const BACKUP_ELSEWHERE: &str = "BackupElsewhere";
    pub const SAME_NAME: &str = "RestoreIntoSourceName";
    pub const TARGET_WITH_DUMP: &str = "RecoveryTargetWithLogicalBackup";
}

/// The restore's source. A `fromBackup` reads its Backup (outside the
/// caches: only a cluster never initialised whose source is not recorded yet
/// reads it); a `fromBucket` needs nothing but the spec.
pub async fn source(ctx: &Context, cluster: &DatabaseCluster) -> Result<Source, Error> {
    let status = cluster.status.as_ref();
    let settled = status.is_some_and(|s| s.restored_from.is_some() || s.initialized);
    let bootstrap = cluster.spec.bootstrap.as_ref();
    if settled {
        return Ok(Source::Recorded);
    }
    if let Some(from) = bootstrap.and_then(|b| b.from_bucket.as_ref()) {
        return Ok(check_bucket(cluster, from));
    }
    let Some(from) = bootstrap.and_then(|b| b.from_backup.as_ref()) else {
        return Ok(Source::Recorded);
    };
    let api: Api<Backup> =
        Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    let backup = api.get_opt(&from.name).await?;
    Ok(check(cluster, backup.as_ref()))
}

/// Whether the folder of cluster `from.cluster` in this cluster's
/// destination can be restored (which backup is for the instance to find
/// in the bucket, with the credentials only it holds).
pub fn check_bucket(cluster: &DatabaseCluster, from: &FromBucketSpec) -> Source {
    if from.cluster == cluster.name_any() {
        return Source::Refused {
            reason: reason::SAME_NAME,
            message: format!(
                "fromBucket.cluster is {:?}, this cluster's own name: it would archive its WAL \
                 into the source's folder; restore into a cluster of another name",
                from.cluster
            ),
        };
    }
    let Some(s3) = build::archive_destination(cluster) else {
        return no_destination();
    };
    let folder = Layout::new(s3.prefix.as_deref().unwrap_or(""), &from.cluster);
    let location = match from.backup_id.as_deref().map(BackupId::parse) {
        Some(Ok(id)) => format!("s3://{}/{}", s3.bucket, folder.base_backup(&id)),
        Some(Err(e)) => {
            return Source::Refused {
                reason: reason::BACKUP_ELSEWHERE,
                message: e.to_string(),
            };
        }
        None => format!("s3://{}/{}", s3.bucket, folder.root()),
    };
    Source::Found(RestoredFrom {
        backup: None,
        cluster: from.cluster.clone(),
        backup_id: from.backup_id.clone(),
        location,
        method: None,
    })
}

fn no_destination() -> Source {
    Source::Refused {
        reason: reason::NO_DESTINATION,
        message: "a restore reads the backup and its WAL from spec.backup.destination (s3), \
                  which is unset: give it the bucket and prefix the backup is in"
            .into(),
    }
}

/// Whether `backup` can be restored into `cluster`.
pub fn check(cluster: &DatabaseCluster, backup: Option<&Backup>) -> Source {
    let name = cluster
        .spec
        .bootstrap
        .as_ref()
        .and_then(|b| b.from_backup.as_ref())
        .map(|f| f.name.clone())
        .unwrap_or_default();
    let Some(backup) = backup else {
        return Source::Waiting {
            reason: reason::BACKUP_NOT_FOUND,
            message: format!("waiting for Backup {name:?} of this namespace: it does not exist"),
        };
    };
    let status = backup.status.clone().unwrap_or_default();
    match status.phase {
        Some(BackupPhase::Completed) => {}
        Some(BackupPhase::Failed) => {
            return Source::Refused {
                reason: reason::BACKUP_FAILED,
                message: format!(
                    "Backup {name:?} failed ({}); nothing was created: restore another backup",
                    status.error.unwrap_or_default()
                ),
            };
        }
        _ => {
            return Source::Waiting {
                reason: reason::BACKUP_NOT_COMPLETED,
                message: format!("waiting for Backup {name:?} to complete"),
            };
        }
    }
    let source = backup.spec.cluster.name.clone();
    if source == cluster.name_any() {
        return Source::Refused {
            reason: reason::SAME_NAME,
            message: format!(
                "Backup {name:?} is of a cluster named {source:?} too: this cluster would \
                 archive its WAL into the source's folder; restore into a cluster of another name"
            ),
        };
    }
    let Some(s3) = build::archive_destination(cluster) else {
        return no_destination();
    };
    let method = backup.spec.method;
    let target = cluster
        .spec
        .bootstrap
        .as_ref()
        .and_then(|b| b.recovery_target());
    if method == BackupMethod::Logical && target.is_some() {
        return Source::Refused {
            reason: reason::TARGET_WITH_DUMP,
            message: format!(
                "Backup {name:?} is logical (a pg_dump): it restores as it was dumped, with no \
                 WAL to replay to a recovery target; remove recoveryTarget, or restore a physical \
                 backup"
            ),
        };
    }
    let id = status.backup_id.clone().unwrap_or_default();
    let expected = BackupId::parse(&id).ok().map(|id| {
        let layout = Layout::new(s3.prefix.as_deref().unwrap_or(""), &source);
        format!(
            "s3://{}/{}",
            s3.bucket,
            layout.backup(method.stored_as(), &id)
        )
    });
    let location = status.location.clone().unwrap_or_default();
    if expected.as_deref() != Some(location.as_str()) {
        return Source::Refused {
            reason: reason::BACKUP_ELSEWHERE,
            message: format!(
                "Backup {name:?} is stored at {location:?}, not in this cluster's \
                 spec.backup.destination (s3://{}/{}): a restore reads from the cluster's own \
                 destination, with its credentials",
                s3.bucket,
                s3.prefix.as_deref().unwrap_or("")
            ),
        };
    }
    Source::Found(RestoredFrom {
        backup: Some(name),
        cluster: source,
        backup_id: Some(id),
        location,
        method: (method == BackupMethod::Logical).then_some(method),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use serde_json::json;

    fn restoring() -> DatabaseCluster {
        let mut cluster = fixtures::archiving(fixtures::cluster(1, &[]));
        cluster.metadata.name = Some("copy".into());
        cluster.spec.bootstrap = Some(
            serde_json::from_value(json!({ "fromBackup": { "name": "nightly" } }))
                .expect("bootstrap"),
        );
        cluster
    }

    fn backup(cluster: &str, status: serde_json::Value) -> Backup {
        serde_json::from_value(json!({
            "apiVersion": "backup.cairn.dev/v1", "kind": "Backup",
            "metadata": { "name": "nightly" },
            "spec": { "cluster": { "name": cluster }, "method": "physical" },
            "status": status,
        }))
        .expect("backup")
    }

    #[test]
    fn a_completed_backup_in_the_clusters_bucket_is_the_source() {
        let done = backup(
            "orders",
            json!({ "phase": "Completed", "backupId": "nightly-0a1b2c3d",
            "location": "s3://wal/shop/orders/base/nightly-0a1b2c3d/" }),
        );
        assert_eq!(
            check(&restoring(), Some(&done)),
            Source::Found(RestoredFrom {
                backup: Some("nightly".into()),
                cluster: "orders".into(),
                backup_id: Some("nightly-0a1b2c3d".into()),
                location: "s3://wal/shop/orders/base/nightly-0a1b2c3d/".into(),
                method: None,
            })
        );
        // A logical backup is in the dumps folder, and restores as dumped:
        // no recovery target.
        let mut dump = backup(
            "orders",
            json!({ "phase": "Completed", "backupId": "nightly-0a1b2c3d",
            "location": "s3://wal/shop/orders/dumps/nightly-0a1b2c3d/" }),
        );
        dump.spec.method = BackupMethod::Logical;
        let found = check(&restoring(), Some(&dump));
        assert!(
            matches!(&found, Source::Found(from) if from.method == Some(BackupMethod::Logical)),
            "{found:?}"
        );
        let mut to_a_time = restoring();
        to_a_time.spec.bootstrap = Some(
            serde_json::from_value(json!({ "fromBackup": { "name": "nightly",
                "recoveryTarget": { "time": "2026-11-26T00:00:00Z" } } }))
            .expect("bootstrap"),
        );
        assert!(matches!(
            check(&to_a_time, Some(&dump)),
            Source::Refused {
                reason: reason::TARGET_WITH_DUMP,
                ..
            }
        ));
    }

    #[test]
    fn a_bucket_restore_names_the_source_folder_and_leaves_the_choice_to_the_instance() {
        let mut cluster = restoring();
        let from: FromBucketSpec =
            serde_json::from_value(json!({ "cluster": "orders" })).expect("from");
        assert_eq!(
            check_bucket(&cluster, &from),
            Source::Found(RestoredFrom {
                backup: None,
                cluster: "orders".into(),
                backup_id: None,
                location: "s3://wal/shop/orders/".into(),
                method: None,
            })
        );
        let same: FromBucketSpec =
            serde_json::from_value(json!({ "cluster": "copy" })).expect("from");
        assert!(matches!(
            check_bucket(&cluster, &same),
            Source::Refused {
                reason: reason::SAME_NAME,
                ..
            }
        ));
        cluster.spec.backup = None;
        assert!(matches!(
            check_bucket(&cluster, &from),
            Source::Refused {
                reason: reason::NO_DESTINATION,
                ..
            }
        ));
    }

    #[test]
    fn a_restore_waits_for_its_backup_and_refuses_what_would_lose_or_mix_data() {
        let cluster = restoring();
        let reason_of = |source: Source| match source {
            Source::Waiting { reason, .. } | Source::Refused { reason, .. } => reason,
            other => panic!("{other:?}"),
        };
        assert_eq!(reason_of(check(&cluster, None)), reason::BACKUP_NOT_FOUND);
        let running = backup("orders", json!({ "phase": "Running" }));
        assert_eq!(
            reason_of(check(&cluster, Some(&running))),
            reason::BACKUP_NOT_COMPLETED
        );
        let failed = backup(
            "orders",
            json!({ "phase": "Failed", "error": "instance lost" }),
        );
        assert!(matches!(
            check(&cluster, Some(&failed)),
            Source::Refused {
                reason: reason::BACKUP_FAILED,
                ..
            }
        ));
        let elsewhere = backup(
            "orders",
            json!({ "phase": "Completed", "backupId": "nightly-0a1b2c3d",
            "location": "s3://other/orders/base/nightly-0a1b2c3d/" }),
        );
        assert!(matches!(
            check(&cluster, Some(&elsewhere)),
            Source::Refused {
                reason: reason::BACKUP_ELSEWHERE,
                ..
            }
        ));
        let own = backup(
            "copy",
            json!({ "phase": "Completed", "backupId": "nightly-0a1b2c3d",
            "location": "s3://wal/shop/copy/base/nightly-0a1b2c3d/" }),
        );
        assert!(matches!(
            check(&cluster, Some(&own)),
            Source::Refused {
                reason: reason::SAME_NAME,
                ..
            }
        ));
        let mut no_destination = cluster.clone();
        no_destination.spec.backup = None;
        let done = backup(
            "orders",
            json!({ "phase": "Completed", "backupId": "nightly-0a1b2c3d",
            "location": "s3://wal/shop/orders/base/nightly-0a1b2c3d/" }),
        );
        assert!(matches!(
            check(&no_destination, Some(&done)),
            Source::Refused {
                reason: reason::NO_DESTINATION,
                ..
            }
        ));
    }
}
