//! The managed reconciler against an in-process fake API
//! ([`cairn_testing::fake_api`]), for the Kubernetes side of its error
//! paths (the provider's are in tests/faults.rs, against moto behind a
//! fault proxy): a ProviderConfig that does not exist, its Secret unreadable,
//! a status write that conflicts. Each checks the retry class and that the
//! status never says more than was done.

use std::sync::Arc;

use cairn_api::cloud::v1alpha1::ObjectBucket;
use cairn_testing::fake_api::{Answer, FakeApi, Fault, Recorded};
use kube::runtime::reflector::store;
use kube::runtime::watcher;

use super::*;

const BUCKET_PATH: &str = "/apis/cloud.cairn.dev/v1alpha1/namespaces/shop/objectbuckets/backups";

fn bucket() -> ObjectBucket {
    serde_json::from_value(json!({
        "apiVersion": "cloud.cairn.dev/v1alpha1", "kind": "ObjectBucket",
        "metadata": { "name": "backups", "namespace": "shop", "uid": "b-1", "generation": 1 },
        "spec": { "providerConfigRef": { "name": "aws" }, "deletionPolicy": "Orphan" },
    }))
    .expect("bucket")
}

fn provider_config() -> ProviderConfig {
    serde_json::from_value(json!({
        "apiVersion": "cloud.cairn.dev/v1alpha1", "kind": "ProviderConfig",
        "metadata": { "name": "aws", "namespace": "shop", "generation": 1 },
        "spec": { "type": "aws", "region": "eu-west-1",
                  "credentialsSecretRef": { "name": "aws-credentials" } },
    }))
    .expect("provider config")
}

/// A context over the fake; `configs` in its ProviderConfig cache.
fn harness(configs: &[ProviderConfig]) -> (FakeApi, Arc<Context>) {
    let (fake, client) = FakeApi::new();
    fake.put(
        BUCKET_PATH,
        serde_json::to_value(bucket()).expect("serializes"),
    );
    let (provider_configs, mut writer) = store();
    for config in configs {
        writer.apply_watcher_event(&watcher::Event::Apply(config.clone()));
    }
    let metrics = CloudMetrics::register(&prometheus::Registry::new()).expect("metrics");
    let context = Context::new(client, provider_configs, Duration::from_secs(60), metrics);
    (fake, Arc::new(context))
}

fn synced(write: &Recorded) -> serde_json::Value {
    write.body["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Synced"))
        .cloned()
        .unwrap_or_default()
}

#[tokio::test]
async fn a_missing_provider_config_is_reported_and_waited_for() {
    let (fake, context) = harness(&[]);
    let error = reconcile(Arc::new(bucket()), context.clone())
        .await
        .expect_err("nothing to reconcile with");
    assert_eq!(error.class(), ErrorClass::DependencyNotReady, "{error:?}");
    let writes = fake.writes();
    assert_eq!(writes.len(), 2, "the status and its Event: {writes:#?}");
    assert!(writes[0].is_status_write());
    let condition = synced(&writes[0]);
    assert_eq!(condition["status"], "False");
    assert_eq!(condition["reason"], "ProviderConfigUnusable");
    assert!(
        condition["message"]
            .as_str()
            .is_some_and(|m| m.contains("ProviderConfig aws")),
        "{condition}"
    );
    // The transition is announced, as a Warning on the bucket.
    let event = &writes[1];
    assert!(event.path.contains("/events"), "{event:?}");
    assert_eq!(event.body["type"], "Warning");
    assert_eq!(event.body["reason"], "ProviderConfigUnusable");
    assert_eq!(event.body["regarding"]["name"], bucket().name_any());

    // Reconciled again from the bucket as written: nothing new to say.
    let written = Api::<ObjectBucket>::namespaced(context.client.clone(), "shop")
        .get("backups")
        .await
        .expect("the bucket");
    let _ = reconcile(Arc::new(written), context).await;
    assert_eq!(fake.writes().len(), 2, "no status and no Event again");
}

/// The credentials Secret cannot be read (a 500): retried, and nothing is
/// written: no status, no finalizer, no call to the provider.
#[tokio::test]
async fn an_unreadable_credentials_secret_is_transient_and_writes_nothing() {
    let (fake, context) = harness(&[provider_config()]);
    fake.inject(Fault {
        method: "GET",
        path: "/secrets/aws-credentials".into(),
        answer: Answer::Status(500, "InternalError"),
        skip: 0,
        times: 1,
    });
    let error = reconcile(Arc::new(bucket()), context)
        .await
        .expect_err("the read failed");
    assert_eq!(error.class(), ErrorClass::Transient, "{error:?}");
    assert!(fake.writes().is_empty(), "{:#?}", fake.writes());
}

/// The status saying why it waits is refused (409): the reconcile fails as
/// transient rather than being taken as reported.
#[tokio::test]
async fn a_conflicting_status_write_is_transient() {
    let (fake, context) = harness(&[]);
    fake.inject(Fault {
        method: "PATCH",
        path: "/objectbuckets/backups/status".into(),
        answer: Answer::Status(409, "Conflict"),
        skip: 0,
        times: 1,
    });
    let error = reconcile(Arc::new(bucket()), context)
        .await
        .expect_err("the write failed");
    assert_eq!(error.class(), ErrorClass::Transient, "{error:?}");
}
