//! Cumulative request counts and a latency histogram of the session routes, for the status
//! page: it polls them and turns differences into throughput and percentiles. (Prometheus
//! gets the same latencies through `/metrics`.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Upper bounds of the latency buckets in microseconds; one more bucket counts the rest.
pub const LATENCY_BOUNDS_US: [u64; 17] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

/// Counters shared by every request; lock-free.
#[derive(Debug, Default)]
pub struct RequestStats {
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
        self.requests.fetch_add(1, Ordering::Relaxed);
        if server_error {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        let us = latency.as_micros().min(u128::from(u64::MAX)) as u64;
        let bucket = LATENCY_BOUNDS_US
            .iter()
            .position(|&bound| us <= bound)
            .unwrap_or(LATENCY_BOUNDS_US.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far.
    pub fn read(&self) -> RequestStatsJson {
        RequestStatsJson {
            requests: self.requests.load(Ordering::Relaxed),
            server_errors: self.errors.load(Ordering::Relaxed),
            latency_bounds_us: LATENCY_BOUNDS_US.to_vec(),
            latency_counts: self
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
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
}
