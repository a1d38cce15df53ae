//! One reconcile of a `DatabaseCluster`: validate → build → apply → status.
//! Reads come from the caches; a write happens only where the cache differs
//! from the desired state, so an unchanged cluster costs no request at all.

use std::sync::Arc;

use cairn_api::backup::v1::{Backup, BackupPhase};
use cairn_api::database::v1::{DatabaseCluster, DatabaseClusterStatus};
use cairn_api::validate;
use cairn_runtime::apply::apply;
use cairn_runtime::conditions::Time;
use cairn_runtime::events;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::api::storage::v1::StorageClass;
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
    pub roles: Store<Role>,
    pub role_bindings: Store<RoleBinding>,
    pub disruption_budgets: Store<PodDisruptionBudget>,
    pub pods: Store<Pod>,
    pub claims: Store<PersistentVolumeClaim>,
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
    if let Err((reason, message)) = bootstrap_source(&ctx, &cluster).await? {
        write_status(
            &ctx,
            &cluster,
            status::waiting(&cluster, reason, &message, &now),
        )
        .await?;
        return Err(Error::DependencyNotReady(message));
    }
    if cluster.spec.paused {
        write_status(&ctx, &cluster, status::paused(&cluster, &now)).await?;
        return Ok(Action::await_change());
    }
    let stateful_set = apply_children(&ctx, &cluster).await?;
    let primary = primary(&cluster);
    label_roles(&ctx, &cluster, &primary).await?;
    let blocked_storage = grow_storage(&ctx, &cluster).await?;
    let instances = Instances::of(Some(&stateful_set));
    let mut observed = status::observe(&cluster, instances, &primary, &now);
    if let Some(class) = blocked_storage {
        status::storage_not_expandable(&mut observed, &cluster, &class, &now);
    }
    write_status(&ctx, &cluster, observed).await?;
    Ok(Action::await_change())
}

/// Whether the Backup a new cluster restores from is there and complete;
/// otherwise the reason and message to report. Checked only until the
/// cluster has instances: afterwards the backup has done its work.
async fn bootstrap_source(
    ctx: &Context,
    cluster: &DatabaseCluster,
) -> Result<Result<(), (&'static str, String)>, Error> {
    let Some(source) = cluster
        .spec
        .bootstrap
        .as_ref()
        .and_then(|b| b.from_backup.as_ref())
    else {
        return Ok(Ok(()));
    };
    let namespace = cluster.namespace().unwrap_or_default();
    if ctx
        .caches
        .stateful_sets
        .get(&ObjectRef::new(&cluster.name_any()).within(&namespace))
        .is_some()
    {
        return Ok(Ok(()));
    }
    let backups = Api::<Backup>::namespaced(ctx.client.clone(), &namespace);
    Ok(match backups.get_opt(&source.name).await? {
        None => Err((
            status::reason::BACKUP_NOT_FOUND,
            format!(
                "spec.bootstrap.fromBackup: Backup {:?} does not exist in {namespace}",
                source.name
            ),
        )),
        Some(backup)
            if backup.status.as_ref().and_then(|s| s.phase) != Some(BackupPhase::Completed) =>
        {
            Err((
                status::reason::BACKUP_NOT_COMPLETED,
                format!(
                    "spec.bootstrap.fromBackup: Backup {:?} has not completed",
                    source.name
                ),
            ))
        }
        Some(_) => Ok(()),
    })
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
    apply_child(ctx, cluster, &caches.roles, build::instance_role(cluster)).await?;
    apply_child(
        ctx,
        cluster,
        &caches.role_bindings,
        build::instance_role_binding(cluster),
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
    let namespace = cluster.namespace().unwrap_or_default();
    let existing = caches
        .stateful_sets
        .get(&ObjectRef::new(&cluster.name_any()).within(&namespace));
    let desired = build::stateful_set(
        cluster,
        existing.as_deref().and_then(build::claim_templates),
    );
    apply_child(ctx, cluster, &caches.stateful_sets, desired).await
}

/// Grows each instance's claim to `spec.storage.size` (claims only grow; the
/// schema rejects a shrink). Returns the StorageClass that refuses expansion,
/// if one does; nothing is patched then.
async fn grow_storage(ctx: &Context, cluster: &DatabaseCluster) -> Result<Option<String>, Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let Some(wanted) = validate::parse_quantity(&cluster.spec.storage.size) else {
        return Ok(None); // the schema only admits valid quantities
    };
    let small: Vec<_> = ctx
        .caches
        .claims
        .state_filter(|claim| {
            claim.namespace().as_deref() == Some(namespace.as_str())
                && claim.labels().get("app.kubernetes.io/instance") == Some(&name)
        })
        .into_iter()
        .filter(|claim| requested_storage(claim).is_some_and(|size| size < wanted))
        .collect();
    let classes = Api::<StorageClass>::all(ctx.client.clone());
    let claims = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &namespace);
    for claim in small {
        let class = claim
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.clone())
            .unwrap_or_default();
        let expandable = classes
            .get_opt(&class)
            .await?
            .and_then(|c| c.allow_volume_expansion)
            .unwrap_or(false);
        if !expandable {
            return Ok(Some(class));
        }
        let patch = json!({ "spec": { "resources": { "requests": { "storage": cluster.spec.storage.size } } } });
        claims
            .patch(
                &claim.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
    }
    Ok(None)
}

fn requested_storage(claim: &PersistentVolumeClaim) -> Option<i128> {
    let requests = claim.spec.as_ref()?.resources.as_ref()?.requests.as_ref()?;
    validate::parse_quantity(&requests.get("storage")?.0)
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
