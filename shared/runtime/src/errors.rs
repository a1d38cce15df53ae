//! How a failed reconcile is retried, by the class of its error.

use std::time::Duration;

/// The class of a reconcile error, which decides how it is retried and which
/// condition reports it. Also the `reason` label of the error metric: a small,
/// fixed set, never an object's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// Might succeed on retry (API conflict, timeout, provider throttling):
    /// exponential backoff.
    Transient,
    /// The spec cannot work as written: `Ready=False, reason=InvalidSpec` and
    /// no retry until the spec changes (a new generation triggers a reconcile).
    InvalidSpec,
    /// Something the object needs is not there yet (a Secret, a Backup, a
    /// bucket): retried with the same exponential backoff, the condition names it.
    DependencyNotReady,
}

impl ErrorClass {
    /// The metric label value.
    pub fn label(self) -> &'static str {
        match self {
            Self::Transient => "transient",
            Self::InvalidSpec => "invalid_spec",
            Self::DependencyNotReady => "dependency_not_ready",
        }
    }
}

/// Exponential backoff with full jitter between `initial` and `max`.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    /// 5 s doubling to 300 s.
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(5),
            max: Duration::from_secs(300),
        }
    }
}

impl Backoff {
    /// The ceiling of the delay after `failures` consecutive failures
    /// (1 for the first): `initial * 2^(failures-1)`, at most `max`.
    pub fn ceiling(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.initial.saturating_mul(1 << doublings).min(self.max)
    }

    /// The delay before the next attempt: uniformly random in
    /// [ceiling / 2, ceiling], so that many objects failing together (an API
    /// server restart) do not retry in lockstep.
    pub fn delay(&self, failures: u32) -> Duration {
        let ceiling = self.ceiling(failures);
        let half = ceiling / 2;
        half + half.mul_f64(rand::random::<f64>())
    }
}

/// The consecutive failures of one task and the delay each earns: the one
/// retry policy of the controllers and cairn-instance.
#[derive(Debug, Clone, Copy)]
pub struct Retries {
    backoff: Backoff,
    failures: u32,
}

impl Retries {
    pub fn new(backoff: Backoff) -> Self {
        Self {
            backoff,
            failures: 0,
        }
    }

    /// Counts a failure and returns the delay before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.backoff.delay(self.failures)
    }

    /// After a success: the next failure starts from the first step.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_five_seconds_to_five_minutes() {
        let backoff = Backoff::default();
        let ceilings: Vec<u64> = (1..=9).map(|n| backoff.ceiling(n).as_secs()).collect();
        assert_eq!(ceilings, vec![5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(backoff.ceiling(u32::MAX), Duration::from_secs(300));
    }

    #[test]
    fn jitter_stays_within_half_and_full_ceiling() {
        let backoff = Backoff::default();
        for failures in 1..12 {
            for _ in 0..50 {
                let delay = backoff.delay(failures);
                let ceiling = backoff.ceiling(failures);
                assert!(
                    delay >= ceiling / 2 && delay <= ceiling,
                    "{delay:?} for {failures}"
                );
            }
        }
    }

    #[test]
    fn retries_climb_the_ceilings_and_start_over_after_a_reset() {
        let backoff = Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(30),
        };
        let ceilings: Vec<u64> = (1..=7).map(|n| backoff.ceiling(n).as_secs()).collect();
        assert_eq!(ceilings, vec![1, 2, 4, 8, 16, 30, 30]);
        let mut retries = Retries::new(backoff);
        for failures in 1..=7 {
            let delay = retries.next_delay();
            let ceiling = backoff.ceiling(failures);
            assert!(delay >= ceiling / 2 && delay <= ceiling, "{delay:?}");
        }
        retries.reset();
        assert!(retries.next_delay() <= Duration::from_secs(1));
    }

    #[test]
    fn labels_are_distinct() {
        let labels = [
            ErrorClass::Transient,
            ErrorClass::InvalidSpec,
            ErrorClass::DependencyNotReady,
        ]
        .map(ErrorClass::label);
        assert_eq!(
            labels.len(),
            labels
                .iter()
                .collect::<std::collections::HashSet<_>>()
                .len()
        );
    }
}
