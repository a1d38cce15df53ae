//! One reconcile of a `DatabaseCluster`: validate → build → apply → status.
//! Reads come from the caches; a write happens only where the cache differs
//! from the desired state, so an unchanged cluster costs no request at all.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use cairn_api::database::instance::{
    BOOTSTRAP_ANNOTATION, BOOTSTRAP_INITDB, BOOTSTRAP_RESTORE, FENCED_ANNOTATION,
};
use cairn_api::database::v1::{
    DatabaseCluster, DatabaseClusterStatus, FailoverRecord, SwitchoverRecord,
};
use cairn_api::validate;
use cairn_runtime::apply::Applier;
use cairn_runtime::certs::{self, Authority};
use cairn_runtime::conditions::{self, Condition, Time};
use cairn_runtime::events;
use cairn_runtime::manager::Recheck;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::MANAGER;
use crate::build::{self, Names, ROLE_LABEL, ROLE_PRIMARY, ROLE_REPLICA};
use crate::error::Error;
use crate::failover::{self, Decision, Member, Policy, Quorum};
use crate::leftovers;
use crate::metrics::ClusterMetrics;
use crate::restore;
use crate::rollout;
use crate::status::{
    self, CONTINUOUS_ARCHIVING, DEGRADED, Instances, PROGRESSING, READY, Switching,
};
use crate::switchover::{self, SWITCHOVER_ANNOTATION, Step};
use crate::tls;
use crate::tokens;

/// What every reconcile reads from and writes with.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub caches: Caches,
    pub metrics: ClusterMetrics,
    /// Since when each cluster's primary (`namespace/name` → pod) has been
    /// seen not serving: this process's clock, so a restart of the controller
    /// can only delay a failover, never hasten one.
    pub not_serving_since: Mutex<HashMap<String, (String, Instant)>>,
    /// Decisions recorded and not yet seen in the cache (see `Decisions`).
    pub decisions: Decisions,
    /// Every apply and status write, remembered against a lagging cache.
    pub applier: Applier,
    /// How old a replaced StatefulSet's successor must be before its
    /// leftover pods are deleted (see `leftovers.rs`).
    pub collector_grace: Duration,
}

impl Context {
    pub fn new(
        client: Client,
        recorder: Recorder,
        caches: Caches,
        metrics: ClusterMetrics,
    ) -> Self {
        Self {
            client,
            recorder,
            caches,
            metrics,
            not_serving_since: Mutex::default(),
            decisions: Decisions::default(),
            applier: Applier::default(),
            collector_grace: leftovers::COLLECTOR_GRACE,
        }
    }

    /// The same, giving the garbage collector `grace` instead of
    /// [`leftovers::COLLECTOR_GRACE`].
    pub fn with_collector_grace(mut self, grace: Duration) -> Self {
        self.collector_grace = grace;
        self
    }

    /// Every `period`: the per-cluster gauges refreshed from the cache, and
    /// what this process remembers of deleted clusters dropped.
    pub async fn housekeeping(
        context: Arc<Self>,
        clusters: Store<DatabaseCluster>,
        period: Duration,
    ) {
        let mut every = tokio::time::interval(period);
        loop {
            every.tick().await;
            context.metrics.refresh(&clusters.state());
            context.forget_missing(&clusters);
        }
    }

    /// Drops what this process remembers of clusters that are gone, so memory
    /// stays bounded however many clusters come and go.
    pub fn forget_missing(&self, clusters: &Store<DatabaseCluster>) {
        let exists = |key: &String| {
            key.split_once('/').is_some_and(|(namespace, name)| {
                clusters
                    .get(&ObjectRef::new(name).within(namespace))
                    .is_some()
            })
        };
        self.not_serving_since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|key, _| exists(key));
        self.decisions
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|key, _| exists(key));
    }
}

/// The decisions (primary, failover, switchover) this process recorded and
/// its cache of clusters has not shown yet, by `namespace/name`. A
/// reconcile of an older copy would undo them: relabel the old primary, or
/// fail over a second time.
#[derive(Default)]
pub struct Decisions(Mutex<HashMap<String, (Recorded, Instant)>>);

/// How long a recorded decision may wait for the cache to show it; past
/// that, something else changed the status since, and the reconcile goes
/// on from the cache.
const CACHE_LAG_LIMIT: Duration = Duration::from_secs(10);

/// What a recorded decision left in the status.
#[derive(Clone, Debug, PartialEq)]
pub struct Recorded {
    current_primary: Option<String>,
    last_failover: Option<FailoverRecord>,
    last_switchover: Option<SwitchoverRecord>,
}

impl Recorded {
    fn of(cluster: &DatabaseCluster) -> Self {
        let status = cluster.status.as_ref();
        Self {
            current_primary: status.and_then(|s| s.current_primary.clone()),
            last_failover: status.and_then(|s| s.last_failover.clone()),
            last_switchover: status.and_then(|s| s.last_switchover.clone()),
        }
    }
}

impl Decisions {
    /// Remembers what a status write left: always for a decision, and for
    /// any later write while a decision awaits the cache.
    fn written(&self, written: &DatabaseCluster, decision: bool) {
        let mut decisions = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let key = key(written);
        if decision || decisions.contains_key(&key) {
            decisions.insert(key, (Recorded::of(written), Instant::now()));
        }
    }

    /// Whether `cluster` is older than a decision recorded for it; forgets
    /// the decision once the cache shows it.
    fn is_behind(&self, cluster: &DatabaseCluster) -> bool {
        let mut decisions = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let key = key(cluster);
        let behind = decisions.get(&key).is_some_and(|(recorded, at)| {
            *recorded != Recorded::of(cluster) && at.elapsed() < CACHE_LAG_LIMIT
        });
        if !behind {
            decisions.remove(&key);
        }
        behind
    }
}

fn key(cluster: &DatabaseCluster) -> String {
    format!(
        "{}/{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    )
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
    pub leases: Store<Lease>,
}

pub async fn reconcile(cluster: Arc<DatabaseCluster>, ctx: Arc<Context>) -> Result<Recheck, Error> {
    if cluster.metadata.deletion_timestamp.is_some() {
        // Owner references hand the children to the garbage collector.
        return Ok(Recheck::AfterResync);
    }
    if ctx.decisions.is_behind(&cluster) {
        // The watch delivers the recorded decision within moments.
        return Ok(Recheck::Within(Duration::from_millis(200)));
    }
    let cluster = ctx.applier.with_written_status(cluster);
    let now = Time(Timestamp::now());
    let problems = validate::database_cluster(&cluster.spec);
    if !problems.is_empty() {
        let message = problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        let mut observed = status::invalid(&cluster, &message, &now);
        if cluster.status.as_ref().is_some_and(|s| s.initialized) && !cluster.spec.paused {
            keep_serving(&ctx, &cluster, &mut observed, &now).await?;
        }
        write_status(&ctx, &cluster, observed).await?;
        return Err(Error::InvalidSpec(message));
    }
    match restore::source(&ctx, &cluster).await? {
        restore::Source::Recorded => {}
        // Recorded first: the children are built from the status's record.
        restore::Source::Found(source) => {
            let mut observed = status::waiting(
                &cluster,
                status::reason::CREATING,
                &format!("restoring {}", source.location),
                &now,
            );
            observed.restored_from = Some(source);
            write_status(&ctx, &cluster, observed).await?;
            return Ok(Recheck::Within(Duration::from_millis(100)));
        }
        restore::Source::Waiting { reason, message } => {
            write_status(
                &ctx,
                &cluster,
                status::waiting(&cluster, reason, &message, &now),
            )
            .await?;
            return Ok(Recheck::Within(Duration::from_secs(10)));
        }
        restore::Source::Refused { reason, message } => {
            let refused = status::refused(&cluster, reason, &message, &now);
            write_status(&ctx, &cluster, refused).await?;
            return Ok(Recheck::AfterResync);
        }
    }
    if cluster.spec.paused {
        write_status(&ctx, &cluster, status::paused(&cluster, &now)).await?;
        return Ok(Recheck::AfterResync);
    }
    let renew_at = ensure_tls(&ctx, &cluster).await?;
    let stateful_set = apply_children(&ctx, &cluster).await?;
    let members = members(&ctx, &cluster);
    let pods = instance_pods(&ctx, &cluster);
    let starting = {
        let pods: Vec<&Pod> = pods.iter().map(AsRef::as_ref).collect();
        rollout::starting(&stateful_set, &pods, &now)
    };
    let instances = Instances {
        starting: starting.is_some(),
        ..Instances::of(Some(&stateful_set))
    };
    let leftovers = collect_leftovers(&ctx, &cluster, &stateful_set, &pods, &now).await?;
    restart_void_tokens(&ctx, &cluster, &pods).await?;
    let rolling = roll_out(&cluster, &stateful_set, &pods, &primary(&cluster), &members);
    let rollout_target = match &rolling {
        rollout::Step::SwitchOver(to) => Some(to.as_str()),
        _ => None,
    };
    let policy = failover_policy(&cluster);
    let roles = assign_roles(
        &ctx,
        &cluster,
        &members,
        &pods,
        rollout_target,
        policy,
        &now,
    )
    .await?;
    if let rollout::Step::Restart(pod) = &rolling
        && roles.steady
    {
        restart(&ctx, &cluster, &pods, pod).await?;
    }
    let blocked_storage = grow_storage(&ctx, &cluster).await?;
    let mut observed = status::observe(&cluster, instances, &roles.primary, &now);
    observed.initialized = roles.initialized;
    observed.timeline = roles.timeline;
    observed.postgres_version = members
        .iter()
        .find(|m| m.pod == roles.primary)
        .and_then(|m| m.observed.server_version.clone())
        .or(observed.postgres_version);
    if let rollout::Step::Wait(why) = &rolling {
        status::rolling_out(&mut observed, &cluster, why, &now);
    }
    status::failover(
        &mut observed,
        &cluster,
        roles.last_failover,
        roles.waiting,
        &now,
    );
    status::switchover(&mut observed, &cluster, roles.switching, &now);
    let primary_report = members.iter().find(|m| m.pod == roles.primary);
    status::archiving(
        &mut observed,
        &cluster,
        primary_report.and_then(|m| m.observed.wal_archive.as_ref()),
        &now,
    );
    if let Some(class) = blocked_storage {
        status::storage_not_expandable(&mut observed, &cluster, &class, &now);
    }
    write_status(&ctx, &cluster, observed).await?;
    // Heartbeats trigger reconciles; silence does not, hence the recheck.
    let renew_in = tls::until(renew_at, SystemTime::now());
    let recheck = if roles.initialized {
        roles.recheck.min(renew_in)
    } else {
        renew_in
    };
    // A pod that does not start within its grace is then lost: look again.
    let recheck = [leftovers, starting]
        .into_iter()
        .flatten()
        .fold(recheck, Duration::min);
    Ok(Recheck::Within(recheck))
}

/// Deletes the instance pods a replaced StatefulSet left behind once the
/// garbage collector has had its grace (see `leftovers.rs`); when to look
/// again while it still has.
async fn collect_leftovers(
    ctx: &Context,
    cluster: &DatabaseCluster,
    stateful_set: &StatefulSet,
    pods: &[Arc<Pod>],
    now: &Time,
) -> Result<Option<Duration>, Error> {
    let pods: Vec<&Pod> = pods.iter().map(AsRef::as_ref).collect();
    let found = leftovers::leftovers(stateful_set, &pods, now, ctx.collector_grace);
    for pod in found.collect {
        let message = format!(
            "deleted pod {} of the replaced StatefulSet {} (the garbage collector left it for over {} s): the current StatefulSet recreates it",
            pod.pod,
            pod.owner_uid,
            ctx.collector_grace.as_secs()
        );
        let why = Deletion::warning("LeftoverPodDeleted", message);
        delete_pod(ctx, cluster, &pod.pod, Some(pod.uid.clone()), why).await?;
    }
    Ok(found.recheck)
}

/// Restarts the instance pods whose token names a ServiceAccount deleted
/// since (see `tokens.rs`), replicas first.
async fn restart_void_tokens(
    ctx: &Context,
    cluster: &DatabaseCluster,
    pods: &[Arc<Pod>],
) -> Result<(), Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let account_name = build::service_account(cluster).name_any();
    let Some(account) = ctx
        .caches
        .service_accounts
        .get(&ObjectRef::new(&account_name).within(&namespace))
    else {
        return Ok(());
    };
    let pods: Vec<&Pod> = pods.iter().map(AsRef::as_ref).collect();
    for pod in tokens::void_token_pods(&account, &pods, &primary(cluster)) {
        let name = pod.name_any();
        let message = format!(
            "deleted pod {name}: its token names ServiceAccount {account_name} as it was before it was deleted and created again, and the API server refuses it; the new pod gets a valid one"
        );
        let why = Deletion::warning("ServiceAccountReplaced", message);
        delete_pod(ctx, cluster, &name, pod.uid(), why).await?;
    }
    Ok(())
}

/// Who is primary after this reconcile, and what the status says of it.
struct Roles {
    primary: String,
    initialized: bool,
    switching: Switching,
    last_failover: Option<FailoverRecord>,
    /// Why a lost primary is not replaced yet.
    waiting: Option<String>,
    recheck: Duration,
    /// The primary serves and no switchover is under way: a rollout may
    /// restart an instance.
    steady: bool,
    /// The timeline the serving primary reports, else the recorded one.
    timeline: Option<u32>,
}

/// The membership step: a requested switchover's next step, else a
/// failover if the primary is lost; then the role labels that make `-rw`
/// and `-ro` follow. Needs only the members, the pods and the status, so it
/// runs even while the spec is invalid.
async fn assign_roles(
    ctx: &Context,
    cluster: &DatabaseCluster,
    members: &[Member],
    pods: &[Arc<Pod>],
    rollout_target: Option<&str>,
    policy: Policy,
    now: &Time,
) -> Result<Roles, Error> {
    let mut primary = primary(cluster);
    let mut last_failover = cluster
        .status
        .as_ref()
        .and_then(|s| s.last_failover.clone());
    let switching = switch_over(ctx, cluster, &mut primary, members, rollout_target, now).await?;
    let decision = match switching.demoted {
        // Between the demotion and the promotion no primary serves, by design.
        true => Decision::Keep {
            recheck: Duration::from_secs(1),
        },
        false => decide(ctx, cluster, &primary, members, policy, now.0),
    };
    let mut waiting = None;
    let mut steady = false;
    let recheck = match decision {
        Decision::Keep { recheck } => {
            steady = !switching.demoted;
            recheck
        }
        Decision::Wait { reason, recheck } => {
            waiting = Some(reason);
            recheck
        }
        Decision::Promote {
            to,
            reason,
            primary_last_seen,
        } => {
            let record = FailoverRecord {
                from: primary.clone(),
                to: to.clone(),
                reason,
                primary_last_seen: Time(primary_last_seen),
                promoted_at: now.clone(),
                completed_at: None,
            };
            if promote(ctx, cluster, members, &record).await? {
                primary = to;
                last_failover = Some(record);
            }
            Duration::from_secs(1)
        }
    };
    let initialized = is_initialized(cluster, &primary, members);
    let timeline = cluster_timeline(cluster, &primary, members);
    let labelled_primary = (!switching.demoted).then_some(primary.as_str());
    label_roles(ctx, cluster, pods, labelled_primary, initialized).await?;
    if let Some(record) = last_failover.as_mut()
        && record.completed_at.is_none()
        && failover::serving(members, &record.to).is_some()
    {
        record.completed_at = Some(now.clone());
        let took = now.0.duration_since(record.primary_last_seen.0);
        ctx.metrics
            .failover_seconds
            .observe(took.as_secs_f64().max(0.0));
    }
    Ok(Roles {
        primary,
        initialized,
        switching,
        last_failover,
        waiting,
        recheck,
        steady,
        timeline,
    })
}

/// An invalid spec stops every change to the children, but not failover:
/// a typo in `resources` must not leave a cluster without a primary. The
/// spec's replication settings may be the invalid part, so the failover
/// policy is the cautious one (see `failover::cautious`).
async fn keep_serving(
    ctx: &Context,
    cluster: &DatabaseCluster,
    observed: &mut DatabaseClusterStatus,
    now: &Time,
) -> Result<(), Error> {
    let members = members(ctx, cluster);
    let pods = instance_pods(ctx, cluster);
    // The instances the running configuration lists: the StatefulSet as
    // last applied from a valid spec.
    let instances = cached_stateful_set(ctx, cluster)
        .and_then(|sts| sts.spec.as_ref()?.replicas)
        .and_then(|replicas| usize::try_from(replicas).ok())
        .unwrap_or(members.len());
    let policy = failover::cautious(failover_policy(cluster), instances);
    let roles = assign_roles(ctx, cluster, &members, &pods, None, policy, now).await?;
    observed.current_primary = Some(roles.primary);
    observed.timeline = roles.timeline;
    status::failover(observed, cluster, roles.last_failover, roles.waiting, now);
    observed.last_switchover = roles.switching.record;
    Ok(())
}

/// The cluster's members, from their Leases.
fn members(ctx: &Context, cluster: &DatabaseCluster) -> Vec<Member> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let mut members: Vec<Member> = ctx
        .caches
        .leases
        .state_filter(|lease| {
            let labels = lease.labels();
            lease.namespace().as_deref() == Some(namespace.as_str())
                && labels.get("app.kubernetes.io/instance") == Some(&name)
                && labels
                    .get("app.kubernetes.io/component")
                    .map(String::as_str)
                    == Some("membership")
        })
        .iter()
        .map(|lease| Member::from_lease(lease))
        .collect();
    members.sort_by(|a, b| a.pod.cmp(&b.pod));
    members
}

/// Initialised: once a primary has served, and for ever after.
fn is_initialized(cluster: &DatabaseCluster, primary: &str, members: &[Member]) -> bool {
    cluster.status.as_ref().is_some_and(|s| s.initialized)
        || failover::serving(members, primary).is_some()
}

/// The timeline the serving primary reports, else the last one recorded:
/// a promotion's new timeline is recorded once the promoted instance serves
/// on it, and kept while no primary serves.
fn cluster_timeline(cluster: &DatabaseCluster, primary: &str, members: &[Member]) -> Option<u32> {
    failover::serving(members, primary)
        .and_then(|m| m.observed.timeline)
        .or_else(|| cluster.status.as_ref().and_then(|s| s.timeline))
}

/// What to do about the primary. Nothing before the cluster was initialised:
/// there is no data yet that a replica could hold.
fn decide(
    ctx: &Context,
    cluster: &DatabaseCluster,
    primary: &str,
    members: &[Member],
    policy: Policy,
    now: Timestamp,
) -> Decision {
    let key = key(cluster);
    let serving = failover::serving(members, primary).is_some();
    let not_serving_for = {
        let mut since = ctx
            .not_serving_since
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if serving {
            since.remove(&key);
            None
        } else {
            let entry = since
                .entry(key)
                .or_insert_with(|| (primary.to_owned(), Instant::now()));
            if entry.0 != primary {
                *entry = (primary.to_owned(), Instant::now());
            }
            Some(entry.1.elapsed())
        }
    };
    if !cluster.status.as_ref().is_some_and(|s| s.initialized) {
        return Decision::Keep {
            recheck: Duration::from_secs(10),
        };
    }
    let timeline = cluster.status.as_ref().and_then(|s| s.timeline);
    failover::decide(primary, members, timeline, not_serving_for, policy, now)
}

/// The failover policy the spec asks for.
fn failover_policy(cluster: &DatabaseCluster) -> Policy {
    let spec = cluster.spec.failover.clone().unwrap_or_default();
    Policy {
        delay: Duration::from_secs(u64::try_from(spec.delay_seconds).unwrap_or(10)),
        max_lag_bytes: spec.max_lag_bytes.and_then(|b| u64::try_from(b).ok()),
        quorum: cluster.spec.replication.as_ref().map(|r| Quorum {
            synchronous: u32::try_from(r.synchronous_replicas).unwrap_or(0),
            instances: u32::try_from(cluster.spec.instances).unwrap_or(0),
        }),
    }
}

/// Deposes the old primary and records the new one, in that order, before
/// any label moves. Deposing is a write to the old primary's Lease
/// conditional on the version that showed it lost: if it renewed since, the
/// write fails and nothing is promoted. Returns whether it promoted.
async fn promote(
    ctx: &Context,
    cluster: &DatabaseCluster,
    members: &[Member],
    record: &FailoverRecord,
) -> Result<bool, Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    // Read, not cached: the last look before a promotion must not be a
    // cache a heartbeat has not reached yet.
    let leases = Api::<Lease>::namespaced(ctx.client.clone(), &namespace);
    if let Some(lease) = leases.get_opt(&record.from).await? {
        let fresh = Member::from_lease(&lease);
        let cached = members.iter().find(|m| m.pod == record.from);
        if cached.is_some_and(|m| m.last_seen != fresh.last_seen) && fresh.serves_as_primary() {
            tracing::info!(primary = %record.from, "the primary renewed its heartbeat: no failover");
            return Ok(false);
        }
        let fence = json!({ "metadata": {
            "resourceVersion": lease.resource_version(),
            "annotations": { FENCED_ANNOTATION: "true" },
        }});
        match leases
            .patch(&record.from, &PatchParams::default(), &Patch::Merge(&fence))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {
                tracing::info!(primary = %record.from, "the primary's Lease changed while deposing it: deciding again");
                return Ok(false);
            }
            Err(e) => return Err(e.into()),
        }
    }
    unfence(ctx, cluster, members, &record.to).await?;
    record_decision(
        ctx,
        cluster,
        json!({ "currentPrimary": record.to, "lastFailover": record }),
    )
    .await?;
    ctx.metrics.failovers.inc();
    tracing::warn!(from = %record.from, to = %record.to, reason = %record.reason, "primary lost: promoting a replica");
    let note = format!(
        "primary {} lost ({}): promoted {}",
        record.from, record.reason, record.to
    );
    publish(ctx, cluster, EventType::Warning, "FailedOver", note).await;
    Ok(true)
}

/// Lifts an earlier deposition from the instance about to be made primary.
async fn unfence(
    ctx: &Context,
    cluster: &DatabaseCluster,
    members: &[Member],
    pod: &str,
) -> Result<(), Error> {
    if !members.iter().any(|m| m.pod == pod && m.fenced) {
        return Ok(());
    }
    let namespace = cluster.namespace().unwrap_or_default();
    let unfence = json!({ "metadata": { "annotations": { FENCED_ANNOTATION: null } } });
    Api::<Lease>::namespaced(ctx.client.clone(), &namespace)
        .patch(pod, &PatchParams::default(), &Patch::Merge(&unfence))
        .await?;
    Ok(())
}

/// Writes a decision into the status at once (a merge patch of `fields`),
/// before acting on it: a crash in between repeats the decision, never
/// forgets it. Each field replaces the recorded one whole (see `replacing`).
async fn record_decision(
    ctx: &Context,
    cluster: &DatabaseCluster,
    fields: serde_json::Value,
) -> Result<(), Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let previous = serde_json::to_value(&cluster.status).map_err(kube::Error::SerdeError)?;
    let recorded = Api::<DatabaseCluster>::namespaced(ctx.client.clone(), &namespace)
        .patch_status(
            &cluster.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&json!({ "status": replacing(&previous, fields) })),
        )
        .await?;
    ctx.decisions.written(&recorded, true);
    Ok(())
}

/// A merge patch of status `fields` that replaces each of them whole. A
/// merge patch keeps whatever an object in it does not name, and a record
/// leaves its unset fields out: a new switchover written over a finished one
/// would inherit its `promotedAt` and read as done before it began. So every
/// field the previous value has and the new one lacks is set to null.
fn replacing(previous_status: &serde_json::Value, fields: serde_json::Value) -> serde_json::Value {
    fn replace(previous: Option<&serde_json::Value>, next: serde_json::Value) -> serde_json::Value {
        let (Some(serde_json::Value::Object(old)), serde_json::Value::Object(mut new)) =
            (previous, next.clone())
        else {
            return next;
        };
        for (key, value) in &mut new {
            *value = replace(old.get(key), value.take());
        }
        for key in old.keys() {
            new.entry(key.clone()).or_insert(serde_json::Value::Null);
        }
        serde_json::Value::Object(new)
    }
    match fields {
        serde_json::Value::Object(fields) => fields
            .into_iter()
            .map(|(key, value)| {
                let value = replace(previous_status.get(&key), value);
                (key, value)
            })
            .collect(),
        other => other,
    }
}

async fn publish(
    ctx: &Context,
    cluster: &DatabaseCluster,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: reason.to_owned(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &cluster.object_ref(&())).await {
        // An Event is a courtesy; losing one must not fail the reconcile.
        tracing::warn!(error = %e, "could not publish an Event");
    }
}

/// Takes the next step of a requested switchover (see `switchover.rs`).
async fn switch_over(
    ctx: &Context,
    cluster: &DatabaseCluster,
    primary: &mut String,
    members: &[Member],
    rollout_target: Option<&str>,
    now: &Time,
) -> Result<Switching, Error> {
    // The user's request first; a rollout's when there is none to act on.
    let requested = cluster
        .annotations()
        .get(SWITCHOVER_ANNOTATION)
        .map(String::as_str)
        .filter(|target| target != primary)
        .or(rollout_target);
    let mut record = cluster
        .status
        .as_ref()
        .and_then(|s| s.last_switchover.clone());
    let mut note = None;
    match switchover::next(requested, primary, record.as_ref(), members) {
        Step::None => {}
        Step::Refuse(why) => note = Some((status::reason::SWITCHOVER_REFUSED, why)),
        Step::Wait(why) => note = Some((status::reason::SWITCHING_OVER, why)),
        Step::Demote { from, to } => {
            let started = SwitchoverRecord {
                from,
                to,
                started_at: now.clone(),
                promoted_at: None,
                completed_at: None,
                write_unavailable_seconds: None,
            };
            record_decision(ctx, cluster, json!({ "lastSwitchover": started })).await?;
            let message = format!("demoting {} to promote {}", started.from, started.to);
            publish(
                ctx,
                cluster,
                EventType::Normal,
                "SwitchoverStarted",
                message.clone(),
            )
            .await;
            note = Some((status::reason::SWITCHING_OVER, message));
            record = Some(started);
        }
        Step::Promote => {
            if let Some(promoted) = record.as_mut() {
                unfence(ctx, cluster, members, &promoted.to).await?;
                promoted.promoted_at = Some(now.clone());
                record_decision(
                    ctx,
                    cluster,
                    json!({ "currentPrimary": promoted.to, "lastSwitchover": promoted }),
                )
                .await?;
                primary.clone_from(&promoted.to);
            }
        }
    }
    if let Some(done) = record.as_mut()
        && done.promoted_at.is_some()
        && done.completed_at.is_none()
        && failover::serving(members, &done.to).is_some()
    {
        let took = now.0.duration_since(done.started_at.0).as_secs_f64();
        done.completed_at = Some(now.clone());
        done.write_unavailable_seconds = Some((took * 10.0).round() / 10.0);
        let message = format!(
            "{} is the primary; writes were unavailable for {took:.1} s",
            done.to
        );
        publish(ctx, cluster, EventType::Normal, "SwitchedOver", message).await;
    }
    let demoted = switchover::under_way(record.as_ref()).is_some();
    Ok(Switching {
        record,
        demoted,
        note,
    })
}

/// The cluster's instance pods, from the cache.
fn instance_pods(ctx: &Context, cluster: &DatabaseCluster) -> Vec<Arc<Pod>> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    ctx.caches.pods.state_filter(|pod| {
        pod.namespace().as_deref() == Some(namespace.as_str())
            && pod.labels().get("app.kubernetes.io/instance") == Some(&name)
    })
}

/// The rollout's next step (see `rollout.rs`).
fn roll_out(
    cluster: &DatabaseCluster,
    stateful_set: &StatefulSet,
    pods: &[Arc<Pod>],
    primary: &str,
    members: &[Member],
) -> rollout::Step {
    let pods: Vec<&Pod> = pods.iter().map(AsRef::as_ref).collect();
    let Some(instances) = rollout::instances(stateful_set, &pods) else {
        // The StatefulSet controller has not seen the new template yet.
        return rollout::Step::Done;
    };
    let switching = switchover::under_way(
        cluster
            .status
            .as_ref()
            .and_then(|s| s.last_switchover.as_ref()),
    )
    .is_some();
    let expected = usize::try_from(cluster.spec.instances).unwrap_or(0);
    let initialized = cluster.status.as_ref().is_some_and(|s| s.initialized);
    rollout::next(
        &instances,
        expected,
        primary,
        members,
        switching,
        initialized,
    )
}

/// Deletes an instance pod so the StatefulSet recreates it from the new
/// template; the precondition makes sure it is the pod the decision saw.
async fn restart(
    ctx: &Context,
    cluster: &DatabaseCluster,
    pods: &[Arc<Pod>],
    name: &str,
) -> Result<(), Error> {
    let Some(pod) = pods.iter().find(|p| p.name_any() == name) else {
        return Ok(());
    };
    let why = Deletion {
        kind: EventType::Normal,
        reason: "RestartingInstance",
        message: format!("restarting {name} with the new pod template"),
    };
    delete_pod(ctx, cluster, name, pod.uid(), why).await
}

/// Why the controller deletes an instance pod: the Event it publishes, and
/// logs at the Event's level, once the delete went through.
struct Deletion {
    kind: EventType,
    reason: &'static str,
    message: String,
}

impl Deletion {
    fn warning(reason: &'static str, message: String) -> Self {
        Self {
            kind: EventType::Warning,
            reason,
            message,
        }
    }
}

/// Deletes an instance pod if it is still the one with `uid` (the one the
/// decision saw) and says `why`; nothing if it is gone already or was
/// replaced since.
async fn delete_pod(
    ctx: &Context,
    cluster: &DatabaseCluster,
    name: &str,
    uid: Option<String>,
    why: Deletion,
) -> Result<(), Error> {
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    if !delete_exactly(&pods, name, uid, None).await? {
        return Ok(());
    }
    match why.kind {
        EventType::Warning => tracing::warn!(pod = %name, "{}", why.message),
        EventType::Normal => tracing::info!(pod = %name, "{}", why.message),
    }
    publish(ctx, cluster, why.kind, why.reason, why.message).await;
    Ok(())
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

/// The cluster's StatefulSet as the cache holds it.
fn cached_stateful_set(ctx: &Context, cluster: &DatabaseCluster) -> Option<Arc<StatefulSet>> {
    cached_child(&ctx.caches.stateful_sets, cluster)
}

/// The child of the cluster's own name in `cache`.
fn cached_child<K>(cache: &Store<K>, cluster: &DatabaseCluster) -> Option<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone,
{
    let namespace = cluster.namespace().unwrap_or_default();
    cache.get(&ObjectRef::new(&cluster.name_any()).within(&namespace))
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
    match build::disruption_budget(cluster) {
        Some(budget) => {
            apply_child(ctx, cluster, &caches.disruption_budgets, budget).await?;
        }
        None => delete_child(ctx, cluster, &caches.disruption_budgets).await?,
    }
    for lease in build::member_leases(cluster) {
        apply_child(ctx, cluster, &caches.leases, lease).await?;
    }
    let existing = cached_stateful_set(ctx, cluster);
    if let Some(old) = existing.as_deref().filter(|s| build::needs_replacing(s)) {
        // Its deletion wakes the next reconcile, which creates the new one.
        orphan_stateful_set(ctx, old).await?;
        return Ok(old.clone());
    }
    let desired = build::stateful_set(
        cluster,
        existing.as_deref().and_then(build::claim_templates),
    );
    apply_child(ctx, cluster, &caches.stateful_sets, desired).await
}

/// Deletes the cached child of the cluster's name that it no longer needs
/// (the disruption budget of a cluster scaled down to one instance); one
/// that another object owns is left alone.
async fn delete_child<K>(
    ctx: &Context,
    cluster: &DatabaseCluster,
    cache: &Store<K>,
) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let Some(child) = cached_child(cache, cluster) else {
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

/// Deletes `name` only while it is still the object with `uid`. Returns
/// whether this call deleted it: one already gone (404) or replaced by a
/// new object of the same name (409, the precondition) is no error, and
/// the new one is never touched.
async fn delete_exactly<K>(
    api: &Api<K>,
    name: &str,
    uid: Option<String>,
    propagation_policy: Option<kube::api::PropagationPolicy>,
) -> Result<bool, Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = kube::api::DeleteParams {
        propagation_policy,
        preconditions: Some(kube::api::Preconditions {
            uid,
            resource_version: None,
        }),
        ..kube::api::DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(false),
        Err(e) => Err(e.into()),
    }
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
    // Read, not cached: only a pending growth gets here, and a cluster-wide
    // StorageClass cache would cost every replica memory for this rare read.
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
        ctx.applier.merge_patch(&claims, &*claim, &patch).await?;
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
    let (applied, _) = ctx
        .applier
        .apply(&api, MANAGER, &desired, current.as_deref())
        .await?;
    Ok(applied)
}

/// Creates the credentials Secret once. It is never updated: the passwords
/// are in use from the moment the first instance starts.
/// The cluster's CA (made once), its server certificate (issued again when
/// due) and the CA published for clients; returns when the server
/// certificate is due for renewal.
async fn ensure_tls(ctx: &Context, cluster: &DatabaseCluster) -> Result<SystemTime, Error> {
    let names = Names::of(cluster);
    let namespace = cluster.namespace().unwrap_or_default();
    let cached = |name: &str| {
        ctx.caches
            .secrets
            .get(&ObjectRef::new(name).within(&namespace))
    };
    let authority = match cached(&names.ca) {
        Some(secret) => tls::authority_of(&secret).ok_or_else(|| {
            Error::DependencyNotReady(format!(
                "Secret {} to hold the cluster's CA (ca.crt and ca.key): delete it to make a new CA",
                names.ca
            ))
        })?,
        None => create_authority(ctx, cluster).await?,
    };
    let hosts = tls::server_hosts(cluster);
    let server = cached(&names.server_tls);
    let now = SystemTime::now();
    let renew_at = match tls::renewal(server.as_deref(), &authority, &hosts, now) {
        tls::Renewal::At(due) => due,
        tls::Renewal::Now(why) => {
            let issued = certs::issue(&authority, &hosts, tls::SERVER_VALIDITY)
                .map_err(|e| Error::Certificate(e.to_string()))?;
            let mut desired = tls::server_secret(cluster, &authority, &issued);
            let api = Api::<Secret>::namespaced(ctx.client.clone(), &namespace);
            match server {
                // Replaced only as the cache saw it: a concurrent change wins.
                Some(current) => {
                    desired.metadata.resource_version = current.resource_version();
                    api.replace(&names.server_tls, &PostParams::default(), &desired)
                        .await?;
                    publish(
                        ctx,
                        cluster,
                        EventType::Normal,
                        "IssuedServerCertificate",
                        format!("Issued a new server certificate ({why}); the instances reload it without a restart"),
                    )
                    .await;
                }
                // A new cluster's first certificate is no news.
                None => create_once(&api, &desired).await?,
            }
            now + (tls::SERVER_VALIDITY - tls::RENEW_BEFORE)
        }
    };
    let published = tls::ca_config_map(cluster, &authority);
    apply_child(ctx, cluster, &ctx.caches.config_maps, published).await?;
    Ok(renew_at)
}

/// A new CA in Secret `<name>-ca`; the one already there if an earlier
/// reconcile made it and the cache has not shown it yet.
async fn create_authority(ctx: &Context, cluster: &DatabaseCluster) -> Result<Authority, Error> {
    let name = Names::of(cluster).ca;
    let common_name = format!(
        "{}/{} CA",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    );
    let authority = certs::new_authority(&common_name, tls::CA_VALIDITY)
        .map_err(|e| Error::Certificate(e.to_string()))?;
    let api =
        Api::<Secret>::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    match api
        .create(&PostParams::default(), &tls::ca_secret(cluster, &authority))
        .await
    {
        Ok(_) => Ok(authority),
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let existing = api.get(&name).await?;
            tls::authority_of(&existing).ok_or_else(|| {
                Error::DependencyNotReady(format!("Secret {name} to hold the cluster's CA"))
            })
        }
        Err(e) => Err(e.into()),
    }
}

/// Creates `secret`; one that exists already (an earlier reconcile made it
/// and the cache has not shown it yet) is left as it is.
async fn create_once(api: &Api<Secret>, secret: &Secret) -> Result<(), Error> {
    match api.create(&PostParams::default(), secret).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

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
    create_once(&Api::namespaced(ctx.client.clone(), &namespace), &secret).await
}

/// Sets the role label on each instance pod where it differs, replicas
/// first (so `-rw` never selects two pods; none is primary during a
/// switchover's demotion), and the bootstrap annotation on the primary of a
/// cluster not yet initialised (removed once it is).
async fn label_roles(
    ctx: &Context,
    cluster: &DatabaseCluster,
    pods: &[Arc<Pod>],
    primary: Option<&str>,
    initialized: bool,
) -> Result<(), Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let api = Api::<Pod>::namespaced(ctx.client.clone(), &namespace);
    let restores = cluster
        .spec
        .bootstrap
        .as_ref()
        .is_some_and(|b| b.restores());
    let bootstrap_kind = if restores {
        BOOTSTRAP_RESTORE
    } else {
        BOOTSTRAP_INITDB
    };
    let mut pods = pods.to_vec();
    pods.sort_by_key(|pod| Some(pod.name_any().as_str()) == primary);
    for pod in pods {
        let is_primary = Some(pod.name_any().as_str()) == primary;
        let role = if is_primary {
            ROLE_PRIMARY
        } else {
            ROLE_REPLICA
        };
        let bootstrap = (is_primary && !initialized).then_some(bootstrap_kind);
        if pod.labels().get(ROLE_LABEL).map(String::as_str) == Some(role)
            && pod
                .annotations()
                .get(BOOTSTRAP_ANNOTATION)
                .map(String::as_str)
                == bootstrap
        {
            continue;
        }
        let patch = json!({ "metadata": {
            "labels": { ROLE_LABEL: role },
            "annotations": { BOOTSTRAP_ANNOTATION: bootstrap },
        }});
        // Through the applier: a Pod cache lagging this write (a new
        // leader's, after an API server outage) must not get it again at
        // every heartbeat.
        ctx.applier.merge_patch(&api, &*pod, &patch).await?;
    }
    Ok(())
}

/// Writes `status` through the status subresource unless it is what the
/// cluster already reports, and announces condition transitions as Events.
async fn write_status(
    ctx: &Context,
    cluster: &DatabaseCluster,
    mut status: DatabaseClusterStatus,
) -> Result<(), Error> {
    let previous = cluster.status.as_ref();
    if let Some(previous) = previous {
        conditions::keep_transition_times(&mut status.conditions, &previous.conditions);
    }
    if previous == Some(&status) {
        return Ok(());
    }
    let api = Api::<DatabaseCluster>::namespaced(
        ctx.client.clone(),
        &cluster.namespace().unwrap_or_default(),
    );
    let Some(written) = ctx
        .applier
        .apply_status(&api, MANAGER, cluster, &status)
        .await?
    else {
        // Written already over the version the cache shows (it lags).
        return Ok(());
    };
    ctx.decisions.written(&written, false);
    let reference = cluster.object_ref(&());
    for event in transition_events(previous, &status) {
        if let Err(e) = ctx.recorder.publish(&event, &reference).await {
            // An Event is a courtesy; losing one must not fail the reconcile.
            tracing::warn!(error = %e, "could not publish an Event");
        }
    }
    Ok(())
}

/// The Events announcing what changed from `previous` to `status`: one per
/// real transition (every Event is a write).
fn transition_events(
    previous: Option<&DatabaseClusterStatus>,
    status: &DatabaseClusterStatus,
) -> Vec<Event> {
    let changed = |type_: &str| {
        let current = status::condition(Some(status), type_)?;
        let before = status::condition(previous, type_);
        // A new cluster's instances are not ready yet: expected, no Warning.
        if before.is_none() && current.reason == status::reason::INSTANCES_NOT_READY {
            return None;
        }
        events::on_transition(before, current).map(|event| (current, event))
    };
    let ready = changed(READY);
    // When Ready changes, its Event announces the transition: progress that
    // converged and health that came back are part of it (progress that
    // ended otherwise, `SwitchoverRefused`, is not). A condition turning for
    // the reason, or with the message, of one announced already is the same
    // news.
    let ready_changed = ready.is_some();
    let part_of_ready = |current: &Condition| {
        let back_to_normal = match current.type_.as_str() {
            PROGRESSING => current.status == "False" && current.reason == status::reason::CONVERGED,
            DEGRADED => current.status == "False",
            _ => false,
        };
        ready_changed && back_to_normal
    };
    let mut announced: Vec<Event> = Vec::new();
    for (current, event) in [
        ready,
        changed(PROGRESSING),
        changed(DEGRADED),
        changed(CONTINUOUS_ARCHIVING),
    ]
    .into_iter()
    .flatten()
    {
        let same_news = announced
            .iter()
            .any(|e| e.reason == event.reason || (e.note.is_some() && e.note == event.note));
        if !part_of_ready(current) && !same_news {
            announced.push(event);
        }
    }
    announced
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(primary: &str) -> DatabaseCluster {
        let mut cluster = crate::fixtures::cluster(3, &[]);
        cluster.status = Some(DatabaseClusterStatus {
            current_primary: Some(primary.to_owned()),
            ..DatabaseClusterStatus::default()
        });
        cluster
    }

    fn with_conditions(conditions: &[(&str, bool, &str)]) -> DatabaseClusterStatus {
        let now = Time(Timestamp::from_second(1).expect("valid"));
        DatabaseClusterStatus {
            conditions: conditions
                .iter()
                .map(|(type_, ok, reason)| {
                    cairn_runtime::conditions::new(type_, *ok, reason, "", Some(1), now.clone())
                })
                .collect(),
            ..DatabaseClusterStatus::default()
        }
    }

    #[test]
    fn a_new_cluster_that_becomes_ready_is_announced_by_one_event() {
        use status::reason::{ALL_INSTANCES_READY, CONVERGED, CREATING, INSTANCES_NOT_READY};
        let creating = with_conditions(&[
            (READY, false, INSTANCES_NOT_READY),
            (PROGRESSING, true, CREATING),
            (DEGRADED, false, status::reason::HEALTHY),
        ]);
        assert!(transition_events(None, &creating).is_empty());
        let ready = with_conditions(&[
            (READY, true, ALL_INSTANCES_READY),
            (PROGRESSING, false, CONVERGED),
            (DEGRADED, false, status::reason::HEALTHY),
        ]);
        let events = transition_events(Some(&creating), &ready);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].reason, ALL_INSTANCES_READY);
        assert_eq!(events[0].type_, EventType::Normal);

        // A rollout that ends while the cluster stays Ready is its own news.
        let rolling = with_conditions(&[
            (READY, true, ALL_INSTANCES_READY),
            (PROGRESSING, true, status::reason::ROLLING_OUT),
            (DEGRADED, false, status::reason::HEALTHY),
        ]);
        let events = transition_events(Some(&rolling), &ready);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].reason, CONVERGED);
        assert_eq!(events[0].type_, EventType::Normal);
    }

    /// The reasons of the Events announcing `previous` → `status`.
    fn reasons(previous: &DatabaseClusterStatus, status: &DatabaseClusterStatus) -> Vec<String> {
        transition_events(Some(previous), status)
            .into_iter()
            .map(|e| e.reason)
            .collect()
    }

    #[test]
    fn a_transition_of_several_conditions_is_one_event_per_news() {
        use status::reason::{
            ALL_INSTANCES_READY, CONVERGED, FAILOVER_BLOCKED, HEALTHY, INSTANCES_NOT_READY,
            INSTANCES_UNAVAILABLE, SCALING, SWITCHOVER_REFUSED,
        };
        let ready = with_conditions(&[
            (READY, true, ALL_INSTANCES_READY),
            (PROGRESSING, false, CONVERGED),
            (DEGRADED, false, HEALTHY),
        ]);
        // The primary lost with no replica: three conditions, one reason.
        let blocked = with_conditions(&[
            (READY, false, FAILOVER_BLOCKED),
            (PROGRESSING, false, FAILOVER_BLOCKED),
            (DEGRADED, true, FAILOVER_BLOCKED),
        ]);
        let events = transition_events(Some(&ready), &blocked);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].reason, FAILOVER_BLOCKED);
        assert_eq!(events[0].type_, EventType::Warning);

        // Then both instances are recreated: Ready says why it is not, the
        // new progress is news, Degraded going back to False is not.
        let scaling = with_conditions(&[
            (READY, false, INSTANCES_NOT_READY),
            (PROGRESSING, true, SCALING),
            (DEGRADED, false, HEALTHY),
        ]);
        assert_eq!(reasons(&blocked, &scaling), [INSTANCES_NOT_READY, SCALING]);

        // Progress that ended otherwise than converged is news of its own.
        let refused = with_conditions(&[
            (READY, true, ALL_INSTANCES_READY),
            (PROGRESSING, false, SWITCHOVER_REFUSED),
            (DEGRADED, false, HEALTHY),
        ]);
        assert_eq!(
            reasons(&blocked, &refused),
            [ALL_INSTANCES_READY, SWITCHOVER_REFUSED]
        );

        // Health back while Ready stays as it was is news of its own.
        let degraded = with_conditions(&[
            (READY, true, ALL_INSTANCES_READY),
            (PROGRESSING, false, CONVERGED),
            (DEGRADED, true, INSTANCES_UNAVAILABLE),
        ]);
        assert_eq!(reasons(&degraded, &ready), [HEALTHY]);
    }

    #[test]
    fn a_copy_older_than_a_recorded_decision_is_behind_until_the_cache_shows_it() {
        let decisions = Decisions::default();
        assert!(!decisions.is_behind(&cluster("orders-0")));
        decisions.written(&cluster("orders-1"), true);
        assert!(decisions.is_behind(&cluster("orders-0")));
        assert!(!decisions.is_behind(&cluster("orders-1")));
        // Forgotten once seen: a later change by anyone is the truth.
        assert!(!decisions.is_behind(&cluster("orders-0")));
    }

    fn switchover(from: &str, to: &str, at: i64, promoted: bool) -> SwitchoverRecord {
        let time = |s: i64| Time(Timestamp::from_second(s).expect("valid"));
        SwitchoverRecord {
            from: from.to_owned(),
            to: to.to_owned(),
            started_at: time(at),
            promoted_at: promoted.then(|| time(at + 5)),
            completed_at: promoted.then(|| time(at + 6)),
            write_unavailable_seconds: promoted.then_some(6.0),
        }
    }

    /// What the API server makes of a recorded decision (RFC 7386).
    fn recorded(before: &DatabaseCluster, fields: serde_json::Value) -> DatabaseClusterStatus {
        let previous = serde_json::to_value(&before.status).expect("serialisable");
        let mut status = previous.clone();
        json_patch::merge(&mut status, &replacing(&previous, fields));
        serde_json::from_value(status).expect("a status")
    }

    #[test]
    fn a_new_switchover_replaces_a_finished_one_whole() {
        let mut before = cluster("orders-2");
        let status = before.status.as_mut().expect("status");
        status.initialized = true;
        status.last_switchover = Some(switchover("orders-0", "orders-2", 1_700_000_000, true));
        let started = switchover("orders-2", "orders-0", 1_700_000_100, false);

        let after = recorded(&before, json!({ "lastSwitchover": started }));

        assert_eq!(after.last_switchover, Some(started));
        assert!(switchover::under_way(after.last_switchover.as_ref()).is_some());
        assert_eq!(after.current_primary.as_deref(), Some("orders-2"));
        assert!(after.initialized, "fields not named are kept");
    }

    #[test]
    fn a_new_failover_is_not_completed_by_the_last_one() {
        let time = |s: i64| Time(Timestamp::from_second(s).expect("valid"));
        let failover = |from: &str, to: &str, at: i64, done: bool| FailoverRecord {
            from: from.to_owned(),
            to: to.to_owned(),
            reason: "no heartbeat for 11 s".to_owned(),
            primary_last_seen: time(at - 11),
            promoted_at: time(at),
            completed_at: done.then(|| time(at + 2)),
        };
        let mut before = cluster("orders-1");
        before.status.as_mut().expect("status").last_failover =
            Some(failover("orders-0", "orders-1", 1_700_000_000, true));
        let next = failover("orders-1", "orders-2", 1_700_000_100, false);

        let after = recorded(
            &before,
            json!({ "currentPrimary": "orders-2", "lastFailover": next }),
        );

        assert_eq!(after.last_failover, Some(next));
        assert_eq!(after.current_primary.as_deref(), Some("orders-2"));
    }

    #[test]
    fn the_clusters_timeline_is_the_one_its_serving_primary_reports() {
        use cairn_api::database::instance::ObservedState;
        let report = |pod: &str, role: &str, ready: bool, timeline: u32| Member {
            pod: pod.to_owned(),
            observed: ObservedState {
                ready,
                role: Some(role.to_owned()),
                timeline: Some(timeline),
                ..ObservedState::default()
            },
            ..Member::default()
        };
        let mut before = cluster("orders-1");
        assert_eq!(cluster_timeline(&before, "orders-1", &[]), None);
        let serving = [report("orders-1", "primary", true, 2)];
        assert_eq!(cluster_timeline(&before, "orders-1", &serving), Some(2));
        before.status.as_mut().expect("status").timeline = Some(2);
        // Promoted but still in recovery on the old timeline: not yet news.
        let promoting = [report("orders-2", "replica", true, 2)];
        assert_eq!(cluster_timeline(&before, "orders-2", &promoting), Some(2));
        let promoted = [report("orders-2", "primary", true, 3)];
        assert_eq!(cluster_timeline(&before, "orders-2", &promoted), Some(3));
        // A replica's report, however new, is not the cluster's timeline.
        let replica = [report("orders-0", "replica", true, 7)];
        assert_eq!(cluster_timeline(&before, "orders-1", &replica), Some(2));
        // Volumes restored in place: the primary's word, not the old record.
        let restored = [report("orders-1", "primary", true, 1)];
        assert_eq!(cluster_timeline(&before, "orders-1", &restored), Some(1));
    }

    #[test]
    fn a_plain_status_write_records_nothing() {
        let decisions = Decisions::default();
        decisions.written(&cluster("orders-1"), false);
        assert!(!decisions.is_behind(&cluster("orders-0")));
    }
}

#[cfg(test)]
#[path = "reconcile_error_paths.rs"]
mod error_paths;
