//! `concord_http_request_duration_seconds{route,method,status}`: one histogram handle per
//! series, made the first time the series is seen and kept. Recording through the `metrics`
//! macro instead builds the series' labels (three strings) and looks them up in the registry
//! on every request.
//!
//! The series are bounded: routes are the router's own paths (or `unmatched`), methods the
//! standard ones (any other is `other`: a client cannot mint series), statuses what the
//! server answers.

use std::collections::HashMap;
use std::time::Duration;

use axum::http::{Method, StatusCode};
use metrics::Histogram;
use parking_lot::RwLock;

use crate::thread_shard::{Padded, THREAD_SHARDS, this_threads_shard};

/// A route's series: by (method label, status code).
type RouteSeries = HashMap<(&'static str, u16), Histogram, foldhash::fast::RandomState>;

/// Routes' series, by route.
type Series = HashMap<String, RouteSeries, foldhash::fast::RandomState>;

/// The handles, by route and then by (method, status), in one copy per thread
/// (`thread_shard.rs`): a request reads its own thread's copy under a lock no other thread
/// takes, and records through the handle without cloning it. Every copy's handle of a series
/// is the same histogram in the registry.
#[derive(Default)]
pub struct RequestDurations {
    shards: [Padded<RwLock<Series>>; THREAD_SHARDS],
}

impl RequestDurations {
    /// Records `elapsed` in the series of `route`, `method` and `status`.
    pub fn record(&self, route: &str, method: &Method, status: StatusCode, elapsed: Duration) {
        let key = (method_label(method), status.as_u16());
        let seconds = elapsed.as_secs_f64();
        let shard = &self.shards[this_threads_shard()].0;
        if let Some(histogram) = shard.read().get(route).and_then(|series| series.get(&key)) {
            histogram.record(seconds);
            return;
        }
        let (method, status) = key;
        shard
            .write()
            .entry(route.to_string())
            .or_default()
            .entry(key)
            .or_insert_with(|| {
                metrics::histogram!(
                    "concord_http_request_duration_seconds",
                    "route" => route.to_string(),
                    "method" => method,
                    "status" => status.to_string(),
                )
            })
            .record(seconds);
    }
}

fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::TRACE => "TRACE",
        Method::CONNECT => "CONNECT",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_series_is_registered_once_and_extension_methods_share_one() {
        let durations = RequestDurations::default();
        let brew = Method::from_bytes(b"BREW").unwrap();
        let mint = Method::from_bytes(b"MINT").unwrap();
        for method in [&Method::POST, &Method::POST, &brew, &mint] {
            durations.record(
                "/v1/sessions",
                method,
                StatusCode::CREATED,
                Duration::from_micros(5),
            );
        }
        let series = durations.shards[this_threads_shard()].0.read();
        let keys: Vec<_> = {
            let mut keys: Vec<_> = series["/v1/sessions"].keys().copied().collect();
            keys.sort();
            keys
        };
        assert_eq!(keys, vec![("POST", 201), ("other", 201)]);
    }
}
