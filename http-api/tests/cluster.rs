//! Three `concord` processes on loopback ports form one cluster: writes go through the
//! leader of their group (a follower answers 421 naming it), every member reads them back,
//! the members restarted on their data form the cluster again, and a member started with a
//! membership its data does not know is refused.

mod common;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Server, request};

/// Free loopback ports, all distinct (the listeners are held until every port is chosen).
fn free_ports(count: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|listener| listener.local_addr().unwrap().port())
        .collect()
}

fn spawn(data_dir: &std::path::Path, members: &str, node: u64) -> Child {
    Command::new(env!("CARGO_BIN_EXE_concord"))
        .arg("serve")
        .arg("--data-dir")
        .arg(data_dir)
        .args([
            "--http-addr",
            "127.0.0.1:0",
            "--log-level",
            "warn",
            "--groups",
            "4",
        ])
        .args(["--initial-cluster", members, "--node-id", &node.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the concord binary starts")
}

/// The `leader` a 421 answer names.
fn named_leader(body: &str) -> Option<usize> {
    let value: serde_json::Value = serde_json::from_str(body).ok()?;
    value["leader"].as_u64().map(|id| id as usize)
}

/// Sends a request to member `first` (1-based), following 421 answers to the leader they
/// name, until a final answer or 20 s.
fn to_leader(
    members: &[Server],
    first: usize,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut target = first;
    loop {
        let (status, answer) = request(&members[target - 1].address, method, path, body);
        let retry = match status {
            421 => {
                target = named_leader(&answer).unwrap_or(target % members.len() + 1);
                true
            }
            503 => true,
            _ => false,
        };
        if !retry || Instant::now() > deadline {
            return (status, answer);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn three_processes_form_one_cluster() {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let members = free_ports(3)
        .iter()
        .enumerate()
        .map(|(i, port)| format!("{}=127.0.0.1:{port}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    // All three start before any is waited for: a member's open waits for its groups'
    // leaders, which needs a quorum.
    let children: Vec<Child> = (0..3)
        .map(|i| spawn(dirs[i].path(), &members, i as u64 + 1))
        .collect();
    let cluster: Vec<Server> = children.into_iter().map(Server::listening).collect();

    for n in 0..12 {
        let body = format!(r#"{{"client_id": "dev/{n}", "broker_id": "b", "connection_id": {n}}}"#);
        let (status, answer) = to_leader(&cluster, n % 3 + 1, "POST", "/v1/sessions", Some(&body));
        assert_eq!(status, 201, "create dev/{n}: {answer}");
    }
    // Every member has every session in its applied state.
    for member in &cluster {
        for n in 0..12 {
            let path = format!("/v1/sessions/dev%2F{n}?consistency=stale");
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let (status, answer) = request(&member.address, "GET", &path, None);
                if status == 200 {
                    assert!(
                        answer.contains(&format!(r#""connection_id":{n}"#)),
                        "{answer}"
                    );
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{} never had dev/{n}: {status} {answer}",
                    member.address
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    // A linearizable read through any member reaches the leader.
    for first in 1..=3 {
        let (status, answer) = to_leader(&cluster, first, "GET", "/v1/sessions/dev%2F5", None);
        assert_eq!(status, 200, "{answer}");
    }
    for member in cluster {
        member.stop();
    }

    // Restarted on their data, the members form the cluster again and still hold everything.
    let children: Vec<Child> = (0..3)
        .map(|i| spawn(dirs[i].path(), &members, i as u64 + 1))
        .collect();
    let cluster: Vec<Server> = children.into_iter().map(Server::listening).collect();
    for n in 0..12 {
        let path = format!("/v1/sessions/dev%2F{n}");
        let (status, answer) = to_leader(&cluster, n % 3 + 1, "GET", &path, None);
        assert_eq!(status, 200, "dev/{n} after the restart: {answer}");
    }
    let (status, answer) = to_leader(
        &cluster,
        2,
        "PATCH",
        "/v1/sessions/dev%2F3",
        Some(r#"{"connection_id": 300}"#),
    );
    assert_eq!(status, 200, "{answer}");
    for member in cluster {
        member.stop();
    }

    // Node 1's data belongs to the three-member cluster: alone, it is refused.
    let alone = Command::new(env!("CARGO_BIN_EXE_concord"))
        .arg("serve")
        .arg("--data-dir")
        .arg(dirs[0].path())
        .args(["--http-addr", "127.0.0.1:0", "--groups", "4"])
        .output()
        .unwrap();
    assert!(!alone.status.success());
    let stderr = String::from_utf8_lossy(&alone.stderr);
    assert!(stderr.contains("voters [1, 2, 3]"), "{stderr}");
}
