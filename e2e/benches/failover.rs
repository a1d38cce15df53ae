//! Benchmark (not a test): automated failover on the real nodes, N times.
//! A 3-instance DatabaseCluster, the controller installed by its chart; a
//! writer on this machine INSERTs through `<name>-rw`'s ClusterIP every
//! 100 ms (one connection each, 3 s bound). Each round stops the primary's
//! node (kubelet and containers frozen), waits for the promotion and for
//! writes to resume, lets the node return and waits for the old primary to
//! be a ready replica. Prints min/median/max of: node stopped → replica
//! promoted, node stopped → first acknowledged write, node back → old primary
//! a ready replica; and the acknowledged rows missing at the end. With
//! `synchronous`, commits wait for one of the two replicas
//! (`spec.replication.synchronousReplicas: 1`).
//!
//! With `kill`, each round SIGKILLs the primary's container instead (a
//! crash, an OOM kill): the kubelet restarts it, and whether it serves
//! again before the failover delay or a replica is promoted, the round
//! measures kill → first acknowledged write, and counts the failovers.
//!
//!   hack/bench.sh failover 10
//!   hack/bench.sh failover 10 synchronous
//!   hack/bench.sh failover 10 kill
//!   hack/bench.sh failover 10 synchronous kill

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_api::database::instance::{OBSERVED_ANNOTATION, ObservedState};
use cairn_api::database::v1::{DatabaseCluster, ReplicationSpec};
use cairn_e2e::real::{
    READY_TIMEOUT, cluster_spec, current_primary, enforce_restricted_pod_security,
    install_controller, node_of, unix_now,
};
use cairn_testing::{Error, LocalCluster, TestNamespace, cluster, wait};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use kube::Api;
use kube::api::PostParams;
use tokio_postgres_rustls::MakeRustlsConnect;

const CLUSTER: &str = "bench";

#[tokio::main]
async fn main() -> Result<(), Error> {
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(10);
    let synchronous = std::env::args().any(|a| a == "synchronous");
    let kill = std::env::args().any(|a| a == "kill");
    let replication = match synchronous {
        true => "synchronous replication, one of two replicas confirms each commit",
        false => "asynchronous replication",
    };
    let ns = cluster().namespace_on_real_nodes("bench-failover").await?;
    enforce_restricted_pod_security(&ns).await?;
    install_controller(&ns).await?;
    let clusters = ns.api::<DatabaseCluster>();
    let mut spec = cluster_spec(3);
    spec.replication = synchronous.then_some(ReplicationSpec {
        synchronous_replicas: 1,
    });
    clusters
        .create(&PostParams::default(), &DatabaseCluster::new(CLUSTER, spec))
        .await?;
    until_healthy(&clusters).await?;
    let writer = Writer::start(&ns).await?;
    if kill {
        return kill_rounds(&ns, &clusters, writer, rounds, replication).await;
    }
    let (mut promoted, mut resumed, mut rejoined) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        let primary = current_primary(&clusters, CLUSTER).await?;
        let node = node_of(&ns, &primary).await?;
        let number = LocalCluster::real_node_number(&node)
            .ok_or_else(|| Error::Setup(format!("{primary} runs on {node}")))?;
        cluster().stop_node(number)?;
        let (stopped, stopped_at) = (Instant::now(), unix_now());
        let outcome = failover(&clusters, &primary, &writer, stopped_at).await;
        cluster().start_node(number)?;
        let back = Instant::now();
        let (promote, resume) = outcome?;
        // Its own report, not the pod's Ready condition (stale until the
        // kubelet, frozen with the node, updates it).
        wait::for_object(
            &ns.api::<Lease>(),
            &primary,
            "a ready replica",
            READY_TIMEOUT,
            |lease| {
                let observed: Option<ObservedState> = lease
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(OBSERVED_ANNOTATION))
                    .and_then(|json| serde_json::from_str(json).ok());
                observed.is_some_and(|o| o.ready && o.role.as_deref() == Some("replica"))
            },
        )
        .await?;
        let rejoin = back.elapsed().as_secs_f64();
        until_healthy(&clusters).await?;
        eprintln!(
            "round {round}: {primary} on {node} stopped; promoted after {promote:.1} s, \
             writes after {resume:.1} s, rejoined {rejoin:.1} s after the node returned \
             (round {:.0} s)",
            stopped.elapsed().as_secs_f64()
        );
        promoted.push(promote);
        resumed.push(resume);
        rejoined.push(rejoin);
    }
    let (acknowledged, missing) = writer.finish().await?;
    println!("failover over {rounds} rounds, {replication} (min / median / max):");
    print_spread("node stopped → replica promoted", &mut promoted);
    print_spread("node stopped → first acknowledged write", &mut resumed);
    print_spread("node back → old primary a ready replica", &mut rejoined);
    println!("  rows acknowledged {acknowledged}, missing afterwards {missing}");
    Ok(())
}

/// Rounds of SIGKILL to the primary's container: kill → first write begun
/// after it and acknowledged, and how many rounds failed over.
async fn kill_rounds(
    ns: &TestNamespace,
    clusters: &Api<DatabaseCluster>,
    writer: Writer,
    rounds: usize,
    replication: &str,
) -> Result<(), Error> {
    let (mut resumed, mut failovers) = (Vec::new(), 0);
    for round in 1..=rounds {
        let primary = current_primary(clusters, CLUSTER).await?;
        cluster().kill_container(&ns.name, &primary, "postgres")?;
        let (killed, killed_at) = (Instant::now(), unix_now());
        let written = wait::until("a write after the kill", READY_TIMEOUT, || async {
            Ok::<_, String>(writer.first_acknowledged_after(killed_at))
        })
        .await?;
        until_healthy(clusters).await?;
        let after = current_primary(clusters, CLUSTER).await?;
        let failed_over = after != primary;
        failovers += usize::from(failed_over);
        eprintln!(
            "round {round}: {primary} killed; writes after {:.1} s, {} (round {:.0} s)",
            written - killed_at,
            match failed_over {
                true => format!("{after} promoted"),
                false => "no failover".to_owned(),
            },
            killed.elapsed().as_secs_f64()
        );
        resumed.push(written - killed_at);
    }
    let (acknowledged, missing) = writer.finish().await?;
    println!(
        "SIGKILL of the primary's container over {rounds} rounds, {replication} (min / median / max):"
    );
    print_spread("killed → first acknowledged write", &mut resumed);
    println!("  failovers {failovers} of {rounds} rounds");
    println!("  rows acknowledged {acknowledged}, missing afterwards {missing}");
    Ok(())
}

/// Seconds from the node stopping to the promotion, and to the first write
/// begun afterwards that was acknowledged.
async fn failover(
    clusters: &Api<DatabaseCluster>,
    old: &str,
    writer: &Writer,
    stopped_at: f64,
) -> Result<(f64, f64), Error> {
    wait::for_object(clusters, CLUSTER, "another primary", READY_TIMEOUT, |c| {
        c.status
            .as_ref()
            .and_then(|s| s.current_primary.as_deref())
            .is_some_and(|p| p != old)
    })
    .await?;
    let promoted = unix_now() - stopped_at;
    let resumed = wait::until("a write after the failover", READY_TIMEOUT, || async {
        Ok::<_, String>(writer.first_acknowledged_after(stopped_at))
    })
    .await?;
    Ok((promoted, resumed - stopped_at))
}

async fn until_healthy(clusters: &Api<DatabaseCluster>) -> Result<(), Error> {
    wait::for_object(clusters, CLUSTER, "3 ready instances", READY_TIMEOUT, |c| {
        c.status.as_ref().and_then(|s| s.ready_instances) == Some(3)
            && wait::condition_status(c, "Ready").as_deref() == Some("True")
            && wait::condition_status(c, "Degraded").as_deref() != Some("True")
            && c.status
                .as_ref()
                .and_then(|s| s.last_failover.as_ref())
                .is_none_or(|f| f.completed_at.is_some())
    })
    .await?;
    Ok(())
}

fn print_spread(what: &str, values: &mut [f64]) {
    values.sort_by(f64::total_cmp);
    let median = values.get(values.len() / 2).copied().unwrap_or(f64::NAN);
    println!(
        "  {what}: {:.1} / {median:.1} / {:.1} s",
        values.first().copied().unwrap_or(f64::NAN),
        values.last().copied().unwrap_or(f64::NAN)
    );
}

/// INSERTs through the `-rw` ClusterIP from this machine (kube-proxy's rules
/// route it), recording each acknowledged id with when its attempt began and
/// ended.
struct Writer {
    config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    acknowledged: Arc<Mutex<Vec<(u64, f64, f64)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    async fn start(ns: &TestNamespace) -> Result<Self, Error> {
        let service = ns.api::<Service>().get(&format!("{CLUSTER}-rw")).await?;
        let address = service
            .spec
            .and_then(|s| s.cluster_ip)
            .ok_or_else(|| Error::Setup("no ClusterIP".into()))?;
        let secret = ns
            .api::<Secret>()
            .get(&format!("{CLUSTER}-credentials"))
            .await?;
        let key = |k: &str| {
            secret
                .data
                .as_ref()
                .and_then(|d| d.get(k))
                .map(|v| String::from_utf8_lossy(&v.0).into_owned())
                .unwrap_or_default()
        };
        let address: std::net::IpAddr = address
            .parse()
            .map_err(|e| Error::Setup(format!("ClusterIP {address}: {e}")))?;
        // TLS only, verified as a client of the cluster would: the CA
        // published in ConfigMap `<name>-ca`, the server named `<name>-rw`
        // (its certificate's name), reached at the ClusterIP.
        let mut config = tokio_postgres::Config::new();
        config
            .host(format!("{CLUSTER}-rw"))
            .hostaddr(address)
            .ssl_mode(tokio_postgres::config::SslMode::Require)
            .port(5432)
            .user(key("username"))
            .password(key("password"))
            .dbname(key("database"))
            .connect_timeout(Duration::from_secs(3));
        let ca = published_ca(ns).await?;
        let tls = cairn_instance::tls::verifying_pem(ca.as_bytes(), &format!("{CLUSTER}-ca"))
            .map_err(|e| Error::Setup(e.to_string()))?;
        let (client, connection) = config
            .connect(tls.clone())
            .await
            .map_err(|e| Error::Setup(format!("psql through {address}: {e}")))?;
        tokio::spawn(connection);
        client
            .batch_execute("CREATE TABLE ticks (id bigint PRIMARY KEY)")
            .await
            .map_err(|e| Error::Setup(e.to_string()))?;
        let acknowledged = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn(write_forever(
            config.clone(),
            tls.clone(),
            acknowledged.clone(),
        ));
        Ok(Self {
            config,
            tls,
            acknowledged,
            task,
        })
    }

    fn first_acknowledged_after(&self, at: f64) -> Option<f64> {
        let done = self.acknowledged.lock().unwrap_or_else(|p| p.into_inner());
        done.iter()
            .find(|(_, started, _)| *started > at)
            .map(|(_, _, ended)| *ended)
    }

    /// Stops writing; returns the rows acknowledged and those missing now.
    async fn finish(self) -> Result<(usize, usize), Error> {
        self.task.abort();
        let (client, connection) = self
            .config
            .connect(self.tls.clone())
            .await
            .map_err(|e| Error::Setup(e.to_string()))?;
        tokio::spawn(connection);
        let present: std::collections::BTreeSet<i64> = client
            .query("SELECT id FROM ticks", &[])
            .await
            .map_err(|e| Error::Setup(e.to_string()))?
            .iter()
            .map(|row| row.get(0))
            .collect();
        let done = self.acknowledged.lock().unwrap_or_else(|p| p.into_inner());
        let missing = done
            .iter()
            .filter(|(id, _, _)| !present.contains(&i64::try_from(*id).unwrap_or(-1)))
            .count();
        Ok((done.len(), missing))
    }
}

async fn write_forever(
    config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    acknowledged: Arc<Mutex<Vec<(u64, f64, f64)>>>,
) {
    for id in 1u64.. {
        let started = unix_now();
        let attempt = async {
            let (client, connection) = config.connect(tls.clone()).await?;
            tokio::spawn(connection);
            let id = i64::try_from(id).unwrap_or(i64::MAX);
            client
                .execute("INSERT INTO ticks VALUES ($1)", &[&id])
                .await
        };
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(3), attempt).await {
            acknowledged
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((id, started, unix_now()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The cluster's CA as published for clients (ConfigMap `<name>-ca`).
async fn published_ca(ns: &TestNamespace) -> Result<String, Error> {
    ns.api::<ConfigMap>()
        .get(&format!("{CLUSTER}-ca"))
        .await?
        .data
        .and_then(|d| d.get("ca.crt").cloned())
        .ok_or_else(|| Error::Setup(format!("no ca.crt in ConfigMap {CLUSTER}-ca")))
}
