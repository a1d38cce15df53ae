//! End-to-end suites against the local control plane live in `tests/`; each
//! file is one suite (`cargo test -p cairn-e2e --test <suite>`). This library
//! holds what several suites share.

use axum::Json;
use axum::routing::post;
use cairn_api::database::conversion;
use kube::api::ApiResource;

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

/// A router answering the API server's `ConversionReview`s at `/convert`
/// with the api crate's handler.
pub fn conversion_router() -> axum::Router {
    axum::Router::new().route(
        "/convert",
        post(|Json(review)| async move { Json(conversion::review(review)) }),
    )
}
