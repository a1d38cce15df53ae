//! DatabaseCluster conversion is lossless both ways, for any object.

use std::collections::BTreeMap;

use cairn_api::database::conversion::{convert, to_v1, to_v1alpha1};
use cairn_api::database::{v1, v1alpha1};
use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use serde_json::{Value, json};

fn quantity() -> impl Strategy<Value = String> {
    (
        1u32..5000,
        prop::sample::select(vec!["", "m", "Mi", "Gi", "Ti", "k", "G"]),
    )
        .prop_map(|(n, unit)| format!("{n}{unit}"))
}

fn word() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9_]{0,12}"
}

/// Object metadata as the API server returns it: an empty annotation or label
/// map is omitted (Go's omitempty), never `{}`.
fn metadata() -> impl Strategy<Value = Value> {
    (word(), option::of(btree_map(word(), ".{0,20}", 1..3)), option::of(btree_map(word(), word(), 1..3)))
        .prop_map(|(name, annotations, labels)| {
            json!({ "name": name, "namespace": "db", "annotations": annotations, "labels": labels })
        })
}

fn conditions() -> impl Strategy<Value = Value> {
    vec(
        (
            prop::sample::select(vec!["Ready", "Progressing", "Degraded"]),
            any::<bool>(),
            word(),
            ".{0,30}",
        ),
        0..3,
    )
    .prop_map(|conditions| {
        Value::Array(
            conditions
                .into_iter()
                .map(|(type_, ok, reason, message)| {
                    json!({ "type": type_, "status": if ok { "True" } else { "False" },
                            "reason": format!("R{reason}"), "message": message,
                            "lastTransitionTime": "2026-01-01T00:00:00Z" })
                })
                .collect(),
        )
    })
}

fn phase() -> impl Strategy<Value = Option<&'static str>> {
    option::of(prop::sample::select(vec![
        "Creating",
        "Running",
        "Scaling",
        "Upgrading",
        "Degraded",
        "Failed",
        "Paused",
    ]))
}

prop_compose! {
    fn v1_spec()(
        instances in 1i32..=9,
        version in "1[3-8](\\.[0-9]{1,2})?",
        image in option::of("[a-z./:0-9-]{1,30}"),
        parameters in btree_map(word(), "[a-zA-Z0-9]{1,8}", 0..4),
        size in quantity(),
        class in option::of(word()),
        requests in option::of(btree_map(prop::sample::select(vec!["cpu".to_owned(), "memory".to_owned()]), quantity(), 0..3)),
        limits in option::of(btree_map(prop::sample::select(vec!["cpu".to_owned(), "memory".to_owned()]), quantity(), 1..3)),
        node_selector in btree_map(word(), word(), 0..2),
        tolerations in vec((word(), word()), 0..2),
        priority in option::of(word()),
        with_scheduling in any::<bool>(),
        bootstrap in option::of(prop_oneof![
            (word(), word()).prop_map(|(d, o)| json!({ "initdb": { "database": d, "owner": o } })),
            word().prop_map(|b| json!({ "fromBackup": { "name": b } })),
            word().prop_map(|b| json!({ "fromBackup": { "name": b, "recoveryTarget": { "lsn": "0/3000060" } } })),
        ]),
        paused in any::<bool>(),
        failover in option::of((6i32..600, option::of(0i64..1_000_000))),
        synchronous in option::of(1i32..9),
        backup in option::of((word(), option::of(word()))),
    ) -> Value {
        let scheduling = with_scheduling.then(|| json!({
            "nodeSelector": node_selector,
            "tolerations": tolerations.into_iter().map(|(k, v)| json!({"key": k, "value": v, "operator": "Equal"})).collect::<Vec<_>>(),
            "priorityClassName": priority,
        }));
        json!({
            "instances": instances,
            "postgres": { "version": version, "image": image, "parameters": parameters },
            "storage": { "size": size, "storageClassName": class },
            "resources": requests.map(|r| json!({ "requests": r, "limits": limits })),
            "scheduling": scheduling,
            "bootstrap": bootstrap,
            "paused": paused,
            "failover": failover.map(|(delay, lag)| json!({ "delaySeconds": delay, "maxLagBytes": lag })),
            "replication": synchronous.map(|n| json!({ "synchronousReplicas": n })),
            "backup": backup.map(|(bucket, prefix)| json!({ "destination": { "s3": {
                "endpoint": "http://s3.example:9000",
                "bucket": bucket,
                "prefix": prefix,
                "credentialsSecret": { "name": "s3" },
            }}})),
        })
    }
}

prop_compose! {
    fn v1_status()(
        generation in option::of(0i64..1000),
        phase in phase(),
        conditions in conditions(),
        instances in option::of(0i32..10),
        ready in option::of(0i32..10),
        primary in option::of(word()),
        selector in option::of(word()),
        endpoints in option::of((option::of(word()), option::of(word()))),
        secret in option::of(word()),
        version in option::of(word()),
        initialized in any::<bool>(),
        timeline in option::of(1u32..100),
        failover in option::of((word(), word(), word())),
    ) -> Value {
        json!({
            "observedGeneration": generation, "phase": phase, "conditions": conditions,
            "instances": instances, "readyInstances": ready, "currentPrimary": primary, "selector": selector,
            "endpoints": endpoints.map(|(rw, ro)| json!({ "readWrite": rw, "readOnly": ro })),
            "credentialsSecret": secret, "postgresVersion": version,
            "initialized": initialized, "timeline": timeline,
            "lastFailover": failover.map(|(from, to, reason)| json!({
                "from": from, "to": to, "reason": reason,
                "primaryLastSeen": "2026-01-02T03:04:05Z", "promotedAt": "2026-01-02T03:04:15Z",
            })),
        })
    }
}

/// Drops `null`s, as the API server stores objects without them.
fn compact(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, compact(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(compact).collect()),
        other => other,
    }
}

fn v1_cluster() -> impl Strategy<Value = v1::DatabaseCluster> {
    (metadata(), v1_spec(), option::of(v1_status())).prop_map(|(metadata, spec, status)| {
        let object = compact(json!({
            "apiVersion": "database.cairn.dev/v1", "kind": "DatabaseCluster",
            "metadata": metadata, "spec": spec, "status": status,
        }));
        serde_json::from_value(object).expect("generated v1 objects are valid")
    })
}

fn v1alpha1_cluster() -> impl Strategy<Value = v1alpha1::DatabaseCluster> {
    let status = (
        phase(),
        conditions(),
        option::of(word()),
        option::of(0i32..10),
    );
    (metadata(), 1i32..=9, "1[3-8]", quantity(), option::of(status)).prop_map(
        |(metadata, size, version, storage, status)| {
            let object = compact(json!({
                "apiVersion": "database.cairn.dev/v1alpha1", "kind": "DatabaseCluster",
                "metadata": metadata,
                "spec": { "size": size, "version": version, "storageSize": storage },
                "status": status.map(|(phase, conditions, endpoint, instances)| json!({
                    "phase": phase, "conditions": conditions, "endpoint": endpoint, "instances": instances,
                })),
            }));
            serde_json::from_value(object).expect("generated v1alpha1 objects are valid")
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn v1_to_v1alpha1_and_back_is_lossless(cluster in v1_cluster()) {
        prop_assert_eq!(to_v1(to_v1alpha1(cluster.clone()).expect("converts")).expect("converts"), cluster);
    }

    #[test]
    fn v1alpha1_to_v1_and_back_is_lossless(cluster in v1alpha1_cluster()) {
        prop_assert_eq!(to_v1alpha1(to_v1(cluster.clone()).expect("converts")).expect("converts"), cluster);
    }

    /// The usual read-modify-write through v1alpha1: a v1 object read as
    /// v1alpha1 (with the annotations) and written back converts losslessly.
    #[test]
    fn v1alpha1_with_kept_fields_round_trips(cluster in v1_cluster()) {
        let old = to_v1alpha1(cluster).expect("converts");
        prop_assert_eq!(to_v1alpha1(to_v1(old.clone()).expect("converts")).expect("converts"), old);
    }

    /// The same through JSON, as the webhook sees objects.
    #[test]
    fn json_round_trips_are_lossless(cluster in v1_cluster()) {
        let original = serde_json::to_value(&cluster).expect("serializes");
        let old = convert(original.clone(), "database.cairn.dev/v1alpha1").expect("converts");
        prop_assert_eq!(old["apiVersion"].as_str(), Some("database.cairn.dev/v1alpha1"));
        prop_assert_eq!(&old["spec"]["size"], &original["spec"]["instances"]);
        let back = convert(old, "database.cairn.dev/v1").expect("converts back");
        prop_assert_eq!(back, original);
    }
}

#[test]
fn the_meaning_survives_in_the_fields_both_versions_have() {
    let old: v1alpha1::DatabaseCluster = serde_json::from_value(json!({
        "apiVersion": "database.cairn.dev/v1alpha1", "kind": "DatabaseCluster",
        "metadata": { "name": "orders" },
        "spec": { "size": 3, "version": "16", "storageSize": "5Gi" }
    }))
    .expect("valid");
    let new = to_v1(old).expect("converts");
    assert_eq!(new.spec.instances, 3);
    assert_eq!(new.spec.postgres.version, "16");
    assert_eq!(new.spec.storage.size, "5Gi");
    assert_eq!(new.metadata.annotations, None);
    assert_eq!(new.spec.postgres.parameters, BTreeMap::new());
}

#[test]
fn a_stale_annotation_on_a_v1_object_does_not_come_back() {
    let mut cluster: v1::DatabaseCluster = serde_json::from_value(json!({
        "apiVersion": "database.cairn.dev/v1", "kind": "DatabaseCluster",
        "metadata": { "name": "orders", "annotations": {
            "database.cairn.dev/v1-spec": "{\"paused\":true}" } },
        "spec": { "instances": 1, "postgres": { "version": "17" }, "storage": { "size": "1Gi" } }
    }))
    .expect("valid");
    let back = to_v1(to_v1alpha1(cluster.clone()).expect("converts")).expect("converts");
    assert!(!back.spec.paused);
    cluster.metadata.annotations = None;
    assert_eq!(back, cluster);
}

#[test]
fn an_unreadable_annotation_is_an_error_not_a_silent_default() {
    let object = json!({
        "apiVersion": "database.cairn.dev/v1alpha1", "kind": "DatabaseCluster",
        "metadata": { "name": "orders", "annotations": { "database.cairn.dev/v1-spec": "{not json" } },
        "spec": { "size": 1, "version": "17", "storageSize": "1Gi" }
    });
    let error = convert(object, "database.cairn.dev/v1").expect_err("must fail");
    assert!(
        error.to_string().contains("database.cairn.dev/v1-spec"),
        "{error}"
    );
}

#[test]
fn unknown_versions_are_refused() {
    let object = json!({ "apiVersion": "database.cairn.dev/v2", "kind": "DatabaseCluster" });
    assert!(convert(object, "database.cairn.dev/v1").is_err());
}
