//! The controller's caches and what wakes it.

use std::sync::Arc;
use std::time::Duration;

use cairn_api::cloud::v1alpha1::{ObjectBucket, ProviderConfig};
use cairn_runtime::manager::{Manager, Runnable};
use futures::StreamExt;
use kube::ResourceExt;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::driver::{self, Context};
use crate::metrics::CloudMetrics;
use crate::provider_config::{self, Users};

/// How often an up-to-date resource is observed for drift, unless its
/// object says otherwise (`cloud.cairn.dev/poll-seconds`).
pub const POLL: Duration = Duration::from_secs(60);

/// ObjectBuckets and ProviderConfigs, each woken by a new generation, new
/// annotations or deletion. A ProviderConfig's users are read from the
/// ObjectBucket cache.
pub fn controllers(manager: &mut Manager) -> Result<Vec<Runnable>, prometheus::Error> {
    let metrics = CloudMetrics::register(&manager.metrics.registry)?;
    let buckets = manager.cache(manager.api::<ObjectBucket>(), watcher::Config::default());
    let configs = manager.cache(manager.api::<ProviderConfig>(), watcher::Config::default());
    let (bucket_store, config_store) = (buckets.store(), configs.store());
    let context = Arc::new(Context::new(
        manager.client.clone(),
        config_store.clone(),
        POLL,
        metrics,
    ));
    let users = Users::new(bucket_store.clone());
    // A bucket created, deleted or moved also wakes its ProviderConfig (its
    // users changed).
    let (bucket_changes, users_changes) = buckets.trigger_on_spec_change_for_two();
    let config_of = |bucket: Arc<ObjectBucket>| {
        ObjectRef::<ProviderConfig>::new(&bucket.spec.provider_config_ref.name)
            .within(&bucket.namespace().unwrap_or_default())
    };
    Ok(vec![
        manager.runnable(
            Controller::for_shared_stream(bucket_changes, bucket_store),
            driver::reconcile::<ObjectBucket>,
            context.clone(),
        ),
        manager.runnable(
            Controller::for_shared_stream(configs.trigger_on_spec_change(), config_store)
                .reconcile_on(users_changes.map(config_of)),
            provider_config::reconcile,
            Arc::new((context, users)),
        ),
    ])
}
