//! Finalizers, for controllers that must clean up something outside the
//! cluster before an object goes (a bucket, a DNS record). Objects whose
//! children are all in the cluster need none: owner references suffice.
//!
//! Both helpers write only when needed and use JSON-patch `test` operations,
//! so a concurrent change of the list fails the write instead of being lost.
//! kube-runtime's `finalizer` does the same, but takes over the whole
//! reconcile (its `Apply`/`Cleanup` events); a driver of external resources
//! needs the two steps separately, inside its own observe → act flow.

use std::fmt::Debug;

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

/// Adds `finalizer` to `object` unless it is there. Returns whether it wrote.
pub async fn add<K>(api: &Api<K>, object: &K, finalizer: &str) -> Result<bool, kube::Error>
where
    K: Resource + Clone + Debug + DeserializeOwned,
{
    let current = object.finalizers();
    if current.iter().any(|f| f == finalizer) {
        return Ok(false);
    }
    let operations = if object.meta().finalizers.is_none() {
        json!([
            { "op": "test", "path": "/metadata/resourceVersion", "value": object.resource_version() },
            { "op": "add", "path": "/metadata/finalizers", "value": [finalizer] },
        ])
    } else {
        json!([
            { "op": "test", "path": "/metadata/finalizers", "value": current },
            { "op": "add", "path": "/metadata/finalizers/-", "value": finalizer },
        ])
    };
    patch(api, object, operations).await?;
    Ok(true)
}

/// Removes `finalizer` from `object` if it is there (the clean-up is done).
/// Returns whether it wrote.
pub async fn remove<K>(api: &Api<K>, object: &K, finalizer: &str) -> Result<bool, kube::Error>
where
    K: Resource + Clone + Debug + DeserializeOwned,
{
    let Some(index) = object.finalizers().iter().position(|f| f == finalizer) else {
        return Ok(false);
    };
    let path = format!("/metadata/finalizers/{index}");
    let operations = json!([
        { "op": "test", "path": path, "value": finalizer },
        { "op": "remove", "path": path },
    ]);
    patch(api, object, operations).await?;
    Ok(true)
}

async fn patch<K>(
    api: &Api<K>,
    object: &K,
    operations: serde_json::Value,
) -> Result<(), kube::Error>
where
    K: Resource + Clone + Debug + DeserializeOwned,
{
    let operations: json_patch::Patch =
        serde_json::from_value(operations).map_err(kube::Error::SerdeError)?;
    api.patch(
        &object.name_any(),
        &PatchParams::default(),
        &Patch::<()>::Json(operations),
    )
    .await?;
    Ok(())
}
