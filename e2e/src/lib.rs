//! End-to-end suites against the local control plane live in `tests/`; each
//! file is one suite (`cargo test -p cairn-e2e --test <suite>`). This library
//! holds what several suites share.

pub mod chaos;
pub mod real;

use std::time::Duration;

use kube::Api;
use kube::api::{ApiResource, DynamicObject, PostParams};
use serde_json::json;

/// The DatabaseCluster resource at `version` (`v1` or `v1alpha1`).
pub fn database_cluster(version: &str) -> ApiResource {
    ApiResource {
        group: cairn_api::DATABASE_GROUP.into(),
        version: version.into(),
        api_version: format!("{}/{version}", cairn_api::DATABASE_GROUP),
        kind: "DatabaseCluster".into(),
        plural: "databaseclusters".into(),
    }
}

/// Creates v1alpha1 DatabaseCluster `name` (`size` instances of PostgreSQL
/// `version`, `storage` each) through `api`, retrying for up to 30 s while
/// the API server cannot reach the conversion webhook yet (a CRD change or a
/// new certificate takes a moment to be used). `what` names the wait.
pub async fn create_v1alpha1_cluster(
    api: &Api<DynamicObject>,
    what: &str,
    name: &str,
    size: i32,
    version: &str,
    storage: &str,
) -> Result<DynamicObject, cairn_testing::Error> {
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{}/v1alpha1", cairn_api::DATABASE_GROUP), "kind": "DatabaseCluster",
        "metadata": { "name": name },
        "spec": { "size": size, "version": version, "storageSize": storage }
    }))
    .map_err(|e| cairn_testing::Error::Setup(e.to_string()))?;
    cairn_testing::wait::until(what, Duration::from_secs(30), || async {
        api.create(&PostParams::default(), &object)
            .await
            .map(Some)
            .map_err(|e| e.to_string())
    })
    .await
}
