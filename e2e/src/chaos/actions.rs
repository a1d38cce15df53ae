//! The faults a chaos run injects, each drawn from the seed. A fault with a
//! duration (an API server outage, a frozen leader, a stopped node, a bad
//! cloud) is started and its healing scheduled; the run goes on meanwhile,
//! so faults overlap with the edits and deletions drawn after them. At most
//! one fault of each lasting kind runs at a time (and one freeze: a frozen
//! node would hang the thawing of a frozen container).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use cairn_api::backup::v1::Backup;
use cairn_api::cloud::v1alpha1::{DnsRecord, ObjectBucket};
use cairn_api::database::v1::DatabaseCluster;
use cairn_testing::cluster;
use cairn_testing::faults::{Fault, Rule};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

use super::Result;
use super::rng::Rng;
use super::workload::{BUCKETS, KWOK_CLUSTERS, REAL_CLUSTER, RECORDS, Workload, bucket, create};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    DeleteChild,
    EditChild,
    ChangeSpec,
    DeleteAndRecreate,
    SigkillController,
    SigtermController,
    FreezeLeader,
    StopApiServer,
    KillDatabasePod,
    StopNode,
    BadCloud,
    CreateBackup,
    DeleteBackup,
}

/// Each kind and its weight: how often it is drawn.
const KINDS: [(Kind, u64); 13] = [
    (Kind::DeleteChild, 20),
    (Kind::EditChild, 10),
    (Kind::ChangeSpec, 10),
    (Kind::DeleteAndRecreate, 8),
    (Kind::SigkillController, 6),
    (Kind::SigtermController, 4),
    (Kind::FreezeLeader, 3),
    (Kind::StopApiServer, 2),
    (Kind::KillDatabasePod, 4),
    (Kind::StopNode, 2),
    (Kind::BadCloud, 5),
    (Kind::CreateBackup, 3),
    (Kind::DeleteBackup, 2),
];

/// A lasting fault's end.
#[derive(Debug, Clone)]
enum Heal {
    ApiServer,
    Node(u32),
    Container(cairn_testing::FrozenTask),
    Cloud,
}

impl Heal {
    fn slot(&self) -> &'static str {
        match self {
            Heal::ApiServer => "api-server",
            Heal::Node(_) | Heal::Container(_) => "freeze",
            Heal::Cloud => "cloud",
        }
    }

    async fn apply(&self, workload: &Workload) -> Result {
        match self {
            Heal::ApiServer => cluster().start_apiserver()?,
            Heal::Node(node) => cluster().start_node(*node)?,
            Heal::Container(task) => cluster().thaw_task(task)?,
            Heal::Cloud => workload.cloud.heal(),
        }
        Ok(())
    }
}

pub struct Chaos<'a> {
    workload: &'a Workload,
    rng: Rng,
    started: Instant,
    log: Vec<String>,
    counts: BTreeMap<Kind, (u64, u64)>,
    pending: Vec<(Instant, Heal)>,
    backups_made: u64,
}

impl<'a> Chaos<'a> {
    pub fn new(workload: &'a Workload, seed: u64) -> Self {
        Self {
            workload,
            rng: Rng::new(seed),
            started: Instant::now(),
            log: Vec::new(),
            counts: BTreeMap::new(),
            pending: Vec::new(),
            backups_made: 0,
        }
    }

    /// Heals what is due, then draws and takes one action.
    pub async fn step(&mut self) {
        self.heal_due(false).await;
        let weights: Vec<u64> = KINDS.iter().map(|(_, w)| *w).collect();
        let kind = KINDS[self.rng.weighted(&weights)].0;
        let outcome = self.take(kind).await;
        let entry = self.counts.entry(kind).or_default();
        let line = match outcome {
            Ok(what) => {
                entry.0 += 1;
                what
            }
            Err(e) => {
                entry.1 += 1;
                format!("{kind:?} not done: {e}")
            }
        };
        let at = self.started.elapsed().as_secs_f64();
        self.log.push(format!("{at:7.1} s  {line}"));
    }

    /// The pause before the next action: uniform in 0..2×mean.
    pub fn pause(&mut self, mean: Duration) -> Duration {
        Duration::from_millis(self.rng.below(2 * mean.as_millis() as u64 + 1))
    }

    /// Ends every lasting fault and brings back what was deleted and not
    /// recreated.
    pub async fn heal(&mut self) -> Result {
        self.heal_due(true).await;
        if let Some((_, heal)) = self.pending.first() {
            return Err(format!("could not heal {heal:?}").into());
        }
        let w = self.workload;
        for name in KWOK_CLUSTERS {
            w.create_kwok_cluster(name).await?;
        }
        for name in BUCKETS {
            w.create_bucket(name).await?;
        }
        for name in RECORDS {
            w.create_record(name).await?;
        }
        Ok(())
    }

    pub fn counts(&self) -> BTreeMap<Kind, (u64, u64)> {
        self.counts.clone()
    }

    pub fn log(&self) -> String {
        self.log.join("\n")
    }

    async fn heal_due(&mut self, all: bool) {
        // The API server first: healing the others needs it.
        self.pending
            .sort_by_key(|(_, heal)| !matches!(heal, Heal::ApiServer));
        let mut still = Vec::new();
        for (due, heal) in std::mem::take(&mut self.pending) {
            if !all && Instant::now() < due {
                still.push((due, heal));
                continue;
            }
            match heal.apply(self.workload).await {
                Ok(()) => self.log.push(format!(
                    "{:7.1} s  healed {heal:?}",
                    self.started.elapsed().as_secs_f64()
                )),
                Err(e) => {
                    self.log.push(format!(
                        "         healing {heal:?} failed, again later: {e}"
                    ));
                    still.push((due, heal));
                }
            }
        }
        self.pending = still;
        if all && !self.pending.is_empty() {
            // One more round: a container thaws once the API server answers.
            tokio::time::sleep(Duration::from_secs(2)).await;
            for (_, heal) in std::mem::take(&mut self.pending) {
                if heal.apply(self.workload).await.is_err() {
                    self.pending.push((Instant::now(), heal));
                }
            }
        }
    }

    fn busy(&self, slot: &str) -> bool {
        self.pending.iter().any(|(_, h)| h.slot() == slot)
    }

    fn schedule_heal(&mut self, seconds: (u64, u64), heal: Heal) -> u64 {
        let lasting = self.rng.between(seconds.0, seconds.1);
        self.pending
            .push((Instant::now() + Duration::from_secs(lasting), heal));
        lasting
    }

    async fn take(&mut self, kind: Kind) -> Result<String> {
        match kind {
            Kind::DeleteChild => self.delete_child().await,
            Kind::EditChild => self.edit_child().await,
            Kind::ChangeSpec => self.change_spec().await,
            Kind::DeleteAndRecreate => self.delete_and_recreate().await,
            Kind::SigkillController => self.signal_controller("SIGKILL").await,
            Kind::SigtermController => self.signal_controller("SIGTERM").await,
            Kind::FreezeLeader => self.freeze_leader().await,
            Kind::StopApiServer => self.stop_apiserver(),
            Kind::KillDatabasePod => self.kill_database_pod().await,
            Kind::StopNode => self.stop_node(),
            Kind::BadCloud => Ok(self.bad_cloud()),
            Kind::CreateBackup => self.create_backup().await,
            Kind::DeleteBackup => self.delete_backup().await,
        }
    }

    /// A DatabaseCluster to act on: most often one on kwok.
    fn some_cluster(&mut self) -> (&'a kube::Client, String, String) {
        let w = self.workload;
        if self.rng.chance(25) {
            (&w.real.client, w.real.name.clone(), REAL_CLUSTER.to_owned())
        } else {
            let name = self.rng.pick(&KWOK_CLUSTERS).copied().unwrap_or("k0");
            (&w.kwok.client, w.kwok.name.clone(), name.to_owned())
        }
    }

    async fn delete_child(&mut self) -> Result<String> {
        let (client, ns, name) = self.some_cluster();
        let kinds = deletable_kinds();
        let resource = self.rng.pick(&kinds).cloned().ok_or("no kinds")?;
        let api = Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &resource);
        let children = api
            .list_metadata(
                &ListParams::default().labels(&format!("app.kubernetes.io/instance={name}")),
            )
            .await?
            .items;
        // The application's password stays: the writer logged in with it.
        let children: Vec<String> = children
            .iter()
            .filter(|c| {
                c.labels()
                    .get("app.kubernetes.io/component")
                    .map(String::as_str)
                    != Some("credentials")
            })
            .map(|c| c.name_any())
            .collect();
        let child = self
            .rng
            .pick(&children)
            .cloned()
            .ok_or_else(|| format!("{name} has no {}", resource.kind))?;
        api.delete(&child, &DeleteParams::default()).await?;
        Ok(format!("deleted {} {ns}/{child}", resource.kind))
    }

    async fn edit_child(&mut self) -> Result<String> {
        let (client, ns, name) = self.some_cluster();
        let merge = |value| Patch::Merge(value);
        let params = PatchParams::default();
        match self.rng.below(3) {
            0 if name != REAL_CLUSTER => {
                Api::<StatefulSet>::namespaced(client.clone(), &ns)
                    .patch(&name, &params, &merge(json!({ "spec": { "replicas": 0 } })))
                    .await?;
                Ok(format!("scaled StatefulSet {ns}/{name} to 0"))
            }
            1 => {
                let services = Api::<Service>::namespaced(client.clone(), &ns);
                let list = services
                    .list_metadata(
                        &ListParams::default()
                            .labels(&format!("app.kubernetes.io/instance={name}")),
                    )
                    .await?;
                let names: Vec<String> = list.items.iter().map(|s| s.name_any()).collect();
                let service = self.rng.pick(&names).cloned().ok_or("no Service")?;
                let patch =
                    json!({ "spec": { "selector": { "app.kubernetes.io/instance": "chaos" } } });
                services.patch(&service, &params, &merge(patch)).await?;
                Ok(format!("pointed Service {ns}/{service} elsewhere"))
            }
            _ => {
                let maps = Api::<ConfigMap>::namespaced(client.clone(), &ns);
                let list = maps
                    .list(
                        &ListParams::default()
                            .labels(&format!("app.kubernetes.io/instance={name}")),
                    )
                    .await?;
                let map = self.rng.pick(&list.items).cloned().ok_or("no ConfigMap")?;
                let key = map
                    .data
                    .as_ref()
                    .and_then(|d| d.keys().next().cloned())
                    .ok_or("an empty ConfigMap")?;
                let patch = json!({ "data": { key.clone(): "edited by the chaos run" } });
                maps.patch(&map.name_any(), &params, &merge(patch)).await?;
                Ok(format!(
                    "overwrote {key} of ConfigMap {ns}/{}",
                    map.name_any()
                ))
            }
        }
    }

    async fn change_spec(&mut self) -> Result<String> {
        let w = self.workload;
        let params = PatchParams::default();
        match self.rng.below(4) {
            0 => {
                let name = self.rng.pick(&KWOK_CLUSTERS).copied().unwrap_or("k0");
                let instances = self.rng.between(1, 2);
                w.kwok
                    .api::<DatabaseCluster>()
                    .patch(
                        name,
                        &params,
                        &Patch::Merge(json!({ "spec": { "instances": instances } })),
                    )
                    .await?;
                Ok(format!("set {name} to {instances} instances"))
            }
            1 => {
                let mb = self.rng.between(4, 64);
                w.real
                    .api::<DatabaseCluster>()
                    .patch(
                        REAL_CLUSTER,
                        &params,
                        &Patch::Merge(json!({ "spec": { "postgres": { "parameters": { "work_mem": format!("{mb}MB") } } } })),
                    )
                    .await?;
                Ok(format!("set {REAL_CLUSTER}'s work_mem to {mb}MB"))
            }
            2 => {
                let name = self.rng.pick(&BUCKETS).copied().unwrap_or("b0");
                let on = self.rng.chance(50);
                w.real
                    .api::<ObjectBucket>()
                    .patch(
                        name,
                        &params,
                        &Patch::Merge(json!({ "spec": { "versioning": on } })),
                    )
                    .await?;
                Ok(format!("set bucket {name}'s versioning to {on}"))
            }
            _ => {
                let name = self.rng.pick(&RECORDS).copied().unwrap_or("r0");
                let value = format!("10.0.0.{}", self.rng.between(1, 250));
                w.real
                    .api::<DnsRecord>()
                    .patch(
                        name,
                        &params,
                        &Patch::Merge(json!({ "spec": { "values": [value] } })),
                    )
                    .await?;
                Ok(format!("pointed record {name} at {value}"))
            }
        }
    }

    async fn delete_and_recreate(&mut self) -> Result<String> {
        let w = self.workload;
        match self.rng.below(3) {
            0 => {
                let name = self.rng.pick(&KWOK_CLUSTERS).copied().unwrap_or("k0");
                delete_until_gone(&w.kwok.api::<DatabaseCluster>(), name).await?;
                w.create_kwok_cluster(name).await?;
                Ok(format!("deleted and recreated DatabaseCluster {name}"))
            }
            1 => {
                let name = self.rng.pick(&BUCKETS).copied().unwrap_or("b0");
                delete_until_gone(&w.real.api::<ObjectBucket>(), name).await?;
                create(&w.real.api(), bucket(name)?).await?;
                Ok(format!("deleted and recreated ObjectBucket {name}"))
            }
            _ => {
                let name = self.rng.pick(&RECORDS).copied().unwrap_or("r0");
                delete_until_gone(&w.real.api::<DnsRecord>(), name).await?;
                w.create_record(name).await?;
                Ok(format!("deleted and recreated DnsRecord {name}"))
            }
        }
    }

    /// A replica of a random controller: its leader half the time.
    async fn some_controller_pod(&mut self) -> Result<(String, String, String)> {
        let w = self.workload;
        let controller = self.rng.pick(&w.controllers).ok_or("no controllers")?;
        let leader = w.leader(controller).await?;
        let pods: Vec<String> = w
            .controller_pods(controller)
            .await?
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .map(|p| p.name_any())
            .collect();
        let pod = match leader {
            Some(leader) if self.rng.chance(50) && pods.contains(&leader) => leader,
            _ => self.rng.pick(&pods).cloned().ok_or("no running replica")?,
        };
        Ok((
            controller.chart.to_owned(),
            pod,
            controller.container.clone(),
        ))
    }

    async fn signal_controller(&mut self, signal: &str) -> Result<String> {
        let (chart, pod, container) = self.some_controller_pod().await?;
        cluster().signal_container(&self.workload.real.name, &pod, &container, signal)?;
        Ok(format!("{signal} to {chart} replica {pod}"))
    }

    async fn freeze_leader(&mut self) -> Result<String> {
        if self.busy("freeze") {
            return Err("a freeze is on".into());
        }
        let w = self.workload;
        let controller = self
            .rng
            .pick(&w.controllers)
            .ok_or("no controllers")?
            .clone();
        let leader = w.leader(&controller).await?.ok_or("no leader")?;
        let task = cluster().freeze_container(&w.real.name, &leader, &controller.container)?;
        let seconds = self.schedule_heal((20, 35), Heal::Container(task));
        Ok(format!(
            "froze {} leader {leader} for {seconds} s",
            controller.chart
        ))
    }

    fn stop_apiserver(&mut self) -> Result<String> {
        if self.busy("api-server") {
            return Err("the API server is down already".into());
        }
        cluster().stop_apiserver()?;
        let seconds = self.schedule_heal((5, 30), Heal::ApiServer);
        Ok(format!("stopped the API server for {seconds} s"))
    }

    async fn kill_database_pod(&mut self) -> Result<String> {
        let w = self.workload;
        let pods: Vec<Pod> = w
            .real
            .api::<Pod>()
            .list(&ListParams::default().labels(&format!(
                "app.kubernetes.io/instance={REAL_CLUSTER},app.kubernetes.io/component=database"
            )))
            .await?
            .items;
        let pod = self.rng.pick(&pods).cloned().ok_or("no instance pod")?;
        let name = pod.name_any();
        if self.rng.chance(50) {
            w.real
                .api::<Pod>()
                .delete(&name, &DeleteParams::default())
                .await?;
            Ok(format!("deleted instance pod {name}"))
        } else {
            let container = pod
                .spec
                .as_ref()
                .map(|s| s.containers[0].name.clone())
                .ok_or("a pod without spec")?;
            cluster().kill_container(&w.real.name, &name, &container)?;
            Ok(format!("SIGKILL to instance pod {name}"))
        }
    }

    fn stop_node(&mut self) -> Result<String> {
        if self.busy("freeze") {
            return Err("a freeze is on".into());
        }
        let node = self.rng.between(1, 3) as u32;
        cluster().stop_node(node)?;
        let seconds = self.schedule_heal((10, 30), Heal::Node(node));
        Ok(format!("stopped real node {node} for {seconds} s"))
    }

    fn bad_cloud(&mut self) -> String {
        if self.busy("cloud") {
            return "the cloud is bad already".to_owned();
        }
        let (fault, what) = match self.rng.below(3) {
            0 => {
                let delay = Duration::from_millis(self.rng.between(1000, 5000));
                (
                    Fault::Slow(delay),
                    format!("slow ({} ms a request)", delay.as_millis()),
                )
            }
            1 => (Fault::Throttle, "throttling".to_owned()),
            _ => (Fault::Unreachable, "unreachable".to_owned()),
        };
        self.workload.cloud.inject(Rule::always(fault));
        let seconds = self.schedule_heal((15, 45), Heal::Cloud);
        format!("made the cloud {what} for {seconds} s")
    }

    async fn create_backup(&mut self) -> Result<String> {
        self.backups_made += 1;
        let name = format!("manual-{}-{}", self.rng.below(1_000_000), self.backups_made);
        let backup: Backup = serde_json::from_value(json!({
            "apiVersion": "backup.cairn.dev/v1", "kind": "Backup",
            "metadata": { "name": name },
            "spec": { "cluster": { "name": REAL_CLUSTER }, "method": "physical",
                      "deadlineSeconds": 300, "deletionPolicy": "Delete" },
        }))?;
        create(&self.workload.real.api(), backup).await?;
        Ok(format!("asked for Backup {name}"))
    }

    async fn delete_backup(&mut self) -> Result<String> {
        let backups = self.workload.real.api::<Backup>();
        let names: Vec<String> = backups
            .list_metadata(&ListParams::default())
            .await?
            .items
            .iter()
            .map(|b| b.name_any())
            .collect();
        let name = self.rng.pick(&names).cloned().ok_or("no Backup")?;
        backups.delete(&name, &DeleteParams::default()).await?;
        Ok(format!("deleted Backup {name}"))
    }
}

/// The kinds of child a chaos run deletes (and the observer lists, with
/// more).
pub fn deletable_kinds() -> Vec<ApiResource> {
    vec![
        ApiResource::erase::<Service>(&()),
        ApiResource::erase::<ConfigMap>(&()),
        ApiResource::erase::<StatefulSet>(&()),
        ApiResource::erase::<Secret>(&()),
        ApiResource::erase::<PodDisruptionBudget>(&()),
        ApiResource::erase::<ServiceAccount>(&()),
        ApiResource::erase::<Lease>(&()),
        ApiResource::erase::<Pod>(&()),
    ]
}

/// Deletes `name` and waits (at most a minute) until it is gone, so that a
/// new object of the same name is a new object.
async fn delete_until_gone<K>(api: &Api<K>, name: &str) -> Result
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    cairn_testing::wait::for_deletion(api, name, Duration::from_secs(60)).await?;
    Ok(())
}

/// Actions per kind: taken, and drawn but not possible then (the target
/// missing, the API server down, a fault of that kind already on).
pub fn table(counts: &BTreeMap<Kind, (u64, u64)>) -> String {
    let mut out = format!("{:<20} {:>6} {:>9}\n", "action", "taken", "not done");
    let (mut done, mut failed) = (0, 0);
    for (kind, (d, f)) in counts {
        let _ = writeln!(out, "{:<20} {d:>6} {f:>9}", format!("{kind:?}"));
        done += d;
        failed += f;
    }
    let _ = writeln!(out, "{:<20} {done:>6} {failed:>9}", "all");
    out
}
