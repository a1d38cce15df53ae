//! Real PostgreSQL servers run by real cairn-instance processes on loopback.
//!
//! A `Fixture` is one database cluster's shared files: the controller's
//! ConfigMap and credentials Secret, rendered by the controller's own `build`
//! code and written as the kubelet would mount them. Each `Instance` is a
//! cairn-instance process with its own data folder, role file and ports.
//! PostgreSQL refuses to run as root, so under root the processes run as the
//! `postgres` user (created by Debian's package), else as the current user.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use cairn_api::database::instance::{
    BOOTSTRAP_ANNOTATION, BOOTSTRAP_INITDB, OBSERVED_ANNOTATION, ObservedState, ROLE_LABEL,
};
use cairn_api::database::v1::DatabaseCluster;
use cairn_database_controller::build;
use cairn_runtime::certs;
use cairn_testing::TestNamespace;
use cairn_testing::process::{free_address, http_get};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::PostParams;
use kube::{Api, Resource};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use serde_json::json;
use tokio::process::{Child, Command};

pub type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The programs of Debian's postgresql package (hack/postgres.sh installs it).
pub fn postgres_bindir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CAIRN_POSTGRES_BINDIR") {
        return dir.into();
    }
    let found = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .find(|bin| bin.join("postgres").exists());
    found.expect(
        "no PostgreSQL server: run hack/test.sh, or hack/postgres.sh and set CAIRN_POSTGRES_BINDIR",
    )
}

/// The user the servers run as: (uid, gid).
fn server_user() -> Option<(u32, u32)> {
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    let user = nix::unistd::User::from_name("postgres")
        .ok()
        .flatten()
        .expect("running as root needs a `postgres` user (Debian's postgresql package creates it)");
    Some((user.uid.as_raw(), user.gid.as_raw()))
}

pub struct Fixture {
    pub root: PathBuf,
    pub config_dir: PathBuf,
    pub credentials_dir: PathBuf,
    pub credentials: BTreeMap<String, String>,
    /// The server certificate Secret's files, for `127.0.0.1` and `localhost`.
    pub tls_dir: PathBuf,
    /// The CA that signed the certificate in `tls_dir`.
    pub ca: String,
    binary: PathBuf,
    user: Option<(u32, u32)>,
    passed: bool,
}

impl Fixture {
    /// A cluster `orders` with `parameters` in its spec.
    pub fn new(test: &str, parameters: &[(&str, &str)]) -> Result<Self> {
        Self::of(test, cluster(parameters)?)
    }

    /// The files of `cluster`, as the controller renders them.
    pub fn of(test: &str, cluster: DatabaseCluster) -> Result<Self> {
        let root =
            std::env::temp_dir().join(format!("cairn-instance-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root)?;
        let user = server_user();
        // The test binary's folder may not be reachable by the server's user.
        let binary = root.join("cairn-instance");
        std::fs::copy(env!("CARGO_BIN_EXE_cairn-instance"), &binary)?;
        let fixture = Self {
            config_dir: root.join("config"),
            credentials_dir: root.join("credentials"),
            credentials: BTreeMap::new(),
            tls_dir: root.join("tls"),
            ca: String::new(),
            root,
            binary,
            user,
            passed: false,
        };
        let mut fixture = fixture;
        let config = build::config_map(&cluster).data.unwrap_or_default();
        fixture.credentials = build::credentials(&cluster, &mut build::random_password)
            .string_data
            .unwrap_or_default();
        std::fs::create_dir_all(&fixture.config_dir)?;
        for (name, text) in &config {
            std::fs::write(fixture.config_dir.join(name), text)?;
        }
        fixture.write_credentials(&fixture.credentials_dir, &fixture.credentials)?;
        fixture.issue_certificate()?;
        fixture.own(&fixture.root)?;
        Ok(fixture)
    }

    /// A new CA and a server certificate it signed, written the way the
    /// kubelet updates a Secret volume (each file replaced by a rename).
    pub fn issue_certificate(&mut self) -> Result {
        const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);
        let ca = certs::new_authority("cairn-instance tests", YEAR)?;
        let hosts = ["127.0.0.1".to_owned(), "localhost".to_owned()];
        let issued = certs::issue(&ca, &hosts, YEAR)?;
        std::fs::create_dir_all(&self.tls_dir)?;
        for (name, text) in [
            (certs::CA_KEY, &ca.cert),
            (certs::CERT_KEY, &issued.cert),
            (certs::KEY_KEY, &issued.key),
        ] {
            let temporary = self.tls_dir.join(format!(".{name}.new"));
            std::fs::write(&temporary, text)?;
            std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o400))?;
            std::fs::rename(&temporary, self.tls_dir.join(name))?;
        }
        self.ca = ca.cert;
        self.own(&self.tls_dir)
    }

    /// Writes a credentials folder (mode 0400 files, as the Secret volume).
    pub fn write_credentials(&self, dir: &Path, credentials: &BTreeMap<String, String>) -> Result {
        std::fs::create_dir_all(dir)?;
        for (key, value) in credentials {
            let path = dir.join(key);
            std::fs::write(&path, value)?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400))?;
        }
        self.own(dir)
    }

    /// Gives `path` (recursively) to the servers' user.
    pub fn own(&self, path: &Path) -> Result {
        std::fs::set_permissions(&self.root, std::fs::Permissions::from_mode(0o755))?;
        let Some((uid, gid)) = self.user else {
            return Ok(());
        };
        let status = std::process::Command::new("chown")
            .arg("-R")
            .arg(format!("{uid}:{gid}"))
            .arg(path)
            .status()?;
        if !status.success() {
            return Err(format!("chown {}: {status}", path.display()).into());
        }
        Ok(())
    }

    /// Replaces the controller's postgresql.conf the way the kubelet updates
    /// a ConfigMap volume: a new file moved into place.
    pub fn set_parameters(&self, parameters: &[(&str, &str)]) -> Result {
        let config = build::config_map(&cluster(parameters)?)
            .data
            .unwrap_or_default();
        let path = self.config_dir.join("postgresql.conf");
        let temporary = self.config_dir.join(".postgresql.conf.new");
        std::fs::write(&temporary, &config["postgresql.conf"])?;
        std::fs::rename(&temporary, &path)?;
        self.own(&path)
    }

    pub fn instance(&self, name: &str, role: &str) -> Result<InstanceSpec> {
        let dir = self.root.join(name);
        std::fs::create_dir_all(dir.join("podinfo"))?;
        std::fs::create_dir_all(dir.join("data"))?;
        std::fs::create_dir_all(dir.join("run"))?;
        std::fs::write(dir.join("podinfo").join("role"), role)?;
        self.own(&dir)?;
        Ok(InstanceSpec {
            name: name.to_owned(),
            port: free_address()?.port(),
            http: free_address()?,
            metrics: free_address()?,
            primary_port: None,
            credentials_dir: self.credentials_dir.clone(),
            env: Vec::new(),
            dir,
        })
    }

    /// `spec` archiving WAL to `bucket` at `endpoint` (moto's test
    /// credentials), as cluster `orders`.
    pub fn archiving_to(
        &self,
        mut spec: InstanceSpec,
        endpoint: &str,
        bucket: &str,
    ) -> Result<InstanceSpec> {
        let credentials = spec.dir.join("backup-credentials");
        let keys = [
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
        ];
        self.write_credentials(
            &credentials,
            &keys
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )?;
        spec = spec
            .env("CAIRN_CLUSTER", "orders")
            .env("CAIRN_BACKUP_BUCKET", bucket)
            .env("CAIRN_BACKUP_ENDPOINT", endpoint)
            .env(
                "CAIRN_BACKUP_CREDENTIALS_DIR",
                &credentials.display().to_string(),
            );
        Ok(spec)
    }

    /// Changes an instance's assigned role, as the kubelet updates the
    /// Downward API file when the controller relabels the pod.
    pub fn assign(&self, spec: &InstanceSpec, role: &str) -> Result {
        let path = spec.dir.join("podinfo").join("role");
        let temporary = spec.dir.join("podinfo").join(".role.new");
        std::fs::write(&temporary, role)?;
        std::fs::rename(&temporary, &path)?;
        self.own(&path)
    }

    /// Starts an instance.
    /// A process that lives `seconds`, as the user the instances run as: a
    /// stand-in for a process of the same user whose pid a stale lock names.
    pub fn process_of_the_instance_user(&self, seconds: u32) -> Result<tokio::process::Child> {
        let mut sleep = Command::new("sleep");
        sleep.arg(seconds.to_string()).kill_on_drop(true);
        if let Some((uid, gid)) = self.user {
            sleep.uid(uid).gid(gid);
        }
        Ok(sleep.spawn()?)
    }

    pub fn start(&self, spec: &InstanceSpec) -> Result<Instance> {
        let logs = self.root.join("logs");
        std::fs::create_dir_all(&logs)?;
        let log = logs.join(format!("{}-{}.log", spec.name, now_millis()));
        let file = std::fs::File::create(&log)?;
        let mut command = Command::new(&self.binary);
        command
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("PGDATA", spec.data_dir())
            .env("CAIRN_CONFIG_DIR", &self.config_dir)
            .env("CAIRN_CREDENTIALS_DIR", &spec.credentials_dir)
            .env("CAIRN_TLS_DIR", &self.tls_dir)
            .env("CAIRN_ROLE_FILE", spec.dir.join("podinfo").join("role"))
            .env("CAIRN_RUN_DIR", spec.dir.join("run"))
            .env("CAIRN_POSTGRES_BINDIR", postgres_bindir())
            .env("CAIRN_POSTGRES_PORT", spec.port.to_string())
            .env("CAIRN_LISTEN_ADDRESSES", "127.0.0.1")
            .env("CAIRN_HTTP_ADDRESS", spec.http.to_string())
            .env("CAIRN_METRICS_ADDRESS", spec.metrics.to_string())
            .env("CAIRN_PRIMARY_HOST", "127.0.0.1")
            .env(
                "CAIRN_PRIMARY_PORT",
                spec.primary_port.unwrap_or(0).to_string(),
            )
            .env("POD_NAME", &spec.name)
            .env("CAIRN_POLL_MILLISECONDS", "200")
            .env("CAIRN_MAX_LAG_SECONDS", "3")
            .env("CAIRN_LOG_FORMAT", "text")
            .env("CAIRN_LOG_LEVEL", "info,cairn_instance=debug")
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .kill_on_drop(true);
        if let Some((uid, gid)) = self.user {
            command.uid(uid).gid(gid);
        }
        let child = command.spawn()?;
        Ok(Instance {
            spec: spec.clone(),
            log,
            child,
            credentials: self.credentials.clone(),
        })
    }
}

impl Fixture {
    /// A kubeconfig of the instances' ServiceAccount (`orders`) in `ns`.
    pub fn service_account_kubeconfig(&self, ns: &TestNamespace) -> Result<PathBuf> {
        let kubeconfig = self.root.join("kubeconfig");
        std::fs::copy(
            cairn_testing::cluster().service_account_kubeconfig(&ns.name, "orders")?,
            &kubeconfig,
        )?;
        self.own(&kubeconfig)?;
        Ok(kubeconfig)
    }

    /// Instance `name` as if in pod `name` of `ns`: its role from the pod,
    /// its heartbeat in its Lease, through the API as the instances'
    /// ServiceAccount.
    pub fn in_pod(
        &self,
        name: &str,
        ns: &TestNamespace,
        kubeconfig: &Path,
    ) -> Result<InstanceSpec> {
        Ok(self
            .instance(name, "")?
            .env("KUBECONFIG", &kubeconfig.display().to_string())
            .env("POD_NAMESPACE", &ns.name)
            // Instances of other tests may run on this machine: no shared
            // port (a single instance here has no peer to reach anyway).
            .env("CAIRN_PEER_PORT", "0"))
    }
}

/// The objects the database controller makes for cluster `orders`' instances
/// (ServiceAccount, Role, RoleBinding, membership Leases), moved into `ns`
/// without their owner (no DatabaseCluster here). Returns the RoleBinding.
pub async fn membership_objects(ns: &TestNamespace) -> Result<RoleBinding> {
    let database = cluster(&[])?;
    let post = PostParams::default();
    let mut account = build::service_account(&database);
    let mut role = build::instance_role(&database);
    let mut binding = build::instance_role_binding(&database);
    let mut leases = build::member_leases(&database);
    for meta in [account.meta_mut(), role.meta_mut(), binding.meta_mut()]
        .into_iter()
        .chain(leases.iter_mut().map(|l| l.meta_mut()))
    {
        meta.namespace = Some(ns.name.clone());
        meta.owner_references = None;
    }
    for subject in binding.subjects.iter_mut().flatten() {
        subject.namespace = Some(ns.name.clone());
    }
    ns.api::<ServiceAccount>().create(&post, &account).await?;
    ns.api::<Role>().create(&post, &role).await?;
    ns.api::<RoleBinding>().create(&post, &binding).await?;
    for lease in &leases {
        ns.api::<Lease>().create(&post, lease).await?;
    }
    Ok(binding)
}

/// Pods standing for instances: `(name, role label, bootstrap annotation)`.
pub async fn instance_pods(pods: &Api<Pod>, instances: &[(&str, &str, bool)]) -> Result {
    for (name, role, bootstrap) in instances {
        let annotations = if *bootstrap {
            json!({ BOOTSTRAP_ANNOTATION: BOOTSTRAP_INITDB })
        } else {
            json!({})
        };
        let pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": name, "labels": { ROLE_LABEL: role }, "annotations": annotations },
            "spec": { "containers": [{ "name": "postgres", "image": "postgres:15" }] },
        }))?;
        pods.create(&PostParams::default(), &pod).await?;
    }
    Ok(())
}

/// Polls Lease `name` until its observed state satisfies `check`, for at
/// most `timeout`.
pub async fn until_observed(
    leases: &Api<Lease>,
    name: &str,
    check: impl Fn(&ObservedState) -> bool,
) -> Result<ObservedState> {
    until_observed_within(leases, name, Duration::from_secs(30), check).await
}

pub async fn until_observed_within(
    leases: &Api<Lease>,
    name: &str,
    timeout: Duration,
    check: impl Fn(&ObservedState) -> bool,
) -> Result<ObservedState> {
    let start = Instant::now();
    loop {
        let lease = leases.get(name).await?;
        let observed: Option<ObservedState> = lease
            .metadata
            .annotations
            .unwrap_or_default()
            .get(OBSERVED_ANNOTATION)
            .map(|t| serde_json::from_str(t))
            .transpose()?;
        if let Some(observed) = observed.as_ref().filter(|o| check(o)) {
            return Ok(observed.clone());
        }
        if start.elapsed() > timeout {
            return Err(format!(
                "Lease {name}: the observed state never matched; last: {observed:?}"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

impl Fixture {
    /// Starts a bare postgres (no instance) on a restored data folder, with
    /// its own port and socket, no archiving and a trusting loopback, and
    /// runs `query` (one count) in the application database once it opens.
    pub async fn count_rows_in_folder(&self, folder: &Path, query: &str) -> Result<i64> {
        for signal in ["standby.signal", "recovery.signal"] {
            let _ = std::fs::remove_file(folder.join(signal));
        }
        let hba = folder.join("restore_hba.conf");
        std::fs::write(&hba, "host all all 127.0.0.1/32 trust\n")?;
        std::fs::set_permissions(folder, std::fs::Permissions::from_mode(0o700))?;
        self.own(folder)?;
        let port = free_address()?.port();
        let mut command = Command::new(postgres_bindir().join("postgres"));
        command
            .arg("-D")
            .arg(folder)
            .args([
                "-c",
                &format!("port={port}"),
                "-c",
                "listen_addresses=127.0.0.1",
            ])
            .args(["-c", "archive_mode=off", "-c", "primary_conninfo="])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", folder.display()))
            .arg("-c")
            .arg(format!("hba_file={}", hba.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(folder.with_extension("log"))?)
            .kill_on_drop(true);
        if let Some((uid, gid)) = self.user {
            command.uid(uid).gid(gid);
        }
        let _server = command.spawn()?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let connected = tokio_postgres::Config::new()
                .host("127.0.0.1")
                .port(port)
                .user("postgres")
                .dbname(&self.credentials["database"])
                .connect_timeout(Duration::from_secs(2))
                .connect(tokio_postgres::NoTls)
                .await;
            match connected {
                Ok((client, connection)) => {
                    tokio::spawn(connection);
                    return Ok(client.query_one(query, &[]).await?.get(0));
                }
                Err(e) if Instant::now() > deadline => {
                    let log =
                        std::fs::read_to_string(folder.with_extension("log")).unwrap_or_default();
                    return Err(format!("the restored folder never opened: {e}\n{log}").into());
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// Ends a test that passed: its folder is removed. Without this call
    /// (an error or a panic) the folder is kept and the logs' tails printed.
    pub fn passed(&mut self) -> Result {
        self.passed = true;
        Ok(())
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        stop_what_runs_under(&self.root);
        if !self.passed {
            eprintln!("instance logs and data kept in {}", self.root.display());
            for log in std::fs::read_dir(self.root.join("logs"))
                .into_iter()
                .flatten()
                .flatten()
            {
                let text = std::fs::read_to_string(log.path()).unwrap_or_default();
                let tail: Vec<_> = text.lines().rev().take(40).collect();
                eprintln!("--- {} (last 40 lines)", log.path().display());
                for line in tail.iter().rev() {
                    eprintln!("{line}");
                }
            }
        } else {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// Stops every process whose command line names a path under `root`: an
/// instance dropped without being stopped (killed, as `kill_on_drop` does,
/// on a failed assertion or an early return) leaves its PostgreSQL running,
/// orphaned, and the run's leftovers check fails on it. SIGQUIT first
/// (PostgreSQL's immediate shutdown), SIGKILL after 5 s.
fn stop_what_runs_under(root: &Path) {
    let pattern = format!("{}/", root.display());
    let running = || {
        std::process::Command::new("pgrep")
            .args(["-f", "--", &pattern])
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    for signal in ["-QUIT", "-KILL"] {
        if !running() {
            return;
        }
        eprintln!("stopping what still runs under {pattern} ({signal})");
        let _ = std::process::Command::new("pkill")
            .args([signal, "-f", "--", &pattern])
            .status();
        for _ in 0..50 {
            if !running() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The DatabaseCluster `orders` in namespace `shop` whose files these are.
pub fn cluster(parameters: &[(&str, &str)]) -> Result<DatabaseCluster> {
    let parameters: BTreeMap<_, _> = parameters.iter().copied().collect();
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "database.cairn.dev/v1",
        "kind": "DatabaseCluster",
        "metadata": { "name": "orders", "namespace": "shop", "uid": "uid-1" },
        "spec": {
            "instances": 3,
            "postgres": { "version": "15", "parameters": parameters },
            "storage": { "size": "1Gi" },
        },
    }))?)
}

fn now_millis() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default()
}

#[derive(Clone)]
pub struct InstanceSpec {
    pub name: String,
    pub dir: PathBuf,
    pub port: u16,
    pub http: SocketAddr,
    pub metrics: SocketAddr,
    pub primary_port: Option<u16>,
    pub credentials_dir: PathBuf,
    pub env: Vec<(String, String)>,
}

impl InstanceSpec {
    pub fn following(mut self, primary: &Instance) -> Self {
        self.primary_port = Some(primary.spec.port);
        self
    }

    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data").join("pgdata")
    }
}

/// `/status.lastError`, or "" when there is none.
pub fn last_error(status: &Value) -> &str {
    status["lastError"].as_str().unwrap_or_default()
}

pub struct Instance {
    pub spec: InstanceSpec,
    pub log: PathBuf,
    child: Child,
    credentials: BTreeMap<String, String>,
}

impl Instance {
    pub async fn get(&self, path: &str) -> Result<(u16, String)> {
        Ok(http_get(self.spec.http, path).await?)
    }

    pub async fn status(&self) -> Result<Value> {
        let (_, body) = self.get("/status").await?;
        Ok(serde_json::from_str(&body)?)
    }

    pub async fn ready(&self) -> bool {
        matches!(self.get("/readyz").await, Ok((200, _)))
    }

    pub async fn metric(&self, series: &str) -> Result<Option<f64>> {
        let (_, body) = http_get(self.spec.metrics, "/metrics").await?;
        Ok(cairn_testing::process::sample(&body, series))
    }

    /// Waits until `/status` satisfies `check`; returns the time it took.
    pub async fn wait_status(
        &self,
        what: &str,
        timeout: Duration,
        check: impl Fn(&Value) -> bool,
    ) -> Result<Duration> {
        let start = Instant::now();
        let mut last = Value::Null;
        while start.elapsed() < timeout {
            if let Ok(status) = self.status().await {
                if check(&status) {
                    return Ok(start.elapsed());
                }
                last = status;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!(
            "{}: {what} not within {timeout:?}; last status {last}",
            self.spec.name
        )
        .into())
    }

    pub async fn wait_ready(&self, timeout: Duration) -> Result<Duration> {
        self.wait_status("ready", timeout, |s| s["ready"] == true)
            .await
    }

    /// A superuser session on the instance's server.
    pub async fn sql(&self) -> Result<tokio_postgres::Client> {
        let password = &self.credentials["superuser-password"];
        self.session("postgres", password, "postgres").await
    }

    /// A session of the application's owner on its database.
    pub async fn app(&self) -> Result<tokio_postgres::Client> {
        let c = &self.credentials;
        self.session(&c["username"], &c["password"], &c["database"])
            .await
    }

    pub async fn session(
        &self,
        user: &str,
        password: &str,
        database: &str,
    ) -> Result<tokio_postgres::Client> {
        let (client, connection) = tokio_postgres::Config::new()
            .host("127.0.0.1")
            .port(self.spec.port)
            .user(user)
            .password(password)
            .dbname(database)
            .connect_timeout(Duration::from_secs(5))
            .connect(tokio_postgres::NoTls)
            .await?;
        tokio::spawn(connection);
        Ok(client)
    }

    /// A superuser session over TLS that trusts only `ca` (PEM).
    pub async fn sql_verifying(&self, ca: &str) -> Result<tokio_postgres::Client> {
        let ca_file = self.spec.dir.join(format!("ca-{}.crt", now_millis()));
        std::fs::write(&ca_file, ca)?;
        let connector = cairn_instance::tls::verifying(&ca_file)?;
        let (client, connection) = tokio_postgres::Config::new()
            .host("localhost")
            .port(self.spec.port)
            .user("postgres")
            .password(&self.credentials["superuser-password"])
            .dbname("postgres")
            .ssl_mode(tokio_postgres::config::SslMode::Require)
            .connect_timeout(Duration::from_secs(5))
            .connect(connector)
            .await?;
        tokio::spawn(connection);
        Ok(client)
    }

    pub async fn postmaster_start_time(&self) -> Result<String> {
        let row = self
            .sql()
            .await?
            .query_one("SELECT pg_postmaster_start_time()::text", &[])
            .await?;
        Ok(row.get(0))
    }

    /// On a primary: ends `replica`'s replication connection and waits until
    /// it streams again over a new one.
    pub async fn cut_replication_until_it_resumes(&self, replica: &Instance) -> Result {
        let superuser = self.sql().await?;
        let before: i32 = superuser
            .query_one("SELECT pid FROM pg_stat_replication", &[])
            .await?
            .get(0);
        superuser
            .execute("SELECT pg_terminate_backend($1)", &[&before])
            .await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while superuser
            .query(
                "SELECT pid FROM pg_stat_replication WHERE state = 'streaming' AND pid <> $1",
                &[&before],
            )
            .await?
            .is_empty()
        {
            if Instant::now() > deadline {
                return Err(format!("replication did not resume: {}", replica.log_text()).into());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    pub async fn show(&self, setting: &str) -> Result<String> {
        let row = self
            .sql()
            .await?
            .query_one(&format!("SHOW {setting}"), &[])
            .await?;
        Ok(row.get(0))
    }

    /// The postmaster's pid, from its lock file.
    pub fn postmaster_pid(&self) -> Option<i32> {
        let text = std::fs::read_to_string(self.spec.data_dir().join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// The cairn-instance process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    pub fn signal(&self, signal: Signal) -> Result {
        let pid = self.child.id().ok_or("the instance has exited")?;
        kill(Pid::from_raw(pid as i32), signal)?;
        Ok(())
    }

    /// SIGTERM, then the exit status.
    pub async fn terminate(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        self.signal(Signal::SIGTERM)?;
        Ok(tokio::time::timeout(timeout, self.child.wait()).await??)
    }

    /// Waits for the process to exit by itself.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        Ok(tokio::time::timeout(timeout, self.child.wait()).await??)
    }

    /// Waits for the process's log (its own and its server's) to contain
    /// `text`.
    pub async fn wait_log(&self, text: &str, timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if self.log_text().contains(text) {
                return Ok(start.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!(
            "{}: no {text:?} in its log within {timeout:?}",
            self.spec.name
        )
        .into())
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// What pg_controldata says of the data folder's state.
    pub fn cluster_state(&self) -> Result<String> {
        let output = std::process::Command::new(postgres_bindir().join("pg_controldata"))
            .arg(self.spec.data_dir())
            .output()?;
        let text = String::from_utf8_lossy(&output.stdout);
        let state = text
            .lines()
            .find_map(|l| l.strip_prefix("Database cluster state:"))
            .ok_or_else(|| {
                format!(
                    "pg_controldata: {text} {}",
                    String::from_utf8_lossy(&output.stderr)
                )
            })?;
        Ok(state.trim().to_owned())
    }
}

/// A tmpfs mounted on a folder, unmounted when dropped.
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    pub fn mount(path: &Path, size: &str) -> Result<Self> {
        std::fs::create_dir_all(path)?;
        let output = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(path)
            .output()?;
        if !output.status.success() {
            return Err(format!(
                "mounting a {size} tmpfs on {} (needs root): {}",
                path.display(),
                String::from_utf8_lossy(&output.stderr)
            )
            .into());
        }
        Ok(Self(path.to_owned()))
    }
}

impl Tmpfs {
    /// Changes the size of the tmpfs mounted on `path`.
    pub fn resize(path: &Path, size: &str) -> Result {
        let status = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(path)
            .status()?;
        if !status.success() {
            return Err(format!("remounting {}: {status}", path.display()).into());
        }
        Ok(())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: processes of a failed test may still hold it.
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Runs pgbench against `instance` as the superuser (benchmarks).
pub async fn pgbench(fixture: &Fixture, instance: &Instance, args: &[&str]) -> Result<String> {
    let mut command = Command::new(postgres_bindir().join("pgbench"));
    command
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &instance.spec.port.to_string(),
            "-U",
            "postgres",
        ])
        .args(args)
        .arg("postgres")
        .env("PGPASSWORD", &fixture.credentials["superuser-password"]);
    output_text(&mut command, &format!("pgbench {args:?}")).await
}

/// A program's stdout and stderr, or an error with both when it fails.
pub async fn output_text(command: &mut Command, what: &str) -> Result<String> {
    let output = command.output().await?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(format!("{what}: {text}").into());
    }
    Ok(text)
}

/// A benchmark's scale: its first numeric argument, else `default`.
pub fn scale_arg(default: u32) -> u32 {
    std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(default)
}

/// Creates Backup `name` of cluster `orders` (`method`) and hands it to
/// `instance`, as the backup controller does.
pub async fn assign_backup(
    ns: &TestNamespace,
    name: &str,
    instance: &str,
    method: &str,
) -> Result<cairn_api::backup::v1::Backup> {
    let backups: Api<cairn_api::backup::v1::Backup> = ns.api();
    let backup = serde_json::from_value(json!({
        "apiVersion": "backup.cairn.dev/v1", "kind": "Backup",
        "metadata": { "name": name },
        "spec": { "cluster": { "name": "orders" }, "method": method },
    }))?;
    let backup = backups.create(&PostParams::default(), &backup).await?;
    let status = json!({
        "apiVersion": "backup.cairn.dev/v1", "kind": "Backup",
        "status": { "phase": "Running", "instance": instance,
                    "startedAt": k8s_openapi::jiff::Timestamp::now() },
    });
    backups
        .patch_status(
            name,
            &kube::api::PatchParams::apply("backup-test").force(),
            &kube::api::Patch::Apply(&status),
        )
        .await?;
    Ok(backup)
}

/// Bytes of database `postgres` (benchmarks).
pub async fn database_size(instance: &Instance) -> Result<i64> {
    let row = instance
        .sql()
        .await?
        .query_one("SELECT pg_database_size('postgres')", &[])
        .await?;
    Ok(row.get(0))
}
