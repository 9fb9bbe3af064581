//! The `concord` binary started as a user starts it, and a minimal HTTP/1.1 client.

#![allow(dead_code)]

pub mod partition_proxy;
pub mod test_pki;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    pub child: Child,
    pub address: String,
}

impl Server {
    pub fn start(data_dir: &std::path::Path, extra: &[&str]) -> Server {
        let child = Command::new(env!("CARGO_BIN_EXE_concord"))
            .arg("serve")
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--http-addr", "127.0.0.1:0", "--log-level", "warn"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the concord binary starts");
        Server::listening(child)
    }

    /// A started `concord serve` (its stdout piped), once it says where it listens.
    pub fn listening(mut child: Child) -> Server {
        let address = listening_address(&mut child);
        Server { child, address }
    }

    /// One HTTP/1.1 request on a fresh connection: (status, body).
    pub fn request(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        request(&self.address, method, path, body)
    }

    /// SIGTERM, then the exit status must be success (drained and flushed).
    pub fn stop(mut self) {
        let terminated = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(terminated.success());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "concord exited with {status}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

/// Reads a started `concord serve`'s first line: the HTTP address it listens on.
fn listening_address(child: &mut Child) -> String {
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    line.trim()
        .strip_prefix("concord listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string()
}

/// Waits for `child` to exit, up to `limit`: its status, or `None` if it still runs.
pub fn exit_within(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// A committed plugin fixture, `fixtures/plugins/<name>`.
pub fn fixture(name: &str) -> std::path::PathBuf {
    [
        env!("CARGO_MANIFEST_DIR"),
        "..",
        "fixtures",
        "plugins",
        name,
    ]
    .iter()
    .collect()
}

/// The kv plugin's put: op 1, the key's length (u16 little-endian), the key, the value.
pub fn kv_put(key: &str, value: &str) -> Vec<u8> {
    let mut command = vec![1];
    command.extend_from_slice(&(key.len() as u16).to_le_bytes());
    command.extend_from_slice(key.as_bytes());
    command.extend_from_slice(value.as_bytes());
    command
}

/// Puts `value` with the kv plugin (served as `kv`) under `key` through `address`, retrying while a group elects.
pub fn put_kv(address: &str, key: &str, value: &str) {
    let path = format!("/v1/plugins/kv/commands?key={key}");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = request_bytes(
            address,
            "POST",
            &path,
            "application/octet-stream",
            &kv_put(key, value),
        );
        if status == 200 {
            return;
        }
        assert!(
            status == 503 && std::time::Instant::now() < deadline,
            "put {key}: {status} {}",
            String::from_utf8_lossy(&body)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The kv plugin's value under `key`, read linearizably.
pub fn get_kv(address: &str, key: &str) -> String {
    let (status, body) = retrying(address, "GET", &format!("/v1/plugins/kv/keys/{key}"), None);
    assert_eq!(status, 200, "get {key}: {body}");
    body
}

/// One HTTP/1.1 request with a body of `content_type`, on a fresh connection: (status, body
/// bytes).
pub fn request_bytes(
    address: &str,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> (u16, Vec<u8>) {
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: {content_type}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP answer");
    let status_line = String::from_utf8_lossy(&answer[..split]);
    let status = status_line.split(' ').nth(1).unwrap().parse().unwrap();
    (status, answer[split + 4..].to_vec())
}

/// One HTTP/1.1 request to `address` on a fresh connection: (status, body).
pub fn request(address: &str, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    request_with_headers(address, method, path, &[], body)
}

/// [`request`] with extra `headers`.
pub fn request_with_headers(
    address: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, String) {
    try_request(address, method, path, headers, body)
        .unwrap_or_else(|error| panic!("{method} {path} to {address}: {error}"))
}

/// [`request_with_headers`], with a connection that fails (a killed server) as an error.
pub fn try_request(
    address: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> std::io::Result<(u16, String)> {
    try_request_within(
        address,
        method,
        path,
        headers,
        body,
        Duration::from_secs(20),
    )
}

/// [`try_request`], given up with an error if no answer comes within `limit`.
pub fn try_request_within(
    address: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
    limit: Duration,
) -> std::io::Result<(u16, String)> {
    let extra: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    let mut stream = TcpStream::connect(address)?;
    stream.set_read_timeout(Some(limit))?;
    let body = body.unwrap_or("");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         {extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        address,
        body.len()
    );
    stream.write_all(request.as_bytes())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {answer:?}")))?;
    let body = answer
        .split_once("\r\n\r\n")
        .map_or("", |(_, body)| body)
        .to_string();
    Ok((status, body))
}

/// `concord SUBCOMMAND ARGS --endpoint http://ADDRESS` (`member`, `group`): its exit success
/// and its output, stdout then stderr.
pub fn concord_command(subcommand: &str, address: &str, args: &[&str]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_concord"))
        .arg(subcommand)
        .args(args)
        .args(["--endpoint", &format!("http://{address}")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.success(), text)
}

/// Free loopback ports, distinct from every other port this test process has handed out.
///
/// Asking the kernel for port 0 and releasing it is not enough when tests run in parallel:
/// the released port can be handed to the next caller, or taken by an outgoing connection,
/// before the member that was meant to listen on it starts. So ports come from below the
/// kernel's ephemeral range (outgoing connections never use those), each one at most once per
/// process, starting at an offset drawn from the process id so that two test processes
/// rarely walk the same ports; each is checked by binding it.
pub fn free_ports(count: usize) -> Vec<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOWEST_PORT: u32 = 10_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral_start: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .filter(|start| *start > LOWEST_PORT + 1_000)
        .unwrap_or(32_768);
    let span = ephemeral_start - LOWEST_PORT;
    let offset = std::process::id().wrapping_mul(7_919) % span;
    let mut ports = Vec::with_capacity(count);
    for _ in 0..span {
        if ports.len() == count {
            break;
        }
        let step = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (LOWEST_PORT + (offset + step) % span) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            ports.push(port);
        }
    }
    assert_eq!(
        ports.len(),
        count,
        "no free loopback ports below {ephemeral_start}"
    );
    ports
}

/// `--initial-cluster` for members 1..=n on `ports`.
pub fn initial_cluster(ports: &[u16]) -> String {
    ports
        .iter()
        .enumerate()
        .map(|(i, port)| format!("{}=127.0.0.1:{port}", i + 1))
        .collect::<Vec<_>>()
        .join(",")
}

/// Starts member `node` of the cluster `members` (4 groups) on `data_dir`; the caller waits
/// for it with [`Server::listening`] (all members first: a member's start waits for a quorum).
pub fn spawn_member(data_dir: &std::path::Path, members: &str, node: u64) -> Child {
    spawn_member_with(data_dir, members, node, &[])
}

/// [`spawn_member`] with `extra` flags.
pub fn spawn_member_with(
    data_dir: &std::path::Path,
    members: &str,
    node: u64,
    extra: &[&str],
) -> Child {
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_concord"));
    spawn_member_of(binary, data_dir, members, node, extra)
}

/// The members' log level: `warn`, or `CONCORD_TEST_MEMBER_LOG_LEVEL` (e.g. `debug`, to see
/// what the members of a failing test did).
fn member_log_level() -> String {
    std::env::var("CONCORD_TEST_MEMBER_LOG_LEVEL").unwrap_or_else(|_| "warn".into())
}

/// [`spawn_member_with`], running `binary` (another build of `concord`).
pub fn spawn_member_of(
    binary: &std::path::Path,
    data_dir: &std::path::Path,
    members: &str,
    node: u64,
    extra: &[&str],
) -> Child {
    Command::new(binary)
        .arg("serve")
        .arg("--data-dir")
        .arg(data_dir)
        .args([
            "--http-addr",
            "127.0.0.1:0",
            "--log-level",
            &member_log_level(),
            "--groups",
            "4",
        ])
        .args(["--initial-cluster", members, "--node-id", &node.to_string()])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the concord binary starts")
}

/// Sends a request to `address`, retrying 503 answers (an election) for up to 20 s.
pub fn retrying(address: &str, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (status, answer) = request(address, method, path, body);
        if status != 503 || std::time::Instant::now() > deadline {
            return (status, answer);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The leader of each group as the member at `address` sees it (0: none).
pub fn leaders(address: &str) -> Vec<u64> {
    let (_, answer) = request(address, "GET", "/v1/status", None);
    let status: serde_json::Value = serde_json::from_str(&answer).unwrap();
    (status["groups"].as_array().unwrap().iter())
        .map(|group| group["leader"].as_u64().unwrap())
        .collect()
}

/// Each group as the member at `address` sees it, one per line: leader, term, last log index,
/// asleep, stopped. A test that waited for leaders in vain prints it, to tell an election
/// that failed (the term moved on, no leader: a split vote) from a member that never
/// campaigned (the term did not move).
pub fn groups_seen_by(address: &str) -> String {
    let (_, answer) = request(address, "GET", "/v1/status", None);
    let Ok(status) = serde_json::from_str::<serde_json::Value>(&answer) else {
        return format!("{address}: no status ({answer})");
    };
    let groups = status["groups"].as_array().cloned().unwrap_or_default();
    let lines: Vec<String> = (groups.iter())
        .map(|g| {
            format!(
                "  group {} leader {} term {} last index {} asleep {} stopped {}",
                g["group"], g["leader"], g["term"], g["last_log_index"], g["asleep"], g["stopped"]
            )
        })
        .collect();
    format!("{address}:\n{}", lines.join("\n"))
}

/// The sum of the Prometheus samples in `metrics` (a `/metrics` answer) whose series begins
/// with `series`: 0 when there is none.
pub fn metric_total(metrics: &str, series: &str) -> f64 {
    (metrics.lines())
        .filter(|line| line.starts_with(series))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `(applied index, sha256)` of `group`'s state on the member at `address`.
pub fn digest(address: &str, group: u64) -> (u64, String) {
    let path = format!("/v1/cluster/groups/{group}/digest");
    let (status, answer) = request(address, "GET", &path, None);
    assert_eq!(status, 200, "{answer}");
    let digest: serde_json::Value = serde_json::from_str(&answer).unwrap();
    (
        digest["applied_index"].as_u64().unwrap(),
        digest["sha256"].as_str().unwrap().to_string(),
    )
}

/// Waits up to `limit` until the members at `addresses` hold the same state, at the same
/// applied index, in every group `0..groups`; panics with their digests and statuses if not.
pub fn wait_converged(addresses: &[&str], groups: u64, limit: Duration) {
    let deadline = std::time::Instant::now() + limit;
    for group in 0..groups {
        loop {
            let digests: Vec<(u64, String)> = addresses.iter().map(|a| digest(a, group)).collect();
            if digests.iter().all(|d| *d == digests[0]) {
                break;
            }
            if std::time::Instant::now() > deadline {
                let statuses: Vec<String> = addresses
                    .iter()
                    .map(|a| request(a, "GET", "/v1/status", None).1)
                    .collect();
                panic!("group {group} never converged: {digests:?}\n{statuses:#?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Debian's Chromium, for the tests that render pages; `None` (after a message) where it is not
/// installed, except under `CI=true`, where `.ci/run` installs it and its absence fails the test.
pub fn chromium_or_skip(what: &str) -> Option<std::path::PathBuf> {
    let found = ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .map(|name| std::path::Path::new("/usr/bin").join(name))
        .find(|path| path.exists());
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but no Chromium in /usr/bin (.ci/run installs it)"
        );
        println!("SKIPPED ({what}): no Chromium in /usr/bin (apt-get install chromium)");
    }
    found
}

/// Runs headless `chromium` on `url` with `args` (`--dump-dom`, `--screenshot=...`), with
/// `virtual_time_ms` of virtual time (a page's timers run that long, quickly).
pub fn headless_chromium(
    chromium: &std::path::Path,
    virtual_time_ms: u32,
    args: &[&str],
    url: &str,
) -> std::process::Output {
    Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
        ])
        .arg(format!("--virtual-time-budget={virtual_time_ms}"))
        .args(args)
        .arg(url)
        .output()
        .expect("chromium runs")
}
