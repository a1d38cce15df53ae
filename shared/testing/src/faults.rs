//! A fault-injecting HTTP proxy in front of moto, which injects none itself:
//! the AWS faults a controller must survive, on demand — throttling answers,
//! 5xx, an unreachable provider, and a response lost after moto acted on the
//! request. It records every request it receives, so a test measures the
//! call rate and counts the calls where the provider would see them.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::Error;

/// What the proxy does to the requests a [`Rule`] matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Answers 503 `SlowDown` (S3) / 400 `Throttling` (others) without
    /// forwarding.
    Throttle,
    /// Answers 500 `InternalError` without forwarding.
    ServerError,
    /// Answers 409 `BucketAlreadyExists` without forwarding: the name is
    /// another account's.
    Conflict,
    /// Closes the connection without forwarding: the provider is unreachable.
    Unreachable,
    /// Forwards the request, waits for the provider's answer, then closes
    /// the connection without passing it on: the provider acted, the caller
    /// does not know.
    DropResponse,
    /// Forwards the request after waiting this long: a slow provider.
    Slow(Duration),
}

/// A fault for the requests `matches` accepts, `times` of them (or all).
#[derive(Clone)]
pub struct Rule {
    pub fault: Fault,
    pub times: Option<usize>,
    pub matches: Arc<dyn Fn(&Seen) -> bool + Send + Sync>,
}

impl Rule {
    /// `fault` for every request.
    pub fn always(fault: Fault) -> Self {
        Self {
            fault,
            times: None,
            matches: Arc::new(|_| true),
        }
    }

    /// `fault` for every request `matches` accepts.
    pub fn every(fault: Fault, matches: impl Fn(&Seen) -> bool + Send + Sync + 'static) -> Self {
        Self {
            fault,
            times: None,
            matches: Arc::new(matches),
        }
    }

    /// `fault` for the first `times` requests `matches` accepts.
    pub fn first(
        fault: Fault,
        times: usize,
        matches: impl Fn(&Seen) -> bool + Send + Sync + 'static,
    ) -> Self {
        Self {
            fault,
            times: Some(times),
            matches: Arc::new(matches),
        }
    }
}

/// A request the proxy received.
#[derive(Clone, Debug)]
pub struct Seen {
    pub at: Instant,
    pub method: String,
    /// Path and query.
    pub target: String,
    /// The AWS service it was signed for (`s3`, `sts`, `route53`).
    pub service: String,
    /// The fault injected, if any.
    pub fault: Option<Fault>,
}

#[derive(Default)]
struct State {
    rules: Vec<Rule>,
    seen: Vec<Seen>,
}

/// The running proxy; stops when dropped.
pub struct FaultProxy {
    address: SocketAddr,
    state: Arc<Mutex<State>>,
    server: JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FaultProxy {
    /// A proxy on a free loopback port forwarding to `upstream` (e.g.
    /// `http://198.18.0.1:4566`).
    pub async fn start(upstream: &str) -> Result<Self, Error> {
        Self::start_on(std::net::Ipv4Addr::LOCALHOST.into(), upstream).await
    }

    /// A proxy on a free port of `ip`: the address moto listens on lets pods
    /// on the real nodes reach it too.
    pub async fn start_on(ip: std::net::IpAddr, upstream: &str) -> Result<Self, Error> {
        let listener = TcpListener::bind((ip, 0))
            .await
            .map_err(|e| Error::Setup(format!("fault proxy: {e}")))?;
        let address = listener
            .local_addr()
            .map_err(|e| Error::Setup(format!("fault proxy: {e}")))?;
        let upstream: hyper::Uri = upstream
            .parse()
            .map_err(|e| Error::Setup(format!("fault proxy upstream {upstream}: {e}")))?;
        let state = Arc::new(Mutex::new(State::default()));
        let client: Client<HttpConnector, Full<Bytes>> =
            Client::builder(TokioExecutor::new()).build_http();
        let shared = state.clone();
        let server = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (state, client, upstream) = (shared.clone(), client.clone(), upstream.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |request| {
                        handle(request, state.clone(), client.clone(), upstream.clone())
                    });
                    // A connection closed on purpose ends with an error here.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self {
            address,
            state,
            server,
        })
    }

    /// The URL to give the controller instead of moto's.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Injects `rule` from now on, after the rules already set.
    pub fn inject(&self, rule: Rule) {
        self.lock().rules.push(rule);
    }

    /// Removes every rule: requests pass again.
    pub fn heal(&self) {
        self.lock().rules.clear();
    }

    /// Every request received so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.lock().seen.clone()
    }

    /// Watches the requests from now on for `window`: the first one
    /// `unwanted` accepts, as soon as it arrives (`None` when none came).
    /// The proof that the caller stayed silent, ended early when it did not.
    pub async fn unwanted_within(
        &self,
        window: Duration,
        unwanted: impl Fn(&Seen) -> bool,
    ) -> Option<Seen> {
        let start = Instant::now();
        loop {
            let found = self
                .lock()
                .seen
                .iter()
                .find(|s| s.at >= start && unwanted(s))
                .cloned();
            if found.is_some() || start.elapsed() >= window {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The most requests received within any `window` (every attempt of
    /// the caller, answered by the provider or by an injected fault), among
    /// those received since `since`.
    pub fn peak_rate(&self, since: Instant, window: Duration) -> usize {
        let times: Vec<Instant> = self
            .seen()
            .into_iter()
            .filter(|s| s.at >= since)
            .map(|s| s.at)
            .collect();
        times
            .iter()
            .enumerate()
            .map(|(i, start)| {
                times[i..]
                    .iter()
                    .take_while(|t| **t < *start + window)
                    .count()
            })
            .max()
            .unwrap_or(0)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

type Answer = Result<Response<Full<Bytes>>, Box<dyn std::error::Error + Send + Sync>>;

async fn handle(
    request: Request<Incoming>,
    state: Arc<Mutex<State>>,
    client: Client<HttpConnector, Full<Bytes>>,
    upstream: hyper::Uri,
) -> Answer {
    let mut seen = Seen {
        at: Instant::now(),
        method: request.method().to_string(),
        target: request
            .uri()
            .path_and_query()
            .map(ToString::to_string)
            .unwrap_or_default(),
        service: signed_service(&request),
        fault: None,
    };
    seen.fault = {
        let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
        let fault = state.rules.iter_mut().find_map(|rule| {
            let applies = rule.times != Some(0) && (rule.matches)(&seen);
            if applies && let Some(times) = rule.times.as_mut() {
                *times -= 1;
            }
            applies.then_some(rule.fault)
        });
        state.seen.push(Seen {
            fault,
            ..seen.clone()
        });
        fault
    };
    match seen.fault {
        Some(Fault::Throttle) => Ok(error_answer(&seen.service, Fault::Throttle)),
        Some(Fault::ServerError) => Ok(error_answer(&seen.service, Fault::ServerError)),
        Some(Fault::Conflict) => Ok(error_answer(&seen.service, Fault::Conflict)),
        Some(Fault::Unreachable) => Err("injected: unreachable".into()),
        Some(Fault::DropResponse) => {
            forward(request, &client, &upstream).await?;
            Err("injected: response dropped".into())
        }
        Some(Fault::Slow(delay)) => {
            tokio::time::sleep(delay).await;
            forward(request, &client, &upstream).await
        }
        None => forward(request, &client, &upstream).await,
    }
}

/// The service in the SigV4 credential scope of the Authorization header.
fn signed_service(request: &Request<Incoming>) -> String {
    request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split("Credential=").nth(1))
        .and_then(|credential| credential.split('/').nth(3))
        .unwrap_or("unknown")
        .to_owned()
}

async fn forward(
    request: Request<Incoming>,
    client: &Client<HttpConnector, Full<Bytes>>,
    upstream: &hyper::Uri,
) -> Answer {
    let (mut parts, body) = request.into_parts();
    let body = body.collect().await?.to_bytes();
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = format!("{upstream}{}", target.trim_start_matches('/')).parse()?;
    let response = client
        .request(Request::from_parts(parts, Full::new(body)))
        .await?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await?.to_bytes();
    Ok(Response::from_parts(parts, Full::new(body)))
}

/// An error answer for `fault` in the service's error format.
fn error_answer(service: &str, fault: Fault) -> Response<Full<Bytes>> {
    let (status, code) = match (service, fault) {
        ("s3", Fault::Throttle) => (StatusCode::SERVICE_UNAVAILABLE, "SlowDown"),
        (_, Fault::Throttle) => (StatusCode::BAD_REQUEST, "Throttling"),
        (_, Fault::Conflict) => (StatusCode::CONFLICT, "BucketAlreadyExists"),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "InternalError"),
    };
    let message = "injected by the test's fault proxy";
    let body = if service == "s3" {
        format!("<Error><Code>{code}</Code><Message>{message}</Message></Error>")
    } else {
        format!(
            "<ErrorResponse><Error><Type>Sender</Type><Code>{code}</Code><Message>{message}</Message></Error></ErrorResponse>"
        )
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/xml"),
    );
    response
}
