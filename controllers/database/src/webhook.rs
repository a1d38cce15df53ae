//! The DatabaseCluster conversion webhook (v1alpha1 <-> v1), served by every
//! replica, leader or not.

use axum::routing::post;
use axum::{Json, Router};
use cairn_api::database::conversion;

/// The CRD whose conversions this webhook answers.
pub const CRD: &str = "databaseclusters.database.cairn.dev";

/// Answers the API server's `ConversionReview`s at `/convert`.
pub fn router() -> Router {
    Router::new().route(
        "/convert",
        post(|Json(review)| async move { Json(conversion::review(review)) }),
    )
}
