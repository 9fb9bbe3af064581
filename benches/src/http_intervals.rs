//! What the load tool's connections saw, one interval at a time: every connection records into
//! the current interval, and once a second the case takes it (for the live line and the
//! timeline) and adds it to the case's total.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use parking_lot::Mutex;

/// The longest latency the histograms tell apart; longer ones count as this.
const MAX_LATENCY_US: u64 = 3_600_000_000;

/// Requests answered (or failed) during one interval.
pub(crate) struct Interval {
    /// Latency of each successful request, microseconds, 3 significant digits.
    pub latencies_us: Histogram<u64>,
    /// Operations answered with success (a batch counts its operations).
    pub ops: u64,
    /// Requests due in an open loop that were never sent.
    pub unsent: u64,
    /// Failed requests by status (0: the connection failed).
    pub errors_by_status: BTreeMap<u16, u64>,
    /// The first unexpected answer, if any.
    pub first_error: Option<String>,
}

impl Interval {
    pub fn new() -> Interval {
        Interval {
            latencies_us: Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)
                .expect("static histogram bounds are valid"),
            ops: 0,
            unsent: 0,
            errors_by_status: BTreeMap::new(),
            first_error: None,
        }
    }

    /// Requests answered with success.
    pub fn requests(&self) -> u64 {
        self.latencies_us.len()
    }

    /// Failed requests, every status together.
    pub fn errors(&self) -> u64 {
        self.errors_by_status.values().sum()
    }

    /// The `q` quantile (0.0..=1.0) of the latencies in microseconds, 0 if none.
    pub fn quantile_us(&self, q: f64) -> u64 {
        if self.latencies_us.is_empty() {
            0
        } else {
            self.latencies_us.value_at_quantile(q)
        }
    }

    /// Adds `other`'s requests to this interval's.
    pub fn absorb(&mut self, other: Interval) {
        // Both histograms have the same bounds, so adding cannot fail.
        let _ = self.latencies_us.add(&other.latencies_us);
        self.ops += other.ops;
        self.unsent += other.unsent;
        for (status, count) in other.errors_by_status {
            *self.errors_by_status.entry(status).or_default() += count;
        }
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// The interval the connections are recording into.
pub(crate) struct IntervalRecorder {
    current: Mutex<Interval>,
}

impl IntervalRecorder {
    pub fn new() -> IntervalRecorder {
        IntervalRecorder {
            current: Mutex::new(Interval::new()),
        }
    }

    /// A request carrying `ops` operations succeeded after `latency`.
    pub fn success(&self, latency: Duration, ops: u64) {
        let latency_us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        let mut current = self.current.lock();
        current.latencies_us.saturating_record(latency_us.max(1));
        current.ops += ops;
    }

    /// A request failed with `status` (0: the connection failed); `describe` says how, and is
    /// called only for the case's first failure.
    pub fn failure(&self, status: u16, describe: impl FnOnce() -> String) {
        let mut current = self.current.lock();
        *current.errors_by_status.entry(status).or_default() += 1;
        if current.first_error.is_none() {
            current.first_error = Some(describe());
        }
    }

    /// `count` requests of an open loop were due and will not be sent.
    pub fn unsent(&self, count: u64) {
        self.current.lock().unsent += count;
    }

    /// The interval recorded so far; the connections go on into a fresh one.
    pub fn take(&self) -> Interval {
        let fresh = Interval::new();
        std::mem::replace(&mut *self.current.lock(), fresh)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_add_up_into_the_total() {
        let recorder = IntervalRecorder::new();
        for us in 1..=100 {
            recorder.success(Duration::from_micros(us), 2);
        }
        recorder.failure(503, || "overloaded".into());
        recorder.failure(503, || unreachable!("only the first failure is described"));
        let first = recorder.take();
        assert_eq!(first.requests(), 100);
        assert_eq!(first.ops, 200);
        assert_eq!(first.quantile_us(0.5), 50);
        assert_eq!(first.quantile_us(0.99), 99);
        assert_eq!(first.errors(), 2);

        recorder.success(Duration::from_secs(7_200), 1);
        recorder.failure(0, || "reset".into());
        let second = recorder.take();
        let clamped = second.quantile_us(1.0);
        assert!(
            (MAX_LATENCY_US..=MAX_LATENCY_US + MAX_LATENCY_US / 1000).contains(&clamped),
            "clamped, not lost: {clamped}"
        );

        let mut total = Interval::new();
        total.absorb(first);
        total.absorb(second);
        assert_eq!(total.requests(), 101);
        assert_eq!(total.ops, 201);
        assert_eq!(total.errors_by_status, BTreeMap::from([(0, 1), (503, 2)]));
        assert_eq!(total.first_error.as_deref(), Some("overloaded"));
        assert_eq!(recorder.take().requests(), 0);
    }
}
