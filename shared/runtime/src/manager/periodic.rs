//! A controller's housekeeping: gauges refreshed from the caches, memory of
//! deleted objects dropped. Owned by the manager ([`super::Manager::every`]):
//! started once the caches are synced (a gauge counted from a half-filled
//! cache would be wrong), stopped when the manager stops.

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

/// A task run every `period`.
pub(super) struct Periodic {
    pub(super) period: Duration,
    pub(super) task: Box<dyn FnMut() + Send>,
}

impl Periodic {
    /// Runs the task now and every period after; a late tick is not caught
    /// up in a burst.
    pub(super) fn start(mut self) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut every = tokio::time::interval(self.period);
            every.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                (self.task)();
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test(start_paused = true)]
    async fn runs_at_once_then_every_period_until_stopped() {
        let runs = Arc::new(AtomicU32::new(0));
        let counted = runs.clone();
        let task = Periodic {
            period: Duration::from_secs(10),
            task: Box::new(move || {
                counted.fetch_add(1, Ordering::SeqCst);
            }),
        }
        .start();
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 3, "at 0, 10 and 20 s");
        task.abort();
        let _ = task.await;
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 3, "stopped with its owner");
    }
}
