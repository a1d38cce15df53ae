//! One reconcile of a `DatabaseCluster`: validate → build → apply → status.
//! Reads come from the caches; a write happens only where the cache differs
//! from the desired state, so an unchanged cluster costs no request at all.

use std::sync::Arc;

use cairn_api::database::v1::{DatabaseCluster, DatabaseClusterStatus};
use cairn_api::validate;
use cairn_runtime::apply::apply;
use cairn_runtime::conditions::Time;
use cairn_runtime::events;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::MANAGER;
use crate::build::{self, Names, ROLE_LABEL, ROLE_PRIMARY, ROLE_REPLICA};
use crate::error::Error;
use crate::status::{self, DEGRADED, Instances, PROGRESSING, READY};

/// What every reconcile reads from and writes with.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub caches: Caches,
}

/// The controller's caches of the children it owns.
pub struct Caches {
    pub stateful_sets: Store<StatefulSet>,
    pub services: Store<Service>,
    pub config_maps: Store<ConfigMap>,
    pub secrets: Store<Secret>,
    pub service_accounts: Store<ServiceAccount>,
    pub disruption_budgets: Store<PodDisruptionBudget>,
    pub pods: Store<Pod>,
}

pub async fn reconcile(cluster: Arc<DatabaseCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    if cluster.metadata.deletion_timestamp.is_some() {
        // Owner references hand the children to the garbage collector.
        return Ok(Action::await_change());
    }
    let now = Time(Timestamp::now());
    let problems = validate::database_cluster(&cluster.spec);
    if !problems.is_empty() {
        let message = problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        write_status(&ctx, &cluster, status::invalid(&cluster, &message, &now)).await?;
        return Err(Error::InvalidSpec(message));
    }
    if cluster.spec.paused {
        write_status(&ctx, &cluster, status::paused(&cluster, &now)).await?;
        return Ok(Action::await_change());
    }
    let stateful_set = apply_children(&ctx, &cluster).await?;
    let primary = primary(&cluster);
    label_roles(&ctx, &cluster, &primary).await?;
    let instances = Instances::of(Some(&stateful_set));
    write_status(
        &ctx,
        &cluster,
        status::observe(&cluster, instances, &primary, &now),
    )
    .await?;
    Ok(Action::await_change())
}

/// The pod running the primary: the one recorded in the status, or ordinal 0
/// of a new cluster.
pub fn primary(cluster: &DatabaseCluster) -> String {
    cluster
        .status
        .as_ref()
        .and_then(|s| s.current_primary.clone())
        .unwrap_or_else(|| format!("{}-0", cluster.name_any()))
}

/// Applies every child that differs from its cached copy; returns the
/// StatefulSet as the API server last reported it.
async fn apply_children(ctx: &Context, cluster: &DatabaseCluster) -> Result<StatefulSet, Error> {
    let caches = &ctx.caches;
    ensure_credentials(ctx, cluster).await?;
    apply_child(
        ctx,
        cluster,
        &caches.service_accounts,
        build::service_account(cluster),
    )
    .await?;
    apply_child(
        ctx,
        cluster,
        &caches.config_maps,
        build::config_map(cluster),
    )
    .await?;
    for service in build::services(cluster) {
        apply_child(ctx, cluster, &caches.services, service).await?;
    }
    apply_child(
        ctx,
        cluster,
        &caches.disruption_budgets,
        build::disruption_budget(cluster),
    )
    .await?;
    apply_child(
        ctx,
        cluster,
        &caches.stateful_sets,
        build::stateful_set(cluster),
    )
    .await
}

async fn apply_child<K>(
    ctx: &Context,
    cluster: &DatabaseCluster,
    cache: &Store<K>,
    desired: K,
) -> Result<K, Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + Serialize
        + DeserializeOwned,
{
    let namespace = cluster.namespace().unwrap_or_default();
    let api = Api::<K>::namespaced(ctx.client.clone(), &namespace);
    let current = cache.get(&ObjectRef::new(&desired.name_any()).within(&namespace));
    let (applied, _) = apply(&api, MANAGER, &desired, current.as_deref()).await?;
    Ok(applied)
}

/// Creates the credentials Secret once. It is never updated: the passwords
/// are in use from the moment the first instance starts.
async fn ensure_credentials(ctx: &Context, cluster: &DatabaseCluster) -> Result<(), Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = Names::of(cluster).credentials;
    if ctx
        .caches
        .secrets
        .get(&ObjectRef::new(&name).within(&namespace))
        .is_some()
    {
        return Ok(());
    }
    let secret = build::credentials(cluster, &mut build::random_password);
    let api = Api::<Secret>::namespaced(ctx.client.clone(), &namespace);
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(()),
        // Created by an earlier reconcile the cache has not seen yet.
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Sets the role label on each instance pod, where it differs.
async fn label_roles(ctx: &Context, cluster: &DatabaseCluster, primary: &str) -> Result<(), Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let api = Api::<Pod>::namespaced(ctx.client.clone(), &namespace);
    let pods = ctx.caches.pods.state_filter(|pod| {
        pod.namespace().as_deref() == Some(namespace.as_str())
            && pod.labels().get("app.kubernetes.io/instance") == Some(&name)
    });
    for pod in pods {
        let role = if pod.name_any() == primary {
            ROLE_PRIMARY
        } else {
            ROLE_REPLICA
        };
        if pod.labels().get(ROLE_LABEL).map(String::as_str) == Some(role) {
            continue;
        }
        let patch = json!({ "metadata": { "labels": { ROLE_LABEL: role } } });
        api.patch(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    }
    Ok(())
}

/// Writes `status` through the status subresource unless it is what the
/// cluster already reports, and announces condition transitions as Events.
async fn write_status(
    ctx: &Context,
    cluster: &DatabaseCluster,
    status: DatabaseClusterStatus,
) -> Result<(), Error> {
    let previous = cluster.status.as_ref();
    if previous == Some(&status) {
        return Ok(());
    }
    let api = Api::<DatabaseCluster>::namespaced(
        ctx.client.clone(),
        &cluster.namespace().unwrap_or_default(),
    );
    let patch = json!({
        "apiVersion": DatabaseCluster::api_version(&()),
        "kind": DatabaseCluster::kind(&()),
        "status": status,
    });
    api.patch_status(
        &cluster.name_any(),
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    let reference = cluster.object_ref(&());
    for type_ in [READY, PROGRESSING, DEGRADED] {
        let Some(current) = status::condition(Some(&status), type_) else {
            continue;
        };
        if let Some(event) = events::on_transition(status::condition(previous, type_), current)
            && let Err(e) = ctx.recorder.publish(&event, &reference).await
        {
            // An Event is a courtesy; losing one must not fail the reconcile.
            tracing::warn!(error = %e, "could not publish an Event");
        }
    }
    Ok(())
}
