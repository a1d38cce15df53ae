//! The controller's caches and what wakes it.

use std::sync::Arc;

use cairn_api::backup::v1::{Backup, BackupSchedule};
use cairn_api::database::instance::{APP_NAME, MEMBERSHIP_COMPONENT};
use cairn_api::database::v1::DatabaseCluster;
use cairn_runtime::labels::MANAGED_BY;
use cairn_runtime::manager::{Manager, Runnable};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::controller::Controller;
use kube::runtime::events::Recorder;
use kube::runtime::watcher;

use crate::MANAGER;
use crate::backup::{self, Caches, Context};
use crate::metrics::BackupMetrics;
use crate::schedule;
use crate::verify;

/// Backups, woken by creation, a spec change or deletion (not by this
/// controller's status writes), and by their verification pods; a Pending or Running Backup is looked at
/// again on a short beat (`plan::POLL`) rather than on every heartbeat of
/// the instances' Leases, which are only read. BackupSchedules, woken by a
/// spec change and at each slot (and every 30 s while one of their Backups
/// runs). Clusters, instance pods and
/// membership Leases are cached for those reads; only the database
/// controller's objects are (by label), never every pod or Lease.
pub fn controllers(manager: &mut Manager) -> Result<Vec<Runnable>, prometheus::Error> {
    let metrics = BackupMetrics::register(&manager.metrics.registry)?;
    let ours =
        format!("app.kubernetes.io/managed-by={MANAGED_BY},app.kubernetes.io/name={APP_NAME}");
    let backups = manager.cache(manager.api::<Backup>(), watcher::Config::default());
    let clusters = manager.cache(manager.api::<DatabaseCluster>(), watcher::Config::default());
    let pods = manager.cache(
        manager.api::<Pod>(),
        watcher::Config::default().labels(&ours),
    );
    let leases = manager.cache(
        manager.api::<Lease>(),
        watcher::Config::default().labels(&format!(
            "{ours},app.kubernetes.io/component={MEMBERSHIP_COMPONENT}"
        )),
    );
    let verification_pods = manager.cache(
        manager.api::<Pod>(),
        watcher::Config::default().labels(&format!(
            "app.kubernetes.io/managed-by={MANAGED_BY},app.kubernetes.io/name={}",
            verify::APP_NAME
        )),
    );
    let verification_store = verification_pods.store();
    let schedules = manager.cache(manager.api::<BackupSchedule>(), watcher::Config::default());
    let schedule_store = schedules.store();
    let store = backups.store();
    let caches = Caches {
        backups: store.clone(),
        schedules: schedule_store.clone(),
        clusters: clusters.without_trigger(),
        pods: pods.without_trigger(),
        verification_pods: verification_store,
        leases: leases.without_trigger(),
    };
    let context = Arc::new(Context {
        client: manager.client.clone(),
        recorder: Recorder::new(manager.client.clone(), MANAGER.into()),
        caches,
        metrics,
        applier: Default::default(),
        health: Some(manager.health.clone()),
        heartbeats: Default::default(),
    });
    let housekeeper = context.clone();
    manager.every(std::time::Duration::from_secs(10), move || {
        housekeeper.housekeeping()
    });
    Ok(vec![
        manager.runnable(
            Controller::for_shared_stream(backups.trigger_on_spec_change(), store)
                .owns_shared_stream(verification_pods.trigger()),
            backup::reconcile,
            context.clone(),
        ),
        manager.runnable(
            Controller::for_shared_stream(schedules.trigger_on_spec_change(), schedule_store),
            schedule::reconcile,
            context,
        ),
    ])
}
