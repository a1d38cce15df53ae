//! The one admin HTTP server of a controller: `/livez`, `/readyz` and
//! `/metrics` on a single port. [`listen`], [`serve`] and [`metrics_text`]
//! also serve cairn-instance's listeners: one HTTP server implementation.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::metrics::Metrics;

/// A watch that keeps failing reports an error at least this often: the
/// watcher's longest retry delay is 30 s. A resumed watch that succeeds says
/// nothing until an object changes, so this much quiet after the last error
/// counts as recovered.
const WATCH_QUIET_AFTER_RECOVERY: Duration = Duration::from_secs(35);

/// What a cache can have missed: changes made while its watch failed, and
/// until it listed again, are seen only from then on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sight {
    /// Its watch never failed in this process.
    Unbroken,
    /// Its watch fails, and has delivered nothing since.
    Blind,
    /// Its watch failed, and delivered again at this instant.
    Since(Instant),
}

/// What the probes report, updated by the manager.
#[derive(Clone)]
pub struct Health {
    inner: Arc<Mutex<HealthState>>,
    /// How long watches may fail before `/livez` fails (the process is then
    /// restarted, which re-establishes every connection).
    watch_failure_limit: Duration,
    quiet_after_recovery: Duration,
}

struct HealthState {
    ready: bool,
    /// The failing watches, by kind: one kind's events say nothing of
    /// another's watch (a Role can be forbidden while Pods flow).
    failing: HashMap<String, FailureRun>,
    /// When each watch that had failed delivered again.
    resumed: HashMap<String, Instant>,
    /// Why the process cannot work any more (a restart is the remedy).
    broken: Option<String>,
}

/// A run of one watch's failures.
struct FailureRun {
    since: Instant,
    last: Instant,
}

impl Health {
    pub fn new(watch_failure_limit: Duration) -> Self {
        Self {
            inner: Arc::new(Mutex::new(HealthState {
                ready: false,
                failing: HashMap::new(),
                resumed: HashMap::new(),
                broken: None,
            })),
            watch_failure_limit,
            quiet_after_recovery: WATCH_QUIET_AFTER_RECOVERY,
        }
    }

    /// Ready: the caches have synced (leader), or the replica stands by
    /// healthily with warm caches.
    pub fn set_ready(&self, ready: bool) {
        self.update(|s| s.ready = ready);
    }

    /// The watch of `kind` failed (the API server is unreachable, say).
    pub fn watch_failed(&self, kind: &str) {
        let quiet = self.quiet_after_recovery;
        self.update(|s| {
            let now = Instant::now();
            let run = s.failing.entry(kind.to_owned()).or_insert(FailureRun {
                since: now,
                last: now,
            });
            if run.last.elapsed() > quiet {
                run.since = now; // a new run of failures
            }
            run.last = now;
        });
    }

    /// The watch of `kind` delivered an event or re-listed: it works.
    pub fn watch_ok(&self, kind: &str) {
        self.update(|s| {
            if s.failing.remove(kind).is_some() {
                s.resumed.insert(kind.to_owned(), Instant::now());
            }
        });
    }

    /// What the cache of `kind` can have missed, as its watch tells.
    pub fn sight(&self, kind: &str) -> Sight {
        self.read(|s| {
            if s.failing.contains_key(kind) {
                Sight::Blind
            } else {
                s.resumed
                    .get(kind)
                    .map_or(Sight::Unbroken, |at| Sight::Since(*at))
            }
        })
    }

    /// Something the process needs stopped for good: `/livez` fails from now
    /// on, so the kubelet restarts it.
    pub fn broken(&self, reason: String) {
        self.update(|s| s.broken = Some(reason));
    }

    /// Whether the process is healthy, with a reason if not: unhealthy while
    /// watches have kept failing for longer than the limit, or once broken.
    pub fn live(&self) -> Result<(), String> {
        if let Some(reason) = self.read(|s| s.broken.clone()) {
            return Err(reason);
        }
        let quiet = self.quiet_after_recovery;
        let limit = self.watch_failure_limit;
        let failing = self.read(|s| {
            s.failing
                .iter()
                .filter(|(_, run)| run.last.elapsed() <= quiet && run.since.elapsed() > limit)
                .map(|(kind, run)| format!("{kind} ({} s)", run.since.elapsed().as_secs()))
                .collect::<Vec<_>>()
        });
        if failing.is_empty() {
            return Ok(());
        }
        Err(format!(
            "watches have failed for longer than {} s: {}",
            limit.as_secs(),
            failing.join(", ")
        ))
    }

    pub fn ready(&self) -> bool {
        self.read(|s| s.ready)
    }

    fn update(&self, change: impl FnOnce(&mut HealthState)) {
        // A poisoned lock only means a panic elsewhere; the flags stay usable.
        let mut state = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        change(&mut state);
    }

    fn read<T>(&self, get: impl FnOnce(&HealthState) -> T) -> T {
        get(&self.inner.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

#[derive(Clone)]
struct AdminState {
    health: Health,
    metrics: Metrics,
}

/// The admin routes.
pub fn router(health: Health, metrics: Metrics) -> Router {
    Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(render_metrics))
        .with_state(AdminState { health, metrics })
}

/// Binds `address`, so a taken port fails at start, not later.
pub async fn listen(address: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(address).await
}

/// Serves `router` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

/// A `/metrics` answer: `text` in the Prometheus text format.
pub fn metrics_text(text: String) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

async fn livez(State(state): State<AdminState>) -> impl IntoResponse {
    match state.health.live() {
        Ok(()) => (StatusCode::OK, "ok".to_owned()),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason),
    }
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    match state.health.ready() {
        true => (StatusCode::OK, "ok"),
        false => (StatusCode::SERVICE_UNAVAILABLE, "caches not synced"),
    }
}

async fn render_metrics(State(state): State<AdminState>) -> impl IntoResponse {
    metrics_text(state.metrics.render())
}

/// Blocking `GET url`s (plain `http://host:port/path`, HTTP/1.0) until one
/// answers 200, a second apart, for at most `deadline`: the `--probe` mode of
/// the controller binaries, run by the charts' `helm test` pod, before any
/// runtime is started. Tried again because a `helm test` right after an
/// install can come before kube-proxy has the Service's new endpoints (it
/// refuses connections to a Service it knows no ready endpoint of). Returns
/// the last attempt's error.
pub fn probe(url: &str, deadline: Duration) -> Result<(), String> {
    let started = std::time::Instant::now();
    loop {
        let left = deadline.saturating_sub(started.elapsed());
        match probe_once(url, left.max(Duration::from_millis(100))) {
            Ok(()) => return Ok(()),
            Err(e) if started.elapsed() + PROBE_PAUSE >= deadline => return Err(e),
            Err(e) => {
                eprintln!("{url}: {e}; trying again");
                std::thread::sleep(PROBE_PAUSE);
            }
        }
    }
}

/// The pause between two attempts of [`probe`].
const PROBE_PAUSE: Duration = Duration::from_secs(1);

/// One attempt of [`probe`], each step within `timeout`.
fn probe_once(url: &str, timeout: Duration) -> Result<(), String> {
    use std::io::{Read, Write};
    use std::net::{TcpStream, ToSocketAddrs};

    let rest = url
        .strip_prefix("http://")
        .ok_or("only http:// URLs can be probed")?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    let address = authority
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {authority}: {e}"))?
        .next()
        .ok_or_else(|| format!("{authority} has no address"))?;
    let mut stream = TcpStream::connect_timeout(&address, timeout)
        .map_err(|e| format!("cannot connect to {address}: {e}"))?;
    let io = |e: std::io::Error| format!("{address}: {e}");
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {authority}\r\n\r\n").map_err(io)?;
    let mut answer = Vec::new();
    stream
        .take(64 * 1024)
        .read_to_end(&mut answer)
        .map_err(io)?;
    let answer = String::from_utf8_lossy(&answer);
    let status = answer.lines().next().unwrap_or_default();
    match status.split_whitespace().nth(1) {
        Some("200") => Ok(()),
        _ => Err(format!(
            "answered {status:?}: {}",
            answer.split("\r\n\r\n").nth(1).unwrap_or_default().trim()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::{Body, to_bytes};
    use axum::http::Request;
    use tower::ServiceExt;

    async fn get(router: &Router, path: &str) -> (StatusCode, String) {
        let response = router
            .clone()
            .oneshot(
                Request::get(path)
                    .body(Body::empty())
                    .expect("valid request"),
            )
            .await
            .expect("infallible");
        let status = response.status();
        let body = to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("readable body");
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    fn fixture(limit: Duration) -> (Health, Router) {
        let health = Health::new(limit);
        let metrics = Metrics::new("test", "0.0.0", "none").expect("valid metrics");
        (health.clone(), router(health, metrics))
    }

    #[tokio::test]
    async fn readyz_follows_cache_sync() {
        let (health, router) = fixture(Duration::from_secs(60));
        assert_eq!(
            get(&router, "/readyz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        health.set_ready(true);
        assert_eq!(get(&router, "/readyz").await, (StatusCode::OK, "ok".into()));
    }

    #[tokio::test]
    async fn livez_fails_only_after_a_watch_failed_past_the_limit() {
        let (health, router) = fixture(Duration::from_millis(100));
        assert_eq!(get(&router, "/livez").await.0, StatusCode::OK);
        health.watch_failed("Pod");
        assert_eq!(
            get(&router, "/livez").await.0,
            StatusCode::OK,
            "a short outage is tolerated"
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
        health.watch_failed("Pod"); // still failing: the start of the run is kept
        let (status, body) = get(&router, "/livez").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            body.contains("watches have failed") && body.contains("Pod"),
            "{body}"
        );
        health.watch_ok("Pod");
        assert_eq!(get(&router, "/livez").await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn another_kinds_events_do_not_hide_a_failing_watch() {
        let (health, _) = fixture(Duration::from_millis(100));
        health.watch_failed("Role");
        tokio::time::sleep(Duration::from_millis(150)).await;
        health.watch_ok("Pod");
        health.watch_failed("Role");
        let why = health
            .live()
            .expect_err("Role's watch failed past the limit");
        assert!(why.contains("Role") && !why.contains("Pod"), "{why}");
    }

    #[test]
    fn a_cache_is_blind_while_its_watch_fails_and_sees_from_its_resumption() {
        let health = Health::new(Duration::from_secs(60));
        assert_eq!(health.sight("Lease"), Sight::Unbroken);
        health.watch_ok("Lease");
        assert_eq!(health.sight("Lease"), Sight::Unbroken, "no failure, no gap");
        health.watch_failed("Lease");
        assert_eq!(health.sight("Lease"), Sight::Blind);
        assert_eq!(
            health.sight("Pod"),
            Sight::Unbroken,
            "one kind says nothing of another"
        );
        let before = Instant::now();
        health.watch_ok("Lease");
        assert!(matches!(health.sight("Lease"), Sight::Since(at) if at >= before));
    }

    #[tokio::test]
    async fn livez_recovers_when_failures_stop_without_an_event() {
        let (mut health, _) = fixture(Duration::from_millis(50));
        health.quiet_after_recovery = Duration::from_millis(200);
        health.watch_failed("Pod");
        tokio::time::sleep(Duration::from_millis(100)).await;
        health.watch_failed("Pod");
        assert!(health.live().is_err(), "failing past the limit");
        // A resumed watch yields nothing: quiet after the last error is recovery.
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(health.live().is_ok());
        // A later failure starts a new run, tolerated up to the limit again.
        health.watch_failed("Pod");
        assert!(health.live().is_ok());
    }

    #[tokio::test]
    async fn metrics_are_served_as_prometheus_text() {
        let (_, router) = fixture(Duration::from_secs(60));
        let (status, body) = get(&router, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("# TYPE cairn_leader gauge"), "{body}");
    }

    /// `--probe` against the real server: refused until the caches sync,
    /// the last answer in the error; passes once they do within its
    /// deadline.
    #[tokio::test(flavor = "multi_thread")]
    async fn probe_passes_only_when_ready() {
        let (health, router) = fixture(Duration::from_secs(60));
        let listener = listen("127.0.0.1:0".parse().expect("address"))
            .await
            .expect("bind");
        let url = format!("http://{}/readyz", listener.local_addr().expect("bound"));
        tokio::spawn(serve(listener, router, std::future::pending()));
        let probe_within = |url: String, deadline: Duration| {
            tokio::task::spawn_blocking(move || probe(&url, deadline))
        };
        let refused = probe_within(url.clone(), Duration::from_millis(1500))
            .await
            .expect("joined");
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.contains("503") && e.contains("caches not synced")),
            "{refused:?}"
        );
        // Ready two seconds into a probe of ten: it tries until then.
        let waiting = probe_within(url, Duration::from_secs(10));
        tokio::time::sleep(Duration::from_secs(2)).await;
        health.set_ready(true);
        assert_eq!(waiting.await.expect("joined"), Ok(()));
        assert!(probe("https://x/readyz", Duration::from_secs(1)).is_err());
        assert!(probe("http://127.0.0.1:1/readyz", Duration::from_secs(1)).is_err());
    }
}
