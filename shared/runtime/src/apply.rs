//! Server-side apply that sends nothing when nothing would change: at steady
//! state a controller makes zero write requests. Children and the few
//! fields set on objects of others here; status writes in [`status`].

mod status;

pub use status::{RECORD_LAG_LIMIT, replacing};

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// What [`apply`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The object already had every field of the desired state: no request sent.
    Unchanged,
    /// The desired state was applied.
    Applied,
}

/// Applies `desired` with field manager `manager` (forcing ownership of its
/// fields), unless `current` (the object as last seen, e.g. from the
/// controller's cache) already holds every field `desired` sets. Without
/// memory: a controller applies through its [`Applier`].
pub async fn apply<K>(
    api: &Api<K>,
    manager: &str,
    desired: &K,
    current: Option<&K>,
) -> Result<(K, Outcome), kube::Error>
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
    K::DynamicType: Default,
{
    apply_value(api, manager, desired, &to_value(desired)?, current).await
}

/// [`apply`] of `desired`, already serialized as `desired_value`.
async fn apply_value<K>(
    api: &Api<K>,
    manager: &str,
    desired: &K,
    desired_value: &Value,
    current: Option<&K>,
) -> Result<(K, Outcome), kube::Error>
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
    K::DynamicType: Default,
{
    if let Some(current) = current {
        match difference(&to_value(current)?, desired_value) {
            None => return Ok((current.clone(), Outcome::Unchanged)),
            // Says why a write happened: a field that never settles (a
            // default the server fills in differently) shows up here.
            Some(field) => tracing::debug!(
                kind = %K::kind(&Default::default()),
                name = %desired.name_any(),
                field,
                "applying: a field differs"
            ),
        }
    }
    let applied = api
        .patch(
            &desired.name_any(),
            &PatchParams::apply(manager).force(),
            &Patch::Apply(desired),
        )
        .await?;
    Ok((applied, Outcome::Applied))
}

/// One controller's server-side applies, of children and of statuses, with
/// the memory of its last write of each: what it wrote and the version of
/// the object it wrote over. A cache that lags this process's own write (a
/// new leader's, or one whose watch failed, after an API server outage)
/// still shows that version, and a reconcile from it would write the same
/// again (and announce a status's transitions again) at every requeue;
/// within [`WRITTEN_MEMORY`] it is not sent. Another version (the cache
/// caught up, someone else wrote, the object was recreated) is compared
/// afresh.
#[derive(Default)]
pub struct Applier {
    written: Mutex<HashMap<String, Written>>,
    /// Decisions recorded in a status, until the cache shows them.
    records: Mutex<HashMap<String, status::Record>>,
}

/// How long a write is taken as known to a cache that has not shown it: a
/// cache lagging longer than this gets the write once more (harmless).
pub const WRITTEN_MEMORY: Duration = Duration::from_secs(30);

/// A write this process made: what, over which version, when.
struct Written {
    desired: Value,
    over_version: Option<String>,
    at: Instant,
}

impl Applier {
    /// [`apply`], unless this process applied exactly `desired` over the
    /// version `current` still shows.
    pub async fn apply<K>(
        &self,
        api: &Api<K>,
        manager: &str,
        desired: &K,
        current: Option<&K>,
    ) -> Result<(K, Outcome), kube::Error>
    where
        K: Resource + Clone + Debug + Serialize + DeserializeOwned,
        K::DynamicType: Default,
    {
        let key = written_key(desired, "");
        let desired_value = to_value(desired)?;
        if let Some(current) = current
            && self.recently_written_over(&key, &desired_value, current)
        {
            return Ok((current.clone(), Outcome::Unchanged));
        }
        let applied = apply_value(api, manager, desired, &desired_value, current).await?;
        if let (Some(current), Outcome::Applied) = (current, applied.1) {
            self.remember(key, desired_value, current);
        }
        Ok(applied)
    }

    /// Merge-patches `patch` onto `current` (the object as the controller
    /// read it, from its cache), unless this process sent exactly `patch`
    /// over the version `current` still shows. For the few fields a
    /// controller sets on objects it does not own (a pod's role label), where
    /// an apply would take over fields others manage. The caller decides
    /// that `current` lacks what `patch` sets.
    pub async fn merge_patch<K>(
        &self,
        api: &Api<K>,
        current: &K,
        patch: &Value,
    ) -> Result<Outcome, kube::Error>
    where
        K: Resource + Clone + Debug + DeserializeOwned,
        K::DynamicType: Default,
    {
        let key = written_key(current, "/merge");
        if self.recently_written_over(&key, patch, current) {
            return Ok(Outcome::Unchanged);
        }
        api.patch(
            &current.name_any(),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await?;
        self.remember(key, patch.clone(), current);
        Ok(Outcome::Applied)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Written>> {
        self.written.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether exactly `desired` was written over the version `current`
    /// still shows, within [`WRITTEN_MEMORY`].
    fn recently_written_over<K: Resource>(&self, key: &str, desired: &Value, current: &K) -> bool {
        self.written_over(key, current).as_ref() == Some(desired)
    }

    /// What this process wrote under `key` over the version `current`
    /// shows, within [`WRITTEN_MEMORY`].
    fn written_over<K: Resource>(&self, key: &str, current: &K) -> Option<Value> {
        let written = self.lock();
        let last = written.get(key)?;
        (last.at.elapsed() < WRITTEN_MEMORY
            && last.over_version.is_some()
            && last.over_version == current.resource_version())
        .then(|| last.desired.clone())
    }

    fn remember<K: Resource>(&self, key: String, desired: Value, current: &K) {
        let mut written = self.lock();
        written.retain(|_, last| last.at.elapsed() < WRITTEN_MEMORY);
        written.insert(
            key,
            Written {
                desired,
                over_version: current.resource_version(),
                at: Instant::now(),
            },
        );
    }
}

/// Deletes `name` only while it is still the object with `uid`. Returns
/// whether this call deleted it: one already gone (404) or replaced by a
/// new object of the same name (409, the precondition) is no error, and
/// the new one is never touched.
pub async fn delete_exactly<K>(
    api: &Api<K>,
    name: &str,
    uid: Option<String>,
    propagation_policy: Option<kube::api::PropagationPolicy>,
) -> Result<bool, kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = kube::api::DeleteParams {
        propagation_policy,
        preconditions: Some(kube::api::Preconditions {
            uid,
            resource_version: None,
        }),
        ..kube::api::DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

fn written_key<K: Resource>(object: &K, part: &str) -> String
where
    K::DynamicType: Default,
{
    format!(
        "{}/{}/{}{part}",
        K::kind(&Default::default()),
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}

fn to_value(object: &impl Serialize) -> Result<Value, kube::Error> {
    serde_json::to_value(object).map_err(kube::Error::SerdeError)
}

/// Whether `actual` has every field `desired` sets, with the same value.
/// Objects may have more keys; lists must match element by element. Status
/// and server-set metadata are not compared; a field desired null, `{}` or
/// `[]` may be absent (the API server drops empty values).
pub fn contains(actual: &Value, desired: &Value) -> bool {
    difference(actual, desired).is_none()
}

/// The path of the first field `desired` sets that `actual` lacks or holds
/// with another value (see [`contains`]).
pub fn difference(actual: &Value, desired: &Value) -> Option<String> {
    match (actual, desired) {
        (Value::Object(actual), Value::Object(desired)) => {
            desired.iter().find_map(|(key, value)| {
                if key == "status" {
                    return None;
                }
                match actual.get(key) {
                    Some(found) => difference(found, value).map(|path| format!(".{key}{path}")),
                    None if is_empty(value) => None,
                    None => Some(format!(".{key}")),
                }
            })
        }
        (Value::Array(actual), Value::Array(desired)) => {
            if actual.len() != desired.len() {
                return Some(format!(" (length {} != {})", actual.len(), desired.len()));
            }
            actual
                .iter()
                .zip(desired)
                .enumerate()
                .find_map(|(i, (a, d))| difference(a, d).map(|path| format!("[{i}]{path}")))
        }
        (actual, desired) if actual == desired => None,
        _ => Some(String::new()),
    }
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(map) => map.is_empty(),
        Value::Array(list) => list.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test(start_paused = true)]
    async fn an_apply_the_lagging_cache_has_not_shown_is_not_repeated() -> Result<(), kube::Error> {
        use k8s_openapi::api::core::v1::ConfigMap;
        let (fake, client) = cairn_testing::fake_api::FakeApi::new();
        let path = "/api/v1/namespaces/shop/configmaps/lagging";
        fake.put(
            path,
            serde_json::json!({ "metadata": { "name": "lagging", "namespace": "shop" },
                                           "data": { "k": "old" } }),
        );
        let api = Api::<ConfigMap>::namespaced(client, "shop");
        let cached = api.get("lagging").await?;
        let desired: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "lagging", "namespace": "shop" }, "data": { "k": "new" } }))
        .expect("a ConfigMap");
        let patches = || fake.writes().len();
        let applier = Applier::default();

        assert_eq!(
            applier
                .apply(&api, "cairn", &desired, Some(&cached))
                .await?
                .1,
            Outcome::Applied
        );
        assert_eq!(patches(), 1);
        // The cache still shows the version it was applied over.
        assert_eq!(
            applier
                .apply(&api, "cairn", &desired, Some(&cached))
                .await?
                .1,
            Outcome::Unchanged
        );
        assert_eq!(patches(), 1, "not applied again over the same version");

        // Someone changed it since: the cache shows a newer version.
        let changed = api.get("lagging").await?;
        let mut edited = changed.clone();
        edited.metadata.resource_version = Some("999".into());
        edited.data = Some([("k".to_owned(), "edited".to_owned())].into());
        assert_eq!(
            applier
                .apply(&api, "cairn", &desired, Some(&edited))
                .await?
                .1,
            Outcome::Applied
        );
        assert_eq!(patches(), 2);

        // A cache lagging past the memory gets the apply again.
        tokio::time::advance(WRITTEN_MEMORY + Duration::from_secs(1)).await;
        assert_eq!(
            applier
                .apply(&api, "cairn", &desired, Some(&edited))
                .await?
                .1,
            Outcome::Applied
        );
        assert_eq!(patches(), 3);
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn a_merge_patch_the_lagging_cache_has_not_shown_is_not_repeated()
    -> Result<(), kube::Error> {
        use k8s_openapi::api::core::v1::Pod;
        let (fake, client) = cairn_testing::fake_api::FakeApi::new();
        fake.put(
            "/api/v1/namespaces/shop/pods/db-0",
            serde_json::json!({ "metadata": { "name": "db-0", "namespace": "shop",
                                              "resourceVersion": "5" } }),
        );
        let api = Api::<Pod>::namespaced(client, "shop");
        let cached = api.get("db-0").await?;
        let label = |role: &str| serde_json::json!({ "metadata": { "labels": { "role": role } } });
        let patches = || fake.writes().len();
        let applier = Applier::default();

        let patch = label("primary");
        assert_eq!(
            applier.merge_patch(&api, &cached, &patch).await?,
            Outcome::Applied
        );
        // A reconcile a second later, from a cache that has not shown it.
        assert_eq!(
            applier.merge_patch(&api, &cached, &patch).await?,
            Outcome::Unchanged
        );
        assert_eq!(patches(), 1, "not patched again over the same version");

        // Another patch over the same version is sent (a new decision).
        assert_eq!(
            applier
                .merge_patch(&api, &cached, &label("replica"))
                .await?,
            Outcome::Applied
        );
        // The cache shows a newer version (someone relabelled it): sent.
        let mut relabelled = cached.clone();
        relabelled.metadata.resource_version = Some("9".into());
        assert_eq!(
            applier
                .merge_patch(&api, &relabelled, &label("replica"))
                .await?,
            Outcome::Applied
        );
        // A cache lagging past the memory gets it again.
        tokio::time::advance(WRITTEN_MEMORY + Duration::from_secs(1)).await;
        assert_eq!(
            applier
                .merge_patch(&api, &relabelled, &label("replica"))
                .await?,
            Outcome::Applied
        );
        assert_eq!(patches(), 4);
        Ok(())
    }

    #[test]
    fn server_added_fields_do_not_count_as_changes() {
        let actual = json!({
            "metadata": {"name": "a", "uid": "1", "resourceVersion": "7", "labels": {"x": "1", "y": "2"}},
            "data": {"k": "v"}
        });
        assert!(contains(
            &actual,
            &json!({"metadata": {"name": "a", "labels": {"x": "1"}}, "data": {"k": "v"}})
        ));
    }

    #[test]
    fn a_different_or_missing_value_is_a_change() {
        let actual = json!({"data": {"k": "v"}, "list": [{"a": 1}, {"a": 2}]});
        assert!(!contains(&actual, &json!({"data": {"k": "w"}})));
        assert!(!contains(&actual, &json!({"data": {"other": "v"}})));
        assert!(
            !contains(&actual, &json!({"list": [{"a": 1}]})),
            "a shorter list is a change"
        );
        assert!(contains(&actual, &json!({"list": [{"a": 1}, {"a": 2}]})));
        assert!(contains(&actual, &json!({"status": {"ignored": true}})));
        assert!(
            contains(
                &actual,
                &json!({"data": {"k": "v"}, "empty": {}, "none": [], "null": null})
            ),
            "the API server drops empty values"
        );
        assert!(!contains(&actual, &json!({"data": {}, "missing": ""})));
        assert_eq!(
            difference(&actual, &json!({"list": [{"a": 1}, {"a": 3}]})).as_deref(),
            Some(".list[1].a")
        );
    }
}
