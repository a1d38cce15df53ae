//! What the chaos plays on: the three controllers installed by their charts
//! (two replicas each, watching every namespace) in a namespace on the real
//! nodes, which also holds a 2-instance PostgreSQL cluster with synchronous
//! replication, a client pod writing to it, WAL archiving and a
//! BackupSchedule, and ObjectBuckets and DnsRecords in moto behind a fault
//! proxy; and a namespace on kwok's nodes with more DatabaseClusters.

use std::time::Duration;

use cairn_api::backup::v1::{Backup, BackupSchedule};
use cairn_api::cloud::v1alpha1::{DnsRecord, ObjectBucket, ProviderConfig};
use cairn_api::database::v1::{DatabaseCluster, ReplicationSpec};
use cairn_testing::faults::FaultProxy;
use cairn_testing::{TestNamespace, cluster, wait};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{ListParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::Result;
use super::invariants::Controller;
use crate::real::{backup_destination, cluster_spec, psql, start_client, start_writer};

pub const CHARTS: [&str; 3] = [
    "cairn-database-controller",
    "cairn-backup-controller",
    "cairn-cloud-controller",
];
/// The PostgreSQL cluster on the real nodes, and its read-write Service.
pub const REAL_CLUSTER: &str = "pg";
pub const REAL_CLUSTER_RW: &str = "pg-rw";
pub const SCHEDULE: &str = "every-minute";
/// Its interval: its backups turn stale two of them after the newest success.
pub const SCHEDULE_INTERVAL: Duration = Duration::from_secs(60);
pub const KWOK_CLUSTERS: [&str; 6] = ["k0", "k1", "k2", "k3", "k4", "k5"];
pub const BUCKETS: [&str; 3] = ["b0", "b1", "b2"];
pub const RECORDS: [&str; 2] = ["r0", "r1"];
pub const PROVIDER: &str = "moto";

/// One controller: its chart's Deployment, the user it writes as, and its
/// leader Lease.
#[derive(Debug, Clone)]
pub struct ControllerInstall {
    pub chart: &'static str,
    pub deployment: String,
    pub selector: String,
    pub container: String,
    pub identity: Controller,
}

pub struct Workload {
    pub real: TestNamespace,
    pub kwok: TestNamespace,
    pub controllers: Vec<ControllerInstall>,
    /// The cloud controller's way to moto.
    pub cloud: FaultProxy,
    pub zone: String,
    pub zone_id: String,
}

impl ControllerInstall {
    /// The controller's name in its metrics: `database`, `backup`, `cloud`.
    pub fn name(&self) -> &'static str {
        self.chart
            .trim_start_matches("cairn-")
            .trim_end_matches("-controller")
    }
}

impl Workload {
    pub async fn set_up() -> Result<Self> {
        let real = cluster().namespace_on_real_nodes("chaos").await?;
        let kwok = cluster().namespace("chaos-kwok").await?;
        let mut controllers = Vec::new();
        for chart in CHARTS {
            controllers.push(install(&real, chart).await?);
        }
        let ip = url_host(cluster().s3_endpoint())?;
        let cloud = FaultProxy::start_on(ip.parse()?, cluster().s3_endpoint()).await?;
        let (zone, zone_id) = hosted_zone(&real).await?;
        let workload = Self {
            real,
            kwok,
            controllers,
            cloud,
            zone,
            zone_id,
        };
        workload.create_database().await?;
        for name in KWOK_CLUSTERS {
            workload.create_kwok_cluster(name).await?;
        }
        workload.create_cloud_objects().await?;
        workload.until_all_ready(super::CONVERGENCE_BOUND).await?;
        workload.start_writing().await?;
        Ok(workload)
    }

    pub fn describe(&self) -> String {
        format!(
            "controllers in {}, PostgreSQL cluster {REAL_CLUSTER} (2 instances, synchronous) there, \
             {} kwok clusters in {}, {} buckets and {} DNS records in moto behind {}",
            self.real.name,
            KWOK_CLUSTERS.len(),
            self.kwok.name,
            BUCKETS.len(),
            RECORDS.len(),
            self.cloud.url()
        )
    }

    async fn create_database(&self) -> Result {
        let mut spec = cluster_spec(2);
        spec.replication = Some(ReplicationSpec {
            synchronous_replicas: 1,
        });
        let bucket = format!("wal-{}", self.real.name);
        spec.backup = Some(backup_destination(&self.real, &bucket, "chaos").await?);
        self.real
            .api::<DatabaseCluster>()
            .create(
                &PostParams::default(),
                &DatabaseCluster::new(REAL_CLUSTER, spec),
            )
            .await?;
        let schedule: BackupSchedule = serde_json::from_value(json!({
            "apiVersion": "backup.cairn.dev/v1", "kind": "BackupSchedule",
            "metadata": { "name": SCHEDULE },
            "spec": { "schedule": "* * * * *",
                      "template": { "spec": { "cluster": { "name": REAL_CLUSTER },
                                              "method": "physical", "deadlineSeconds": 300 } } },
        }))?;
        self.real
            .api::<BackupSchedule>()
            .create(&PostParams::default(), &schedule)
            .await?;
        Ok(())
    }

    pub async fn create_kwok_cluster(&self, name: &str) -> Result {
        let cluster: DatabaseCluster = serde_json::from_value(json!({
            "apiVersion": "database.cairn.dev/v1", "kind": "DatabaseCluster",
            "metadata": { "name": name },
            "spec": { "instances": 1, "postgres": { "version": "17" }, "storage": { "size": "1Gi" } },
        }))?;
        create(&self.kwok.api(), cluster).await
    }

    async fn create_cloud_objects(&self) -> Result {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": { "name": "moto-credentials" },
            "stringData": { "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing" },
        }))?;
        create(&self.real.api(), secret).await?;
        let config: ProviderConfig = serde_json::from_value(json!({
            "apiVersion": "cloud.cairn.dev/v1alpha1", "kind": "ProviderConfig",
            "metadata": { "name": PROVIDER },
            "spec": { "type": "aws", "region": "us-east-1", "endpoint": self.cloud.url(),
                      "credentialsSecretRef": { "name": "moto-credentials" } },
        }))?;
        create(&self.real.api(), config).await?;
        for name in BUCKETS {
            self.create_bucket(name).await?;
        }
        for name in RECORDS {
            self.create_record(name).await?;
        }
        Ok(())
    }

    pub async fn create_bucket(&self, name: &str) -> Result {
        create(&self.real.api(), bucket(name)?).await
    }

    pub async fn create_record(&self, name: &str) -> Result {
        create(&self.real.api(), self.record(name, "10.0.0.1")?).await
    }

    pub fn record(&self, name: &str, value: &str) -> Result<DnsRecord> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "cloud.cairn.dev/v1alpha1", "kind": "DnsRecord",
            "metadata": { "name": name, "annotations": { "cloud.cairn.dev/poll-seconds": "10" } },
            "spec": { "providerConfigRef": { "name": PROVIDER }, "zone": self.zone,
                      "name": format!("{name}.{}", self.zone), "type": "A", "values": [value],
                      "deletionPolicy": "Delete" },
        }))?)
    }

    /// The client pod, its table, and a write every 100 ms through the
    /// read-write Service (acknowledged writes recorded in the pod).
    async fn start_writing(&self) -> Result {
        start_client(&self.real, REAL_CLUSTER).await?;
        psql(
            &self.real,
            REAL_CLUSTER_RW,
            "CREATE TABLE IF NOT EXISTS ticks (id bigint PRIMARY KEY)",
        )
        .await?;
        start_writer(&self.real, REAL_CLUSTER_RW).await?;
        Ok(())
    }

    /// Every object of the workload that must be Ready, as `kind ns/name`
    /// and whether it is, listed now.
    pub async fn readiness(&self) -> Result<Vec<(String, bool, String)>> {
        let mut all = Vec::new();
        for ns in [&self.real, &self.kwok] {
            ready_of::<DatabaseCluster>(&ns.api(), &["Ready"], &mut all).await?;
        }
        // A managed resource stays Ready through a provider outage (its
        // cloud object is still there); it has converged once it is Synced
        // again too, and not before its controller's last write of it.
        let managed = ["Ready", "Synced"];
        ready_of::<ObjectBucket>(&self.real.api(), &managed, &mut all).await?;
        ready_of::<DnsRecord>(&self.real.api(), &managed, &mut all).await?;
        Ok(all)
    }

    async fn until_all_ready(&self, bound: Duration) -> Result {
        wait::until("the workload Ready", bound, || async {
            let all = self.readiness().await.map_err(|e| e.to_string())?;
            let waiting: Vec<String> = all
                .into_iter()
                .filter(|(_, ready, _)| !ready)
                .map(|(name, _, why)| format!("{name}: {why}"))
                .collect();
            if waiting.is_empty() {
                Ok(Some(()))
            } else {
                Err(waiting.join("; "))
            }
        })
        .await?;
        Ok(())
    }

    /// The pods of a controller, by name.
    pub async fn controller_pods(&self, controller: &ControllerInstall) -> Result<Vec<Pod>> {
        Ok(self
            .real
            .api::<Pod>()
            .list(&ListParams::default().labels(&controller.selector))
            .await?
            .items)
    }

    /// `helm uninstall` of the three releases: their cluster-wide objects
    /// (ClusterRoles and their bindings, which watch every namespace) would
    /// outlive the namespaces, and the suite's next tests share the cluster.
    /// First the objects with finalizers go, while their controllers still
    /// run to clean up (else the namespace would stay Terminating).
    pub async fn uninstall(&self) -> Result {
        delete_all::<Backup>(&self.real).await?;
        delete_all::<BackupSchedule>(&self.real).await?;
        delete_all::<ObjectBucket>(&self.real).await?;
        delete_all::<DnsRecord>(&self.real).await?;
        delete_all::<ProviderConfig>(&self.real).await?;
        for controller in &self.controllers {
            cluster()
                .helm(&[
                    "uninstall",
                    &controller.deployment,
                    "--namespace",
                    &self.real.name,
                    "--wait",
                ])
                .await?;
        }
        Ok(())
    }

    /// The pod holding a controller's leader Lease, if any.
    pub async fn leader(&self, controller: &ControllerInstall) -> Result<Option<String>> {
        let lease = self
            .real
            .api::<Lease>()
            .get_opt(&controller.identity.lease_name)
            .await?;
        Ok(lease
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty()))
    }
}

/// The controllers' resync: every object is reconciled again this often,
/// so the idle window at the end sees reconciles that write nothing.
pub const RESYNC: Duration = Duration::from_secs(10);

/// `helm install` of `chart`, watching every namespace, its images never
/// pulled; returns once both replicas are available and one leads.
async fn install(ns: &TestNamespace, chart: &'static str) -> Result<ControllerInstall> {
    let release = format!("{}-{chart}", ns.name);
    let resync = format!("runtime.resyncSeconds={}", RESYNC.as_secs());
    cluster()
        .helm_install(
            chart,
            &release,
            &ns.name,
            &["--set", "image.pullPolicy=Never", "--set", &resync],
        )
        .await?;
    let deployments = ns.api::<Deployment>();
    let deployment = wait::for_object(
        &deployments,
        &release,
        "2 available replicas",
        Duration::from_secs(120),
        |d| d.status.as_ref().and_then(|s| s.available_replicas) == Some(2),
    )
    .await?;
    let spec = deployment.spec.clone().ok_or("a Deployment without spec")?;
    let selector = spec
        .selector
        .match_labels
        .unwrap_or_default()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let pod_spec = spec.template.spec.ok_or("a pod template without spec")?;
    let container = pod_spec.containers[0].name.clone();
    let account = pod_spec.service_account_name.unwrap_or_default();
    let pods: Vec<String> = ns
        .api::<Pod>()
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    // The leader Lease: the one in this namespace a replica holds.
    let lease_name = wait::until(
        &format!("{chart} to lead"),
        Duration::from_secs(60),
        || async {
            let leases = ns
                .api::<Lease>()
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let held = leases.items.into_iter().find(|l| {
                l.spec
                    .as_ref()
                    .and_then(|s| s.holder_identity.as_ref())
                    .is_some_and(|h| pods.contains(h))
            });
            Ok::<_, String>(held.map(|l| l.name_any()))
        },
    )
    .await?;
    Ok(ControllerInstall {
        chart,
        deployment: release,
        selector,
        container,
        identity: Controller {
            user: format!("system:serviceaccount:{}:{account}", ns.name),
            lease_namespace: ns.name.clone(),
            lease_name,
        },
    })
}

/// A Route53 hosted zone in moto for this run's records.
async fn hosted_zone(ns: &TestNamespace) -> Result<(String, String)> {
    let zone = format!("{}.test", ns.name);
    let created = cairn_testing::s3::route53(cluster().s3_endpoint())
        .create_hosted_zone()
        .name(&zone)
        .caller_reference(&ns.name)
        .send()
        .await?;
    let id = created
        .hosted_zone
        .map(|z| z.id)
        .ok_or("moto made no hosted zone")?;
    Ok((zone, id.trim_start_matches("/hostedzone/").to_owned()))
}

pub fn bucket(name: &str) -> Result<ObjectBucket> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "cloud.cairn.dev/v1alpha1", "kind": "ObjectBucket",
        "metadata": { "name": name, "annotations": { "cloud.cairn.dev/poll-seconds": "10" } },
        "spec": { "providerConfigRef": { "name": PROVIDER }, "versioning": true,
                  "deletionPolicy": "Delete" },
    }))?)
}

/// Creates `object`; one that exists already is left as it is.
pub async fn create<K>(api: &Api<K>, object: K) -> Result
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Appends whether each object has every one of `true_conditions` True:
/// `(kind ns/name, converged, the reasons of those that are not)`.
async fn ready_of<K>(
    api: &Api<K>,
    true_conditions: &[&str],
    all: &mut Vec<(String, bool, String)>,
) -> Result
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    for object in api.list(&ListParams::default()).await?.items {
        let value: Value = serde_json::to_value(&object)?;
        let conditions = value["status"]["conditions"].as_array();
        let not_true: Vec<String> = true_conditions
            .iter()
            .filter_map(|kind| {
                let condition = conditions
                    .and_then(|c| c.iter().find(|c| c["type"] == *kind))
                    .unwrap_or(&Value::Null);
                (condition["status"] != "True").then(|| {
                    format!(
                        "{kind}: {} {}",
                        condition["reason"].as_str().unwrap_or("no condition"),
                        condition["message"].as_str().unwrap_or("")
                    )
                })
            })
            .collect();
        all.push((
            format!(
                "{} {}/{}",
                K::kind(&()),
                object.namespace().unwrap_or_default(),
                object.name_any()
            ),
            not_true.is_empty() && object.meta().deletion_timestamp.is_none(),
            not_true.join("; "),
        ));
    }
    Ok(())
}

fn url_host(url: &str) -> Result<String> {
    let rest = url
        .split("://")
        .nth(1)
        .ok_or("an endpoint without scheme")?;
    Ok(rest.split([':', '/']).next().unwrap_or_default().to_owned())
}

/// Deletes every `K` in `ns` and waits until they are gone (their
/// finalizers done).
async fn delete_all<K>(ns: &TestNamespace) -> Result
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
    K::DynamicType: Default,
{
    let api = ns.api::<K>();
    api.delete_collection(&Default::default(), &ListParams::default())
        .await?;
    wait::until(
        &format!("every {} gone", K::kind(&Default::default())),
        Duration::from_secs(180),
        || async {
            let left = api
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            if left.items.is_empty() {
                Ok(Some(()))
            } else {
                Err(format!("{} left", left.items.len()))
            }
        },
    )
    .await?;
    Ok(())
}
