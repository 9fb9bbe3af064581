//! When each worker's log write in progress began, and when a write last stalled. A write that
//! does not return — a disk that stalls — blocks the raft thread inside it, where it can report
//! nothing: this clock lets anyone else see it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::cache_padded::CachePadded;

/// A log write running longer than this has stalled: a disk that keeps up takes microseconds
/// to milliseconds, and every request that needs the log waits behind it.
pub const LOG_WRITE_STALLED_AFTER: Duration = Duration::from_secs(1);

/// A node counts as stalled until this long after a stalled write returned: a disk that stalls
/// once tends to again, and between two stalled writes the node should not look well.
pub const LOG_WRITE_STALL_HOLD: Duration = Duration::from_secs(5);

/// One slot per worker: when its write in progress began, as a stamp (nanoseconds after
/// `epoch`, plus one); 0 while it writes nothing. Each slot on lines of its own: its worker
/// writes it twice a round.
pub(crate) struct LogWriteClock {
    epoch: Instant,
    began: Vec<CachePadded<AtomicU64>>,
    /// The stamp of the latest return of a write that had stalled; 0: none has.
    stall_returned: AtomicU64,
}

impl LogWriteClock {
    /// A clock for `workers` workers, none of them writing.
    pub(crate) fn new(workers: usize) -> Self {
        LogWriteClock {
            epoch: Instant::now(),
            began: (0..workers)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
            stall_returned: AtomicU64::new(0),
        }
    }

    fn stamp(&self, at: Instant) -> u64 {
        let nanos = at.saturating_duration_since(self.epoch).as_nanos();
        u64::try_from(nanos).unwrap_or(u64::MAX - 1) + 1
    }

    fn instant(&self, stamp: u64) -> Instant {
        self.epoch + Duration::from_nanos(stamp - 1)
    }

    /// `worker` began a log write at `at`.
    pub(crate) fn began(&self, worker: usize, at: Instant) {
        self.began[worker].store(self.stamp(at), Ordering::Release);
    }

    /// `worker`'s log write returned (written or failed) after running `took`.
    pub(crate) fn ended(&self, worker: usize, took: Duration) {
        self.began[worker].store(0, Ordering::Release);
        if took > LOG_WRITE_STALLED_AFTER {
            let now = self.stamp(Instant::now());
            self.stall_returned.fetch_max(now, Ordering::AcqRel);
        }
    }

    /// How long the oldest log write still in progress has been running; `None` while no
    /// worker is inside one.
    pub(crate) fn longest_in_progress(&self) -> Option<Duration> {
        let oldest = (self.began.iter())
            .map(|slot| slot.load(Ordering::Acquire))
            .filter(|&stamp| stamp != 0)
            .min()?;
        Some(self.instant(oldest).elapsed())
    }

    /// A write in progress has stalled, or one that had returned less than
    /// [`LOG_WRITE_STALL_HOLD`] ago.
    pub(crate) fn stalled(&self) -> bool {
        if self
            .longest_in_progress()
            .is_some_and(|running| running > LOG_WRITE_STALLED_AFTER)
        {
            return true;
        }
        let returned = self.stall_returned.load(Ordering::Acquire);
        returned != 0 && self.instant(returned).elapsed() < LOG_WRITE_STALL_HOLD
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_write_in_progress_is_reported_until_it_returns() {
        let clock = LogWriteClock::new(2);
        assert_eq!(clock.longest_in_progress(), None);
        std::thread::sleep(Duration::from_millis(20));
        clock.began(0, clock.epoch);
        clock.began(1, Instant::now());
        let both = clock.longest_in_progress().expect("two writes in progress");
        assert!(both >= Duration::from_millis(20), "{both:?}");
        clock.ended(0, both);
        let one = clock.longest_in_progress().expect("one write in progress");
        assert!(one < both, "{one:?} against {both:?}");
        clock.ended(1, one);
        assert_eq!(clock.longest_in_progress(), None);
        assert!(!clock.stalled(), "no write ran a second");
    }

    /// A clock whose epoch lies `ago` in the past, so that instants that far back have stamps.
    fn clock_started_ago(ago: Duration) -> LogWriteClock {
        let mut clock = LogWriteClock::new(1);
        clock.epoch = Instant::now()
            .checked_sub(ago)
            .expect("the machine is up that long");
        clock
    }

    #[test]
    fn a_stalled_write_counts_while_it_runs_and_for_the_hold_after() {
        let margin = Duration::from_millis(10);
        let clock = clock_started_ago(LOG_WRITE_STALL_HOLD + LOG_WRITE_STALLED_AFTER * 2);
        let began = Instant::now() - (LOG_WRITE_STALLED_AFTER + margin);
        clock.began(0, began);
        assert!(clock.stalled(), "a write in progress for over a second");
        clock.ended(0, began.elapsed());
        assert_eq!(clock.longest_in_progress(), None);
        assert!(clock.stalled(), "a stalled write returned a moment ago");
        // As if it had returned a hold ago.
        let held = clock.stamp(Instant::now() - (LOG_WRITE_STALL_HOLD + margin));
        clock.stall_returned.store(held, Ordering::Release);
        assert!(!clock.stalled());
    }
}
