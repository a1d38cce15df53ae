//! The CRDs as the API server enforces them: samples apply, invalid objects
//! and invalid changes are rejected with messages a user understands, and
//! kubectl shows the kinds well (`explain`, `get cairn`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use cairn_testing::{TestNamespace, cluster, wait};
use kube::api::{ApiResource, DynamicObject, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

type Result = std::result::Result<(), Box<dyn std::error::Error>>;

fn repo_root() -> PathBuf {
    cairn_testing::repo_root()
}

/// The samples of `config/samples`, by kind.
fn samples() -> BTreeMap<String, Value> {
    let dir = repo_root().join("config/samples");
    let mut samples = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).expect("config/samples exists") {
        let path = entry.expect("readable folder").path();
        let text = std::fs::read_to_string(&path).expect("readable sample");
        let sample: Value = serde_yaml_ng::from_str(&text).expect("sample is YAML");
        let kind = sample["kind"]
            .as_str()
            .expect("sample has a kind")
            .to_owned();
        samples.insert(kind, sample);
    }
    samples
}

/// `ApiResource`s of every Cairn kind, by kind, from the generated CRDs.
fn resources() -> BTreeMap<String, ApiResource> {
    cairn_api::crds::all()
        .into_iter()
        .map(|crd| {
            let version = &crd
                .spec
                .versions
                .iter()
                .find(|v| v.storage)
                .expect("a storage version")
                .name;
            let resource = ApiResource {
                group: crd.spec.group.clone(),
                version: version.clone(),
                api_version: format!("{}/{version}", crd.spec.group),
                kind: crd.spec.names.kind.clone(),
                plural: crd.spec.names.plural.clone(),
            };
            (crd.spec.names.kind, resource)
        })
        .collect()
}

/// RFC 7386 JSON merge patch: `null` removes a key.
fn merge(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(target), Some(patch)) => {
            for (key, value) in patch {
                if value.is_null() {
                    target.remove(key);
                } else {
                    merge(target.entry(key.clone()).or_insert(Value::Null), value);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

async fn install_crds(ns: &TestNamespace) -> Result {
    cairn_testing::crds::install(&ns.client, &cairn_api::crds::all()).await?;
    Ok(())
}

fn api(ns: &TestNamespace, kind: &str) -> Api<DynamicObject> {
    Api::namespaced_with(ns.client.clone(), &ns.name, &resources()[kind])
}

fn object(value: Value) -> DynamicObject {
    serde_json::from_value(value).expect("a valid object")
}

#[tokio::test]
async fn every_sample_applies() -> Result {
    let ns = cluster().namespace("api-samples").await?;
    install_crds(&ns).await?;
    let samples = samples();
    assert_eq!(
        samples.len(),
        resources().len(),
        "one sample per kind: {:?}",
        samples.keys()
    );
    for (kind, sample) in samples {
        let created = api(&ns, &kind)
            .create(&PostParams::default(), &object(sample.clone()))
            .await?;
        // Nothing the sample sets is pruned (an unknown field would be).
        let mut expected = created.data["spec"].clone();
        merge(&mut expected, &sample["spec"]);
        assert_eq!(created.data["spec"], expected, "{kind} lost fields");
    }
    Ok(())
}

/// An invalid object or change, and what the API server must say about it.
struct Case {
    name: &'static str,
    kind: &'static str,
    /// Applied to the sample before it is created.
    create: Value,
    /// If set, applied to the created object in an update, which must fail;
    /// otherwise the create must fail.
    update: Option<Value>,
    expected: &'static [&'static str],
}

fn invalid(
    name: &'static str,
    kind: &'static str,
    create: Value,
    expected: &'static [&'static str],
) -> Case {
    Case {
        name,
        kind,
        create,
        update: None,
        expected,
    }
}

fn invalid_change(
    name: &'static str,
    kind: &'static str,
    create: Value,
    update: Value,
    expected: &'static [&'static str],
) -> Case {
    Case {
        name,
        kind,
        create,
        update: Some(update),
        expected,
    }
}

fn cases() -> Vec<Case> {
    const DBC: &str = "DatabaseCluster";
    const BK: &str = "Backup";
    const BKS: &str = "BackupSchedule";
    const PC: &str = "ProviderConfig";
    const OB: &str = "ObjectBucket";
    const DNS: &str = "DnsRecord";
    let both_destinations = json!({ "bucketRef": { "name": "b" }, "s3": {
        "bucket": "acme-backups", "credentialsSecret": { "name": "c" } } });
    vec![
        // DatabaseCluster, on create
        invalid(
            "no instances",
            DBC,
            json!({"spec": {"instances": 0}}),
            &["spec.instances", "greater than or equal to 1"],
        ),
        invalid(
            "ten instances",
            DBC,
            json!({"spec": {"instances": 10}}),
            &["spec.instances", "less than or equal to 9"],
        ),
        invalid(
            "instances as text",
            DBC,
            json!({"spec": {"instances": "three"}}),
            &["spec.instances", "must be of type integer"],
        ),
        invalid(
            "postgres 12",
            DBC,
            json!({"spec": {"postgres": {"version": "12"}}}),
            &["spec.postgres.version", "should match"],
        ),
        invalid(
            "postgres 17.x",
            DBC,
            json!({"spec": {"postgres": {"version": "17.x"}}}),
            &["spec.postgres.version", "should match"],
        ),
        invalid(
            "no postgres version",
            DBC,
            json!({"spec": {"postgres": {"version": null}}}),
            &["spec.postgres.version", "Required value"],
        ),
        invalid(
            "no storage",
            DBC,
            json!({"spec": {"storage": null}}),
            &["spec.storage", "Required value"],
        ),
        invalid(
            "storage in words",
            DBC,
            json!({"spec": {"storage": {"size": "ten gigs"}}}),
            &["spec.storage.size", "should match"],
        ),
        invalid(
            "zero storage",
            DBC,
            json!({"spec": {"storage": {"size": "0"}}}),
            &["spec.storage.size must be a positive quantity"],
        ),
        invalid(
            "managed port",
            DBC,
            json!({"spec": {"postgres": {"parameters": {"port": "5433"}}}}),
            &[
                "spec.postgres.parameters",
                "a parameter Cairn manages cannot be set",
            ],
        ),
        invalid(
            "managed wal_level",
            DBC,
            json!({"spec": {"postgres": {"parameters": {"wal_level": "minimal"}}}}),
            &["a parameter Cairn manages cannot be set"],
        ),
        invalid(
            "two bootstraps",
            DBC,
            json!({"spec": {"bootstrap": {"fromBackup": {"name": "b"}}}}),
            &["set exactly one of initdb, fromBackup and fromBucket"],
        ),
        invalid(
            "two recovery targets",
            DBC,
            json!({"spec": {"bootstrap": {"initdb": null, "fromBackup": {"name": "b",
                "recoveryTarget": {"lsn": "0/3000060", "name": "before-migration"}}}}}),
            &["recoveryTarget: set at most one of time, lsn, name and endOfBackup"],
        ),
        invalid(
            "recovery target LSN",
            DBC,
            json!({"spec": {"bootstrap": {"initdb": null, "fromBackup": {"name": "b",
                "recoveryTarget": {"lsn": "yesterday"}}}}}),
            &[
                "spec.bootstrap.fromBackup.recoveryTarget.lsn",
                "should match",
            ],
        ),
        invalid(
            "empty bootstrap",
            DBC,
            json!({"spec": {"bootstrap": {"initdb": null}}}),
            &["set exactly one of initdb, fromBackup and fromBucket"],
        ),
        invalid(
            "database name with capitals",
            DBC,
            json!({"spec": {"bootstrap": {"initdb": {"database": "Orders-DB"}}}}),
            &["spec.bootstrap.initdb.database", "should match"],
        ),
        invalid(
            "image with a space",
            DBC,
            json!({"spec": {"postgres": {"image": "postgres 17"}}}),
            &["spec.postgres.image", "should match"],
        ),
        // DatabaseCluster, on update
        invalid(
            "as many synchronous replicas as instances",
            DBC,
            json!({"spec": {"instances": 3, "replication": {"synchronousReplicas": 3}}}),
            &["synchronousReplicas must be below spec.instances"],
        ),
        invalid(
            "no synchronous replica",
            DBC,
            json!({"spec": {"replication": {"synchronousReplicas": 0}}}),
            &[
                "spec.replication.synchronousReplicas",
                "greater than or equal to 1",
            ],
        ),
        invalid_change(
            "scaled down to the synchronous replicas",
            DBC,
            json!({"spec": {"instances": 3, "replication": {"synchronousReplicas": 2}}}),
            json!({"spec": {"instances": 2}}),
            &["synchronousReplicas must be below spec.instances"],
        ),
        invalid_change(
            "major downgrade",
            DBC,
            json!({}),
            json!({"spec": {"postgres": {"version": "16"}}}),
            &["the major version cannot change"],
        ),
        invalid_change(
            "major upgrade (not supported yet)",
            DBC,
            json!({}),
            json!({"spec": {"postgres": {"version": "18"}}}),
            &["the major version cannot change", "Cairn does not upgrade"],
        ),
        invalid_change(
            "major downgrade with minor",
            DBC,
            json!({}),
            json!({"spec": {"postgres": {"version": "16.4"}}}),
            &["the major version cannot change"],
        ),
        invalid_change(
            "storage shrink",
            DBC,
            json!({}),
            json!({"spec": {"storage": {"size": "5Gi"}}}),
            &["spec.storage.size cannot shrink"],
        ),
        invalid_change(
            "storage shrink in other units",
            DBC,
            json!({}),
            json!({"spec": {"storage": {"size": "10000Mi"}}}),
            &["spec.storage.size cannot shrink"],
        ),
        invalid_change(
            "storage class change",
            DBC,
            json!({"spec": {"storage": {"storageClassName": "standard"}}}),
            json!({"spec": {"storage": {"storageClassName": "fast"}}}),
            &["spec.storage.storageClassName is immutable"],
        ),
        invalid_change(
            "storage class added",
            DBC,
            json!({}),
            json!({"spec": {"storage": {"storageClassName": "fast"}}}),
            &["spec.storage.storageClassName is immutable"],
        ),
        invalid_change(
            "bootstrap owner change",
            DBC,
            json!({}),
            json!({"spec": {"bootstrap": {"initdb": {"owner": "someone"}}}}),
            &["spec.bootstrap is immutable"],
        ),
        invalid_change(
            "bootstrap removed",
            DBC,
            json!({}),
            json!({"spec": {"bootstrap": null}}),
            &["spec.bootstrap is immutable"],
        ),
        // Backup
        invalid(
            "unknown method",
            BK,
            json!({"spec": {"method": "snapshot"}}),
            &["spec.method", "Unsupported value"],
        ),
        invalid(
            "two destinations",
            BK,
            json!({"spec": {"destination": both_destinations.clone()}}),
            &["destination: set exactly one of bucketRef and s3"],
        ),
        invalid(
            "no destination",
            BK,
            json!({"spec": {"destination": {"bucketRef": null}}}),
            &["destination: set exactly one of bucketRef and s3"],
        ),
        invalid(
            "short deadline",
            BK,
            json!({"spec": {"deadlineSeconds": 10}}),
            &["spec.deadlineSeconds", "greater than or equal to 60"],
        ),
        invalid(
            "unknown deletion policy",
            BK,
            json!({"spec": {"deletionPolicy": "Keep"}}),
            &["spec.deletionPolicy", "Unsupported value"],
        ),
        invalid(
            "bucket with capitals",
            BK,
            json!({"spec": {"destination": {"bucketRef": null, "s3": {"bucket": "Bad_Bucket", "credentialsSecret": {"name": "c"}}}}}),
            &["spec.destination.s3.bucket", "should match"],
        ),
        invalid(
            "ftp endpoint",
            BK,
            json!({"spec": {"destination": {"bucketRef": null, "s3": {"bucket": "acme", "endpoint": "ftp://x", "credentialsSecret": {"name": "c"}}}}}),
            &["spec.destination.s3.endpoint", "should match"],
        ),
        invalid(
            "no cluster",
            BK,
            json!({"spec": {"cluster": null}}),
            &["spec.cluster", "Required value"],
        ),
        invalid_change(
            "method change",
            BK,
            json!({}),
            json!({"spec": {"method": "logical"}}),
            &["a Backup's cluster, method, destination and deadlineSeconds are immutable"],
        ),
        invalid_change(
            "deadline change",
            BK,
            json!({}),
            json!({"spec": {"deadlineSeconds": 600}}),
            &["a Backup's cluster, method, destination and deadlineSeconds are immutable"],
        ),
        // BackupSchedule
        invalid(
            "schedule in words",
            BKS,
            json!({"spec": {"schedule": "every day"}}),
            &["spec.schedule", "should match"],
        ),
        invalid(
            "four cron fields",
            BKS,
            json!({"spec": {"schedule": "0 3 * *"}}),
            &["spec.schedule", "should match"],
        ),
        invalid(
            "time zone in words",
            BKS,
            json!({"spec": {"timeZone": "Paris time"}}),
            &["spec.timeZone", "should match"],
        ),
        invalid(
            "unknown concurrency policy",
            BKS,
            json!({"spec": {"concurrencyPolicy": "Sometimes"}}),
            &["spec.concurrencyPolicy", "Unsupported value"],
        ),
        invalid(
            "keep none",
            BKS,
            json!({"spec": {"retention": {"keepLast": 0}}}),
            &["spec.retention.keepLast", "greater than or equal to 1"],
        ),
        invalid(
            "max age in words",
            BKS,
            json!({"spec": {"retention": {"maxAge": "30 days"}}}),
            &["spec.retention.maxAge", "should match"],
        ),
        invalid(
            "template with two destinations",
            BKS,
            json!({"spec": {"template": {"spec": {"destination": both_destinations}}}}),
            &["destination: set exactly one of bucketRef and s3"],
        ),
        invalid(
            "negative starting deadline",
            BKS,
            json!({"spec": {"startingDeadlineSeconds": -1}}),
            &[
                "spec.startingDeadlineSeconds",
                "greater than or equal to 10",
            ],
        ),
        // ProviderConfig
        invalid(
            "unknown provider",
            PC,
            json!({"spec": {"type": "gcp"}}),
            &["spec.type", "Unsupported value"],
        ),
        invalid(
            "region in words",
            PC,
            json!({"spec": {"region": "Europe"}}),
            &["spec.region", "should match"],
        ),
        invalid(
            "burst below qps",
            PC,
            json!({"spec": {"rateLimit": {"qps": 50, "burst": 10}}}),
            &["rateLimit.burst must be at least rateLimit.qps"],
        ),
        invalid(
            "zero qps",
            PC,
            json!({"spec": {"rateLimit": {"qps": 0}}}),
            &["spec.rateLimit.qps", "greater than or equal to 1"],
        ),
        invalid(
            "no credentials",
            PC,
            json!({"spec": {"credentialsSecretRef": null}}),
            &["spec.credentialsSecretRef", "Required value"],
        ),
        // ObjectBucket
        invalid(
            "bucket name with capitals",
            OB,
            json!({"spec": {"bucketName": "UPPER"}}),
            &["spec.bucketName", "should match"],
        ),
        invalid(
            "unknown encryption",
            OB,
            json!({"spec": {"encryption": "rot13"}}),
            &["spec.encryption", "Unsupported value"],
        ),
        invalid(
            "expire at once",
            OB,
            json!({"spec": {"lifecycle": {"expireAfterDays": 0}}}),
            &[
                "spec.lifecycle.expireAfterDays",
                "greater than or equal to 1",
            ],
        ),
        invalid_change(
            "bucket renamed",
            OB,
            json!({"spec": {"bucketName": "acme-one"}}),
            json!({"spec": {"bucketName": "acme-two"}}),
            &["spec.bucketName is immutable"],
        ),
        invalid_change(
            "bucket name removed",
            OB,
            json!({"spec": {"bucketName": "acme-one"}}),
            json!({"spec": {"bucketName": null}}),
            &["spec.bucketName is immutable"],
        ),
        // DnsRecord
        invalid(
            "unknown record type",
            DNS,
            json!({"spec": {"type": "PTR"}}),
            &["spec.type", "Unsupported value"],
        ),
        invalid(
            "CNAME with two values",
            DNS,
            json!({"spec": {"values": ["a.example.com", "b.example.com"]}}),
            &["a CNAME record has exactly one value"],
        ),
        invalid(
            "name outside the zone",
            DNS,
            json!({"spec": {"name": "db.other.org"}}),
            &["spec.name must be spec.zone or a name inside it"],
        ),
        invalid(
            "no values",
            DNS,
            json!({"spec": {"values": []}}),
            &["spec.values", "should have at least 1 items"],
        ),
        invalid(
            "negative ttl",
            DNS,
            json!({"spec": {"ttl": -5}}),
            &["spec.ttl", "greater than or equal to 0"],
        ),
        invalid_change(
            "record renamed",
            DNS,
            json!({}),
            json!({"spec": {"name": "other.example.com"}}),
            &["spec.zone, spec.name and spec.type identify the record and are immutable"],
        ),
        // Rules added after review
        invalid(
            "managed parameter in capitals",
            DBC,
            json!({"spec": {"postgres": {"parameters": {"Listen_Addresses": "*"}}}}),
            &["a parameter Cairn manages cannot be set"],
        ),
        invalid(
            "reserved owner",
            DBC,
            json!({"spec": {"bootstrap": {"initdb": {"owner": "postgres"}}}}),
            &["postgres, streaming_replica and pg_* are reserved roles"],
        ),
        invalid(
            "reserved database",
            DBC,
            json!({"spec": {"bootstrap": {"initdb": {"database": "template1"}}}}),
            &["are PostgreSQL's own databases"],
        ),
        invalid(
            "starting deadline too short",
            BKS,
            json!({"spec": {"startingDeadlineSeconds": 5}}),
            &[
                "spec.startingDeadlineSeconds",
                "greater than or equal to 10",
            ],
        ),
        invalid(
            "AWS region in words without endpoint",
            PC,
            json!({"spec": {"region": "auto"}}),
            &["spec.region must be an AWS region"],
        ),
        invalid(
            "CNAME at the apex",
            DNS,
            json!({"spec": {"name": "example.com"}}),
            &["a CNAME record cannot be at the zone apex"],
        ),
        invalid(
            "observed bucket with Delete",
            OB,
            json!({"spec": {"managementPolicy": "ObserveOnly", "deletionPolicy": "Delete"}}),
            &["an ObserveOnly bucket must have deletionPolicy Orphan"],
        ),
        invalid_change(
            "bucket name added later",
            OB,
            json!({}),
            json!({"spec": {"bucketName": "acme-later"}}),
            &["spec.bucketName is immutable"],
        ),
        invalid_change(
            "bucket moved",
            OB,
            json!({"spec": {"region": "eu-west-1"}}),
            json!({"spec": {"region": "us-east-1"}}),
            &["spec.region is immutable"],
        ),
    ]
}

/// What the API server answered, as a failure description if it was not
/// the expected rejection.
async fn check(
    ns: &TestNamespace,
    samples: &BTreeMap<String, Value>,
    index: usize,
    case: &Case,
) -> Option<String> {
    let api = api(ns, case.kind);
    let mut manifest = samples[case.kind].clone();
    manifest["metadata"] = json!({ "name": format!("case-{index}") });
    merge(&mut manifest, &case.create);
    let result = match &case.update {
        None => api.create(&PostParams::default(), &object(manifest)).await,
        Some(update) => {
            let created = match api.create(&PostParams::default(), &object(manifest)).await {
                Ok(created) => created,
                Err(e) => return Some(format!("the valid object was rejected: {e}")),
            };
            let mut changed = serde_json::to_value(&created).expect("object serializes");
            merge(&mut changed, update);
            api.replace(
                &created.name_any(),
                &PostParams::default(),
                &object(changed),
            )
            .await
        }
    };
    match result {
        Err(kube::Error::Api(status)) if status.code == 422 => {
            let missing: Vec<_> = case
                .expected
                .iter()
                .filter(|e| !status.message.contains(*e))
                .collect();
            (!missing.is_empty()).then(|| format!("message lacks {missing:?}: {}", status.message))
        }
        Err(e) => Some(format!("unexpected error: {e}")),
        Ok(_) => Some("accepted".to_owned()),
    }
}

#[tokio::test]
async fn invalid_objects_and_changes_are_rejected_with_clear_messages() -> Result {
    let ns = cluster().namespace("api-invalid").await?;
    install_crds(&ns).await?;
    let samples = samples();
    let cases = cases();
    assert!(cases.len() >= 40, "only {} cases", cases.len());
    let mut failures = Vec::new();
    for (index, case) in cases.iter().enumerate() {
        if let Some(failure) = check(&ns, &samples, index, case).await {
            failures.push(format!("{} {:?}: {failure}", case.kind, case.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    Ok(())
}

#[tokio::test]
async fn allowed_changes_are_accepted() -> Result {
    let ns = cluster().namespace("api-changes").await?;
    install_crds(&ns).await?;
    let samples = samples();
    let changes = [
        (
            "DatabaseCluster",
            json!({"spec": {"postgres": {"version": "17.4"}, "storage": {"size": "20Gi"}, "instances": 5}}),
        ),
        (
            "DatabaseCluster",
            json!({"spec": {"postgres": {"version": "17.2", "parameters": {"work_mem": "64MB"}}}}),
        ),
        (
            "ObjectBucket",
            json!({"spec": {"versioning": false, "tags": {"team": "billing"}, "deletionPolicy": "Delete"}}),
        ),
        ("Backup", json!({"spec": {"deletionPolicy": "Delete"}})),
        (
            "ProviderConfig",
            json!({"spec": {"region": "auto", "endpoint": "https://example.r2.cloudflarestorage.com"}}),
        ),
        (
            "BackupSchedule",
            json!({"spec": {"suspend": true, "schedule": "30 1 * * 0"}}),
        ),
        (
            "DnsRecord",
            json!({"spec": {"ttl": 600, "values": ["elsewhere.example.com"]}}),
        ),
    ];
    for (index, (kind, change)) in changes.into_iter().enumerate() {
        let api = api(&ns, kind);
        let mut manifest = samples[kind].clone();
        manifest["metadata"] = json!({ "name": format!("change-{index}") });
        let created = api
            .create(&PostParams::default(), &object(manifest))
            .await?;
        let mut changed = serde_json::to_value(&created)?;
        merge(&mut changed, &change);
        let replaced = api
            .replace(
                &created.name_any(),
                &PostParams::default(),
                &object(changed),
            )
            .await?;
        let mut expected = created.data.clone();
        merge(&mut expected, &change);
        assert_eq!(replaced.data["spec"], expected["spec"], "{kind}: {change}");
    }
    Ok(())
}

/// Runs the pinned kubectl against the test cluster; its stdout.
async fn kubectl(args: &[&str]) -> std::result::Result<String, String> {
    cluster()
        .kubectl(args)
        .await
        .map(|out| out.stdout)
        .map_err(|e| e.to_string())
}

#[tokio::test]
async fn kubectl_explain_describes_every_storage_field() -> Result {
    let ns = cluster().namespace("api-explain").await?;
    install_crds(&ns).await?;
    // The API server publishes a new CRD's OpenAPI a moment after it is established.
    let explained = wait::until(
        "kubectl explain to know spec.storage",
        Duration::from_secs(30),
        || async {
            kubectl(&["explain", "databaseclusters.spec.storage"])
                .await
                .map(Some)
        },
    )
    .await?;
    for (field, description) in [
        ("size", "Size of each instance's volume"),
        ("storageClassName", "StorageClass of the volumes"),
    ] {
        assert!(
            explained.contains(field),
            "{field} missing from:\n{explained}"
        );
        assert!(
            explained.contains(description),
            "{field}'s description missing from:\n{explained}"
        );
    }
    assert!(explained.contains("can grow"), "{explained}");
    Ok(())
}

#[tokio::test]
async fn kubectl_get_cairn_lists_every_kind_with_its_columns() -> Result {
    let ns = cluster().namespace("api-get").await?;
    install_crds(&ns).await?;
    for (kind, sample) in samples() {
        api(&ns, &kind)
            .create(&PostParams::default(), &object(sample))
            .await?;
    }
    let listed = kubectl(&["get", "cairn", "-n", &ns.name]).await?;
    let headers: Vec<String> = listed
        .lines()
        .filter(|line| line.starts_with("NAME"))
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    for expected in [
        "NAME INSTANCES READY PHASE PRIMARY AGE",
        "NAME CLUSTER INSTANCE METHOD PHASE SIZE VERIFIED AGE",
        "NAME SCHEDULE SUSPENDED LAST BACKUP NEXT HEALTHY",
        "NAME TYPE REGION READY AGE",
        "NAME EXTERNAL NAME READY SYNCED AGE",
    ] {
        assert!(
            headers.iter().any(|h| h == expected),
            "no `{expected}` in:\n{listed}"
        );
    }
    for name in [
        "orders",
        "orders-before-migration",
        "orders-nightly",
        "aws",
        "backups",
        "orders-db",
    ] {
        assert!(
            listed.contains(&format!("/{name} ")),
            "{name} not listed:\n{listed}"
        );
    }
    Ok(())
}
