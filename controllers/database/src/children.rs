//! Applies a cluster's desired children in one loop: each through the
//! [`Applier`](cairn_runtime::apply::Applier), so one that equals its
//! cached copy costs no request; a child no longer needed is deleted only
//! while the cluster owns it.

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use cairn_api::database::v1::DatabaseCluster;

use crate::MANAGER;
use crate::context::{Context, cached_named};
use crate::desired::{Child, Desired, Instances};
use crate::error::Error;
use cairn_runtime::apply::delete_exactly;

/// Applies every child in `desired` that differs from its cached copy, the
/// StatefulSet last; returns the StatefulSet as the API server last
/// reported it.
pub async fn apply(
    ctx: &Context,
    cluster: &DatabaseCluster,
    desired: Desired,
) -> Result<StatefulSet, Error> {
    let caches = &ctx.caches;
    for child in desired.children {
        match child {
            Child::ServiceAccount(account) => {
                apply_child(ctx, cluster, &caches.service_accounts, account).await?;
            }
            Child::Role(role) => {
                apply_child(ctx, cluster, &caches.roles, role).await?;
            }
            Child::RoleBinding(binding) => {
                apply_child(ctx, cluster, &caches.role_bindings, binding).await?;
            }
            Child::ConfigMap(config) => {
                apply_child(ctx, cluster, &caches.config_maps, config).await?;
            }
            Child::Service(service) => {
                apply_child(ctx, cluster, &caches.services, service).await?;
            }
            Child::DisruptionBudget(budget) => {
                apply_child(ctx, cluster, &caches.disruption_budgets, budget).await?;
            }
            Child::NoDisruptionBudget(name) => {
                delete_child(ctx, cluster, &caches.disruption_budgets, &name).await?;
            }
            Child::Lease(lease) => {
                apply_child(ctx, cluster, &caches.leases, lease).await?;
            }
        }
    }
    match desired.stateful_set {
        Instances::Apply(stateful_set) => {
            apply_child(ctx, cluster, &caches.stateful_sets, stateful_set).await
        }
        Instances::Replace(old) => {
            // Its deletion wakes the next reconcile, which creates the new one.
            orphan_stateful_set(ctx, &old).await?;
            Ok(old)
        }
    }
}

/// Deletes the cached child `name` that the cluster no longer needs (the
/// disruption budgets of a cluster scaled down to one instance); one that
/// another object owns is left alone.
async fn delete_child<K>(
    ctx: &Context,
    cluster: &DatabaseCluster,
    cache: &Store<K>,
    name: &str,
) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let Some(child) = cached_named(cache, cluster, name) else {
        return Ok(());
    };
    let owned = child
        .owner_references()
        .iter()
        .any(|o| Some(&o.uid) == cluster.metadata.uid.as_ref());
    if owned && child.meta().deletion_timestamp.is_none() {
        let api =
            Api::<K>::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
        delete_exactly(&api, &child.name_any(), child.uid(), None).await?;
    }
    Ok(())
}

/// Deletes a StatefulSet whose immutable fields must change, leaving its
/// pods running: the garbage collector removes their owner reference and
/// the new StatefulSet adopts them.
async fn orphan_stateful_set(ctx: &Context, old: &StatefulSet) -> Result<(), Error> {
    if old.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let name = old.name_any();
    let sets =
        Api::<StatefulSet>::namespaced(ctx.client.clone(), &old.namespace().unwrap_or_default());
    let orphan = Some(kube::api::PropagationPolicy::Orphan);
    if delete_exactly(&sets, &name, old.uid(), orphan).await? {
        tracing::info!(stateful_set = %name, "replacing the StatefulSet for its pod management policy; its pods keep running");
    }
    Ok(())
}

/// Applies `desired` unless the cache shows it as it is; returns it as
/// the API server has it.
pub(crate) async fn apply_child<K>(
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
    let (applied, _) = ctx
        .applier
        .apply(&api, MANAGER, &desired, current.as_deref())
        .await?;
    Ok(applied)
}
