//! An in-process fake of the Kubernetes API for fast reconcile tests of the
//! error paths a real server seldom takes on demand: a 409 on an apply, a
//! 500 or a lost connection in the middle of a multi-object reconcile, a
//! status write that conflicts. It records every request and keeps objects
//! by path: a write merges what it carries into the object at its path (a
//! status write into its parent's) and answers with the result, as a real
//! server answers an apply; a read answers the object or 404; unless a
//! [`Fault`] matches the request first. Not a substitute for the real API
//! server of the other suites: it validates nothing, merges only top-level
//! fields, and ignores selectors.
//!
//! Lists and watches: every change (a write, a [`FakeApi::put`], a
//! [`FakeApi::remove`]) gets the next resourceVersion and is kept in a
//! history. A GET of a collection lists its objects with the current
//! resourceVersion; with `watch=true` it streams, one JSON line per event,
//! the history after the given resourceVersion and every change after that,
//! until [`FakeApi::disconnect_watches`]. After [`FakeApi::compact`] a watch
//! from an older resourceVersion gets what a real server answers after an
//! etcd compaction: an `ERROR` event carrying a 410 `Expired` Status.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http_body_util::{BodyExt, Either, Full};
use hyper::body::{Body, Bytes, Frame};
use hyper::{Request, Response, StatusCode};
use kube::Client;
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

/// One request the fake received.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    /// The path, without the query.
    pub path: String,
    pub query: String,
    /// The body as JSON (`Null` if empty or not JSON).
    pub body: Value,
}

impl Recorded {
    /// A write: anything but GET.
    pub fn is_write(&self) -> bool {
        self.method != "GET"
    }

    /// A list of a collection (a GET without `watch`).
    pub fn is_list(&self) -> bool {
        verb(&self.method, &self.path, &self.query) == "LIST"
    }

    /// A watch of a collection.
    pub fn is_watch(&self) -> bool {
        verb(&self.method, &self.path, &self.query) == "WATCH"
    }

    /// The `resourceVersion` the request asked for, if any.
    pub fn resource_version(&self) -> Option<&str> {
        query_value(&self.query, "resourceVersion")
    }

    /// A write to a status subresource.
    pub fn is_status_write(&self) -> bool {
        self.is_write() && self.path.ends_with("/status")
    }
}

impl std::fmt::Display for Recorded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.method, self.path)
    }
}

/// What a matching request gets instead of the normal answer.
#[derive(Clone, Debug)]
pub enum Answer {
    /// A `Status` error with this code and reason (`Conflict`, ...).
    Status(u16, &'static str),
    /// No answer: the connection fails (a timeout or a reset, to the client).
    ConnectionLost,
    /// For a watch: 200, then one `ERROR` event carrying a Status with this
    /// code and reason, then the end of the stream (how a real server refuses
    /// a watch it cannot serve, e.g. `410, "Expired"` after a compaction).
    WatchError(u16, &'static str),
}

/// A fault: requests with `method` whose path contains `path` get `answer`,
/// `times` times (the first `skip` matching requests pass). `method` is an
/// HTTP method (`GET` matches reads, lists and watches alike) or `LIST` or
/// `WATCH` for a collection's lists or watches alone.
#[derive(Clone, Debug)]
pub struct Fault {
    pub method: &'static str,
    pub path: String,
    pub answer: Answer,
    pub skip: usize,
    pub times: usize,
}

#[derive(Default)]
struct State {
    requests: Vec<Recorded>,
    faults: Vec<Fault>,
    /// How often each of `faults` answered a request.
    fired: Vec<usize>,
    /// Faults removed before they ever answered a request.
    unfired: Vec<String>,
    /// Calls the test expects to come (method, path fragment).
    expected: Vec<(String, String)>,
    objects: std::collections::HashMap<String, Value>,
    /// The resourceVersion of the latest change.
    revision: u64,
    /// Every change: its resourceVersion, the event type, the object's path
    /// and the object (as it was last, for a deletion).
    history: Vec<(u64, &'static str, String, Value)>,
    /// A watch from before this resourceVersion is answered 410 Expired.
    compacted: u64,
    /// Open watches: the collection, and where its events go.
    watches: Vec<(String, UnboundedSender<Bytes>)>,
}

impl State {
    /// Stores `object` at `path` with the next resourceVersion (a name and a
    /// uid if it has none), tells the watches, and returns it as stored.
    fn store(&mut self, path: &str, object: Value) -> Value {
        let event = if self.objects.contains_key(path) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        self.revision += 1;
        let object = echo(object, path, self.revision);
        self.objects.insert(path.to_owned(), object.clone());
        self.changed(event, path, object.clone());
        object
    }

    /// Deletes the object at `path`, if there is one, and tells the watches.
    fn delete(&mut self, path: &str) {
        if let Some(object) = self.objects.remove(path) {
            self.revision += 1;
            let object = echo(object, path, self.revision);
            self.changed("DELETED", path, object);
        }
    }

    fn changed(&mut self, event: &'static str, path: &str, object: Value) {
        let line = watch_line(event, &object);
        self.watches.retain(|(collection, events)| {
            !in_collection(path, collection) || events.send(line.clone()).is_ok()
        });
        self.history
            .push((self.revision, event, path.to_owned(), object));
    }

    /// The objects of `collection`, as a list at the current resourceVersion.
    fn list(&self, collection: &str) -> Value {
        let mut paths: Vec<&String> = self
            .objects
            .keys()
            .filter(|path| in_collection(path, collection))
            .collect();
        paths.sort();
        let items: Vec<&Value> = paths.into_iter().map(|p| &self.objects[p]).collect();
        json!({
            "apiVersion": "v1", "kind": "List",
            "metadata": { "resourceVersion": self.revision.to_string() },
            "items": items,
        })
    }

    /// A watch of `collection` from `from` (a resourceVersion): the changes
    /// since, then every new one; 410 Expired if the history since is gone.
    fn watch(&mut self, collection: &str, from: Option<u64>) -> WatchBody {
        let (events, body) = unbounded_channel();
        if let Some(from) = from.filter(|from| *from > 0) {
            if from < self.compacted {
                let expired = format!("too old resource version: {from} ({})", self.compacted);
                let _ = events.send(error_line(410, "Expired", &expired));
                return WatchBody(body);
            }
            for (_, event, _, object) in self.history.iter().filter(|(revision, _, path, _)| {
                *revision > from && in_collection(path, collection)
            }) {
                let _ = events.send(watch_line(event, object));
            }
        }
        self.watches.push((collection.to_owned(), events));
        WatchBody(body)
    }
}

/// The body of a watch: its events as they come, until the fake drops the
/// sending end.
pub struct WatchBody(UnboundedReceiver<Bytes>);

impl Body for WatchBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|line| line.map(|line| Ok(Frame::data(line))))
    }
}

type Answered = Response<Either<Full<Bytes>, WatchBody>>;

/// The fake and the requests it saw.
///
/// When the test's last handle is dropped, the fake fails the test (panics)
/// if a fault it was given never answered a request, or a call the test
/// expected ([`FakeApi::expect_call`]) never came: a test whose fault never
/// fired tests nothing.
#[derive(Clone, Default)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
    /// Held for its `Drop`: the test's handles have one, the server's none.
    _verifier: Option<Arc<Verifier>>,
}

/// Checks, when the test is done with the fake, that every fault fired and
/// every expected call came.
struct Verifier(Arc<Mutex<State>>);

impl Drop for Verifier {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut problems: Vec<String> = state.unfired.clone();
        for (fault, fired) in state.faults.iter().zip(&state.fired) {
            if *fired == 0 {
                problems.push(describe(fault));
            }
        }
        for (method, path) in &state.expected {
            let verb_matches = |r: &Recorded| {
                r.method == *method || verb(&r.method, &r.path, &r.query) == method.as_str()
            };
            if !state
                .requests
                .iter()
                .any(|r| verb_matches(r) && r.path.contains(path.as_str()))
            {
                problems.push(format!("the expected call {method} {path} never came"));
            }
        }
        if !problems.is_empty() {
            panic!("the fake API server's checks failed: {problems:#?}");
        }
    }
}

fn describe(fault: &Fault) -> String {
    format!(
        "the fault {:?} for {} {} never fired",
        fault.answer, fault.method, fault.path
    )
}

impl FakeApi {
    /// A fake and a client of it (default namespace `default`).
    pub fn new() -> (Self, Client) {
        let state = Arc::new(Mutex::new(State::default()));
        let fake = Self {
            state: state.clone(),
            _verifier: Some(Arc::new(Verifier(state.clone()))),
        };
        // The server's own handle checks nothing: the test's last one does.
        let serving = Self {
            state,
            _verifier: None,
        };
        let service = tower::service_fn(move |request: Request<kube::client::Body>| {
            let fake = serving.clone();
            async move { fake.answer(request).await }
        });
        (fake, Client::new(service, "default"))
    }

    /// Stores `object` at `path` (e.g. the object a reconcile is given, so
    /// its status writes answer with the whole object), as a change: with
    /// the next resourceVersion, seen by the watches of its collection.
    pub fn put(&self, path: &str, object: Value) {
        self.lock().store(path, object);
    }

    /// Deletes the object at `path`, as a change the watches see.
    pub fn remove(&self, path: &str) {
        self.lock().delete(path);
    }

    /// Ends every open watch, as an API server restart does: a watcher
    /// watches again from the last resourceVersion it saw.
    pub fn disconnect_watches(&self) {
        self.lock().watches.clear();
    }

    /// Forgets the history up to now, as an etcd compaction does: a watch
    /// from an older resourceVersion is answered 410 Expired, and its
    /// watcher must list again to learn what it missed.
    pub fn compact(&self) {
        let mut state = self.lock();
        state.compacted = state.revision;
        let compacted = state.compacted;
        state.history.retain(|(revision, ..)| *revision > compacted);
    }

    /// Adds a fault. It must answer a request before the test ends.
    pub fn inject(&self, fault: Fault) {
        let mut state = self.lock();
        state.faults.push(fault);
        state.fired.push(0);
    }

    /// Removes every fault: the requests from now on are answered normally.
    /// A fault removed before it fired still fails the test.
    pub fn clear_faults(&self) {
        let mut state = self.lock();
        let unfired: Vec<String> = state
            .faults
            .iter()
            .zip(&state.fired)
            .filter(|(_, fired)| **fired == 0)
            .map(|(fault, _)| describe(fault))
            .collect();
        state.unfired.extend(unfired);
        state.faults.clear();
        state.fired.clear();
    }

    /// A call (`method` as for [`Fault`], a fragment of the path) that must
    /// come before the test ends.
    pub fn expect_call(&self, method: &str, path: &str) {
        self.lock()
            .expected
            .push((method.to_owned(), path.to_owned()));
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.lock().requests.clone()
    }

    /// Every write so far, in order.
    pub fn writes(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(Recorded::is_write)
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn answer(
        &self,
        request: Request<kube::client::Body>,
    ) -> Result<Answered, std::io::Error> {
        let method = request.method().to_string();
        let path = request.uri().path().to_owned();
        let query = request.uri().query().unwrap_or_default().to_owned();
        let bytes = request
            .into_body()
            .collect()
            .await
            .map_err(std::io::Error::other)?
            .to_bytes();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let verb = verb(&method, &path, &query);
        let mut state = self.lock();
        state.requests.push(Recorded {
            method: method.clone(),
            path: path.clone(),
            query: query.clone(),
            body: body.clone(),
        });
        let matching = state.faults.iter().position(|f| {
            (f.method == method || f.method == verb) && path.contains(&f.path) && f.times > 0
        });
        let fault = matching.and_then(|index| {
            let fault = &mut state.faults[index];
            if fault.skip > 0 {
                fault.skip -= 1;
                return None;
            }
            fault.times -= 1;
            let answer = fault.answer.clone();
            state.fired[index] += 1;
            Some(answer)
        });
        // A status write changes its parent; a create posts to the collection.
        let mut object_path = path.strip_suffix("/status").unwrap_or(&path).to_owned();
        if let ("POST", Some(name)) = (method.as_str(), body["metadata"]["name"].as_str()) {
            object_path = format!("{object_path}/{name}");
        }
        let whole = |response: Response<Full<Bytes>>| response.map(Either::Left);
        match (fault, verb) {
            (Some(Answer::ConnectionLost), _) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the fake API server dropped the connection",
            )),
            (Some(Answer::Status(code, reason)), _) => Ok(whole(status(code, reason, &path))),
            (Some(Answer::WatchError(code, reason)), _) => {
                let (events, body) = unbounded_channel();
                let message = format!("{reason} (injected by the fake API for {path})");
                let _ = events.send(error_line(code, reason, &message));
                Ok(streaming(WatchBody(body)))
            }
            (None, "WATCH") => {
                let from = query_value(&query, "resourceVersion").and_then(|v| v.parse().ok());
                Ok(streaming(state.watch(&path, from)))
            }
            (None, "LIST") => Ok(whole(json_response(200, &state.list(&path)))),
            (None, "GET") => Ok(whole(match state.objects.get(&object_path) {
                Some(object) => json_response(200, object),
                None => status(404, "NotFound", &path),
            })),
            (None, "DELETE") => {
                state.delete(&object_path);
                Ok(whole(json_response(
                    200,
                    &json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
                )))
            }
            (None, _) => {
                let mut object = state
                    .objects
                    .get(&object_path)
                    .cloned()
                    .unwrap_or(Value::Null);
                // A write naming the resourceVersion it read is refused
                // when the object has changed since, as a real server does.
                let read = body["metadata"]["resourceVersion"].as_str();
                let current = object["metadata"]["resourceVersion"].as_str();
                if let (Some(read), Some(current)) = (read, current)
                    && read != current
                {
                    return Ok(whole(status(409, "Conflict", &path)));
                }
                merge(&mut object, body);
                let object = state.store(&object_path, object);
                Ok(whole(json_response(
                    if method == "POST" { 201 } else { 200 },
                    &object,
                )))
            }
        }
    }
}

/// `LIST` or `WATCH` for a GET of a collection, else the method.
fn verb<'a>(method: &'a str, path: &str, query: &str) -> &'a str {
    if method != "GET" || !is_collection(path) {
        return method;
    }
    match query_value(query, "watch") {
        Some("true" | "1") => "WATCH",
        _ => "LIST",
    }
}

/// Whether `path` names a collection (`/api/v1/namespaces/shop/configmaps`,
/// `/apis/apps/v1/statefulsets`), not an object or a subresource.
fn is_collection(path: &str) -> bool {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match segments.first() {
        Some(&"api") => segments.get(2..),
        Some(&"apis") => segments.get(3..),
        _ => None,
    }
    .unwrap_or_default();
    let rest = match rest {
        ["namespaces", _, kind @ ..] if !kind.is_empty() => kind,
        rest => rest,
    };
    rest.len() == 1
}

/// Whether the object at `path` belongs to `collection`, in its namespace
/// or across all namespaces.
fn in_collection(path: &str, collection: &str) -> bool {
    let Some((parent, _)) = path.rsplit_once('/') else {
        return false;
    };
    let across_namespaces = parent.split_once("/namespaces/").and_then(|(api, rest)| {
        let (_, kind) = rest.split_once('/')?;
        Some(format!("{api}/{kind}"))
    });
    parent == collection || across_namespaces.as_deref() == Some(collection)
}

fn query_value<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))
}

fn watch_line(event: &str, object: &Value) -> Bytes {
    Bytes::from(format!("{}\n", json!({"type": event, "object": object})))
}

fn error_line(code: u16, reason: &str, message: &str) -> Bytes {
    let status = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
    });
    watch_line("ERROR", &status)
}

fn streaming(body: WatchBody) -> Answered {
    let mut response = Response::new(Either::Right(body));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

/// `patch`'s top-level fields replace `object`'s, but for `metadata`,
/// whose fields it sets one by one.
fn merge(object: &mut Value, patch: Value) {
    match (object, patch) {
        (Value::Object(fields), Value::Object(patch)) => {
            for (key, value) in patch {
                match (fields.get_mut(&key), value) {
                    (Some(Value::Object(metadata)), Value::Object(set)) if key == "metadata" => {
                        metadata.extend(set)
                    }
                    (_, value) => {
                        fields.insert(key, value);
                    }
                }
            }
        }
        (object, patch) => *object = patch,
    }
}

/// The object a write carried, as the server would return it: with its
/// resourceVersion, and a name for a create that named none.
fn echo(mut object: Value, path: &str, revision: u64) -> Value {
    if let Value::Object(fields) = &mut object {
        let metadata = fields.entry("metadata").or_insert_with(|| json!({}));
        if let Value::Object(metadata) = metadata {
            metadata.insert("resourceVersion".into(), json!(revision.to_string()));
            metadata
                .entry("uid")
                .or_insert_with(|| json!(format!("uid-{path}")));
            metadata
                .entry("name")
                .or_insert_with(|| json!(path.rsplit('/').next().unwrap_or("x")));
        }
    }
    object
}

fn status(code: u16, reason: &str, path: &str) -> Response<Full<Bytes>> {
    json_response(
        code,
        &json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("{reason} (injected by the fake API for {path})"),
            "reason": reason, "code": code,
        }),
    )
}

fn json_response(code: u16, body: &Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() =
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::Api;
    use kube::api::{Patch, PatchParams};

    /// A test whose fault never fired tests nothing: the fake fails it.
    #[tokio::test]
    #[should_panic(expected = "never fired")]
    async fn a_fault_that_never_fired_fails_the_test() {
        let (fake, client) = FakeApi::new();
        fake.inject(Fault {
            method: "PATCH",
            path: "/configmaps/never-asked".into(),
            answer: Answer::ConnectionLost,
            skip: 0,
            times: 1,
        });
        let maps = Api::<ConfigMap>::namespaced(client, "shop");
        let _ = maps.get_opt("a").await;
    }

    #[tokio::test]
    #[should_panic(expected = "never came")]
    async fn an_expected_call_that_never_came_fails_the_test() {
        let (fake, client) = FakeApi::new();
        fake.expect_call("DELETE", "/configmaps/a");
        let maps = Api::<ConfigMap>::namespaced(client, "shop");
        let _ = maps.get_opt("a").await;
    }

    #[tokio::test]
    async fn a_fault_that_fired_and_a_call_that_came_pass() {
        let (fake, client) = FakeApi::new();
        fake.inject(Fault {
            method: "GET",
            path: "/configmaps/a".into(),
            answer: Answer::Status(500, "InternalError"),
            skip: 0,
            times: 1,
        });
        fake.expect_call("GET", "/configmaps/a");
        let maps = Api::<ConfigMap>::namespaced(client, "shop");
        assert!(maps.get_opt("a").await.is_err());
    }

    #[tokio::test]
    async fn writes_are_echoed_and_faults_answer_in_their_place() {
        let (fake, client) = FakeApi::new();
        let maps = Api::<ConfigMap>::namespaced(client, "shop");
        let apply = PatchParams::apply("test");
        let map = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": "v"}});
        let applied = maps
            .patch("a", &apply, &Patch::Apply(&map))
            .await
            .expect("echoed");
        assert_eq!(
            applied
                .data
                .unwrap_or_default()
                .get("k")
                .map(String::as_str),
            Some("v")
        );

        fake.inject(Fault {
            method: "PATCH",
            path: "/configmaps/b".into(),
            answer: Answer::Status(409, "Conflict"),
            skip: 0,
            times: 1,
        });
        let refused = maps.patch("b", &apply, &Patch::Apply(&map)).await;
        assert!(
            matches!(&refused, Err(kube::Error::Api(status)) if status.code == 409),
            "{refused:?}"
        );
        assert!(
            maps.patch("b", &apply, &Patch::Apply(&map)).await.is_ok(),
            "once only"
        );
        assert!(matches!(maps.get("c").await, Err(kube::Error::Api(s)) if s.code == 404));

        fake.inject(Fault {
            method: "PATCH",
            path: "/configmaps/d".into(),
            answer: Answer::ConnectionLost,
            skip: 0,
            times: 1,
        });
        assert!(maps.patch("d", &apply, &Patch::Apply(&map)).await.is_err());
        assert_eq!(fake.writes().len(), 4);
    }

    /// The raw answer to a GET of `uri`: its status and its lines, read
    /// until the stream ends or `lines` have come.
    async fn get_lines(client: &Client, uri: &str, lines: usize) -> (u16, Vec<Value>) {
        let request = Request::get(uri).body(Vec::new()).expect("a request");
        let response = client
            .send(request.map(Into::into))
            .await
            .expect("answered");
        let code = response.status().as_u16();
        let mut body = response.into_body();
        let mut text = String::new();
        while text.lines().count() < lines {
            match body.frame().await {
                Some(frame) => {
                    let data = frame.expect("a frame").into_data().unwrap_or_default();
                    text.push_str(&String::from_utf8_lossy(&data));
                }
                None => break,
            }
        }
        let values = text
            .lines()
            .map(|line| serde_json::from_str(line).expect("JSON lines"))
            .collect();
        (code, values)
    }

    fn config_map(namespace: &str, name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": namespace}})
    }

    const SHOP: &str = "/api/v1/namespaces/shop/configmaps";

    #[tokio::test]
    async fn a_list_has_the_collections_objects_and_its_resource_version() {
        let (fake, client) = FakeApi::new();
        fake.put(&format!("{SHOP}/a"), config_map("shop", "a"));
        fake.put(&format!("{SHOP}/b"), config_map("shop", "b"));
        fake.put(
            "/api/v1/namespaces/other/configmaps/c",
            config_map("other", "c"),
        );
        let listed = Api::<ConfigMap>::namespaced(client.clone(), "shop")
            .list(&Default::default())
            .await
            .expect("listed");
        let names: Vec<_> = listed
            .items
            .iter()
            .filter_map(|m| m.metadata.name.clone())
            .collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(listed.metadata.resource_version.as_deref(), Some("3"));
        let everywhere = Api::<ConfigMap>::all(client)
            .list(&Default::default())
            .await;
        assert_eq!(everywhere.expect("listed").items.len(), 3);
        assert!(fake.requests().iter().all(Recorded::is_list));
    }

    #[tokio::test]
    async fn a_watch_streams_the_changes_since_its_version_until_disconnected() {
        let (fake, client) = FakeApi::new();
        fake.put(&format!("{SHOP}/a"), config_map("shop", "a")); // 1
        fake.put(&format!("{SHOP}/b"), config_map("shop", "b")); // 2
        fake.put(
            "/api/v1/namespaces/other/configmaps/c",
            config_map("other", "c"),
        ); // 3
        let watching = tokio::spawn({
            let client = client.clone();
            async move { get_lines(&client, &format!("{SHOP}?watch=true&resourceVersion=1"), 3).await }
        });
        // The watch is open once it was asked for.
        while !fake.requests().iter().any(Recorded::is_watch) {
            tokio::task::yield_now().await;
        }
        fake.remove(&format!("{SHOP}/a")); // 4
        fake.put(&format!("{SHOP}/a"), config_map("shop", "a")); // 5
        let (code, events) = watching.await.expect("watched");
        assert_eq!(code, 200);
        let seen: Vec<(String, String)> = events
            .iter()
            .map(|e| {
                let version = &e["object"]["metadata"]["resourceVersion"];
                (
                    e["type"].as_str().unwrap_or("?").to_owned(),
                    version.as_str().unwrap_or("?").to_owned(),
                )
            })
            .collect();
        let seen: Vec<(&str, &str)> = seen.iter().map(|(t, v)| (t.as_str(), v.as_str())).collect();
        assert_eq!(seen, [("ADDED", "2"), ("DELETED", "4"), ("ADDED", "5")]);

        let watching = tokio::spawn({
            let client = client.clone();
            async move { get_lines(&client, &format!("{SHOP}?watch=true&resourceVersion=5"), 1).await }
        });
        while fake.requests().iter().filter(|r| r.is_watch()).count() < 2 {
            tokio::task::yield_now().await;
        }
        fake.disconnect_watches();
        assert_eq!(
            watching.await.expect("ended"),
            (200, Vec::new()),
            "ended, nothing new"
        );
    }

    #[tokio::test]
    async fn a_watch_from_before_a_compaction_is_answered_410_expired() {
        let (fake, client) = FakeApi::new();
        fake.put(&format!("{SHOP}/a"), config_map("shop", "a"));
        fake.put(&format!("{SHOP}/b"), config_map("shop", "b"));
        fake.compact();
        let (code, events) =
            get_lines(&client, &format!("{SHOP}?watch=true&resourceVersion=1"), 2).await;
        assert_eq!(code, 200);
        assert_eq!(events.len(), 1, "the error, then the end: {events:?}");
        assert_eq!(events[0]["type"], "ERROR");
        assert_eq!(events[0]["object"]["code"], 410);
        assert_eq!(events[0]["object"]["reason"], "Expired");
        // From the compacted version on, a watch is served.
        fake.put(&format!("{SHOP}/c"), config_map("shop", "c"));
        let (_, events) =
            get_lines(&client, &format!("{SHOP}?watch=true&resourceVersion=2"), 1).await;
        assert_eq!(events[0]["type"], "ADDED", "{events:?}");
    }

    #[tokio::test]
    async fn watch_faults_answer_watches_only() {
        let (fake, client) = FakeApi::new();
        fake.put(&format!("{SHOP}/a"), config_map("shop", "a"));
        for answer in [
            Answer::Status(410, "Gone"),
            Answer::WatchError(410, "Expired"),
        ] {
            fake.inject(Fault {
                method: "WATCH",
                path: SHOP.into(),
                answer,
                skip: 0,
                times: 1,
            });
        }
        let (code, _) = get_lines(&client, SHOP, 1).await;
        assert_eq!(code, 200, "a list passes");
        let (code, _) =
            get_lines(&client, &format!("{SHOP}?watch=true&resourceVersion=1"), 1).await;
        assert_eq!(code, 410, "HTTP 410");
        let (code, events) =
            get_lines(&client, &format!("{SHOP}?watch=true&resourceVersion=1"), 2).await;
        assert_eq!((code, events.len()), (200, 1), "{events:?}");
        assert_eq!(events[0]["object"]["code"], 410);
    }
}
