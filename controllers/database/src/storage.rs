//! Storage growth: each instance's claim grows to `spec.storage.size` where
//! its StorageClass allows expansion.

use cairn_api::database::v1::DatabaseCluster;
use cairn_api::validate;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::context::Context;
use crate::error::Error;

/// Grows each instance's claim to `spec.storage.size` (claims only grow; the
/// schema rejects a shrink). Returns the StorageClass that refuses expansion,
/// if one does; nothing is patched then.
pub async fn grow(ctx: &Context, cluster: &DatabaseCluster) -> Result<Option<String>, Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let Some(wanted) = validate::parse_quantity(&cluster.spec.storage.size) else {
        return Ok(None); // the schema only admits valid quantities
    };
    let small: Vec<_> = ctx
        .caches
        .claims
        .state_filter(|claim| {
            claim.namespace().as_deref() == Some(namespace.as_str())
                && claim.labels().get("app.kubernetes.io/instance") == Some(&name)
        })
        .into_iter()
        .filter(|claim| requested_storage(claim).is_some_and(|size| size < wanted))
        .collect();
    // Read, not cached: only a pending growth gets here, and a cluster-wide
    // StorageClass cache would cost every replica memory for this rare read.
    let classes = Api::<StorageClass>::all(ctx.client.clone());
    let claims = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &namespace);
    for claim in small {
        let class = claim
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.clone())
            .unwrap_or_default();
        let expandable = classes
            .get_opt(&class)
            .await?
            .and_then(|c| c.allow_volume_expansion)
            .unwrap_or(false);
        if !expandable {
            return Ok(Some(class));
        }
        let patch = json!({ "spec": { "resources": { "requests": { "storage": cluster.spec.storage.size } } } });
        ctx.applier.merge_patch(&claims, &*claim, &patch).await?;
    }
    Ok(None)
}

fn requested_storage(claim: &PersistentVolumeClaim) -> Option<i128> {
    let requests = claim.spec.as_ref()?.resources.as_ref()?.requests.as_ref()?;
    validate::parse_quantity(&requests.get("storage")?.0)
}
