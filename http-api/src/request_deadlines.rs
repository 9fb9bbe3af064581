//! The request timeout, kept without a timer per request.
//!
//! A tokio timer per request (`tokio::time::timeout` around each handler) costs every request a
//! registration in the runtime's timer wheel and its removal, under the wheel's locks, for a
//! timeout that almost never fires (docs/BENCHMARKS.md has what that cost). Here a request only
//! writes its deadline into its thread's shard of a list (one uncontended lock) and marks itself
//! finished when it ends (one atomic store); one sweeper task, every `sweep_interval`, wakes the
//! requests past their deadline and drops the finished ones. A timeout is therefore answered up
//! to one interval late: a tenth of the timeout, at most 100 ms.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use atomic_waker::AtomicWaker;
use parking_lot::Mutex;

use crate::thread_shard::{Padded, THREAD_SHARDS, this_threads_shard};

/// The sweeper runs at least this often, and at most every millisecond.
const LONGEST_SWEEP_INTERVAL: Duration = Duration::from_millis(100);
/// A shard drops its finished requests itself once it holds this many (or twice what it kept
/// the last time it did), so that its list stays bounded between sweeps however fast requests
/// come.
const SHARD_PRUNE_LENGTH: usize = 1024;

const RUNNING: u8 = 0;
const FINISHED: u8 = 1;
const EXPIRED: u8 = 2;

/// The deadlines of the requests in progress.
pub(crate) struct RequestDeadlines {
    timeout: Duration,
    /// The list in shards; a thread keeps to one, so the HTTP workers do not share a lock.
    shards: [Padded<Mutex<Shard>>; THREAD_SHARDS],
    sweeper_started: AtomicBool,
}

#[derive(Default)]
struct Shard {
    /// Requests in the order they started (their deadlines in order too).
    watches: Vec<Arc<Watch>>,
    /// Length at which a start drops the finished requests itself.
    prune_at: usize,
}

/// One request's deadline and how it stands.
struct Watch {
    deadline: Instant,
    state: AtomicU8,
    waker: AtomicWaker,
}

/// A request's deadline, from [`RequestDeadlines::start`]; the request counts as finished
/// when it is dropped.
pub(crate) struct Deadline {
    watch: Arc<Watch>,
}

impl RequestDeadlines {
    pub(crate) fn new(timeout: Duration) -> Self {
        RequestDeadlines {
            timeout,
            shards: std::array::from_fn(|_| Padded(Mutex::new(Shard::default()))),
            sweeper_started: AtomicBool::new(false),
        }
    }

    /// The request timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// How often the sweeper looks for requests past their deadline.
    fn sweep_interval(&self) -> Duration {
        (self.timeout / 10).clamp(Duration::from_millis(1), LONGEST_SWEEP_INTERVAL)
    }

    /// Starts watching a request that began at `started` (from a task of a tokio runtime: the
    /// first call starts the sweeper there).
    pub(crate) fn start(self: &Arc<Self>, started: Instant) -> Deadline {
        if !self.sweeper_started.load(Ordering::Relaxed)
            && !self.sweeper_started.swap(true, Ordering::AcqRel)
        {
            tokio::spawn(sweep_until_dropped(Arc::downgrade(self)));
        }
        let watch = Arc::new(Watch {
            deadline: started + self.timeout,
            state: AtomicU8::new(RUNNING),
            waker: AtomicWaker::new(),
        });
        let mut shard = self.shards[this_threads_shard()].0.lock();
        if shard.watches.len() >= shard.prune_at.max(SHARD_PRUNE_LENGTH) {
            shard.watches.retain(|watch| watch.is_running());
            shard.prune_at = 2 * shard.watches.len();
        }
        shard.watches.push(watch.clone());
        Deadline { watch }
    }

    /// Wakes every request past its deadline at `now` and forgets the finished ones.
    fn sweep(&self, now: Instant) {
        for shard in &self.shards {
            shard.0.lock().watches.retain(|watch| {
                if !watch.is_running() {
                    return false;
                }
                if watch.deadline > now {
                    return true;
                }
                if watch
                    .state
                    .compare_exchange(RUNNING, EXPIRED, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    watch.waker.wake();
                }
                false
            });
        }
    }

    /// Requests watched (running, or finished and not yet forgotten), for tests.
    #[cfg(test)]
    fn watched(&self) -> usize {
        self.shards.iter().map(|s| s.0.lock().watches.len()).sum()
    }
}

impl Watch {
    fn is_running(&self) -> bool {
        self.state.load(Ordering::Acquire) == RUNNING
    }
}

impl Deadline {
    /// Resolves once the request is past its deadline.
    pub(crate) fn passed(&self) -> Passed<'_> {
        Passed { watch: &self.watch }
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        // An expired request stays expired; a running one is finished.
        let _ = self.watch.state.compare_exchange(
            RUNNING,
            FINISHED,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }
}

/// The future of [`Deadline::passed`].
pub(crate) struct Passed<'a> {
    watch: &'a Watch,
}

impl Future for Passed<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let expired = || self.watch.state.load(Ordering::Acquire) == EXPIRED;
        if expired() {
            return Poll::Ready(());
        }
        self.watch.waker.register(cx.waker());
        // The sweeper may have expired it between the check and the registration.
        if expired() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// Sweeps every interval until the deadlines are dropped (the server stopped).
async fn sweep_until_dropped(deadlines: Weak<RequestDeadlines>) {
    let Some(interval) = deadlines.upgrade().map(|d| d.sweep_interval()) else {
        return;
    };
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(deadlines) = deadlines.upgrade() else {
            return;
        };
        deadlines.sweep(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_past_its_deadline_is_woken_and_a_finished_one_is_not() {
        let deadlines = Arc::new(RequestDeadlines::new(Duration::from_millis(30)));
        let slow = deadlines.start(Instant::now());
        let quick = deadlines.start(Instant::now());
        drop(quick);
        let waited = Instant::now();
        tokio::time::timeout(Duration::from_secs(5), slow.passed())
            .await
            .expect("the sweeper wakes a request past its deadline");
        let waited = waited.elapsed();
        assert!(waited >= Duration::from_millis(25), "early: {waited:?}");
        // Woken by the sweeper, not found expired when the outer timeout polled it again.
        assert!(waited < Duration::from_secs(2), "late: {waited:?}");
        // Both are forgotten by the sweep that expired the slow one.
        assert_eq!(deadlines.watched(), 0);
    }

    #[tokio::test]
    async fn a_request_that_finishes_in_time_never_passes_its_deadline() {
        let deadlines = Arc::new(RequestDeadlines::new(Duration::from_secs(60)));
        let deadline = deadlines.start(Instant::now());
        deadlines.sweep(Instant::now() + Duration::from_secs(1));
        let mut passed = std::pin::pin!(deadline.passed());
        let mut context = Context::from_waker(std::task::Waker::noop());
        assert!(passed.as_mut().poll(&mut context).is_pending());
        drop(deadline);
        deadlines.sweep(Instant::now() + Duration::from_secs(120));
        assert_eq!(deadlines.watched(), 0, "a finished request is forgotten");
    }

    #[tokio::test]
    async fn the_lists_stay_bounded_without_a_sweep() {
        let deadlines = Arc::new(RequestDeadlines::new(Duration::from_secs(3600)));
        let running: Vec<Deadline> = (0..100).map(|_| deadlines.start(Instant::now())).collect();
        for _ in 0..100_000 {
            drop(deadlines.start(Instant::now()));
        }
        // The hundred running ones, and at most one prune length of finished ones per shard.
        assert!(
            deadlines.watched() <= running.len() + SHARD_PRUNE_LENGTH,
            "{} watched",
            deadlines.watched()
        );
    }
}
