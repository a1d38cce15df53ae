//! The desired children of a `DatabaseCluster`, built without I/O (unit-tested
//! here; applied by `reconcile`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use cairn_api::backup::v1::{BackupMethod, S3Destination};
use cairn_api::database::v1::{DatabaseCluster, REPLICATION_USER, RESTARTED_AT_ANNOTATION};
use cairn_api::database::{instance, pod};
use cairn_runtime::labels;
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, ObjectFieldSelector,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, Secret, Service, ServiceAccount, ServicePort, ServiceSpec,
    TopologySpreadConstraint, VolumeResourceRequirements,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};

/// `app.kubernetes.io/name` of every child.
pub use cairn_api::database::instance::APP_NAME;
use cairn_api::database::instance::MEMBERSHIP_COMPONENT;
pub use cairn_api::database::instance::{ROLE_LABEL, ROLE_PRIMARY, ROLE_REPLICA};
/// Pod-template annotation: a digest of the settings that need a restart, so
/// changing one rolls the pods and changing any other does not.
pub const RESTART_DIGEST_ANNOTATION: &str = "database.cairn.dev/restart-config-digest";
pub use cairn_api::database::pod::{DEFAULT_IMAGE_REPOSITORY, Names};

pub const POSTGRES_PORT: i32 = instance::POSTGRES_PORT as i32;
pub const INSTANCE_HTTP_PORT: i32 = instance::INSTANCE_HTTP_PORT as i32;
pub const INSTANCE_METRICS_PORT: i32 = instance::INSTANCE_METRICS_PORT as i32;

/// Settings Cairn manages (the schema rejects them in `spec.postgres.parameters`).
fn managed_parameters() -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        ("listen_addresses", "'*'".to_owned()),
        ("port", POSTGRES_PORT.to_string()),
        ("hot_standby", "on".to_owned()),
        ("wal_level", "replica".to_owned()),
        ("wal_log_hints", "on".to_owned()),
        ("max_wal_senders", "10".to_owned()),
        ("max_replication_slots", "10".to_owned()),
        (
            "hba_file",
            format!("'{}/pg_hba.conf'", instance::CONFIG_DIR),
        ),
    ])
}

/// A quorum of `synchronousReplicas` among every instance of the cluster.
/// The primary is listed too, so a failover changes nothing here: a primary
/// never streams from itself, and replicas ignore the setting.
fn synchronous_parameters(cluster: &DatabaseCluster) -> Option<(&'static str, String)> {
    let quorum = cluster.spec.synchronous_replicas()?;
    let names: Vec<String> = pod_names(cluster)
        .iter()
        .map(|pod| format!("\"{pod}\""))
        .collect();
    Some((
        "synchronous_standby_names",
        format!("'ANY {quorum} ({})'", names.join(", ")),
    ))
}

/// Defaults written before `spec.postgres.parameters`, which may override them.
fn default_parameters(cluster: &DatabaseCluster) -> BTreeMap<&'static str, String> {
    // The WAL replication slots may hold for a replica that stopped: a tenth
    // of the volume (at least 64 MB), so a dead replica cannot fill the
    // primary's disk; beyond it the replica must be cloned again.
    let volume_bytes = cairn_api::validate::parse_quantity(&cluster.spec.storage.size).unwrap_or(0)
        / 1_000_000_000; // the quantity is in billionths
    let slot_keep_mb = (volume_bytes / 10 / (1024 * 1024)).max(64);
    BTreeMap::from([
        // WAL a replica or a rewound former primary may still need after a
        // disconnection or a failover (pg_rewind reads it from the old primary).
        ("wal_keep_size", "'256MB'".to_owned()),
        ("max_slot_wal_keep_size", format!("'{slot_keep_mb}MB'")),
        // After a failover a replica's connection may still lead to the old
        // primary (a frozen node answers TCP but sends nothing): it gives up
        // and reconnects through `-rw` within this time, not the default
        // minute. A primary likewise drops a replica that stopped answering,
        // so a frozen synchronous standby holds commits no longer than this.
        ("wal_receiver_timeout", "'5s'".to_owned()),
        ("wal_sender_timeout", "'5s'".to_owned()),
    ])
}

/// The pods the StatefulSet keeps: `spec.instances`, or up to the primary's
/// while a scale-down waits for a switchover to move it to a pod that stays
/// (see `rollout.rs`).
pub fn kept_instances(cluster: &DatabaseCluster) -> i32 {
    let primary = cluster
        .status
        .as_ref()
        .and_then(|s| s.current_primary.as_deref())
        .map_or(0, crate::rollout::ordinal);
    cluster
        .spec
        .instances
        .max(i32::try_from(primary).unwrap_or(0).saturating_add(1))
}

/// Labels selecting every instance pod of the cluster.
pub fn selector_labels(cluster: &DatabaseCluster) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), APP_NAME.to_owned()),
        ("app.kubernetes.io/instance".to_owned(), cluster.name_any()),
    ])
}

/// The same as a label selector string (for `status.selector`).
pub fn selector_string(cluster: &DatabaseCluster) -> String {
    selector_labels(cluster)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

pub(crate) fn metadata(cluster: &DatabaseCluster, name: &str, component: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: cluster.namespace(),
        labels: Some(labels::standard(APP_NAME, &cluster.name_any(), component)),
        owner_references: Some(vec![owner_reference(cluster)]),
        ..ObjectMeta::default()
    }
}

fn owner_reference(cluster: &DatabaseCluster) -> OwnerReference {
    OwnerReference {
        api_version: DatabaseCluster::api_version(&()).into_owned(),
        kind: DatabaseCluster::kind(&()).into_owned(),
        name: cluster.name_any(),
        uid: cluster.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// postgresql.conf and pg_hba.conf.
pub fn config_map(cluster: &DatabaseCluster) -> ConfigMap {
    let names = Names::of(cluster);
    ConfigMap {
        metadata: metadata(cluster, &names.config, "config"),
        data: Some(BTreeMap::from([
            ("postgresql.conf".to_owned(), postgresql_conf(cluster)),
            ("pg_hba.conf".to_owned(), pg_hba_conf()),
            (instance::MEMBERS_FILE.to_owned(), members_file(cluster)),
        ])),
        ..ConfigMap::default()
    }
}

fn postgresql_conf(cluster: &DatabaseCluster) -> String {
    let mut conf = String::from(
        "# Written by cairn-database-controller; edit spec.postgres.parameters instead.\n",
    );
    for (name, value) in managed_parameters()
        .into_iter()
        .chain(synchronous_parameters(cluster))
        .chain(default_parameters(cluster))
    {
        let _ = writeln!(conf, "{name} = {value}");
    }
    for (name, value) in &cluster.spec.postgres.parameters {
        let _ = writeln!(conf, "{name} = '{}'", value.replace('\'', "''"));
    }
    conf
}

/// The pods the cluster keeps, one per line.
fn members_file(cluster: &DatabaseCluster) -> String {
    pod_names(cluster)
        .iter()
        .map(|pod| format!("{pod}\n"))
        .collect()
}

/// TLS for every connection from outside the pod; over loopback (inside
/// the pod: cairn-instance's own monitoring session) it is not needed.
fn pg_hba_conf() -> String {
    format!(
        "# Written by cairn-database-controller.\n\
         local all all peer\n\
         host all all 127.0.0.1/32 scram-sha-256\n\
         host all all ::1/128 scram-sha-256\n\
         hostssl replication {REPLICATION_USER} all scram-sha-256\n\
         hostssl all all all scram-sha-256\n\
         hostnossl all all all reject\n"
    )
}

/// A digest of the user's settings that need a restart: equal digests, no roll.
pub fn restart_digest(cluster: &DatabaseCluster) -> String {
    use std::hash::{Hash, Hasher};
    // FNV-1a: stable across builds and platforms, unlike DefaultHasher.
    struct Fnv(u64);
    impl Hasher for Fnv {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            for byte in bytes {
                self.0 = (self.0 ^ u64::from(*byte)).wrapping_mul(0x100_0000_01b3);
            }
        }
    }
    let mut hasher = Fnv(0xcbf2_9ce4_8422_2325);
    for (name, value) in &cluster.spec.postgres.parameters {
        if cairn_api::database::v1::RESTART_PARAMETERS.contains(&name.to_ascii_lowercase().as_str())
        {
            name.to_ascii_lowercase().hash(&mut hasher);
            value.hash(&mut hasher);
        }
    }
    format!("{:016x}", hasher.finish())
}

/// The Secret with generated passwords. Created once: the passwords are never
/// regenerated, and the Secret is never applied over.
pub fn credentials(cluster: &DatabaseCluster, generate: &mut impl FnMut() -> String) -> Secret {
    let names = Names::of(cluster);
    let (database, owner) = match cluster
        .spec
        .bootstrap
        .as_ref()
        .and_then(|b| b.initdb.as_ref())
    {
        Some(initdb) => (initdb.database.clone(), initdb.owner.clone()),
        None => ("app".to_owned(), "app".to_owned()),
    };
    Secret {
        metadata: metadata(cluster, &names.credentials, "credentials"),
        type_: Some("Opaque".to_owned()),
        string_data: Some(BTreeMap::from([
            (instance::DATABASE_KEY.to_owned(), database),
            (instance::OWNER_KEY.to_owned(), owner),
            (instance::OWNER_PASSWORD_KEY.to_owned(), generate()),
            (instance::SUPERUSER_PASSWORD_KEY.to_owned(), generate()),
            (
                instance::REPLICATION_USER_KEY.to_owned(),
                REPLICATION_USER.to_owned(),
            ),
            (instance::REPLICATION_PASSWORD_KEY.to_owned(), generate()),
        ])),
        ..Secret::default()
    }
}

/// A random password: 32 characters from a 62-letter alphabet (190 bits).
pub fn random_password() -> String {
    use rand::Rng;
    use rand::distr::Alphanumeric;
    rand::rng()
        .sample_iter(Alphanumeric)
        .take(32)
        .map(char::from)
        .collect()
}

/// `-rw` (the primary), `-ro` (the replicas) and the headless Service that
/// gives each pod a stable DNS name.
pub fn services(cluster: &DatabaseCluster) -> [Service; 3] {
    let names = Names::of(cluster);
    let with_role = |role: &str| {
        let mut selector = selector_labels(cluster);
        selector.insert(ROLE_LABEL.to_owned(), role.to_owned());
        selector
    };
    let port = ServicePort {
        name: Some("postgres".to_owned()),
        port: POSTGRES_PORT,
        target_port: Some(IntOrString::String("postgres".to_owned())),
        ..ServicePort::default()
    };
    let service = |name: &str, selector, headless: bool| Service {
        metadata: metadata(cluster, name, "database"),
        spec: Some(ServiceSpec {
            selector: Some(selector),
            ports: Some(vec![port.clone()]),
            cluster_ip: headless.then(|| "None".to_owned()),
            publish_not_ready_addresses: headless.then_some(true),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    };
    [
        service(&names.read_write, with_role(ROLE_PRIMARY), false),
        service(&names.read_only, with_role(ROLE_REPLICA), false),
        service(&names.cluster, selector_labels(cluster), true),
    ]
}

/// The instances' ServiceAccount (see [`instance_role`]).
pub fn service_account(cluster: &DatabaseCluster) -> ServiceAccount {
    ServiceAccount {
        metadata: metadata(cluster, &cluster.name_any(), "database"),
        automount_service_account_token: Some(false),
        ..ServiceAccount::default()
    }
}

/// The instances' pod names, by ordinal.
pub fn pod_names(cluster: &DatabaseCluster) -> Vec<String> {
    // The pods the StatefulSet keeps: a primary waiting to be switched away
    // from before a scale-down still renews its Lease and is still listed.
    (0..kept_instances(cluster).max(0))
        .map(|ordinal| format!("{}-{ordinal}", cluster.name_any()))
        .collect()
}

/// What cairn-instance may do with the API: read and watch its cluster's pods
/// (its assigned role is a label the controller sets) and renew their
/// membership Leases. No write to any pod: only the controller decides which
/// pod `-rw` selects.
pub fn instance_role(cluster: &DatabaseCluster) -> Role {
    let rule = |group: &str, resource: &str, verbs: &[&str]| PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(vec![resource.to_owned()]),
        resource_names: Some(pod_names(cluster)),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..PolicyRule::default()
    };
    Role {
        metadata: metadata(cluster, &cluster.name_any(), "database"),
        rules: Some(vec![
            // list and watch with resourceNames need a metadata.name field selector.
            rule("", "pods", &["get", "list", "watch"]),
            rule("coordination.k8s.io", "leases", &["get", "update", "patch"]),
            // The Backups of the namespace, read only: an instance takes the
            // one the backup controller assigned to it (by field selector on
            // spec.cluster.name; RBAC cannot narrow a list to it).
            PolicyRule {
                api_groups: Some(vec![cairn_api::BACKUP_GROUP.to_owned()]),
                resources: Some(vec!["backups".to_owned()]),
                verbs: vec!["list".to_owned(), "watch".to_owned()],
                ..PolicyRule::default()
            },
        ]),
    }
}

/// One membership Lease per instance, named after its pod (see
/// `cairn_api::database::instance`). The controller creates them, so they go
/// with the cluster; only the spec's holder and renewal, written by the
/// instance, change afterwards.
pub fn member_leases(cluster: &DatabaseCluster) -> Vec<Lease> {
    pod_names(cluster)
        .into_iter()
        .map(|pod| Lease {
            metadata: metadata(cluster, &pod, MEMBERSHIP_COMPONENT),
            spec: None,
        })
        .collect()
}

/// Grants [`instance_role`] to the instances' ServiceAccount.
pub fn instance_role_binding(cluster: &DatabaseCluster) -> RoleBinding {
    let name = cluster.name_any();
    RoleBinding {
        metadata: metadata(cluster, &name, "database"),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "Role".to_owned(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_owned(),
            name,
            namespace: cluster.namespace(),
            ..Subject::default()
        }]),
    }
}

/// The disruption budgets' names: the replicas' (the cluster's own) and the
/// primary's.
pub fn disruption_budget_names(cluster: &DatabaseCluster) -> [String; 2] {
    let name = cluster.name_any();
    [name.clone(), format!("{name}-primary")]
}

/// What voluntary disruptions (evictions: a node drain) may take, by role,
/// since the eviction API refuses a pod that two budgets select:
/// - the replicas, one at a time;
/// - the primary, never: its eviction waits while a drain of its node
///   switches it over (`drain`), and the old primary, relabelled a
///   replica, falls under the replicas' budget.
///
/// None once the StatefulSet keeps a single pod: a budget there would allow
/// every eviction or block every drain for good, so it would be an object
/// (and a write) that does nothing useful. While a scale-down to one waits
/// for a switchover, the pods it keeps are still protected.
pub fn disruption_budgets(cluster: &DatabaseCluster) -> Vec<PodDisruptionBudget> {
    if kept_instances(cluster) <= 1 {
        return Vec::new();
    }
    let [replicas, primary] = disruption_budget_names(cluster);
    let budget = |name: &str, role: &str, spec: PodDisruptionBudgetSpec| {
        let mut labels = selector_labels(cluster);
        labels.insert(ROLE_LABEL.to_owned(), role.to_owned());
        PodDisruptionBudget {
            metadata: metadata(cluster, name, "database"),
            spec: Some(PodDisruptionBudgetSpec {
                selector: Some(LabelSelector {
                    match_labels: Some(labels),
                    ..LabelSelector::default()
                }),
                ..spec
            }),
            ..PodDisruptionBudget::default()
        }
    };
    vec![
        budget(
            &replicas,
            ROLE_REPLICA,
            PodDisruptionBudgetSpec {
                max_unavailable: Some(IntOrString::Int(1)),
                ..PodDisruptionBudgetSpec::default()
            },
        ),
        budget(
            &primary,
            ROLE_PRIMARY,
            PodDisruptionBudgetSpec {
                min_available: Some(IntOrString::Int(1)),
                ..PodDisruptionBudgetSpec::default()
            },
        ),
    ]
}

/// The instances. Replicas and parameters change here. Claim templates are
/// immutable once created, so an existing StatefulSet's are kept as they are
/// (`existing_claims`; storage growth patches the claims themselves, and a
/// newer controller's template never blocks an older cluster).
pub fn stateful_set(
    cluster: &DatabaseCluster,
    existing_claims: Option<Vec<PersistentVolumeClaim>>,
) -> StatefulSet {
    let names = Names::of(cluster);
    let spec = &cluster.spec;
    let mut pod_labels = labels::standard(APP_NAME, &names.cluster, "database");
    pod_labels.extend(selector_labels(cluster));
    let scheduling = spec.scheduling.clone().unwrap_or_default();
    let pod = PodSpec {
        service_account_name: Some(names.cluster.clone()),
        // cairn-instance watches its pod and renews its Lease (instance_role).
        automount_service_account_token: Some(true),
        enable_service_links: Some(false),
        termination_grace_period_seconds: Some(60),
        security_context: Some(pod::pod_security_context()),
        containers: vec![instance_container(cluster)],
        volumes: Some(pod::volumes(cluster, archive_destination(cluster))),
        node_selector: (!scheduling.node_selector.is_empty()).then_some(scheduling.node_selector),
        affinity: scheduling.affinity,
        tolerations: (!scheduling.tolerations.is_empty()).then_some(scheduling.tolerations),
        priority_class_name: scheduling.priority_class_name,
        // Spread the instances over zones where the nodes allow it.
        topology_spread_constraints: Some(vec![TopologySpreadConstraint {
            max_skew: 1,
            topology_key: "topology.kubernetes.io/zone".to_owned(),
            when_unsatisfiable: "ScheduleAnyway".to_owned(),
            label_selector: Some(LabelSelector {
                match_labels: Some(selector_labels(cluster)),
                ..LabelSelector::default()
            }),
            ..TopologySpreadConstraint::default()
        }]),
        ..PodSpec::default()
    };
    StatefulSet {
        metadata: metadata(cluster, &names.cluster, "database"),
        spec: Some(StatefulSetSpec {
            replicas: Some(kept_instances(cluster)),
            // All at once: with OrderedReady a replica that cannot be Ready
            // without its primary (ordinal 1 after a failover) keeps the
            // StatefulSet from ever creating that primary again.
            pod_management_policy: Some(POD_MANAGEMENT_POLICY.to_owned()),
            service_name: Some(names.cluster.clone()),
            // The controller restarts the pods for a new template (see
            // `rollout.rs`): replicas first, the primary after a switchover.
            update_strategy: Some(k8s_openapi::api::apps::v1::StatefulSetUpdateStrategy {
                type_: Some("OnDelete".to_owned()),
                rolling_update: None,
            }),
            selector: LabelSelector {
                match_labels: Some(selector_labels(cluster)),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(pod_template_annotations(cluster)),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod),
            },
            volume_claim_templates: Some(
                existing_claims.unwrap_or_else(|| vec![data_claim(cluster)]),
            ),
            // Claims outlive the cluster: deleting it must never delete data.
            persistent_volume_claim_retention_policy: Some(
                k8s_openapi::api::apps::v1::StatefulSetPersistentVolumeClaimRetentionPolicy {
                    when_deleted: Some("Retain".to_owned()),
                    when_scaled: Some("Retain".to_owned()),
                },
            ),
            ..StatefulSetSpec::default()
        }),
        ..StatefulSet::default()
    }
}

/// The pod template's annotations: the restart digest and, when the user
/// asked for a restart (`RESTARTED_AT_ANNOTATION` on the cluster), its time.
/// Either changing gives the StatefulSet a new revision, which `rollout.rs`
/// rolls through the instances.
fn pod_template_annotations(cluster: &DatabaseCluster) -> BTreeMap<String, String> {
    let mut annotations = BTreeMap::from([(
        RESTART_DIGEST_ANNOTATION.to_owned(),
        restart_digest(cluster),
    )]);
    if let Some(at) = cluster.annotations().get(RESTARTED_AT_ANNOTATION) {
        annotations.insert(RESTARTED_AT_ANNOTATION.to_owned(), at.clone());
    }
    annotations
}

/// How the instances' StatefulSet creates and deletes pods.
pub const POD_MANAGEMENT_POLICY: &str = "Parallel";

/// An existing StatefulSet whose pod management policy (immutable) is not
/// [`POD_MANAGEMENT_POLICY`]: one made before it was; it is replaced, its
/// pods kept.
pub fn needs_replacing(stateful_set: &StatefulSet) -> bool {
    let policy = stateful_set
        .spec
        .as_ref()
        .and_then(|s| s.pod_management_policy.as_deref())
        .unwrap_or("OrderedReady");
    policy != POD_MANAGEMENT_POLICY
}

/// The claim templates of an existing StatefulSet.
pub fn claim_templates(stateful_set: &StatefulSet) -> Option<Vec<PersistentVolumeClaim>> {
    stateful_set.spec.as_ref()?.volume_claim_templates.clone()
}

fn data_claim(cluster: &DatabaseCluster) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".to_owned()),
            labels: Some(labels::standard(APP_NAME, &cluster.name_any(), "data")),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            storage_class_name: cluster.spec.storage.storage_class_name.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    canonical(&Quantity(cluster.spec.storage.size.clone())),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    }
}

/// Half the failover delay: the primary is read-only well before a replica
/// may be promoted, with the other half for restarting it read-only.
pub fn fence_seconds(cluster: &DatabaseCluster) -> u64 {
    cluster.spec.failover_delay().as_secs() / 2
}

fn instance_container(cluster: &DatabaseCluster) -> Container {
    let field = |path: &str| EnvVarSource {
        field_ref: Some(ObjectFieldSelector {
            field_path: path.to_owned(),
            ..ObjectFieldSelector::default()
        }),
        ..EnvVarSource::default()
    };
    // cairn-instance answers both from its last sample, never from a query
    // of its own, so a probe costs nothing under load. Readiness is probed
    // every second: a restarted instance serves through the Services within
    // a second of being ready (5 s apart, a crash's recovery waited up to 5 s
    // more), and one that stops being ready leaves them after 5 failures.
    // Liveness keeps 15 s: a restart is the last resort.
    let probe = |path: &str, period: i32, failures: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::String("instance".to_owned()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Probe::default()
    };
    let port = |name: &str, port: i32| ContainerPort {
        name: Some(name.to_owned()),
        container_port: port,
        ..ContainerPort::default()
    };
    Container {
        name: "postgres".to_owned(),
        image: Some(pod::image(cluster)),
        command: Some(vec!["cairn-instance".to_owned()]),
        env: Some(
            vec![
                EnvVar {
                    name: "POD_NAME".to_owned(),
                    value_from: Some(field("metadata.name")),
                    ..EnvVar::default()
                },
                EnvVar {
                    name: "POD_NAMESPACE".to_owned(),
                    value_from: Some(field("metadata.namespace")),
                    ..EnvVar::default()
                },
                EnvVar {
                    name: "CAIRN_CLUSTER".to_owned(),
                    value: Some(cluster.name_any()),
                    ..EnvVar::default()
                },
                EnvVar {
                    name: "PGDATA".to_owned(),
                    value: Some(instance::PGDATA.to_owned()),
                    ..EnvVar::default()
                },
                EnvVar {
                    name: instance::FENCE_SECONDS_ENV.to_owned(),
                    value: Some(fence_seconds(cluster).to_string()),
                    ..EnvVar::default()
                },
            ]
            .into_iter()
            .chain(archive_env(cluster))
            .chain(restore_env(cluster))
            .collect(),
        ),
        ports: Some(vec![
            port("postgres", POSTGRES_PORT),
            port("instance", INSTANCE_HTTP_PORT),
            port("metrics", INSTANCE_METRICS_PORT),
        ]),
        readiness_probe: Some(probe("/readyz", 1, 5)),
        liveness_probe: Some(probe("/livez", 5, 3)),
        resources: cluster.spec.resources.as_ref().map(canonical_resources),
        security_context: Some(pod::container_security_context()),
        volume_mounts: Some(pod::mounts(archive_destination(cluster).is_some())),
        ..Container::default()
    }
}

/// The bucket the instances archive WAL to: an explicit S3 destination.
/// (An ObjectBucket reference is refused in the status until supported.)
pub fn archive_destination(cluster: &DatabaseCluster) -> Option<&S3Destination> {
    cluster.spec.backup.as_ref()?.destination.s3.as_ref()
}

/// What cairn-instance needs to archive WAL (the credentials come from a
/// volume, never an environment variable).
fn archive_env(cluster: &DatabaseCluster) -> Vec<EnvVar> {
    let Some(s3) = archive_destination(cluster) else {
        return Vec::new();
    };
    // Bytes, so the instance needs no quantity parser; a size the schema let
    // through but that does not parse leaves the guard off, as unset.
    let max_pending = cluster
        .spec
        .backup
        .as_ref()
        .and_then(|b| b.max_pending_wal_size.as_deref())
        .and_then(cairn_api::validate::parse_quantity)
        // parse_quantity counts in nano-units.
        .map(|nanos| (nanos / 1_000_000_000).to_string());
    let mut env = pod::destination_env(s3);
    env.extend(pod::env([(
        "CAIRN_WAL_ARCHIVE_MAX_PENDING_BYTES",
        max_pending,
    )]));
    env
}

/// What the first primary of a cluster bootstrapped from a backup restores:
/// the source recorded in the status (before the StatefulSet is made, and
/// never changed after, so the pods never roll for it) and the spec's
/// recovery target.
fn restore_env(cluster: &DatabaseCluster) -> Vec<EnvVar> {
    let Some(source) = cluster
        .status
        .as_ref()
        .and_then(|s| s.restored_from.as_ref())
    else {
        return Vec::new();
    };
    let target = cluster
        .spec
        .bootstrap
        .as_ref()
        .and_then(|b| b.recovery_target());
    let time = target
        .and_then(|t| t.time.as_ref())
        .map(|t| t.0.to_string());
    let end_of_backup = target
        .and_then(|t| t.end_of_backup)
        .filter(|end| *end)
        .map(|_| "true".to_owned());
    pod::env([
        ("CAIRN_RESTORE_CLUSTER", Some(source.cluster.clone())),
        ("CAIRN_RESTORE_BACKUP_ID", source.backup_id.clone()),
        ("CAIRN_RESTORE_TARGET_TIME", time),
        (
            "CAIRN_RESTORE_TARGET_LSN",
            target.and_then(|t| t.lsn.clone()),
        ),
        (
            "CAIRN_RESTORE_TARGET_NAME",
            target.and_then(|t| t.name.clone()),
        ),
        ("CAIRN_RESTORE_TARGET_END_OF_BACKUP", end_of_backup),
        (
            "CAIRN_RESTORE_LOGICAL",
            (source.method == Some(BackupMethod::Logical)).then(|| "true".to_owned()),
        ),
    ])
}

/// A quantity as the API server stores it ("0.5" → "500m"), so a converged
/// child compares equal whatever notation the user wrote. An invalid one is
/// kept as written: validation reports it.
fn canonical(quantity: &Quantity) -> Quantity {
    Quantity(
        cairn_api::validate::canonical_quantity(&quantity.0).unwrap_or_else(|| quantity.0.clone()),
    )
}

fn canonical_resources(resources: &ResourceRequirements) -> ResourceRequirements {
    let canonical_all = |quantities: &Option<BTreeMap<String, Quantity>>| {
        quantities.as_ref().map(|q| {
            q.iter()
                .map(|(name, quantity)| (name.clone(), canonical(quantity)))
                .collect()
        })
    };
    ResourceRequirements {
        limits: canonical_all(&resources.limits),
        requests: canonical_all(&resources.requests),
        ..resources.clone()
    }
}

#[cfg(test)]
mod tests;
