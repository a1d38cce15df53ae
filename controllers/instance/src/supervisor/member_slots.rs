//! The slots a primary keeps for the other members: made before a
//! promotion, so each replica streams on its first try, and dropped once a
//! pod has left the cluster, so they stop holding WAL.

use std::time::{Duration, Instant};

use cairn_api::database::instance as contract;
use tokio_postgres::Client;

use super::Supervisor;
use crate::conf;
use crate::error::sql_message;

impl Supervisor {
    /// Before a promotion: the slot of every other member, so that each
    /// replica finds its slot on its first try to follow this server. Slots
    /// are not replicated, and without one the new primary refuses a
    /// replica's WAL receiver, which then waits `wal_retrieve_retry_interval`
    /// (5 s) before it tries again: 5 s more without a synchronous commit.
    /// Made on the standby, they outlive the promotion. They reserve no WAL
    /// (`restart_lsn` NULL) until a replica streams through one, so a member
    /// that never comes back costs no disk and its slot is never lost to
    /// `max_slot_wal_keep_size`; a replica about to clone or rewind makes
    /// its own again, reserving (`reserve_slot`). A member's slot left lost
    /// from when this server was a primary is dropped first. Best effort: a
    /// failure is logged, and each replica makes its own slot anyway.
    pub(super) async fn make_member_slots(&self, client: &Client) {
        let Some(members) = self.members() else {
            return;
        };
        let own = self.slot_name();
        let slots: Vec<String> = members
            .iter()
            .map(|pod| conf::slot_name(pod))
            .filter(|slot| *slot != own)
            .collect();
        if let Err(e) = client
            .execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
                 WHERE slot_name = ANY($1) AND wal_status = 'lost' AND NOT active",
                &[&slots],
            )
            .await
        {
            tracing::warn!(error = %sql_message(&e), "cannot drop the members' lost replication slots");
        }
        match client
            .query(
                "SELECT (pg_create_physical_replication_slot(slot)).slot_name::text
                 FROM unnest($1::text[]) AS slot
                 WHERE NOT EXISTS (SELECT FROM pg_replication_slots s WHERE s.slot_name = slot)",
                &[&slots],
            )
            .await
        {
            Ok(rows) if rows.is_empty() => {}
            Ok(rows) => {
                let made: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
                tracing::info!(?made, "made the other members' replication slots");
            }
            Err(e) => {
                tracing::warn!(error = %sql_message(&e), "cannot make the other members' replication slots");
            }
        }
    }

    /// On the primary: drops the slot of each pod the cluster no longer has
    /// (a scale-down), once it has been unused for the grace period, so it
    /// stops holding WAL. Slots other tools made (other names) are not
    /// touched. Best effort: a failure is logged and tried again later.
    pub(super) async fn drop_slots_of_removed_pods(
        &self,
        client: &Client,
        leaving: &mut LeavingSlots,
    ) {
        let (Some(cluster), Some(members)) = (&self.config.cluster, self.members()) else {
            return;
        };
        let prefix = conf::slot_name(&format!("{cluster}-"));
        let unused = match client
            .query(
                "SELECT slot_name::text FROM pg_replication_slots
                 WHERE slot_type = 'physical' AND NOT active AND starts_with(slot_name::text, $1)",
                &[&prefix],
            )
            .await
        {
            Ok(rows) => rows.iter().map(|row| row.get::<_, String>(0)).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the replication slots");
                return;
            }
        };
        let kept: Vec<String> = members.iter().map(|pod| conf::slot_name(pod)).collect();
        let grace = Duration::from_secs(self.config.slot_grace_seconds);
        for slot in leaving.due(&prefix, unused, &kept, grace) {
            match client
                .execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
                     WHERE slot_name = $1 AND NOT active",
                    &[&slot],
                )
                .await
            {
                Ok(_) => {
                    tracing::info!(%slot, "dropped the replication slot of a pod the cluster no longer has")
                }
                Err(e) => tracing::warn!(%slot, error = %e, "cannot drop a replication slot"),
            }
        }
    }

    /// The cluster's pods as the controller lists them; `None` without the file.
    pub(super) fn members(&self) -> Option<Vec<String>> {
        crate::files::members(&self.config.config_dir.join(contract::MEMBERS_FILE))
    }
}

/// Unused slots of pods no longer in the cluster, and since when each has
/// been seen so.
#[derive(Default)]
pub(super) struct LeavingSlots(std::collections::HashMap<String, Instant>);

impl LeavingSlots {
    /// Of the `unused` slots, those named `<prefix><ordinal>` for a pod not
    /// in `kept` that have been seen so for `grace`; forgets the others.
    fn due(
        &mut self,
        prefix: &str,
        unused: Vec<String>,
        kept: &[String],
        grace: Duration,
    ) -> Vec<String> {
        let leaving: Vec<String> = unused
            .into_iter()
            .filter(|slot| {
                slot.strip_prefix(prefix)
                    .is_some_and(|o| !o.is_empty() && o.bytes().all(|b| b.is_ascii_digit()))
                    && !kept.contains(slot)
            })
            .collect();
        self.0.retain(|slot, _| leaving.contains(slot));
        let now = Instant::now();
        leaving
            .into_iter()
            .filter(|slot| now.duration_since(*self.0.entry(slot.clone()).or_insert(now)) >= grace)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unused_slots_of_removed_pods_are_dropped_after_the_grace() {
        let mut leaving = LeavingSlots::default();
        let kept = ["orders_0".to_owned(), "orders_1".to_owned()];
        let unused = || {
            ["orders_1", "orders_3", "orders_extra", "other_4", "orders_"]
                .map(str::to_owned)
                .to_vec()
        };
        let grace = Duration::from_millis(50);
        assert!(leaving.due("orders_", unused(), &kept, grace).is_empty());
        std::thread::sleep(grace);
        assert_eq!(leaving.due("orders_", unused(), &kept, grace), ["orders_3"]);
        // Seen in use again (or back in the members): the wait starts over.
        assert!(leaving.due("orders_", vec![], &kept, grace).is_empty());
        assert!(leaving.due("orders_", unused(), &kept, grace).is_empty());
    }
}
