//! The `http` benchmark: session operations against a running `concord serve` (or cluster
//! member), at several connection counts, over keep-alive HTTP/1.1.
//!
//! Closed loop (the default): each connection sends one request, waits for the answer, and
//! sends the next. Open loop (`rate_per_sec`): requests are due at a fixed total rate, spread
//! evenly over the connections; a request that goes out late because its connection was still
//! waiting for an earlier answer is measured from the time it was *due*, not the time it was
//! sent, so a server that stalls is charged for the requests that queued behind the stall (no
//! coordinated omission). A connection has one request in flight at a time: when the server
//! falls behind, requests go out late and their latency shows it; what is still unsent at the
//! end is counted, not sent.
//!
//! The workload decides what each request does (`http_workload.rs`). All connections are opened
//! (and their sessions made) before the clock starts. Once a second a live line gives the rate,
//! p50, p99 and errors by status; on a terminal a progress bar runs on stderr. Each case ends
//! with one JSON line (with its per-second timeline), and the run with a summary table and,
//! with `report`, an HTML page of charts (`http_report.rs`). Latencies are kept in HDR
//! histograms. Given the server's pid, or when a process of this machine listens on the
//! address's port, each case carries the server's CPU per operation and its memory before and
//! after, and when the server's `/metrics` can be read, its own p50 and p99 of the case
//! (`server_latency.rs`).

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

use crate::core_round_trip::{core_round_trip_ns, core_round_trip_text};
use crate::http_client::{connect, exchange, find};
use crate::http_intervals::{Interval, IntervalRecorder};
use crate::http_report::{self, ReportRun};
use crate::http_result::{HttpResult, LoadSecond, closed_loop, human_latency};
use crate::http_workload::{ClientIds, Requests, SESSIONS_PER_CONNECTION, Workload};
use crate::process_cpu::{
    ContextSwitches, ThreadReading, by_thread_kind, by_thread_text, ms_per_second,
    pid_listening_on, process_cpu_time_of, rss_bytes_of, switches_per_1k_operations, switches_text,
    thread_context_switches_of, thread_cpu_times_of, thread_run_queue_waits_of, us_per_operation,
};
use crate::report::{human_rate, print_json};
use crate::server_latency::ServerHistogram;

/// What to run.
#[derive(Clone, Debug)]
pub struct HttpBenchConfig {
    /// The server's `host:port`.
    pub address: String,
    /// Connection counts, run in turn.
    pub connections: Vec<u64>,
    /// What each request does.
    pub workload: Workload,
    /// How the ids of the sessions created follow one another (creates, and mixed's creates).
    pub client_ids: ClientIds,
    /// Measured time per case.
    pub duration: Duration,
    /// Open loop at this many requests per second in total; `None`: closed loop.
    pub rate_per_sec: Option<f64>,
    /// Threads of the client's runtime.
    pub client_threads: usize,
    /// The server's process id; `None`: the process listening on the address's port, if it is
    /// on this machine and readable.
    pub server_pid: Option<u32>,
    /// Distinguishes this run's client ids from earlier runs' on the same data.
    pub run_id: String,
    /// Names this run in reports that compare runs.
    pub label: String,
    /// Where to write the HTML report, if anywhere.
    pub report: Option<PathBuf>,
    /// Earlier runs' output (JSON lines) to compare with in the report.
    pub compare: Vec<PathBuf>,
    /// Whether to print the per-second lines (the summary and JSON lines are always printed).
    pub live: bool,
}

/// Runs every case: live lines while each runs, a JSON line after each, a summary table at the
/// end, and the report if asked for. Returns the cases' results.
pub fn run(config: &HttpBenchConfig) -> Result<Vec<HttpResult>, Box<dyn std::error::Error>> {
    // Read the runs to compare with first: a wrong path fails before the load, not after.
    let earlier_runs = http_report::read_runs(&config.compare)?;
    let server_pid = config.server_pid.or_else(|| {
        let port = config.address.rsplit(':').next()?.parse().ok()?;
        let pid = pid_listening_on(port)?;
        println!("server: pid {pid} (listens on port {port}): its CPU and memory are reported");
        Some(pid)
    });
    if let Some(rate) = config.rate_per_sec {
        warn_if_rate_is_too_fine(rate, &config.connections);
    }
    // One thread: a current-thread runtime, whose queue of woken connections is first come,
    // first served. A one-thread work-stealing runtime has nothing to steal from and a bounded
    // local queue that spills its oldest half behind the newer tasks: with thousands of
    // connections it answered some connections' responses much later than others', and the
    // latency measured was partly the tool's own.
    let runtime = match config.client_threads {
        0 | 1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
        threads => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()?,
    };
    let mut results = Vec::with_capacity(config.connections.len());
    for (index, &connections) in config.connections.iter().enumerate() {
        let case = CaseRun {
            config,
            connections,
            server_pid,
            number: index + 1,
            of: config.connections.len(),
        };
        let result = runtime.block_on(case.run())?;
        print_json(&result);
        results.push(result);
    }
    print_summary(&results);
    if let Some(path) = &config.report {
        let mut runs = vec![ReportRun {
            label: config.label.clone(),
            results,
        }];
        runs.extend(earlier_runs);
        http_report::write_report(
            path,
            &format!("concord-bench http: {}", config.address),
            &runs,
        )?;
        println!("report: {}", path.display());
        results = runs.swap_remove(0).results;
    }
    Ok(results)
}

/// Open-loop pacing sleeps on tokio's timer, which wakes to the millisecond: a connection due
/// more often than that sends in bursts, and the latency from the due time includes the wait.
fn warn_if_rate_is_too_fine(rate_per_sec: f64, connections: &[u64]) {
    for &count in connections {
        let interval_ms = count as f64 * 1000.0 / rate_per_sec;
        if interval_ms < 2.0 {
            eprintln!(
                "note: at {rate_per_sec}/s over {count} connections each is due every \
                 {interval_ms:.2} ms, finer than the 1 ms timer: use at least {} connections \
                 for latencies without pacing error",
                (rate_per_sec / 500.0).ceil()
            );
        }
    }
}

fn print_summary(results: &[HttpResult]) {
    println!(
        "{:>11} {:>16} {:>6} {:>10} {:>8} {:>9} {:>9} {:>9} {:>12} {:>14}",
        "connections",
        "workload",
        "loop",
        "ops/s",
        "errors",
        "p50",
        "p99",
        "p99.9",
        "server_us/op",
        "server_rss_mb"
    );
    for result in results {
        println!(
            "{:>11} {:>16} {:>6} {:>10} {:>8} {:>9} {:>9} {:>9} {:>12} {:>14}",
            result.connections,
            result.case.trim_start_matches("http_"),
            result.mode,
            human_rate(result.ops_per_sec),
            result.errors(),
            human_latency(result.p50_us),
            human_latency(result.p99_us),
            human_latency(result.p999_us),
            result
                .server_cpu_us_per_op
                .map_or("-".to_string(), |us| format!("{us:.1}")),
            match (
                result.server_rss_before_bytes,
                result.server_rss_after_bytes
            ) {
                (Some(before), Some(after)) => format!("{} -> {}", before >> 20, after >> 20),
                _ => "-".to_string(),
            }
        );
        if let (Some(p50), Some(p99)) = (result.server_p50_us, result.server_p99_us) {
            println!(
                "            the server's own p50 {} p99 {} (its /metrics, from the request to its answer)",
                human_latency(p50),
                human_latency(p99)
            );
        }
        if !result.server_cpu_us_per_op_by_thread.is_empty() {
            let by_thread = by_thread_text(&result.server_cpu_us_per_op_by_thread, 1);
            println!("            the server's CPU µs/op by thread: {by_thread}");
        }
        if !result.server_run_queue_wait_ms_per_sec_by_thread.is_empty() {
            let by_thread = by_thread_text(&result.server_run_queue_wait_ms_per_sec_by_thread, 0);
            println!("            the server's threads waited for a core, ms/s: {by_thread}");
        }
        if !result
            .server_context_switches_per_1k_ops_by_thread
            .is_empty()
        {
            let by_thread = switches_text(&result.server_context_switches_per_1k_ops_by_thread);
            println!(
                "            the server's threads switched out per 1k ops, voluntary + involuntary: {by_thread}"
            );
        }
        if let Some(line) =
            core_round_trip_text(result.core_round_trip_ns, result.core_round_trip_after_ns)
        {
            println!("            {line}");
        }
        if let Some(error) = &result.first_error {
            println!("            first error: {error}");
        }
        if result.unsent_requests > 0 {
            println!(
                "            {} requests were due but never sent: the rate was not reached",
                result.unsent_requests
            );
        }
    }
}

/// How a connection times its requests.
#[derive(Clone, Copy)]
enum Pace {
    /// The next request as soon as the answer is in; latency from the send.
    Closed,
    /// Request `k` is due at `first + k * every`; latency from the due time when it leaves late.
    Open { first: Instant, every: Duration },
}

/// One case of a run: `connections` connections for the configured time.
struct CaseRun<'a> {
    config: &'a HttpBenchConfig,
    connections: u64,
    server_pid: Option<u32>,
    /// This case's place in the run, for the progress bar.
    number: usize,
    of: usize,
}

/// The server's threads at one moment: each one's CPU time, its wait for a core and its
/// context switches.
struct ServerThreads {
    cpu: ThreadReading,
    waits: ThreadReading,
    switches: ThreadReading<ContextSwitches>,
}

impl ServerThreads {
    fn read(pid: u32) -> ServerThreads {
        ServerThreads {
            cpu: thread_cpu_times_of(pid),
            waits: thread_run_queue_waits_of(pid),
            switches: thread_context_switches_of(pid),
        }
    }
}

impl CaseRun<'_> {
    async fn run(&self) -> Result<HttpResult, Box<dyn std::error::Error>> {
        let config = self.config;
        // Before the connections open: the machine is as quiet as it will be.
        let round_trip_before_ns = core_round_trip_ns();
        let prepared = self.open_connections().await?;
        let recorder = Arc::new(IntervalRecorder::new());
        let server_before = self.server_pid.map(ServerUsage::read);
        let server_threads_before = self.server_pid.map(ServerThreads::read);
        let histogram_before = ServerHistogram::scrape(&config.address).await;
        let start = Instant::now();
        let deadline = start + config.duration;
        let mut tasks = tokio::task::JoinSet::new();
        for (index, (stream, requests)) in prepared.into_iter().enumerate() {
            let pace = match config.rate_per_sec {
                None => Pace::Closed,
                Some(rate) => {
                    let every = Duration::from_secs_f64(self.connections as f64 / rate);
                    // Staggered, so that the connections' requests are due evenly.
                    let offset = every.mul_f64(index as f64 / self.connections as f64);
                    Pace::Open {
                        first: start + offset,
                        every,
                    }
                }
            };
            tasks.spawn(connection_loop(
                stream,
                requests,
                Arc::clone(&recorder),
                pace,
                deadline,
            ));
        }

        let mut total = Interval::new();
        let mut timeline = Vec::new();
        let mut second_ticks = tokio::time::interval_at(
            (start + Duration::from_secs(1)).into(),
            Duration::from_secs(1),
        );
        second_ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let show_progress = std::io::stderr().is_terminal();
        let mut progress_ticks = tokio::time::interval(Duration::from_millis(250));
        let mut last_tick = start;
        let mut last_server = server_before;
        loop {
            tokio::select! {
                joined = tasks.join_next() => match joined {
                    Some(outcome) => outcome?,
                    None => break,
                },
                _ = second_ticks.tick() => {
                    let now = Instant::now();
                    let interval = recorder.take();
                    let server_now = self.server_pid.map(ServerUsage::read);
                    let second = load_second(&interval, start, last_tick, now, &last_server, &server_now);
                    if show_progress {
                        clear_progress();
                    }
                    if config.live {
                        self.print_live_line(&second, &interval);
                    }
                    timeline.push(second);
                    total.absorb(interval);
                    last_tick = now;
                    last_server = server_now;
                }
                _ = progress_ticks.tick(), if show_progress => {
                    self.draw_progress(start, total.ops);
                }
            }
        }
        if show_progress {
            clear_progress();
        }
        let seconds = start.elapsed().as_secs_f64();
        let server_after = self.server_pid.map(ServerUsage::read);
        let last = recorder.take();
        let now = Instant::now();
        // The requests in flight at the deadline end a moment later: a sliver that short would
        // only be noise as a point of its own, so it counts in the totals only.
        if last.requests() + last.errors() > 0 && now - last_tick >= Duration::from_millis(250) {
            let second = load_second(&last, start, last_tick, now, &last_server, &server_after);
            if config.live {
                self.print_live_line(&second, &last);
            }
            timeline.push(second);
        }
        total.absorb(last);
        // The load has stopped; the server's threads go idle.
        let round_trip_after_ns = core_round_trip_ns();
        let server_cpu_us_per_op = cpu_us_per_op(&server_before, &server_after, total.ops);
        let (
            server_cpu_us_per_op_by_thread,
            server_run_queue_wait_ms_per_sec_by_thread,
            server_context_switches_per_1k_ops_by_thread,
        ) = match (
            server_threads_before,
            self.server_pid.map(ServerThreads::read),
        ) {
            (Some(before), Some(after)) => (
                us_per_operation(by_thread_kind(&before.cpu, &after.cpu), total.ops),
                ms_per_second(by_thread_kind(&before.waits, &after.waits), seconds),
                switches_per_1k_operations(
                    by_thread_kind(&before.switches, &after.switches),
                    total.ops,
                ),
            ),
            _ => (BTreeMap::new(), BTreeMap::new(), BTreeMap::new()),
        };
        let server_histogram = match (
            histogram_before,
            ServerHistogram::scrape(&config.address).await,
        ) {
            (Some(before), Some(after)) => Some(after.since(&before)),
            _ => None,
        };
        let server_quantile = |quantile| {
            server_histogram
                .as_ref()
                .and_then(|h| h.quantile_us(quantile))
        };
        Ok(HttpResult {
            label: config.label.clone(),
            case: format!("http_{}", config.workload.name()),
            client_ids: config.client_ids.name().into(),
            mode: if config.rate_per_sec.is_some() {
                "open".into()
            } else {
                closed_loop()
            },
            target_rate_per_sec: config.rate_per_sec,
            connections: self.connections,
            ops: total.ops,
            requests: total.requests(),
            unsent_requests: total.unsent,
            seconds,
            ops_per_sec: total.ops as f64 / seconds,
            p50_us: total.quantile_us(0.5),
            p90_us: total.quantile_us(0.9),
            p99_us: total.quantile_us(0.99),
            p999_us: total.quantile_us(0.999),
            max_us: total.quantile_us(1.0),
            errors_by_status: total.errors_by_status,
            first_error: total.first_error,
            server_cpu_us_per_op,
            server_cpu_us_per_op_by_thread,
            server_run_queue_wait_ms_per_sec_by_thread,
            server_context_switches_per_1k_ops_by_thread,
            server_p50_us: server_quantile(0.5),
            server_p99_us: server_quantile(0.99),
            core_round_trip_ns: round_trip_before_ns,
            core_round_trip_after_ns: round_trip_after_ns,
            server_rss_before_bytes: server_before.and_then(|usage| usage.rss_bytes),
            server_rss_after_bytes: server_after.and_then(|usage| usage.rss_bytes),
            timeline,
        })
    }

    /// Every connection, opened (with its sessions made, for workloads that read or patch)
    /// before the clock starts.
    async fn open_connections(
        &self,
    ) -> Result<Vec<(TcpStream, Requests)>, Box<dyn std::error::Error>> {
        let config = self.config;
        let mut prepared = Vec::with_capacity(self.connections as usize);
        for index in 0..self.connections {
            let mut stream = connect(&config.address)
                .await
                .map_err(|error| format!("cannot connect to {}: {error}", config.address))?;
            let prefix = format!("bench/{}/{}/{index}", config.run_id, self.connections);
            let requests = Requests {
                host: config.address.clone(),
                prefix: prefix.clone(),
                workload: config.workload.clone(),
                sequence: 0,
                client_ids: config.client_ids,
                random_state: index,
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
        Ok(prepared)
    }

    fn print_live_line(&self, second: &LoadSecond, interval: &Interval) {
        let errors = if interval.errors_by_status.is_empty() {
            "0".to_string()
        } else {
            interval
                .errors_by_status
                .iter()
                .map(|(status, count)| format!("{count}x{status}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        println!(
            "{:>6.1}s {:>6} conn {:>14} {:>9} ops/s  p50 {:>7}  p99 {:>7}  server {:>7} {:>8}  errors {errors}",
            second.at_secs,
            self.connections,
            self.config.workload.name(),
            human_rate(second.ops_per_sec),
            human_latency(second.p50_us),
            human_latency(second.p99_us),
            second
                .server_cpu_us_per_op
                .map_or("-".to_string(), |us| format!("{us:.1}us/op")),
            second
                .server_rss_bytes
                .map_or(String::new(), |bytes| format!("{}MiB", bytes >> 20)),
        );
    }

    fn draw_progress(&self, start: Instant, ops_so_far: u64) {
        const WIDTH: usize = 30;
        let total = self.config.duration.as_secs_f64();
        let done = start.elapsed().as_secs_f64().min(total);
        let filled = ((done / total.max(f64::EPSILON)) * WIDTH as f64) as usize;
        let mut stderr = std::io::stderr().lock();
        let _ = write!(
            stderr,
            "\r[{}{}] case {}/{} {:.0}/{:.0} s, {} ops",
            "#".repeat(filled.min(WIDTH)),
            ".".repeat(WIDTH - filled.min(WIDTH)),
            self.number,
            self.of,
            done,
            total,
            ops_so_far
        );
        let _ = stderr.flush();
    }
}

/// Erases the progress bar's line (stderr is a terminal).
fn clear_progress() {
    let mut stderr = std::io::stderr().lock();
    let _ = write!(stderr, "\r\x1b[2K");
    let _ = stderr.flush();
}

fn load_second(
    interval: &Interval,
    start: Instant,
    from: Instant,
    to: Instant,
    server_from: &Option<ServerUsage>,
    server_to: &Option<ServerUsage>,
) -> LoadSecond {
    let seconds = to.duration_since(from).as_secs_f64().max(f64::EPSILON);
    LoadSecond {
        at_secs: to.duration_since(start).as_secs_f64(),
        ops_per_sec: interval.ops as f64 / seconds,
        p50_us: interval.quantile_us(0.5),
        p99_us: interval.quantile_us(0.99),
        errors: interval.errors(),
        server_cpu_us_per_op: cpu_us_per_op(server_from, server_to, interval.ops),
        server_rss_bytes: server_to.as_ref().and_then(|usage| usage.rss_bytes),
    }
}

fn cpu_us_per_op(
    before: &Option<ServerUsage>,
    after: &Option<ServerUsage>,
    ops: u64,
) -> Option<f64> {
    let before = before.as_ref()?.cpu?;
    let after = after.as_ref()?.cpu?;
    (ops > 0).then(|| after.saturating_sub(before).as_secs_f64() * 1e6 / ops as f64)
}

/// The server's CPU time and resident memory at one moment (from `/proc/<pid>`).
#[derive(Clone, Copy)]
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
    recorder: Arc<IntervalRecorder>,
    pace: Pace,
    deadline: Instant,
) {
    let mut buffer = Vec::with_capacity(4096);
    let mut refused: Option<(String, u64)> = None;
    let mut closed_after_refusal = false;
    for k in 0u64.. {
        let due = match pace {
            Pace::Closed => Instant::now(),
            Pace::Open { first, every } => {
                first + Duration::from_nanos((every.as_nanos() as u64).saturating_mul(k))
            }
        };
        if due >= deadline {
            return;
        }
        if let Pace::Open { first, every } = pace
            && Instant::now() >= deadline
        {
            // Behind the rate at the end: what was due and never sent is reported, not sent
            // late (which would stretch the case past its duration).
            let due_in_case = deadline.duration_since(first).as_nanos() / every.as_nanos().max(1);
            recorder.unsent(
                u64::try_from(due_in_case)
                    .unwrap_or(u64::MAX)
                    .saturating_sub(k)
                    + 1,
            );
            return;
        }
        // Latency counts from the due time when the request is late because the connection
        // was still waiting for an earlier answer (the server's delay), and from the send when
        // the connection was idle until it was due (the timer wakes up to a millisecond late:
        // that delay is the client's own).
        let latency_from = if due > Instant::now() {
            tokio::time::sleep_until(due.into()).await;
            Instant::now()
        } else {
            due
        };
        // A request the server refused (503: nothing applied) is sent again, as a client
        // would; only a new one costs the building of its body (a batch's is large).
        let (request, operations) = match refused.take() {
            Some(again) => again,
            None => requests.next(),
        };
        let status = match exchange(&mut stream, request.as_bytes(), &mut buffer).await {
            Ok(status) => status,
            Err(error) => {
                recorder.failure(0, || format!("connection: {error}"));
                // A server that refuses a request before reading its body closes the
                // connection: a client opens another, as real ones do. A request that failed
                // on the connection the server closed after a refusal was never read, so it
                // is still the refused one; any other may have applied and is not repeated.
                if closed_after_refusal {
                    refused = Some((request, operations));
                }
                closed_after_refusal = false;
                match connect(&requests.host).await {
                    Ok(fresh) => {
                        stream = fresh;
                        continue;
                    }
                    Err(_) => return,
                }
            }
        };
        let overloaded = status == 503 && find(&buffer, OVERLOADED_TYPE.as_bytes()).is_some();
        closed_after_refusal = overloaded;
        // A batch's operations may each fail while the batch answers 200: count the ones
        // that did not.
        let failed_in_batch = operations > 1
            && status == 200
            && String::from_utf8_lossy(&buffer).contains(r#""problem""#);
        if matches!(status, 200 | 201 | 204) && !failed_in_batch {
            recorder.success(latency_from.elapsed(), operations);
        } else {
            recorder.failure(status, || {
                format!(
                    "status {status}: {}",
                    String::from_utf8_lossy(&buffer)
                        .chars()
                        .take(300)
                        .collect::<String>()
                )
            });
        }
        if overloaded {
            refused = Some((request, operations));
        }
    }
}

/// The problem type of a refusal for overload: nothing was applied.
const OVERLOADED_TYPE: &str = "urn:concord:problem:overloaded";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_read_in_their_unit() {
        assert_eq!(human_latency(850), "850us");
        assert_eq!(human_latency(4_240), "4.2ms");
        assert_eq!(human_latency(48_000), "48ms");
        assert_eq!(human_latency(1_250_000), "1.25s");
    }

    #[test]
    fn results_of_older_runs_still_read() {
        let older = r#"{"case":"http_create","connections":256,"ops":1000,"requests":1000,
            "errors_by_status":{"503":2},"first_error":null,"seconds":10.0,"ops_per_sec":100.0,
            "p50_us":900,"p99_us":5000,"server_cpu_us_per_op":21.5,
            "server_rss_before_bytes":null,"server_rss_after_bytes":null}"#;
        let result: HttpResult = serde_json::from_str(older).unwrap();
        assert_eq!(result.mode, "closed");
        assert_eq!(result.errors(), 2);
        assert!(result.timeline.is_empty());
    }
}
