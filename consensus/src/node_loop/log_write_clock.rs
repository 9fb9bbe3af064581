//! When each worker's log write in progress began. A write that does not return — a disk that
//! stalls — blocks the raft thread inside it, where it can report nothing: this clock lets
//! anyone else see how long it has been.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::cache_padded::CachePadded;

/// One slot per worker: when its write in progress began, in nanoseconds after `epoch` plus
/// one; 0 while it writes nothing. Each slot on lines of its own: its worker writes it twice a
/// round.
pub(crate) struct LogWriteClock {
    epoch: Instant,
    began: Vec<CachePadded<AtomicU64>>,
}

impl LogWriteClock {
    /// A clock for `workers` workers, none of them writing.
    pub(crate) fn new(workers: usize) -> Self {
        LogWriteClock {
            epoch: Instant::now(),
            began: (0..workers)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
        }
    }

    /// `worker` began a log write at `at`.
    pub(crate) fn began(&self, worker: usize, at: Instant) {
        let nanos = at.saturating_duration_since(self.epoch).as_nanos();
        let stamp = u64::try_from(nanos).unwrap_or(u64::MAX - 1) + 1;
        self.began[worker].store(stamp, Ordering::Release);
    }

    /// `worker`'s log write returned (written or failed).
    pub(crate) fn ended(&self, worker: usize) {
        self.began[worker].store(0, Ordering::Release);
    }

    /// How long the oldest log write still in progress has been running; `None` while no
    /// worker is inside one.
    pub(crate) fn longest_in_progress(&self) -> Option<Duration> {
        let oldest = (self.began.iter())
            .map(|slot| slot.load(Ordering::Acquire))
            .filter(|&stamp| stamp != 0)
            .min()?;
        let began = self.epoch + Duration::from_nanos(oldest - 1);
        Some(began.elapsed())
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
        clock.ended(0);
        let one = clock.longest_in_progress().expect("one write in progress");
        assert!(one < both, "{one:?} against {both:?}");
        clock.ended(1);
        assert_eq!(clock.longest_in_progress(), None);
    }
}
