//! The `concord` binary as a user runs it: start on a free port, write sessions, stop it with
//! SIGTERM, start it again on the same data, read them back.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Server, exit_within, free_ports, initial_cluster, retrying, spawn_member};

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
    assert!(metrics.contains("concord_state_flush_duration_seconds_bucket"));
    assert!(metrics.contains("concord_state_pending_bytes"), "{metrics}");
    // No write stalls here: the gauge is there, and at most an instant (a write may be under
    // way at the scrape).
    let in_progress_secs: f64 = (metrics.lines())
        .find_map(|line| line.strip_prefix("concord_log_write_in_progress_seconds "))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no log-write gauge in {metrics}"));
    assert!(in_progress_secs < 1.0, "{in_progress_secs}");
    // Counts of entries have buckets in entries, not in seconds.
    for histogram in [
        "concord_raft_apply_batch_entries",
        "concord_raft_log_append_batch_entries",
    ] {
        assert!(
            metrics.contains(&format!("{histogram}_bucket{{le=\"1024\"}}")),
            "{metrics}"
        );
        assert!(
            !metrics.contains(&format!("{histogram}_bucket{{le=\"0.00005\"}}")),
            "{metrics}"
        );
    }
    // The plugin's own series: at least the 20 creates and the patch (the expiry scans are
    // commands too).
    let plugin_commands: u64 = metrics
        .split("concord_plugin_commands_total{plugin=\"session\"} ")
        .nth(1)
        .and_then(|rest| rest.lines().next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no plugin command count:\n{metrics}"));
    assert!(plugin_commands >= 21, "{plugin_commands}");
    assert!(metrics.contains("concord_plugin_batch_duration_seconds"));
    assert!(metrics.contains("concord_plugin_info{plugin=\"session\",sha256=\""));
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

/// A node of a few groups publishes a gauge per group; one of many groups does not (a scrape
/// would carry thousands of series per gauge), and its write-path histograms stay one series.
#[test]
fn per_group_gauges_only_on_a_node_of_few_groups() {
    for (groups, per_group) in [("4", true), ("1024", false)] {
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start(dir.path(), &["--groups", groups]);
        let body = r#"{"client_id": "one", "broker_id": "b"}"#;
        assert_eq!(server.request("POST", "/v1/sessions", Some(body)).0, 201);
        let (status, metrics) = server.request("GET", "/metrics", None);
        assert_eq!(status, 200);
        assert_eq!(
            metrics.contains("concord_raft_last_applied{group="),
            per_group,
            "{groups} groups"
        );
        assert!(metrics.contains("concord_raft_write_duration_seconds_count 1"));
        assert!(
            metrics.len() < 256 * 1024,
            "{groups} groups: {} bytes of metrics",
            metrics.len()
        );
        server.stop();
    }
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

/// A server whose standard output nobody reads any more (the script that started it closed
/// its end of the pipe) still serves: the line that names its address is not worth a stop.
#[test]
fn a_server_whose_stdout_is_closed_serves() {
    let dir = tempfile::tempdir().unwrap();
    let address = format!("127.0.0.1:{}", free_ports(1)[0]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_concord"))
        .args(["serve", "--http-addr", &address, "--log-level", "error"])
        .arg("--data-dir")
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok((200, _)) = common::try_request(&address, "GET", "/livez", &[], None) {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the server stopped: {:?}",
            child.try_wait()
        );
        assert!(std::time::Instant::now() < deadline, "never served");
        std::thread::sleep(Duration::from_millis(50));
    }
    let body = r#"{"client_id": "unread", "broker_id": "b"}"#;
    assert_eq!(
        retrying(&address, "POST", "/v1/sessions", Some(body)).0,
        201
    );
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn data_without_its_group_count_is_refused_rather_than_misrouted() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--groups", "4"]);
    let (status, answer) = server.request("POST", "/v1/sessions", Some(r#"{"client_id": "a"}"#));
    assert_eq!(status, 201, "{answer}");
    server.stop();
    std::fs::remove_file(dir.path().join("ENGINE_GROUPS")).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_concord"))
        .arg("serve")
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--http-addr", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("ENGINE_GROUPS") && stderr.contains("is missing"),
        "{stderr}"
    );
    assert!(!dir.path().join("ENGINE_GROUPS").exists(), "not rewritten");
}

/// A cluster member reads the vote quiet it said before (`VOTE_QUIET`) at every start: a
/// damaged record refuses the start with the file named and what to do (guessing a quiet
/// could let it vote while a leader's lease still counts on it), and a sound one starts.
#[test]
fn a_damaged_vote_quiet_record_refuses_the_start_and_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let members = initial_cluster(&free_ports(1));
    let server = Server::listening(spawn_member(dir.path(), &members, 1));
    let body = r#"{"client_id": "kept"}"#;
    assert_eq!(
        retrying(&server.address, "POST", "/v1/sessions", Some(body)).0,
        201
    );
    server.stop();
    let record = dir.path().join("VOTE_QUIET");
    // Ticks of 100 ms, elections after 10: a quiet of 9 ticks.
    assert_eq!(
        std::fs::read_to_string(&record).unwrap(),
        "vote_quiet_ms = 900\n"
    );

    std::fs::write(&record, "vote_quiet_ms = a while\n").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_concord"))
        .arg("serve")
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--http-addr", "127.0.0.1:0", "--groups", "4"])
        .args(["--initial-cluster", &members, "--node-id", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let Some(status) = exit_within(&mut child, Duration::from_secs(20)) else {
        let _ = child.kill();
        panic!("started on a damaged VOTE_QUIET");
    };
    let stderr = String::from_utf8_lossy(&child.wait_with_output().unwrap().stderr).to_string();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("VOTE_QUIET") && stderr.contains("remove the file"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&record).unwrap(),
        "vote_quiet_ms = a while\n",
        "not rewritten"
    );

    std::fs::write(&record, "vote_quiet_ms = 900\n").unwrap();
    let server = Server::listening(spawn_member(dir.path(), &members, 1));
    let (status, answer) = retrying(&server.address, "GET", "/v1/sessions/kept", None);
    assert_eq!(status, 200, "{answer}");
    server.stop();
}

/// A state file lost (or replaced by an older copy) after the log was compacted past it would
/// leave the writes between in neither: the node is refused with the group named, instead of
/// serving a state with holes in it.
/// Starts the binary on `data_dir`, expecting it to refuse the directory: returns its stderr
/// once it exited with an error. A node that wrongly starts would serve until stopped: it gets
/// ten seconds to exit, then the test fails naming `what` it started on.
fn refused_start(data_dir: &std::path::Path, flags: &[&str], what: &str) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_concord"))
        .arg("serve")
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--http-addr", "127.0.0.1:0", "--log-level", "warn"])
        .args(flags)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if exit_within(&mut child, Duration::from_secs(10)).is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the node started on {what}");
    }
    let output = child.wait_with_output().unwrap();
    assert!(!output.status.success());
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn a_state_lost_behind_the_compacted_log_is_refused_rather_than_served_in_part() {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--groups", "1", "--log-keep-entries", "4"];
    // The first stop flushes the state. The second run plans the log's compaction below it at
    // its first ticks (100 ms each), and the compaction rides with the next writes.
    for round in 0..2 {
        let server = Server::start(dir.path(), &flags);
        if round == 1 {
            std::thread::sleep(Duration::from_millis(500));
        }
        for i in 0..20 {
            let body = format!(r#"{{"client_id": "s{round}-{i}"}}"#);
            let (status, answer) = server.request("POST", "/v1/sessions", Some(&body));
            assert_eq!(status, 201, "{answer}");
        }
        server.stop();
    }
    std::fs::remove_file(dir.path().join("state.redb")).unwrap();
    let stderr = refused_start(dir.path(), &flags, "a state behind its compacted log");
    assert!(
        stderr.contains("group 0") && stderr.contains("compacted through"),
        "{stderr}"
    );
}

#[test]
fn a_node_alone_whose_synced_log_was_lost_is_refused_until_told_to_start_from_its_state() {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--groups", "1"];
    let server = Server::start(dir.path(), &flags);
    for i in 0..20 {
        let body = format!(r#"{{"client_id": "kept-{i}"}}"#);
        let (status, answer) = server.request("POST", "/v1/sessions", Some(&body));
        assert_eq!(status, 201, "{answer}");
    }
    // The stop flushes the state; the log (synced, the default) then goes missing.
    server.stop();
    std::fs::remove_dir_all(dir.path().join("log.wal")).unwrap();
    // Refused twice the same way: the refusal changed nothing.
    for _ in 0..2 {
        let stderr = refused_start(dir.path(), &flags, "a state ahead of a synced log");
        assert!(
            stderr.contains("group 0") && stderr.contains("lost writes it had acknowledged"),
            "{stderr}"
        );
    }

    // The operator accepts the loss: the node starts from its state, which holds them all.
    std::fs::remove_file(dir.path().join(concord_engine::LOG_SYNC_FILE)).unwrap();
    let server = Server::start(dir.path(), &flags);
    for i in 0..20 {
        let (status, answer) = server.request("GET", &format!("/v1/sessions/kept-{i}"), None);
        assert_eq!(status, 200, "{answer}");
    }
    server.stop();
}

#[test]
fn the_server_removes_expired_sessions_and_keeps_live_ones() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--session-expiry-scan-ms", "200"]);
    let sessions = [
        // A lifetime of one second and no connection: it ends.
        (
            "gone",
            r#""session_expiry_interval_secs": 1, "connection_id": 0"#,
        ),
        // The same lifetime, still held by a connection.
        (
            "held",
            r#""session_expiry_interval_secs": 1, "connection_id": 9"#,
        ),
        // Interval 0: MQTT ends it with its connection, which the broker does.
        ("zero", r#""session_expiry_interval_secs": 0"#),
        ("hour", r#""session_expiry_interval_secs": 3600"#),
    ];
    for (client_id, fields) in sessions {
        let body = format!(r#"{{"client_id": "{client_id}", {fields}}}"#);
        let (status, answer) = server.request("POST", "/v1/sessions", Some(&body));
        assert_eq!(status, 201, "{answer}");
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while server.request("GET", "/v1/sessions/gone", None).0 != 404 {
        assert!(
            std::time::Instant::now() < deadline,
            "the expired session is still there"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    for live in ["held", "zero", "hour"] {
        let (status, answer) = server.request("GET", &format!("/v1/sessions/{live}"), None);
        assert_eq!(status, 200, "{live}: {answer}");
    }
    let (_, metrics) = server.request("GET", "/metrics", None);
    assert!(
        metrics.contains("concord_sessions_expired_total 1"),
        "{metrics}"
    );
    server.stop();
}
