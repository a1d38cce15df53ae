//! The DatabaseCluster conversion webhook (v1alpha1 <-> v1), served by every
//! replica, leader or not.

use axum::routing::post;
use axum::{Json, Router};
use cairn_api::database::conversion;
use cairn_runtime::metrics::{Metrics, RuntimeError};
use kube::core::conversion::ConversionReview;

/// The CRD whose conversions this webhook answers.
pub const CRD: &str = "databaseclusters.database.cairn.dev";

/// Answers the API server's `ConversionReview`s at `/convert`. A conversion
/// that fails is logged and counted (`cairn_runtime_errors_total{reason="conversion"}`):
/// the API server only tells the client that asked.
pub fn router(metrics: Metrics) -> Router {
    Router::new().route(
        "/convert",
        post(|Json(review): Json<ConversionReview>| async move {
            let answered = conversion::review(review);
            if let Some(failure) = answered.response.as_ref().filter(|r| r.result.is_failure()) {
                tracing::warn!(message = %failure.result.message, "conversion failed");
                metrics.record_runtime_error(RuntimeError::Conversion);
            }
            Json(answered)
        }),
    )
}
