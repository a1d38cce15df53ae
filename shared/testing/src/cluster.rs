//! Finding (or starting) the local control plane and making clients for it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

use crate::{Error, Nodes, TestNamespace};

/// A running local cluster, as described by the `env` file that
/// `hack/local-cluster.sh up` writes into its state folder.
#[derive(Debug)]
pub struct LocalCluster {
    state_dir: PathBuf,
    pub(crate) kubeconfig: Kubeconfig,
    s3_endpoint: String,
    bin_dir: PathBuf,
}

/// The local cluster every test in this process uses.
///
/// If `CAIRN_CLUSTER_STATE` is set (the test entry point exports it), that
/// cluster is used. Otherwise the local development cluster is started, or
/// reused if it runs already, with `hack/local-cluster.sh up`; it is left
/// running for the next test run (`hack/local-cluster.sh down` stops it).
///
/// # Panics
/// When no cluster can be found or started: every test needs one, and the
/// message says what went wrong.
pub fn cluster() -> &'static LocalCluster {
    static CLUSTER: OnceLock<LocalCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        LocalCluster::locate().unwrap_or_else(|e| panic!("no local cluster for tests: {e}"))
    })
}

impl LocalCluster {
    fn locate() -> Result<Self, Error> {
        let state_dir = match std::env::var_os("CAIRN_CLUSTER_STATE") {
            Some(dir) => PathBuf::from(dir),
            None => start_dev_cluster()?,
        };
        Self::from_state_dir(&state_dir)
    }

    /// Reads a cluster's `env` file and admin kubeconfig.
    pub fn from_state_dir(state_dir: &Path) -> Result<Self, Error> {
        let env_path = state_dir.join("env");
        let text = std::fs::read_to_string(&env_path).map_err(|e| {
            Error::Setup(format!(
                "cannot read {}: {e} (is the cluster up?)",
                env_path.display()
            ))
        })?;
        let env = parse_env(&text);
        let get = |key: &str| {
            env.get(key)
                .cloned()
                .ok_or_else(|| Error::Setup(format!("{} has no {key}", env_path.display())))
        };
        let kubeconfig_path = get("KUBECONFIG")?;
        let kubeconfig = Kubeconfig::read_from(&kubeconfig_path)
            .map_err(|e| Error::Setup(format!("cannot read {kubeconfig_path}: {e}")))?;
        Ok(Self {
            state_dir: state_dir.to_owned(),
            kubeconfig,
            s3_endpoint: get("CAIRN_S3_ENDPOINT")?,
            bin_dir: get("CAIRN_BIN")?.into(),
        })
    }

    /// The admin's client configuration (a member of `system:masters`).
    pub async fn admin_config(&self) -> Result<Config, Error> {
        let options = KubeConfigOptions::default();
        Config::from_custom_kubeconfig(self.kubeconfig.clone(), &options)
            .await
            .map_err(|e| Error::Setup(format!("admin kubeconfig: {e}")))
    }

    /// A client with full rights, for setting up and observing tests.
    pub async fn admin_client(&self) -> Result<Client, Error> {
        Ok(Client::try_from(self.admin_config().await?)?)
    }

    /// A client that impersonates ServiceAccount `namespace/name`: the API
    /// server authorizes its requests exactly as it would the account's own
    /// token, so tests prove a component works with the RBAC it is given.
    /// The account must exist (impersonation alone would not check that).
    pub async fn client_as_service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Client, Error> {
        let mut config = self.admin_config().await?;
        let accounts =
            Api::<ServiceAccount>::namespaced(Client::try_from(config.clone())?, namespace);
        if accounts.get_opt(name).await?.is_none() {
            return Err(Error::Setup(format!(
                "ServiceAccount {namespace}/{name} does not exist"
            )));
        }
        config.auth_info.impersonate = Some(format!("system:serviceaccount:{namespace}:{name}"));
        config.auth_info.impersonate_groups = Some(vec![
            "system:serviceaccounts".to_owned(),
            format!("system:serviceaccounts:{namespace}"),
            "system:authenticated".to_owned(),
        ]);
        Ok(Client::try_from(config)?)
    }

    /// A client holding ServiceAccount `namespace/account`'s token bound to
    /// pod `pod`, as the kubelet mounts it into that pod: the API server knows
    /// the pod it comes from (`authentication.kubernetes.io/pod-name`), which
    /// admission policies may check.
    pub async fn client_with_pod_token(
        &self,
        namespace: &str,
        account: &str,
        pod: &str,
    ) -> Result<Client, Error> {
        use k8s_openapi::api::authentication::v1::{
            BoundObjectReference, TokenRequest, TokenRequestSpec,
        };
        let mut config = self.admin_config().await?;
        let admin = Client::try_from(config.clone())?;
        let uid = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(admin.clone(), namespace)
            .get(pod)
            .await?
            .metadata
            .uid;
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".to_owned()),
                    kind: Some("Pod".to_owned()),
                    name: Some(pod.to_owned()),
                    uid,
                }),
                expiration_seconds: Some(600),
                ..TokenRequestSpec::default()
            }),
            ..TokenRequest::default()
        };
        let issued = Api::<ServiceAccount>::namespaced(admin, namespace)
            .create_token_request(account, &kube::api::PostParams::default(), &request)
            .await?;
        let token = issued
            .status
            .and_then(|s| s.token)
            .ok_or_else(|| Error::Setup(format!("no token issued for {namespace}/{account}")))?;
        config.auth_info = kube::config::AuthInfo {
            token: Some(token.into()),
            ..kube::config::AuthInfo::default()
        };
        Ok(Client::try_from(config)?)
    }

    /// A fresh namespace named `<prefix>-<random>` whose pods run on kwok's
    /// nodes, deleted when the returned value is dropped (see
    /// [`TestNamespace`] for when it is kept).
    pub async fn namespace(&'static self, prefix: &str) -> Result<TestNamespace, Error> {
        TestNamespace::create(self, prefix, Nodes::Kwok).await
    }

    /// Like [`namespace`](Self::namespace), with its pods on the real nodes:
    /// for what happens inside a pod (processes, volumes, networking).
    pub async fn namespace_on_real_nodes(
        &'static self,
        prefix: &str,
    ) -> Result<TestNamespace, Error> {
        TestNamespace::create(self, prefix, Nodes::Real).await
    }

    /// The moto server's URL: an S3 (and other AWS services) endpoint.
    pub fn s3_endpoint(&self) -> &str {
        &self.s3_endpoint
    }

    /// The folder with the cluster's certificates, kubeconfig, logs and audit log.
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// The API server's audit log (metadata of every write request).
    pub fn audit_log(&self) -> PathBuf {
        self.state_dir.join("logs/audit.log")
    }

    /// Runs the pinned kubectl against this cluster as the admin; returns
    /// stdout and stderr, or an error with stderr if it failed.
    pub async fn kubectl(&self, args: &[&str]) -> Result<KubectlOutput, Error> {
        // A discovery cache of its own per call: tests install CRDs as they
        // go, and a cached discovery would not know them (`kubectl get
        // <category>` silently lists fewer kinds).
        static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let cache = self
            .state_dir
            .join("kubectl-cache")
            .join(format!("{}-{call}", std::process::id()));
        let output = tokio::process::Command::new(self.bin_dir.join("kubectl"))
            .env("KUBECONFIG", self.state_dir.join("kubeconfig"))
            .arg("--cache-dir")
            .arg(&cache)
            .args(args)
            .output()
            .await
            .map_err(|e| Error::Setup(format!("cannot run kubectl: {e}")))?;
        let _ = std::fs::remove_dir_all(&cache);
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        if !output.status.success() {
            return Err(Error::Setup(format!(
                "kubectl {} failed: {stderr}",
                args.join(" ")
            )));
        }
        Ok(KubectlOutput {
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr,
        })
    }

    /// Stops the API server (etcd and the other components keep running), to
    /// test what clients do while it is unreachable.
    pub fn stop_apiserver(&self) -> Result<(), Error> {
        run_script(&["stop-apiserver", &self.state_dir.to_string_lossy()]).map(drop)
    }

    /// Starts the API server again, on the same address; returns once ready.
    pub fn start_apiserver(&self) -> Result<(), Error> {
        run_script(&["start-apiserver", &self.state_dir.to_string_lossy()]).map(drop)
    }

    /// Freezes real node `node` (1-based) as a machine that stopped would be:
    /// its kubelet, containerd and every container stop running, nothing is
    /// deleted, and the API server only sees its heartbeats cease.
    pub fn stop_node(&self, node: u32) -> Result<(), Error> {
        run_script(&[
            "stop-node",
            &self.state_dir.to_string_lossy(),
            &node.to_string(),
        ])
        .map(drop)
    }

    /// Lets a node frozen by [`Self::stop_node`] run again.
    pub fn start_node(&self, node: u32) -> Result<(), Error> {
        run_script(&[
            "start-node",
            &self.state_dir.to_string_lossy(),
            &node.to_string(),
        ])
        .map(drop)
    }

    /// SIGKILL to every process of container `container` of pod
    /// `namespace/pod` on a real node, through its containerd: a crash or an
    /// OOM kill (no shutdown, no cleanup). The kubelet then restarts it.
    pub fn kill_container(&self, namespace: &str, pod: &str, container: &str) -> Result<(), Error> {
        self.signal_container(namespace, pod, container, "SIGKILL")
    }

    /// `signal` (e.g. `SIGTERM`) to every process of the container.
    pub fn signal_container(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        signal: &str,
    ) -> Result<(), Error> {
        let state = self.state_dir.to_string_lossy();
        run_script(&["kill-container", &state, namespace, pod, container, signal]).map(drop)
    }

    /// Stalls every process of the container (the cgroup freezer): it holds
    /// its connections and answers nothing, as a process stuck in a long
    /// garbage collection or on a dead disk would, until
    /// [`Self::thaw_task`] of the task returned.
    pub fn freeze_container(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
    ) -> Result<FrozenTask, Error> {
        let state = self.state_dir.to_string_lossy();
        let task = run_script(&["freeze-container", &state, namespace, pod, container])?;
        Ok(FrozenTask(task.trim().to_owned()))
    }

    /// Lets a frozen container run again (through its node's containerd
    /// only: the API server may be down); a container gone since is done.
    pub fn thaw_task(&self, task: &FrozenTask) -> Result<(), Error> {
        let state = self.state_dir.to_string_lossy();
        let (socket, id) = task
            .0
            .split_once(' ')
            .ok_or_else(|| Error::Setup(format!("not a task: {}", task.0)))?;
        run_script(&["thaw-task", &state, socket, id]).map(drop)
    }

    /// Stops kube-controller-manager (SIGSTOP to its process group), as a
    /// manager stuck or partitioned would be: its garbage collector and
    /// workload controllers act on nothing until the returned guard is
    /// dropped, which lets it run again.
    pub fn freeze_controller_manager(&self) -> Result<FrozenProcess, Error> {
        let file = self.state_dir.join("pids/kube-controller-manager.pid");
        let line = std::fs::read_to_string(&file)
            .map_err(|e| Error::Setup(format!("{}: {e}", file.display())))?;
        let pid = line
            .split_whitespace()
            .next()
            .ok_or_else(|| Error::Setup(format!("{}: no pid", file.display())))?
            .to_owned();
        signal_group(&pid, "STOP")?;
        Ok(FrozenProcess { pid })
    }

    /// Drops every packet from the pod at `pod_ip` to the API server (and
    /// only those: the database network stays up), established connections
    /// included, until [`Self::heal_from_apiserver`].
    pub fn cut_from_apiserver(&self, pod_ip: &str) -> Result<(), Error> {
        run_script(&[
            "cut-from-apiserver",
            &self.state_dir.to_string_lossy(),
            pod_ip,
        ])
        .map(drop)
    }

    pub fn heal_from_apiserver(&self, pod_ip: &str) -> Result<(), Error> {
        run_script(&[
            "heal-from-apiserver",
            &self.state_dir.to_string_lossy(),
            pod_ip,
        ])
        .map(drop)
    }

    /// Drops every packet between two pods, both ways.
    pub fn cut_between(&self, pod_ip: &str, other_ip: &str) -> Result<(), Error> {
        run_script(&[
            "cut-between",
            &self.state_dir.to_string_lossy(),
            pod_ip,
            other_ip,
        ])
        .map(drop)
    }

    pub fn heal_between(&self, pod_ip: &str, other_ip: &str) -> Result<(), Error> {
        run_script(&[
            "heal-between",
            &self.state_dir.to_string_lossy(),
            pod_ip,
            other_ip,
        ])
        .map(drop)
    }

    /// The number (1-based) of the real node a node name denotes.
    pub fn real_node_number(node_name: &str) -> Option<u32> {
        node_name.strip_prefix("cairn-node-")?.parse().ok()
    }

    /// The folder with the pinned kubectl, helm and control plane binaries.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }
}

/// What a kubectl run printed.
#[derive(Debug)]
pub struct KubectlOutput {
    pub stdout: String,
    pub stderr: String,
}

/// Starts (or reuses) the development cluster and returns its state folder.
fn start_dev_cluster() -> Result<PathBuf, Error> {
    run_script(&["up"])?;
    parse_env(&run_script(&["env"])?)
        .remove("CAIRN_CLUSTER_STATE")
        .map(PathBuf::from)
        .ok_or_else(|| Error::Setup("local-cluster.sh env printed no CAIRN_CLUSTER_STATE".into()))
}

/// A container frozen by [`LocalCluster::freeze_container`]: its node's
/// containerd socket and its task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrozenTask(String);

/// A component frozen by [`LocalCluster::freeze_controller_manager`]; it
/// runs again when this is dropped (a failing test included).
#[derive(Debug)]
pub struct FrozenProcess {
    pid: String,
}

impl Drop for FrozenProcess {
    fn drop(&mut self) {
        if let Err(e) = signal_group(&self.pid, "CONT") {
            eprintln!("cannot thaw process group {}: {e}", self.pid);
        }
    }
}

/// Sends `signal` to the process group led by `pid` (the local cluster
/// starts each component in its own group).
fn signal_group(pid: &str, signal: &str) -> Result<(), Error> {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg("--")
        .arg(format!("-{pid}"))
        .status()
        .map_err(|e| Error::Setup(format!("cannot run kill: {e}")))?;
    match status.success() {
        true => Ok(()),
        false => Err(Error::Setup(format!(
            "kill -{signal} -- -{pid} failed ({status})"
        ))),
    }
}

/// Runs `hack/local-cluster.sh ARGS`; its standard output.
fn run_script(args: &[&str]) -> Result<String, Error> {
    let script = crate::repo_root().join("hack/local-cluster.sh");
    let run = |args: &[&str]| {
        let command = args.join(" ");
        Command::new("bash")
            .arg(&script)
            .args(args)
            .stderr(std::process::Stdio::inherit())
            .output()
            .map_err(|e| Error::Setup(format!("cannot run {}: {e}", script.display())))
            .and_then(|out| match out.status.success() {
                true => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
                false => Err(Error::Setup(format!(
                    "{} {command} failed ({})",
                    script.display(),
                    out.status
                ))),
            })
    };
    run(args)
}

/// Parses `export KEY=VALUE` lines (values are written unquoted).
fn parse_env(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let line = line.strip_prefix("export ").unwrap_or(line);
            let (key, value) = line.split_once('=')?;
            Some((key.trim().to_owned(), value.trim().to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::parse_env;

    #[test]
    fn parses_exported_and_plain_assignments() {
        let env = parse_env("export KUBECONFIG=/x/kubeconfig\nCAIRN_BIN=/b\n\n# comment\n");
        assert_eq!(env["KUBECONFIG"], "/x/kubeconfig");
        assert_eq!(env["CAIRN_BIN"], "/b");
        assert_eq!(env.len(), 2);
    }
}
