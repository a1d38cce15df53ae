//! Another process's heartbeat (a Lease's `renewTime`) timed on this
//! process's monotonic clock. The renewal is another node's wall-clock
//! time: comparing it with this node's clock lets a few seconds of skew
//! make a live instance silent, or a dead one fresh. What is compared
//! instead is the renewal with the one last seen: a silence is how long
//! this process has seen the same renewal, as the runtime's leader
//! election judges its leader.

use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

use crate::admin::Sight;

/// One object's heartbeat as this process last saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    renewed: Option<Timestamp>,
    first_seen: Instant,
    /// A renewal was seen to change (a beat) since this process first saw
    /// the object: its holder was alive then.
    beat_seen: bool,
}

impl Heartbeat {
    /// The heartbeat after reading `renewed` at `now`: the one `last` seen
    /// while the renewal is the same; else a new one, first seen now (a
    /// restart of this process thus counts from now, so it only ever
    /// delays the verdict "silent").
    pub fn seen(last: Option<&Self>, renewed: Option<Timestamp>, now: Instant) -> Self {
        match last {
            Some(last) if last.renewed == renewed => last.clone(),
            _ => Self {
                renewed,
                first_seen: now,
                beat_seen: last.is_some(),
            },
        }
    }

    /// A heartbeat first seen at `first_seen` (tests, and a process that
    /// knows when it saw it).
    pub fn since(renewed: Option<Timestamp>, first_seen: Instant) -> Self {
        Self {
            renewed,
            first_seen,
            beat_seen: true,
        }
    }

    /// How long the renewal has been seen unchanged: from its first sight,
    /// or from the watch's resumption if that came later (a renewal in
    /// between was not seen); unknown while the watch is blind. A broken
    /// watch thus delays the verdict by its outage, never hastens it.
    pub fn silence(&self, sight: Sight, now: Instant) -> Option<Duration> {
        let since = match sight {
            Sight::Unbroken => self.first_seen,
            Sight::Since(resumed) => self.first_seen.max(resumed),
            Sight::Blind => return None,
        };
        Some(now.duration_since(since))
    }

    /// Whether this process saw the renewal change: a holder seen alive
    /// once, not only a Lease left behind.
    pub fn beat_seen(&self) -> bool {
        self.beat_seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ago(now: Instant, seconds: u64) -> Instant {
        now.checked_sub(Duration::from_secs(seconds))
            .expect("uptime")
    }

    #[test]
    fn silence_is_unknown_while_the_watch_is_blind_and_counts_from_its_resumption() {
        let now = Instant::now();
        let old = Heartbeat::since(None, ago(now, 30));
        assert_eq!(
            old.silence(Sight::Unbroken, now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(old.silence(Sight::Blind, now), None);
        // Resumed 3 s ago: a renewal before then may not have been seen.
        assert_eq!(
            old.silence(Sight::Since(ago(now, 3)), now),
            Some(Duration::from_secs(3))
        );
        // A renewal first seen after the resumption counts from its sight.
        let recent = Heartbeat::since(None, ago(now, 2));
        assert_eq!(
            recent.silence(Sight::Since(ago(now, 30)), now),
            Some(Duration::from_secs(2))
        );
    }

    #[test]
    fn a_renewal_counts_from_its_first_sight_whatever_its_wall_clock_says() {
        let now = Instant::now();
        // Renewed "an hour ago" by a node whose clock is behind: first seen
        // now, so silent for no time at all.
        let skewed: Timestamp = "2026-12-01T00:00:00Z".parse().expect("time");
        let first = Heartbeat::seen(None, Some(skewed), ago(now, 10));
        assert!(!first.beat_seen(), "a Lease left behind looks the same");
        let same = Heartbeat::seen(Some(&first), Some(skewed), now);
        assert_eq!(
            same.silence(Sight::Unbroken, now),
            Some(Duration::from_secs(10)),
            "the same renewal: silent since its first sight"
        );
        let later: Timestamp = "2026-12-01T00:00:02Z".parse().expect("time");
        let beat = Heartbeat::seen(Some(&same), Some(later), now);
        assert_eq!(beat.silence(Sight::Unbroken, now), Some(Duration::ZERO));
        assert!(beat.beat_seen(), "its holder was seen alive");
    }
}
