//! The one way a controller writes a status, in three forms:
//! - [`Applier::apply_status`]: the whole status, server-side applied;
//! - [`Applier::apply_status_at_version`]: the same, refused (409) unless the
//!   object is still the version the status was decided from;
//! - [`Applier::record_in_status`]: a decision written at once, before it is
//!   acted on, that holds the object's reconciles
//!   ([`Applier::is_behind_record`]) until the cache shows it.
//!
//! Each remembers what it wrote against a cache that lags the write.

use std::fmt::Debug;
use std::sync::Arc;

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::time::{Duration, Instant};

use super::{Applier, to_value, written_key};

/// How long a recorded decision may wait for the cache to show it; past
/// that, something else changed the status since, and reconciles go on
/// from the cache.
pub const RECORD_LAG_LIMIT: Duration = Duration::from_secs(10);

/// A decision recorded in a status: the fields it named, as the status
/// held them after the last write this process made.
pub(super) struct Record {
    fields: Vec<String>,
    written: Vec<Value>,
    at: Instant,
}

impl Applier {
    /// Applies `status` to the status of `object` (as the controller read
    /// it, from its cache) with field manager `manager`, unless this process
    /// wrote exactly this status over the version `object` still shows. The
    /// object as written, or `None` when nothing was sent.
    pub async fn apply_status<K>(
        &self,
        api: &Api<K>,
        manager: &str,
        object: &K,
        status: &impl Serialize,
    ) -> Result<Option<K>, kube::Error>
    where
        K: Resource + Clone + Debug + Serialize + DeserializeOwned,
        K::DynamicType: Default,
    {
        self.send_status(api, manager, object, status, None).await
    }

    /// [`Applier::apply_status`], on the condition that the object is still
    /// the version `object` was read at: a status decided from a cache that
    /// lags another write is refused (409, retried once the cache caught
    /// up) rather than undoing that write. For a status whose every write is
    /// a step that must not be taken twice (a Backup's assignment).
    pub async fn apply_status_at_version<K>(
        &self,
        api: &Api<K>,
        manager: &str,
        object: &K,
        status: &impl Serialize,
    ) -> Result<Option<K>, kube::Error>
    where
        K: Resource + Clone + Debug + Serialize + DeserializeOwned,
        K::DynamicType: Default,
    {
        let version = object.resource_version();
        self.send_status(api, manager, object, status, version)
            .await
    }

    async fn send_status<K>(
        &self,
        api: &Api<K>,
        manager: &str,
        object: &K,
        status: &impl Serialize,
        at_version: Option<String>,
    ) -> Result<Option<K>, kube::Error>
    where
        K: Resource + Clone + Debug + Serialize + DeserializeOwned,
        K::DynamicType: Default,
    {
        let status = to_value(status)?;
        let key = written_key(object, "/status");
        if self.recently_written_over(&key, &status, object) {
            return Ok(None);
        }
        let dynamic = K::DynamicType::default();
        let mut patch = json!({
            "apiVersion": K::api_version(&dynamic),
            "kind": K::kind(&dynamic),
            "status": status,
        });
        if let Some(version) = at_version {
            patch["metadata"] = json!({ "resourceVersion": version });
        }
        let written = api
            .patch_status(
                &object.name_any(),
                &PatchParams::apply(manager).force(),
                &Patch::Apply(&patch),
            )
            .await?;
        self.remember(key, status, object);
        self.follow_record(&written)?;
        Ok(Some(written))
    }

    /// Writes the status `fields` of `object` at once (a merge patch, each
    /// field replaced whole: see [`replacing`]), before the caller acts on
    /// them: a crash in between repeats the decision, never forgets it.
    /// Until the cache shows them (or [`RECORD_LAG_LIMIT`]),
    /// [`Applier::is_behind_record`] says the cached object is older than
    /// the decision. The object as written.
    pub async fn record_in_status<K>(
        &self,
        api: &Api<K>,
        object: &K,
        fields: Value,
    ) -> Result<K, kube::Error>
    where
        K: Resource + Clone + Debug + Serialize + DeserializeOwned,
        K::DynamicType: Default,
    {
        let previous = status_of(object)?;
        let names: Vec<String> = fields
            .as_object()
            .map(|f| f.keys().cloned().collect())
            .unwrap_or_default();
        let written = api
            .patch_status(
                &object.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&json!({ "status": replacing(&previous, fields) })),
            )
            .await?;
        let record = Record {
            written: projection(&written, &names)?,
            fields: names,
            at: Instant::now(),
        };
        let mut records = self.records();
        records.retain(|_, r| r.at.elapsed() < RECORD_LAG_LIMIT);
        records.insert(written_key(object, "/record"), record);
        Ok(written)
    }

    /// Whether `object` (from the cache) is older than a decision this
    /// process recorded in its status: a reconcile from it would decide
    /// again what was decided already. Forgets the decision once the cache
    /// shows it: a later change by anyone is the truth.
    pub fn is_behind_record<K>(&self, object: &K) -> bool
    where
        K: Resource + Serialize,
        K::DynamicType: Default,
    {
        let key = written_key(object, "/record");
        let mut records = self.records();
        let behind = records.get(&key).is_some_and(|record| {
            record.at.elapsed() < RECORD_LAG_LIMIT
                && projection(object, &record.fields).ok().as_ref() != Some(&record.written)
        });
        if !behind {
            records.remove(&key);
        }
        behind
    }

    /// A later status write, while a decision awaits the cache, is what the
    /// cache will show: the record follows it.
    fn follow_record<K>(&self, written: &K) -> Result<(), kube::Error>
    where
        K: Resource + Serialize,
        K::DynamicType: Default,
    {
        if let Some(record) = self.records().get_mut(&written_key(written, "/record")) {
            record.written = projection(written, &record.fields)?;
            record.at = Instant::now();
        }
        Ok(())
    }

    /// `object` with the status this process last wrote over the version
    /// `object` shows, while the cache lags that write (within
    /// [`WRITTEN_MEMORY`]). A reconcile then builds on the status the API
    /// server holds: it carries that write's transition times and does not
    /// write the same conditions again stamped a second later. The status
    /// written replaces the cached one whole: only for a kind whose status
    /// this controller alone writes, all of it at each write.
    pub fn with_written_status<K>(&self, object: Arc<K>) -> Arc<K>
    where
        K: Resource + Serialize + DeserializeOwned,
        K::DynamicType: Default,
    {
        let key = written_key(&*object, "/status");
        let Some(status) = self.written_over(&key, &*object) else {
            return object;
        };
        let replaced = to_value(&*object).and_then(|mut value| {
            value["status"] = status;
            serde_json::from_value(value).map_err(kube::Error::SerdeError)
        });
        match replaced {
            Ok(replaced) => Arc::new(replaced),
            Err(error) => {
                // Never expected (the status was serialized from this type);
                // the cached object is still a correct, if older, start.
                tracing::warn!(%error, "cannot read back a status written");
                object
            }
        }
    }

    fn records(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Record>> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A merge patch of status `fields` that replaces each of them whole. A
/// merge patch keeps whatever an object in it does not name, and a record
/// leaves its unset fields out: a new switchover written over a finished one
/// would inherit its `promotedAt` and read as done before it began. So every
/// field the previous value has and the new one lacks is set to null.
pub fn replacing(previous_status: &Value, fields: Value) -> Value {
    fn replace(previous: Option<&Value>, next: Value) -> Value {
        let (Some(Value::Object(old)), Value::Object(mut new)) = (previous, next.clone()) else {
            return next;
        };
        for (key, value) in &mut new {
            *value = replace(old.get(key), value.take());
        }
        for key in old.keys() {
            new.entry(key.clone()).or_insert(Value::Null);
        }
        Value::Object(new)
    }
    match fields {
        Value::Object(fields) => fields
            .into_iter()
            .map(|(key, value)| {
                let value = replace(previous_status.get(&key), value);
                (key, value)
            })
            .collect(),
        other => other,
    }
}

fn status_of(object: &impl Serialize) -> Result<Value, kube::Error> {
    Ok(to_value(object)?
        .get_mut("status")
        .map(Value::take)
        .unwrap_or(Value::Null))
}

/// The values of the status `fields` of `object` (null where absent).
fn projection(object: &impl Serialize, fields: &[String]) -> Result<Vec<Value>, kube::Error> {
    let status = status_of(object)?;
    Ok(fields
        .iter()
        .map(|field| status.get(field).cloned().unwrap_or(Value::Null))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::WRITTEN_MEMORY;
    use k8s_openapi::api::core::v1::Pod;

    fn pod_api() -> (cairn_testing::fake_api::FakeApi, Api<Pod>) {
        let (fake, client) = cairn_testing::fake_api::FakeApi::new();
        fake.put(
            "/api/v1/namespaces/shop/pods/db-0",
            json!({ "metadata": { "name": "db-0", "namespace": "shop" },
                    "status": { "phase": "Pending" } }),
        );
        (fake, Api::<Pod>::namespaced(client, "shop"))
    }

    fn phase(pod: &Pod) -> Option<String> {
        pod.status.as_ref().and_then(|s| s.phase.clone())
    }

    #[tokio::test(start_paused = true)]
    async fn a_status_the_lagging_cache_has_not_shown_is_not_written_again()
    -> Result<(), kube::Error> {
        let (fake, api) = pod_api();
        let cached = api.get("db-0").await?;
        let running = json!({ "phase": "Running" });
        let writes = || fake.writes().len();
        let applier = Applier::default();

        let written = applier
            .apply_status(&api, "cairn", &cached, &running)
            .await?;
        assert_eq!(written.as_ref().and_then(phase).as_deref(), Some("Running"));
        assert_eq!(writes(), 1);
        // The cache still shows the version the status was written over.
        assert!(
            applier
                .apply_status(&api, "cairn", &cached, &running)
                .await?
                .is_none()
        );
        assert_eq!(
            writes(),
            1,
            "the same status written again over one version"
        );

        // Another status over the same version is a new decision: written.
        let failed = json!({ "phase": "Failed" });
        assert!(
            applier
                .apply_status(&api, "cairn", &cached, &failed)
                .await?
                .is_some()
        );
        assert_eq!(writes(), 2);

        // A newer version (the cache caught up, or someone else wrote) is
        // compared afresh, and so is a cache lagging past the memory.
        let fresh = api.get("db-0").await?;
        assert!(
            applier
                .apply_status(&api, "cairn", &fresh, &running)
                .await?
                .is_some()
        );
        assert_eq!(writes(), 3);
        tokio::time::advance(WRITTEN_MEMORY + Duration::from_secs(1)).await;
        assert!(
            applier
                .apply_status(&api, "cairn", &fresh, &running)
                .await?
                .is_some()
        );
        assert_eq!(writes(), 4);
        Ok(())
    }

    #[tokio::test]
    async fn a_status_at_a_version_carries_that_version_and_a_plain_one_none()
    -> Result<(), kube::Error> {
        let (fake, api) = pod_api();
        let cached = api.get("db-0").await?;
        let applier = Applier::default();
        applier
            .apply_status_at_version(&api, "cairn", &cached, &json!({ "phase": "Running" }))
            .await?;
        applier
            .apply_status(&api, "cairn", &cached, &json!({ "phase": "Failed" }))
            .await?;
        let versions: Vec<Value> = fake
            .writes()
            .iter()
            .map(|w| w.body["metadata"]["resourceVersion"].clone())
            .collect();
        assert_eq!(versions, [json!(cached.resource_version()), Value::Null]);
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconcile_of_a_lagging_cache_sees_the_status_written() -> Result<(), kube::Error> {
        let (_fake, api) = pod_api();
        let cached = Arc::new(api.get("db-0").await?);
        let applier = Applier::default();

        let unwritten = applier.with_written_status(cached.clone());
        assert_eq!(phase(&unwritten).as_deref(), Some("Pending"));
        applier
            .apply_status(&api, "cairn", &*cached, &json!({ "phase": "Running" }))
            .await?;
        // The cache still shows the version written over: its reconcile
        // starts from the status written, the rest as cached.
        let seen = applier.with_written_status(cached.clone());
        assert_eq!(phase(&seen).as_deref(), Some("Running"));
        assert_eq!(seen.metadata, cached.metadata);

        // The cache caught up (another version), or the memory ended: as
        // cached.
        let mut newer = (*cached).clone();
        newer.metadata.resource_version = Some("999".into());
        let newer = applier.with_written_status(Arc::new(newer));
        assert_eq!(phase(&newer).as_deref(), Some("Pending"));
        tokio::time::advance(WRITTEN_MEMORY + Duration::from_secs(1)).await;
        let late = applier.with_written_status(cached.clone());
        assert_eq!(phase(&late).as_deref(), Some("Pending"));
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn a_copy_older_than_a_recorded_decision_is_behind_until_the_cache_shows_it()
    -> Result<(), kube::Error> {
        let (_fake, api) = pod_api();
        let cached = api.get("db-0").await?;
        let applier = Applier::default();
        assert!(!applier.is_behind_record(&cached), "nothing recorded");

        let recorded = applier
            .record_in_status(&api, &cached, json!({ "phase": "Running" }))
            .await?;
        assert!(applier.is_behind_record(&cached));
        assert!(!applier.is_behind_record(&recorded), "the cache shows it");
        // Forgotten once seen: a later change by anyone is the truth.
        assert!(!applier.is_behind_record(&cached));

        // A status written while a decision awaits the cache is what the
        // cache will show.
        let recorded = applier
            .record_in_status(&api, &cached, json!({ "phase": "Running" }))
            .await?;
        let written = applier
            .apply_status(&api, "cairn", &recorded, &json!({ "phase": "Failed" }))
            .await?
            .expect("written");
        assert!(applier.is_behind_record(&recorded));
        assert!(!applier.is_behind_record(&written));

        // A cache lagging past the limit: reconciles go on from it.
        applier
            .record_in_status(&api, &cached, json!({ "phase": "Running" }))
            .await?;
        tokio::time::advance(RECORD_LAG_LIMIT + Duration::from_secs(1)).await;
        assert!(!applier.is_behind_record(&cached));
        Ok(())
    }

    #[tokio::test]
    async fn a_plain_status_write_records_nothing() -> Result<(), kube::Error> {
        let (_fake, api) = pod_api();
        let cached = api.get("db-0").await?;
        let applier = Applier::default();
        applier
            .apply_status(&api, "cairn", &cached, &json!({ "phase": "Running" }))
            .await?;
        assert!(!applier.is_behind_record(&cached));
        Ok(())
    }

    #[test]
    fn a_recorded_field_replaces_the_previous_one_whole() {
        let previous = json!({
            "currentPrimary": "db-0",
            "lastSwitchover": { "from": "db-1", "to": "db-0", "promotedAt": "t1" },
        });
        let patch = replacing(
            &previous,
            json!({ "lastSwitchover": { "from": "db-0", "to": "db-1" } }),
        );
        assert_eq!(
            patch,
            json!({ "lastSwitchover": { "from": "db-0", "to": "db-1", "promotedAt": null } })
        );
    }
}
