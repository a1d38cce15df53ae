//! What every reconcile of a `DatabaseCluster` reads from and writes with:
//! the client, the caches of the children, what this process remembers
//! between reconciles, and the read of one cluster's caches ([`Observed`]).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_api::database::instance::{ObservedState, parse_lsn};
use cairn_api::database::v1::DatabaseCluster;
use cairn_runtime::admin::{Health, Sight};
use cairn_runtime::apply::Applier;
use cairn_runtime::events;
use cairn_runtime::heartbeat::Heartbeat;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Node, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};

use crate::drain;
use crate::failover::Member;
use crate::leftovers;
use crate::metrics::ClusterMetrics;

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
    /// Each cluster's members' heartbeats (`namespace/name` → pod → the
    /// renewal seen, and when this process first saw it): silence is judged
    /// on this process's monotonic clock, as the runtime's leader election
    /// does, never by comparing another node's wall clock with this one's.
    pub sightings: Mutex<HashMap<String, HashMap<String, Sighting>>>,
    /// Every apply and status write, remembered against a lagging cache,
    /// and the decisions recorded that the cache has not shown yet.
    pub applier: Applier,
    /// How old a replaced StatefulSet's successor must be before its
    /// leftover pods are deleted (see `leftovers.rs`).
    pub collector_grace: Duration,
    /// The process's watch health: a renewal made while the Lease watch
    /// failed reaches the cache only once it lists again, so no member's
    /// silence is judged meanwhile (none if not given: tests).
    pub health: Option<Health>,
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
            sightings: Mutex::default(),
            applier: Applier::default(),
            collector_grace: leftovers::COLLECTOR_GRACE,
            health: None,
        }
    }

    /// The same, judging silence by the Lease watch `health` reports.
    pub fn with_health(mut self, health: Health) -> Self {
        self.health = Some(health);
        self
    }

    /// What the Lease cache can have missed.
    fn lease_sight(&self) -> Sight {
        self.health
            .as_ref()
            .map_or(Sight::Unbroken, |health| health.sight(&Lease::kind(&())))
    }

    /// The same, giving the garbage collector `grace` instead of
    /// [`leftovers::COLLECTOR_GRACE`].
    pub fn with_collector_grace(mut self, grace: Duration) -> Self {
        self.collector_grace = grace;
        self
    }

    /// Publishes an Event about `cluster` (never fails the reconcile).
    pub async fn publish(
        &self,
        cluster: &DatabaseCluster,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let reference = cluster.object_ref(&());
        events::publish(&self.recorder, &reference, type_, reason, note).await;
    }

    /// The per-cluster gauges refreshed from the cache, and what this
    /// process remembers of deleted clusters dropped (every few seconds).
    pub fn housekeeping(&self, clusters: &Store<DatabaseCluster>) {
        self.metrics.refresh(&clusters.state());
        self.forget_missing(clusters);
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
        self.sightings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|key, _| exists(key));
    }
}

impl Context {
    /// For tests: as if this process had watched each Lease since its
    /// renewal (by this machine's clock), as a long-running controller has.
    #[cfg(test)]
    pub fn watched_since_renewal(&self, leases: &[Lease]) {
        let now = Instant::now();
        let mut sightings = self.sightings.lock().unwrap_or_else(|p| p.into_inner());
        for lease in leases {
            let member = Member::from_lease(lease);
            let age = member
                .last_seen
                .and_then(|seen| {
                    Duration::try_from(k8s_openapi::jiff::Timestamp::now().duration_since(seen))
                        .ok()
                })
                .unwrap_or_default();
            let cluster = lease
                .labels()
                .get("app.kubernetes.io/instance")
                .cloned()
                .unwrap_or_default();
            let key = format!("{}/{cluster}", lease.namespace().unwrap_or_default());
            sightings.entry(key).or_default().insert(
                member.pod,
                Sighting {
                    heartbeat: Heartbeat::since(
                        member.last_seen,
                        now.checked_sub(age).unwrap_or(now),
                    ),
                    written: None,
                    standby_names: None,
                },
            );
        }
    }
}

/// A member's latest heartbeat as this process saw it.
#[derive(Clone, Debug)]
pub struct Sighting {
    heartbeat: Heartbeat,
    /// The highest WAL position reported, and on which timeline.
    written: Option<(Option<u32>, u64)>,
    /// The last `synchronous_standby_names` it reported running.
    standby_names: Option<String>,
}

impl Sighting {
    /// A position only grows on one timeline; a report without one (its
    /// sample failed) keeps the last. A failed sample likewise keeps the
    /// quorum the member last ran as a primary, so its report carries it.
    fn remember(&mut self, observed: &mut ObservedState) {
        match &observed.synchronous_standby_names {
            Some(names) => self.standby_names = Some(names.clone()),
            None if observed.role.is_none() => {
                observed.synchronous_standby_names = self.standby_names.clone();
            }
            None => self.standby_names = None,
        }
        let Some(position) = observed.wal_position.as_deref().and_then(parse_lsn) else {
            return;
        };
        self.written = match self.written {
            Some((timeline, old)) if timeline == observed.timeline => {
                Some((timeline, old.max(position)))
            }
            _ => Some((observed.timeline, position)),
        };
    }
}

pub(crate) fn key(cluster: &DatabaseCluster) -> String {
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
    /// Every node (cluster-scoped, trimmed to what a drain shows).
    pub nodes: Store<Node>,
}

/// What the caches show of one cluster, read once at the start of a
/// reconcile so every step decides on the same picture.
pub struct Observed {
    /// The members, from their Leases, by pod name.
    pub members: Vec<Member>,
    /// The instance pods.
    pub pods: Vec<Arc<Pod>>,
    /// The StatefulSet, as last seen.
    pub stateful_set: Option<Arc<StatefulSet>>,
    /// The instance pods whose node is being drained.
    pub draining: BTreeSet<String>,
}

impl Observed {
    pub fn of(ctx: &Context, cluster: &DatabaseCluster) -> Self {
        let pods = instance_pods(ctx, cluster);
        let draining = drain::pods_on_draining_nodes(pods.iter().map(AsRef::as_ref), |node| {
            ctx.caches.nodes.get(&ObjectRef::new(node))
        });
        Self {
            members: members(ctx, cluster),
            pods,
            stateful_set: cached_child(&ctx.caches.stateful_sets, cluster),
            draining,
        }
    }

    /// The pods, borrowed (as the pure decisions take them).
    pub fn pod_refs(&self) -> Vec<&Pod> {
        self.pods.iter().map(AsRef::as_ref).collect()
    }
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
    let mut sightings = ctx.sightings.lock().unwrap_or_else(|p| p.into_inner());
    let seen = sightings.entry(key(cluster)).or_default();
    // A heartbeat is new when its renewal differs from the one last seen; a
    // member first seen by this process (a restart, a new leader) counts
    // from now, so a restart only ever delays a failover.
    let now = Instant::now();
    let sight = ctx.lease_sight();
    *seen = members
        .iter_mut()
        .map(|member| {
            let old = seen.get(&member.pod);
            let mut sighting = Sighting {
                heartbeat: Heartbeat::seen(old.map(|o| &o.heartbeat), member.last_seen, now),
                written: old.and_then(|o| o.written),
                standby_names: old.and_then(|o| o.standby_names.clone()),
            };
            sighting.remember(&mut member.observed);
            member.silent = sighting.heartbeat.silence(sight, now);
            member.written = sighting.written.map(|(_, position)| position);
            (member.pod.clone(), sighting)
        })
        .collect();
    members
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

/// The child of the cluster's own name in `cache`.
pub(crate) fn cached_child<K>(cache: &Store<K>, cluster: &DatabaseCluster) -> Option<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone,
{
    let namespace = cluster.namespace().unwrap_or_default();
    cache.get(&ObjectRef::new(&cluster.name_any()).within(&namespace))
}

/// The object `name` in the cluster's namespace in `cache`.
pub(crate) fn cached_named<K>(
    cache: &Store<K>,
    cluster: &DatabaseCluster,
    name: &str,
) -> Option<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone,
{
    let namespace = cluster.namespace().unwrap_or_default();
    cache.get(&ObjectRef::new(name).within(&namespace))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(timeline: u32, position: Option<&str>) -> ObservedState {
        ObservedState {
            timeline: Some(timeline),
            wal_position: position.map(str::to_owned),
            ..ObservedState::default()
        }
    }

    #[test]
    fn a_failed_sample_reports_the_quorum_last_run() {
        let mut sighting = Sighting {
            heartbeat: Heartbeat::since(None, Instant::now()),
            written: None,
            standby_names: None,
        };
        let mut primary = ObservedState {
            role: Some("primary".to_owned()),
            synchronous_standby_names: Some("ANY 1 (db-1)".to_owned()),
            ..ObservedState::default()
        };
        sighting.remember(&mut primary);
        let mut failed = ObservedState::default();
        sighting.remember(&mut failed);
        assert_eq!(
            failed.synchronous_standby_names.as_deref(),
            Some("ANY 1 (db-1)")
        );
        let mut replica = ObservedState {
            role: Some("replica".to_owned()),
            ..ObservedState::default()
        };
        sighting.remember(&mut replica);
        assert_eq!(replica.synchronous_standby_names, None);
        sighting.remember(&mut ObservedState::default());
        assert_eq!(sighting.standby_names, None, "a replica runs no quorum");
    }

    #[test]
    fn the_last_known_position_survives_a_failed_sample_and_resets_on_a_new_timeline() {
        let mut sighting = Sighting {
            heartbeat: Heartbeat::since(None, Instant::now()),
            written: None,
            standby_names: None,
        };
        sighting.remember(&mut report(1, Some("0/9000")));
        sighting.remember(&mut report(1, None));
        assert_eq!(sighting.written, Some((Some(1), 0x9000)));
        sighting.remember(&mut report(1, Some("0/8000")));
        assert_eq!(
            sighting.written,
            Some((Some(1), 0x9000)),
            "a position only grows"
        );
        sighting.remember(&mut report(2, Some("0/100")));
        assert_eq!(sighting.written, Some((Some(2), 0x100)));
    }
}
