//! Objects for the unit tests.

use std::collections::BTreeMap;

use cairn_api::database::instance::{OBSERVED_ANNOTATION, ObservedState, ROLE_LABEL};
use cairn_api::database::v1::{DatabaseCluster, DatabaseClusterStatus};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodSpec, PodStatus};
use serde_json::json;

/// DatabaseCluster `name` in namespace `shop`.
pub fn cluster(name: &str, instances: i32) -> DatabaseCluster {
    let mut cluster: DatabaseCluster = serde_json::from_value(json!({
        "apiVersion": "database.cairn.dev/v1", "kind": "DatabaseCluster",
        "metadata": { "name": name, "namespace": "shop", "uid": "uid-1" },
        "spec": { "instances": instances, "postgres": { "version": "15" },
                  "storage": { "size": "1Gi" } },
    }))
    .expect("cluster");
    cluster.status = Some(DatabaseClusterStatus::default());
    cluster
}

pub fn pod(name: &str, ready: bool, role: &str, node: &str) -> Pod {
    let mut pod = Pod::default();
    pod.metadata.name = Some(name.to_owned());
    pod.metadata.labels = Some(BTreeMap::from([(ROLE_LABEL.to_owned(), role.to_owned())]));
    pod.spec = Some(PodSpec {
        node_name: Some(node.to_owned()),
        ..PodSpec::default()
    });
    pod.status = Some(PodStatus {
        phase: Some("Running".to_owned()),
        conditions: Some(vec![PodCondition {
            type_: "Ready".to_owned(),
            status: if ready { "True" } else { "False" }.to_owned(),
            ..PodCondition::default()
        }]),
        ..PodStatus::default()
    });
    pod
}

pub fn lease(name: &str, role: &str, timeline: u32, position: &str, ready: bool) -> Lease {
    let observed = ObservedState {
        ready,
        role: Some(role.to_owned()),
        timeline: Some(timeline),
        wal_position: Some(position.to_owned()),
        received_position: Some(position.to_owned()),
        ..ObservedState::default()
    };
    let mut lease = Lease::default();
    lease.metadata.name = Some(name.to_owned());
    lease.metadata.annotations = Some(BTreeMap::from([(
        OBSERVED_ANNOTATION.to_owned(),
        serde_json::to_string(&observed).expect("json"),
    )]));
    lease.spec = Some(LeaseSpec::default());
    lease
}
