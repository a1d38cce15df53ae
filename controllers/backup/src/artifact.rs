//! What Backups leave in the bucket: removing one when its Backup goes
//! (`deletionPolicy: Delete`), the WAL no remaining backup needs, and the
//! recoverability window a schedule reports.
//!
//! The bucket is the truth. Every complete backup in the cluster's folder
//! counts as kept, whoever took it: one whose Backup was deleted with
//! `Retain`, or one of a Kubernetes cluster that is gone. WAL is deleted
//! only before the start of the oldest of them, and not at all while none
//! is complete.
//!
//! A deletion is never held for ever: a bucket that is gone, a destination
//! that can no longer be known (cluster and `spec.destination` both gone)
//! or one failing for [`GIVE_UP_AFTER`] releases the Backup, with a Warning
//! Event naming what was left behind.

use std::time::Duration;

use cairn_api::backup::layout::{BackupKind, segment_number_of};
use cairn_api::backup::v1::{Backup, BackupPhase, BackupSpec, PINNED_ANNOTATION, S3Destination};
use cairn_api::database::instance::{BackupProgressPhase, parse_lsn};
use cairn_api::database::v1::DatabaseCluster;
use cairn_storage::{BackupId, BaseBackups, S3Settings, StorageError, WalArchive};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::{Api, Client, ResourceExt};

use crate::plan::{self, SILENT_INSTANCE, World};

/// A deletion whose clean-up has failed this long is released anyway.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(15 * 60);

/// What a deleted Backup waits for, or what is done before it goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cleanup {
    /// Its instance may still be writing the backup: it stops when it sees
    /// the deletion, and is given [`SILENT_INSTANCE`] to.
    WaitForInstance(String),
    /// A new cluster is restoring from its cluster's folder and may still
    /// read its files or the WAL after it.
    WaitForRestore(String),
    /// Remove the stored backup, then release the Backup.
    Remove,
    /// Release it, leaving the bucket as it is (`Retain`).
    Release,
    /// Release it and keep its files although its policy says Delete; why.
    Keep(String),
}

/// What else, beyond the Backup and its instances, holds its files back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holds {
    /// The schedule that made it is gone or going: its Backups are being
    /// collected with it, and a schedule removed must not take every
    /// backup it made with it.
    pub schedule_gone: bool,
    /// New clusters still restoring from the folder of its cluster.
    pub restoring: Vec<String>,
}

/// What to do with a Backup that is being deleted and holds our finalizer.
pub fn cleanup(backup: &Backup, world: &World, holds: &Holds) -> Cleanup {
    if backup.spec.deletion_policy != cairn_api::backup::v1::BackupDeletionPolicy::Delete {
        return Cleanup::Release;
    }
    if backup
        .annotations()
        .get(PINNED_ANNOTATION)
        .map(String::as_str)
        == Some("true")
    {
        return Cleanup::Keep(format!("it is pinned ({PINNED_ANNOTATION})"));
    }
    if holds.schedule_gone {
        return Cleanup::Keep(
            "the BackupSchedule that made it was deleted: its backups stay (delete them one by \
             one to remove them)"
                .into(),
        );
    }
    if let Some(pod) = still_writing(backup, world) {
        return Cleanup::WaitForInstance(pod);
    }
    if let Some(cluster) = holds.restoring.first() {
        return Cleanup::WaitForRestore(cluster.clone());
    }
    Cleanup::Remove
}

/// The instance that may still write this Backup's files: it was assigned
/// the Backup, its pod is the same, its Lease is fresh, it has not reported
/// the backup finished, and the deletion is younger than
/// [`SILENT_INSTANCE`] (by then it has seen it, or is lost).
fn still_writing(backup: &Backup, world: &World) -> Option<String> {
    let status = backup.status.as_ref()?;
    if status.phase != Some(BackupPhase::Running) {
        return None;
    }
    let deleted = backup.metadata.deletion_timestamp.as_ref()?.0;
    let grace = SignedDuration::try_from(SILENT_INSTANCE).unwrap_or_default();
    if world.now.duration_since(deleted) > grace {
        return None;
    }
    let pod = status.instance.as_deref()?;
    let instance = world.instances.iter().find(|i| i.pod == pod)?;
    // Not known while the Lease watch is blind: held, as if it still wrote.
    let fresh = plan::fresh(instance) != Some(false);
    let uid = backup.uid().unwrap_or_default();
    let finished = instance
        .observed
        .as_ref()
        .and_then(|o| o.backup.as_ref())
        .is_some_and(|b| b.uid == uid && b.phase != BackupProgressPhase::Running);
    (Some(instance.uid.as_str()) == status.instance_uid.as_deref() && fresh && !finished)
        .then(|| pod.to_owned())
}

/// Where a Backup's files are: its cluster's destination (the only one
/// backups go to), or its own `spec.destination` once the cluster is gone.
pub fn destination<'a>(
    backup: &'a BackupSpec,
    cluster: Option<&'a DatabaseCluster>,
) -> Option<&'a S3Destination> {
    cluster
        .and_then(|c| c.spec.backup.as_ref()?.destination.s3.as_ref())
        .or_else(|| backup.destination.as_ref()?.s3.as_ref())
}

/// The settings of `destination` with its credentials, read from its
/// Secret now (never cached: the controller watches no Secret). The inner
/// error says why the destination cannot be used (a missing Secret or key).
pub async fn settings(
    client: &Client,
    namespace: &str,
    destination: &S3Destination,
) -> Result<Result<S3Settings, String>, kube::Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = secrets
        .get_opt(&destination.credentials_secret.name)
        .await?;
    Ok(S3Settings::of(destination, secret.as_ref()))
}

/// What removing a Backup's files did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Removed {
    pub location: String,
    pub wal_files: usize,
}

/// Where `backup`'s files are with `settings`: `s3://…/base/<id>/` (or
/// `dumps/<id>/`).
pub fn location(settings: &S3Settings, backup: &Backup) -> Result<String, StorageError> {
    let id = BackupId::of_backup(&backup.name_any(), &backup.uid().unwrap_or_default())?;
    let kind = backup.spec.method.stored_as();
    Ok(BaseBackups::of_kind(settings, &backup.spec.cluster.name, kind).location(&id))
}

/// Removes the files of `backup` (its folder, whatever state the upload
/// reached) and then, for a base backup and with `prune_wal`, the WAL that
/// no remaining base backup of its cluster needs (a logical backup needs
/// no WAL).
pub async fn remove(
    settings: &S3Settings,
    backup: &Backup,
    prune_wal: bool,
) -> Result<Removed, StorageError> {
    let cluster = &backup.spec.cluster.name;
    let id = BackupId::of_backup(&backup.name_any(), &backup.uid().unwrap_or_default())?;
    let kind = backup.spec.method.stored_as();
    let base = BaseBackups::of_kind(settings, cluster, kind);
    base.delete(&id).await?;
    let wal_files = match kind {
        BackupKind::Base if prune_wal => delete_unneeded_wal(settings, cluster).await?,
        _ => 0,
    };
    Ok(Removed {
        location: base.location(&id),
        wal_files,
    })
}

/// Deletes the WAL of `cluster` older than its oldest complete backup's
/// start; nothing when no backup is complete, or when a manifest's start
/// cannot be read (it might be the oldest).
pub async fn delete_unneeded_wal(
    settings: &S3Settings,
    cluster: &str,
) -> Result<usize, StorageError> {
    let catalog = BaseBackups::new(settings, cluster).catalog().await?;
    let starts: Option<Vec<u64>> = catalog.iter().map(|m| parse_lsn(&m.begin_lsn)).collect();
    let Some(first) = starts.and_then(|starts| starts.into_iter().min()) else {
        return Ok(0);
    };
    WalArchive::new(settings, cluster)
        .delete_before(&segment_number_of(first))
        .await
}

/// The span a cluster can be restored to, read from its folder.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Window {
    /// When the oldest complete backup ended.
    pub first: Option<Timestamp>,
    /// When the newest WAL file or backup was stored.
    pub last: Option<Timestamp>,
}

pub async fn window(settings: &S3Settings, cluster: &str) -> Result<Window, StorageError> {
    let catalog = BaseBackups::new(settings, cluster).catalog().await?;
    let ended = |m: &cairn_storage::Manifest| m.completed_at.parse::<Timestamp>().ok();
    let first = catalog.iter().filter_map(ended).min();
    if first.is_none() {
        // WAL alone restores nothing.
        return Ok(Window::default());
    }
    let wal = WalArchive::new(settings, cluster)
        .last_stored()
        .await?
        .and_then(|t| Timestamp::try_from(t).ok());
    let last = catalog.iter().filter_map(ended).chain(wal).max();
    Ok(Window { first, last })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Instance;
    use cairn_api::database::instance::{BackupProgress, ObservedState};
    use serde_json::json;

    fn deleted_backup(policy: &str, phase: &str, deleted: &str) -> Backup {
        serde_json::from_value(json!({
            "apiVersion": "backup.cairn.dev/v1", "kind": "Backup",
            "metadata": { "name": "nightly", "uid": "u-1", "deletionTimestamp": deleted,
                          "finalizers": ["backup.cairn.dev/artifact"] },
            "spec": { "cluster": { "name": "orders" }, "method": "physical",
                      "deletionPolicy": policy },
            "status": { "phase": phase, "instance": "orders-1", "instanceUid": "pod-1" },
        }))
        .expect("backup")
    }

    fn world(now: &str, report: Option<BackupProgressPhase>) -> World {
        let now: Timestamp = now.parse().expect("time");
        World {
            cluster: None,
            instances: vec![Instance {
                pod: "orders-1".into(),
                uid: "pod-1".into(),
                observed: Some(ObservedState {
                    backup: report.map(|phase| BackupProgress {
                        uid: "u-1".into(),
                        phase,
                        ..BackupProgress::default()
                    }),
                    ..ObservedState::default()
                }),
                silent: Some(Duration::ZERO),
                beat_seen: true,
            }],
            running: vec![],
            now,
        }
    }

    #[test]
    fn retain_releases_at_once_and_delete_removes() {
        let at = "2026-11-26T00:00:00Z";
        let retained = deleted_backup("Retain", "Running", at);
        let running = Some(BackupProgressPhase::Running);
        assert_eq!(
            cleanup(&retained, &world(at, running), &Holds::default()),
            Cleanup::Release
        );
        let done = deleted_backup("Delete", "Completed", at);
        let none = Holds::default();
        assert_eq!(cleanup(&done, &world(at, None), &none), Cleanup::Remove);
        // Never the files of a pinned one, nor of a schedule's Backups
        // collected with it; not while a restore reads the folder.
        let mut pinned = done.clone();
        pinned
            .annotations_mut()
            .insert(PINNED_ANNOTATION.into(), "true".into());
        assert!(matches!(
            cleanup(&pinned, &world(at, None), &none),
            Cleanup::Keep(_)
        ));
        let orphaned = Holds {
            schedule_gone: true,
            ..Holds::default()
        };
        assert!(matches!(
            cleanup(&done, &world(at, None), &orphaned),
            Cleanup::Keep(_)
        ));
        let read = Holds {
            restoring: vec!["copy".into()],
            ..Holds::default()
        };
        assert_eq!(
            cleanup(&done, &world(at, None), &read),
            Cleanup::WaitForRestore("copy".into())
        );
    }

    fn cleanup_of(backup: &Backup, world: &World) -> Cleanup {
        cleanup(backup, world, &Holds::default())
    }

    #[test]
    fn a_running_backup_is_removed_once_its_instance_stopped_or_had_time_to() {
        let deleted = "2026-11-26T00:00:00Z";
        let backup = deleted_backup("Delete", "Running", deleted);
        let writing = Cleanup::WaitForInstance("orders-1".into());
        let running = Some(BackupProgressPhase::Running);
        assert_eq!(
            cleanup_of(&backup, &world("2026-11-26T00:00:05Z", running)),
            writing
        );
        // Not reported yet: it may have just started.
        assert_eq!(
            cleanup_of(&backup, &world("2026-11-26T00:00:05Z", None)),
            writing
        );
        let failed = Some(BackupProgressPhase::Failed);
        assert_eq!(
            cleanup_of(&backup, &world("2026-11-26T00:00:05Z", failed)),
            Cleanup::Remove,
            "it stopped"
        );
        assert_eq!(
            cleanup_of(&backup, &world("2026-11-26T00:00:31Z", running)),
            Cleanup::Remove,
            "it had the time to see the deletion"
        );
        let mut replaced = world("2026-11-26T00:00:05Z", running);
        replaced.instances[0].uid = "pod-2".into();
        assert_eq!(cleanup_of(&backup, &replaced), Cleanup::Remove);
    }

    #[test]
    fn the_files_are_where_the_cluster_stores_them_or_the_backup_said() {
        let mut backup = deleted_backup("Delete", "Completed", "2026-11-26T00:00:00Z");
        assert_eq!(destination(&backup.spec, None), None);
        let cluster: DatabaseCluster = serde_json::from_value(json!({
            "apiVersion": "database.cairn.dev/v1", "kind": "DatabaseCluster",
            "metadata": { "name": "orders" },
            "spec": { "instances": 1, "postgres": { "version": "17" }, "storage": { "size": "1Gi" },
                      "backup": { "destination": { "s3": { "bucket": "b1", "credentialsSecret": { "name": "s3" } } } } },
        }))
        .expect("cluster");
        assert_eq!(
            destination(&backup.spec, Some(&cluster)).map(|d| d.bucket.as_str()),
            Some("b1")
        );
        backup.spec.destination = serde_json::from_value(
            json!({ "s3": { "bucket": "b2", "credentialsSecret": { "name": "s3" } } }),
        )
        .expect("destination");
        assert_eq!(
            destination(&backup.spec, None).map(|d| d.bucket.as_str()),
            Some("b2"),
            "the cluster gone"
        );
    }
}
