//! Child processes and their exit statuses, for a process that may be PID 1.
//!
//! As PID 1 (or a child subreaper, which this makes itself so the same code
//! runs in tests) it inherits every orphan and must reap it. One task owns
//! `waitpid(-1)`: it hands each exit status to whoever spawned that child and
//! counts the rest as reaped orphans. Nothing else may wait for children, so
//! children are spawned here, never with `tokio::process`.

use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::sync::oneshot;

/// How a child ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(Signal),
}

impl Exit {
    pub fn success(self) -> bool {
        self == Exit::Code(0)
    }
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exit::Code(code) => write!(f, "exit code {code}"),
            Exit::Signal(signal) => write!(f, "killed by {signal}"),
        }
    }
}

#[derive(Default)]
struct Registry {
    waiting: HashMap<Pid, oneshot::Sender<Exit>>,
    orphans_reaped: u64,
}

/// The reaper; cheap to clone.
#[derive(Clone)]
pub struct Children {
    registry: Arc<Mutex<Registry>>,
}

/// A running child.
pub struct Child {
    pub pid: Pid,
    exit: oneshot::Receiver<Exit>,
    status: Option<Exit>,
    signaller: Signaller,
}

/// Sends signals to one child, never to a process that took its pid after
/// it was reaped; cheap to clone.
#[derive(Clone)]
pub struct Signaller {
    pid: Pid,
    registry: Arc<Mutex<Registry>>,
}

impl Signaller {
    pub fn signal(&self, signal: Signal) {
        // The reaper takes this lock around waitpid: while the pid is still
        // registered, the child is alive or a zombie, so the pid is its own.
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        if registry.waiting.contains_key(&self.pid) {
            let _ = kill(self.pid, signal);
        }
    }

    pub fn pid(&self) -> Pid {
        self.pid
    }
}

impl Child {
    pub fn signal(&self, signal: Signal) {
        self.signaller.signal(signal);
    }

    pub fn signaller(&self) -> Signaller {
        self.signaller.clone()
    }

    /// Waits for the exit status (cancel-safe).
    pub async fn wait(&mut self) -> Exit {
        if let Some(exit) = self.status {
            return exit;
        }
        // The reaper never drops a registered sender without sending.
        let exit = (&mut self.exit).await.unwrap_or(Exit::Code(-1));
        self.status = Some(exit);
        exit
    }
}

/// A finished command's status and output (stdout then stderr).
pub struct Output {
    pub exit: Exit,
    pub output: String,
}

impl Children {
    /// Becomes a child subreaper and starts reaping. Needs a Tokio runtime.
    pub fn start() -> std::io::Result<Self> {
        nix::sys::prctl::set_child_subreaper(true).map_err(std::io::Error::from)?;
        let children = Self {
            registry: Arc::default(),
        };
        let mut sigchld = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())?;
        let reaper = children.clone();
        tokio::spawn(async move {
            loop {
                // Signals coalesce; the timer is a safety net, not the path.
                let _ = tokio::time::timeout(Duration::from_secs(1), sigchld.recv()).await;
                reaper.reap();
            }
        });
        Ok(children)
    }

    /// Starts `command`. Its exit is awaited with [`Child::wait`].
    pub fn spawn(&self, command: &mut Command) -> std::io::Result<Child> {
        // The std handle is dropped without waiting: the reaper owns that.
        self.spawn_registered(command).map(|(_, child)| child)
    }

    /// Starts `command` with a pipe to its stdin, which it gets with it.
    pub fn spawn_with_stdin(
        &self,
        command: &mut Command,
    ) -> std::io::Result<(Child, std::process::ChildStdin)> {
        command.stdin(Stdio::piped());
        let (mut std_child, child) = self.spawn_registered(command)?;
        let stdin = std_child
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("no stdin pipe"))?;
        Ok((child, stdin))
    }

    fn spawn_registered(
        &self,
        command: &mut Command,
    ) -> std::io::Result<(std::process::Child, Child)> {
        // Holding the lock across the fork: the reaper cannot take this
        // child's status for an orphan's before it is registered.
        let mut registry = self.lock();
        let std_child = command.spawn()?;
        let pid = Pid::from_raw(std_child.id() as i32);
        let (sender, exit) = oneshot::channel();
        registry.waiting.insert(pid, sender);
        let child = Child {
            pid,
            exit,
            status: None,
            signaller: Signaller {
                pid,
                registry: self.registry.clone(),
            },
        };
        Ok((std_child, child))
    }

    /// Runs `command` to its end, collecting its output. Cancelling the
    /// future stops the command (SIGTERM): nothing runs on unobserved.
    pub async fn run(&self, command: &mut Command) -> std::io::Result<Output> {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let (mut std_child, mut child) = self.spawn_registered(command)?;
        let stdout = std_child.stdout.take();
        let stderr = std_child.stderr.take();
        drop(std_child);
        let read = |pipe: Option<Box<dyn Read + Send>>| {
            tokio::task::spawn_blocking(move || {
                let mut text = String::new();
                if let Some(mut pipe) = pipe {
                    let mut bytes = Vec::new();
                    let _ = pipe.read_to_end(&mut bytes);
                    text = String::from_utf8_lossy(&bytes).into_owned();
                }
                text
            })
        };
        let stdout = read(stdout.map(|p| Box::new(p) as Box<dyn Read + Send>));
        let stderr = read(stderr.map(|p| Box::new(p) as Box<dyn Read + Send>));
        let mut guard = TerminateOnDrop(Some(child.signaller()));
        let exit = child.wait().await;
        guard.0 = None;
        let mut output = stdout.await.unwrap_or_default();
        output.push_str(&stderr.await.unwrap_or_default());
        Ok(Output { exit, output })
    }

    /// Starts `command` with its stdout and stderr piped to the caller, for
    /// output too large to collect (a base backup's tar stream). Dropping
    /// the result before its exit stops the command (SIGTERM).
    pub fn spawn_piped(&self, command: &mut Command) -> std::io::Result<Piped> {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let (mut std_child, child) = self.spawn_registered(command)?;
        let missing = || std::io::Error::other("no pipe");
        let stdout = std_child.stdout.take().ok_or_else(missing)?;
        let stderr = std_child.stderr.take().ok_or_else(missing)?;
        let guard = TerminateOnDrop(Some(child.signaller()));
        Ok(Piped {
            child,
            stdin: None,
            stdout: Some(stdout),
            stderr: Some(stderr),
            guard,
        })
    }

    /// Starts `command` with its stdin and stderr piped from and to the
    /// caller, for input too large to hold (a dump fed to pg_restore).
    /// Dropping the result before its exit stops the command (SIGTERM).
    pub fn spawn_fed(&self, command: &mut Command) -> std::io::Result<Piped> {
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let (mut std_child, child) = self.spawn_registered(command)?;
        let missing = || std::io::Error::other("no pipe");
        let stdin = std_child.stdin.take().ok_or_else(missing)?;
        let stderr = std_child.stderr.take().ok_or_else(missing)?;
        let guard = TerminateOnDrop(Some(child.signaller()));
        Ok(Piped {
            child,
            stdin: Some(stdin),
            stdout: None,
            stderr: Some(stderr),
            guard,
        })
    }

    /// Orphans reaped so far (processes this one never started).
    pub fn orphans_reaped(&self) -> u64 {
        self.lock().orphans_reaped
    }

    fn reap(&self) {
        loop {
            // Under the lock, so a Signaller never sees a reaped pid as registered.
            let mut registry = self.lock();
            let (pid, exit) = match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => (pid, Exit::Code(code)),
                Ok(WaitStatus::Signaled(pid, signal, _)) => (pid, Exit::Signal(signal)),
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return,
                Ok(_) | Err(Errno::EINTR) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "waitpid failed");
                    return;
                }
            };
            match registry.waiting.remove(&pid) {
                Some(sender) => {
                    let _ = sender.send(exit);
                }
                None => {
                    registry.orphans_reaped += 1;
                    tracing::debug!(pid = pid.as_raw(), %exit, "reaped an orphan");
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A child started by [`Children::spawn_piped`].
pub struct Piped {
    child: Child,
    pub stdin: Option<std::process::ChildStdin>,
    pub stdout: Option<std::process::ChildStdout>,
    pub stderr: Option<std::process::ChildStderr>,
    guard: TerminateOnDrop,
}

impl Piped {
    /// Waits for the exit status (cancel-safe; cancelled, the child lives
    /// on until this is dropped).
    pub async fn wait(&mut self) -> Exit {
        let exit = self.child.wait().await;
        self.guard.0 = None;
        exit
    }

    /// Stops the child (SIGTERM) and waits for its exit.
    pub async fn stop(&mut self) -> Exit {
        self.child.signaller().signal(Signal::SIGTERM);
        self.wait().await
    }
}

/// Stops a child whose waiter was cancelled.
struct TerminateOnDrop(Option<Signaller>);

impl Drop for TerminateOnDrop {
    fn drop(&mut self) {
        if let Some(signaller) = &self.0 {
            signaller.signal(Signal::SIGTERM);
        }
    }
}
