//! `switchover`: asks the controller for a planned switchover with the
//! annotation `database.cairn.dev/switchover-to`, to a replica chosen here
//! when none is named.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use cairn_api::database::instance::ROLE_REPLICA;
use cairn_api::database::v1::{DatabaseCluster, SWITCHOVER_ANNOTATION};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::args::SwitchoverArgs;
use crate::client::{Target, explain};
use crate::status::gather;
use crate::view::{ClusterView, InstanceView, ordinal};

/// The `Progressing` reason the controller gives a refused request.
const SWITCHOVER_REFUSED: &str = "SwitchoverRefused";

/// Whether an instance could take over now: a ready pod whose server runs
/// as a replica and reports no problem.
fn eligible(instance: &InstanceView) -> bool {
    instance.ready
        && instance.server_role.as_deref() == Some(ROLE_REPLICA)
        && instance.problem.is_none()
}

/// The replica to promote: `requested` if it can take over, else the
/// healthiest ready replica (the newest timeline, then the least lag, then
/// the lowest ordinal, as the controller's failover ranks them). An error
/// says why there is none.
pub fn candidate(view: &ClusterView, requested: Option<&str>) -> Result<String, String> {
    let Some(primary) = view.current_primary.as_deref() else {
        return Err(format!(
            "DatabaseCluster {} has no current primary yet: wait until it is Ready",
            view.name
        ));
    };
    if let Some(target) = requested {
        if target == primary {
            return Err(format!("{target} is already the primary"));
        }
        let Some(instance) = view.instances.iter().find(|i| i.pod == target) else {
            let pods: Vec<&str> = view.instances.iter().map(|i| i.pod.as_str()).collect();
            return Err(format!(
                "{target} is not an instance of DatabaseCluster {} (its pods: {})",
                view.name,
                pods.join(", ")
            ));
        };
        if !eligible(instance) {
            return Err(format!(
                "{target} cannot take over now: it is not a ready, streaming replica{}",
                instance
                    .problem
                    .as_deref()
                    .map(|p| format!(" ({p})"))
                    .unwrap_or_default()
            ));
        }
        return Ok(target.to_owned());
    }
    view.instances
        .iter()
        .filter(|i| i.pod != primary && eligible(i))
        .min_by_key(|i| {
            (
                std::cmp::Reverse(i.timeline.unwrap_or(0)),
                i.lag_bytes.unwrap_or(u64::MAX),
                ordinal(&i.pod),
            )
        })
        .map(|i| i.pod.clone())
        .ok_or_else(|| {
            format!(
                "DatabaseCluster {} has no ready replica to switch over to (primary {primary}); \
                 see kubectl cairn status {}",
                view.name, view.name
            )
        })
}

/// Clears a switchover request that is done (the annotation names the
/// current primary): left in place, it would move the primary back after
/// any later failover or rollout.
pub async fn clear_done_request(target: &Target, cluster: &DatabaseCluster) -> Result<()> {
    let primary = cluster
        .status
        .as_ref()
        .and_then(|s| s.current_primary.as_deref());
    let requested = cluster.annotations().get(SWITCHOVER_ANNOTATION);
    if requested.is_some() && requested.map(String::as_str) == primary {
        remove_request(target, &cluster.name_any()).await?;
    }
    Ok(())
}

async fn remove_request(target: &Target, name: &str) -> Result<()> {
    target
        .api::<DatabaseCluster>()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({ "metadata": { "annotations": { SWITCHOVER_ANNOTATION: null } } }),
            ),
        )
        .await
        .map_err(explain)
        .context("cannot remove the switchover annotation")?;
    Ok(())
}

pub async fn run(target: &Target, args: &SwitchoverArgs) -> Result<ExitCode> {
    let (cluster, view) = gather(target, &args.cluster).await?;
    let to = candidate(&view, args.to.as_deref()).map_err(anyhow::Error::msg)?;
    let from = view.current_primary.clone().unwrap_or_default();
    let requested_at = crate::client::now();
    target
        .api::<DatabaseCluster>()
        .patch(
            &cluster.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { SWITCHOVER_ANNOTATION: to } } })),
        )
        .await
        .map_err(explain)
        .context("cannot annotate the cluster")?;
    println!("switchover of {} requested: {from} → {to}", view.name);
    if !args.wait {
        eprintln!(
            "follow it with kubectl cairn status {} (the annotation {SWITCHOVER_ANNOTATION} stays \
             until removed; kubectl cairn switchover --wait removes it once done)",
            view.name
        );
        return Ok(ExitCode::SUCCESS);
    }
    wait_for(target, &view.name, &to, requested_at, args.timeout).await?;
    remove_request(target, &view.name).await?;
    Ok(ExitCode::SUCCESS)
}

async fn wait_for(
    target: &Target,
    name: &str,
    to: &str,
    requested_at: Timestamp,
    timeout: Duration,
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    // The status the request was made against may still say "refused" for
    // an older request: give the controller a moment before believing it.
    let trust_refusal_after = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let cluster = target.cluster(name).await?;
        let status = cluster.status.unwrap_or_default();
        let record = status.last_switchover.as_ref();
        let done = status.current_primary.as_deref() == Some(to)
            && record.is_some_and(|r| {
                r.to == to
                    && r.completed_at.is_some()
                    && r.started_at.0.as_second() >= requested_at.as_second() - 1
            });
        if done {
            let seconds = record.and_then(|r| r.write_unavailable_seconds);
            println!(
                "{to} is the primary{}",
                seconds
                    .map(|s| format!(" (writes unavailable {s:.1} s)"))
                    .unwrap_or_default()
            );
            return Ok(());
        }
        if tokio::time::Instant::now() >= trust_refusal_after
            && let Some(refused) = status
                .conditions
                .iter()
                .find(|c| c.reason == SWITCHOVER_REFUSED)
        {
            remove_request(target, name).await?;
            bail!("the controller refused the switchover: {}", refused.message);
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "the switchover to {to} did not complete within {timeout:?}; see kubectl cairn \
                 status {name}"
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{cluster, lease, pod};
    use crate::view::cluster_view;

    fn view(replicas: &[(&str, bool, u32, &str)]) -> ClusterView {
        let mut web = cluster("web", 3);
        web.status.get_or_insert_default().current_primary = Some("web-0".into());
        let mut pods = vec![pod("web-0", true, "primary", "cairn-node-1")];
        let mut leases = vec![lease("web-0", "primary", 1, "0/5000000", true)];
        for (name, ready, timeline, position) in replicas {
            pods.push(pod(name, *ready, "replica", "cairn-node-2"));
            leases.push(lease(name, "replica", *timeline, position, *ready));
        }
        cluster_view(&web, &pods, &leases, &[], &[])
    }

    #[test]
    fn the_healthiest_ready_replica_is_chosen() {
        // Least lag wins.
        let v = view(&[
            ("web-1", true, 1, "0/4000000"),
            ("web-2", true, 1, "0/4FFFFFF"),
        ]);
        assert_eq!(candidate(&v, None), Ok("web-2".into()));
        // A newer timeline beats less lag; an unready replica never counts.
        let v = view(&[
            ("web-1", true, 2, "0/1000000"),
            ("web-2", false, 2, "0/5000000"),
            ("web-3", true, 1, "0/5000000"),
        ]);
        assert_eq!(candidate(&v, None), Ok("web-1".into()));
        // Equal: the lowest ordinal.
        let v = view(&[
            ("web-2", true, 1, "0/4000000"),
            ("web-1", true, 1, "0/4000000"),
        ]);
        assert_eq!(candidate(&v, None), Ok("web-1".into()));
    }

    #[test]
    fn no_candidate_is_refused_with_the_reason() {
        let v = view(&[("web-1", false, 1, "0/4000000")]);
        let why = candidate(&v, None).expect_err("none");
        assert!(why.contains("no ready replica"), "{why}");
        let why = candidate(&v, Some("web-1")).expect_err("unready");
        assert!(why.contains("not a ready, streaming replica"), "{why}");
        let why = candidate(&v, Some("web-0")).expect_err("primary");
        assert!(why.contains("already the primary"), "{why}");
        let why = candidate(&v, Some("db-1")).expect_err("foreign");
        assert!(
            why.contains("not an instance") && why.contains("web-0, web-1"),
            "{why}"
        );
        let v = view(&[("web-1", true, 1, "0/4000000")]);
        assert_eq!(candidate(&v, Some("web-1")), Ok("web-1".into()));
        let mut no_primary = v.clone();
        no_primary.current_primary = None;
        assert!(candidate(&no_primary, None).is_err());
    }
}
