//! `promote --accept-data-loss`: the way out of a blocked failover for an
//! operator who chooses availability. It writes the order
//! (`database.cairn.dev/promote-accepting-data-loss: <pod>@<timeline>`); the
//! controller follows it only while the failover stays blocked on that
//! timeline, and still refuses a replica that would fork the history or a
//! primary a replica hears serving.

use std::process::ExitCode;

use anyhow::{Context, Result};
use cairn_api::database::v1::{DatabaseCluster, FORCED_PROMOTION_ANNOTATION, ForcedPromotion};
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::args::PromoteArgs;
use crate::client::{Target, explain};

/// The `Degraded` reason of a failover that waits.
const FAILOVER_BLOCKED: &str = "FailoverBlocked";

/// The order to write, or why none is given.
pub fn order(
    cluster: &DatabaseCluster,
    pod: &str,
    accept_data_loss: bool,
) -> Result<ForcedPromotion, String> {
    let name = cluster.name_any();
    let status = cluster.status.clone().unwrap_or_default();
    let blocked = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Degraded" && c.status == "True" && c.reason == FAILOVER_BLOCKED);
    let Some(blocked) = blocked else {
        return Err(format!(
            "DatabaseCluster {name} has no blocked failover: nothing to force (to move a serving \
             primary, use kubectl cairn switchover {name} --to {pod})"
        ));
    };
    if !accept_data_loss {
        return Err(format!(
            "the failover of {name} waits because {}.\npromoting {pod} now may lose writes the \
             lost primary acknowledged; pass --accept-data-loss to accept that",
            blocked.message
        ));
    }
    let Some(timeline) = status.timeline else {
        return Err(format!("DatabaseCluster {name} records no timeline yet"));
    };
    Ok(ForcedPromotion {
        pod: pod.to_owned(),
        timeline,
    })
}

pub async fn run(target: &Target, args: &PromoteArgs) -> Result<ExitCode> {
    let cluster = target.cluster(&args.cluster).await?;
    let order = order(&cluster, &args.pod, args.accept_data_loss).map_err(anyhow::Error::msg)?;
    target
        .api::<DatabaseCluster>()
        .patch(
            &cluster.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": {
                FORCED_PROMOTION_ANNOTATION: order.to_string(),
            } } })),
        )
        .await
        .map_err(explain)
        .context("cannot annotate the cluster")?;
    println!(
        "promotion of {} ordered, accepting data loss: the controller records it in \
         status.lastFailover (an Event ForcedFailover), or says in Degraded why it refuses",
        order.pod
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use cairn_api::common::{Condition, Time};
    use k8s_openapi::jiff::Timestamp;

    fn blocked(cluster: &mut DatabaseCluster) {
        let status = cluster.status.get_or_insert_default();
        status.timeline = Some(3);
        status.conditions.push(Condition {
            type_: "Degraded".into(),
            status: "True".into(),
            reason: FAILOVER_BLOCKED.into(),
            message: "primary web-0 lost (no heartbeat), and every replica is behind".into(),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
            observed_generation: None,
        });
    }

    #[test]
    fn an_order_is_written_only_for_a_blocked_failover_and_with_the_loss_accepted() {
        let mut cluster = fixtures::cluster("web", 3);
        let refused = order(&cluster, "web-1", true).expect_err("nothing blocked");
        assert!(refused.contains("switchover"), "{refused}");
        blocked(&mut cluster);
        let refused = order(&cluster, "web-1", false).expect_err("loss not accepted");
        assert!(
            refused.contains("every replica is behind") && refused.contains("--accept-data-loss"),
            "{refused}"
        );
        assert_eq!(
            order(&cluster, "web-1", true),
            Ok(ForcedPromotion {
                pod: "web-1".into(),
                timeline: 3
            })
        );
    }
}
