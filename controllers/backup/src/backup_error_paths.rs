//! The Backup reconcile against an in-process fake API
//! ([`cairn_testing::fake_api`]) for what a real server seldom does on
//! demand: a status write refused as stale, a finalizer write failing, a
//! verification pod that cannot be created. Each checks the retry class and
//! that nothing is counted or announced as done that was not.

use std::sync::Arc;

use cairn_api::backup::v1::BackupSchedule;
use cairn_runtime::errors::ErrorClass;
use cairn_runtime::manager::Classify;
use cairn_testing::fake_api::{Answer, FakeApi, Fault, Recorded};
use kube::runtime::reflector::store;
use kube::runtime::watcher;
use serde_json::json;

use super::*;

const BACKUP_PATH: &str = "/apis/backup.cairn.dev/v1/namespaces/shop/backups/nightly";

fn backup(spec: serde_json::Value, status: serde_json::Value) -> Backup {
    let mut object = json!({
        "apiVersion": "backup.cairn.dev/v1", "kind": "Backup",
        "metadata": { "name": "nightly", "namespace": "shop", "uid": "u-1",
                      "generation": 1 },
        "spec": { "cluster": { "name": "orders" }, "method": "physical" },
        "status": status,
    });
    if let (Some(fields), serde_json::Value::Object(extra)) = (object["spec"].as_object_mut(), spec)
    {
        fields.extend(extra);
    }
    serde_json::from_value(object).expect("backup")
}

fn cluster() -> DatabaseCluster {
    serde_json::from_value(json!({
        "apiVersion": "database.cairn.dev/v1", "kind": "DatabaseCluster",
        "metadata": { "name": "orders", "namespace": "shop", "uid": "c-1" },
        "spec": {
            "instances": 2, "postgres": { "version": "16" }, "storage": { "size": "1Gi" },
            "backup": { "destination": { "s3": {
                "bucket": "backups", "endpoint": "http://moto:5000",
                "credentialsSecret": { "name": "s3" },
            } } },
        },
    }))
    .expect("cluster")
}

struct Harness {
    fake: FakeApi,
    context: Arc<Context>,
    registry: prometheus::Registry,
}

/// A context over the fake, its cluster cache holding `orders`.
fn harness(backup: &Backup) -> Harness {
    let (fake, client) = FakeApi::new();
    fake.put(
        BACKUP_PATH,
        serde_json::to_value(backup).expect("serializes"),
    );
    let (clusters, mut writer) = store();
    writer.apply_watcher_event(&watcher::Event::Apply(cluster()));
    let caches = Caches {
        backups: store().0,
        schedules: store().0,
        clusters,
        pods: store().0,
        verification_pods: store().0,
        leases: store().0,
    };
    let registry = prometheus::Registry::new_custom(Some("cairn".into()), None).expect("registry");
    let metrics = BackupMetrics::register(&registry).expect("metrics");
    let context = Arc::new(Context {
        client: client.clone(),
        recorder: Recorder::new(client, MANAGER.into()),
        caches,
        metrics,
        applier: Default::default(),
        health: None,
        heartbeats: Default::default(),
    });
    Harness {
        fake,
        context,
        registry,
    }
}

fn fault(method: &'static str, path: &str, status: u16, reason: &'static str) -> Fault {
    Fault {
        method,
        path: path.into(),
        answer: Answer::Status(status, reason),
        skip: 0,
        times: 1,
    }
}

fn finished_count(registry: &prometheus::Registry) -> f64 {
    registry
        .gather()
        .iter()
        .filter(|family| family.name() == "cairn_backup_finished_total")
        .flat_map(|family| family.get_metric())
        .map(|metric| metric.get_counter().get_value())
        .sum()
}

fn events(requests: &[Recorded]) -> usize {
    requests
        .iter()
        .filter(|r| r.path.contains("/events"))
        .count()
}

/// A Backup whose instance reported it done, its status refused as stale
/// (the cache lagged this controller's own write): retried, and neither
/// counted as finished nor announced.
#[tokio::test]
async fn a_stale_status_write_is_retried_not_counted_or_announced() {
    let failed = backup(json!({}), json!({ "phase": "Running" }));
    let harness = harness(&failed);
    harness
        .fake
        .inject(fault("PATCH", "/backups/nightly/status", 409, "Conflict"));
    // The instance is gone: the plan fails the Backup (a status to write).
    let result = reconcile(Arc::new(failed), harness.context.clone()).await;
    let error = result.expect_err("the refused write fails the reconcile");
    assert_eq!(error.class(), ErrorClass::Transient, "{error:?}");
    let requests = harness.fake.requests();
    assert_eq!(
        requests.iter().filter(|r| r.is_status_write()).count(),
        1,
        "{requests:#?}"
    );
    assert_eq!(finished_count(&harness.registry), 0.0);
    assert_eq!(events(&requests), 0, "nothing announced: {requests:#?}");
}

/// With `deletionPolicy: Delete` the finalizer goes on before anything
/// else: when that write fails, no status is written (no instance is handed
/// a Backup whose files nothing would remove).
#[tokio::test]
async fn a_failed_finalizer_write_stops_the_reconcile_first() {
    let new = backup(json!({ "deletionPolicy": "Delete" }), json!({}));
    let harness = harness(&new);
    harness
        .fake
        .inject(fault("PATCH", "/backups/nightly", 500, "InternalError"));
    let result = reconcile(Arc::new(new), harness.context.clone()).await;
    let error = result.expect_err("the failed finalizer fails the reconcile");
    assert_eq!(error.class(), ErrorClass::Transient, "{error:?}");
    let writes: Vec<String> = harness
        .fake
        .writes()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        writes,
        [format!("PATCH {BACKUP_PATH}")],
        "only the finalizer was tried"
    );
}

/// A completed Backup's verification: the status says Verifying before the
/// pod is created; when the create fails the reconcile is retried, and
/// nothing says Verified.
#[tokio::test]
async fn a_verification_pod_that_cannot_be_created_is_retried_never_verified() {
    let completed = backup(
        json!({ "verification": { "sql": "SELECT true", "deadlineSeconds": 600 } }),
        json!({ "phase": "Completed", "backupId": "nightly-u-1" }),
    );
    let harness = harness(&completed);
    harness
        .fake
        .inject(fault("POST", "/namespaces/shop/pods", 500, "InternalError"));
    let result = reconcile(Arc::new(completed), harness.context.clone()).await;
    let error = result.expect_err("the failed create fails the reconcile");
    assert_eq!(error.class(), ErrorClass::Transient, "{error:?}");
    let requests = harness.fake.requests();
    let create = requests
        .iter()
        .position(|r| r.method == "POST" && r.path.ends_with("/pods"))
        .expect("the pod create was tried");
    let status = requests
        .iter()
        .position(Recorded::is_status_write)
        .expect("a status write");
    assert!(status < create, "the status before the pod: {requests:#?}");
    for write in requests.iter().filter(|r| r.is_status_write()) {
        let verified = write.body["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Verified"))
            .cloned()
            .unwrap_or_default();
        assert_ne!(verified["status"], "True", "{}", write.body);
    }
}

/// The same reconcile without the fault counts and announces the outcome:
/// the checks above can fail.
#[tokio::test]
async fn without_the_fault_the_outcome_is_counted_and_announced() {
    let failed = backup(json!({}), json!({ "phase": "Running" }));
    let harness = harness(&failed);
    reconcile(Arc::new(failed), harness.context.clone())
        .await
        .expect("reconciled");
    assert_eq!(finished_count(&harness.registry), 1.0);
    assert_eq!(events(&harness.fake.requests()), 1);
}

const SCHEDULE_PATH: &str = "/apis/backup.cairn.dev/v1/namespaces/shop/backupschedules/nightly";

/// A schedule whose slot (every minute) is due now: its reconcile creates
/// the slot's Backup, then writes its status.
fn due_schedule(harness: &Harness) -> Arc<BackupSchedule> {
    let schedule: BackupSchedule = serde_json::from_value(json!({
        "apiVersion": "backup.cairn.dev/v1", "kind": "BackupSchedule",
        "metadata": { "name": "nightly", "namespace": "shop", "uid": "s-1", "generation": 1,
                      "creationTimestamp": "2020-01-01T00:00:00Z" },
        "spec": { "schedule": "* * * * *",
                  "template": { "spec": { "cluster": { "name": "orders" }, "method": "physical" } } },
    }))
    .expect("schedule");
    harness.fake.put(
        SCHEDULE_PATH,
        serde_json::to_value(&schedule).expect("serializes"),
    );
    Arc::new(schedule)
}

fn schedule_status_writes(requests: &[Recorded]) -> Vec<&Recorded> {
    requests
        .iter()
        .filter(|r| r.is_status_write() && r.path.starts_with(SCHEDULE_PATH))
        .collect()
}

/// The slot's Backup exists already (made before a restart that lost the
/// status write): the 409 on its create is the slot taken, recorded in the
/// status, and not announced as a new Backup.
#[tokio::test]
async fn a_schedule_whose_slot_backup_exists_records_the_slot_without_announcing_it() {
    let harness = harness(&backup(json!({}), json!({})));
    let schedule = due_schedule(&harness);
    harness.fake.inject(fault(
        "POST",
        "/namespaces/shop/backups",
        409,
        "AlreadyExists",
    ));
    crate::schedule::reconcile(schedule, harness.context.clone())
        .await
        .expect("the slot is taken");
    let requests = harness.fake.requests();
    let statuses = schedule_status_writes(&requests);
    assert_eq!(statuses.len(), 1, "{requests:#?}");
    assert!(
        statuses[0].body["status"]["lastScheduleTime"].is_string(),
        "{}",
        statuses[0].body
    );
    assert_eq!(events(&requests), 0, "no Backup announced: {requests:#?}");
}

/// A 500 on the slot's Backup create, midway through the schedule's
/// reconcile: transient, and no status claims the slot taken (it is tried
/// again, not skipped), nothing announced.
#[tokio::test]
async fn a_server_error_creating_the_slots_backup_leaves_the_slot_untaken() {
    let harness = harness(&backup(json!({}), json!({})));
    let schedule = due_schedule(&harness);
    harness.fake.inject(fault(
        "POST",
        "/namespaces/shop/backups",
        500,
        "InternalError",
    ));
    let error = crate::schedule::reconcile(schedule.clone(), harness.context.clone())
        .await
        .expect_err("the create failed");
    assert_eq!(error.class(), ErrorClass::Transient, "{error:?}");
    assert_eq!(error.class().label(), "transient");
    let requests = harness.fake.requests();
    assert!(
        schedule_status_writes(&requests).is_empty(),
        "{requests:#?}"
    );
    assert_eq!(events(&requests), 0, "{requests:#?}");
    // Without the fault the same reconcile creates, announces and records:
    // the checks above can fail.
    crate::schedule::reconcile(schedule, harness.context.clone())
        .await
        .expect("reconciled");
    let requests = harness.fake.requests();
    assert_eq!(schedule_status_writes(&requests).len(), 1, "{requests:#?}");
    assert_eq!(events(&requests), 1, "{requests:#?}");
}

/// A schedule cache that has not shown the status just written (its watch
/// lags) plans from the slot already taken: no second Backup or
/// announcement, and the slot and conditions stay as written. (The Backup
/// cache lags too, so `active` may be written without the new Backup until
/// it shows.)
#[tokio::test]
async fn a_slot_the_schedule_cache_has_not_shown_taken_is_not_taken_again() {
    let harness = harness(&backup(json!({}), json!({})));
    let mut schedule = (*due_schedule(&harness)).clone();
    schedule.metadata.resource_version = Some("4".into());
    let schedule = Arc::new(schedule);
    for _ in 0..2 {
        crate::schedule::reconcile(schedule.clone(), harness.context.clone())
            .await
            .expect("reconciled");
    }
    let requests = harness.fake.requests();
    let creates = requests
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/namespaces/shop/backups"))
        .count();
    assert_eq!(creates, 1, "{requests:#?}");
    assert_eq!(events(&requests), 1, "{requests:#?}");
    let statuses = schedule_status_writes(&requests);
    let written = |field: &str| -> Vec<&serde_json::Value> {
        statuses.iter().map(|r| &r.body["status"][field]).collect()
    };
    for field in ["lastScheduleTime", "conditions"] {
        let values = written(field);
        assert!(
            values.iter().all(|v| *v == values[0]),
            "{field} rewritten: {values:#?}"
        );
    }
}
