//! Server-side apply that sends nothing when nothing would change: at steady
//! state a controller makes zero write requests.

use std::fmt::Debug;

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
/// controller's cache) already holds every field `desired` sets.
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
    if let Some(current) = current {
        match difference(&to_value(current)?, &to_value(desired)?) {
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

/// Applies `status` to the status of `object` (as the controller read it,
/// e.g. from its cache) with field manager `manager`, only if the object
/// has not changed since: the `resourceVersion` read is a precondition, and
/// a stale read gets 409 Conflict, a transient error, instead of a write.
/// A status is computed from the status read (conditions keep their
/// transition time, Events mark transitions): written from a cache that
/// lags (a new leader's, after an API server outage), it would flip back
/// what a newer write set, and announce it again, at every requeue.
pub async fn apply_status<K>(
    api: &Api<K>,
    manager: &str,
    object: &K,
    status: &impl Serialize,
) -> Result<K, kube::Error>
where
    K: Resource + Clone + Debug + DeserializeOwned,
    K::DynamicType: Default,
{
    let dynamic = K::DynamicType::default();
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&dynamic),
        "kind": K::kind(&dynamic),
        "metadata": { "resourceVersion": object.resource_version() },
        "status": status,
    });
    api.patch_status(
        &object.name_any(),
        &PatchParams::apply(manager).force(),
        &Patch::Apply(&patch),
    )
    .await
}

#[cfg(test)]
mod tests {

    #[tokio::test]
    async fn a_status_computed_from_a_stale_read_is_refused() -> Result<(), kube::Error> {
        use k8s_openapi::api::core::v1::Pod;
        let (fake, client) = cairn_testing::fake_api::FakeApi::new();
        let path = "/api/v1/namespaces/shop/pods/db-0";
        fake.put(
            path,
            serde_json::json!({ "metadata": { "name": "db-0", "namespace": "shop" } }),
        );
        let api = Api::<Pod>::namespaced(client, "shop");
        let read = api.get("db-0").await?;
        fake.put(
            path,
            serde_json::json!({ "metadata": { "name": "db-0", "namespace": "shop" },
                                           "status": { "phase": "Running" } }),
        );
        let stale = apply_status(
            &api,
            "cairn",
            &read,
            &serde_json::json!({ "phase": "Pending" }),
        )
        .await
        .expect_err("written over a newer status");
        assert!(
            matches!(stale, kube::Error::Api(ref s) if s.code == 409),
            "{stale}"
        );
        assert_eq!(
            api.get("db-0")
                .await?
                .status
                .and_then(|s| s.phase)
                .as_deref(),
            Some("Running")
        );

        let fresh = api.get("db-0").await?;
        apply_status(
            &api,
            "cairn",
            &fresh,
            &serde_json::json!({ "phase": "Succeeded" }),
        )
        .await?;
        assert_eq!(
            api.get("db-0")
                .await?
                .status
                .and_then(|s| s.phase)
                .as_deref(),
            Some("Succeeded")
        );
        Ok(())
    }
    use super::*;
    use serde_json::json;

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
