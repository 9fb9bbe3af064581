//! The server's own view of a case's latency: its `/metrics` histogram of the session requests
//! it answered with success (`concord_http_request_duration_seconds`), read before and after
//! the case. What the client measures beyond it was spent outside the server's handling: in
//! the network, in socket buffers and accept queues, or in the client itself — on a machine the
//! client shares with the server, queueing for the CPU.

use std::collections::BTreeMap;

use crate::http_client::{connect, exchange};

/// The histogram's name in the server's `/metrics`.
const BUCKET_SERIES: &str = "concord_http_request_duration_seconds_bucket{";

/// Cumulative counts by upper bound in microseconds (`u64::MAX` for `+Inf`), summed over the
/// session routes and the success statuses.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ServerHistogram {
    cumulative_by_upper_us: BTreeMap<u64, u64>,
}

impl ServerHistogram {
    /// Reads the server's `/metrics` at `address`; `None` if it cannot be read.
    pub(crate) async fn scrape(address: &str) -> Option<ServerHistogram> {
        let mut stream = connect(address).await.ok()?;
        let host = address.to_string();
        let request = format!("GET /metrics HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let mut page = Vec::new();
        let status = exchange(&mut stream, request.as_bytes(), &mut page)
            .await
            .ok()?;
        if status != 200 {
            return None;
        }
        // A server that has answered no session request yet has no such series: empty, not
        // unknown (the case's figures come from the page read after it).
        Some(ServerHistogram::parse(&String::from_utf8_lossy(&page)))
    }

    /// The buckets of the session routes' successful answers in a Prometheus text page.
    fn parse(page: &str) -> ServerHistogram {
        let mut cumulative_by_upper_us = BTreeMap::new();
        for line in page.lines() {
            let Some(series) = line.strip_prefix(BUCKET_SERIES) else {
                continue;
            };
            let Some((labels, count)) = series.rsplit_once("} ") else {
                continue;
            };
            let label = |name: &str| {
                labels
                    .split(',')
                    .find_map(|pair| pair.strip_prefix(name)?.strip_prefix("=\""))
                    .map(|value| value.trim_end_matches('"'))
            };
            let session_route =
                label("route").is_some_and(|route| route.starts_with("/v1/sessions"));
            let success = label("status").is_some_and(|status| status.starts_with('2'));
            let (Some(upper), Ok(count)) = (label("le"), count.trim().parse::<f64>()) else {
                continue;
            };
            if !session_route || !success {
                continue;
            }
            let upper_us = if upper == "+Inf" {
                u64::MAX
            } else {
                match upper.parse::<f64>() {
                    Ok(seconds) => (seconds * 1e6).round() as u64,
                    Err(_) => continue,
                }
            };
            *cumulative_by_upper_us.entry(upper_us).or_insert(0) += count as u64;
        }
        ServerHistogram {
            cumulative_by_upper_us,
        }
    }

    /// What was recorded after `earlier` was read.
    pub(crate) fn since(&self, earlier: &ServerHistogram) -> ServerHistogram {
        let cumulative_by_upper_us = self
            .cumulative_by_upper_us
            .iter()
            .map(|(&upper, &count)| {
                let before = earlier
                    .cumulative_by_upper_us
                    .get(&upper)
                    .copied()
                    .unwrap_or(0);
                (upper, count.saturating_sub(before))
            })
            .collect();
        ServerHistogram {
            cumulative_by_upper_us,
        }
    }

    /// The latency below which `quantile` of the requests fall, interpolated linearly inside
    /// its bucket (as Prometheus's `histogram_quantile` does); the bucket's lower bound when it
    /// is the last, unbounded one. `None` without requests.
    pub(crate) fn quantile_us(&self, quantile: f64) -> Option<u64> {
        let total = *self.cumulative_by_upper_us.get(&u64::MAX)?;
        if total == 0 {
            return None;
        }
        let rank = quantile.clamp(0.0, 1.0) * total as f64;
        let mut lower_us = 0;
        let mut below = 0;
        for (&upper_us, &cumulative) in &self.cumulative_by_upper_us {
            if cumulative as f64 >= rank && cumulative > below {
                if upper_us == u64::MAX {
                    return Some(lower_us);
                }
                let inside = (rank - below as f64) / (cumulative - below) as f64;
                return Some(lower_us + ((upper_us - lower_us) as f64 * inside) as u64);
            }
            lower_us = upper_us;
            below = cumulative;
        }
        Some(lower_us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = r#"# TYPE concord_http_request_duration_seconds histogram
concord_http_request_duration_seconds_bucket{route="/v1/sessions/batch",method="POST",status="200",le="0.1"} 10
concord_http_request_duration_seconds_bucket{route="/v1/sessions/batch",method="POST",status="200",le="0.25"} 60
concord_http_request_duration_seconds_bucket{route="/v1/sessions/batch",method="POST",status="200",le="0.5"} 100
concord_http_request_duration_seconds_bucket{route="/v1/sessions/batch",method="POST",status="200",le="+Inf"} 100
concord_http_request_duration_seconds_bucket{route="/v1/sessions/batch",method="POST",status="503",le="0.1"} 5000
concord_http_request_duration_seconds_bucket{route="/v1/sessions/batch",method="POST",status="503",le="0.25"} 5000
concord_http_request_duration_seconds_bucket{route="/v1/sessions/batch",method="POST",status="503",le="0.5"} 5000
concord_http_request_duration_seconds_bucket{route="/v1/sessions/batch",method="POST",status="503",le="+Inf"} 5000
concord_http_request_duration_seconds_bucket{route="/metrics",method="GET",status="200",le="0.1"} 3
concord_http_request_duration_seconds_bucket{route="/metrics",method="GET",status="200",le="0.25"} 3
concord_http_request_duration_seconds_bucket{route="/metrics",method="GET",status="200",le="0.5"} 3
concord_http_request_duration_seconds_bucket{route="/metrics",method="GET",status="200",le="+Inf"} 3
concord_http_request_duration_seconds_bucket{route="/v1/sessions/{client_id}",method="GET",status="200",le="0.1"} 100
concord_http_request_duration_seconds_bucket{route="/v1/sessions/{client_id}",method="GET",status="200",le="0.25"} 100
concord_http_request_duration_seconds_bucket{route="/v1/sessions/{client_id}",method="GET",status="200",le="0.5"} 100
concord_http_request_duration_seconds_bucket{route="/v1/sessions/{client_id}",method="GET",status="200",le="+Inf"} 100
concord_http_request_duration_seconds_sum{route="/v1/sessions/batch",method="POST",status="200"} 25.0
"#;

    #[test]
    fn only_the_session_routes_successes_count() {
        let histogram = ServerHistogram::parse(PAGE);
        assert_eq!(
            histogram.cumulative_by_upper_us,
            BTreeMap::from([
                (100_000, 110),
                (250_000, 160),
                (500_000, 200),
                (u64::MAX, 200)
            ])
        );
    }

    #[test]
    fn quantiles_interpolate_inside_their_bucket() {
        let histogram = ServerHistogram::parse(PAGE);
        // The 100th of 200 lies in the first bucket, which holds 110: at 100/110 of [0, 0.1].
        assert_eq!(histogram.quantile_us(0.5), Some(90_909));
        // The 198th: 38 of the 40 in (0.25, 0.5].
        assert_eq!(histogram.quantile_us(0.99), Some(487_500));
        assert_eq!(histogram.quantile_us(1.0), Some(500_000));
        assert_eq!(ServerHistogram::default().quantile_us(0.5), None);
    }

    #[test]
    fn what_came_before_the_case_is_taken_out() {
        let before = ServerHistogram::parse(PAGE);
        let after =
            ServerHistogram::parse(&PAGE.replace("le=\"+Inf\"} 100\n", "le=\"+Inf\"} 140\n"));
        let case = after.since(&before);
        assert_eq!(case.cumulative_by_upper_us[&u64::MAX], 80);
        assert_eq!(case.cumulative_by_upper_us[&500_000], 0);
        // Every request of the case was slower than the last bounded bucket: its lower bound.
        assert_eq!(case.quantile_us(0.5), Some(500_000));
    }
}
