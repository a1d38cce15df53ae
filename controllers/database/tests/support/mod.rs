//! What the database controller's process tests share: the controller
//! installed in a fresh namespace with its chart's RBAC, started as a real
//! process that authenticates as the chart's ServiceAccount.

#![allow(dead_code)] // each test binary uses part of it

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use cairn_api::database::v1::{DatabaseCluster, DatabaseClusterSpec, PostgresSpec, StorageSpec};
use cairn_testing::process::ControllerProcess;
use cairn_testing::{Error, LocalCluster, TestNamespace, audit, cluster, crds, wait};
use kube::Api;
use kube::api::PostParams;

pub const CHART: &str = "cairn-database-controller";

/// A namespace with the CRDs installed.
pub async fn namespace(prefix: &str) -> Result<TestNamespace, Error> {
    let namespace = cluster().namespace(prefix).await?;
    crds::install(&namespace.client, &cairn_api::crds::for_chart(CHART)).await?;
    Ok(namespace)
}

/// Installs the chart's ServiceAccount and RBAC for Helm release `release`,
/// scoped to the test namespace; returns the account's name.
pub async fn install_rbac(namespace: &TestNamespace, release: &str) -> Result<String, Error> {
    cluster()
        .install_controller_rbac(CHART, release, &namespace.name)
        .await
}

/// Starts the controller as `account`, watching and leasing in `namespace`.
pub fn start(
    namespace: &TestNamespace,
    name: &str,
    account: &str,
    env: &[(&str, &str)],
) -> Result<ControllerProcess, Error> {
    let cluster: &LocalCluster = cluster();
    let kubeconfig = cluster.service_account_kubeconfig(&namespace.name, account)?;
    let mut all_env = vec![
        ("CAIRN_NAMESPACES", namespace.name.as_str()),
        ("CAIRN_LEASE_NAMESPACE", namespace.name.as_str()),
    ];
    all_env.extend_from_slice(env);
    ControllerProcess::start(
        cluster,
        Path::new(env!("CARGO_BIN_EXE_cairn-database-controller")),
        &format!("{}-{name}", namespace.name),
        &kubeconfig,
        &all_env,
    )
}

/// Waits until `process` answers `path` with `status`.
pub async fn until_status(
    process: &ControllerProcess,
    path: &str,
    status: u16,
    timeout: Duration,
) -> Result<(), Error> {
    wait::until(
        &format!("{} {path} = {status}", process.name),
        timeout,
        || async {
            match process.get(path).await {
                Ok((code, _)) if code == status => Ok(Some(())),
                Ok((code, body)) => Err(format!("{code} {body}")),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await
    .map_err(|e| Error::Setup(format!("{e}\nlog tail:\n{}", process.log_tail(20))))
}

/// A minimal cluster of `instances` PostgreSQL 17 instances.
pub fn database_cluster(name: &str, instances: i32) -> DatabaseCluster {
    DatabaseCluster::new(
        name,
        DatabaseClusterSpec {
            instances,
            postgres: PostgresSpec {
                version: "17".into(),
                image: None,
                parameters: BTreeMap::new(),
            },
            storage: StorageSpec {
                size: "1Gi".into(),
                storage_class_name: None,
            },
            resources: None,
            scheduling: None,
            bootstrap: None,
            paused: false,
            failover: None,
            replication: None,
            backup: None,
        },
    )
}

pub async fn create(api: &Api<DatabaseCluster>, cluster: &DatabaseCluster) -> Result<(), Error> {
    api.create(&PostParams::default(), cluster).await?;
    Ok(())
}

/// Waits until cluster `name` reports condition `type_` with `status`.
pub async fn until_condition(
    api: &Api<DatabaseCluster>,
    name: &str,
    type_: &str,
    status: &str,
    timeout: Duration,
) -> Result<DatabaseCluster, Error> {
    wait::for_object(
        api,
        name,
        &format!("{name} {type_}={status}"),
        timeout,
        |c| wait::condition_status(c, type_).as_deref() == Some(status),
    )
    .await
}

/// Write requests `user` made in `namespace`, from the audit log.
pub fn writes_by(user: &str, namespace: &str) -> Result<Vec<audit::WriteRequest>, Error> {
    Ok(audit::write_requests(&cluster().audit_log())?
        .into_iter()
        .filter(|w| w.user == user && w.namespace.as_deref() == Some(namespace))
        .collect())
}

/// Watches the audit log from now on for `window`: the writes `user` makes in
/// `namespace` (leader Lease renewals aside), as soon as one is recorded;
/// empty when there was none.
pub async fn writes_within(
    user: &str,
    namespace: &str,
    window: Duration,
) -> Result<Vec<audit::WriteRequest>, Error> {
    audit::Tail::from_now(&cluster().audit_log())?
        .unwanted_within(window, |w| {
            w.user == user && w.namespace.as_deref() == Some(namespace) && w.resource != "leases"
        })
        .await
}

/// The user name the API server sees for ServiceAccount `namespace/account`.
pub fn user(namespace: &TestNamespace, account: &str) -> String {
    format!("system:serviceaccount:{}:{account}", namespace.name)
}

/// The DatabaseCluster reconciles `process` has finished (its metric).
pub async fn reconciles(process: &ControllerProcess) -> Result<f64, Error> {
    const SERIES: &str = "cairn_reconcile_total{kind=\"DatabaseCluster\",controller=\"database\"}";
    Ok(process.metric(SERIES).await?.unwrap_or(0.0))
}

/// Waits until `process` has finished `count` more reconciles than `since`:
/// with `count` of 2, at least one began after `since` was read. The proof
/// that a reconcile saw a change, before a test asserts what it did not do.
pub async fn reconciled(
    process: &ControllerProcess,
    since: f64,
    count: f64,
    timeout: Duration,
) -> Result<(), Error> {
    wait::until("reconciles after the change", timeout, || async {
        let done = reconciles(process).await.map_err(|e| e.to_string())?;
        if done >= since + count {
            Ok(Some(()))
        } else {
            Err(format!("{} reconciles since", done - since))
        }
    })
    .await
}
