//! The fence, an actuator apart from the supervisor's loop: a thread of its
//! own that stops postgres at once (immediate shutdown, SIGQUIT) when it runs
//! as a primary and the heartbeat forbids it, whatever the loop is doing (a
//! query that hangs, a connection without an answer, a shutdown under way).
//!
//! A thread stops with its process: with cairn-instance frozen (SIGSTOP, a
//! runtime that never yields) postgres would go on. So the thread also tells
//! a watchdog, a process of its own (`cairn-instance fence-watchdog`), how
//! much longer writes stay allowed; told nothing new by then, the watchdog
//! stops the postmaster itself.

use std::io::{BufRead, Write};
use std::path::Path;
use std::process::{ChildStdin, Command, ExitCode};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::children::{Children, Signaller};
use crate::membership::Heartbeat;

/// How often the fence looks: its reaction time, which the safety argument
/// counts (see `peers::HOLD`).
pub const CHECK: Duration = Duration::from_millis(100);
/// The watchdog acts this long after the thread would have: the thread,
/// when it runs, always acts first.
const WATCHDOG_LAG: Duration = Duration::from_millis(500);
/// The longest allowance told to the watchdog (it is told again every
/// `CHECK`), so a frozen process outside a pod is also bounded.
const LONGEST: Duration = Duration::from_secs(3600);

/// The postmaster to stop, while it runs as a primary.
#[derive(Default)]
pub struct Fence {
    armed: Mutex<Option<Signaller>>,
}

impl Fence {
    /// Starts the fence's thread for `heartbeat`, and the watchdog as a
    /// child of `children` when given.
    pub fn start(heartbeat: Arc<Heartbeat>, children: Option<&Children>) -> Arc<Self> {
        let fence = Arc::new(Self::default());
        let mut watchdog = children.and_then(start_watchdog);
        let watched = fence.clone();
        let spawned = std::thread::Builder::new()
            .name("fence".to_owned())
            .spawn(move || {
                loop {
                    std::thread::sleep(CHECK);
                    let told = watched.check(&heartbeat);
                    if let Some(pipe) = &mut watchdog
                        && writeln!(pipe, "{told}").is_err()
                    {
                        tracing::error!("the fence's watchdog is gone");
                        watchdog = None;
                    }
                }
            });
        if let Err(error) = spawned {
            // The supervisor's own check still fences, at its poll.
            tracing::error!(%error, "cannot start the fence's thread");
        }
        fence
    }

    /// postgres (`postmaster`) runs, or is about to run, as a primary.
    pub fn arm(&self, postmaster: Signaller) {
        *self.lock() = Some(postmaster);
    }

    /// postgres stopped, or runs as a replica.
    pub fn disarm(&self) {
        self.lock().take();
    }

    /// Stops postgres if the heartbeat forbids writes; returns what the
    /// watchdog is told: `<postmaster pid> <milliseconds allowed>`, or `0 0`.
    fn check(&self, heartbeat: &Heartbeat) -> String {
        let mut armed = self.lock();
        let Some(postmaster) = armed.as_ref() else {
            return "0 0".to_owned();
        };
        match heartbeat.writable_for() {
            Some(left) => format!("{} {}", postmaster.pid(), left.min(LONGEST).as_millis()),
            None => {
                let why = heartbeat.forbids_primary().unwrap_or_default();
                tracing::error!(reason = %why, "fencing: stopping postgres at once");
                postmaster.signal(Signal::SIGQUIT);
                armed.take();
                "0 0".to_owned()
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Signaller>> {
        self.armed.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn start_watchdog(children: &Children) -> Option<ChildStdin> {
    let program = std::env::current_exe().ok()?;
    let started = children.spawn_with_stdin(Command::new(&program).arg(WATCHDOG_COMMAND));
    match started {
        Ok((_child, stdin)) => Some(stdin),
        Err(error) => {
            tracing::error!(%error, program = %Path::new(&program).display(), "cannot start the fence's watchdog");
            None
        }
    }
}

/// The watchdog's subcommand.
pub const WATCHDOG_COMMAND: &str = "fence-watchdog";

/// The watchdog: reads `<pid> <milliseconds>` lines on stdin; when the
/// allowance of an armed postmaster runs out (plus `WATCHDOG_LAG`) without
/// a new line, stops it (SIGQUIT). Returns when stdin closes and nothing
/// is armed any more.
pub fn watchdog() -> ExitCode {
    let (lines, told) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut armed: Option<(Pid, Instant)> = None;
    let mut open = true;
    loop {
        let wait = armed.map_or(Duration::from_secs(1), |(_, deadline)| {
            deadline.saturating_duration_since(Instant::now())
        });
        let received = match open {
            true => told.recv_timeout(wait),
            false => {
                std::thread::sleep(wait);
                Err(RecvTimeoutError::Timeout)
            }
        };
        match received {
            Ok(line) => armed = parse(&line),
            Err(RecvTimeoutError::Disconnected) => open = false,
            Err(RecvTimeoutError::Timeout) => {}
        }
        if let Some((pid, deadline)) = armed
            && Instant::now() >= deadline
        {
            eprintln!("fence-watchdog: no word from cairn-instance: stopping postgres ({pid})");
            let _ = kill(pid, Signal::SIGQUIT);
            armed = None;
        }
        if !open && armed.is_none() {
            return ExitCode::SUCCESS;
        }
    }
}

fn parse(line: &str) -> Option<(Pid, Instant)> {
    let (pid, milliseconds) = line.trim().split_once(' ')?;
    let pid: i32 = pid.parse().ok().filter(|p| *p > 0)?;
    let allowed = Duration::from_millis(milliseconds.parse().ok()?);
    Some((Pid::from_raw(pid), Instant::now() + allowed + WATCHDOG_LAG))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_reads_an_allowance_or_nothing_armed() {
        let (pid, deadline) = parse("1234 2000").expect("armed");
        assert_eq!(pid, Pid::from_raw(1234));
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(left > Duration::from_millis(2400) && left <= Duration::from_millis(2500));
        assert_eq!(parse("0 0"), None);
        assert_eq!(parse("junk"), None);
    }
}
