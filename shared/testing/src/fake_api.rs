//! An in-process fake of the Kubernetes API for fast reconcile tests of the
//! error paths a real server seldom takes on demand: a 409 on an apply, a
//! 500 or a lost connection in the middle of a multi-object reconcile, a
//! status write that conflicts. It records every request and keeps objects
//! by path: a write merges what it carries into the object at its path (a
//! status write into its parent's) and answers with the result, as a real
//! server answers an apply; a read answers the object or 404; unless a
//! [`Fault`] matches the request first. Not a substitute for the real API
//! server of the other suites: it validates nothing, merges only top-level
//! fields, and lists and watches nothing.

use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use kube::Client;
use serde_json::{Value, json};

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
}

/// A fault: requests with `method` whose path contains `path` get `answer`,
/// `times` times (the first `skip` matching requests pass).
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
    objects: std::collections::HashMap<String, Value>,
}

/// The fake and the requests it saw.
#[derive(Clone, Default)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
}

impl FakeApi {
    /// A fake and a client of it (default namespace `default`).
    pub fn new() -> (Self, Client) {
        let fake = Self::default();
        let serving = fake.clone();
        let service = tower::service_fn(move |request: Request<kube::client::Body>| {
            let fake = serving.clone();
            async move { fake.answer(request).await }
        });
        (fake, Client::new(service, "default"))
    }

    /// Stores `object` at `path` (e.g. the object a reconcile is given, so
    /// its status writes answer with the whole object).
    pub fn put(&self, path: &str, object: Value) {
        self.lock().objects.insert(path.to_owned(), object);
    }

    /// Adds a fault.
    pub fn inject(&self, fault: Fault) {
        self.lock().faults.push(fault);
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
    ) -> Result<Response<Full<Bytes>>, std::io::Error> {
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
        let mut state = self.lock();
        state.requests.push(Recorded {
            method: method.clone(),
            path: path.clone(),
            query,
            body: body.clone(),
        });
        let fault = state
            .faults
            .iter_mut()
            .find(|f| f.method == method && path.contains(&f.path) && f.times > 0)
            .and_then(|fault| {
                if fault.skip > 0 {
                    fault.skip -= 1;
                    return None;
                }
                fault.times -= 1;
                Some(fault.answer.clone())
            });
        // A status write changes its parent; a create posts to the collection.
        let mut object_path = path.strip_suffix("/status").unwrap_or(&path).to_owned();
        if let ("POST", Some(name)) = (method.as_str(), body["metadata"]["name"].as_str()) {
            object_path = format!("{object_path}/{name}");
        }
        match fault {
            Some(Answer::ConnectionLost) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the fake API server dropped the connection",
            )),
            Some(Answer::Status(code, reason)) => Ok(status(code, reason, &path)),
            None if method == "GET" => Ok(match state.objects.get(&object_path) {
                Some(object) => json_response(200, object),
                None => status(404, "NotFound", &path),
            }),
            None if method == "DELETE" => {
                state.objects.remove(&object_path);
                Ok(json_response(
                    200,
                    &json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
                ))
            }
            None => {
                let mut object = state
                    .objects
                    .get(&object_path)
                    .cloned()
                    .unwrap_or(Value::Null);
                merge(&mut object, body);
                let object = echo(object, &object_path);
                state.objects.insert(object_path, object.clone());
                Ok(json_response(
                    if method == "POST" { 201 } else { 200 },
                    &object,
                ))
            }
        }
    }
}

/// `patch`'s top-level fields replace `object`'s.
fn merge(object: &mut Value, patch: Value) {
    match (object, patch) {
        (Value::Object(fields), Value::Object(patch)) => fields.extend(patch),
        (object, patch) => *object = patch,
    }
}

/// The object a write carried, as the server would return it: with a
/// resourceVersion, and a name for a create that named none.
fn echo(mut object: Value, path: &str) -> Value {
    if let Value::Object(fields) = &mut object {
        let metadata = fields.entry("metadata").or_insert_with(|| json!({}));
        if let Value::Object(metadata) = metadata {
            metadata.insert("resourceVersion".into(), json!("1"));
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
}
