//! Controller binaries run as separate processes against the local cluster,
//! authenticated as a ServiceAccount (impersonation in their kubeconfig), so
//! tests exercise exactly the RBAC a chart grants and real signals.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use crate::{Error, LocalCluster};

/// A running controller process; killed when dropped.
pub struct ControllerProcess {
    pub name: String,
    /// Where `/livez`, `/readyz` and `/metrics` are served.
    pub admin: SocketAddr,
    pub log: PathBuf,
    child: Child,
}

impl LocalCluster {
    /// A kubeconfig file for ServiceAccount `namespace/name`: the admin's
    /// credentials impersonating the account and its groups.
    pub fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<PathBuf, Error> {
        let mut kubeconfig = self.kubeconfig.clone();
        for named in &mut kubeconfig.auth_infos {
            if let Some(auth) = named.auth_info.as_mut() {
                auth.impersonate = Some(format!("system:serviceaccount:{namespace}:{name}"));
                auth.impersonate_groups = Some(vec![
                    "system:serviceaccounts".to_owned(),
                    format!("system:serviceaccounts:{namespace}"),
                    "system:authenticated".to_owned(),
                ]);
            }
        }
        let yaml = serde_yaml_ng::to_string(&kubeconfig)
            .map_err(|e| Error::Setup(format!("kubeconfig for {namespace}/{name}: {e}")))?;
        let dir = self.state_dir().join("kubeconfigs");
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::Setup(format!("{}: {e}", dir.display())))?;
        let path = dir.join(format!("{namespace}-{name}.yaml"));
        std::fs::write(&path, yaml)
            .map_err(|e| Error::Setup(format!("{}: {e}", path.display())))?;
        Ok(path)
    }
}

impl ControllerProcess {
    /// Starts `binary` with `kubeconfig`, text logs at debug for Cairn, the
    /// admin server on a free loopback port, and `env` on top. Its output goes
    /// to `<cluster state>/logs/controllers/<name>.log` (kept when a test run fails).
    pub fn start(
        cluster: &LocalCluster,
        binary: &Path,
        name: &str,
        kubeconfig: &Path,
        env: &[(&str, &str)],
    ) -> Result<Self, Error> {
        let admin = free_address()?;
        let dir = cluster.state_dir().join("logs").join("controllers");
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::Setup(format!("{}: {e}", dir.display())))?;
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log)
            .map_err(|e| Error::Setup(format!("{}: {e}", log.display())))?;
        let stderr = file
            .try_clone()
            .map_err(|e| Error::Setup(format!("{}: {e}", log.display())))?;
        let mut command = Command::new(binary);
        command
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("KUBECONFIG", kubeconfig)
            .env("POD_NAME", name)
            .env("CAIRN_ADMIN_ADDRESS", admin.to_string())
            .env("CAIRN_LOG_FORMAT", "text")
            .env("CAIRN_LOG_LEVEL", "info,cairn=debug")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(stderr)
            .kill_on_drop(true);
        let child = command
            .spawn()
            .map_err(|e| Error::Setup(format!("cannot start {}: {e}", binary.display())))?;
        Ok(Self {
            name: name.to_owned(),
            admin,
            log,
            child,
        })
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// GET `path` on the admin server: the status code and body.
    pub async fn get(&self, path: &str) -> Result<(u16, String), Error> {
        http_get(self.admin, path).await
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> Result<String, Error> {
        let (status, body) = self.get("/metrics").await?;
        if status != 200 {
            return Err(Error::Setup(format!(
                "{}: /metrics answered {status}",
                self.name
            )));
        }
        Ok(body)
    }

    /// The value of the sample `series` (name with labels, as rendered) in
    /// `/metrics`, if present.
    pub async fn metric(&self, series: &str) -> Result<Option<f64>, Error> {
        Ok(sample(&self.metrics().await?, series))
    }

    /// Sends SIGTERM (a graceful shutdown, as the kubelet does).
    pub fn terminate(&self) -> Result<(), Error> {
        self.signal("TERM")
    }

    /// Sends SIGKILL (a crash, or a node lost).
    pub fn kill(&self) -> Result<(), Error> {
        self.signal("KILL")
    }

    /// Sends SIGSTOP: the process stops dead (a stalled node, a long GC
    /// pause) with its connections open, until [`ControllerProcess::thaw`].
    pub fn freeze(&self) -> Result<(), Error> {
        self.signal("STOP")
    }

    /// Sends SIGCONT to a frozen process.
    pub fn thaw(&self) -> Result<(), Error> {
        self.signal("CONT")
    }

    fn signal(&self, signal: &str) -> Result<(), Error> {
        let pid = self
            .pid()
            .ok_or_else(|| Error::Setup(format!("{} has exited", self.name)))?;
        let status = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .map_err(|e| Error::Setup(format!("kill: {e}")))?;
        if status.success() {
            Ok(())
        } else {
            Err(Error::Setup(format!(
                "kill -{signal} {pid} failed: {status}"
            )))
        }
    }

    /// Waits at most `timeout` for the process to exit.
    pub async fn wait(&mut self, timeout: Duration) -> Result<ExitStatus, Error> {
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(status) => {
                status.map_err(|e| Error::Setup(format!("waiting for {}: {e}", self.name)))
            }
            Err(_) => Err(Error::Setup(format!(
                "{} still runs {timeout:?} later; log tail:\n{}",
                self.name,
                self.log_tail(30)
            ))),
        }
    }

    /// The last `lines` lines of the process's output, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

/// Says, in the test's captured output (printed only if it fails), whether
/// the process had exited and how its log ended: a test that timed out
/// waiting on a controller shows why without the kept logs.
impl Drop for ControllerProcess {
    fn drop(&mut self) {
        let state = match self.child.try_wait() {
            Ok(Some(status)) => format!("had exited ({status})"),
            Ok(None) => "was running".to_owned(),
            Err(e) => format!("in an unknown state ({e})"),
        };
        eprintln!(
            "controller {} {state}; its log ended:\n{}",
            self.name,
            self.log_tail(20)
        );
    }
}

/// The value of `series` in Prometheus text `metrics`.
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

/// Ports handed out below the kernel's ephemeral range (32768-60999 by
/// default) and the NodePort range: an ephemeral port free now can be taken
/// by any outgoing connection before the server under test binds it.
const TEST_PORTS: std::ops::Range<u16> = 15000..30000;

/// This process's share of [`TEST_PORTS`]: hack/run-tests.sh runs test
/// binaries in lanes side by side (`CAIRN_TEST_LANE` of `CAIRN_TEST_LANES`),
/// and a port one binary found free must not be found free by another
/// before its server binds it.
fn lane_ports() -> std::ops::Range<u16> {
    let setting = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u16>().ok());
    let lanes = setting("CAIRN_TEST_LANES").unwrap_or(1).max(1);
    let lane = setting("CAIRN_TEST_LANE").unwrap_or(0).min(lanes - 1);
    let share = (TEST_PORTS.end - TEST_PORTS.start) / lanes;
    let start = TEST_PORTS.start + lane * share;
    start..start + share
}

/// A loopback address with a port free right now, outside the ephemeral
/// range, in this lane's share and never handed out twice by this process.
pub fn free_address() -> Result<SocketAddr, Error> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ports = lane_ports();
    let span = u32::from(ports.end - ports.start);
    // Test binaries of a lane run one after another; the pid spreads them apart.
    let start = std::process::id().wrapping_mul(7919) % span;
    for _ in 0..span {
        let offset = (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let port = ports.start + offset as u16;
        if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            return listener
                .local_addr()
                .map_err(|e| Error::Setup(format!("no free port: {e}")));
        }
    }
    Err(Error::Setup(format!("no free port in {ports:?}")))
}

/// A minimal HTTP/1.0 GET (the admin server speaks plain HTTP).
pub async fn http_get(address: SocketAddr, path: &str) -> Result<(u16, String), Error> {
    let fail = |e: std::io::Error| Error::Setup(format!("GET http://{address}{path}: {e}"));
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address)
            .await
            .map_err(fail)?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.map_err(fail)?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.map_err(fail)?;
        Ok::<_, Error>(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .map_err(|_| Error::Setup(format!("GET http://{address}{path}: no answer in 5 s")))??;
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| {
            Error::Setup(format!(
                "GET http://{address}{path}: not HTTP: {response:.200}"
            ))
        })?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_read_by_exact_series() {
        let text = "# TYPE cairn_leader gauge\ncairn_leader{controller=\"database\"} 1\ncairn_leader_x{controller=\"database\"} 5\n";
        assert_eq!(
            sample(text, "cairn_leader{controller=\"database\"}"),
            Some(1.0)
        );
        assert_eq!(sample(text, "cairn_leader"), None);
    }
}
