//! The `concord` binary as a user runs it: start on a free port, write sessions, stop it with
//! SIGTERM, start it again on the same data, read them back.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Server {
    child: Child,
    address: String,
}

impl Server {
    fn start(data_dir: &std::path::Path, extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_concord"))
            .arg("serve")
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--http-addr", "127.0.0.1:0", "--log-level", "warn"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the concord binary starts");
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        let address = line
            .trim()
            .strip_prefix("concord listening on http://")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        Server { child, address }
    }

    /// One HTTP/1.1 request on a fresh connection: (status, body).
    fn request(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        let mut stream = TcpStream::connect(&self.address).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let body = body.unwrap_or("");
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.address,
            body.len()
        );
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        let status = answer
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
        let body = answer
            .split_once("\r\n\r\n")
            .map_or("", |(_, body)| body)
            .to_string();
        (status, body)
    }

    /// SIGTERM, then the exit status must be success (drained and flushed).
    fn stop(mut self) {
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

#[test]
fn sessions_survive_a_restart_of_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    for n in 0..20 {
        let body = format!(r#"{{"client_id": "dev/{n}", "broker_id": "b", "connection_id": {n}}}"#);
        let (status, answer) = server.request("POST", "/v1/sessions", Some(&body));
        assert_eq!(status, 201, "{answer}");
    }
    let (status, answer) = server.request(
        "PATCH",
        "/v1/sessions/dev%2F7",
        Some(r#"{"connection_id": 700}"#),
    );
    assert_eq!(status, 200, "{answer}");
    let (status, metrics) = server.request("GET", "/metrics", None);
    assert_eq!(status, 200);
    assert!(
        metrics.contains("concord_http_request_duration_seconds_bucket"),
        "{metrics}"
    );
    assert!(metrics.contains("concord_raft_write_duration_seconds"));
    server.stop();

    let server = Server::start(dir.path(), &[]);
    let (status, answer) = server.request("GET", "/v1/sessions/dev%2F7", None);
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains(r#""connection_id":700"#), "{answer}");
    assert!(answer.contains(r#""version":2"#), "{answer}");
    let (status, answer) = server.request("GET", "/v1/sessions?prefix=dev%2F&limit=1000", None);
    assert_eq!(status, 200);
    assert_eq!(answer.matches("\"client_id\"").count(), 20, "{answer}");
    let (status, _) = server.request("GET", "/readyz", None);
    assert_eq!(status, 200);
    server.stop();
}

#[test]
fn bad_settings_stop_the_binary_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("concord.toml");
    std::fs::write(&config, "grups = 4\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_concord"))
        .args(["serve", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unknown field `grups`"), "{stderr}");

    let output = Command::new(env!("CARGO_BIN_EXE_concord"))
        .args(["serve", "--backend", "tape"])
        .env("CONCORD_DATA_DIR", dir.path().join("data"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("backend"), "{stderr}");
}
