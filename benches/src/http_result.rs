//! What one case of the `http` benchmark measured: its JSON line (`HttpResult`, with its
//! second-by-second timeline), as the load tool prints it and the report reads it back.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One second (or the last part of one) of a case.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LoadSecond {
    /// Seconds since the clock started, at the end of this interval.
    pub at_secs: f64,
    /// Operations answered with success per second.
    pub ops_per_sec: f64,
    /// Median latency of the interval's requests.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// Failed requests.
    pub errors: u64,
    /// The server's CPU over the interval per operation, when its pid is known.
    pub server_cpu_us_per_op: Option<f64>,
    /// The server's resident memory at the end of the interval, when its pid is known.
    #[serde(default)]
    pub server_rss_bytes: Option<u64>,
}

fn counted_client_ids() -> String {
    "counter".into()
}

/// One case.
#[derive(Debug, Serialize, Deserialize)]
pub struct HttpResult {
    /// The run's label (`--label`).
    #[serde(default)]
    pub label: String,
    /// `"http_<workload>"`.
    pub case: String,
    /// How the created sessions' ids followed one another: `"counter"` or `"random"`.
    #[serde(default = "counted_client_ids")]
    pub client_ids: String,
    /// `"closed"` or `"open"` loop.
    #[serde(default = "closed_loop")]
    pub mode: String,
    /// The open loop's target rate, requests per second.
    #[serde(default)]
    pub target_rate_per_sec: Option<f64>,
    /// Concurrent keep-alive connections, one request in flight each.
    pub connections: u64,
    /// Operations answered with success (a batch counts its operations).
    pub ops: u64,
    /// Requests answered with success.
    pub requests: u64,
    /// Open loop: requests that were due before the end but never sent, because the server
    /// (or the client) fell behind the rate.
    #[serde(default)]
    pub unsent_requests: u64,
    /// Failed requests by status (0: the connection failed).
    pub errors_by_status: BTreeMap<u16, u64>,
    /// The first unexpected answer, if any.
    pub first_error: Option<String>,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Operations per second.
    pub ops_per_sec: f64,
    /// Median request latency.
    pub p50_us: u64,
    /// 90th percentile.
    #[serde(default)]
    pub p90_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    #[serde(default)]
    pub p999_us: u64,
    /// The slowest request.
    #[serde(default)]
    pub max_us: u64,
    /// The server's user + system CPU over the case per operation.
    pub server_cpu_us_per_op: Option<f64>,
    /// The same split by kind of server thread (a thread's name without its numbers: the
    /// HTTP runtime's, `concord-raft`, `concord-apply`, ...), when its pid is known.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub server_cpu_us_per_op_by_thread: BTreeMap<String, f64>,
    /// How long each kind of server thread waited for a core, in ms per second of the case
    /// (the kernel's run-queue wait), when its pid is known: a thread near 1000 was ready to
    /// run but had no core most of the time.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub server_run_queue_wait_ms_per_sec_by_thread: BTreeMap<String, f64>,
    /// How often each kind of server thread was switched out per thousand operations,
    /// `[voluntary, involuntary]`, when its pid is known.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub server_context_switches_per_1k_ops_by_thread: BTreeMap<String, [f64; 2]>,
    /// The server's own median latency of the session requests it answered with success
    /// during the case, from its `/metrics` histogram (interpolated inside a bucket): the
    /// client's figure beyond it was spent outside the server's handling.
    #[serde(default)]
    pub server_p50_us: Option<u64>,
    /// The server's own 99th percentile, likewise.
    #[serde(default)]
    pub server_p99_us: Option<u64>,
    /// A cache line's round trip between two of the machine's cores, in nanoseconds, measured
    /// just before the case (`core_round_trip.rs`).
    #[serde(default)]
    pub core_round_trip_ns: Option<f64>,
    /// The same measured just after the case.
    #[serde(default)]
    pub core_round_trip_after_ns: Option<f64>,
    /// The server's resident memory before the case.
    pub server_rss_before_bytes: Option<u64>,
    /// And after it.
    pub server_rss_after_bytes: Option<u64>,
    /// Second by second.
    #[serde(default)]
    pub timeline: Vec<LoadSecond>,
}

/// The mode of a closed-loop case, and of a JSON line written before open loops existed.
pub(crate) fn closed_loop() -> String {
    "closed".into()
}

impl HttpResult {
    /// Failed requests, every status together.
    pub fn errors(&self) -> u64 {
        self.errors_by_status.values().sum()
    }
}

/// A latency for people: `850us`, `4.2ms`, `1.25s`.
pub(crate) fn human_latency(us: u64) -> String {
    if us >= 1_000_000 {
        format!("{:.2}s", us as f64 / 1e6)
    } else if us >= 10_000 {
        format!("{:.0}ms", us as f64 / 1e3)
    } else if us >= 1_000 {
        format!("{:.1}ms", us as f64 / 1e3)
    } else {
        format!("{us}us")
    }
}
