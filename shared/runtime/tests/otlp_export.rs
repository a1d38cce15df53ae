//! With an OTLP endpoint configured, a reconcile's span reaches the collector
//! (here: a small HTTP server standing in for one). Its own test binary: the
//! global subscriber can be installed once per process.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::routing::post;
use cairn_runtime::config::LogFormat;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_spans_are_exported_over_otlp_http() {
    let received: Arc<Mutex<Vec<(String, Bytes)>>> = Arc::default();
    let sink = received.clone();
    let collector = Router::new().route(
        "/v1/traces",
        post(move |headers: HeaderMap, body: Bytes| {
            let sink = sink.clone();
            async move {
                let content_type = headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                sink.lock()
                    .expect("not poisoned")
                    .push((content_type, body));
                ""
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("free port");
    let endpoint = format!("http://{}", listener.local_addr().expect("bound"));
    tokio::spawn(async move { axum::serve(listener, collector).await });

    let telemetry =
        cairn_runtime::telemetry::init("cairn-test", LogFormat::Json, "info", Some(&endpoint))
            .expect("telemetry starts");
    tracing::info_span!("reconcile", object.ref = "db/orders")
        .in_scope(|| tracing::info!("reconciled"));
    tokio::task::spawn_blocking(move || telemetry.shutdown())
        .await
        .expect("shutdown runs");

    let received = received.lock().expect("not poisoned");
    assert!(!received.is_empty(), "the collector received nothing");
    let (content_type, body) = &received[0];
    assert_eq!(content_type, "application/x-protobuf");
    let contains = |needle: &[u8]| body.windows(needle.len()).any(|w| w == needle);
    assert!(contains(b"reconcile"), "no span named reconcile");
    assert!(
        contains(b"db/orders"),
        "the object reference attribute is missing"
    );
    assert!(contains(b"cairn-test"), "the service name is missing");
}
