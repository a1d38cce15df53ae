//! The build's unit tests: each child as a cluster's spec makes it.

use super::*;
use cairn_api::backup::v1::{ACCESS_KEY_ID, SECRET_ACCESS_KEY};
use cairn_api::database::pod::BACKUP_CREDENTIALS;

#[test]
fn the_settings_the_builder_writes_are_the_ones_the_schema_refuses() {
    for name in managed_parameters().keys() {
        assert!(
            cairn_api::database::v1::MANAGED_PARAMETERS.contains(name),
            "{name} is written by the builder but users may set it too"
        );
    }
}

fn cluster(parameters: &[(&str, &str)]) -> DatabaseCluster {
    crate::fixtures::cluster(3, parameters)
}

#[test]
fn instances_are_created_all_at_once_and_an_ordered_stateful_set_is_replaced() {
    let built = stateful_set(&cluster(&[]), None);
    let policy = built
        .spec
        .as_ref()
        .and_then(|s| s.pod_management_policy.as_deref());
    assert_eq!(policy, Some("Parallel"));
    assert!(!needs_replacing(&built));

    let with_policy = |policy: Option<&str>| {
        let mut made = built.clone();
        if let Some(spec) = made.spec.as_mut() {
            spec.pod_management_policy = policy.map(str::to_owned);
        }
        made
    };
    assert!(needs_replacing(&with_policy(Some("OrderedReady"))));
    // The API server's default when none was set.
    assert!(needs_replacing(&with_policy(None)));
}

#[test]
fn every_child_is_owned_by_the_cluster() {
    let cluster = cluster(&[]);
    let mut children = vec![
        config_map(&cluster).metadata,
        credentials(&cluster, &mut random_password).metadata,
        service_account(&cluster).metadata,
        instance_role(&cluster).metadata,
        instance_role_binding(&cluster).metadata,
        stateful_set(&cluster, None).metadata,
    ];
    children.extend(services(&cluster).map(|s| s.metadata));
    let mut single = cluster.clone();
    single.spec.instances = 1;
    assert!(disruption_budgets(&single).is_empty());
    // Scaled down to one while the primary is still on a leaving pod.
    let mut leaving = single.clone();
    leaving.status.get_or_insert_default().current_primary = Some("orders-2".to_owned());
    assert_eq!(disruption_budgets(&leaving).len(), 2);
    let mut replicated = cluster.clone();
    replicated.spec.instances = 2;
    children.extend(
        disruption_budgets(&replicated)
            .into_iter()
            .map(|b| b.metadata),
    );
    assert_eq!(children.len(), 11);
    for meta in children {
        let owner = &meta.owner_references.expect("owned")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("DatabaseCluster", "uid-1")
        );
        assert_eq!(owner.controller, Some(true));
        assert_eq!(meta.namespace.as_deref(), Some("shop"));
    }
}

#[test]
fn replicas_are_evicted_one_at_a_time_and_the_primary_never() {
    let budgets = disruption_budgets(&cluster(&[]));
    let by_role = |role: &str| {
        budgets
            .iter()
            .find(|b| {
                let selector = b.spec.as_ref().and_then(|s| s.selector.as_ref());
                let labels = selector.and_then(|s| s.match_labels.as_ref());
                labels.and_then(|l| l.get(ROLE_LABEL)).map(String::as_str) == Some(role)
            })
            .and_then(|b| b.spec.clone())
            .unwrap_or_else(|| panic!("no budget for the {role}"))
    };
    let replicas = by_role(ROLE_REPLICA);
    assert_eq!(replicas.max_unavailable, Some(IntOrString::Int(1)));
    let primary = by_role(ROLE_PRIMARY);
    assert_eq!(primary.min_available, Some(IntOrString::Int(1)));
    // The eviction API refuses a pod two budgets select: none overlap.
    assert_eq!(budgets.len(), 2);
    for budget in &budgets {
        let labels = budget.spec.as_ref().and_then(|s| s.selector.as_ref());
        let labels = labels
            .and_then(|s| s.match_labels.clone())
            .unwrap_or_default();
        assert_eq!(
            labels.get("app.kubernetes.io/instance").map(String::as_str),
            Some("orders")
        );
    }
}

#[test]
fn an_instance_may_read_its_clusters_pods_and_renew_their_leases_only() {
    let role = instance_role(&cluster(&[]));
    let rules = role.rules.unwrap_or_default();
    let names = ["orders-0", "orders-1", "orders-2"].map(String::from);
    let granted: Vec<_> = rules
        .iter()
        .map(|r| {
            (
                r.resources.clone().unwrap_or_default(),
                r.verbs.clone(),
                r.resource_names.clone(),
            )
        })
        .collect();
    assert_eq!(
        granted,
        [
            (
                vec!["pods".to_owned()],
                vec!["get".into(), "list".into(), "watch".into()],
                Some(names.to_vec())
            ),
            (
                vec!["leases".to_owned()],
                vec!["get".into(), "update".into(), "patch".into()],
                Some(names.to_vec())
            ),
            // Read only; the Backups of the namespace (see the rule).
            (
                vec!["backups".to_owned()],
                vec!["list".into(), "watch".into()],
                None
            ),
        ]
    );
    let binding = instance_role_binding(&cluster(&[]));
    let subject = &binding.subjects.unwrap_or_default()[0];
    assert_eq!(
        (subject.name.as_str(), subject.namespace.as_deref()),
        ("orders", Some("shop"))
    );
    let leases: Vec<_> = member_leases(&cluster(&[]))
        .into_iter()
        .map(|l| l.metadata.name.unwrap_or_default())
        .collect();
    assert_eq!(leases, names);
}

#[test]
fn services_select_by_role() {
    let [rw, ro, headless] = services(&cluster(&[]));
    let role = |s: &Service| {
        s.spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .and_then(|s| s.get(ROLE_LABEL).cloned())
    };
    assert_eq!(rw.metadata.name.as_deref(), Some("orders-rw"));
    assert_eq!(role(&rw).as_deref(), Some(ROLE_PRIMARY));
    assert_eq!(role(&ro).as_deref(), Some(ROLE_REPLICA));
    assert_eq!(role(&headless), None);
    assert_eq!(
        headless.spec.and_then(|s| s.cluster_ip).as_deref(),
        Some("None")
    );
}

#[test]
fn user_parameters_follow_the_managed_ones_quoted() {
    let conf = postgresql_conf(&cluster(&[("work_mem", "64MB"), ("search_path", "a's")]));
    assert!(conf.contains("wal_level = replica\n"), "{conf}");
    assert!(conf.contains("work_mem = '64MB'\n"), "{conf}");
    assert!(conf.contains("search_path = 'a''s'\n"), "{conf}");
}

#[test]
fn slots_keep_at_most_a_tenth_of_the_volume() {
    let conf = postgresql_conf(&cluster(&[]));
    assert!(
        conf.contains("max_slot_wal_keep_size = '102MB'\n"),
        "{conf}"
    );
}

#[test]
fn a_primary_a_scale_down_would_remove_is_kept_with_its_lease_until_switched_away() {
    let mut cluster = cluster(&[]);
    cluster.spec.instances = 2;
    cluster.status = Some(cairn_api::database::v1::DatabaseClusterStatus {
        current_primary: Some("orders-2".into()),
        ..Default::default()
    });
    assert_eq!(kept_instances(&cluster), 3);
    assert_eq!(pod_names(&cluster), ["orders-0", "orders-1", "orders-2"]);
    let members = |cluster: &DatabaseCluster| {
        config_map(cluster).data.expect("data")[instance::MEMBERS_FILE].clone()
    };
    assert_eq!(members(&cluster), "orders-0\norders-1\norders-2\n");
    cluster.status = None;
    assert_eq!(kept_instances(&cluster), 2);
    assert_eq!(
        members(&cluster),
        "orders-0\norders-1\n",
        "orders-2's slot may go"
    );
}

#[test]
fn a_restored_cluster_tells_its_instances_the_recorded_source_and_the_target() {
    let mut cluster = crate::fixtures::archiving(crate::fixtures::cluster(1, &[]));
    cluster.spec.bootstrap = Some(
        serde_json::from_value(serde_json::json!({ "fromBackup": { "name": "nightly",
            "recoveryTarget": { "time": "2026-11-26T03:00:00Z" } } }))
        .expect("bootstrap"),
    );
    let env = |cluster: &DatabaseCluster| -> BTreeMap<String, Option<String>> {
        restore_env(cluster)
            .into_iter()
            .map(|e| (e.name, e.value))
            .collect()
    };
    assert!(
        env(&cluster).is_empty(),
        "nothing before the source is recorded"
    );
    cluster.status = Some(
        serde_json::from_value(serde_json::json!({ "restoredFrom": {
        "backup": "nightly", "cluster": "orders", "backupId": "nightly-0a1b2c3d",
        "location": "s3://wal/shop/orders/base/nightly-0a1b2c3d/" } }))
        .expect("status"),
    );
    let env = env(&cluster);
    assert_eq!(env["CAIRN_RESTORE_CLUSTER"].as_deref(), Some("orders"));
    assert_eq!(
        env["CAIRN_RESTORE_BACKUP_ID"].as_deref(),
        Some("nightly-0a1b2c3d")
    );
    assert_eq!(
        env["CAIRN_RESTORE_TARGET_TIME"].as_deref(),
        Some("2026-11-26T03:00:00Z")
    );
    assert_eq!(env.len(), 3);
}

#[test]
fn replication_connections_to_a_silent_peer_end_within_seconds() {
    let conf = postgresql_conf(&cluster(&[]));
    assert!(conf.contains("wal_receiver_timeout = '5s'\n"), "{conf}");
    assert!(conf.contains("wal_sender_timeout = '5s'\n"), "{conf}");
}

#[test]
fn synchronous_replication_is_a_quorum_of_every_instance() {
    let mut cluster = cluster(&[]);
    assert!(!postgresql_conf(&cluster).contains("synchronous_standby_names"));
    cluster.spec.replication = Some(cairn_api::database::v1::ReplicationSpec {
        synchronous_replicas: 1,
    });
    let conf = postgresql_conf(&cluster);
    assert!(
        conf.contains(
            "synchronous_standby_names = 'ANY 1 (\"orders-0\", \"orders-1\", \"orders-2\")'\n"
        ),
        "{conf}"
    );
}

#[test]
fn defaults_come_before_the_users_settings_so_they_win() {
    let conf = postgresql_conf(&cluster(&[("wal_keep_size", "1GB")]));
    let default = conf
        .find("wal_keep_size = '256MB'")
        .expect("default written");
    let users = conf.find("wal_keep_size = '1GB'").expect("user's written");
    assert!(default < users, "{conf}");
}

#[test]
fn only_restart_parameters_change_the_pod_template() {
    let base = restart_digest(&cluster(&[("work_mem", "4MB")]));
    assert_eq!(
        base,
        restart_digest(&cluster(&[("work_mem", "64MB")])),
        "reloadable"
    );
    assert_ne!(
        base,
        restart_digest(&cluster(&[("shared_buffers", "256MB")])),
        "restart"
    );
    assert_ne!(
        restart_digest(&cluster(&[("shared_buffers", "256MB")])),
        restart_digest(&cluster(&[("SHARED_BUFFERS", "512MB")]))
    );
}

#[test]
fn a_restart_request_changes_the_pod_template_and_nothing_else() {
    let template =
        |cluster: &DatabaseCluster| stateful_set(cluster, None).spec.expect("spec").template;
    let plain = cluster(&[]);
    let mut restarted = plain.clone();
    restarted.annotations_mut().insert(
        RESTARTED_AT_ANNOTATION.to_owned(),
        "2026-11-26T12:00:00Z".to_owned(),
    );
    let before = template(&plain);
    let after = template(&restarted);
    assert_ne!(before, after, "a restart request is a new revision");
    let annotations = after
        .metadata
        .and_then(|m| m.annotations)
        .expect("annotations");
    assert_eq!(
        annotations.get(RESTARTED_AT_ANNOTATION).map(String::as_str),
        Some("2026-11-26T12:00:00Z")
    );
    assert_eq!(
        annotations.get(RESTART_DIGEST_ANNOTATION),
        Some(&restart_digest(&plain)),
        "the configuration digest is unchanged"
    );
    assert_eq!(before.spec, after.spec, "only the annotation differs");
    // The same request again is the same template: no second roll.
    let mut again = restarted.clone();
    again.metadata.resource_version = Some("2".to_owned());
    assert_eq!(template(&again), template(&restarted));
    assert!(
        !before
            .metadata
            .and_then(|m| m.annotations)
            .expect("annotations")
            .contains_key(RESTARTED_AT_ANNOTATION),
        "no restart asked, no annotation"
    );
}

#[test]
fn an_existing_claim_template_is_kept() {
    let size = |sts: &StatefulSet| {
        let claims = claim_templates(sts).expect("templates");
        claims[0]
            .spec
            .clone()
            .and_then(|s| s.resources)
            .and_then(|r| r.requests)
            .map(|r| r["storage"].0.clone())
    };
    let mut grown = cluster(&[]);
    grown.spec.storage.size = "2Gi".into();
    let existing = stateful_set(&cluster(&[]), None);
    assert_eq!(size(&existing).as_deref(), Some("1Gi"));
    let desired = stateful_set(&grown, claim_templates(&existing));
    assert_eq!(size(&desired).as_deref(), Some("1Gi"), "immutable: kept");
    assert_eq!(
        size(&stateful_set(&grown, None)).as_deref(),
        Some("2Gi"),
        "new: from the spec"
    );
}

#[test]
fn credentials_hold_distinct_random_passwords() {
    let secret = credentials(&cluster(&[]), &mut random_password);
    let data = secret.string_data.expect("data");
    assert_eq!(data["password"].len(), 32);
    assert_ne!(data["password"], data["superuser-password"]);
    assert_ne!(data["password"], data["replication-password"]);
    assert_eq!(data["replication-username"], REPLICATION_USER);
}

#[test]
fn the_pod_runs_restricted_and_fences_at_half_the_failover_delay() {
    let sts = stateful_set(&cluster(&[]), None);
    let spec = sts.spec.expect("spec");
    assert_eq!(spec.replicas, Some(3));
    let pod = spec.template.spec.expect("pod");
    let container = &pod.containers[0];
    assert_eq!(
        container.image.as_deref(),
        Some("ghcr.io/cairn-dev/postgres:17")
    );
    let security = container
        .security_context
        .as_ref()
        .expect("security context");
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(
        pod.security_context.and_then(|s| s.run_as_non_root),
        Some(true)
    );
    let fence = container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == instance::FENCE_SECONDS_ENV)
        .and_then(|e| e.value.clone());
    assert_eq!(fence.as_deref(), Some("5"));
}

#[test]
fn a_backup_destination_reaches_the_instances_with_its_credentials_in_a_volume() {
    let plain = stateful_set(&cluster(&[]), None);
    let pod = plain.spec.and_then(|s| s.template.spec).expect("pod");
    let env = pod.containers[0].env.clone().unwrap_or_default();
    assert!(!env.iter().any(|e| e.name.starts_with("CAIRN_BACKUP")));
    assert!(
        !pod.volumes
            .iter()
            .flatten()
            .any(|v| v.name == BACKUP_CREDENTIALS)
    );

    let archiving = stateful_set(&crate::fixtures::archiving(cluster(&[])), None);
    let pod = archiving.spec.and_then(|s| s.template.spec).expect("pod");
    let container = &pod.containers[0];
    let env: BTreeMap<String, Option<String>> = container
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone()))
        .collect();
    assert_eq!(env["CAIRN_BACKUP_BUCKET"].as_deref(), Some("wal"));
    assert_eq!(
        env["CAIRN_BACKUP_ENDPOINT"].as_deref(),
        Some("http://s3.local:9000")
    );
    assert_eq!(env["CAIRN_BACKUP_PREFIX"].as_deref(), Some("shop/"));
    assert!(
        !env.contains_key("CAIRN_BACKUP_REGION"),
        "unset: no variable"
    );
    assert_eq!(
        env["CAIRN_WAL_ARCHIVE_MAX_PENDING_BYTES"].as_deref(),
        Some("1073741824")
    );
    assert!(
        !env.keys().any(|k| k.contains("ACCESS_KEY")),
        "credentials only in a volume"
    );
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == BACKUP_CREDENTIALS)
        .and_then(|v| v.secret.clone())
        .expect("the credentials volume");
    assert_eq!(volume.secret_name.as_deref(), Some("s3"));
    let keys: Vec<String> = volume
        .items
        .iter()
        .flatten()
        .map(|i| i.key.clone())
        .collect();
    assert_eq!(keys, [ACCESS_KEY_ID, SECRET_ACCESS_KEY]);
    assert!(
        container
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == BACKUP_CREDENTIALS
                && m.mount_path == instance::BACKUP_CREDENTIALS_DIR
                && m.read_only == Some(true))
    );
}

#[test]
fn readiness_is_probed_every_second_and_liveness_every_five() {
    let sts = stateful_set(&cluster(&[]), None);
    let container = sts
        .spec
        .and_then(|s| s.template.spec)
        .map(|p| p.containers[0].clone())
        .expect("the instance container");
    let timing = |probe: Option<k8s_openapi::api::core::v1::Probe>| {
        probe.map(|p| (p.period_seconds, p.failure_threshold))
    };
    assert_eq!(timing(container.readiness_probe), Some((Some(1), Some(5))));
    assert_eq!(timing(container.liveness_probe), Some((Some(5), Some(3))));
}
