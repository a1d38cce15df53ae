//! A DatabaseCluster's life with the controller running as a real process
//! under its chart's RBAC: creation, scaling, storage growth, configuration
//! changes, drift repair, credentials kept, deletion; many clusters through a
//! controller restart, then an idle window of resyncs without a write.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cairn_api::backup::v1::Backup;
use cairn_api::database::v1::DatabaseCluster;
use cairn_database_controller::build::{RESTART_DIGEST_ANNOTATION, ROLE_LABEL};
use cairn_testing::{Error, TestNamespace, cluster, wait};
use futures::TryStreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

const LONG: Duration = Duration::from_secs(90);
/// Resync every 10 s (the shortest the controller takes).
const RESYNC: &[(&str, &str)] = &[("CAIRN_RESYNC_SECONDS", "10")];
/// The idle window: more than two resyncs.
const IDLE: Duration = Duration::from_secs(25);

async fn patch_spec(
    api: &Api<DatabaseCluster>,
    name: &str,
    spec: serde_json::Value,
) -> Result<(), Error> {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": spec })),
    )
    .await?;
    Ok(())
}

/// Waits until the cluster reports `ready` ready instances of its current
/// generation and `Ready=True`.
async fn until_ready(
    api: &Api<DatabaseCluster>,
    name: &str,
    ready: i32,
) -> Result<DatabaseCluster, Error> {
    wait::for_object(
        api,
        name,
        &format!("{name}: {ready} ready instances"),
        LONG,
        |c| {
            let Some(status) = &c.status else {
                return false;
            };
            status.observed_generation == c.metadata.generation
                && status.ready_instances == Some(ready)
                && wait::condition_status(c, "Ready").as_deref() == Some("True")
        },
    )
    .await
}

async fn pods(namespace: &TestNamespace, cluster: &str) -> Result<BTreeMap<String, Pod>, Error> {
    let list = namespace
        .api::<Pod>()
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={cluster}")))
        .await?;
    Ok(list.items.into_iter().map(|p| (p.name_any(), p)).collect())
}

fn owned_by(meta: &kube::api::ObjectMeta, cluster: &DatabaseCluster) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| Some(&o.uid) == cluster.meta().uid.as_ref() && o.controller == Some(true))
}

async fn secret_data(
    namespace: &TestNamespace,
    name: &str,
) -> Result<BTreeMap<String, Vec<u8>>, Error> {
    let secret = namespace.api::<Secret>().get(name).await?;
    Ok(secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect())
}

async fn passwords(
    namespace: &TestNamespace,
    cluster: &str,
) -> Result<BTreeMap<String, Vec<u8>>, Error> {
    secret_data(namespace, &format!("{cluster}-credentials")).await
}

#[tokio::test]
async fn a_cluster_is_created_scaled_grown_reconfigured_repaired_and_deleted() -> Result<(), Error>
{
    let namespace = support::namespace("lifecycle").await?;
    let account = support::install_rbac(&namespace, "lifecycle").await?;
    // A 10 s resync bounds the waits for a reconcile after a change.
    let mut controller = support::start(&namespace, "lifecycle", &account, RESYNC)?;
    let clusters = namespace.api::<DatabaseCluster>();

    // Created: Ready, Running, every child owned by it.
    support::create(&clusters, &support::database_cluster("orders", 3)).await?;
    let orders = until_ready(&clusters, "orders", 3).await?;
    let status = orders.status.clone().expect("status");
    assert_eq!(format!("{:?}", status.phase), "Some(Running)");
    assert_eq!(status.current_primary.as_deref(), Some("orders-0"));
    assert_eq!(
        status.credentials_secret.as_deref(),
        Some("orders-credentials")
    );
    let children = [
        namespace.api::<StatefulSet>().get("orders").await?.metadata,
        namespace
            .api::<ConfigMap>()
            .get("orders-config")
            .await?
            .metadata,
        namespace
            .api::<Secret>()
            .get("orders-credentials")
            .await?
            .metadata,
        namespace.api::<Service>().get("orders-rw").await?.metadata,
        namespace.api::<Service>().get("orders-ro").await?.metadata,
        namespace.api::<Service>().get("orders").await?.metadata,
        namespace
            .api::<ServiceAccount>()
            .get("orders")
            .await?
            .metadata,
        namespace
            .api::<PodDisruptionBudget>()
            .get("orders")
            .await?
            .metadata,
        namespace
            .api::<PodDisruptionBudget>()
            .get("orders-primary")
            .await?
            .metadata,
        namespace.api::<Role>().get("orders").await?.metadata,
        namespace.api::<RoleBinding>().get("orders").await?.metadata,
        namespace.api::<Secret>().get("orders-ca").await?.metadata,
        namespace
            .api::<Secret>()
            .get("orders-server")
            .await?
            .metadata,
        namespace
            .api::<ConfigMap>()
            .get("orders-ca")
            .await?
            .metadata,
    ];
    for child in &children {
        assert!(
            owned_by(child, &orders),
            "{:?} is not owned by the cluster",
            child.name
        );
    }
    let roles: BTreeMap<String, String> = pods(&namespace, "orders")
        .await?
        .into_iter()
        .map(|(name, pod)| {
            (
                name,
                pod.labels().get(ROLE_LABEL).cloned().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(roles["orders-0"], "primary");
    assert_eq!(
        (roles["orders-1"].as_str(), roles["orders-2"].as_str()),
        ("replica", "replica")
    );
    let table = cluster()
        .kubectl(&["get", "dbc", "-n", &namespace.name])
        .await?
        .stdout;
    println!("{table}");
    assert!(
        table.contains("INSTANCES   READY   PHASE     PRIMARY"),
        "{table}"
    );
    assert!(
        table
            .split_whitespace()
            .collect::<Vec<_>>()
            .windows(5)
            .any(|w| w == ["orders", "3", "3", "Running", "orders-0"]),
        "{table}"
    );
    let secrets_before = passwords(&namespace, "orders").await?;

    // Scaled through the scale subresource: up to 5, down to 1, up to 2 (the
    // highest ordinals go; the primary stays). A single instance has no
    // disruption budgets: they would allow every eviction or block every
    // drain.
    let budgets = namespace.api::<PodDisruptionBudget>();
    for (replicas, expected) in [("5", 5), ("1", 1), ("2", 2)] {
        cluster()
            .kubectl(&[
                "scale",
                "dbc/orders",
                "-n",
                &namespace.name,
                &format!("--replicas={replicas}"),
            ])
            .await?;
        until_ready(&clusters, "orders", expected).await?;
        for budget in ["orders", "orders-primary"] {
            if expected == 1 {
                wait::for_deletion(&budgets, budget, LONG).await?;
            } else {
                wait::for_object(&budgets, budget, "present", LONG, |_| true).await?;
            }
        }
    }
    wait::until("pods orders-2..4 gone", LONG, || async {
        let names: Vec<String> = pods(&namespace, "orders")
            .await
            .map_err(|e| e.to_string())?
            .into_keys()
            .collect();
        Ok((names == ["orders-0", "orders-1"])
            .then_some(())
            .ok_or(format!("{names:?}"))
            .ok())
    })
    .await?;

    // Storage grows by patching the claims; a shrink is refused by the schema.
    patch_spec(&clusters, "orders", json!({ "storage": { "size": "2Gi" } })).await?;
    let claims = namespace.api::<PersistentVolumeClaim>();
    for claim in ["data-orders-0", "data-orders-1"] {
        wait::for_object(&claims, claim, "2Gi requested", LONG, |c| {
            c.spec
                .as_ref()
                .and_then(|s| s.resources.as_ref())
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("storage"))
                .map(|q| q.0.as_str())
                == Some("2Gi")
        })
        .await?;
    }
    let shrink = patch_spec(&clusters, "orders", json!({ "storage": { "size": "1Gi" } })).await;
    let message = format!("{shrink:?}");
    assert!(message.contains("cannot shrink"), "{message}");

    // A reloadable setting restarts nothing; a restart-only one rolls the
    // pods one at a time, the replica before the primary.
    let before: BTreeMap<String, String> = pods(&namespace, "orders")
        .await?
        .into_iter()
        .map(|(n, p)| (n, p.uid().unwrap_or_default()))
        .collect();
    patch_spec(
        &clusters,
        "orders",
        json!({ "postgres": { "parameters": { "work_mem": "64MB" } } }),
    )
    .await?;
    wait::for_object(
        &namespace.api::<ConfigMap>(),
        "orders-config",
        "work_mem in postgresql.conf",
        LONG,
        |cm| {
            cm.data
                .as_ref()
                .and_then(|d| d.get("postgresql.conf"))
                .is_some_and(|c| c.contains("work_mem = '64MB'"))
        },
    )
    .await?;
    until_ready(&clusters, "orders", 2).await?;
    // Two more reconciles: at least one began with the new configuration in
    // place, so a restart it decided on would have been issued.
    let since = support::reconciles(&controller).await?;
    support::reconciled(&controller, since, 2.0, LONG).await?;
    let after: BTreeMap<String, String> = pods(&namespace, "orders")
        .await?
        .into_iter()
        .filter(|(_, p)| p.metadata.deletion_timestamp.is_none())
        .map(|(n, p)| (n, p.uid().unwrap_or_default()))
        .collect();
    assert_eq!(before, after, "a reloadable change restarts no pod");

    // The order comes from a watch: with instant pods, both can be replaced
    // between two polls of a list, which would lose it.
    let selector = watcher::Config::default().labels("app.kubernetes.io/instance=orders");
    let mut replaced = std::pin::pin!(watcher(namespace.api::<Pod>(), selector).applied_objects());
    patch_spec(
        &clusters,
        "orders",
        json!({ "postgres": { "parameters": { "shared_buffers": "256MB" } } }),
    )
    .await?;
    let mut order = Vec::new();
    let roll = async {
        while order.len() < 2 {
            let Some(pod) = replaced
                .try_next()
                .await
                .map_err(|e| Error::Setup(e.to_string()))?
            else {
                break;
            };
            let name = pod.name_any();
            if before.get(&name) != pod.uid().as_ref() && !order.contains(&name) {
                order.push(name);
            }
        }
        Ok::<_, Error>(())
    };
    if let Ok(watched) = tokio::time::timeout(LONG, roll).await {
        watched?;
    }
    println!("restart order: {order:?}");
    assert_eq!(
        order,
        ["orders-1", "orders-0"],
        "replicas roll before the primary"
    );
    let rolled = until_ready(&clusters, "orders", 2).await?;
    let digest = namespace
        .api::<StatefulSet>()
        .get("orders")
        .await?
        .spec
        .and_then(|s| s.template.metadata)
        .and_then(|m| m.annotations)
        .and_then(|a| a.get(RESTART_DIGEST_ANNOTATION).cloned());
    assert!(digest.is_some());
    let _ = rolled;

    // Drift is repaired within 10 s.
    let drift = Duration::from_secs(10);
    namespace
        .api::<Service>()
        .delete("orders-rw", &DeleteParams::default())
        .await?;
    wait::for_object(
        &namespace.api::<Service>(),
        "orders-rw",
        "orders-rw restored",
        drift,
        |s| s.metadata.deletion_timestamp.is_none(),
    )
    .await?;
    namespace
        .api::<StatefulSet>()
        .patch(
            "orders",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "replicas": 4 } })),
        )
        .await?;
    wait::for_object(
        &namespace.api::<StatefulSet>(),
        "orders",
        "replicas back to 2",
        drift,
        |s| s.spec.as_ref().and_then(|s| s.replicas) == Some(2),
    )
    .await?;
    namespace
        .api::<ConfigMap>()
        .delete("orders-config", &DeleteParams::default())
        .await?;
    wait::for_object(
        &namespace.api::<ConfigMap>(),
        "orders-config",
        "orders-config restored",
        drift,
        |c| c.metadata.deletion_timestamp.is_none(),
    )
    .await?;

    // A deleted server certificate is issued again, by the same CA that
    // clients were given.
    let ca_before = secret_data(&namespace, "orders-ca").await?;
    let server_before = secret_data(&namespace, "orders-server").await?;
    namespace
        .api::<Secret>()
        .delete("orders-server", &DeleteParams::default())
        .await?;
    let server_after = wait::until("orders-server issued again", drift, || async {
        match secret_data(&namespace, "orders-server").await {
            Ok(data) if data["tls.crt"] != server_before["tls.crt"] => Ok(Some(data)),
            Ok(_) => Err("the old certificate".to_owned()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await?;
    assert_eq!(server_after["ca.crt"], ca_before["ca.crt"]);
    assert_eq!(
        secret_data(&namespace, "orders-ca").await?,
        ca_before,
        "the CA never changes"
    );
    let published = namespace.api::<ConfigMap>().get("orders-ca").await?;
    assert_eq!(
        published
            .data
            .unwrap_or_default()
            .get("ca.crt")
            .map(String::as_bytes),
        Some(ca_before["ca.crt"].as_slice()),
        "clients get the CA, and only the CA"
    );
    assert!(ca_before.contains_key("ca.key"));

    // The passwords survive reconciles and a controller restart.
    controller.terminate()?;
    controller.wait(Duration::from_secs(30)).await?;
    let _restarted = support::start(&namespace, "lifecycle-again", &account, &[])?;
    patch_spec(
        &clusters,
        "orders",
        json!({ "postgres": { "parameters": { "work_mem": "32MB" } } }),
    )
    .await?;
    until_ready(&clusters, "orders", 2).await?;
    assert_eq!(
        passwords(&namespace, "orders").await?,
        secrets_before,
        "credentials never change"
    );

    // Deleting the cluster removes its children and keeps the data.
    clusters.delete("orders", &DeleteParams::default()).await?;
    wait::for_deletion(&namespace.api::<StatefulSet>(), "orders", LONG).await?;
    wait::for_deletion(&namespace.api::<Secret>(), "orders-credentials", LONG).await?;
    wait::for_deletion(&namespace.api::<Service>(), "orders-rw", LONG).await?;
    wait::for_deletion(&namespace.api::<ConfigMap>(), "orders-config", LONG).await?;
    let kept: Vec<String> = claims
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|c| c.name_any())
        .collect();
    assert!(kept.contains(&"data-orders-0".to_owned()), "{kept:?}");
    Ok(())
}

#[tokio::test]
async fn twenty_clusters_converge_through_a_restart_then_idle_without_writes() -> Result<(), Error>
{
    let namespace = support::namespace("many").await?;
    let account = support::install_rbac(&namespace, "many").await?;
    let first = support::start(&namespace, "many", &account, &[])?;
    let clusters = namespace.api::<DatabaseCluster>();
    let names: Vec<String> = (0..20).map(|i| format!("db-{i:02}")).collect();
    for name in &names {
        support::create(&clusters, &support::database_cluster(name, 1)).await?;
    }
    // Killed in the middle of creating them, then started again: once it
    // has made the first StatefulSet, while clusters are still not Ready.
    let sets = namespace.api::<StatefulSet>();
    wait::until("the first StatefulSet", LONG, || async {
        let made = sets
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        Ok((!made.items.is_empty()).then_some(()))
    })
    .await?;
    first.kill()?;
    let ready_at_kill = clusters
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|c| {
            c.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
        })
        .count();
    println!("clusters Ready when the controller was killed: {ready_at_kill} of 20");
    assert!(
        ready_at_kill < 20,
        "the kill came after the creation, not in its middle"
    );
    // A 10 s resync: the idle window below sees every cluster reconciled.
    let controller = support::start(&namespace, "many-again", &account, RESYNC)?;
    let started = Instant::now();
    for name in &names {
        until_ready(&clusters, name, 1).await?;
    }
    println!(
        "20 clusters Ready {} ms after the restart",
        started.elapsed().as_millis()
    );

    // Every child belongs to exactly one existing cluster.
    let uids: Vec<String> = clusters
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter_map(|c| c.uid())
        .collect();
    let owned = |meta: &kube::api::ObjectMeta| {
        meta.owner_references
            .iter()
            .flatten()
            .filter(|o| uids.contains(&o.uid))
            .count()
            == 1
    };
    let selector = ListParams::default().labels("app.kubernetes.io/managed-by=cairn");
    let sets = namespace.api::<StatefulSet>().list(&selector).await?.items;
    assert_eq!(sets.len(), 20);
    assert!(sets.iter().all(|s| owned(&s.metadata)));
    let services = namespace.api::<Service>().list(&selector).await?.items;
    assert_eq!(services.len(), 60);
    assert!(services.iter().all(|s| owned(&s.metadata)));
    let secrets = namespace.api::<Secret>().list(&selector).await?.items;
    assert_eq!(secrets.len(), 60, "credentials, CA and server certificate");
    assert!(secrets.iter().all(|s| owned(&s.metadata)));

    // Idle: every cluster reconciled again (its resync) and no write from
    // the controller's account. The window starts once the last status
    // write of the convergence is behind: a resync's worth of reconciles
    // after all were Ready.
    let since = support::reconciles(&controller).await?;
    support::reconciled(&controller, since, 20.0, LONG).await?;
    let user = support::user(&namespace, &account);
    let before_idle = support::reconciles(&controller).await?;
    let idle = support::writes_within(&user, &namespace.name, IDLE).await?;
    let idle_reconciles = support::reconciles(&controller).await? - before_idle;
    println!(
        "idle {} s with 20 clusters: {idle_reconciles} reconciles, {} writes",
        IDLE.as_secs(),
        idle.len()
    );
    assert_eq!(idle, vec![]);
    assert!(
        idle_reconciles >= 20.0,
        "every cluster reconciled in the idle window: {idle_reconciles}"
    );
    drop(controller);

    // Deleting the namespace with its clusters completes.
    let name = namespace.name.clone();
    let all = Api::<k8s_openapi::api::core::v1::Namespace>::all(namespace.client.clone());
    all.delete(&name, &DeleteParams::default()).await?;
    wait::for_deletion(&all, &name, Duration::from_secs(120)).await?;
    Ok(())
}

#[tokio::test]
async fn clusters_that_cannot_proceed_say_why() -> Result<(), Error> {
    let namespace = support::namespace("paused").await?;
    let account = support::install_rbac(&namespace, "paused").await?;
    let controller = support::start(&namespace, "paused", &account, RESYNC)?;
    let clusters = namespace.api::<DatabaseCluster>();

    // Storage on a class without volume expansion: nothing patched, a reason.
    let mut fixed = support::database_cluster("fixed", 1);
    fixed.spec.storage.storage_class_name = Some("fixed".into());
    support::create(&clusters, &fixed).await?;
    until_ready(&clusters, "fixed", 1).await?;
    patch_spec(&clusters, "fixed", json!({ "storage": { "size": "2Gi" } })).await?;
    let blocked = wait::for_object(
        &clusters,
        "fixed",
        "StorageExpansionNotSupported",
        LONG,
        |c| {
            c.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Progressing" && c.reason == "StorageExpansionNotSupported")
            })
        },
    )
    .await?;
    let message = blocked
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Progressing"))
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(message.contains("\"fixed\""), "{message}");
    let claim = namespace
        .api::<PersistentVolumeClaim>()
        .get("data-fixed-0")
        .await?;
    let requested = claim
        .spec
        .and_then(|s| s.resources)
        .and_then(|r| r.requests)
        .and_then(|r| r.get("storage").cloned());
    assert_eq!(
        requested.map(|q| q.0).as_deref(),
        Some("1Gi"),
        "not patched"
    );

    // Paused: the phase says so, a deleted child stays deleted until resumed.
    support::create(&clusters, &support::database_cluster("held", 1)).await?;
    until_ready(&clusters, "held", 1).await?;
    patch_spec(&clusters, "held", json!({ "paused": true })).await?;
    wait::for_object(&clusters, "held", "phase Paused", LONG, |c| {
        c.status
            .as_ref()
            .and_then(|s| s.phase)
            .map(|p| format!("{p:?}"))
            .as_deref()
            == Some("Paused")
    })
    .await?;
    let since = support::reconciles(&controller).await?;
    namespace
        .api::<ConfigMap>()
        .delete("held-config", &DeleteParams::default())
        .await?;
    // The deletion wakes the controller at once; three reconciles later (the
    // other cluster here resyncs every 10 s), one has seen it.
    support::reconciled(&controller, since, 3.0, LONG).await?;
    assert!(
        namespace
            .api::<ConfigMap>()
            .get_opt("held-config")
            .await?
            .is_none(),
        "a paused cluster's children are left alone"
    );
    patch_spec(&clusters, "held", json!({ "paused": false })).await?;
    wait::for_object(
        &namespace.api::<ConfigMap>(),
        "held-config",
        "held-config restored",
        LONG,
        |_| true,
    )
    .await?;
    until_ready(&clusters, "held", 1).await?;

    // A restore that cannot read its backup (no destination of its own to
    // read it from) is refused with the reason; nothing is created, and
    // initdb never runs in its place.
    let backup_crds = cairn_api::crds::for_chart("cairn-backup-controller");
    cairn_testing::crds::install(&namespace.client, &backup_crds).await?;
    let backups = namespace.api::<Backup>();
    let backup: Backup = serde_json::from_value(json!({
        "apiVersion": "backup.cairn.dev/v1", "kind": "Backup",
        "metadata": { "name": "nightly" },
        "spec": { "cluster": { "name": "held" }, "method": "physical",
                  "destination": { "s3": { "bucket": "backups", "credentialsSecret": { "name": "s3" } } } },
    }))
    .map_err(|e| Error::Setup(e.to_string()))?;
    backups.create(&PostParams::default(), &backup).await?;
    backups
        .patch_status(
            "nightly",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "phase": "Completed" } })),
        )
        .await?;
    let mut restored = support::database_cluster("restored", 1);
    restored.spec.bootstrap =
        serde_json::from_value(json!({ "fromBackup": { "name": "nightly" } }))
            .map_err(|e| Error::Setup(e.to_string()))?;
    support::create(&clusters, &restored).await?;
    let refused = support::until_condition(&clusters, "restored", "Ready", "False", LONG).await?;
    let ready = refused
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .cloned()
        .expect("Ready set");
    assert_eq!(ready.reason, "RestoreNeedsDestination");
    assert!(
        ready.message.contains("spec.backup.destination"),
        "{}",
        ready.message
    );
    let owned_by_restored = |meta: &kube::api::ObjectMeta| {
        meta.owner_references
            .iter()
            .flatten()
            .any(|o| o.name == "restored")
    };
    assert!(
        namespace
            .api::<StatefulSet>()
            .get_opt("restored")
            .await?
            .is_none(),
        "no StatefulSet for a refused restore"
    );
    for secret in namespace.api::<Secret>().list(&Default::default()).await? {
        assert!(!owned_by_restored(&secret.metadata), "no Secret either");
    }

    // With the backup in its own destination: the source recorded in the
    // status first, then the StatefulSet tells the first primary what to
    // restore and where to stop.
    backups
        .patch_status(
            "nightly",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "backupId": "nightly-0a1b2c3d",
                "location": "s3://backups/held/base/nightly-0a1b2c3d/" } })),
        )
        .await?;
    let mut copy = support::database_cluster("copy", 1);
    copy.spec.bootstrap = serde_json::from_value(json!({ "fromBackup": { "name": "nightly",
        "recoveryTarget": { "lsn": "0/3000060" } } }))
    .map_err(|e| Error::Setup(e.to_string()))?;
    copy.spec.backup = serde_json::from_value(json!({ "destination": { "s3": {
        "bucket": "backups", "credentialsSecret": { "name": "s3" } } } }))
    .map_err(|e| Error::Setup(e.to_string()))?;
    support::create(&clusters, &copy).await?;
    let recorded = wait::for_object(&clusters, "copy", "restoredFrom", LONG, |c| {
        c.status.as_ref().is_some_and(|s| s.restored_from.is_some())
    })
    .await?;
    let source = recorded
        .status
        .and_then(|s| s.restored_from)
        .expect("recorded");
    assert_eq!(
        (source.cluster.as_str(), source.backup_id.as_deref()),
        ("held", Some("nightly-0a1b2c3d"))
    );
    let set = wait::for_object(
        &namespace.api::<StatefulSet>(),
        "copy",
        "StatefulSet copy",
        LONG,
        |_| true,
    )
    .await?;
    let env: BTreeMap<String, String> = set
        .spec
        .and_then(|s| s.template.spec)
        .map(|p| p.containers[0].env.clone().unwrap_or_default())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|e| Some((e.name, e.value?)))
        .collect();
    assert_eq!(
        env.get("CAIRN_RESTORE_CLUSTER").map(String::as_str),
        Some("held")
    );
    assert_eq!(
        env.get("CAIRN_RESTORE_BACKUP_ID").map(String::as_str),
        Some("nightly-0a1b2c3d")
    );
    assert_eq!(
        env.get("CAIRN_RESTORE_TARGET_LSN").map(String::as_str),
        Some("0/3000060")
    );

    // From the bucket alone (no Backup object): the source's folder
    // recorded, the backup left for the instance to choose there.
    let mut recovered = support::database_cluster("recovered", 1);
    recovered.spec.bootstrap =
        serde_json::from_value(json!({ "fromBucket": { "cluster": "held" } }))
            .map_err(|e| Error::Setup(e.to_string()))?;
    recovered.spec.backup = copy.spec.backup.clone();
    support::create(&clusters, &recovered).await?;
    let recorded = wait::for_object(&clusters, "recovered", "restoredFrom", LONG, |c| {
        c.status.as_ref().is_some_and(|s| s.restored_from.is_some())
    })
    .await?;
    let source = recorded
        .status
        .and_then(|s| s.restored_from)
        .expect("recorded");
    assert_eq!(source.location, "s3://backups/held/");
    assert_eq!(
        (source.backup.as_deref(), source.backup_id.as_deref()),
        (None, None)
    );
    Ok(())
}
