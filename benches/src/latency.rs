//! Latency samples and their percentiles.

use std::time::Duration;

/// Collected latencies of one benchmark case, in microseconds. Bounded: past
/// `MAX_SAMPLES` it keeps every other sample, which keeps percentiles unbiased enough for a
/// report while capping memory.
#[derive(Debug, Default)]
pub struct Latencies {
    samples_us: Vec<u64>,
    stride: u64,
    seen: u64,
    /// The longest recorded, kept even if its sample is thinned out.
    max_us: u64,
}

const MAX_SAMPLES: usize = 1 << 20;

impl Latencies {
    /// An empty set.
    pub fn new() -> Self {
        Latencies {
            samples_us: Vec::new(),
            stride: 1,
            seen: 0,
            max_us: 0,
        }
    }

    /// Records one latency.
    pub fn record(&mut self, latency: Duration) {
        self.seen += 1;
        self.max_us = self.max_us.max(latency.as_micros() as u64);
        if !self.seen.is_multiple_of(self.stride) {
            return;
        }
        if self.samples_us.len() == MAX_SAMPLES {
            let mut keep = false;
            self.samples_us.retain(|_| {
                keep = !keep;
                keep
            });
            self.stride *= 2;
        }
        self.samples_us.push(latency.as_micros() as u64);
    }

    /// The longest latency recorded, in microseconds (0 if none).
    pub fn max_us(&self) -> u64 {
        self.max_us
    }

    /// The `q` quantile (0.0..=1.0) in microseconds, 0 if empty.
    pub fn quantile_us(&mut self, q: f64) -> u64 {
        if self.samples_us.is_empty() {
            return 0;
        }
        self.samples_us.sort_unstable();
        let rank = ((self.samples_us.len() - 1) as f64 * q).round() as usize;
        self.samples_us[rank]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_of_a_known_set() {
        let mut latencies = Latencies::new();
        for us in (1..=100).rev() {
            latencies.record(Duration::from_micros(us));
        }
        assert_eq!(latencies.quantile_us(0.5), 51);
        assert_eq!(latencies.quantile_us(0.99), 99);
        assert_eq!(latencies.quantile_us(1.0), 100);
        assert_eq!(latencies.max_us(), 100);
        assert_eq!(Latencies::new().quantile_us(0.5), 0);
        assert_eq!(Latencies::new().max_us(), 0);
    }
}
