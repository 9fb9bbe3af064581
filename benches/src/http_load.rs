//! The `http` benchmark: closed-loop session operations against a running `concord serve`, at
//! several connection counts, over keep-alive HTTP/1.1.
//!
//! Each connection sends one request, waits for the answer, and sends the next. The workload
//! decides what: creates of fresh sessions, reads (at a consistency) or patches of sessions the
//! connection created before the clock started, a mix, or batches of creates. All connections
//! are opened (and their sessions made) before the clock starts. The client is a minimal
//! HTTP/1.1 writer and reader on tokio sockets, so that on a shared 2-core machine it takes as
//! little CPU from the server as it can. Given the server's pid, the result carries the
//! server's CPU per operation and its memory before and after.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::latency::Latencies;
use crate::process_cpu::{process_cpu_time_of, rss_bytes_of};
use crate::report::{human_rate, print_json};

/// Sessions each connection creates before the clock starts, for reads and patches.
const SESSIONS_PER_CONNECTION: u64 = 16;

/// What each request does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Workload {
    /// `POST /v1/sessions` of a fresh session with a 150-byte will.
    Create,
    /// `GET /v1/sessions/{id}?consistency=...` of one of the connection's sessions.
    Get(String),
    /// `PATCH /v1/sessions/{id}` of `connection_id`.
    Patch,
    /// Per ten requests: five linearizable reads, three patches, two creates.
    Mixed,
    /// `POST /v1/sessions/batch` of this many creates.
    Batch(u64),
}

impl FromStr for Workload {
    type Err = String;

    fn from_str(word: &str) -> Result<Workload, String> {
        let (name, argument) = word.split_once(':').unwrap_or((word, ""));
        match (name, argument) {
            ("create", "") => Ok(Workload::Create),
            ("get", "") => Ok(Workload::Get("linearizable".into())),
            ("get", consistency @ ("linearizable" | "lease" | "stale")) => {
                Ok(Workload::Get(consistency.into()))
            }
            ("patch", "") => Ok(Workload::Patch),
            ("mixed", "") => Ok(Workload::Mixed),
            ("batch", size) => match size.parse::<u64>() {
                Ok(size) if (1..=10_000).contains(&size) => Ok(Workload::Batch(size)),
                _ => Err(format!("batch:<1..=10000 operations>, not {word:?}")),
            },
            _ => Err(format!(
                "create, get[:linearizable|lease|stale], patch, mixed or batch:<n>, not {word:?}"
            )),
        }
    }
}

impl Workload {
    fn name(&self) -> String {
        match self {
            Workload::Create => "create".into(),
            Workload::Get(consistency) => format!("get_{consistency}"),
            Workload::Patch => "patch".into(),
            Workload::Mixed => "mixed".into(),
            Workload::Batch(size) => format!("batch_{size}"),
        }
    }

    fn needs_sessions(&self) -> bool {
        matches!(self, Workload::Get(_) | Workload::Patch | Workload::Mixed)
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct HttpBenchConfig {
    /// The server's `host:port`.
    pub address: String,
    /// Connection counts, run in turn.
    pub connections: Vec<u64>,
    /// What each request does.
    pub workload: Workload,
    /// Measured time per case.
    pub duration: Duration,
    /// Threads of the client's runtime.
    pub client_threads: usize,
    /// The server's process id, when it runs on this machine: its CPU and memory are reported.
    pub server_pid: Option<u32>,
    /// Distinguishes this run's client ids from earlier runs' on the same data.
    pub run_id: String,
}

/// One case.
#[derive(Debug, Serialize)]
pub struct HttpResult {
    /// `"http_<workload>"`.
    pub case: String,
    /// Concurrent keep-alive connections, one request in flight each.
    pub connections: u64,
    /// Operations answered with success (a batch counts its operations).
    pub ops: u64,
    /// Requests answered with success.
    pub requests: u64,
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
    /// 99th percentile.
    pub p99_us: u64,
    /// The server's user + system CPU over the run per operation, with `--server-pid`.
    pub server_cpu_us_per_op: Option<f64>,
    /// The server's resident memory before the case, with `--server-pid`.
    pub server_rss_before_bytes: Option<u64>,
    /// And after it.
    pub server_rss_after_bytes: Option<u64>,
}

/// Runs every case, prints a table and JSON lines.
pub fn run(config: &HttpBenchConfig) -> Result<(), Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.client_threads.max(1))
        .enable_all()
        .build()?;
    println!(
        "{:>11} {:>16} {:>10} {:>8} {:>10} {:>10} {:>12}",
        "connections", "workload", "ops/s", "errors", "p50_us", "p99_us", "server_us/op"
    );
    for &connections in &config.connections {
        let result = runtime.block_on(run_case(config, connections))?;
        let errors: u64 = result.errors_by_status.values().sum();
        println!(
            "{:>11} {:>16} {:>10} {:>8} {:>10} {:>10} {:>12}",
            result.connections,
            config.workload.name(),
            human_rate(result.ops_per_sec),
            errors,
            result.p50_us,
            result.p99_us,
            result
                .server_cpu_us_per_op
                .map_or("-".to_string(), |us| format!("{us:.1}"))
        );
        if let Some(error) = &result.first_error {
            println!("            first error: {error}");
        }
        print_json(&result);
    }
    Ok(())
}

#[derive(Default)]
struct ConnectionOutcome {
    latencies_us: Vec<u32>,
    ops: u64,
    errors_by_status: BTreeMap<u16, u64>,
    first_error: Option<String>,
}

/// One connection's requests: what it sends next, from its own sessions.
struct Requests {
    /// The server's `host:port`.
    host: String,
    prefix: String,
    workload: Workload,
    sequence: u64,
}

impl Requests {
    /// The next request, and how many operations it carries.
    fn next(&mut self) -> (String, u64) {
        self.sequence += 1;
        let n = self.sequence;
        match &self.workload {
            Workload::Create => (self.create(&format!("{}/{n}", self.prefix), n), 1),
            Workload::Get(consistency) => (self.get(n, consistency), 1),
            Workload::Patch => (self.patch(n), 1),
            Workload::Mixed => match n % 10 {
                0..=4 => (self.get(n, "linearizable"), 1),
                5..=7 => (self.patch(n), 1),
                _ => (self.create(&format!("{}/{n}", self.prefix), n), 1),
            },
            Workload::Batch(size) => {
                let operations: Vec<String> = (0..*size)
                    .map(|i| {
                        format!(
                            r#"{{"op":"create","client_id":"{}/{n}/{i}","session":{}}}"#,
                            self.prefix,
                            session_fields(&self.prefix, n)
                        )
                    })
                    .collect();
                let body = format!(r#"{{"operations":[{}]}}"#, operations.join(","));
                (self.post("/v1/sessions/batch", &body), *size)
            }
        }
    }

    /// The `i`-th of the sessions made before the clock started.
    fn existing(&self, n: u64) -> String {
        format!(
            "{}%2Fseed%2F{}",
            self.prefix.replace('/', "%2F"),
            n % SESSIONS_PER_CONNECTION
        )
    }

    fn create(&self, client_id: &str, n: u64) -> String {
        let fields = session_fields(&self.prefix, n);
        let body = format!(r#"{{"client_id":"{client_id}",{}"#, &fields[1..]);
        self.post("/v1/sessions", &body)
    }

    fn get(&self, n: u64, consistency: &str) -> String {
        format!(
            "GET /v1/sessions/{}?consistency={consistency} HTTP/1.1\r\nHost: {}\r\n\r\n",
            self.existing(n),
            self.host
        )
    }

    fn patch(&self, n: u64) -> String {
        let body = format!(r#"{{"connection_id":{n}}}"#);
        format!(
            "PATCH /v1/sessions/{} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.existing(n),
            self.host,
            body.len()
        )
    }

    fn post(&self, path: &str, body: &str) -> String {
        format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.host,
            body.len()
        )
    }
}

/// A session's fields as JSON: an hour's expiry, a broker, a connection and a 150-byte will.
fn session_fields(prefix: &str, n: u64) -> String {
    format!(
        r#"{{"session_expiry_interval_secs":3600,"broker_id":"broker-1","connection_id":{n},"last_will":{{"topic":"status/{prefix}","payload_base64":"b2ZmbGluZQ==","qos":1}}}}"#
    )
}

async fn run_case(
    config: &HttpBenchConfig,
    connections: u64,
) -> Result<HttpResult, Box<dyn std::error::Error>> {
    let mut prepared = Vec::with_capacity(connections as usize);
    for index in 0..connections {
        let mut stream = TcpStream::connect(&config.address).await?;
        stream.set_nodelay(true)?;
        let prefix = format!("bench/{}/{connections}/{index}", config.run_id);
        let requests = Requests {
            host: config.address.clone(),
            prefix: prefix.clone(),
            workload: config.workload.clone(),
            sequence: 0,
        };
        if config.workload.needs_sessions() {
            let mut buffer = Vec::new();
            for i in 0..SESSIONS_PER_CONNECTION {
                let request = requests.create(&format!("{prefix}/seed/{i}"), i);
                let status = exchange(&mut stream, request.as_bytes(), &mut buffer).await?;
                if status != 201 {
                    return Err(format!(
                        "making the sessions to read: status {status}: {}",
                        String::from_utf8_lossy(&buffer)
                    )
                    .into());
                }
            }
        }
        prepared.push((stream, requests));
    }
    let server_before = config.server_pid.map(ServerUsage::read);
    let start = Instant::now();
    let deadline = start + config.duration;
    let mut tasks = tokio::task::JoinSet::new();
    for (stream, requests) in prepared {
        tasks.spawn(connection_loop(stream, requests, deadline));
    }
    let mut latencies = Latencies::new();
    let mut total = ConnectionOutcome::default();
    let mut requests_ok = 0u64;
    while let Some(joined) = tasks.join_next().await {
        let outcome = joined?;
        requests_ok += outcome.latencies_us.len() as u64;
        total.ops += outcome.ops;
        for (status, count) in outcome.errors_by_status {
            *total.errors_by_status.entry(status).or_default() += count;
        }
        if total.first_error.is_none() {
            total.first_error = outcome.first_error;
        }
        for us in outcome.latencies_us {
            latencies.record(Duration::from_micros(u64::from(us)));
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let server_after = config.server_pid.map(ServerUsage::read);
    let server_cpu_us_per_op = match (&server_before, &server_after) {
        (Some(before), Some(after)) => match (before.cpu, after.cpu) {
            (Some(a), Some(b)) if total.ops > 0 => {
                Some(b.saturating_sub(a).as_secs_f64() * 1e6 / total.ops as f64)
            }
            _ => None,
        },
        _ => None,
    };
    Ok(HttpResult {
        case: format!("http_{}", config.workload.name()),
        connections,
        ops: total.ops,
        requests: requests_ok,
        errors_by_status: total.errors_by_status,
        first_error: total.first_error,
        seconds,
        ops_per_sec: total.ops as f64 / seconds,
        p50_us: latencies.quantile_us(0.5),
        p99_us: latencies.quantile_us(0.99),
        server_cpu_us_per_op,
        server_rss_before_bytes: server_before.and_then(|usage| usage.rss_bytes),
        server_rss_after_bytes: server_after.and_then(|usage| usage.rss_bytes),
    })
}

/// The server's CPU time and resident memory at one moment (from `/proc/<pid>`).
struct ServerUsage {
    cpu: Option<Duration>,
    rss_bytes: Option<u64>,
}

impl ServerUsage {
    fn read(pid: u32) -> ServerUsage {
        ServerUsage {
            cpu: process_cpu_time_of(pid),
            rss_bytes: rss_bytes_of(pid),
        }
    }
}

async fn connection_loop(
    mut stream: TcpStream,
    mut requests: Requests,
    deadline: Instant,
) -> ConnectionOutcome {
    let mut outcome = ConnectionOutcome::default();
    let mut buffer = Vec::with_capacity(4096);
    while Instant::now() < deadline {
        let (request, operations) = requests.next();
        let sent = Instant::now();
        let status = match exchange(&mut stream, request.as_bytes(), &mut buffer).await {
            Ok(status) => status,
            Err(error) => {
                *outcome.errors_by_status.entry(0).or_default() += 1;
                outcome
                    .first_error
                    .get_or_insert(format!("connection: {error}"));
                // A server that refuses a request before reading its body closes the
                // connection: a client opens another, as real ones do.
                match TcpStream::connect(&requests.host).await {
                    Ok(fresh) => {
                        let _ = fresh.set_nodelay(true);
                        stream = fresh;
                        continue;
                    }
                    Err(_) => return outcome,
                }
            }
        };
        // A batch's operations may each fail while the batch answers 200: count the ones
        // that did not.
        let failed_in_batch = if operations > 1 && status == 200 {
            String::from_utf8_lossy(&buffer)
                .matches(r#""problem""#)
                .count() as u64
        } else {
            0
        };
        if (status == 200 || status == 201) && failed_in_batch == 0 {
            outcome
                .latencies_us
                .push(sent.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
            outcome.ops += operations;
        } else {
            *outcome.errors_by_status.entry(status).or_default() += 1;
            outcome.first_error.get_or_insert(format!(
                "status {status}: {}",
                String::from_utf8_lossy(&buffer)
                    .chars()
                    .take(300)
                    .collect::<String>()
            ));
        }
    }
    outcome
}

/// Writes one request and reads one answer (headers and a `Content-Length` body) into
/// `buffer`; returns the status code.
async fn exchange(
    stream: &mut TcpStream,
    request: &[u8],
    buffer: &mut Vec<u8>,
) -> std::io::Result<u16> {
    stream.write_all(request).await?;
    buffer.clear();
    let mut chunk = [0u8; 4096];
    let header_end = loop {
        if let Some(end) = find(buffer, b"\r\n\r\n") {
            break end + 4;
        }
        if buffer.len() > 64 * 1024 {
            return Err(std::io::Error::other("answer headers over 64 KiB"));
        }
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Err(std::io::Error::other("the server closed the connection"));
        }
        buffer.extend_from_slice(&chunk[..read]);
    };
    let head = String::from_utf8_lossy(&buffer[..header_end]).to_string();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other("not an HTTP answer"))?;
    let content_length: usize = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buffer.len() < header_end + content_length {
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Err(std::io::Error::other("the server closed the connection"));
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
    buffer.drain(..header_end);
    Ok(status)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_parse_and_build_requests() {
        assert_eq!("create".parse::<Workload>().unwrap(), Workload::Create);
        assert_eq!(
            "get:lease".parse::<Workload>().unwrap(),
            Workload::Get("lease".into())
        );
        assert_eq!("batch:50".parse::<Workload>().unwrap(), Workload::Batch(50));
        assert!("batch:0".parse::<Workload>().is_err());
        assert!("get:eventual".parse::<Workload>().is_err());
        let mut requests = Requests {
            host: "h:1".into(),
            prefix: "bench/r/1/0".into(),
            workload: Workload::Mixed,
            sequence: 0,
        };
        let kinds: Vec<String> = (0..10)
            .map(|_| requests.next().0.split(' ').next().unwrap().to_string())
            .collect();
        assert_eq!(kinds.iter().filter(|k| *k == "GET").count(), 5);
        assert_eq!(kinds.iter().filter(|k| *k == "PATCH").count(), 3);
        assert_eq!(kinds.iter().filter(|k| *k == "POST").count(), 2);
        let (get, _) = Requests {
            workload: Workload::Get("stale".into()),
            ..requests
        }
        .next();
        assert!(
            get.starts_with("GET /v1/sessions/bench%2Fr%2F1%2F0%2Fseed%2F"),
            "{get}"
        );
        assert!(get.contains("consistency=stale"), "{get}");
    }
}
