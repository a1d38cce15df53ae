//! What the suites on real nodes share: a namespace under restricted Pod
//! Security, the database controller installed by its chart, and a client pod
//! running psql against a cluster's Services.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cairn_api::database::instance::{
    CREDENTIALS_DIR, OBSERVED_ANNOTATION, ObservedState, ROLE_REPLICA, SUPERUSER_PASSWORD_KEY,
};
use cairn_api::database::v1::{
    ClusterBackupSpec, DatabaseCluster, DatabaseClusterSpec, PostgresSpec, SWITCHOVER_ANNOTATION,
    StorageSpec, SwitchoverRecord,
};
use cairn_testing::{Error, TestNamespace, cluster, wait};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

type Result<T = ()> = std::result::Result<T, Error>;

pub const CHART: &str = "cairn-database-controller";
/// Built by `hack/images.sh workspace` and imported into every node.
pub const INSTANCE_IMAGE: &str = "ghcr.io/cairn-dev/postgres:15";
pub const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// Waits until cluster `name` has `instances` ready instances and Ready=True.
pub async fn until_ready(clusters: &Api<DatabaseCluster>, name: &str, instances: i32) -> Result {
    wait::for_object(
        clusters,
        name,
        &format!("{instances} ready instances, Ready=True"),
        READY_TIMEOUT,
        |c| {
            c.status.as_ref().and_then(|s| s.ready_instances) == Some(instances)
                && wait::condition_status(c, "Ready").as_deref() == Some("True")
        },
    )
    .await?;
    Ok(())
}

/// Until every replica of cluster `name` (of `instances`) reports, on its
/// membership Lease, that it runs as a ready replica of the cluster's
/// timeline: the reports a failover is decided from. `Ready` does not show
/// it: it counts pods the kubelet last probed ready (up to 15 s ago), and a
/// ready replica may not stream a new primary's timeline yet. A test that
/// takes the primary away before this may rightly get no failover: promoting
/// a replica behind the timeline would lose its writes.
pub async fn until_replicas_follow(
    ns: &TestNamespace,
    clusters: &Api<DatabaseCluster>,
    name: &str,
    instances: i32,
) -> Result {
    let status = clusters.get(name).await?.status.unwrap_or_default();
    let (Some(primary), Some(timeline)) = (status.current_primary, status.timeline) else {
        return Err(Error::Setup(format!(
            "{name} reports no primary or timeline"
        )));
    };
    let leases = ns.api::<Lease>();
    let replicas: Vec<String> = (0..instances)
        .map(|i| format!("{name}-{i}"))
        .filter(|pod| *pod != primary)
        .collect();
    wait::until(
        &format!(
            "{} report following timeline {timeline}",
            replicas.join(", ")
        ),
        READY_TIMEOUT,
        || async {
            let mut behind = Vec::new();
            for pod in &replicas {
                let observed: ObservedState = leases
                    .get(pod)
                    .await
                    .map_err(|e| e.to_string())?
                    .annotations()
                    .get(OBSERVED_ANNOTATION)
                    .and_then(|json| serde_json::from_str(json).ok())
                    .unwrap_or_default();
                let follows = observed.ready
                    && observed.role.as_deref() == Some(ROLE_REPLICA)
                    && observed.timeline == Some(timeline);
                if !follows {
                    behind.push(format!(
                        "{pod}: ready {}, role {:?}, timeline {:?}",
                        observed.ready, observed.role, observed.timeline
                    ));
                }
            }
            if behind.is_empty() {
                Ok(Some(()))
            } else {
                Err(behind.join("; "))
            }
        },
    )
    .await
}

/// Pods of `ns` must pass the restricted Pod Security level.
pub async fn enforce_restricted_pod_security(ns: &TestNamespace) -> Result {
    Api::<Namespace>::all(ns.client.clone())
        .patch(
            &ns.name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
            } } })),
        )
        .await?;
    Ok(())
}

/// A namespace on the real nodes under the restricted Pod Security level,
/// with the database controller installed by its chart on the shared CRDs
/// (see [`Crds`]): where each real-node test of a DatabaseCluster starts.
pub async fn namespace_with_controller(prefix: &str) -> Result<TestNamespace> {
    namespace_with_controller_on(prefix, Crds::Shared).await
}

/// [`namespace_with_controller`], the CRDs installed as `crds` says.
pub async fn namespace_with_controller_on(prefix: &str, crds: Crds) -> Result<TestNamespace> {
    let ns = cairn_testing::cluster()
        .namespace_on_real_nodes(prefix)
        .await?;
    enforce_restricted_pod_security(&ns).await?;
    install_chart_on(&ns, CHART, crds).await?;
    Ok(ns)
}

/// The database controller, installed by its chart: see [`install_chart`].
pub async fn install_controller(ns: &TestNamespace) -> Result {
    install_chart(ns, CHART).await
}

/// Who installs a chart's CRDs for a test's release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crds {
    /// The test bed: the CRDs as every test binary installs them (left as
    /// they are when they serve that already), and the release with
    /// `crds.install=false`, as a second release of a chart is installed.
    /// Releases of this kind share the cluster with each other: each
    /// installing the CRDs would take them, and the conversion webhook,
    /// from the one before.
    Shared,
    /// The release itself, with the conversion webhook behind its Service:
    /// for the tests of what the chart does with its CRDs, which
    /// hack/run-tests.sh runs one at a time.
    FromChart,
}

/// `helm install` of the controller `chart` on the shared CRDs: see
/// [`install_chart_on`].
pub async fn install_chart(ns: &TestNamespace, chart: &str) -> Result {
    install_chart_on(ns, chart, Crds::Shared).await
}

/// `helm install` of the controller `chart`, watching this namespace, its
/// images never pulled, its CRDs installed as `crds` says; returns once both
/// replicas are available. The release is named `<namespace>-<chart>`: its
/// ClusterRole is cluster-scoped, and a namespace may hold several
/// controllers' releases.
pub async fn install_chart_on(ns: &TestNamespace, chart: &str, crds: Crds) -> Result {
    let watch = format!("watchNamespace={}", ns.name);
    let mut args = vec!["--set", &watch, "--set", "image.pullPolicy=Never"];
    if crds == Crds::Shared {
        cairn_testing::crds::install(&ns.client, &cairn_api::crds::for_chart(chart)).await?;
        args.extend(["--set", "crds.install=false"]);
    }
    cluster()
        .helm_install(chart, &format!("{}-{chart}", ns.name), &ns.name, &args)
        .await?;
    wait::for_object(
        &ns.api::<Deployment>(),
        &format!("{}-{chart}", ns.name),
        "2 available replicas",
        Duration::from_secs(60),
        |d| d.status.as_ref().and_then(|s| s.available_replicas) == Some(2),
    )
    .await?;
    Ok(())
}

/// Both replicas of controller `chart` run on real nodes and serve their
/// metrics from their pods' addresses, reached through the API server.
pub async fn controller_serves_metrics_from_its_pods(ns: &TestNamespace, chart: &str) -> Result {
    let pods = ns
        .api::<Pod>()
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/name={chart}")))
        .await?
        .items;
    assert_eq!(pods.len(), 2, "two controller pods");
    for pod in pods {
        let name = pod.metadata.name.unwrap_or_default();
        let node = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
        assert!(node.starts_with("cairn-node-"), "{name} runs on {node}");
        let path = format!(
            "/api/v1/namespaces/{}/pods/{name}:8080/proxy/metrics",
            ns.name
        );
        let metrics = cluster().kubectl(&["get", "--raw", &path]).await?.stdout;
        assert!(
            metrics.contains("cairn_leader"),
            "{name} serves its metrics: {}",
            &metrics[..metrics.len().min(300)]
        );
    }
    Ok(())
}

/// PostgreSQL 15 from the workspace image, on local-path volumes.
pub fn cluster_spec(instances: i32) -> DatabaseClusterSpec {
    DatabaseClusterSpec {
        instances,
        postgres: PostgresSpec {
            version: "15".into(),
            image: Some(INSTANCE_IMAGE.into()),
            parameters: BTreeMap::new(),
        },
        storage: StorageSpec {
            size: "1Gi".into(),
            storage_class_name: Some("local-path".into()),
        },
        resources: None,
        scheduling: None,
        bootstrap: None,
        paused: false,
        failover: None,
        replication: None,
        backup: None,
    }
}

/// A backup destination in moto (reached from the pod network): bucket
/// `bucket`, made now, under `prefix`, with moto's credentials in Secret
/// `backup-bucket` of `ns`.
pub async fn backup_destination(
    ns: &TestNamespace,
    bucket: &str,
    prefix: &str,
) -> Result<ClusterBackupSpec> {
    cairn_testing::s3::client(cluster().s3_endpoint())
        .create_bucket()
        .bucket(bucket)
        .send()
        .await
        .map_err(|e| Error::Setup(format!("bucket {bucket}: {e}")))?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "backup-bucket" },
        "stringData": { "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing" },
    }))
    .map_err(|e| Error::Setup(e.to_string()))?;
    ns.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await?;
    serde_json::from_value(json!({ "destination": { "s3": {
        "endpoint": cluster().s3_endpoint(),
        "bucket": bucket,
        "prefix": prefix,
        "credentialsSecret": { "name": "backup-bucket" },
    }}}))
    .map_err(|e| Error::Setup(e.to_string()))
}

/// Where the client pod mounts the cluster's published CA (ConfigMap `<cluster>-ca`).
pub const CLIENT_CA_FILE: &str = "/etc/cairn-ca/ca.crt";

/// A pod `client` with psql, under the restricted level, logged in as the
/// application's owner from `database`'s credentials Secret, verifying the
/// server with the cluster's published CA (`sslmode=verify-full`).
pub async fn start_client(ns: &TestNamespace, database: &str) -> Result {
    start_client_on(ns, database, None).await
}

/// [`start_client`] on node `node` (bypassing the scheduler) if given.
pub async fn start_client_on(ns: &TestNamespace, database: &str, node: Option<&str>) -> Result {
    let secret = format!("{database}-credentials");
    let from_secret = |key: &str| json!({ "secretKeyRef": { "name": secret, "key": key } });
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": "client" },
        "spec": {
            "securityContext": {
                "runAsNonRoot": true, "runAsUser": 999, "runAsGroup": 999,
                "seccompProfile": { "type": "RuntimeDefault" }
            },
            "terminationGracePeriodSeconds": 0,
            "nodeName": node,
            "containers": [{
                "name": "psql",
                "image": INSTANCE_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sleep", "infinity"],
                "env": [
                    { "name": "PGUSER", "valueFrom": from_secret("username") },
                    { "name": "PGPASSWORD", "valueFrom": from_secret("password") },
                    { "name": "PGDATABASE", "valueFrom": from_secret("database") },
                    { "name": "PGCONNECT_TIMEOUT", "value": "5" },
                    { "name": "PGSSLMODE", "value": "verify-full" },
                    { "name": "PGSSLROOTCERT", "value": CLIENT_CA_FILE }
                ],
                "volumeMounts": [{ "name": "ca", "mountPath": "/etc/cairn-ca", "readOnly": true }],
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "capabilities": { "drop": ["ALL"] }
                }
            }],
            "volumes": [{ "name": "ca", "configMap": { "name": format!("{database}-ca") } }]
        }
    }))
    .map_err(|e| Error::Setup(e.to_string()))?;
    let pods = ns.api::<Pod>();
    pods.create(&PostParams::default(), &pod).await?;
    wait::for_object(&pods, "client", "Ready", Duration::from_secs(60), |p| {
        wait::condition_status(p, "Ready").as_deref() == Some("True")
    })
    .await?;
    Ok(())
}

/// Runs `sql` with psql in the client pod against `host` (a Service or pod
/// DNS name); returns what it printed, unaligned and tuples only.
pub async fn psql(ns: &TestNamespace, host: &str, sql: &str) -> Result<String> {
    let out = cluster()
        .kubectl(&[
            "-n",
            &ns.name,
            "exec",
            "client",
            "--",
            "psql",
            "-h",
            host,
            "-XAtq",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            sql,
        ])
        .await?;
    Ok(out.stdout.trim().to_owned())
}

/// Polls `sql` against `host` until it prints `expected`.
pub async fn until_psql(ns: &TestNamespace, host: &str, sql: &str, expected: &str) -> Result {
    wait::until(
        &format!("`{sql}` on {host} = {expected}"),
        READY_TIMEOUT,
        || async {
            match psql(ns, host, sql).await {
                Ok(out) if out == expected => Ok(Some(())),
                Ok(out) => Err(out),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await
}

/// `kubectl annotate dbc <name> database.cairn.dev/switchover-to=<to>`, as
/// the docs show: waits until a switchover to `to` requested by it (started
/// after the annotation) completed, then removes the annotation, which
/// would otherwise stay a lasting preference. Returns its record.
pub async fn switch_over(ns: &TestNamespace, name: &str, to: &str) -> Result<SwitchoverRecord> {
    let requested = k8s_openapi::jiff::Timestamp::now() - Duration::from_secs(1);
    let annotate = format!("{SWITCHOVER_ANNOTATION}={to}");
    cluster()
        .kubectl(&[
            "-n",
            &ns.name,
            "annotate",
            "--overwrite",
            "dbc",
            name,
            &annotate,
        ])
        .await?;
    let done = wait::for_object(
        &ns.api::<DatabaseCluster>(),
        name,
        &format!("the switchover to {to} completed"),
        READY_TIMEOUT,
        |c| {
            c.status
                .as_ref()
                .and_then(|s| s.last_switchover.as_ref())
                .is_some_and(|r| {
                    r.to == to && r.started_at.0 >= requested && r.completed_at.is_some()
                })
        },
    )
    .await?;
    let remove = format!("{SWITCHOVER_ANNOTATION}-");
    cluster()
        .kubectl(&["-n", &ns.name, "annotate", "dbc", name, &remove])
        .await?;
    done.status
        .and_then(|s| s.last_switchover)
        .ok_or_else(|| Error::Setup("no lastSwitchover".into()))
}

/// `status.currentPrimary` of DatabaseCluster `name`.
pub async fn current_primary(clusters: &Api<DatabaseCluster>, name: &str) -> Result<String> {
    clusters
        .get(name)
        .await?
        .status
        .and_then(|s| s.current_primary)
        .ok_or_else(|| Error::Setup("no status.currentPrimary".into()))
}

/// The node pod `pod` runs on.
pub async fn node_of(ns: &TestNamespace, pod: &str) -> Result<String> {
    ns.api::<Pod>()
        .get(pod)
        .await?
        .spec
        .and_then(|s| s.node_name)
        .ok_or_else(|| Error::Setup(format!("{pod} is not scheduled")))
}

/// A node running another instance of 3-instance cluster `name` than
/// node `not` (for a client that must outlive `not`).
pub async fn other_real_node(ns: &TestNamespace, name: &str, not: &str) -> Result<String> {
    for ordinal in 0..3 {
        let node = node_of(ns, &format!("{name}-{ordinal}")).await?;
        if node != not {
            return Ok(node);
        }
    }
    Err(Error::Setup(format!("every instance runs on {not}")))
}

/// In the client pod: INSERT a new id into table `ticks` through `host`
/// every 100 ms, one
/// connection each (as a pooled client reconnecting would), each attempt
/// bounded by `timeout` (a frozen server accepts a TCP connection and never
/// answers); `/tmp/writes` gets `ok|no ID STARTED ENDED` (Unix times) per
/// attempt.
pub async fn start_writer(ns: &TestNamespace, host: &str) -> Result {
    let script = format!(
        "i=0; while :; do i=$((i+1)); s=$(date +%s.%N); \
         if timeout 3 psql -h {host} -XAtq -c \"INSERT INTO ticks VALUES ($i)\" >/dev/null 2>&1; \
         then echo \"ok $i $s $(date +%s.%N)\"; else echo \"no $i $s $(date +%s.%N)\"; fi; \
         sleep 0.1; done"
    );
    let launch = format!(
        "setsid bash -c '{script}' >/tmp/writes 2>&1 </dev/null & echo $! >/tmp/writer.pid"
    );
    exec(ns, &["bash", "-c", &launch]).await.map(drop)
}

/// Table `ticks` created through `host`, the writer started on it, and 20
/// writes acknowledged: the start of every suite that counts writes.
pub async fn start_ticks(ns: &TestNamespace, host: &str) -> Result {
    psql(ns, host, "CREATE TABLE ticks (id bigint PRIMARY KEY)").await?;
    start_writer(ns, host).await?;
    until_acknowledged(ns, 20).await
}

/// Stops the writer [`start_writer`] started.
pub async fn stop_writer(ns: &TestNamespace) -> Result {
    exec(ns, &["bash", "-c", "kill -- -$(cat /tmp/writer.pid)"])
        .await
        .map(drop)
}

/// One attempt of the writer.
pub struct Write {
    pub ok: bool,
    pub id: u64,
    /// Unix time the attempt began.
    pub started: f64,
    /// When it was acknowledged (or failed).
    pub at: f64,
}

/// The ids in table `ticks`, read through `host`.
pub async fn rows_present(ns: &TestNamespace, host: &str) -> Result<BTreeSet<u64>> {
    Ok(psql(ns, host, "SELECT id FROM ticks")
        .await?
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect())
}

/// Every attempt so far.
pub async fn writes(ns: &TestNamespace) -> Result<Vec<Write>> {
    let log = exec(ns, &["cat", "/tmp/writes"]).await?;
    Ok(log
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            Some(Write {
                ok: fields.next()? == "ok",
                id: fields.next()?.parse().ok()?,
                started: fields.next()?.parse().ok()?,
                at: fields.next()?.parse().ok()?,
            })
        })
        .collect())
}

/// Until `count` writes have been acknowledged in all.
pub async fn until_acknowledged(ns: &TestNamespace, count: usize) -> Result {
    wait::until(
        &format!("{count} acknowledged writes"),
        Duration::from_secs(60),
        || async {
            let done = writes(ns).await.map_err(|e| e.to_string())?;
            let ok = done.iter().filter(|w| w.ok).count();
            if ok >= count {
                Ok(Some(()))
            } else {
                Err(format!("{ok} acknowledged"))
            }
        },
    )
    .await
}

/// Until `count` more writes have been acknowledged after the last failed one.
pub async fn until_acknowledged_after(ns: &TestNamespace, count: usize) -> Result {
    wait::until(
        &format!("{count} writes acknowledged in a row"),
        READY_TIMEOUT,
        || async {
            let done = writes(ns).await.map_err(|e| e.to_string())?;
            let streak = done.iter().rev().take_while(|w| w.ok).count();
            if streak >= count {
                Ok(Some(()))
            } else {
                Err(format!("{streak} in a row"))
            }
        },
    )
    .await
}

/// Runs `sql` with psql in pod `pod`'s own container, as the superuser over
/// loopback with the password mounted there (never on a command line).
pub async fn as_superuser(ns: &TestNamespace, pod: &str, sql: &str) -> Result<String> {
    let script = format!(
        "PGPASSWORD=$(cat {CREDENTIALS_DIR}/{SUPERUSER_PASSWORD_KEY}) \
         psql -h 127.0.0.1 -U postgres -XAtq -c \"{sql}\""
    );
    let out = cluster()
        .kubectl(&["-n", &ns.name, "exec", pod, "--", "sh", "-c", &script])
        .await?;
    Ok(out.stdout.trim().to_owned())
}

/// Runs `command` in the client pod; its output.
pub async fn exec(ns: &TestNamespace, command: &[&str]) -> Result<String> {
    let mut args = vec!["-n", &ns.name, "exec", "client", "--"];
    args.extend_from_slice(command);
    Ok(cluster().kubectl(&args).await?.stdout)
}

/// Seconds since the epoch, as the writer's `date +%s.%N`.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}
