//! A `metrics` recorder for `--breakdown`: it keeps every histogram the engine records (labels
//! merged, so all groups of a node count together) in log-scale buckets, and hands each case
//! the median and 99th percentile of every write-path segment, then starts over.
//!
//! Off by default: the engine records some segments once per command, and a recorder makes
//! those calls cost a lookup instead of nothing.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use parking_lot::RwLock;
use serde::Serialize;

/// Buckets per doubling: a bucket spans 2^(1/8), so a reported quantile is within 9% of the
/// true one.
const BUCKETS_PER_DOUBLING: f64 = 8.0;
/// The smallest value with a bucket of its own is 2^-40 (about a picosecond in seconds).
const SMALLEST_EXPONENT: f64 = -40.0;
/// 64 doublings: up to 2^24 (sixteen million entries, or half a year in seconds).
const BUCKETS: usize = 64 * 8;

/// One histogram: counts per log-scale bucket, updated without locks.
struct LogHistogram {
    buckets: Vec<AtomicU64>,
}

impl LogHistogram {
    fn new() -> Self {
        LogHistogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn bucket_of(value: f64) -> usize {
        if value.is_nan() || value <= 0.0 {
            return 0;
        }
        let position = (value.log2() - SMALLEST_EXPONENT) * BUCKETS_PER_DOUBLING;
        position.clamp(0.0, (BUCKETS - 1) as f64) as usize
    }

    /// The geometric middle of a bucket.
    fn value_of(bucket: usize) -> f64 {
        (2.0f64).powf((bucket as f64 + 0.5) / BUCKETS_PER_DOUBLING + SMALLEST_EXPONENT)
    }

    /// Empties the histogram and returns its counts.
    fn take_counts(&self) -> Vec<u64> {
        self.buckets
            .iter()
            .map(|bucket| bucket.swap(0, Ordering::Relaxed))
            .collect()
    }
}

impl HistogramFn for LogHistogram {
    fn record(&self, value: f64) {
        self.buckets[Self::bucket_of(value)].fetch_add(1, Ordering::Relaxed);
    }
}

/// One segment of the write path over one case.
#[derive(Clone, Debug, Serialize)]
pub struct Segment {
    /// The metric name without the `concord_` prefix, e.g. `raft_log_sync_duration_seconds`.
    pub name: String,
    /// Values recorded.
    pub count: u64,
    /// Median: microseconds for `_seconds` metrics, the value itself otherwise.
    pub p50: f64,
    /// 99th percentile, in the same unit.
    pub p99: f64,
}

impl Segment {
    /// `us` for durations, empty for counts.
    pub fn unit(&self) -> &'static str {
        if is_duration(&self.name) { "us" } else { "" }
    }
}

/// The recorder; see the module documentation.
#[derive(Default)]
pub struct SegmentRecorder {
    histograms: RwLock<BTreeMap<String, Arc<LogHistogram>>>,
}

static INSTALLED: OnceLock<&'static SegmentRecorder> = OnceLock::new();

impl SegmentRecorder {
    /// Installs the recorder as the process's global one (once; later calls return the same
    /// recorder). Fails if another recorder was installed first.
    pub fn install() -> Result<&'static SegmentRecorder, String> {
        if let Some(recorder) = INSTALLED.get() {
            return Ok(recorder);
        }
        let recorder: &'static SegmentRecorder = Box::leak(Box::default());
        metrics::set_global_recorder(recorder)
            .map_err(|error| format!("installing the segment recorder: {error}"))?;
        let _ = INSTALLED.set(recorder);
        Ok(recorder)
    }

    /// Every histogram recorded since the last call, then starts over.
    pub fn take_segments(&self) -> Vec<Segment> {
        let histograms = self.histograms.read();
        histograms
            .iter()
            .filter_map(|(name, histogram)| {
                let counts = histogram.take_counts();
                let count: u64 = counts.iter().sum();
                if count == 0 {
                    return None;
                }
                let scale = if is_duration(name) { 1e6 } else { 1.0 };
                Some(Segment {
                    name: name.trim_start_matches("concord_").to_string(),
                    count,
                    p50: quantile(&counts, count, 0.5) * scale,
                    p99: quantile(&counts, count, 0.99) * scale,
                })
            })
            .collect()
    }

    fn histogram(&self, name: &str) -> Arc<LogHistogram> {
        if let Some(histogram) = self.histograms.read().get(name) {
            return Arc::clone(histogram);
        }
        let mut histograms = self.histograms.write();
        Arc::clone(
            histograms
                .entry(name.to_string())
                .or_insert_with(|| Arc::new(LogHistogram::new())),
        )
    }
}

/// Durations are recorded in seconds and reported in microseconds; the metric names say which
/// histograms hold durations.
fn is_duration(metric_name: &str) -> bool {
    metric_name.ends_with("_seconds")
}

/// The value below which `q` of the `count` values lie.
fn quantile(counts: &[u64], count: u64, q: f64) -> f64 {
    let rank = ((count as f64 * q).ceil() as u64).max(1);
    let mut seen = 0;
    for (bucket, &n) in counts.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return LogHistogram::value_of(bucket);
        }
    }
    LogHistogram::value_of(BUCKETS - 1)
}

impl Recorder for SegmentRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.histogram(key.name()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_fall_within_a_bucket_of_the_truth() {
        let histogram = LogHistogram::new();
        for micros in 1..=1000 {
            histogram.record(micros as f64 * 1e-6);
        }
        let counts = histogram.take_counts();
        let p50 = quantile(&counts, 1000, 0.5) * 1e6;
        let p99 = quantile(&counts, 1000, 0.99) * 1e6;
        assert!((460.0..=545.0).contains(&p50), "p50 {p50}");
        assert!((910.0..=1080.0).contains(&p99), "p99 {p99}");
        assert!(histogram.take_counts().iter().all(|&n| n == 0));
    }

    #[test]
    fn odd_values_land_in_the_end_buckets() {
        assert_eq!(LogHistogram::bucket_of(0.0), 0);
        assert_eq!(LogHistogram::bucket_of(-1.0), 0);
        assert_eq!(LogHistogram::bucket_of(f64::NAN), 0);
        assert_eq!(LogHistogram::bucket_of(f64::INFINITY), BUCKETS - 1);
    }
}
