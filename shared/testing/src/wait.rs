//! Waiting for the cluster to reach a state, with a failure message that says
//! what was expected and what was last seen.

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::Error;

/// How often conditions are polled.
const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// Polls `probe` until it returns `Ok(Some(value))`, and returns that value.
///
/// `probe` returns `Ok(None)` for "not yet", or `Err(observed)` to describe
/// the state it saw; the last description is part of the timeout error.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, String>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last_observed = String::from("nothing yet");
    loop {
        // A probe that hangs (an API call during an outage) must not stretch
        // the wait past its deadline.
        match tokio::time::timeout_at(deadline, probe()).await {
            Ok(Ok(Some(value))) => return Ok(value),
            Ok(Ok(None)) => {}
            Ok(Err(observed)) => last_observed = observed,
            Err(_elapsed) => last_observed = format!("{last_observed} (last probe still running)"),
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: what.to_owned(),
                timeout,
                last_observed,
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Waits until object `name` exists and `condition` holds for it, and returns
/// the object. On timeout the error shows the object's last status.
pub async fn for_object<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    timeout: Duration,
    condition: impl Fn(&K) -> bool,
) -> Result<K, Error>
where
    K: Resource + Clone + Debug + DeserializeOwned + Serialize,
    K::DynamicType: Default,
{
    let description = format!("{} {name} {what}", K::kind(&K::DynamicType::default()));
    until(&description, timeout, || async {
        match api.get_opt(name).await {
            Ok(Some(object)) if condition(&object) => Ok(Some(object)),
            Ok(Some(object)) => Err(describe(&object)),
            Ok(None) => Err("not found".to_owned()),
            Err(e) => Err(format!("error reading it: {e}")),
        }
    })
    .await
}

/// Waits until object `name` no longer exists.
pub async fn for_deletion<K>(api: &Api<K>, name: &str, timeout: Duration) -> Result<(), Error>
where
    K: Resource + Clone + Debug + DeserializeOwned + Serialize,
    K::DynamicType: Default,
{
    let description = format!(
        "{} {name} to be deleted",
        K::kind(&K::DynamicType::default())
    );
    until(&description, timeout, || async {
        match api.get_opt(name).await {
            Ok(None) => Ok(Some(())),
            Ok(Some(object)) => Err(describe(&object)),
            Err(e) => Err(format!("error reading it: {e}")),
        }
    })
    .await
}

/// Deletes every object of `api` and waits until none is left (their
/// finalizers done): a test's teardown while its controller still runs.
pub async fn for_all_deleted<K>(api: &Api<K>, timeout: Duration) -> Result<(), Error>
where
    K: Resource + Clone + Debug + DeserializeOwned + Serialize,
    K::DynamicType: Default,
{
    let everything = kube::api::ListParams::default();
    api.delete_collection(&kube::api::DeleteParams::default(), &everything)
        .await?;
    let description = format!(
        "every {} to be deleted",
        K::kind(&K::DynamicType::default())
    );
    until(&description, timeout, || async {
        match api.list(&everything).await {
            Ok(list) if list.items.is_empty() => Ok(Some(())),
            Ok(list) => Err(list
                .items
                .iter()
                .map(|o| {
                    format!(
                        "{}: {}",
                        o.meta().name.as_deref().unwrap_or_default(),
                        describe(o)
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")),
            Err(e) => Err(format!("error listing them: {e}")),
        }
    })
    .await
}

/// The `status` of an object (or the whole object if it has none), as JSON.
fn describe(object: &impl Serialize) -> String {
    let value = serde_json::to_value(object).unwrap_or_default();
    let shown = value.get("status").unwrap_or(&value);
    serde_json::to_string(shown).unwrap_or_default()
}

/// The `status` of condition `type_` in `status.conditions` of any object that
/// follows the Kubernetes conventions, e.g. `Some("True")`.
pub fn condition_status(object: &impl Serialize, type_: &str) -> Option<String> {
    let value = serde_json::to_value(object).ok()?;
    value
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(|t| t.as_str()) == Some(type_))?
        .get("status")?
        .as_str()
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_a_condition_by_type() {
        let object = json!({"status": {"conditions": [
            {"type": "Progressing", "status": "True"},
            {"type": "Ready", "status": "False"}
        ]}});
        assert_eq!(condition_status(&object, "Ready").as_deref(), Some("False"));
        assert_eq!(condition_status(&object, "Degraded"), None);
    }

    #[tokio::test]
    async fn a_timeout_reports_the_last_observation() {
        let mut polls = 0;
        let result: Result<(), Error> = until("the impossible", Duration::from_millis(300), || {
            polls += 1;
            let seen = format!("poll {polls}");
            async move { Err(seen) }
        })
        .await;
        let message = result.expect_err("must time out").to_string();
        assert!(message.contains("the impossible"), "{message}");
        assert!(message.contains("last observed: poll"), "{message}");
    }

    #[tokio::test]
    async fn a_hanging_probe_does_not_outlive_the_deadline() {
        let started = std::time::Instant::now();
        let result: Result<(), Error> = until("a hang", Duration::from_millis(200), || async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(None)
        })
        .await;
        assert!(matches!(result, Err(Error::Timeout { .. })));
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn returns_the_first_success() {
        let mut polls = 0;
        let value = until("three polls", Duration::from_secs(5), || {
            polls += 1;
            let ready = polls >= 3;
            async move { Ok(ready.then_some(polls)) }
        })
        .await
        .expect("must succeed");
        assert_eq!(value, 3);
    }
}
