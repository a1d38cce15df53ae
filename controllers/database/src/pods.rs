//! The instance pods this controller deletes, each only while it is still
//! the pod the decision saw: leftovers of a replaced StatefulSet, pods
//! whose token names a ServiceAccount replaced since, and a rollout's next
//! restart.

use std::time::Duration;

use cairn_api::database::v1::DatabaseCluster;
use cairn_runtime::conditions::Time;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};

use crate::build;
use crate::context::{Context, Observed};
use crate::error::Error;
use crate::leftovers;
use crate::membership::primary;
use crate::rollout;
use crate::switchover;
use crate::tokens;
use cairn_runtime::apply::delete_exactly;

/// Deletes the instance pods a replaced StatefulSet left behind once the
/// garbage collector has had its grace (see `leftovers.rs`); when to look
/// again while it still has.
pub async fn collect_leftovers(
    ctx: &Context,
    cluster: &DatabaseCluster,
    stateful_set: &StatefulSet,
    observed: &Observed,
    now: &Time,
) -> Result<Option<Duration>, Error> {
    let pods = observed.pod_refs();
    let found = leftovers::leftovers(stateful_set, &pods, now, ctx.collector_grace);
    for pod in found.collect {
        let message = format!(
            "deleted pod {} of the replaced StatefulSet {} (the garbage collector left it for over {} s): the current StatefulSet recreates it",
            pod.pod,
            pod.owner_uid,
            ctx.collector_grace.as_secs()
        );
        let why = Deletion::warning("LeftoverPodDeleted", message);
        delete_pod(ctx, cluster, &pod.pod, Some(pod.uid.clone()), why).await?;
    }
    Ok(found.recheck)
}

/// Restarts the instance pods whose token names a ServiceAccount deleted
/// since (see `tokens.rs`), replicas first.
pub async fn restart_void_tokens(
    ctx: &Context,
    cluster: &DatabaseCluster,
    observed: &Observed,
) -> Result<(), Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let account_name = build::service_account(cluster).name_any();
    let Some(account) = ctx
        .caches
        .service_accounts
        .get(&ObjectRef::new(&account_name).within(&namespace))
    else {
        return Ok(());
    };
    for pod in tokens::void_token_pods(&account, &observed.pod_refs(), &primary(cluster)) {
        let name = pod.name_any();
        let message = format!(
            "deleted pod {name}: its token names ServiceAccount {account_name} as it was before it was deleted and created again, and the API server refuses it; the new pod gets a valid one"
        );
        let why = Deletion::warning("ServiceAccountReplaced", message);
        delete_pod(ctx, cluster, &name, pod.uid(), why).await?;
    }
    Ok(())
}

/// The rollout's next step (see `rollout.rs`), from the StatefulSet as
/// last seen: one not seen yet has no rollout under way.
pub fn roll_out(cluster: &DatabaseCluster, observed: &Observed) -> rollout::Step {
    let Some(stateful_set) = observed.stateful_set.as_deref() else {
        return rollout::Step::Done;
    };
    let Some(instances) = rollout::instances(stateful_set, &observed.pod_refs()) else {
        // The StatefulSet controller has not seen the new template yet.
        return rollout::Step::Done;
    };
    let switching = switchover::under_way(
        cluster
            .status
            .as_ref()
            .and_then(|s| s.last_switchover.as_ref()),
    )
    .is_some();
    let expected = cluster.spec.instance_count() as usize;
    let initialized = cluster.status.as_ref().is_some_and(|s| s.initialized);
    rollout::next(
        &instances,
        expected,
        &primary(cluster),
        &observed.members,
        switching,
        initialized,
    )
}

/// Deletes an instance pod so the StatefulSet recreates it from the new
/// template; the precondition makes sure it is the pod the decision saw.
pub async fn restart(
    ctx: &Context,
    cluster: &DatabaseCluster,
    observed: &Observed,
    name: &str,
) -> Result<(), Error> {
    let Some(pod) = observed.pods.iter().find(|p| p.name_any() == name) else {
        return Ok(());
    };
    let why = Deletion {
        kind: EventType::Normal,
        reason: "RestartingInstance",
        message: format!("restarting {name} with the new pod template"),
    };
    delete_pod(ctx, cluster, name, pod.uid(), why).await
}

/// Why the controller deletes an instance pod: the Event it publishes, and
/// logs at the Event's level, once the delete went through.
struct Deletion {
    kind: EventType,
    reason: &'static str,
    message: String,
}

impl Deletion {
    fn warning(reason: &'static str, message: String) -> Self {
        Self {
            kind: EventType::Warning,
            reason,
            message,
        }
    }
}

/// Deletes an instance pod if it is still the one with `uid` (the one the
/// decision saw) and says `why`; nothing if it is gone already or was
/// replaced since.
async fn delete_pod(
    ctx: &Context,
    cluster: &DatabaseCluster,
    name: &str,
    uid: Option<String>,
    why: Deletion,
) -> Result<(), Error> {
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    if !delete_exactly(&pods, name, uid, None).await? {
        return Ok(());
    }
    match why.kind {
        EventType::Warning => tracing::warn!(pod = %name, "{}", why.message),
        EventType::Normal => tracing::info!(pod = %name, "{}", why.message),
    }
    ctx.publish(cluster, why.kind, why.reason, why.message)
        .await;
    Ok(())
}
