//! `concord_http_request_duration_seconds{route,method,status}`: one histogram handle per
//! series, made the first time the series is seen and kept. Recording through the `metrics`
//! macro instead builds the series' labels (three strings) and looks them up in the registry
//! on every request.
//!
//! The series are bounded: routes are the router's own paths (or `unmatched`), methods the
//! standard ones (any other is `other`: a client cannot mint series), statuses what the
//! server answers.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::Duration;

use axum::http::{Method, StatusCode};
use metrics::Histogram;

/// A route's series: by (method label, status code).
type RouteSeries = HashMap<(&'static str, u16), Histogram>;

/// The handles, by route and then by (method, status).
#[derive(Default)]
pub struct RequestDurations {
    series: RwLock<HashMap<String, RouteSeries>>,
}

impl RequestDurations {
    /// Records one answered request.
    pub fn record(&self, route: &str, method: &Method, status: StatusCode, elapsed: Duration) {
        let key = (method_label(method), status.as_u16());
        let known = self
            .series
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(route)
            .and_then(|by_method| by_method.get(&key))
            .cloned();
        let histogram = match known {
            Some(histogram) => histogram,
            None => self.register(route, key),
        };
        histogram.record(elapsed.as_secs_f64());
    }

    fn register(&self, route: &str, (method, status): (&'static str, u16)) -> Histogram {
        let mut series = self
            .series
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        series
            .entry(route.to_string())
            .or_default()
            .entry((method, status))
            .or_insert_with(|| {
                metrics::histogram!(
                    "concord_http_request_duration_seconds",
                    "route" => route.to_string(),
                    "method" => method,
                    "status" => status.to_string(),
                )
            })
            .clone()
    }
}

/// The method's name if it is a standard one, else `other`.
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
        let series = durations.series.read().unwrap();
        let keys: Vec<_> = {
            let mut keys: Vec<_> = series["/v1/sessions"].keys().copied().collect();
            keys.sort();
            keys
        };
        assert_eq!(keys, vec![("POST", 201), ("other", 201)]);
    }
}
