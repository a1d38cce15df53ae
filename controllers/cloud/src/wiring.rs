//! The controller's caches and what wakes it.

use std::sync::Arc;
use std::time::Duration;

use cairn_api::cloud::v1alpha1::{
    DnsRecord, EXTERNAL_NAME_ANNOTATION, ObjectBucket, ProviderConfig,
};
use cairn_runtime::manager::{Manager, Runnable};
use futures::StreamExt;
use kube::ResourceExt;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::driver::{self, Context, Managed};
use crate::metrics::{self, CloudMetrics};
use crate::policy::CREATE_PENDING_ANNOTATION;
use crate::provider_config::{self, Users};

/// How often an up-to-date resource is observed for drift, unless its
/// object says otherwise (`cloud.cairn.dev/poll-seconds`).
pub const POLL: Duration = Duration::from_secs(60);

/// The annotations the driver writes itself: setting or lifting them must
/// not wake it (a refused create would otherwise retry at once, for ever).
const OWN_ANNOTATIONS: &[&str] = &[CREATE_PENDING_ANNOTATION, EXTERNAL_NAME_ANNOTATION];

/// ObjectBuckets, DnsRecords and ProviderConfigs, each woken by a new
/// generation, new annotations or deletion. A ProviderConfig's users are
/// read from the other two caches, and a user created, deleted or moved
/// wakes its ProviderConfig.
pub fn controllers(manager: &mut Manager) -> Result<Vec<Runnable>, prometheus::Error> {
    let metrics = CloudMetrics::register(&manager.metrics.registry)?;
    let buckets = manager
        .cache(manager.api::<ObjectBucket>(), watcher::Config::default())
        .ignoring_annotations(OWN_ANNOTATIONS);
    let records = manager
        .cache(manager.api::<DnsRecord>(), watcher::Config::default())
        .ignoring_annotations(OWN_ANNOTATIONS);
    let configs = manager.cache(manager.api::<ProviderConfig>(), watcher::Config::default());
    let (bucket_store, record_store, config_store) =
        (buckets.store(), records.store(), configs.store());
    let context = Arc::new(Context::new(
        manager.client.clone(),
        config_store.clone(),
        POLL,
        metrics.clone(),
    ));
    let count_buckets = metrics::count_by_ready(metrics.resources.clone(), bucket_store.clone());
    let count_records = metrics::count_by_ready(metrics.resources.clone(), record_store.clone());
    manager.every(metrics::COUNT_INTERVAL, count_buckets);
    manager.every(metrics::COUNT_INTERVAL, count_records);
    let users = Users::new(bucket_store.clone(), record_store.clone());
    let (bucket_changes, bucket_users) = buckets.trigger_on_spec_change_for_two();
    let (record_changes, record_users) = records.trigger_on_spec_change_for_two();
    let users_changed = futures::stream::select(
        bucket_users.map(|b| config_of(&*b)),
        record_users.map(|r| config_of(&*r)),
    );
    Ok(vec![
        manager.runnable(
            Controller::for_shared_stream(bucket_changes, bucket_store),
            driver::reconcile::<ObjectBucket>,
            context.clone(),
        ),
        manager.runnable(
            Controller::for_shared_stream(record_changes, record_store),
            driver::reconcile::<DnsRecord>,
            context.clone(),
        ),
        manager.runnable(
            Controller::for_shared_stream(configs.trigger_on_spec_change(), config_store)
                .reconcile_on(users_changed),
            provider_config::reconcile,
            Arc::new((context, users)),
        ),
    ])
}

/// The ProviderConfig an object uses.
fn config_of(object: &impl Managed) -> ObjectRef<ProviderConfig> {
    ObjectRef::new(object.provider_config()).within(&object.namespace().unwrap_or_default())
}
