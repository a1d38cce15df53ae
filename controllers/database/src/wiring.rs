//! The controller's caches and what wakes it: one cache per child kind, each
//! named once, in [`Caches`].

use std::fmt::Debug;
use std::sync::Arc;

use cairn_api::database::v1::DatabaseCluster;
use cairn_runtime::manager::Manager;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{Node, NodeSpec, Pod, PodSpec, PodStatus};
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
    let pods = children.pods();
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
        nodes: children.nodes(&pods),
        pods,
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

    /// Nodes, for their drains: a node's change wakes the clusters with an
    /// instance on it, only when whether it drains may have changed (not at
    /// each status update).
    fn nodes(&mut self, pods: &Store<Pod>) -> Store<Node> {
        let api = self.manager.cluster_api::<Node>();
        let cache = self
            .manager
            .cache_trimmed(api, watcher::Config::default(), trim_node);
        let store = cache.store();
        let pods = pods.clone();
        self.controller = self.controller.take().map(|c| {
            c.watches_shared_stream(
                cache.trigger_on_change_of(|node: &Node| {
                    node.spec
                        .as_ref()
                        .map(|s| (s.unschedulable, format!("{:?}", s.taints)))
                }),
                move |node: Arc<Node>| clusters_on(&pods, &node.name_any()),
            )
        });
        store
    }

    /// Pods belong to the StatefulSet; their cluster is in their labels.
    fn pods(&mut self) -> Store<Pod> {
        let cache =
            self.manager
                .cache_trimmed(self.manager.api::<Pod>(), self.selector.clone(), trim_pod);
        let store = cache.store();
        self.controller = self
            .controller
            .take()
            .map(|c| c.watches_shared_stream(cache.trigger(), |pod: Arc<Pod>| cluster_of(&pod)));
        store
    }
}

/// Keeps of an instance pod what the reconcile reads: its metadata (labels,
/// annotations, owner, deletion), its node and its conditions. The rest of
/// the spec and the container statuses, most of a pod, never enter the
/// cache.
fn trim_pod(pod: &mut Pod) {
    pod.spec = pod.spec.take().map(|spec| PodSpec {
        node_name: spec.node_name,
        ..PodSpec::default()
    });
    pod.status = pod.status.take().map(|status| PodStatus {
        conditions: status.conditions,
        ..PodStatus::default()
    });
}

/// The clusters with an instance pod on `node`.
fn clusters_on(pods: &Store<Pod>, node: &str) -> Vec<ObjectRef<DatabaseCluster>> {
    let mut clusters: Vec<_> = pods
        .state()
        .iter()
        .filter(|pod| pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .filter_map(|pod| cluster_of(pod))
        .collect();
    clusters.sort_by_key(ToString::to_string);
    clusters.dedup();
    clusters
}

/// The cluster of an instance pod, from its labels.
fn cluster_of(pod: &Pod) -> Option<ObjectRef<DatabaseCluster>> {
    let namespace = pod.namespace()?;
    let cluster = pod.labels().get("app.kubernetes.io/instance")?;
    Some(ObjectRef::<DatabaseCluster>::new(cluster).within(&namespace))
}

/// Keeps of a node what a drain shows: its name, whether it is cordoned,
/// and its taints. Its status (images, conditions), most of a node, never
/// enters the cache.
fn trim_node(node: &mut Node) {
    node.metadata.labels = None;
    node.metadata.annotations = None;
    node.status = None;
    node.spec = node.spec.take().map(|spec| NodeSpec {
        unschedulable: spec.unschedulable,
        taints: spec.taints,
        ..NodeSpec::default()
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_pod_keeps_its_metadata_node_and_conditions_only() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "db-0", "labels": { "app.kubernetes.io/instance": "db" } },
            "spec": {
                "nodeName": "node-1",
                "containers": [{ "name": "postgres", "image": "cairn/postgres" }],
            },
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
                "spec": { "nodeName": "node-1", "containers": [] },
                "status": { "conditions": [{ "type": "Ready", "status": "True" }] },
            })
        );
    }

    #[test]
    fn a_cached_node_keeps_its_name_cordon_and_taints_only() {
        let mut node: Node = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "node-1", "labels": { "zone": "a" },
                          "annotations": { "node.alpha.kubernetes.io/ttl": "0" } },
            "spec": {
                "podCIDR": "10.0.1.0/24",
                "unschedulable": true,
                "taints": [{ "key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule" }],
            },
            "status": { "images": [{ "names": ["cairn/postgres"], "sizeBytes": 1 }] },
        }))
        .expect("a node");
        trim_node(&mut node);
        assert_eq!(
            serde_json::to_value(&node).expect("json"),
            serde_json::json!({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": { "name": "node-1" },
                "spec": {
                    "unschedulable": true,
                    "taints": [{ "key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule" }],
                },
            })
        );
    }

    #[test]
    fn a_nodes_change_wakes_the_clusters_with_an_instance_on_it() {
        let (pods, mut writer) = kube::runtime::reflector::store::<Pod>();
        for (name, cluster, node) in [
            ("a-0", "a", "n1"),
            ("a-1", "a", "n1"),
            ("b-0", "b", "n1"),
            ("c-0", "c", "n2"),
        ] {
            let pod: Pod = serde_json::from_value(serde_json::json!({
                "metadata": { "name": name, "namespace": "shop",
                              "labels": { "app.kubernetes.io/instance": cluster } },
                "spec": { "nodeName": node, "containers": [] },
            }))
            .expect("a pod");
            writer.apply_watcher_event(&watcher::Event::Apply(pod));
        }
        let woken: Vec<String> = clusters_on(&pods, "n1")
            .iter()
            .map(|c| c.name.clone())
            .collect();
        assert_eq!(woken, ["a", "b"], "each once, none of another node");
    }
}
