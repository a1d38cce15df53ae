//! The controller's caches and what wakes it: one cache per child kind, each
//! named once, in [`Caches`].

use std::fmt::Debug;
use std::sync::Arc;

use cairn_api::database::v1::DatabaseCluster;
use cairn_runtime::manager::Manager;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::runtime::controller::Controller;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

use crate::build;
use crate::context::Caches;

/// The caches of the clusters and their children, and the controller they
/// wake: a cluster's spec change, any change of a child it owns, any change
/// of one of its pods.
pub fn database_controller(
    manager: &mut Manager,
) -> (Controller<DatabaseCluster>, Store<DatabaseCluster>, Caches) {
    let clusters = manager.cache(manager.api::<DatabaseCluster>(), watcher::Config::default());
    let store = clusters.store();
    let mut children = Children {
        // Only what this controller made: never every Secret of the cluster.
        selector: watcher::Config::default().labels(&format!(
            "app.kubernetes.io/managed-by={},app.kubernetes.io/name={}",
            cairn_runtime::labels::MANAGED_BY,
            build::APP_NAME
        )),
        controller: Some(Controller::for_shared_stream(
            clusters.trigger_on_spec_change(),
            store.clone(),
        )),
        manager,
    };
    let caches = Caches {
        stateful_sets: children.owned(),
        services: children.owned(),
        config_maps: children.owned(),
        secrets: children.owned(),
        service_accounts: children.owned(),
        roles: children.owned(),
        role_bindings: children.owned(),
        disruption_budgets: children.owned(),
        // Every heartbeat wakes a reconcile that reads caches and writes
        // nothing unless a member's state changed.
        leases: children.owned(),
        claims: children.cached(),
        pods: children.pods(),
    };
    let controller = children.controller.take().expect("set until here");
    (controller, store, caches)
}

/// A namespaced kind the controller caches.
trait Child:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + Debug
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<K> Child for K where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

struct Children<'a> {
    manager: &'a mut Manager,
    selector: watcher::Config,
    /// Taken and given back by each builder step.
    controller: Option<Controller<DatabaseCluster>>,
}

impl Children<'_> {
    /// A cache of a kind the clusters own: a change wakes the owner.
    fn owned<K: Child>(&mut self) -> Store<K> {
        let cache = self
            .manager
            .cache(self.manager.api::<K>(), self.selector.clone());
        let store = cache.store();
        self.controller = self
            .controller
            .take()
            .map(|c| c.owns_shared_stream(cache.trigger()));
        store
    }

    /// A cache read by reconciles that wakes nothing (claims change with
    /// their pods).
    fn cached<K: Child>(&mut self) -> Store<K> {
        self.manager
            .cache(self.manager.api::<K>(), self.selector.clone())
            .without_trigger()
    }

    /// Pods belong to the StatefulSet; their cluster is in their labels.
    fn pods(&mut self) -> Store<Pod> {
        let cache =
            self.manager
                .cache_trimmed(self.manager.api::<Pod>(), self.selector.clone(), trim_pod);
        let store = cache.store();
        self.controller = self.controller.take().map(|c| {
            c.watches_shared_stream(cache.trigger(), |pod: Arc<Pod>| {
                let namespace = pod.namespace()?;
                let cluster = pod.labels().get("app.kubernetes.io/instance")?;
                Some(ObjectRef::<DatabaseCluster>::new(cluster).within(&namespace))
            })
        });
        store
    }
}

/// Keeps of an instance pod what the reconcile reads: its metadata (labels,
/// annotations, owner, deletion) and its conditions. The spec and the
/// container statuses, most of a pod, never enter the cache.
fn trim_pod(pod: &mut Pod) {
    pod.spec = None;
    pod.status = pod.status.take().map(|status| PodStatus {
        conditions: status.conditions,
        ..PodStatus::default()
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_pod_keeps_its_metadata_and_conditions_only() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "db-0", "labels": { "app.kubernetes.io/instance": "db" } },
            "spec": { "containers": [{ "name": "postgres", "image": "cairn/postgres" }] },
            "status": {
                "phase": "Running",
                "podIP": "10.0.0.7",
                "conditions": [{ "type": "Ready", "status": "True" }],
                "containerStatuses": [{
                    "name": "postgres", "image": "cairn/postgres", "imageID": "",
                    "ready": true, "restartCount": 2,
                }],
            },
        }))
        .expect("a pod");
        let metadata = pod.metadata.clone();
        trim_pod(&mut pod);
        assert_eq!(
            serde_json::to_value(&pod).expect("json"),
            serde_json::json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": metadata,
                "status": { "conditions": [{ "type": "Ready", "status": "True" }] },
            })
        );
    }
}
