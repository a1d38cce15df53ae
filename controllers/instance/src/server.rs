//! The instance's two HTTP listeners: health and status for the kubelet and
//! the controller, metrics for Prometheus.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State as Extract;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};

use cairn_runtime::admin;

use crate::state::State;

#[derive(Clone)]
struct Routes {
    state: Arc<State>,
    live_limit: Duration,
}

pub fn health_router(state: Arc<State>, live_limit: Duration) -> Router {
    Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/status", get(status))
        .with_state(Routes { state, live_limit })
}

pub fn metrics_router(state: Arc<State>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(Routes {
            state,
            live_limit: Duration::ZERO,
        })
}

/// Serves `router` on `address` for as long as the process runs.
pub async fn serve(address: SocketAddr, router: Router) -> std::io::Result<()> {
    let listener = admin::listen(address).await?;
    admin::serve(listener, router, std::future::pending()).await
}

async fn livez(Extract(routes): Extract<Routes>) -> impl IntoResponse {
    match routes.state.live(routes.live_limit) {
        Ok(text) => (StatusCode::OK, text),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason.to_string()),
    }
}

async fn readyz(Extract(routes): Extract<Routes>) -> impl IntoResponse {
    let status = routes.state.status();
    match status.ready {
        true => (StatusCode::OK, "ok".to_owned()),
        false => (
            StatusCode::SERVICE_UNAVAILABLE,
            status.reason.unwrap_or_else(|| "not ready".to_owned()),
        ),
    }
}

async fn status(Extract(routes): Extract<Routes>) -> impl IntoResponse {
    Json(routes.state.status())
}

async fn metrics(Extract(routes): Extract<Routes>) -> impl IntoResponse {
    admin::metrics_text(routes.state.metrics.render())
}
