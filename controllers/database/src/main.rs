//! Entry point of cairn-database-controller.

use std::process::ExitCode;
use std::sync::Arc;

use cairn_api::database::v1::DatabaseCluster;
use cairn_database_controller::metrics::ClusterMetrics;
use cairn_database_controller::reconcile::{self, Caches, Context};
use cairn_database_controller::{MANAGER, build, webhook};
use cairn_runtime::config::Config;
use cairn_runtime::manager::{BuildInfo, Manager};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::ResourceExt;
use kube::runtime::controller::Controller;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

const INFO: BuildInfo = BuildInfo {
    controller: "database",
    version: env!("CARGO_PKG_VERSION"),
    git_commit: match option_env!("CAIRN_GIT_COMMIT") {
        Some(commit) => commit,
        None => "unknown",
    },
};

#[tokio::main]
async fn main() -> ExitCode {
    let mut manager = match Manager::start(INFO, Config::load()).await {
        Ok(manager) => manager,
        Err(e) => {
            eprintln!("cairn-database-controller: {e}");
            return ExitCode::FAILURE;
        }
    };
    let webhook = match manager
        .serve_webhook(webhook::router(manager.metrics.clone()), &[webhook::CRD])
        .await
    {
        Ok(server) => server,
        Err(e) => {
            tracing::error!(error = %e, "cannot serve the conversion webhook");
            return ExitCode::FAILURE;
        }
    };
    // Only what this controller made: never every Secret of the cluster.
    let children = watcher::Config::default().labels(&format!(
        "app.kubernetes.io/managed-by={},app.kubernetes.io/name={}",
        cairn_runtime::labels::MANAGED_BY,
        build::APP_NAME
    ));
    let clusters = manager.cache(manager.api::<DatabaseCluster>(), watcher::Config::default());
    let stateful_sets = manager.cache(manager.api::<StatefulSet>(), children.clone());
    let services = manager.cache(manager.api::<Service>(), children.clone());
    let config_maps = manager.cache(manager.api::<ConfigMap>(), children.clone());
    let secrets = manager.cache(manager.api::<Secret>(), children.clone());
    let service_accounts = manager.cache(manager.api::<ServiceAccount>(), children.clone());
    let roles = manager.cache(manager.api::<Role>(), children.clone());
    let role_bindings = manager.cache(manager.api::<RoleBinding>(), children.clone());
    let disruption_budgets = manager.cache(manager.api::<PodDisruptionBudget>(), children.clone());
    let pods = manager.cache(manager.api::<Pod>(), children.clone());
    let claims = manager.cache(manager.api::<PersistentVolumeClaim>(), children.clone());
    let leases = manager.cache(manager.api::<Lease>(), children);
    let metrics = match ClusterMetrics::register(&manager.metrics.registry) {
        Ok(metrics) => metrics,
        Err(e) => {
            tracing::error!(error = %e, "cannot register the cluster metrics");
            return ExitCode::FAILURE;
        }
    };

    let context = Arc::new(Context {
        client: manager.client.clone(),
        recorder: Recorder::new(manager.client.clone(), MANAGER.into()),
        caches: Caches {
            stateful_sets: stateful_sets.store(),
            services: services.store(),
            config_maps: config_maps.store(),
            secrets: secrets.store(),
            service_accounts: service_accounts.store(),
            roles: roles.store(),
            role_bindings: role_bindings.store(),
            disruption_budgets: disruption_budgets.store(),
            pods: pods.store(),
            claims: claims.store(),
            leases: leases.store(),
        },
        metrics: metrics.clone(),
        not_serving_since: Default::default(),
        decisions: Default::default(),
    });
    let cluster_store = clusters.store();
    let (store, housekeeping) = (cluster_store.clone(), context.clone());
    tokio::spawn(async move {
        let mut every = tokio::time::interval(std::time::Duration::from_secs(10));
        loop {
            every.tick().await;
            metrics.refresh(&store.state());
            housekeeping.forget_missing(&store);
        }
    });
    let controller =
        Controller::for_shared_stream(clusters.trigger_on_spec_change(), cluster_store)
            .owns_shared_stream(stateful_sets.trigger())
            .owns_shared_stream(services.trigger())
            .owns_shared_stream(config_maps.trigger())
            .owns_shared_stream(secrets.trigger())
            .owns_shared_stream(service_accounts.trigger())
            .owns_shared_stream(roles.trigger())
            .owns_shared_stream(role_bindings.trigger())
            .owns_shared_stream(disruption_budgets.trigger())
            // Every heartbeat: a reconcile that reads caches and writes nothing
            // unless a member's state changed.
            .owns_shared_stream(leases.trigger())
            // Pods belong to the StatefulSet; their cluster is in their labels.
            .watches_shared_stream(pods.trigger(), |pod| {
                let namespace = pod.namespace()?;
                let cluster = pod.labels().get("app.kubernetes.io/instance")?;
                Some(ObjectRef::<DatabaseCluster>::new(cluster).within(&namespace))
            });
    let code = manager.run(controller, reconcile::reconcile, context).await;
    if let Some(webhook) = webhook {
        webhook.shutdown();
    }
    code
}
