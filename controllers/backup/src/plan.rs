//! What to do with a Backup, decided without I/O from what the caches show:
//! the Backup, its cluster, and the cluster's instances as their pods and
//! membership Leases report them. Then the status that decision writes.

use std::sync::Arc;
use std::time::Duration;

use cairn_api::backup::layout::Layout;
use cairn_api::backup::v1::{Backup, BackupDestination, BackupPhase, BackupStatus};
use cairn_api::common::Time;
use cairn_api::database::instance::{
    BackupProgress, BackupProgressPhase, ObservedState, parse_lsn,
};
use cairn_api::database::v1::DatabaseCluster;
use cairn_runtime::conditions;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

/// A Backup not finished this long after its creation fails.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(3600);
/// An instance whose Lease has not been renewed for this long while it
/// takes a backup is lost (its heartbeat is every 2 s).
pub const SILENT_INSTANCE: Duration = Duration::from_secs(30);
/// How often a Backup waiting for an instance, or running, is looked at
/// again: progress comes in the instances' Leases, which renew every 2 s,
/// so they are read on this beat instead of waking on every renewal.
pub const POLL: Duration = Duration::from_secs(5);

/// One instance of the cluster: its pod and what its Lease reports.
#[derive(Clone, Debug, Default)]
pub struct Instance {
    pub pod: String,
    pub uid: String,
    pub observed: Option<ObservedState>,
    /// How long this process has seen its Lease's renewal unchanged, on
    /// its own clock (`heartbeat`); None while the Lease watch is blind.
    pub silent: Option<Duration>,
    /// This process saw its Lease renewed: it was alive, not only a Lease
    /// left behind.
    pub beat_seen: bool,
}

/// Everything a decision reads.
#[derive(Debug)]
pub struct World {
    pub cluster: Option<Arc<DatabaseCluster>>,
    pub instances: Vec<Instance>,
    /// Other Backups of the same cluster that go first: Running, or
    /// waiting and older.
    pub running: Vec<String>,
    pub now: Timestamp,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Completed or Failed: nothing more ever happens.
    Final,
    /// Pending, and why.
    Wait {
        reason: &'static str,
        message: String,
    },
    /// Hand it to this instance.
    Assign {
        pod: String,
        uid: String,
    },
    /// The instance is at it.
    Running,
    Completed(BackupProgress),
    Failed {
        reason: &'static str,
        message: String,
    },
}

pub fn decide(backup: &Backup, world: &World) -> Decision {
    let status = backup.status.clone().unwrap_or_default();
    if matches!(
        status.phase,
        Some(BackupPhase::Completed | BackupPhase::Failed)
    ) {
        return Decision::Final;
    }
    let running = status.phase == Some(BackupPhase::Running);
    let decision = if running {
        follow(backup, &status, world)
    } else {
        start(backup, world)
    };
    // The instance's last word counts even past the deadline.
    if matches!(decision, Decision::Completed(_) | Decision::Failed { .. }) {
        return decision;
    }
    if let Some(late) = past_deadline(backup, world.now) {
        let phase = if running { "Running" } else { "Pending" };
        return Decision::Failed {
            reason: "DeadlineExceeded",
            message: format!("not completed within {late} seconds of its creation (still {phase})"),
        };
    }
    decision
}

/// A Pending backup: the cluster and an instance to take it.
fn start(backup: &Backup, world: &World) -> Decision {
    let wait = |reason, message: String| Decision::Wait { reason, message };
    let Some(cluster) = world.cluster.as_deref() else {
        return wait(
            "ClusterNotFound",
            format!(
                "DatabaseCluster {:?} does not exist",
                backup.spec.cluster.name
            ),
        );
    };
    let Some(destination) = cluster.spec.backup.as_ref().map(|b| &b.destination) else {
        return wait(
            "NoDestination",
            "the cluster has no spec.backup.destination to store backups in".into(),
        );
    };
    if let Some(own) = &backup.spec.destination
        && own != destination
    {
        return Decision::Failed {
            reason: "DestinationNotSupported",
            message: "spec.destination differs from the cluster's spec.backup.destination: \
                      backups are stored in the cluster's destination only (its credentials are \
                      the ones its instances hold); leave spec.destination unset"
                .into(),
        };
    }
    let Some(location) = cluster_destination(cluster, destination) else {
        return wait(
            "DestinationNotSupported",
            "spec.backup.destination.bucketRef: backups to an ObjectBucket by reference are not \
             supported yet; give the bucket under s3"
                .into(),
        );
    };
    if let Some(other) = world.running.first() {
        return wait(
            "AnotherBackupRunning",
            format!(
                "waiting for Backup {other} of the same cluster to finish (one at a time, oldest first)"
            ),
        );
    }
    match choose(&world.instances, &location) {
        Some(instance) => Decision::Assign {
            pod: instance.pod.clone(),
            uid: instance.uid.clone(),
        },
        None => wait(
            "NoInstanceReady",
            format!(
                "no ready instance reports the cluster's destination {location} and was seen \
                 renewing its Lease in the last {} s",
                SILENT_INSTANCE.as_secs()
            ),
        ),
    }
}

/// Where the cluster's instances store backups, as they report it.
pub fn cluster_destination(
    cluster: &DatabaseCluster,
    destination: &BackupDestination,
) -> Option<String> {
    let s3 = destination.s3.as_ref()?;
    let layout = Layout::new(s3.prefix.as_deref().unwrap_or(""), &cluster.name_any());
    Some(format!("s3://{}/{}", s3.bucket, layout.root()))
}

/// A ready standby, the most advanced one; the primary when no standby is
/// ready. Only instances that report the cluster's destination (a change of
/// destination reaches each pod with its restart), and that this process
/// saw renew their Lease lately.
fn choose<'a>(instances: &'a [Instance], location: &str) -> Option<&'a Instance> {
    let usable = |i: &&Instance| {
        i.observed.as_ref().is_some_and(|o| {
            o.ready && o.backup_destination.as_deref() == Some(location) && o.problem.is_none()
        }) && fresh(i) == Some(true)
            && i.beat_seen
    };
    let role = |i: &Instance| i.observed.as_ref().and_then(|o| o.role.clone());
    let position = |i: &Instance| {
        i.observed
            .as_ref()
            .and_then(|o| o.wal_position.as_deref())
            .and_then(parse_lsn)
            .unwrap_or(0)
    };
    let standby = instances
        .iter()
        .filter(usable)
        .filter(|i| role(i).as_deref() == Some("replica"))
        .max_by_key(|i| position(i));
    standby.or_else(|| {
        instances
            .iter()
            .filter(usable)
            .find(|i| role(i).as_deref() == Some("primary"))
    })
}

/// Heard from within [`SILENT_INSTANCE`]; None when not known (the Lease
/// watch is blind).
pub fn fresh(instance: &Instance) -> Option<bool> {
    instance.silent.map(|silent| silent <= SILENT_INSTANCE)
}

/// A Running backup: what its instance reports.
fn follow(backup: &Backup, status: &BackupStatus, world: &World) -> Decision {
    let pod = status.instance.clone().unwrap_or_default();
    let lost = |message: String| Decision::Failed {
        reason: "InstanceLost",
        message,
    };
    let Some(instance) = world.instances.iter().find(|i| i.pod == pod) else {
        return lost(format!(
            "instance {pod} was deleted while taking the backup"
        ));
    };
    if status.instance_uid.as_deref() != Some(instance.uid.as_str()) {
        return lost(format!(
            "instance {pod} was replaced (a new pod) while taking the backup"
        ));
    }
    match fresh(instance) {
        Some(true) => {}
        // Its reports may be arriving unseen: judged once the watch is back.
        None => return Decision::Running,
        Some(false) => {
            return lost(format!(
                "instance {pod} has not reported for more than {} seconds",
                SILENT_INSTANCE.as_secs()
            ));
        }
    }
    let uid = backup.uid().unwrap_or_default();
    let report = instance
        .observed
        .as_ref()
        .and_then(|o| o.backup.as_ref())
        .filter(|b| b.uid == uid);
    match report {
        Some(done) if done.phase == BackupProgressPhase::Completed => {
            Decision::Completed(done.clone())
        }
        Some(failed) if failed.phase == BackupProgressPhase::Failed => Decision::Failed {
            reason: "BackupFailed",
            message: failed
                .error
                .clone()
                .unwrap_or_else(|| "the instance reported a failure".into()),
        },
        _ => Decision::Running,
    }
}

/// The deadline in seconds, if it has passed.
fn past_deadline(backup: &Backup, now: Timestamp) -> Option<u64> {
    let created = backup.metadata.creation_timestamp.as_ref()?.0;
    let seconds = deadline(backup).as_secs();
    (now.duration_since(created).as_secs() >= seconds as i64).then_some(seconds)
}

pub fn deadline(backup: &Backup) -> Duration {
    backup
        .spec
        .deadline_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(DEFAULT_DEADLINE, Duration::from_secs)
}

/// The status after `decision`, from the current one. `None` when the
/// decision changes nothing it owns.
pub fn status(backup: &Backup, decision: &Decision, now: Timestamp) -> Option<BackupStatus> {
    let mut status = backup.status.clone().unwrap_or_default();
    let generation = backup.metadata.generation;
    let ready = |status: &mut BackupStatus, ok: bool, reason: &str, message: String| {
        let condition = conditions::new("Ready", ok, reason, message, generation, Time(now));
        conditions::set(&mut status.conditions, condition);
    };
    match decision {
        Decision::Final | Decision::Running => return None,
        Decision::Wait { reason, message } => {
            status.phase = Some(BackupPhase::Pending);
            ready(&mut status, false, reason, message.clone());
        }
        Decision::Assign { pod, uid } => {
            status.phase = Some(BackupPhase::Running);
            status.instance = Some(pod.clone());
            status.instance_uid = Some(uid.clone());
            status.started_at = Some(Time(now));
            ready(
                &mut status,
                false,
                "Running",
                format!("instance {pod} is taking the backup"),
            );
        }
        Decision::Completed(report) => {
            status.phase = Some(BackupPhase::Completed);
            status.completed_at = Some(Time(now));
            status.backup_id = Some(report.id.clone());
            status.location = report.location.clone();
            status.timeline = report.timeline.map(i64::from);
            status.begin_lsn = report.begin_lsn.clone();
            status.end_lsn = report.end_lsn.clone();
            status.size_bytes = i64::try_from(report.stored_bytes).ok();
            status.duration_seconds = report.duration_milliseconds.map(|ms| ms as f64 / 1000.0);
            ready(
                &mut status,
                true,
                "Completed",
                "the backup and its manifest are stored".into(),
            );
        }
        Decision::Failed { reason, message } => {
            status.phase = Some(BackupPhase::Failed);
            status.completed_at = Some(Time(now));
            status.error = Some(message.clone());
            ready(&mut status, false, reason, message.clone());
        }
    }
    status.observed_generation = generation;
    (Some(&status) != backup.status.as_ref()).then_some(status)
}

/// When to look again: never once final; on the poll beat while pending or
/// running, and no later than the deadline.
pub fn recheck(backup: &Backup, decision: &Decision, now: Timestamp) -> Option<Duration> {
    match decision {
        Decision::Final | Decision::Completed(_) | Decision::Failed { .. } => None,
        _ => {
            let left = backup.metadata.creation_timestamp.as_ref().map(|created| {
                let elapsed = now.duration_since(created.0).as_secs().max(0) as u64;
                deadline(backup).saturating_sub(Duration::from_secs(elapsed))
            });
            Some(left.map_or(POLL, |left| left.clamp(Duration::from_secs(1), POLL)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: &str = "2026-11-26T03:00:00Z";
    const LOCATION: &str = "s3://backups/orders/";

    fn now() -> Timestamp {
        NOW.parse().expect("time")
    }

    fn backup(status: serde_json::Value) -> Backup {
        serde_json::from_value(json!({
            "apiVersion": "backup.cairn.dev/v1", "kind": "Backup",
            "metadata": { "name": "nightly", "uid": "u-1", "generation": 1,
                          "creationTimestamp": "2026-11-26T02:59:00Z" },
            "spec": { "cluster": { "name": "orders" }, "method": "physical", "deadlineSeconds": 600 },
            "status": status,
        }))
        .expect("backup")
    }

    fn cluster() -> DatabaseCluster {
        serde_json::from_value(json!({
            "apiVersion": "database.cairn.dev/v1", "kind": "DatabaseCluster",
            "metadata": { "name": "orders" },
            "spec": { "instances": 3, "postgres": { "version": "17" }, "storage": { "size": "1Gi" },
                      "backup": { "destination": { "s3": { "bucket": "backups", "credentialsSecret": { "name": "s3" } } } } },
        }))
        .expect("cluster")
    }

    fn instance(pod: &str, role: &str, position: &str) -> Instance {
        Instance {
            pod: pod.into(),
            uid: format!("uid-{pod}"),
            observed: Some(ObservedState {
                ready: true,
                role: Some(role.into()),
                wal_position: Some(position.into()),
                backup_destination: Some(LOCATION.into()),
                ..ObservedState::default()
            }),
            silent: Some(Duration::from_secs(1)),
            beat_seen: true,
        }
    }

    fn world(cluster: &DatabaseCluster, instances: Vec<Instance>) -> World {
        World {
            cluster: Some(Arc::new(cluster.clone())),
            instances,
            running: Vec::new(),
            now: now(),
        }
    }

    #[test]
    fn the_most_advanced_ready_standby_takes_it_else_the_primary() {
        let cluster = cluster();
        let pending = backup(json!({}));
        let instances = vec![
            instance("orders-0", "primary", "0/5000000"),
            instance("orders-1", "replica", "0/4000000"),
            instance("orders-2", "replica", "0/4800000"),
        ];
        assert_eq!(
            decide(&pending, &world(&cluster, instances.clone())),
            Decision::Assign {
                pod: "orders-2".into(),
                uid: "uid-orders-2".into()
            }
        );
        let mut lagging = instances.clone();
        for standby in &mut lagging[1..] {
            standby.observed.as_mut().expect("observed").ready = false;
        }
        assert_eq!(
            decide(&pending, &world(&cluster, lagging)),
            Decision::Assign {
                pod: "orders-0".into(),
                uid: "uid-orders-0".into()
            }
        );
        // An instance still on another destination, or silent, is passed over.
        let mut other = instances.clone();
        other[2]
            .observed
            .as_mut()
            .expect("observed")
            .backup_destination = Some("s3://old/orders/".into());
        other[1].silent = Some(Duration::from_secs(60));
        assert_eq!(
            decide(&pending, &world(&cluster, other.clone())),
            Decision::Assign {
                pod: "orders-0".into(),
                uid: "uid-orders-0".into()
            }
        );
        // Nor one whose renewal this process never saw change (a Lease left
        // by a dead instance looks fresh to a controller that just started),
        // nor one while the Lease watch is blind.
        for unknown in [
            Instance {
                beat_seen: false,
                ..instances[2].clone()
            },
            Instance {
                silent: None,
                ..instances[2].clone()
            },
        ] {
            let mut seen = instances.clone();
            seen[2] = unknown;
            assert_eq!(
                decide(&pending, &world(&cluster, seen)),
                Decision::Assign {
                    pod: "orders-1".into(),
                    uid: "uid-orders-1".into()
                }
            );
        }
    }

    #[test]
    fn a_backup_waits_with_a_reason_and_one_runs_per_cluster() {
        let cluster = cluster();
        let pending = backup(json!({}));
        let mut busy = world(&cluster, vec![instance("orders-1", "replica", "0/1")]);
        busy.running = vec!["hourly".into()];
        assert!(matches!(
            decide(&pending, &busy),
            Decision::Wait {
                reason: "AnotherBackupRunning",
                ..
            }
        ));
        assert!(matches!(
            decide(&pending, &world(&cluster, vec![])),
            Decision::Wait {
                reason: "NoInstanceReady",
                ..
            }
        ));
        let none = World {
            cluster: None,
            instances: vec![],
            running: vec![],
            now: now(),
        };
        assert!(matches!(
            decide(&pending, &none),
            Decision::Wait {
                reason: "ClusterNotFound",
                ..
            }
        ));
    }

    fn running() -> Backup {
        backup(
            json!({ "phase": "Running", "instance": "orders-1", "instanceUid": "uid-orders-1", "startedAt": "2026-11-26T02:59:30Z" }),
        )
    }

    fn reporting(phase: BackupProgressPhase) -> Instance {
        let mut standby = instance("orders-1", "replica", "0/1");
        standby.observed.as_mut().expect("observed").backup = Some(BackupProgress {
            name: "nightly".into(),
            uid: "u-1".into(),
            phase,
            id: "nightly-u1".into(),
            stored_bytes: 4096,
            error: Some("pg_basebackup failed".into()),
            ..BackupProgress::default()
        });
        standby
    }

    #[test]
    fn a_running_backup_ends_as_its_instance_reports_or_fails_when_the_instance_is_lost() {
        let cluster = cluster();
        let backup = running();
        assert_eq!(
            decide(
                &backup,
                &world(&cluster, vec![reporting(BackupProgressPhase::Running)])
            ),
            Decision::Running
        );
        assert!(matches!(
            decide(&backup, &world(&cluster, vec![reporting(BackupProgressPhase::Completed)])),
            Decision::Completed(report) if report.stored_bytes == 4096
        ));
        assert!(matches!(
            decide(&backup, &world(&cluster, vec![reporting(BackupProgressPhase::Failed)])),
            Decision::Failed { reason: "BackupFailed", message } if message == "pg_basebackup failed"
        ));
        // A report of another Backup (same name, an earlier uid) is not this one's.
        let mut earlier = reporting(BackupProgressPhase::Completed);
        earlier
            .observed
            .as_mut()
            .expect("observed")
            .backup
            .as_mut()
            .expect("backup")
            .uid = "u-0".into();
        assert_eq!(
            decide(&backup, &world(&cluster, vec![earlier])),
            Decision::Running
        );
        let mut replaced = reporting(BackupProgressPhase::Running);
        replaced.uid = "uid-new".into();
        for (instances, what) in [(vec![], "deleted"), (vec![replaced], "replaced")] {
            assert!(matches!(
                decide(&backup, &world(&cluster, instances)),
                Decision::Failed { reason: "InstanceLost", message } if message.contains(what)
            ));
        }
        let mut silent = reporting(BackupProgressPhase::Running);
        silent.silent = Some(Duration::from_secs(31));
        assert!(matches!(
            decide(&backup, &world(&cluster, vec![silent.clone()])),
            Decision::Failed {
                reason: "InstanceLost",
                ..
            }
        ));
        // While the Lease watch is blind its reports may be arriving
        // unseen: not lost, judged once the watch delivers again.
        silent.silent = None;
        assert_eq!(
            decide(&backup, &world(&cluster, vec![silent])),
            Decision::Running
        );
    }

    #[test]
    fn past_its_deadline_a_backup_fails_unless_its_instance_finished() {
        let cluster = cluster();
        let backup = running();
        let mut late = world(&cluster, vec![reporting(BackupProgressPhase::Running)]);
        late.now = "2026-11-26T03:09:00Z".parse().expect("time");
        assert!(matches!(
            decide(&backup, &late),
            Decision::Failed {
                reason: "DeadlineExceeded",
                ..
            }
        ));
        late.instances = vec![reporting(BackupProgressPhase::Completed)];
        assert!(matches!(decide(&backup, &late), Decision::Completed(_)));
        assert_eq!(recheck(&backup, &Decision::Running, now()), Some(POLL));
        let near: Timestamp = "2026-11-26T03:08:58Z".parse().expect("time");
        assert_eq!(
            recheck(&backup, &Decision::Running, near),
            Some(Duration::from_secs(2))
        );
    }

    #[test]
    fn statuses_are_final_once_written_and_unchanged_decisions_write_nothing() {
        let cluster = cluster();
        let pending = backup(json!({}));
        let decision = decide(
            &pending,
            &world(&cluster, vec![instance("orders-1", "replica", "0/1")]),
        );
        let assigned = status(&pending, &decision, now()).expect("a change");
        assert_eq!(assigned.phase, Some(BackupPhase::Running));
        assert_eq!(assigned.instance.as_deref(), Some("orders-1"));
        assert_eq!(assigned.instance_uid.as_deref(), Some("uid-orders-1"));
        let mut done = pending.clone();
        done.status = Some(assigned);
        assert_eq!(status(&done, &Decision::Running, now()), None);
        let completed = status(
            &done,
            &Decision::Completed(
                reporting(BackupProgressPhase::Completed)
                    .observed
                    .expect("o")
                    .backup
                    .expect("b"),
            ),
            now(),
        )
        .expect("a change");
        assert_eq!(completed.phase, Some(BackupPhase::Completed));
        assert_eq!(completed.size_bytes, Some(4096));
        assert!(conditions::is_true(&completed.conditions, "Ready"));
        done.status = Some(completed);
        assert_eq!(decide(&done, &world(&cluster, vec![])), Decision::Final);
        let waiting = Decision::Wait {
            reason: "NoInstanceReady",
            message: "none".into(),
        };
        let once = status(&pending, &waiting, now()).expect("a change");
        let mut again = pending.clone();
        again.status = Some(once);
        assert_eq!(
            status(&again, &waiting, now()),
            None,
            "the same wait writes nothing"
        );
    }
}
