//! Smoke tests of the local control plane itself: every later suite relies on
//! these behaviours of the real components (scheduling onto kwok nodes, garbage
//! collection, volume provisioning, RBAC, CEL validation, the fake S3).

use std::time::Duration;

use cairn_testing::{cluster, wait};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::core::GroupVersionKind;
use kube::{Api, ResourceExt};
use serde_json::json;

type Result = std::result::Result<(), Box<dyn std::error::Error>>;

const TIMEOUT: Duration = Duration::from_secs(60);

fn from_json<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).expect("test manifest must deserialize")
}

#[tokio::test]
async fn three_ready_nodes_in_distinct_zones() -> Result {
    let client = cluster().admin_client().await?;
    let nodes = Api::<Node>::all(client)
        .list(&ListParams::default())
        .await?;
    let mut zones: Vec<_> = nodes
        .items
        .iter()
        .filter(|n| wait::condition_status(n, "Ready").as_deref() == Some("True"))
        .filter_map(|n| n.labels().get("topology.kubernetes.io/zone").cloned())
        .collect();
    zones.sort();
    zones.dedup();
    assert!(zones.len() >= 3, "ready nodes span only zones {zones:?}");
    Ok(())
}

/// A Deployment of `replicas` pause containers, labelled `app: <name>`.
fn pause_deployment(name: &str, replicas: i32) -> Deployment {
    from_json(json!({
        "metadata": { "name": name },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": { "containers": [{ "name": name, "image": "registry.k8s.io/pause:3.10" }] }
            }
        }
    }))
}

/// A test that panics keeps its namespace for inspection, but stops its
/// Deployments (the controllers a test installs from a chart): a cluster-wide
/// controller of a later test would reconcile the same objects beside them.
#[tokio::test]
async fn a_panicking_tests_namespace_is_kept_with_its_deployments_stopped() -> Result {
    let ns = cluster().namespace("smoke-kept").await?;
    let name = ns.name.clone();
    ns.api::<Deployment>()
        .create(&PostParams::default(), &pause_deployment("controller", 2))
        .await?;
    let unwound = std::thread::spawn(move || {
        let _held = ns;
        panic!("a test failing while it holds its namespace");
    })
    .join();
    assert!(unwound.is_err());
    let client = cluster().admin_client().await?;
    let kept = Api::<Deployment>::namespaced(client.clone(), &name)
        .get("controller")
        .await?;
    assert_eq!(kept.spec.and_then(|s| s.replicas), Some(0));
    Api::<Namespace>::all(client)
        .delete(&name, &DeleteParams::background())
        .await?;
    Ok(())
}

#[tokio::test]
async fn deployment_scales_to_ready_pods_and_is_garbage_collected() -> Result {
    let ns = cluster().namespace("smoke-deploy").await?;
    let deployments = ns.api::<Deployment>();
    deployments
        .create(&PostParams::default(), &pause_deployment("web", 3))
        .await?;
    wait::for_object(
        &deployments,
        "web",
        "to have 3 ready replicas",
        TIMEOUT,
        |d| d.status.as_ref().and_then(|s| s.ready_replicas) == Some(3),
    )
    .await?;
    let pods = ns.api::<Pod>();
    let selector = ListParams::default().labels("app=web");
    let running = pods.list(&selector).await?.items;
    assert_eq!(running.len(), 3);
    assert!(
        running
            .iter()
            .all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
    );

    let replica_sets = ns.api::<ReplicaSet>();
    let owned = replica_sets.list(&selector).await?.items;
    assert_eq!(owned.len(), 1);
    assert_eq!(owned[0].owner_references()[0].name, "web");

    // Background propagation: the garbage collector removes the dependants.
    deployments
        .delete("web", &DeleteParams::background())
        .await?;
    wait::until(
        "the ReplicaSet and pods of web to be collected",
        TIMEOUT,
        || async {
            let left = replica_sets
                .list(&selector)
                .await
                .map_err(|e| e.to_string())?
                .items
                .len()
                + pods
                    .list(&selector)
                    .await
                    .map_err(|e| e.to_string())?
                    .items
                    .len();
            match left {
                0 => Ok(Some(())),
                n => Err(format!("{n} ReplicaSets and pods left")),
            }
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn statefulset_claims_are_bound_and_pods_ready() -> Result {
    let ns = cluster().namespace("smoke-sts").await?;
    let statefulsets = ns.api::<StatefulSet>();
    let statefulset: StatefulSet = from_json(json!({
        "metadata": { "name": "db" },
        "spec": {
            "replicas": 2,
            "serviceName": "db",
            "selector": { "matchLabels": { "app": "db" } },
            "template": {
                "metadata": { "labels": { "app": "db" } },
                "spec": { "containers": [{
                    "name": "db",
                    "image": "registry.k8s.io/pause:3.10",
                    "volumeMounts": [{ "name": "data", "mountPath": "/data" }]
                }] }
            },
            "volumeClaimTemplates": [{
                "metadata": { "name": "data" },
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": { "requests": { "storage": "1Gi" } }
                }
            }]
        }
    }));
    statefulsets
        .create(&PostParams::default(), &statefulset)
        .await?;
    wait::for_object(
        &statefulsets,
        "db",
        "to have 2 ready replicas",
        TIMEOUT,
        |s| s.status.as_ref().and_then(|s| s.ready_replicas) == Some(2),
    )
    .await?;
    let claims = ns.api::<PersistentVolumeClaim>();
    for name in ["data-db-0", "data-db-1"] {
        let claim = wait::for_object(&claims, name, "to be Bound", TIMEOUT, |c| {
            c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
        })
        .await?;
        let spec = claim.spec.unwrap_or_default();
        assert_eq!(spec.storage_class_name.as_deref(), Some("standard"));
        assert!(spec.volume_name.is_some(), "{name} names no volume");
    }
    Ok(())
}

#[tokio::test]
async fn rbac_denies_a_service_account_until_a_role_allows_it() -> Result {
    let ns = cluster().namespace("smoke-rbac").await?;
    ns.create_service_account("reader").await?;
    let as_reader = ns.client_as_service_account("reader").await?;
    let secrets = Api::<Secret>::namespaced(as_reader, &ns.name);

    match secrets.list(&ListParams::default()).await {
        Err(kube::Error::Api(status)) if status.code == 403 => {}
        other => panic!("expected 403 Forbidden without a Role, got {other:?}"),
    }

    ns.grant("reader", "secrets", &["list"]).await?;
    // The authorizer's informer sees the binding a moment after it is written.
    wait::until(
        "the reader to list secrets",
        Duration::from_secs(10),
        || async {
            secrets
                .list(&ListParams::default())
                .await
                .map(Some)
                .map_err(|e| e.to_string())
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn cel_rule_rejects_changing_an_immutable_field() -> Result {
    let ns = cluster().namespace("smoke-cel").await?;
    let crd: CustomResourceDefinition = from_json(json!({
        "metadata": { "name": "widgets.smoke.cairn.dev" },
        "spec": {
            "group": "smoke.cairn.dev",
            "names": { "kind": "Widget", "plural": "widgets", "singular": "widget" },
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "properties": { "spec": {
                        "type": "object",
                        "properties": {
                            "size": {
                                "type": "string",
                                "x-kubernetes-validations": [
                                    { "rule": "self == oldSelf", "message": "size is immutable" }
                                ]
                            },
                            "color": { "type": "string" }
                        }
                    } }
                } }
            }]
        }
    }));
    cairn_testing::crds::install(&ns.client, &[crd]).await?;

    let gvk = GroupVersionKind::gvk("smoke.cairn.dev", "v1", "Widget");
    let widgets: Api<DynamicObject> =
        Api::namespaced_with(ns.client.clone(), &ns.name, &ApiResource::from_gvk(&gvk));
    let mut widget: DynamicObject = from_json(json!({
        "apiVersion": "smoke.cairn.dev/v1", "kind": "Widget",
        "metadata": { "name": "w" },
        "spec": { "size": "small", "color": "red" }
    }));
    widget = widgets.create(&PostParams::default(), &widget).await?;

    widget.data["spec"]["color"] = json!("blue");
    widget = widgets
        .replace("w", &PostParams::default(), &widget)
        .await?;

    widget.data["spec"]["size"] = json!("large");
    match widgets.replace("w", &PostParams::default(), &widget).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{status:?}");
            assert!(
                status.message.contains("size is immutable"),
                "{}",
                status.message
            );
        }
        other => panic!("changing spec.size must be rejected, got {other:?}"),
    }
    let stored = widgets.get("w").await?;
    assert_eq!(stored.data["spec"]["size"], "small");
    assert_eq!(stored.data["spec"]["color"], "blue");
    Ok(())
}

#[tokio::test]
async fn s3_bucket_is_created_and_deleted_on_moto() -> Result {
    let s3 = cairn_testing::s3::client(cluster().s3_endpoint());
    let bucket = format!("cairn-smoke-{}", std::process::id());
    s3.create_bucket().bucket(&bucket).send().await?;
    let names = |list: aws_sdk_s3::operation::list_buckets::ListBucketsOutput| -> Vec<String> {
        list.buckets()
            .iter()
            .filter_map(|b| b.name().map(str::to_owned))
            .collect()
    };
    assert!(names(s3.list_buckets().send().await?).contains(&bucket));
    s3.head_bucket().bucket(&bucket).send().await?;

    s3.delete_bucket().bucket(&bucket).send().await?;
    assert!(!names(s3.list_buckets().send().await?).contains(&bucket));
    assert!(s3.head_bucket().bucket(&bucket).send().await.is_err());
    Ok(())
}

#[tokio::test]
async fn audit_log_attributes_writes_to_the_service_account_that_made_them() -> Result {
    let ns = cluster().namespace("smoke-audit").await?;
    ns.create_service_account("writer").await?;
    ns.grant("writer", "configmaps", &["create", "list"])
        .await?;

    let as_writer = ns.client_as_service_account("writer").await?;
    let config_maps = Api::<ConfigMap>::namespaced(as_writer, &ns.name);
    let config_map: ConfigMap = from_json(json!({ "metadata": { "name": "audited" } }));
    // A read first: it must not appear in the log, which records writes only.
    wait::until(
        "the writer to list ConfigMaps",
        Duration::from_secs(10),
        || async {
            config_maps
                .list(&ListParams::default())
                .await
                .map(Some)
                .map_err(|e| e.to_string())
        },
    )
    .await?;
    config_maps
        .create(&PostParams::default(), &config_map)
        .await?;

    let user = format!("system:serviceaccount:{}:writer", ns.name);
    let log = cluster().audit_log();
    let writes = wait::until(
        "the audit log to record the create",
        Duration::from_secs(10),
        || async {
            let writes: Vec<_> = cairn_testing::audit::write_requests(&log)
                .map_err(|e| e.to_string())?
                .into_iter()
                .filter(|w| w.user == user)
                .collect();
            match writes.iter().any(|w| w.code == Some(201)) {
                true => Ok(Some(writes)),
                false => Err(format!("{} writes by {user}", writes.len())),
            }
        },
    )
    .await?;
    let created: Vec<_> = writes.iter().filter(|w| w.code == Some(201)).collect();
    assert_eq!(created.len(), 1, "{writes:?}");
    assert_eq!(created[0].verb, "create");
    assert_eq!(created[0].resource, "configmaps");
    assert_eq!(created[0].name.as_deref(), Some("audited"));
    // The list made before the create is not there: reads are not audited.
    assert!(writes.iter().all(|w| w.verb == "create"), "{writes:?}");
    Ok(())
}
