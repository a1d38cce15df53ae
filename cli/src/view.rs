//! `status`: a DatabaseCluster's facts gathered from its status, its pods,
//! their membership Leases (what each instance reports of its server), its
//! Backups and BackupSchedules. Pure, so every fact shown is unit-tested.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use cairn_api::backup::v1::{Backup, BackupMethod, BackupSchedule, VERIFIED};
use cairn_api::database::instance::{OBSERVED_ANNOTATION, ObservedState, ROLE_LABEL, parse_lsn};
use cairn_api::database::v1::{DatabaseCluster, Endpoints, FailoverRecord, SwitchoverRecord};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde::{Deserialize, Serialize};

/// The condition the database controller reports WAL archiving in.
pub const CONTINUOUS_ARCHIVING: &str = "ContinuousArchiving";
/// The condition a BackupSchedule reports its health in.
pub const BACKUPS_HEALTHY: &str = "BackupsHealthy";

/// `kubectl cairn status -o json|yaml`: one document, stable field names.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterView {
    pub name: String,
    pub namespace: String,
    /// The status's phase; none before the controller first wrote it.
    pub phase: Option<String>,
    pub paused: bool,
    /// `spec.instances`.
    pub desired_instances: i32,
    /// `status.readyInstances`.
    pub ready_instances: i32,
    /// `status.currentPrimary`.
    pub current_primary: Option<String>,
    pub postgres_version: Option<String>,
    pub endpoints: Option<Endpoints>,
    pub credentials_secret: Option<String>,
    /// `status.conditions`, in the status's order.
    pub conditions: Vec<ConditionView>,
    /// Every instance pod (and any membership Lease without its pod), by ordinal.
    pub instances: Vec<InstanceView>,
    pub last_switchover: Option<SwitchoverRecord>,
    pub last_failover: Option<FailoverRecord>,
    /// With `spec.backup`: the `ContinuousArchiving` condition and the primary's report.
    pub archiving: Option<ArchivingView>,
    /// The newest Backup of this cluster (by creation).
    pub last_backup: Option<BackupView>,
    pub backups: usize,
    /// The BackupSchedules of this cluster.
    pub schedules: Vec<ScheduleView>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConditionView {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
    pub last_transition_time: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct InstanceView {
    pub pod: String,
    /// The role the controller assigned (the pod's `database.cairn.dev/role`).
    pub role: Option<String>,
    /// The role the server itself reports (its Lease).
    pub server_role: Option<String>,
    /// The pod's Ready condition.
    pub ready: bool,
    pub node: Option<String>,
    /// The pod's phase; none when only its Lease exists.
    pub pod_phase: Option<String>,
    pub restarts: i32,
    pub timeline: Option<u32>,
    /// Current WAL position (primary) or last replayed (replica).
    pub wal_position: Option<String>,
    /// A replica's last received position.
    pub received_position: Option<String>,
    /// A replica's replay lag behind the primary's position, in bytes.
    pub lag_bytes: Option<u64>,
    pub server_version: Option<String>,
    /// Why the instance does not serve in its role, as it reports.
    pub problem: Option<String>,
    /// When its Lease was last renewed (its heartbeat).
    pub last_heartbeat: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ArchivingView {
    /// The `ContinuousArchiving` condition's status, reason and message.
    pub status: Option<String>,
    pub reason: Option<String>,
    pub message: Option<String>,
    /// The primary's report: files waiting, when a file was last stored,
    /// the failing attempt's error, the first file of a gap.
    pub pending: Option<u32>,
    pub last_stored: Option<String>,
    pub failing: Option<String>,
    pub gap: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct BackupView {
    pub name: String,
    pub method: String,
    pub phase: Option<String>,
    pub created_at: Option<String>,
    pub instance: Option<String>,
    pub started_at: Option<String>,
    pub completed_at: Option<String>,
    pub size_bytes: Option<i64>,
    pub location: Option<String>,
    pub error: Option<String>,
    /// The `Verified` condition's status, when verified.
    pub verified: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleView {
    pub name: String,
    pub schedule: String,
    pub suspended: bool,
    pub last_schedule_time: Option<String>,
    pub last_successful_time: Option<String>,
    pub next_schedule_time: Option<String>,
    /// The recoverability window: from the oldest complete base backup's end…
    pub first_recoverability_point: Option<String>,
    /// …to the newest stored WAL file (as of the schedule's last look).
    pub last_recoverability_point: Option<String>,
    /// `BackupsHealthy`: status and reason.
    pub healthy: Option<String>,
    pub healthy_reason: Option<String>,
}

fn time(t: &Time) -> String {
    t.0.to_string()
}

fn debug_name<T: std::fmt::Debug>(value: &T) -> String {
    format!("{value:?}")
}

pub fn method_name(method: BackupMethod) -> &'static str {
    match method {
        BackupMethod::Physical => "physical",
        BackupMethod::Logical => "logical",
    }
}

/// The instance's report in its membership Lease.
pub fn observed(lease: &Lease) -> Option<ObservedState> {
    serde_json::from_str(lease.annotations().get(OBSERVED_ANNOTATION)?).ok()
}

pub fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The StatefulSet ordinal of pod `name` (`web-2` → 2).
pub fn ordinal(name: &str) -> u32 {
    name.rsplit_once('-')
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or(u32::MAX)
}

/// The Backups of `cluster` among `backups` (found by `spec.cluster`), oldest first.
pub fn backups_of<'a>(cluster: &DatabaseCluster, backups: &'a [Backup]) -> Vec<&'a Backup> {
    let name = cluster.name_any();
    let mut mine: Vec<&Backup> = backups
        .iter()
        .filter(|b| b.spec.cluster.name == name)
        .collect();
    mine.sort_by(|a, b| {
        (a.creation_timestamp(), a.name_any()).cmp(&(b.creation_timestamp(), b.name_any()))
    });
    mine
}

/// The instances: pods and Leases matched by name, by ordinal.
pub fn instances(cluster: &DatabaseCluster, pods: &[Pod], leases: &[Lease]) -> Vec<InstanceView> {
    let names: BTreeSet<String> = pods
        .iter()
        .map(ResourceExt::name_any)
        .chain(leases.iter().map(ResourceExt::name_any))
        .collect();
    let mut names: Vec<String> = names.into_iter().collect();
    names.sort_by_key(|n| (ordinal(n), n.clone()));
    let primary = cluster
        .status
        .as_ref()
        .and_then(|s| s.current_primary.as_deref());
    let observed_of = |name: &str| {
        leases
            .iter()
            .find(|l| l.name_any() == name)
            .and_then(observed)
    };
    let primary_position = primary
        .and_then(observed_of)
        .and_then(|o| o.wal_position)
        .and_then(|p| parse_lsn(&p));
    names
        .iter()
        .map(|name| {
            let pod = pods.iter().find(|p| &p.name_any() == name);
            let lease = leases.iter().find(|l| &l.name_any() == name);
            let state = lease.and_then(observed).unwrap_or_default();
            let is_primary = primary == Some(name.as_str());
            let lag_bytes = match (is_primary, primary_position, &state.wal_position) {
                (false, Some(primary), Some(own)) => {
                    parse_lsn(own).map(|own| primary.saturating_sub(own))
                }
                _ => None,
            };
            InstanceView {
                pod: name.clone(),
                role: pod.and_then(|p| p.labels().get(ROLE_LABEL).cloned()),
                server_role: state.role,
                ready: pod.is_some_and(pod_ready),
                node: pod.and_then(|p| p.spec.as_ref()?.node_name.clone()),
                pod_phase: pod.and_then(|p| p.status.as_ref()?.phase.clone()),
                restarts: pod
                    .and_then(|p| p.status.as_ref()?.container_statuses.as_ref())
                    .map_or(0, |c| c.iter().map(|c| c.restart_count).sum()),
                timeline: state.timeline,
                wal_position: state.wal_position,
                received_position: state.received_position,
                lag_bytes,
                server_version: state.server_version,
                problem: state.problem,
                last_heartbeat: lease
                    .and_then(|l| l.spec.as_ref()?.renew_time.as_ref())
                    .map(|t| t.0.to_string()),
            }
        })
        .collect()
}

/// Everything `status` shows.
pub fn cluster_view(
    cluster: &DatabaseCluster,
    pods: &[Pod],
    leases: &[Lease],
    backups: &[Backup],
    schedules: &[BackupSchedule],
) -> ClusterView {
    let status = cluster.status.clone().unwrap_or_default();
    let condition = |type_: &str| status.conditions.iter().find(|c| c.type_ == type_);
    let instances = instances(cluster, pods, leases);
    let primary_report = status.current_primary.as_deref().and_then(|primary| {
        leases
            .iter()
            .find(|l| l.name_any() == primary)
            .and_then(observed)
            .and_then(|o| o.wal_archive)
    });
    let archiving = cluster.spec.backup.as_ref().map(|_| {
        let condition = condition(CONTINUOUS_ARCHIVING);
        ArchivingView {
            status: condition.map(|c| c.status.clone()),
            reason: condition.map(|c| c.reason.clone()),
            message: condition.map(|c| c.message.clone()),
            pending: primary_report.as_ref().map(|r| r.pending),
            last_stored: primary_report.as_ref().and_then(|r| r.last_stored.clone()),
            failing: primary_report.as_ref().and_then(|r| r.failing.clone()),
            gap: primary_report.as_ref().and_then(|r| r.gap.clone()),
        }
    });
    let mine = backups_of(cluster, backups);
    let last_backup = mine.last().map(|b| {
        let s = b.status.clone().unwrap_or_default();
        BackupView {
            name: b.name_any(),
            method: method_name(b.spec.method).to_owned(),
            phase: s.phase.as_ref().map(debug_name),
            created_at: b.creation_timestamp().as_ref().map(time),
            instance: s.instance,
            started_at: s.started_at.as_ref().map(time),
            completed_at: s.completed_at.as_ref().map(time),
            size_bytes: s.size_bytes,
            location: s.location,
            error: s.error,
            verified: s
                .conditions
                .iter()
                .find(|c| c.type_ == VERIFIED)
                .map(|c| c.status.clone()),
        }
    });
    let name = cluster.name_any();
    let mut schedules: Vec<ScheduleView> = schedules
        .iter()
        .filter(|s| s.spec.template.spec.cluster.name == name)
        .map(|schedule| {
            let s = schedule.status.clone().unwrap_or_default();
            let healthy = s.conditions.iter().find(|c| c.type_ == BACKUPS_HEALTHY);
            ScheduleView {
                name: schedule.name_any(),
                schedule: schedule.spec.schedule.clone(),
                suspended: schedule.spec.suspend,
                last_schedule_time: s.last_schedule_time.as_ref().map(time),
                last_successful_time: s.last_successful_time.as_ref().map(time),
                next_schedule_time: s.next_schedule_time.as_ref().map(time),
                first_recoverability_point: s.first_recoverability_point.as_ref().map(time),
                last_recoverability_point: s.last_recoverability_point.as_ref().map(time),
                healthy: healthy.map(|c| c.status.clone()),
                healthy_reason: healthy.map(|c| c.reason.clone()),
            }
        })
        .collect();
    schedules.sort_by(|a, b| a.name.cmp(&b.name));
    ClusterView {
        name,
        namespace: cluster.namespace().unwrap_or_default(),
        phase: status.phase.as_ref().map(debug_name),
        paused: cluster.spec.paused,
        desired_instances: cluster.spec.instances,
        ready_instances: status.ready_instances.unwrap_or(0),
        current_primary: status.current_primary.clone(),
        postgres_version: status.postgres_version.clone(),
        endpoints: status.endpoints.clone(),
        credentials_secret: status.credentials_secret.clone(),
        conditions: status
            .conditions
            .iter()
            .map(|c| ConditionView {
                type_: c.type_.clone(),
                status: c.status.clone(),
                reason: c.reason.clone(),
                message: c.message.clone(),
                last_transition_time: Some(time(&c.last_transition_time)),
            })
            .collect(),
        instances,
        last_switchover: status.last_switchover.clone(),
        last_failover: status.last_failover.clone(),
        archiving,
        last_backup,
        backups: mine.len(),
        schedules,
    }
}

/// `5s`, `3m`, `7h`, `2d`, as kubectl prints ages.
pub fn age(since: &str, now: Timestamp) -> String {
    let Ok(then) = since.parse::<Timestamp>() else {
        return "?".to_owned();
    };
    let seconds = (now.as_second() - then.as_second()).max(0);
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 120 * 60 => format!("{}m", s / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

fn or_dash(value: Option<&str>) -> &str {
    value.filter(|v| !v.is_empty()).unwrap_or("-")
}

/// Rows as columns padded to their widest cell.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            rows.iter()
                .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}   ", width = widths[i]);
            }
        }
        out.push_str("  ");
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The human form: sections and tables.
pub fn render_text(view: &ClusterView, now: Timestamp) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "DatabaseCluster {}/{}: {}{}",
        view.namespace,
        view.name,
        or_dash(view.phase.as_deref()),
        if view.paused {
            " (PAUSED: the controller changes nothing; kubectl cairn resume)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        out,
        "  instances {} ready of {}, primary {}, PostgreSQL {}",
        view.ready_instances,
        view.desired_instances,
        or_dash(view.current_primary.as_deref()),
        or_dash(view.postgres_version.as_deref())
    );
    if let Some(endpoints) = &view.endpoints {
        let _ = writeln!(
            out,
            "  read-write {}, read-only {}, credentials Secret {}",
            or_dash(endpoints.read_write.as_deref()),
            or_dash(endpoints.read_only.as_deref()),
            or_dash(view.credentials_secret.as_deref())
        );
    }
    out.push_str("\nConditions:\n");
    if view.conditions.is_empty() {
        out.push_str("  none yet\n");
    } else {
        let mut rows = vec![vec![
            "TYPE".to_owned(),
            "STATUS".to_owned(),
            "REASON".to_owned(),
            "AGE".to_owned(),
            "MESSAGE".to_owned(),
        ]];
        for c in &view.conditions {
            rows.push(vec![
                c.type_.clone(),
                c.status.clone(),
                c.reason.clone(),
                c.last_transition_time
                    .as_deref()
                    .map_or_else(|| "-".to_owned(), |t| age(t, now)),
                c.message.clone(),
            ]);
        }
        out.push_str(&table(&rows));
    }
    out.push_str("\nInstances:\n");
    let mut rows = vec![
        [
            "POD", "ROLE", "READY", "NODE", "TIMELINE", "LSN", "LAG", "RESTARTS", "PROBLEM",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    for i in &view.instances {
        let role = match (&i.role, &i.server_role) {
            (Some(assigned), Some(server)) if assigned != server => {
                format!("{assigned} (server: {server})")
            }
            (Some(assigned), _) => assigned.clone(),
            (None, Some(server)) => format!("(server: {server})"),
            (None, None) => "-".to_owned(),
        };
        rows.push(vec![
            i.pod.clone(),
            role,
            if i.ready { "true" } else { "false" }.to_owned(),
            or_dash(i.node.as_deref()).to_owned(),
            i.timeline.map_or_else(|| "-".to_owned(), |t| t.to_string()),
            or_dash(i.wal_position.as_deref()).to_owned(),
            i.lag_bytes
                .map_or_else(|| "-".to_owned(), |b| format!("{b} B")),
            i.restarts.to_string(),
            or_dash(i.problem.as_deref()).to_owned(),
        ]);
    }
    if view.instances.is_empty() {
        out.push_str("  none yet\n");
    } else {
        out.push_str(&table(&rows));
    }
    out.push_str("\nSwitchover and failover:\n");
    match &view.last_switchover {
        Some(s) => {
            let _ = writeln!(
                out,
                "  last switchover {} → {}, started {} ago, {}",
                s.from,
                s.to,
                age(&time(&s.started_at), now),
                match (&s.abandoned, &s.completed_at, s.write_unavailable_seconds) {
                    (Some(why), _, _) => format!("GIVEN UP: {why}"),
                    (None, Some(_), Some(seconds)) =>
                        format!("completed (writes unavailable {seconds:.1} s)"),
                    (None, Some(_), None) => "completed".to_owned(),
                    (None, None, _) => "UNDER WAY".to_owned(),
                }
            );
        }
        None => out.push_str("  no switchover yet\n"),
    }
    match &view.last_failover {
        Some(f) => {
            let _ = writeln!(
                out,
                "  last failover {} → {}, {} ago: {}",
                f.from,
                f.to,
                age(&time(&f.promoted_at), now),
                f.reason
            );
        }
        None => out.push_str("  no failover yet\n"),
    }
    out.push_str("\nContinuous archiving:\n");
    match &view.archiving {
        None => out.push_str("  off (no spec.backup)\n"),
        Some(a) => {
            let _ = writeln!(
                out,
                "  {} {}: {}",
                or_dash(a.status.as_deref()),
                or_dash(a.reason.as_deref()),
                or_dash(a.message.as_deref())
            );
            let _ = writeln!(
                out,
                "  last stored {}, waiting {}, failing: {}{}",
                a.last_stored
                    .as_deref()
                    .map_or_else(|| "-".to_owned(), |t| format!("{} ago", age(t, now))),
                a.pending.map_or_else(|| "-".to_owned(), |p| p.to_string()),
                or_dash(a.failing.as_deref()),
                a.gap
                    .as_deref()
                    .map(|g| format!(", GAP from {g}"))
                    .unwrap_or_default()
            );
        }
    }
    out.push_str("\nBackups:\n");
    match &view.last_backup {
        None => out.push_str("  no Backup of this cluster (kubectl cairn backup NAME)\n"),
        Some(b) => {
            let _ = writeln!(
                out,
                "  last of {}: {} ({}) {}, created {} ago{}{}{}",
                view.backups,
                b.name,
                b.method,
                or_dash(b.phase.as_deref()),
                b.created_at
                    .as_deref()
                    .map_or("?".to_owned(), |t| age(t, now)),
                b.size_bytes
                    .map(|s| format!(", {s} bytes"))
                    .unwrap_or_default(),
                b.verified
                    .as_deref()
                    .map(|v| format!(", verified {v}"))
                    .unwrap_or_default(),
                b.error
                    .as_deref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            );
        }
    }
    for s in &view.schedules {
        let _ = writeln!(
            out,
            "  schedule {} \"{}\"{}: healthy {} {}, last success {}, recoverable from {} to {}",
            s.name,
            s.schedule,
            if s.suspended { " (suspended)" } else { "" },
            or_dash(s.healthy.as_deref()),
            or_dash(s.healthy_reason.as_deref()),
            or_dash(s.last_successful_time.as_deref()),
            or_dash(s.first_recoverability_point.as_deref()),
            or_dash(s.last_recoverability_point.as_deref())
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{cluster, lease, pod};
    use cairn_api::common::Condition;

    fn time_of(text: &str) -> Time {
        Time(text.parse().expect("time"))
    }

    fn backup(name: &str, cluster: &str, created: &str, phase: &str) -> Backup {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "backup.cairn.dev/v1", "kind": "Backup",
            "metadata": { "name": name, "creationTimestamp": created },
            "spec": { "cluster": { "name": cluster }, "method": "physical" },
            "status": { "phase": phase, "sizeBytes": 1024,
                        "conditions": [{ "type": "Verified", "status": "True", "reason": "Verified",
                                         "message": "", "lastTransitionTime": created }] },
        }))
        .expect("backup")
    }

    fn web() -> DatabaseCluster {
        let mut web = cluster("web", 2);
        web.spec.backup = Some(
            serde_json::from_value(serde_json::json!({ "destination": { "s3": {
                "bucket": "b", "credentialsSecret": { "name": "s" } } } }))
            .expect("backup spec"),
        );
        let status = web.status.get_or_insert_default();
        status.current_primary = Some("web-0".into());
        status.ready_instances = Some(2);
        status.phase = Some(cairn_api::database::v1::DatabaseClusterPhase::Running);
        status.conditions = vec![
            Condition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: "AllInstancesReady".into(),
                message: "2 of 2 instances ready".into(),
                last_transition_time: time_of("2026-11-26T11:00:00Z"),
                observed_generation: None,
            },
            Condition {
                type_: CONTINUOUS_ARCHIVING.into(),
                status: "True".into(),
                reason: "Archiving".into(),
                message: "stored".into(),
                last_transition_time: time_of("2026-11-26T11:00:00Z"),
                observed_generation: None,
            },
        ];
        web
    }

    #[test]
    fn the_view_reports_the_status_the_members_and_the_lag() {
        let web = web();
        let pods = vec![
            pod("web-1", true, "replica", "cairn-node-2"),
            pod("web-0", true, "primary", "cairn-node-1"),
        ];
        let mut primary = lease("web-0", "primary", 2, "0/3000100", true);
        let mut state = observed(&primary).expect("observed");
        state.wal_archive = Some(cairn_api::database::instance::WalArchiveState {
            pending: 1,
            last_stored: Some("2026-11-26T11:59:00Z".into()),
            failing: None,
            gap: None,
        });
        primary.metadata.annotations = Some(std::collections::BTreeMap::from([(
            OBSERVED_ANNOTATION.to_owned(),
            serde_json::to_string(&state).expect("json"),
        )]));
        let leases = vec![primary, lease("web-1", "replica", 2, "0/3000000", true)];
        let view = cluster_view(&web, &pods, &leases, &[], &[]);
        assert_eq!(view.name, "web");
        assert_eq!(view.namespace, "shop");
        assert_eq!(view.phase.as_deref(), Some("Running"));
        assert_eq!(view.current_primary.as_deref(), Some("web-0"));
        assert_eq!(view.ready_instances, 2);
        assert_eq!(view.conditions.len(), 2);
        assert_eq!(view.conditions[0].type_, "Ready");
        assert_eq!(
            view.conditions[0].last_transition_time.as_deref(),
            Some("2026-11-26T11:00:00Z")
        );
        let pods: Vec<&str> = view.instances.iter().map(|i| i.pod.as_str()).collect();
        assert_eq!(pods, ["web-0", "web-1"], "by ordinal");
        assert_eq!(view.instances[0].lag_bytes, None, "the primary has no lag");
        assert_eq!(view.instances[1].lag_bytes, Some(0x100));
        assert_eq!(view.instances[1].timeline, Some(2));
        assert_eq!(view.instances[1].node.as_deref(), Some("cairn-node-2"));
        assert_eq!(view.instances[1].role.as_deref(), Some("replica"));
        let archiving = view.archiving.clone().expect("archiving");
        assert_eq!(archiving.reason.as_deref(), Some("Archiving"));
        assert_eq!(archiving.pending, Some(1));
        assert_eq!(
            archiving.last_stored.as_deref(),
            Some("2026-11-26T11:59:00Z")
        );

        let json = serde_json::to_value(&view).expect("json");
        assert_eq!(json["currentPrimary"], "web-0");
        assert_eq!(json["conditions"][0]["type"], "Ready");
        assert_eq!(json["instances"][1]["lagBytes"], 256);

        let now: Timestamp = "2026-11-26T12:00:00Z".parse().expect("time");
        let text = render_text(&view, now);
        assert!(text.contains("DatabaseCluster shop/web: Running"), "{text}");
        assert!(text.contains("AllInstancesReady"), "{text}");
        assert!(text.contains("60m"), "the condition's age: {text}");
        assert!(text.contains("256 B"), "{text}");
        assert!(text.contains("last stored 60s ago"), "{text}");
    }

    #[test]
    fn the_last_backup_is_the_newest_of_this_cluster_and_schedules_are_its_own() {
        let web = web();
        let backups = vec![
            backup("web-new", "web", "2026-11-26T11:00:00Z", "Completed"),
            backup("api-newer", "api", "2026-11-26T11:30:00Z", "Failed"),
            backup("web-old", "web", "2026-11-25T11:00:00Z", "Failed"),
        ];
        let schedule: BackupSchedule = serde_json::from_value(serde_json::json!({
            "apiVersion": "backup.cairn.dev/v1", "kind": "BackupSchedule",
            "metadata": { "name": "nightly" },
            "spec": { "schedule": "0 3 * * *",
                      "template": { "spec": { "cluster": { "name": "web" }, "method": "physical" } } },
            "status": { "firstRecoverabilityPoint": "2026-11-20T03:00:00Z",
                        "lastRecoverabilityPoint": "2026-11-26T11:59:00Z" },
        }))
        .expect("schedule");
        let mut other = schedule.clone();
        other.metadata.name = Some("theirs".into());
        other.spec.template.spec.cluster.name = "api".into();
        let view = cluster_view(&web, &[], &[], &backups, &[schedule, other]);
        let last = view.last_backup.clone().expect("a backup");
        assert_eq!(last.name, "web-new");
        assert_eq!(last.phase.as_deref(), Some("Completed"));
        assert_eq!(last.verified.as_deref(), Some("True"));
        assert_eq!(view.backups, 2);
        assert_eq!(view.schedules.len(), 1);
        assert_eq!(
            view.schedules[0].first_recoverability_point.as_deref(),
            Some("2026-11-20T03:00:00Z")
        );
        let mut paused = web.clone();
        paused.spec.paused = true;
        let text = render_text(
            &cluster_view(&paused, &[], &[], &[], &[]),
            "2026-11-26T12:00:00Z".parse().expect("time"),
        );
        assert!(text.contains("PAUSED"), "{text}");
        assert!(text.contains("no Backup of this cluster"), "{text}");
    }

    #[test]
    fn ages() {
        let now: Timestamp = "2026-11-26T12:00:00Z".parse().expect("time");
        assert_eq!(age("2026-11-26T11:59:30Z", now), "30s");
        assert_eq!(age("2026-11-26T11:30:00Z", now), "30m");
        assert_eq!(age("2026-11-26T02:00:00Z", now), "10h");
        assert_eq!(age("2026-11-20T12:00:00Z", now), "6d");
        assert_eq!(age("junk", now), "?");
    }
}
