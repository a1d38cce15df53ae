//! `restart`, `pause` and `resume`: small patches of the DatabaseCluster.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use cairn_api::database::v1::{DatabaseCluster, RESTARTED_AT_ANNOTATION};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::{Value, json};

use crate::args::RestartArgs;
use crate::client::{Target, explain};
use crate::status::pod_selector;
use crate::view::pod_ready;

/// The merge patch that asks for a rolling restart at `now`.
pub fn restart_patch(now: Timestamp) -> Value {
    json!({ "metadata": { "annotations": {
        RESTARTED_AT_ANNOTATION: now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
    } } })
}

/// The merge patch that pauses or resumes (removes the field).
pub fn paused_patch(paused: bool) -> Value {
    json!({ "spec": { "paused": if paused { Value::Bool(true) } else { Value::Null } } })
}

/// Whether every one of the `expected` instance pods was created at or
/// after `since` and is ready.
pub fn restarted(pods: &[Pod], expected: usize, since: Timestamp) -> bool {
    pods.len() == expected
        && pods.iter().all(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.metadata
                    .creation_timestamp
                    .as_ref()
                    .is_some_and(|t| t.0.as_second() >= since.as_second())
                && pod_ready(p)
        })
}

pub async fn restart(target: &Target, args: &RestartArgs) -> Result<ExitCode> {
    let cluster = target.cluster(&args.cluster).await?;
    crate::switchover::clear_done_request(target, &cluster).await?;
    let now = crate::client::now();
    target
        .api::<DatabaseCluster>()
        .patch(
            &args.cluster,
            &PatchParams::default(),
            &Patch::Merge(restart_patch(now)),
        )
        .await
        .map_err(explain)
        .context("cannot annotate the cluster")?;
    println!(
        "restart of {} requested: replicas first, then a switchover, the old primary last",
        args.cluster
    );
    if cluster.spec.paused {
        eprintln!(
            "warning: {} is paused: the instances restart once it is resumed \
             (kubectl cairn resume {})",
            args.cluster, args.cluster
        );
        return Ok(ExitCode::SUCCESS);
    }
    if !args.wait {
        return Ok(ExitCode::SUCCESS);
    }
    let expected = usize::try_from(cluster.spec.instances).unwrap_or(0);
    let deadline = tokio::time::Instant::now() + args.timeout;
    loop {
        let pods = target
            .api::<Pod>()
            .list(&ListParams::default().labels(&pod_selector(&args.cluster)))
            .await
            .map_err(explain)?
            .items;
        if restarted(&pods, expected, now) {
            let cluster = target.cluster(&args.cluster).await?;
            let ready = cluster.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            });
            if ready {
                println!(
                    "every instance of {} restarted; the cluster is Ready",
                    args.cluster
                );
                return Ok(ExitCode::SUCCESS);
            }
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "{} did not finish restarting within {:?}; see kubectl cairn status {}",
                args.cluster,
                args.timeout,
                args.cluster
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

pub async fn set_paused(target: &Target, name: &str, paused: bool) -> Result<ExitCode> {
    target.cluster(name).await?;
    target
        .api::<DatabaseCluster>()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(paused_patch(paused)),
        )
        .await
        .map_err(explain)
        .context("cannot patch the cluster")?;
    if paused {
        println!(
            "{name} paused: the controller changes none of its objects until kubectl cairn resume {name}"
        );
    } else {
        println!("{name} resumed");
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::pod;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn patches() {
        let now: Timestamp = "2026-11-26T12:00:00.5Z".parse().expect("time");
        assert_eq!(
            restart_patch(now),
            json!({ "metadata": { "annotations": {
                "database.cairn.dev/restartedAt": "2026-11-26T12:00:00Z" } } })
        );
        assert_eq!(paused_patch(true), json!({ "spec": { "paused": true } }));
        assert_eq!(paused_patch(false), json!({ "spec": { "paused": null } }));
    }

    #[test]
    fn restarted_means_every_pod_new_and_ready() {
        let since: Timestamp = "2026-11-26T12:00:00Z".parse().expect("time");
        let at = |text: &str, ready: bool| {
            let mut p = pod("web-0", ready, "replica", "n");
            p.metadata.creation_timestamp = Some(Time(text.parse().expect("time")));
            p
        };
        let new = at("2026-11-26T12:01:00Z", true);
        let old = at("2026-11-26T11:00:00Z", true);
        assert!(restarted(&[new.clone(), new.clone()], 2, since));
        assert!(!restarted(&[new.clone(), old], 2, since), "one is old");
        assert!(
            !restarted(std::slice::from_ref(&new), 2, since),
            "one is missing"
        );
        assert!(
            !restarted(&[new, at("2026-11-26T12:01:00Z", false)], 2, since),
            "unready"
        );
    }
}
