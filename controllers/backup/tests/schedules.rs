//! BackupSchedules with the controller as a process under its chart's RBAC,
//! the test playing a fast instance (every Backup assigned to the standby is
//! reported Completed at its next heartbeat). A schedule every minute while
//! the controller is SIGKILLed every 15 s (each new process with a Lease of
//! its own, so it leads at once): exactly one Backup per slot, none missed,
//! and retention keeps the newest and the pinned one.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_api::backup::v1::{
    Backup, BackupPhase, BackupSchedule, PINNED_ANNOTATION, SCHEDULE_LABEL, SLOT_ANNOTATION,
};
use cairn_testing::{cluster, wait};
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use support::{Result, controller_as, database_side_completing};

/// Three slots: retention (the newest and a pinned first one) must delete
/// one, the second. How many retention keeps of how many is the retention
/// plan's unit tests'; this one proves it through controller kills.
const SLOTS: usize = 3;
const KEEP_LAST: usize = 1;

#[tokio::test]
async fn one_backup_per_slot_through_controller_kills_and_retention_keeps_what_it_must() -> Result {
    let ns = cluster().namespace("backup-schedule").await?;
    let mut controller =
        controller_as(&ns, "schedule-0", &[("CAIRN_LEASE_NAME", "schedule-0")]).await?;
    let (_reports, _heartbeat) = database_side_completing(&ns, true).await?;

    // Every Backup the schedule ever creates, as a watch sees them.
    let created: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
    let creations: Arc<Mutex<usize>> = Arc::default();
    let (seen, count) = (created.clone(), creations.clone());
    let config = watcher::Config::default().labels(&format!("{SCHEDULE_LABEL}=every-minute"));
    let backups = ns.api::<Backup>();
    let watching = tokio::spawn(watcher(backups.clone(), config).touched_objects().for_each(
        move |event| {
            if let Ok(backup) = event {
                let slot = backup
                    .annotations()
                    .get(SLOT_ANNOTATION)
                    .cloned()
                    .unwrap_or_default();
                let mut seen = seen.lock().expect("seen");
                if seen.insert(backup.name_any(), slot).is_none() {
                    *count.lock().expect("count") += 1;
                }
            }
            std::future::ready(())
        },
    ));

    let schedule: BackupSchedule = serde_json::from_value(json!({
        "apiVersion": "backup.cairn.dev/v1", "kind": "BackupSchedule",
        "metadata": { "name": "every-minute" },
        "spec": { "schedule": "* * * * *", "concurrencyPolicy": "Allow",
                  "template": { "spec": { "cluster": { "name": "orders" }, "method": "physical", "deadlineSeconds": 300 } },
                  "retention": { "keepLast": KEEP_LAST } },
    }))?;
    let schedules = ns.api::<BackupSchedule>();
    schedules.create(&PostParams::default(), &schedule).await?;
    let started = Instant::now();

    // SIGKILL every 15 s across the slots; the first completed Backup pinned.
    let (mut kills, mut pinned) = (0, None::<String>);
    while started.elapsed() < Duration::from_secs(60 * SLOTS as u64 + 15) {
        tokio::time::sleep(Duration::from_secs(15)).await;
        controller.kill()?;
        kills += 1;
        let name = format!("schedule-{kills}");
        controller = controller_as(&ns, &name, &[("CAIRN_LEASE_NAME", &name)]).await?;
        if pinned.is_none()
            && let Some(done) = backups
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .find(|b| b.status.as_ref().and_then(|s| s.phase) == Some(BackupPhase::Completed))
        {
            let pin = json!({ "metadata": { "annotations": { PINNED_ANNOTATION: "true" } } });
            backups
                .patch(
                    &done.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&pin),
                )
                .await?;
            pinned = Some(done.name_any());
        }
    }
    let pinned = pinned.ok_or("no Backup completed to pin")?;
    // The last slot's Backup completed, and retention applied after it.
    let kept = wait::until("retention applied", Duration::from_secs(90), || async {
        let list = backups
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let names: Vec<String> = list.items.iter().map(|b| b.name_any()).collect();
        let done = list
            .items
            .iter()
            .all(|b| b.status.as_ref().and_then(|s| s.phase) == Some(BackupPhase::Completed));
        if done && names.len() <= KEEP_LAST + 1 {
            Ok(Some(names))
        } else {
            Err(format!("{names:?}"))
        }
    })
    .await?;
    watching.abort();

    let created = created.lock().expect("created").clone();
    println!(
        "{SLOTS} minutes, {kills} controller kills: {} Backups created ({} creations seen), kept {kept:?}",
        created.len(),
        *creations.lock().expect("count")
    );
    // One per slot: distinct slots, each its own name, one a minute, none missed.
    let mut slots: Vec<Timestamp> = created
        .values()
        .map(|s| s.parse())
        .collect::<std::result::Result<_, _>>()?;
    slots.sort();
    slots.dedup();
    assert_eq!(
        slots.len(),
        created.len(),
        "two Backups for one slot: {created:?}"
    );
    assert!(slots.len() >= SLOTS, "slots missed: {created:?}");
    for pair in slots.windows(2) {
        assert_eq!(
            pair[1].duration_since(pair[0]).as_secs(),
            60,
            "a slot missed: {created:?}"
        );
    }
    // Retention: the newest and the pinned one, and nothing else.
    assert!(kept.contains(&pinned), "the pinned one kept: {kept:?}");
    assert!(
        kept.len() < created.len(),
        "retention deleted nothing: kept {kept:?} of {created:?}"
    );
    let newest: Vec<&String> = created.keys().rev().take(KEEP_LAST).collect();
    for name in newest {
        assert!(kept.contains(name), "{name} kept: {kept:?}");
    }
    let status = schedules
        .get("every-minute")
        .await?
        .status
        .unwrap_or_default();
    assert!(status.last_successful_time.is_some());
    let healthy = status
        .conditions
        .iter()
        .find(|c| c.type_ == "BackupsHealthy")
        .map(|c| c.status.clone());
    assert_eq!(healthy.as_deref(), Some("True"));
    Ok(())
}
