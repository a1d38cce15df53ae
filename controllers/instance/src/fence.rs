//! The fence, an actuator apart from the supervisor's loop: a thread of its
//! own that stops postgres at once (immediate shutdown, SIGQUIT) when it runs
//! as a primary and the heartbeat forbids it, whatever the loop is doing (a
//! query that hangs, a connection without an answer, a shutdown under way).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::children::Signaller;
use crate::membership::Heartbeat;

/// How often the fence looks: its reaction time, which the safety argument
/// counts (see `peers::HOLD`).
pub const CHECK: Duration = Duration::from_millis(100);

/// The postmaster to stop, while it runs as a primary.
#[derive(Default)]
pub struct Fence {
    armed: Mutex<Option<Signaller>>,
}

impl Fence {
    /// Starts the fence's thread for `heartbeat`.
    pub fn start(heartbeat: Arc<Heartbeat>) -> Arc<Self> {
        let fence = Arc::new(Self::default());
        let watched = fence.clone();
        let spawned = std::thread::Builder::new()
            .name("fence".to_owned())
            .spawn(move || {
                loop {
                    std::thread::sleep(CHECK);
                    watched.check(&heartbeat);
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

    pub fn armed(&self) -> bool {
        self.lock().is_some()
    }

    fn check(&self, heartbeat: &Heartbeat) {
        let Some(why) = heartbeat.forbids_primary() else {
            return;
        };
        if let Some(postmaster) = self.lock().take() {
            tracing::error!(reason = %why, "fencing: stopping postgres at once");
            postmaster.signal(Signal::SIGQUIT);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Signaller>> {
        self.armed.lock().unwrap_or_else(|p| p.into_inner())
    }
}
