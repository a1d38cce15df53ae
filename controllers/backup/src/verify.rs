//! Restore verification of a completed Backup (`spec.verification`),
//! decided without I/O: a throw-away pod runs `cairn-instance` in its
//! verifying mode with the cluster's image, configuration and credentials,
//! restores the backup into an emptyDir, checks it, and reports in its
//! termination message; the outcome goes into the `Verified` condition and
//! `status.verification`, then the pod is deleted. The pod has no
//! Kubernetes credentials, and the instance archives nothing in that mode.
//! A verification runs once per Backup; its outcome is final.

use std::time::Duration;

use cairn_api::backup::v1::{
    Backup, BackupMethod, BackupPhase, BackupStatus, S3Destination, VERIFIED, Verification,
    VerificationStatus,
};
use cairn_api::common::Time;
use cairn_api::database::instance::{self as contract, VerificationReport};
use cairn_api::database::pod as instance_pod;
use cairn_api::database::v1::DatabaseCluster;
use cairn_runtime::{conditions, labels};
use k8s_openapi::api::core::v1::{Container, EmptyDirVolumeSource, EnvVar, Pod, PodSpec, Volume};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};

/// `app.kubernetes.io/name` of verification pods (what the controller
/// caches of pods besides the database instances).
pub const APP_NAME: &str = "cairn-backup-verification";
/// A verification not finished this long after it started fails.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(3600);
/// Beyond the pod's own deadline (enforced by the kubelet once it runs),
/// for a pod that never starts.
const GRACE: Duration = Duration::from_secs(60);

/// What the verification of a Backup needs now.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Not asked, not completed yet, or decided and cleaned up.
    Idle,
    /// Create this pod.
    Start(Box<Pod>),
    /// The pod is at it.
    Wait,
    /// Record this outcome, then delete the pod.
    Record(Outcome),
    /// The outcome is recorded: delete the pod left.
    Clean,
    /// `spec.verification` was removed before an outcome: the pod goes and
    /// the verification in progress is forgotten.
    Withdraw,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub verified: bool,
    pub reason: String,
    pub message: String,
    pub restored_lsn: Option<String>,
    pub seconds: Option<f64>,
}

impl Outcome {
    fn failed(reason: &str, message: String) -> Self {
        Self {
            verified: false,
            reason: reason.to_owned(),
            message,
            restored_lsn: None,
            seconds: None,
        }
    }
}

/// The name of a Backup's verification pod.
pub fn pod_name(backup: &Backup) -> String {
    format!("{}-verify", backup.name_any())
}

/// Decides from the Backup, its cluster and its verification pod.
pub fn plan(
    backup: &Backup,
    cluster: Option<&DatabaseCluster>,
    pod: Option<&Pod>,
    now: Timestamp,
) -> Step {
    let status = backup.status.clone().unwrap_or_default();
    let condition = conditions::find(&status.conditions, VERIFIED);
    let decided = condition.is_some_and(|c| c.status != "Unknown");
    let Some(verification) = &backup.spec.verification else {
        return match (condition.is_some() && !decided, pod.is_some()) {
            (true, _) => Step::Withdraw,
            (false, true) => Step::Clean,
            (false, false) => Step::Idle,
        };
    };
    if decided {
        return if pod.is_some() {
            Step::Clean
        } else {
            Step::Idle
        };
    }
    if status.phase != Some(BackupPhase::Completed) {
        return Step::Idle;
    }
    let started = status
        .verification
        .as_ref()
        .and_then(|v| v.started_at.as_ref());
    let late = started.is_some_and(|at| {
        now.duration_since(at.0).as_secs() > (deadline(verification) + GRACE).as_secs() as i64
    });
    match pod {
        Some(pod) if !owned_by(pod, backup) => Step::Record(Outcome::failed(
            "PodNameTaken",
            format!("pod {} exists and is not this Backup's", pod.name_any()),
        )),
        Some(pod) => match finished(pod) {
            Some(outcome) => Step::Record(outcome),
            None if late => Step::Record(Outcome::failed(
                "DeadlineExceeded",
                format!(
                    "not verified within {} seconds (pod {} still {})",
                    deadline(verification).as_secs(),
                    pod.name_any(),
                    pod.status
                        .as_ref()
                        .and_then(|s| s.phase.clone())
                        .unwrap_or_default()
                ),
            )),
            None => Step::Wait,
        },
        None if late => Step::Record(Outcome::failed(
            "DeadlineExceeded",
            format!(
                "not verified within {} seconds",
                deadline(verification).as_secs()
            ),
        )),
        None => match build(backup, cluster, verification) {
            Ok(pod) => Step::Start(Box::new(pod)),
            Err(outcome) => Step::Record(outcome),
        },
    }
}

fn deadline(verification: &Verification) -> Duration {
    verification
        .deadline_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(DEFAULT_DEADLINE, Duration::from_secs)
}

/// Whether `pod` is `backup`'s (its owner reference's uid).
pub fn owned_by(pod: &Pod, backup: &Backup) -> bool {
    pod.owner_references()
        .iter()
        .any(|owner| Some(&owner.uid) == backup.meta().uid.as_ref())
}

/// The outcome of a pod that has ended: its report, or why there is none.
fn finished(pod: &Pod) -> Option<Outcome> {
    let status = pod.status.as_ref()?;
    let phase = status.phase.as_deref()?;
    if phase != "Succeeded" && phase != "Failed" {
        return None;
    }
    // Ended by the kubelet at activeDeadlineSeconds.
    if status.reason.as_deref() == Some("DeadlineExceeded") {
        return Some(Outcome::failed(
            "DeadlineExceeded",
            format!(
                "pod {} was stopped at its deadline before it reported",
                pod.name_any()
            ),
        ));
    }
    let terminated = status
        .container_statuses
        .iter()
        .flatten()
        .find_map(|c| c.state.as_ref()?.terminated.as_ref());
    let message = terminated.and_then(|t| t.message.as_deref()).unwrap_or("");
    if let Ok(report) = serde_json::from_str::<VerificationReport>(message) {
        return Some(Outcome {
            verified: report.verified,
            reason: report.reason,
            message: report.message,
            restored_lsn: report.restored_lsn,
            seconds: Some(report.seconds),
        });
    }
    let why = terminated
        .map(|t| {
            format!(
                "{} (exit {})",
                t.reason.as_deref().unwrap_or("terminated"),
                t.exit_code
            )
        })
        .or_else(|| status.reason.clone())
        .unwrap_or_else(|| phase.to_owned());
    let tail = message.trim();
    Some(Outcome::failed(
        "PodFailed",
        format!(
            "pod {} ended without a report: {why}{}",
            pod.name_any(),
            if tail.is_empty() {
                String::new()
            } else {
                format!("; its log ends: {}", last_chars(tail, 600))
            }
        ),
    ))
}

fn last_chars(text: &str, n: usize) -> &str {
    let start = text
        .char_indices()
        .rev()
        .nth(n.saturating_sub(1))
        .map_or(0, |(i, _)| i);
    &text[start..]
}

/// The verification pod, or why there can be none.
pub fn build(
    backup: &Backup,
    cluster: Option<&DatabaseCluster>,
    verification: &Verification,
) -> Result<Pod, Outcome> {
    let Some(cluster) = cluster else {
        return Err(Outcome::failed(
            "ClusterNotFound",
            format!(
                "DatabaseCluster {:?} is gone: a verification runs with its image, configuration \
                 and credentials",
                backup.spec.cluster.name
            ),
        ));
    };
    let Some(s3) = crate::artifact::destination(&backup.spec, Some(cluster)) else {
        return Err(Outcome::failed(
            "NoDestination",
            "neither the Backup nor its cluster has an S3 destination".into(),
        ));
    };
    let Some(id) = backup.status.as_ref().and_then(|s| s.backup_id.clone()) else {
        return Err(Outcome::failed(
            "NoBackupId",
            "the completed Backup records no backup id".into(),
        ));
    };
    let scheduling = cluster.spec.scheduling.clone().unwrap_or_default();
    let spec = PodSpec {
        restart_policy: Some("Never".to_owned()),
        // The kubelet ends it at the deadline.
        active_deadline_seconds: i64::try_from(deadline(verification).as_secs()).ok(),
        // It needs nothing of the API.
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        termination_grace_period_seconds: Some(30),
        security_context: Some(instance_pod::pod_security_context()),
        containers: vec![container(backup, cluster, s3, &id, verification)],
        volumes: Some(
            std::iter::once(Volume {
                name: "data".to_owned(),
                // No larger than the cluster's own volume: a backup that
                // outgrows it is evicted, not the node's disk filled.
                empty_dir: Some(EmptyDirVolumeSource {
                    size_limit: Some(Quantity(cluster.spec.storage.size.clone())),
                    ..EmptyDirVolumeSource::default()
                }),
                ..Volume::default()
            })
            .chain(instance_pod::volumes(cluster, Some(s3)))
            .collect(),
        ),
        node_selector: (!scheduling.node_selector.is_empty()).then_some(scheduling.node_selector),
        affinity: scheduling.affinity,
        tolerations: (!scheduling.tolerations.is_empty()).then_some(scheduling.tolerations),
        priority_class_name: scheduling.priority_class_name,
        ..PodSpec::default()
    };
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(backup)),
            namespace: backup.namespace(),
            labels: Some(labels::standard(
                APP_NAME,
                &backup.spec.cluster.name,
                "verification",
            )),
            owner_references: Some(vec![OwnerReference {
                api_version: Backup::api_version(&()).into_owned(),
                kind: Backup::kind(&()).into_owned(),
                name: backup.name_any(),
                uid: backup.uid().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    })
}

fn container(
    backup: &Backup,
    cluster: &DatabaseCluster,
    s3: &S3Destination,
    id: &str,
    verification: &Verification,
) -> Container {
    let logical = backup.spec.method == BackupMethod::Logical;
    let env: Vec<EnvVar> = instance_pod::env([
        ("PGDATA", Some(contract::PGDATA.to_owned())),
        (contract::VERIFY_ENV, Some("true".to_owned())),
        (contract::VERIFY_SQL_ENV, verification.sql.clone()),
        (
            "CAIRN_RESTORE_CLUSTER",
            Some(backup.spec.cluster.name.clone()),
        ),
        ("CAIRN_RESTORE_BACKUP_ID", Some(id.to_owned())),
        (
            "CAIRN_RESTORE_TARGET_END_OF_BACKUP",
            (!logical).then(|| "true".to_owned()),
        ),
        ("CAIRN_RESTORE_LOGICAL", logical.then(|| "true".to_owned())),
    ])
    .into_iter()
    .chain(instance_pod::destination_env(s3))
    .collect();
    Container {
        name: "verify".to_owned(),
        image: Some(instance_pod::image(cluster)),
        command: Some(vec!["cairn-instance".to_owned()]),
        env: Some(env),
        resources: verification
            .resources
            .clone()
            .or_else(|| cluster.spec.resources.clone()),
        security_context: Some(instance_pod::container_security_context()),
        volume_mounts: Some(instance_pod::mounts(true)),
        termination_message_path: Some(contract::VERIFY_REPORT_PATH.to_owned()),
        // A crash before the report still says something.
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        ..Container::default()
    }
}

/// The status after `step`, from the current one; `None` when it changes
/// nothing.
pub fn status(backup: &Backup, step: &Step, now: Timestamp) -> Option<BackupStatus> {
    let mut status = backup.status.clone().unwrap_or_default();
    let generation = backup.metadata.generation;
    match step {
        Step::Idle | Step::Wait | Step::Clean => return None,
        Step::Withdraw => {
            status.conditions.retain(|c| c.type_ != VERIFIED);
            status.verification = None;
        }
        Step::Start(pod) => {
            // Started now unless this pod's start is recorded already.
            let verification = status.verification.get_or_insert_with(Default::default);
            if verification.pod != pod.metadata.name || verification.started_at.is_none() {
                verification.pod = pod.metadata.name.clone();
                verification.started_at = Some(Time(now));
            }
            let mut condition = conditions::new(
                VERIFIED,
                false,
                "Verifying",
                format!("pod {} restores the backup and checks it", pod.name_any()),
                generation,
                Time(now),
            );
            condition.status = "Unknown".to_owned();
            conditions::set(&mut status.conditions, condition);
        }
        Step::Record(outcome) => {
            let verification = status.verification.get_or_insert_with(Default::default);
            verification.completed_at = Some(Time(now));
            verification.restored_lsn = outcome.restored_lsn.clone();
            verification.duration_seconds = outcome.seconds;
            verification.message = Some(outcome.message.clone());
            let condition = conditions::new(
                VERIFIED,
                outcome.verified,
                &outcome.reason,
                outcome.message.clone(),
                generation,
                Time(now),
            );
            conditions::set(&mut status.conditions, condition);
        }
    }
    (Some(&status) != backup.status.as_ref()).then_some(status)
}

/// The verification recorded, for an Event.
pub fn summary(status: &VerificationStatus) -> String {
    match (&status.restored_lsn, status.duration_seconds) {
        (Some(lsn), Some(seconds)) => format!(
            "{} (restored to {lsn} in {seconds:.1} s)",
            status.message.as_deref().unwrap_or("")
        ),
        _ => status.message.clone().unwrap_or_default(),
    }
}

/// When to look again: the pod's changes wake the Backup; this is the
/// backstop for a pod that never starts.
pub fn recheck(backup: &Backup, step: &Step) -> Option<Duration> {
    match step {
        Step::Start(_) | Step::Wait => backup
            .spec
            .verification
            .as_ref()
            .map(|v| deadline(v) + GRACE),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: &str = "2026-11-26T09:00:00Z";

    fn now() -> Timestamp {
        NOW.parse().expect("time")
    }

    fn backup(method: &str, status: serde_json::Value) -> Backup {
        serde_json::from_value(json!({
            "apiVersion": "backup.cairn.dev/v1", "kind": "Backup",
            "metadata": { "name": "nightly", "namespace": "shop", "uid": "u-1", "generation": 1 },
            "spec": {
                "cluster": { "name": "orders" }, "method": method,
                "verification": { "sql": "SELECT count(*) > 0 FROM orders", "deadlineSeconds": 600 },
            },
            "status": status,
        }))
        .expect("backup")
    }

    fn completed() -> serde_json::Value {
        json!({ "phase": "Completed", "backupId": "nightly-u-1" })
    }

    fn cluster() -> DatabaseCluster {
        serde_json::from_value(json!({
            "apiVersion": "database.cairn.dev/v1", "kind": "DatabaseCluster",
            "metadata": { "name": "orders", "namespace": "shop" },
            "spec": {
                "instances": 2, "postgres": { "version": "16" }, "storage": { "size": "1Gi" },
                "scheduling": { "nodeSelector": { "cairn.dev/real": "true" } },
                "backup": { "destination": { "s3": {
                    "bucket": "backups", "endpoint": "http://moto:5000",
                    "credentialsSecret": { "name": "s3" },
                } } },
            },
        }))
        .expect("cluster")
    }

    fn pod_with(phase: &str, message: Option<&str>) -> Pod {
        serde_json::from_value(json!({
            "metadata": { "name": "nightly-verify", "ownerReferences": [{
                "apiVersion": "backup.cairn.dev/v1", "kind": "Backup", "name": "nightly", "uid": "u-1",
            }] },
            "status": { "phase": phase, "containerStatuses": [{
                "name": "verify", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": message.map_or(json!({ "running": {} }), |m| json!({
                    "terminated": { "exitCode": 1, "reason": "Error", "message": m },
                })),
            }] },
        }))
        .expect("pod")
    }

    #[test]
    fn a_completed_backup_gets_a_throw_away_pod_without_credentials_that_archives_nothing() {
        let cluster = cluster();
        let Step::Start(pod) = plan(
            &backup("physical", completed()),
            Some(&cluster),
            None,
            now(),
        ) else {
            panic!("expected a pod");
        };
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(pod.name_any(), "nightly-verify");
        assert_eq!(pod.owner_references()[0].uid, "u-1");
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(spec.active_deadline_seconds, Some(600));
        assert_eq!(
            spec.node_selector
                .as_ref()
                .and_then(|s| s.get("cairn.dev/real"))
                .map(String::as_str),
            Some("true")
        );
        let container = &spec.containers[0];
        assert_eq!(
            container.image.as_deref(),
            Some("ghcr.io/cairn-dev/postgres:16")
        );
        let env: std::collections::BTreeMap<_, _> = container
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.as_str(), e.value.as_deref().unwrap_or("")))
            .collect();
        assert_eq!(env["CAIRN_VERIFY"], "true");
        assert_eq!(env["CAIRN_RESTORE_CLUSTER"], "orders");
        assert_eq!(env["CAIRN_RESTORE_BACKUP_ID"], "nightly-u-1");
        assert_eq!(env["CAIRN_RESTORE_TARGET_END_OF_BACKUP"], "true");
        assert_eq!(env["CAIRN_BACKUP_BUCKET"], "backups");
        assert_eq!(env["CAIRN_VERIFY_SQL"], "SELECT count(*) > 0 FROM orders");
        // Never told to archive: no cluster of its own, so nothing to write to.
        assert!(!env.contains_key("CAIRN_CLUSTER"), "{env:?}");
        let volumes: Vec<_> = spec
            .volumes
            .iter()
            .flatten()
            .map(|v| v.name.as_str())
            .collect();
        assert!(volumes.contains(&"data") && volumes.contains(&"backup-credentials"));
        let data = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == "data")
            .expect("data");
        let limit = data.empty_dir.as_ref().and_then(|e| e.size_limit.clone());
        assert_eq!(
            limit,
            Some(Quantity("1Gi".into())),
            "no larger than the cluster's volume"
        );
        let restricted = container.security_context.as_ref().expect("security");
        assert_eq!(restricted.allow_privilege_escalation, Some(false));

        let logical = backup("logical", completed());
        let Step::Start(pod) = plan(&logical, Some(&cluster), None, now()) else {
            panic!("expected a pod");
        };
        let env = pod.spec.as_ref().expect("spec").containers[0]
            .env
            .clone()
            .unwrap_or_default();
        assert!(env.iter().any(|e| e.name == "CAIRN_RESTORE_LOGICAL"));
        assert!(
            !env.iter()
                .any(|e| e.name == "CAIRN_RESTORE_TARGET_END_OF_BACKUP")
        );
    }

    #[test]
    fn a_verification_withdrawn_midway_is_forgotten_and_its_pod_deleted() {
        let cluster = cluster();
        let mut backup = backup("physical", completed());
        let started = plan(&backup, Some(&cluster), None, now());
        backup.status = status(&backup, &started, now());
        backup.spec.verification = None;
        let running = pod_with("Running", None);
        let step = plan(&backup, Some(&cluster), Some(&running), now());
        assert_eq!(step, Step::Withdraw);
        let after = status(&backup, &step, now()).expect("a change");
        assert!(conditions::find(&after.conditions, VERIFIED).is_none());
        assert_eq!(after.verification, None);
    }

    #[test]
    fn nothing_before_completion_nor_without_the_opt_in() {
        let cluster = cluster();
        let running = backup("physical", json!({ "phase": "Running" }));
        assert_eq!(plan(&running, Some(&cluster), None, now()), Step::Idle);
        let mut plain = backup("physical", completed());
        plain.spec.verification = None;
        assert_eq!(plan(&plain, Some(&cluster), None, now()), Step::Idle);
        let stray = pod_with("Running", None);
        assert_eq!(
            plan(&plain, Some(&cluster), Some(&stray), now()),
            Step::Clean
        );
    }

    #[test]
    fn the_report_decides_and_is_recorded_once() {
        let cluster = cluster();
        let mut backup = backup("physical", completed());
        let started = plan(&backup, Some(&cluster), None, now());
        backup.status = status(&backup, &started, now());
        let verifying = conditions::find(
            &backup.status.as_ref().expect("status").conditions,
            VERIFIED,
        )
        .expect("condition");
        assert_eq!(
            (verifying.status.as_str(), verifying.reason.as_str()),
            ("Unknown", "Verifying")
        );
        let running = pod_with("Running", None);
        assert_eq!(
            plan(&backup, Some(&cluster), Some(&running), now()),
            Step::Wait
        );

        let report = r#"{"verified":true,"reason":"Verified","message":"read 3 tables","restoredLsn":"0/3000060","seconds":2.5}"#;
        let done = pod_with("Succeeded", Some(report));
        let step = plan(&backup, Some(&cluster), Some(&done), now());
        let Step::Record(outcome) = &step else {
            panic!("expected an outcome: {step:?}");
        };
        assert!(outcome.verified);
        backup.status = status(&backup, &step, now());
        let recorded = backup.status.as_ref().expect("status");
        assert!(conditions::is_true(&recorded.conditions, VERIFIED));
        let verification = recorded.verification.as_ref().expect("verification");
        assert_eq!(verification.restored_lsn.as_deref(), Some("0/3000060"));
        assert_eq!(verification.duration_seconds, Some(2.5));
        // Recorded: the pod goes, and nothing runs again.
        assert_eq!(
            plan(&backup, Some(&cluster), Some(&done), now()),
            Step::Clean
        );
        assert_eq!(plan(&backup, Some(&cluster), None, now()), Step::Idle);
    }

    #[test]
    fn failures_say_why() {
        let cluster = cluster();
        let backup = backup("physical", completed());
        let report = r#"{"verified":false,"reason":"RestoreFailed","message":"data.tar.zst is damaged","seconds":4.0}"#;
        let failed = pod_with("Failed", Some(report));
        let Step::Record(outcome) = plan(&backup, Some(&cluster), Some(&failed), now()) else {
            panic!("expected an outcome");
        };
        assert_eq!(
            (outcome.verified, outcome.reason.as_str()),
            (false, "RestoreFailed")
        );

        let mut stopped = pod_with("Failed", Some("killed"));
        stopped.status.as_mut().expect("status").reason = Some("DeadlineExceeded".into());
        let Step::Record(outcome) = plan(&backup, Some(&cluster), Some(&stopped), now()) else {
            panic!("expected an outcome");
        };
        assert_eq!(outcome.reason, "DeadlineExceeded");

        let crashed = pod_with("Failed", Some("panic: out of memory"));
        let Step::Record(outcome) = plan(&backup, Some(&cluster), Some(&crashed), now()) else {
            panic!("expected an outcome");
        };
        assert_eq!(outcome.reason, "PodFailed");
        assert!(
            outcome.message.contains("out of memory"),
            "{}",
            outcome.message
        );

        let Step::Record(outcome) = plan(&backup, None, None, now()) else {
            panic!("expected an outcome");
        };
        assert_eq!(outcome.reason, "ClusterNotFound");

        // Started long ago, the pod still pending: past the deadline.
        let mut stuck = backup.clone();
        stuck.status.as_mut().expect("status").verification = Some(VerificationStatus {
            started_at: Some(Time("2026-11-26T08:40:00Z".parse().expect("time"))),
            ..VerificationStatus::default()
        });
        let pending = pod_with("Pending", None);
        let Step::Record(outcome) = plan(&stuck, Some(&cluster), Some(&pending), now()) else {
            panic!("expected an outcome");
        };
        assert_eq!(outcome.reason, "DeadlineExceeded");
    }
}
