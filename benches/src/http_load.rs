//! The `http` benchmark: closed-loop session creates against a running `concord serve`, at
//! several connection counts, over keep-alive HTTP/1.1.
//!
//! Each connection sends `POST /v1/sessions` with a fresh client id, waits for the answer,
//! and sends the next. All connections are opened before the clock starts. The client is a
//! minimal HTTP/1.1 writer and reader on tokio sockets, so that on a shared 2-core machine it
//! takes as little CPU from the server as it can.

use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::latency::Latencies;
use crate::report::{human_rate, print_json};

/// What to run.
#[derive(Clone, Debug)]
pub struct HttpBenchConfig {
    /// The server's `host:port`.
    pub address: String,
    /// Connection counts, run in turn.
    pub connections: Vec<u64>,
    /// Measured time per case.
    pub duration: Duration,
    /// Threads of the client's runtime.
    pub client_threads: usize,
    /// Distinguishes this run's client ids from earlier runs' on the same data.
    pub run_id: String,
}

/// One case.
#[derive(Debug, Serialize)]
pub struct HttpResult {
    /// Always `"http_create"`.
    pub case: &'static str,
    /// Concurrent keep-alive connections, one request in flight each.
    pub connections: u64,
    /// Answers with status 201.
    pub created: u64,
    /// Other answers and failed connections.
    pub errors: u64,
    /// The first unexpected answer's status line, if any.
    pub first_error: Option<String>,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Creates per second.
    pub creates_per_sec: f64,
    /// Median request latency.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
}

/// Runs every case, prints a table and JSON lines.
pub fn run(config: &HttpBenchConfig) -> Result<(), Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.client_threads.max(1))
        .enable_all()
        .build()?;
    println!(
        "{:>11} {:>10} {:>8} {:>10} {:>10}",
        "connections", "creates/s", "errors", "p50_us", "p99_us"
    );
    for &connections in &config.connections {
        let result = runtime.block_on(run_case(config, connections))?;
        println!(
            "{:>11} {:>10} {:>8} {:>10} {:>10}",
            result.connections,
            human_rate(result.creates_per_sec),
            result.errors,
            result.p50_us,
            result.p99_us
        );
        if let Some(error) = &result.first_error {
            println!("            first error: {error}");
        }
        print_json(&result);
    }
    Ok(())
}

struct ConnectionOutcome {
    latencies_us: Vec<u32>,
    errors: u64,
    first_error: Option<String>,
}

async fn run_case(
    config: &HttpBenchConfig,
    connections: u64,
) -> Result<HttpResult, Box<dyn std::error::Error>> {
    let mut streams = Vec::with_capacity(connections as usize);
    for _ in 0..connections {
        let stream = TcpStream::connect(&config.address).await?;
        stream.set_nodelay(true)?;
        streams.push(stream);
    }
    let start = Instant::now();
    let deadline = start + config.duration;
    let mut tasks = tokio::task::JoinSet::new();
    for (index, stream) in streams.into_iter().enumerate() {
        let prefix = format!("bench/{}/{connections}/{index}", config.run_id);
        let host = config.address.clone();
        tasks.spawn(connection_loop(stream, host, prefix, deadline));
    }
    let mut latencies = Latencies::new();
    let (mut created, mut errors, mut first_error) = (0u64, 0u64, None);
    while let Some(joined) = tasks.join_next().await {
        let outcome = joined?;
        created += outcome.latencies_us.len() as u64;
        errors += outcome.errors;
        if first_error.is_none() {
            first_error = outcome.first_error;
        }
        for us in outcome.latencies_us {
            latencies.record(Duration::from_micros(u64::from(us)));
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(HttpResult {
        case: "http_create",
        connections,
        created,
        errors,
        first_error,
        seconds,
        creates_per_sec: created as f64 / seconds,
        p50_us: latencies.quantile_us(0.5),
        p99_us: latencies.quantile_us(0.99),
    })
}

async fn connection_loop(
    mut stream: TcpStream,
    host: String,
    prefix: String,
    deadline: Instant,
) -> ConnectionOutcome {
    let mut outcome = ConnectionOutcome {
        latencies_us: Vec::new(),
        errors: 0,
        first_error: None,
    };
    let mut buffer = Vec::with_capacity(4096);
    let mut sequence = 0u64;
    while Instant::now() < deadline {
        sequence += 1;
        let body = format!(
            r#"{{"client_id":"{prefix}/{sequence}","session_expiry_interval_secs":3600,"broker_id":"broker-1","connection_id":{sequence},"last_will":{{"topic":"status/{prefix}","payload_base64":"b2ZmbGluZQ==","qos":1}}}}"#
        );
        let request = format!(
            "POST /v1/sessions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let sent = Instant::now();
        let status = match exchange(&mut stream, request.as_bytes(), &mut buffer).await {
            Ok(status) => status,
            Err(error) => {
                outcome.errors += 1;
                outcome
                    .first_error
                    .get_or_insert(format!("connection: {error}"));
                return outcome;
            }
        };
        if status == 201 {
            outcome
                .latencies_us
                .push(sent.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
        } else {
            outcome.errors += 1;
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
