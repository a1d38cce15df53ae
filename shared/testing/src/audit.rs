//! Reading the API server's audit log, which records the metadata of every
//! write request (see the audit policy in `hack/local-cluster.sh`). Tests and
//! benchmarks count a controller's writes with it: a controller at steady state
//! must make none.

use std::path::Path;

use serde::Deserialize;

use crate::Error;

/// One write request, as the audit log records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteRequest {
    /// The user the request was authorized as: the impersonated user if the
    /// client impersonated one, otherwise the authenticated user.
    pub user: String,
    pub verb: String,
    pub resource: String,
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// HTTP status code of the response.
    pub code: Option<u16>,
    /// When the request was received (RFC 3339, microseconds).
    pub received: String,
}

/// Every write request recorded in `log` so far. The API server writes the
/// log in batches (at most a second late); poll with [`crate::wait::until`]
/// when a request has only just been made.
pub fn write_requests(log: &Path) -> Result<Vec<WriteRequest>, Error> {
    let text = std::fs::read_to_string(log)
        .map_err(|e| Error::Setup(format!("cannot read audit log {}: {e}", log.display())))?;
    Ok(parse(&text))
}

/// Parses JSON-lines audit events, skipping lines that are not (for example a
/// line the API server is still writing).
fn parse(text: &str) -> Vec<WriteRequest> {
    text.lines()
        .filter_map(|line| serde_json::from_str::<Event>(line).ok())
        .filter(|event| event.stage == "ResponseComplete")
        .map(|event| WriteRequest {
            user: event
                .impersonated_user
                .map_or(event.user.username, |u| u.username),
            verb: event.verb,
            resource: event.object_ref.resource.unwrap_or_default(),
            subresource: event.object_ref.subresource,
            namespace: event.object_ref.namespace,
            name: event.object_ref.name,
            code: event.response_status.and_then(|s| s.code),
            received: event.request_received_timestamp,
        })
        .collect()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    stage: String,
    verb: String,
    user: User,
    impersonated_user: Option<User>,
    #[serde(default)]
    object_ref: ObjectRef,
    response_status: Option<ResponseStatus>,
    #[serde(default)]
    request_received_timestamp: String,
}

#[derive(Deserialize)]
struct User {
    username: String,
}

#[derive(Deserialize, Default)]
struct ObjectRef {
    resource: Option<String>,
    subresource: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
}

#[derive(Deserialize)]
struct ResponseStatus {
    code: Option<u16>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_an_impersonated_request_to_the_impersonated_user() {
        let log = concat!(
            r#"{"kind":"Event","level":"Metadata","stage":"ResponseComplete","verb":"create","#,
            r#""user":{"username":"cairn-admin"},"impersonatedUser":{"username":"system:serviceaccount:a:b"},"#,
            r#""objectRef":{"resource":"configmaps","namespace":"a","name":"c"},"#,
            r#""responseStatus":{"code":201},"requestReceivedTimestamp":"2026-01-01T00:00:00.000000Z"}"#,
            "\n",
            r#"{"kind":"Event","stage":"ResponseComplete","verb":"patch","user":{"username":"cairn-admin"},"#,
            r#""objectRef":{"resource":"pods","subresource":"status"},"responseStatus":{"code":200}}"#,
            "\n{\"truncated\n"
        );
        let requests = parse(log);
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[0].user, "system:serviceaccount:a:b");
        assert_eq!(requests[0].code, Some(201));
        assert_eq!(requests[1].user, "cairn-admin");
        assert_eq!(requests[1].subresource.as_deref(), Some("status"));
    }
}
