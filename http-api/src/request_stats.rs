//! Cumulative request counts and a latency histogram of the session routes, for the status
//! page: it polls them and turns differences into throughput and percentiles. (Prometheus
//! gets the same latencies through `/metrics`.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::thread_shard::{Padded, THREAD_SHARDS, this_threads_shard};

/// Upper bounds of the latency buckets in microseconds; one more bucket counts the rest.
pub const LATENCY_BOUNDS_US: [u64; 17] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

/// Counters of every request, lock-free, in one shard per thread (`thread_shard.rs`).
#[derive(Debug, Default)]
pub struct RequestStats {
    shards: [Padded<Counters>; THREAD_SHARDS],
}

/// One thread's counts.
#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    errors: AtomicU64,
    buckets: [AtomicU64; LATENCY_BOUNDS_US.len() + 1],
}

/// A reading of [`RequestStats`], as `/v1/status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RequestStatsJson {
    /// Session requests answered since start.
    pub requests: u64,
    /// Of which with a 5xx status.
    pub server_errors: u64,
    /// Upper bounds of `latency_counts` in microseconds (the last count has no bound).
    pub latency_bounds_us: Vec<u64>,
    /// Requests per latency bucket since start.
    pub latency_counts: Vec<u64>,
}

impl RequestStats {
    /// Counts one answered request.
    pub fn record(&self, latency: Duration, server_error: bool) {
        let counters = &self.shards[this_threads_shard()].0;
        counters.requests.fetch_add(1, Ordering::Relaxed);
        if server_error {
            counters.errors.fetch_add(1, Ordering::Relaxed);
        }
        let us = latency.as_micros().min(u128::from(u64::MAX)) as u64;
        let bucket = LATENCY_BOUNDS_US
            .iter()
            .position(|&bound| us <= bound)
            .unwrap_or(LATENCY_BOUNDS_US.len());
        counters.buckets[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far, every thread's added up.
    pub fn read(&self) -> RequestStatsJson {
        let sum = |count: &dyn Fn(&Counters) -> &AtomicU64| -> u64 {
            self.shards
                .iter()
                .map(|shard| count(&shard.0).load(Ordering::Relaxed))
                .sum()
        };
        RequestStatsJson {
            requests: sum(&|c| &c.requests),
            server_errors: sum(&|c| &c.errors),
            latency_bounds_us: LATENCY_BOUNDS_US.to_vec(),
            latency_counts: (0..=LATENCY_BOUNDS_US.len())
                .map(|bucket| sum(&|c| &c.buckets[bucket]))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_by_upper_bound() {
        let stats = RequestStats::default();
        stats.record(Duration::from_micros(50), false);
        stats.record(Duration::from_micros(51), true);
        stats.record(Duration::from_secs(60), false);
        let read = stats.read();
        assert_eq!((read.requests, read.server_errors), (3, 1));
        assert_eq!(read.latency_counts[0], 1);
        assert_eq!(read.latency_counts[1], 1);
        assert_eq!(*read.latency_counts.last().unwrap(), 1);
        assert_eq!(read.latency_counts.len(), read.latency_bounds_us.len() + 1);
    }

    /// Each thread counts in its own shard; a reading adds them all up.
    #[test]
    fn every_threads_counts_are_read() {
        let stats = RequestStats::default();
        std::thread::scope(|scope| {
            for thread in 0..12u64 {
                let stats = &stats;
                scope.spawn(move || {
                    for _ in 0..100 {
                        stats.record(Duration::from_micros(60), thread == 0);
                    }
                });
            }
        });
        let read = stats.read();
        assert_eq!((read.requests, read.server_errors), (1200, 100));
        assert_eq!(read.latency_counts[1], 1200);
    }
}
