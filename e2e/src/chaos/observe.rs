//! What the chaos run looks at: the objects in its namespaces, the buckets
//! and records in moto, the instances of the PostgreSQL cluster, the audit
//! log and the controllers' metrics, fed to the [`invariants`] checks.
//! A sample that cannot be taken (the API server is down) is skipped; the
//! audit log misses nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use cairn_api::backup::v1::{Backup, BackupPhase, BackupSchedule, SLOT_ANNOTATION};
use cairn_api::cloud::v1alpha1::{DnsRecord, ObjectBucket, ProviderConfig};
use cairn_api::database::v1::DatabaseCluster;
use cairn_testing::audit::{Tail, WriteRequest};
use cairn_testing::process::sample;
use cairn_testing::{TestNamespace, cluster};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};

use super::invariants::{self, Child, External, Grace, Invariant, SlotBackup, Tally};
use super::workload::{
    REAL_CLUSTER, REAL_CLUSTER_RW, RESYNC, SCHEDULE, SCHEDULE_INTERVAL, Workload,
};
use super::{CONVERGENCE_BOUND, Result};
use crate::real::{as_superuser, rows_present, stop_writer, until_acknowledged_after, writes};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// How long garbage collection (or a finalizer's cleanup) may take before a
/// child without a live owner counts: longer than an API server outage.
const ORPHAN_GRACE: Duration = Duration::from_secs(90);
/// How often the objects are sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// The most writes of one object by the controllers within a minute.
const WRITES_PER_MINUTE: usize = 40;
/// A controller's resident memory after the churn, against before it.
const MEMORY_FACTOR: f64 = 2.0;
/// The idle window at the end: two resyncs and a margin, so that every
/// object is reconciled at least twice in it.
const IDLE_WINDOW: Duration = Duration::from_secs(2 * RESYNC.as_secs() + 5);
/// The longest the idle window goes on for a controller that has not
/// reconciled yet (one backing off after the faults).
const IDLE_WINDOW_LONGEST: Duration = Duration::from_secs(120);

pub struct Observer {
    audit: Tail,
    writes: Vec<WriteRequest>,
    census: invariants::Census,
    grace: Grace,
    memory_before: BTreeMap<&'static str, f64>,
    last_sample: Option<Instant>,
    pub skipped_samples: u64,
}

impl Observer {
    pub async fn new(workload: &Workload) -> Result<Self> {
        let children = list_children(workload).await?.0;
        Ok(Self {
            audit: Tail::from_now(&cluster().audit_log())?,
            writes: Vec::new(),
            census: invariants::census(&children),
            grace: Grace::default(),
            memory_before: memory_of_every_controller(workload).await?,
            last_sample: None,
            skipped_samples: 0,
        })
    }

    /// Samples the objects, if the last sample is old enough.
    pub async fn sample(&mut self, workload: &Workload, tally: &mut Tally) {
        if self
            .last_sample
            .is_some_and(|at| at.elapsed() < SAMPLE_EVERY)
        {
            return;
        }
        self.last_sample = Some(Instant::now());
        if let Err(e) = self.sample_now(workload, tally).await {
            self.skipped_samples += 1;
            eprintln!("chaos: sample skipped: {e}");
        }
    }

    async fn sample_now(&mut self, workload: &Workload, tally: &mut Tally) -> Result {
        let (children, live) = list_children(workload).await?;
        let orphans = invariants::children_without_live_owner(&children, &live);
        let now = Instant::now();
        let overdue = self
            .grace
            .overdue(Invariant::ChildHasLiveOwner, orphans, ORPHAN_GRACE, now);
        tally.record(Invariant::ChildHasLiveOwner, overdue);
        tally.record(
            Invariant::NoDuplicateChild,
            invariants::duplicate_children(&children, &self.census),
        );
        tally.record(
            Invariant::OneBackupPerSlot,
            invariants::backups_sharing_a_slot(&slot_backups(&workload.real).await?),
        );
        let (externals, cloud_objects) = externals(workload).await?;
        tally.record(
            Invariant::OneExternalResourcePerObject,
            invariants::objects_with_several_externals(&externals, &cloud_objects),
        );
        let unowned = invariants::externals_without_live_owner(&externals, &cloud_objects);
        let overdue =
            self.grace
                .overdue(Invariant::ExternalResourceOwned, unowned, ORPHAN_GRACE, now);
        tally.record(Invariant::ExternalResourceOwned, overdue);
        tally.record(Invariant::OnePrimary, primaries(workload).await?);
        Ok(())
    }

    /// Waits until every object is Ready (a managed resource Synced too) and
    /// the database acknowledges writes again; the slowest object and its
    /// time.
    pub async fn converge(
        &mut self,
        workload: &Workload,
        tally: &mut Tally,
    ) -> Result<(Duration, String)> {
        let started = Instant::now();
        // A status read before the controllers' caches resumed is what they
        // wrote before the faults: not a convergence.
        if let Err(e) = until_watches_resumed(workload).await {
            eprintln!("chaos: {e}");
        }
        let mut ready_at: BTreeMap<String, Duration> = BTreeMap::new();
        let mut waiting = Vec::new();
        while started.elapsed() < CONVERGENCE_BOUND {
            if let Err(e) = ready_kwok_pods(&workload.kwok).await {
                eprintln!("chaos: kwok pods not readied: {e}");
            }
            match workload.readiness().await {
                Ok(all) => {
                    waiting.clear();
                    for (name, ready, why) in all {
                        if ready {
                            ready_at.entry(name).or_insert(started.elapsed());
                        } else {
                            ready_at.remove(&name);
                            waiting.push(format!(
                                "{name} not converged after {:.0} s: {why}",
                                CONVERGENCE_BOUND.as_secs_f64()
                            ));
                        }
                    }
                    if waiting.is_empty() {
                        break;
                    }
                }
                Err(e) => waiting = vec![format!("cannot list the workload: {e}")],
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        if !waiting.is_empty() {
            match unready_pods_and_nodes(&workload.kwok).await {
                Ok(report) => eprintln!("chaos: not converged; kwok pods and nodes:\n{report}"),
                Err(e) => eprintln!("chaos: not converged; kwok pods not listed: {e}"),
            }
        }
        match until_acknowledged_after(&workload.real, 5).await {
            // Ready is not the end for the database: its writer must be
            // acknowledged again too, and may be the slowest.
            Ok(()) => {
                let writes = format!("{REAL_CLUSTER}'s writes acknowledged again");
                ready_at.insert(writes, started.elapsed());
            }
            Err(e) => waiting.push(format!("{REAL_CLUSTER} acknowledges no writes: {e}")),
        }
        tally.record(Invariant::Converges, waiting);
        let slowest = ready_at
            .into_iter()
            .max_by_key(|(_, at)| *at)
            .map(|(name, at)| (at, name))
            .unwrap_or_default();
        eprintln!(
            "chaos: converged in {:.1} s (slowest {}: {:.1} s)",
            started.elapsed().as_secs_f64(),
            slowest.1,
            slowest.0.as_secs_f64()
        );
        Ok(slowest)
    }

    /// The audit log's checks over everything written since the start.
    pub fn audit(&mut self, workload: &Workload, tally: &mut Tally) -> Result {
        self.writes.extend(self.audit.recorded()?);
        for controller in &workload.controllers {
            tally.record(
                Invariant::OneWriterPerController,
                invariants::writes_by_non_leaders(&self.writes, &controller.identity),
            );
        }
        let users: BTreeSet<String> = workload
            .controllers
            .iter()
            .map(|c| c.identity.user.clone())
            .collect();
        tally.record(
            Invariant::BoundedWriteRate,
            invariants::objects_written_too_often(&self.writes, &users, 60.0, WRITES_PER_MINUTE),
        );
        Ok(())
    }

    /// The end: no acknowledged row lost, memory back, and an idle window
    /// of two resyncs in which every controller reconciles and none writes
    /// (the writer and the schedule stopped, the last Backup finished).
    pub async fn finish(&mut self, workload: &Workload, tally: &mut Tally) -> Result {
        let real = &workload.real;
        stop_writer(real).await?;
        let attempts = writes(real).await?;
        let acknowledged: Vec<u64> = attempts.iter().filter(|w| w.ok).map(|w| w.id).collect();
        let outage = invariants::longest_write_outage(
            &attempts
                .iter()
                .map(|w| (w.ok, w.started, w.at))
                .collect::<Vec<_>>(),
        );
        // Not an invariant: strict synchronous replication refuses to
        // acknowledge while no standby streams, which chaos causes at will.
        eprintln!("chaos: longest stretch without an acknowledged write: {outage:.1} s");
        // A database that never came back is a violation with its evidence,
        // and the checks after this one still run.
        let lost = match rows_present(real, REAL_CLUSTER_RW).await {
            Ok(present) => {
                let lost = invariants::lost_rows(&acknowledged, &present);
                eprintln!(
                    "chaos: {} writes acknowledged, {} rows present, {} lost",
                    acknowledged.len(),
                    present.len(),
                    lost.len()
                );
                lost.iter()
                    .map(|id| format!("acknowledged row {id} is missing"))
                    .collect()
            }
            Err(e) => vec![format!(
                "{} acknowledged writes, and the table cannot be read: {e}",
                acknowledged.len()
            )],
        };
        tally.record(Invariant::NoAcknowledgedRowLost, lost);

        let memory_after = memory_of_every_controller(workload).await?;
        let mut grown = Vec::new();
        for (chart, before) in &self.memory_before {
            let after = memory_after.get(chart).copied().unwrap_or_default();
            eprintln!(
                "chaos: {chart} RSS {:.1} MiB before, {:.1} MiB after",
                before / 1048576.0,
                after / 1048576.0
            );
            if after <= 0.0 {
                grown.push(format!("{chart}: no replica reported its RSS"));
            }
            if after > before * MEMORY_FACTOR {
                grown.push(format!(
                    "{chart}: {:.1} MiB after the churn, {:.1} MiB before",
                    after / 1048576.0,
                    before / 1048576.0
                ));
            }
        }
        tally.record(Invariant::MemoryReturns, grown);

        real.api::<BackupSchedule>()
            .patch(
                SCHEDULE,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "spec": { "suspend": true } })),
            )
            .await?;
        // These bound the idle window's start; a Backup or a schedule that
        // never settles is a convergence failure, still followed by the
        // audit's checks. The schedule first: a reconcile that read it before
        // the suspension can still create its slot's Backup, and only once it
        // has seen the suspension will it create none; then every Backup
        // (that one too) must be final, and the schedule must have recorded
        // the last one; then no change the clock alone makes (the backups
        // turning stale) may be due within the window.
        let settled = async {
            until_schedule_settled(real).await?;
            until_backups_finished(real).await?;
            until_schedule_recorded_the_last_backup(real).await?;
            until_no_staleness_due(real).await
        }
        .await;
        tally.record(
            Invariant::Converges,
            settled.err().map(|e| e.to_string()).into_iter().collect(),
        );
        self.audit(workload, tally)?;
        let users: BTreeSet<String> = workload
            .controllers
            .iter()
            .map(|c| c.identity.user.clone())
            .collect();
        let leases: BTreeSet<&str> = workload
            .controllers
            .iter()
            .map(|c| c.identity.lease_name.as_str())
            .collect();
        // The workload's writes only: the controllers watch every namespace,
        // and another suite's leftovers (a namespace still terminating) are
        // not this run's to judge.
        let namespaces = [workload.real.name.as_str(), workload.kwok.name.as_str()];
        let mut idle = Tail::from_now(&cluster().audit_log())?;
        let reconciles_before = reconciles_of_every_leader(workload).await?;
        let ours = |w: &WriteRequest| {
            users.contains(&w.user)
                && w.namespace
                    .as_deref()
                    .is_none_or(|n| namespaces.contains(&n))
                && !(w.resource == "leases"
                    && w.name.as_deref().is_some_and(|n| leases.contains(n)))
        };
        let window = Instant::now();
        let mut unwanted = idle.unwanted_within(IDLE_WINDOW, ours).await?;
        let mut reconciles_after = reconciles_of_every_leader(workload).await?;
        // A controller still backing off after the faults may reconcile
        // nothing for a while: the window goes on, a resync at a time, until
        // each has reconciled (or IDLE_WINDOW_LONGEST has passed), so that
        // what it shows covers a reconcile of each.
        let all_reconciled = |after: &BTreeMap<&str, Reconciles>| {
            reconciles_before
                .iter()
                .all(|(chart, before)| after.get(chart).is_some_and(|a| a.done > before.done))
        };
        while unwanted.is_empty()
            && !all_reconciled(&reconciles_after)
            && window.elapsed() < IDLE_WINDOW_LONGEST
        {
            unwanted = idle.unwanted_within(RESYNC, ours).await?;
            reconciles_after = reconciles_of_every_leader(workload).await?;
        }
        let window = window.elapsed();
        print_written_objects(&unwanted).await;
        // A window without reconciles would show nothing: each controller's
        // leader must have reconciled in it (its resync is RESYNC).
        let unproven = reconciles_before.iter().filter_map(|(chart, before)| {
            let after = reconciles_after.get(chart).copied().unwrap_or_default();
            eprintln!(
                "chaos: {chart}: {} reconciles in the idle window of {:.0} s, {} in flight at its end",
                after.done - before.done,
                window.as_secs_f64(),
                after.in_flight
            );
            (after.done <= before.done).then(|| {
                format!(
                    "{chart}: no reconcile in the idle window ({} before, {} after, {} in flight), \
                     so it proves nothing",
                    before.done, after.done, after.in_flight
                )
            })
        });
        tally.record(
            Invariant::NoIdleWrites,
            unproven
                .collect::<Vec<_>>()
                .into_iter()
                .chain(unwanted.iter().map(|w| {
                    format!(
                        "{} {}{} {}/{} by {} at {}: {}",
                        w.verb,
                        w.resource,
                        w.subresource
                            .as_deref()
                            .map(|s| format!("/{s}"))
                            .unwrap_or_default(),
                        w.namespace.as_deref().unwrap_or("-"),
                        w.name.as_deref().unwrap_or("-"),
                        w.user,
                        w.received,
                        w.code.map_or("no response".to_owned(), |c| c.to_string())
                    )
                }))
                .collect(),
        );
        Ok(())
    }
}

/// Every object of the kinds the controllers make in the run's namespaces:
/// the ones labelled as Cairn's, and the uids of all (the live owners).
async fn list_children(workload: &Workload) -> Result<(Vec<Child>, BTreeSet<String>)> {
    let mut kinds = super::actions::deletable_kinds();
    kinds.extend([
        ApiResource::erase::<Role>(&()),
        ApiResource::erase::<RoleBinding>(&()),
        ApiResource::erase::<Backup>(&()),
        ApiResource::erase::<BackupSchedule>(&()),
        ApiResource::erase::<DatabaseCluster>(&()),
        ApiResource::erase::<ObjectBucket>(&()),
        ApiResource::erase::<DnsRecord>(&()),
        ApiResource::erase::<ProviderConfig>(&()),
    ]);
    let mut children = Vec::new();
    let mut live = BTreeSet::new();
    for ns in [&workload.real, &workload.kwok] {
        for resource in &kinds {
            let api = Api::<DynamicObject>::namespaced_with(ns.client.clone(), &ns.name, resource);
            for object in api.list_metadata(&ListParams::default()).await?.items {
                live.insert(object.uid().unwrap_or_default());
                // A child names its owner in `instance`; the webhook's
                // certificate, shared by the replicas, is nobody's child.
                let labels = object.labels();
                if labels
                    .get("app.kubernetes.io/managed-by")
                    .map(String::as_str)
                    != Some("cairn")
                    || !labels.contains_key("app.kubernetes.io/instance")
                {
                    continue;
                }
                let owner = object
                    .owner_references()
                    .iter()
                    .find(|o| o.controller == Some(true))
                    .map(|o| (o.kind.clone(), o.uid.clone()));
                children.push(Child {
                    kind: resource.kind.clone(),
                    namespace: ns.name.clone(),
                    name: object.name_any(),
                    owner,
                    component: labels.get("app.kubernetes.io/component").cloned(),
                    deleting: object
                        .metadata
                        .deletion_timestamp
                        .as_ref()
                        .map(|at| format!("since {}, finalizers {:?}", at.0, object.finalizers())),
                });
            }
        }
    }
    Ok((children, live))
}

async fn slot_backups(ns: &TestNamespace) -> Result<Vec<SlotBackup>> {
    Ok(ns
        .api::<Backup>()
        .list_metadata(&ListParams::default())
        .await?
        .items
        .iter()
        .filter_map(|b| {
            let slot = b.annotations().get(SLOT_ANNOTATION)?.clone();
            let owner = b
                .owner_references()
                .iter()
                .find(|o| o.kind == "BackupSchedule")?;
            Some(SlotBackup {
                schedule_uid: owner.uid.clone(),
                slot,
                name: b.name_any(),
            })
        })
        .collect())
}

/// The run's buckets and A records in moto with their owner tags, and the
/// live cloud objects (uid → name).
async fn externals(workload: &Workload) -> Result<(Vec<External>, HashMap<String, String>)> {
    let mut live = HashMap::new();
    for b in workload
        .real
        .api::<ObjectBucket>()
        .list_metadata(&ListParams::default())
        .await?
        .items
    {
        live.insert(
            b.uid().unwrap_or_default(),
            format!("ObjectBucket {}", b.name_any()),
        );
    }
    for r in workload
        .real
        .api::<DnsRecord>()
        .list_metadata(&ListParams::default())
        .await?
        .items
    {
        live.insert(
            r.uid().unwrap_or_default(),
            format!("DnsRecord {}", r.name_any()),
        );
    }
    let s3 = cairn_testing::s3::client(cluster().s3_endpoint());
    let prefix = format!("{}-", workload.real.name);
    let mut externals = Vec::new();
    for bucket in s3.list_buckets().send().await?.buckets() {
        let name = bucket.name().unwrap_or_default();
        if !name.starts_with(&prefix) {
            continue;
        }
        let owner_uid = match s3.get_bucket_tagging().bucket(name).send().await {
            Ok(tags) => tags
                .tag_set()
                .iter()
                .find(|t| t.key() == "cairn.dev/owner-uid")
                .map(|t| t.value().to_owned()),
            Err(_) => None,
        };
        externals.push(External {
            name: format!("bucket {name}"),
            owner_uid,
        });
    }
    let route53 = cairn_testing::s3::route53(cluster().s3_endpoint());
    let sets = route53
        .list_resource_record_sets()
        .hosted_zone_id(&workload.zone_id)
        .send()
        .await?;
    let owners: HashMap<String, String> = sets
        .resource_record_sets()
        .iter()
        .filter(|s| s.name().starts_with("_cairn-owner-a."))
        .filter_map(|s| {
            let value = s.resource_records().first()?.value().trim_matches('"');
            let uid = value.strip_prefix("cairn.dev/owner-uid=")?;
            Some((
                s.name().trim_start_matches("_cairn-owner-a.").to_owned(),
                uid.to_owned(),
            ))
        })
        .collect();
    for set in sets.resource_record_sets() {
        if set.r#type().as_str() == "A" {
            externals.push(External {
                name: format!("record {}", set.name()),
                owner_uid: owners.get(set.name()).cloned(),
            });
        }
    }
    Ok((externals, live))
}

/// More than one instance of the PostgreSQL cluster out of recovery.
async fn primaries(workload: &Workload) -> Result<Vec<String>> {
    let pods = workload
        .real
        .api::<Pod>()
        .list(&ListParams::default().labels(&format!(
            "app.kubernetes.io/instance={REAL_CLUSTER},app.kubernetes.io/component=database"
        )))
        .await?
        .items;
    let mut primaries = Vec::new();
    for pod in pods {
        let name = pod.name_any();
        let asked = tokio::time::timeout(
            Duration::from_secs(5),
            as_superuser(&workload.real, &name, "SELECT pg_is_in_recovery()"),
        )
        .await;
        if let Ok(Ok(answer)) = asked
            && answer == "f"
        {
            primaries.push(name);
        }
    }
    Ok(if primaries.len() > 1 {
        vec![format!(
            "{} instances out of recovery at once: {}",
            primaries.len(),
            primaries.join(", ")
        )]
    } else {
        vec![]
    })
}

/// [`memory`], asked again for up to 30 s while a controller has no figure
/// (its replicas restarting when asked).
async fn memory_of_every_controller(workload: &Workload) -> Result<BTreeMap<&'static str, f64>> {
    let mut memory_now = memory(workload).await?;
    for _ in 0..10 {
        if memory_now.values().all(|rss| *rss > 0.0) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        memory_now = memory(workload).await?;
    }
    Ok(memory_now)
}

/// The evidence behind idle writes: each object written, as it is now,
/// with its managed fields (who owns the fields a write keeps setting).
async fn print_written_objects(writes: &[WriteRequest]) {
    let objects: BTreeSet<(&str, &str, &str)> = writes
        .iter()
        .filter_map(|w| {
            Some((
                w.resource.as_str(),
                w.namespace.as_deref()?,
                w.name.as_deref()?,
            ))
        })
        .collect();
    for (resource, namespace, name) in objects {
        let shown = cluster()
            .kubectl(&[
                "get",
                resource,
                name,
                "-n",
                namespace,
                "-o",
                "json",
                "--show-managed-fields",
            ])
            .await;
        match shown {
            Ok(out) => eprintln!(
                "chaos: written in the idle window, {resource} {namespace}/{name} now:\n{}",
                out.stdout
            ),
            Err(e) => {
                eprintln!("chaos: written in the idle window, {resource} {namespace}/{name}: {e}")
            }
        }
    }
}

/// A controller pod's `/metrics`, through the API server's pod proxy.
async fn metrics_of(workload: &Workload, pod: &str) -> Result<String> {
    let path = format!(
        "/api/v1/namespaces/{}/pods/{pod}:8080/proxy/metrics",
        workload.real.name
    );
    Ok(cluster().kubectl(&["get", "--raw", &path]).await?.stdout)
}

/// A controller's reconciles, from its metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Reconciles {
    /// Finished so far (`cairn_reconcile_total`, every kind).
    done: f64,
    /// Running now (`cairn_reconciles_in_flight`, every kind).
    in_flight: f64,
}

/// Each controller's reconciles, read from the replica holding its leader
/// Lease.
async fn reconciles_of_every_leader(
    workload: &Workload,
) -> Result<BTreeMap<&'static str, Reconciles>> {
    let mut counts = BTreeMap::new();
    for controller in &workload.controllers {
        let leader = workload
            .leader(controller)
            .await?
            .ok_or_else(|| format!("{}: no replica leads", controller.chart))?;
        let metrics = metrics_of(workload, &leader).await?;
        counts.insert(controller.chart, reconciles_in(&metrics));
    }
    Ok(counts)
}

/// Until no replica of any controller has had a watch fail for longer than
/// its longest retry delay (5 s): every cache lists again, and the
/// reconciles that wakes have begun.
async fn until_watches_resumed(workload: &Workload) -> Result {
    const QUIET: Duration = Duration::from_secs(7);
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut last: Option<(f64, Instant)> = None;
    while Instant::now() < deadline {
        let mut failures = 0.0;
        let mut read = true;
        for controller in &workload.controllers {
            match workload.controller_pods(controller).await {
                Ok(pods) => {
                    for pod in pods.iter().filter_map(|p| p.metadata.name.as_deref()) {
                        match metrics_of(workload, pod).await {
                            Ok(metrics) => {
                                failures += sum_of(&metrics, "cairn_watch_failures_total")
                            }
                            Err(_) => read = false,
                        }
                    }
                }
                Err(_) => read = false,
            }
        }
        match last {
            Some((before, since)) if read && before == failures => {
                if since.elapsed() >= QUIET {
                    return Ok(());
                }
            }
            _ => last = read.then(|| (failures, Instant::now())),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Err(
        "the controllers' watches kept failing for 90 s after the faults were healed"
            .to_owned()
            .into(),
    )
}

/// A series in Prometheus text, summed over its labels.
fn sum_of(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// The reconcile series in Prometheus text, summed over their kinds.
fn reconciles_in(metrics: &str) -> Reconciles {
    Reconciles {
        done: sum_of(metrics, "cairn_reconcile_total"),
        in_flight: sum_of(metrics, "cairn_reconciles_in_flight"),
    }
}

/// Each controller's largest resident memory among its replicas.
async fn memory(workload: &Workload) -> Result<BTreeMap<&'static str, f64>> {
    let mut memory = BTreeMap::new();
    for controller in &workload.controllers {
        let mut most: f64 = 0.0;
        for pod in workload.controller_pods(controller).await? {
            let series = format!(
                "process_resident_memory_bytes{{controller=\"{}\"}}",
                controller.name()
            );
            if let Ok(metrics) = metrics_of(workload, &pod.name_any()).await
                && let Some(rss) = sample(&metrics, &series)
            {
                most = most.max(rss);
            }
        }
        memory.insert(controller.chart, most);
    }
    Ok(memory)
}

/// Until no Backup is still to finish (at most five minutes).
async fn until_backups_finished(ns: &TestNamespace) -> Result {
    cairn_testing::wait::until(
        "every Backup finished",
        Duration::from_secs(300),
        || async {
            let backups = ns
                .api::<Backup>()
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let running: Vec<String> = backups
                .items
                .iter()
                .filter(|b| {
                    !b.status
                        .as_ref()
                        .and_then(|s| s.phase)
                        .is_some_and(|p| matches!(p, BackupPhase::Completed | BackupPhase::Failed))
                })
                .map(|b| b.name_any())
                .collect();
            if running.is_empty() {
                Ok(Some(()))
            } else {
                Err(format!("running: {}", running.join(", ")))
            }
        },
    )
    .await?;
    Ok(())
}

/// Until the schedule's status names no running Backup and holds the
/// newest success among its Backups: its write for the last one to finish.
async fn until_schedule_recorded_the_last_backup(ns: &TestNamespace) -> Result {
    let newest_success = ns
        .api::<Backup>()
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|b| {
            let status = b.status?;
            (status.phase == Some(BackupPhase::Completed)).then_some(status.completed_at?.0)
        })
        .max();
    let schedules = ns.api::<BackupSchedule>();
    cairn_testing::wait::for_object(
        &schedules,
        SCHEDULE,
        "the last Backup recorded",
        Duration::from_secs(120),
        |s| {
            s.status.as_ref().is_some_and(|status| {
                status.active.is_empty()
                    && status.last_successful_time.as_ref().map(|t| t.0) >= newest_success
            })
        },
    )
    .await?;
    Ok(())
}

/// Until the schedule's backups turning stale (`BackupsHealthy` False, two
/// intervals after the newest success, written when due) cannot fall within
/// the idle window: it has been reported, or it is due after the window
/// would end.
async fn until_no_staleness_due(ns: &TestNamespace) -> Result {
    let schedules = ns.api::<BackupSchedule>();
    // The window, and a margin for the controller's clock and its write.
    let margin = SignedDuration::from_secs(5);
    let window = SignedDuration::try_from(IDLE_WINDOW)? + margin;
    cairn_testing::wait::until(
        "no staleness due within the idle window",
        2 * SCHEDULE_INTERVAL + IDLE_WINDOW + Duration::from_secs(30),
        || async {
            let schedule = schedules.get(SCHEDULE).await.map_err(|e| e.to_string())?;
            let status = schedule.status.unwrap_or_default();
            let reported = status
                .conditions
                .iter()
                .any(|c| c.type_ == "BackupsHealthy" && c.status == "False");
            let Some(success) = status.last_successful_time else {
                return Ok(Some(()));
            };
            let interval =
                SignedDuration::try_from(SCHEDULE_INTERVAL).map_err(|e| e.to_string())?;
            let due_in = (success.0 + interval * 2).duration_since(Timestamp::now());
            if reported || due_in > window {
                Ok(Some(()))
            } else {
                Err(format!(
                    "the backups turn stale in {due_in:#}, within the window"
                ))
            }
        },
    )
    .await?;
    Ok(())
}

/// Until the schedule's status describes its suspended spec and names no
/// running Backup: its last write after the last Backup finished.
async fn until_schedule_settled(ns: &TestNamespace) -> Result {
    let schedules = ns.api::<BackupSchedule>();
    cairn_testing::wait::for_object(
        &schedules,
        SCHEDULE,
        "settled",
        Duration::from_secs(120),
        |s| {
            s.status.as_ref().is_some_and(|status| {
                status.active.is_empty() && status.observed_generation == s.metadata.generation
            })
        },
    )
    .await?;
    Ok(())
}

/// Does for kwok's pods what a kubelet does once its node is back: while
/// the API server was down kwok could not renew its nodes' leases, the node
/// lifecycle controller marked their pods NotReady, and kwok never marks a
/// pod Ready again. A pod NotReady on a Ready node is marked Ready.
async fn ready_kwok_pods(ns: &TestNamespace) -> Result {
    use k8s_openapi::api::core::v1::Node;
    let nodes = Api::<Node>::all(ns.client.clone())
        .list(&ListParams::default())
        .await?;
    let ready_nodes: BTreeSet<String> = nodes
        .items
        .iter()
        .filter(|n| {
            has_true_condition(
                n.status.as_ref().and_then(|s| s.conditions.as_ref()),
                "Ready",
            )
        })
        .map(|n| n.name_any())
        .collect();
    let pods = ns.api::<Pod>();
    for pod in pods.list(&ListParams::default()).await?.items {
        let status = pod.status.as_ref();
        let on_ready_node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_some_and(|n| ready_nodes.contains(n));
        let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
        let ready = has_true_condition(status.and_then(|s| s.conditions.as_ref()), "Ready");
        if on_ready_node && running && !ready && pod.metadata.deletion_timestamp.is_none() {
            let patch = serde_json::json!({ "status": { "conditions": [
                { "type": "Ready", "status": "True" },
                { "type": "ContainersReady", "status": "True" },
            ] } });
            pods.patch_status(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Strategic(patch),
            )
            .await?;
        }
    }
    Ok(())
}

/// The evidence of a kwok cluster that did not converge: every node's
/// readiness and taints, and every pod that is not Ready with its node,
/// phase, owner and deletion.
async fn unready_pods_and_nodes(ns: &TestNamespace) -> Result<String> {
    use k8s_openapi::api::core::v1::Node;
    let mut report = Vec::new();
    for node in Api::<Node>::all(ns.client.clone())
        .list(&ListParams::default())
        .await?
    {
        let ready = has_true_condition(
            node.status.as_ref().and_then(|s| s.conditions.as_ref()),
            "Ready",
        );
        let taints: Vec<String> = node
            .spec
            .iter()
            .flat_map(|s| s.taints.iter().flatten())
            .map(|t| format!("{}:{}", t.key, t.effect))
            .collect();
        report.push(format!(
            "node {} ready={ready} taints={taints:?}",
            node.name_any()
        ));
    }
    for pod in ns.api::<Pod>().list(&ListParams::default()).await? {
        let status = pod.status.as_ref();
        if has_true_condition(status.and_then(|s| s.conditions.as_ref()), "Ready") {
            continue;
        }
        report.push(format!(
            "pod {} node={:?} phase={:?} owner={:?} deleting={:?} finalizers={:?}",
            pod.name_any(),
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            status.and_then(|s| s.phase.as_deref()),
            pod.owner_references()
                .iter()
                .map(|o| format!("{}/{} {}", o.kind, o.name, o.uid))
                .collect::<Vec<_>>(),
            pod.metadata
                .deletion_timestamp
                .as_ref()
                .map(|t| t.0.to_string()),
            pod.finalizers(),
        ));
    }
    Ok(report.join("\n"))
}

fn has_true_condition<C: serde::Serialize>(conditions: Option<&Vec<C>>, type_: &str) -> bool {
    conditions.is_some_and(|all| {
        all.iter().any(|c| {
            let c = serde_json::to_value(c).unwrap_or_default();
            c["type"] == type_ && c["status"] == "True"
        })
    })
}

#[cfg(test)]
mod tests {
    use super::reconciles_in;

    #[test]
    fn reconciles_are_summed_over_kinds_and_nothing_else_is() {
        let metrics = "# TYPE cairn_reconcile_total counter\n\
            cairn_reconcile_total{kind=\"Backup\",controller=\"backup\"} 7\n\
            cairn_reconcile_total{kind=\"BackupSchedule\",controller=\"backup\"} 3\n\
            cairn_reconcile_errors_total{kind=\"Backup\",reason=\"kube\",controller=\"backup\"} 2\n\
            cairn_reconcile_duration_seconds_count{kind=\"Backup\",controller=\"backup\"} 10\n\
            cairn_reconciles_in_flight{kind=\"Backup\",controller=\"backup\"} 1\n\
            cairn_reconciles_in_flight{kind=\"BackupSchedule\",controller=\"backup\"} 0\n";
        let counted = reconciles_in(metrics);
        assert_eq!((counted.done, counted.in_flight), (10.0, 1.0));
        assert_eq!(reconciles_in(""), Default::default());
    }
}
