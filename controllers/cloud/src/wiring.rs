//! The controller's caches and what wakes it.

use std::sync::Arc;
use std::time::Duration;

use cairn_api::cloud::v1alpha1::{ObjectBucket, ProviderConfig};
use cairn_runtime::manager::Manager;
use kube::runtime::controller::Controller;
use kube::runtime::watcher;

use crate::driver::Context;

/// How often an up-to-date resource is observed for drift, unless its
/// object says otherwise (`cloud.cairn.dev/poll-seconds`).
pub const POLL: Duration = Duration::from_secs(60);

/// ObjectBuckets, woken by a new generation, new annotations or deletion;
/// ProviderConfigs cached for the reconciles.
pub fn bucket_controller(manager: &mut Manager) -> (Controller<ObjectBucket>, Arc<Context>) {
    let buckets = manager.cache(manager.api::<ObjectBucket>(), watcher::Config::default());
    let configs = manager
        .cache(manager.api::<ProviderConfig>(), watcher::Config::default())
        .without_trigger();
    let store = buckets.store();
    let controller = Controller::for_shared_stream(buckets.trigger_on_spec_change(), store);
    let context = Arc::new(Context::new(manager.client.clone(), configs, POLL));
    (controller, context)
}
