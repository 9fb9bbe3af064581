//! Three `concord` processes on loopback ports form one cluster: any member takes any write
//! (a follower forwards it to the leader) and serves reads at every consistency; a client
//! that asks not to be forwarded gets 421 with the leader's id and URL; the members restarted
//! on their data form the cluster again; a member started with a membership its data does
//! not know is refused. A group's leadership moves on request, over HTTP and through `concord
//! group transfer`. The same holds over mutual TLS, and with two raft workers per member.

mod common;

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::{
    Server, concord_command, free_ports, initial_cluster, metric_total, request,
    request_with_headers, retrying, spawn_member,
};

#[test]
fn three_processes_form_one_cluster() {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let members = initial_cluster(&free_ports(3));
    // All three start before any is waited for: a member's open waits for its groups'
    // leaders, which needs a quorum.
    let children: Vec<Child> = (0..3)
        .map(|i| spawn_member(dirs[i].path(), &members, i as u64 + 1))
        .collect();
    let cluster: Vec<Server> = children.into_iter().map(Server::listening).collect();

    // Any member takes any write: a follower forwards it and answers with the result.
    for n in 0..12 {
        let body = format!(r#"{{"client_id": "dev/{n}", "broker_id": "b", "connection_id": {n}}}"#);
        let (status, answer) =
            retrying(&cluster[n % 3].address, "POST", "/v1/sessions", Some(&body));
        assert_eq!(
            status,
            201,
            "create dev/{n} through member {}: {answer}",
            n % 3 + 1
        );
    }
    // Linearizable and lease reads on every member see every acknowledged write at once
    // (a follower asks the leader for the read index); stale reads catch up.
    read_back_on_every_member(&cluster, "dev", 12);
    // Each lease read is counted by how it was served: from a lease, or through a quorum.
    let lease_reads: f64 = (cluster.iter())
        .map(|member| {
            let (_, metrics) = request(&member.address, "GET", "/metrics", None);
            metric_total(&metrics, "concord_raft_lease_reads_total{")
        })
        .sum();
    assert!(
        lease_reads >= 36.0,
        "{lease_reads} lease reads counted of 36"
    );
    for member in &cluster {
        for n in 0..12 {
            let path = format!("/v1/sessions/dev%2F{n}?consistency=stale");
            let deadline = Instant::now() + Duration::from_secs(10);
            while request(&member.address, "GET", &path, None).0 != 200 {
                assert!(
                    Instant::now() < deadline,
                    "{} never had dev/{n}",
                    member.address
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    // A client that routes by itself: the members that do not lead dev/0's group answer 421
    // naming the leader and its URL; the leader answers.
    let leader_only = [("Concord-Forward", "false")];
    let path = "/v1/sessions/dev%2F0";
    let answers: Vec<(u16, String)> = cluster
        .iter()
        .map(|member| request_with_headers(&member.address, "GET", path, &leader_only, None))
        .collect();
    let refused: Vec<&(u16, String)> = answers.iter().filter(|(s, _)| *s == 421).collect();
    assert_eq!(refused.len(), 2, "{answers:?}");
    assert_eq!(
        answers.iter().filter(|(s, _)| *s == 200).count(),
        1,
        "{answers:?}"
    );
    for (_, answer) in refused {
        let problem: serde_json::Value = serde_json::from_str(answer).unwrap();
        let leader = problem["leader"].as_u64().expect("the leader is named") as usize;
        let url = problem["leader_url"]
            .as_str()
            .expect("the leader's URL is named");
        assert_eq!(
            url,
            format!("http://{}", cluster[leader - 1].address),
            "{answer}"
        );
        assert_eq!(answers[leader - 1].0, 200);
    }
    let (status, _) = request_with_headers(
        &cluster[0].address,
        "GET",
        path,
        &[("Concord-Forward", "maybe")],
        None,
    );
    assert_eq!(status, 400);

    // Every member knows every member's URL, protocol version and vote quiet, and who leads what; the four groups spread over
    // the three members (at most two each).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, answer) = request(&cluster[0].address, "GET", "/v1/cluster/members", None);
        let members: serde_json::Value = serde_json::from_str(&answer).unwrap();
        let members = members.as_array().unwrap();
        let urls_known = members.iter().enumerate().all(|(i, m)| {
            m["client_url"].as_str() == Some(&format!("http://{}", cluster[i].address))
                && m["wire_version"] == 5
                && m["vote_quiet_ms"] == 900
        });
        let leads: Vec<u64> = members
            .iter()
            .map(|m| m["leads"].as_u64().unwrap())
            .collect();
        if urls_known && leads.iter().sum::<u64>() == 4 && leads.iter().all(|&n| n <= 2) {
            break;
        }
        assert!(Instant::now() < deadline, "members never settled: {answer}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The leader of group 1 reports each voter's progress (published every tick, so a
    // leadership that just moved may not show it yet); the others report none.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let statuses: Vec<serde_json::Value> = cluster
            .iter()
            .map(|m| {
                serde_json::from_str(&request(&m.address, "GET", "/v1/status", None).1).unwrap()
            })
            .collect();
        let leaders: Vec<&serde_json::Value> = statuses
            .iter()
            .filter(|s| s["groups"][1]["is_leader"] == true)
            .collect();
        let voters = leaders.first().map(|s| s["groups"][1]["voters"].clone());
        let ids: Vec<u64> = voters
            .as_ref()
            .and_then(|v| v.as_array())
            .map(|v| v.iter().map(|v| v["node_id"].as_u64().unwrap()).collect())
            .unwrap_or_default();
        let followers_quiet = statuses
            .iter()
            .filter(|s| s["groups"][1]["is_leader"] == false)
            .all(|s| s["groups"][1]["voters"] == serde_json::json!([]));
        if leaders.len() == 1 && ids == [1, 2, 3] && followers_quiet {
            let last = leaders[0]["groups"][1]["last_log_index"].as_u64().unwrap();
            for voter in voters.unwrap().as_array().unwrap() {
                assert!(voter["matched_index"].as_u64().unwrap() <= last, "{voter}");
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "voter progress never showed: {statuses:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Each member measures its peers: traffic per peer, and round trips as a leader.
    let (status, metrics) = request(&cluster[0].address, "GET", "/metrics", None);
    assert_eq!(status, 200);
    for name in [
        r#"concord_peer_bytes_sent_total{peer="2"}"#,
        r#"concord_peer_frames_received_total{peer="3"}"#,
        r#"concord_peer_connections_total{peer="2"}"#,
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics");
    }
    let leaders_measure = cluster.iter().any(|member| {
        let (_, metrics) = request(&member.address, "GET", "/metrics", None);
        metrics.contains("concord_peer_round_trip_seconds_bucket")
    });
    assert!(leaders_measure, "no member measured a round trip");
    // Group 0's leadership moves on request, sent to its leader (others answer 421).
    let leader = known_leader(&cluster[0], 0);
    let target = leader % 3 + 1;
    let body = format!(r#"{{"node_id": {target}}}"#);
    let path = "/v1/cluster/groups/0/leader";
    let (status, answer) = request(&cluster[target - 1].address, "POST", path, Some(&body));
    assert_eq!(status, 421, "{answer}");
    let (status, answer) = request(&cluster[leader - 1].address, "POST", path, Some(&body));
    assert_eq!(status, 202, "{answer}");
    wait_until_leading(&cluster[target - 1], 0);
    // `GET /v1/cluster/groups/{group}` shows one group; `concord group transfer`, sent to a
    // member that does not lead the group, goes on to the leader and waits until the voter
    // leads; `concord group show` prints what a member knows.
    let (status, answer) = request(
        &cluster[target - 1].address,
        "GET",
        "/v1/cluster/groups/0",
        None,
    );
    assert_eq!(status, 200, "{answer}");
    let group: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(group["leader"], target as u64, "{answer}");
    assert_eq!(group["voter_ids"], serde_json::json!([1, 2, 3]), "{answer}");
    let (status, answer) = request(&cluster[0].address, "GET", "/v1/cluster/groups/99", None);
    assert_eq!(status, 404, "{answer}");
    let bystander = (1..=3).find(|&n| n != leader && n != target).unwrap();
    let via = &cluster[bystander - 1].address;
    let (ok, out) = concord_command("group", via, &["transfer", "0", &leader.to_string()]);
    assert!(ok, "{out}");
    assert!(out.contains(&format!("node {leader} leads it")), "{out}");
    let (ok, out) = concord_command("group", &cluster[target - 1].address, &["show", "0"]);
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("leader node {leader}, term")),
        "{out}"
    );
    let (ok, out) = concord_command("group", via, &["transfer", "0", "9"]);
    assert!(!ok && out.contains("HTTP 400"), "{out}");
    for member in cluster {
        member.stop();
    }

    // Restarted on their data, the members form the cluster again and still hold everything.
    let children: Vec<Child> = (0..3)
        .map(|i| spawn_member(dirs[i].path(), &members, i as u64 + 1))
        .collect();
    let cluster: Vec<Server> = children.into_iter().map(Server::listening).collect();
    for n in 0..12 {
        let path = format!("/v1/sessions/dev%2F{n}");
        let (status, answer) = retrying(&cluster[n % 3].address, "GET", &path, None);
        assert_eq!(status, 200, "dev/{n} after the restart: {answer}");
    }
    let (status, answer) = retrying(
        &cluster[1].address,
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

/// Three members with mutual TLS between them (`--peer-tls-*`): a write through one reads back
/// through the others; a member without TLS cannot join them.
#[test]
fn three_processes_over_mutual_tls() {
    let pki = common::test_pki::TestPki::new();
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let members = initial_cluster(&free_ports(3));
    let children: Vec<Child> = (0..3)
        .map(|i| {
            let node = i + 1;
            let ca = pki.ca();
            let (cert, key) = pki.issue(&node.to_string());
            let flags = [
                "--peer-tls-ca",
                &ca,
                "--peer-tls-cert",
                &cert,
                "--peer-tls-key",
                &key,
            ];
            common::spawn_member_with(dirs[i].path(), &members, node as u64, &flags)
        })
        .collect();
    let cluster: Vec<Server> = children.into_iter().map(Server::listening).collect();
    let body = r#"{"client_id": "over-tls", "broker_id": "b"}"#;
    let (status, answer) = retrying(&cluster[0].address, "POST", "/v1/sessions", Some(body));
    assert_eq!(status, 201, "{answer}");
    for member in &cluster[1..] {
        let (status, answer) = retrying(&member.address, "GET", "/v1/sessions/over-tls", None);
        assert_eq!(status, 200, "{answer}");
    }
    let (_, metrics) = request(&cluster[1].address, "GET", "/metrics", None);
    assert!(
        !metrics.contains("concord_peer_connections_refused_total"),
        "no refusal yet"
    );
    // Member 3 restarted without TLS is refused by the others (and hears no leader).
    let mut cluster = cluster;
    cluster.pop().unwrap().stop();
    let plain = Server::listening(spawn_member(dirs[2].path(), &members, 3));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, metrics) = request(&cluster[0].address, "GET", "/metrics", None);
        if metrics.contains("concord_peer_connections_refused_total") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the plain member was never refused"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(plain);
    for member in cluster {
        member.stop();
    }
}

/// Members with two raft workers each (`--raft-workers 2`: each worker owns the groups of its
/// parity, and one of them reads every peer connection for both): writes through every member
/// read back on every member at every consistency after each group's leadership moved to
/// another member; a member killed and restarted on its data catches up with what was
/// written meanwhile, and all three hold the same state in every group.
#[test]
fn three_processes_with_two_raft_workers_each() {
    const GROUPS: u64 = 4;
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let members = initial_cluster(&free_ports(3));
    let two_workers = ["--raft-workers", "2"];
    let spawn =
        |i: usize| common::spawn_member_with(dirs[i].path(), &members, i as u64 + 1, &two_workers);
    let children: Vec<Child> = (0..3).map(spawn).collect();
    let mut cluster: Vec<Server> = children.into_iter().map(Server::listening).collect();
    let create = |address: &str, n: usize| {
        let body = format!(r#"{{"client_id": "w/{n}", "broker_id": "b", "connection_id": {n}}}"#);
        let (status, answer) = retrying(address, "POST", "/v1/sessions", Some(&body));
        assert_eq!(status, 201, "create w/{n} through {address}: {answer}");
    };
    for n in 0..16 {
        create(&cluster[n % 3].address, n);
    }
    // Every group's leadership moves to another member: the groups of both workers hand
    // over through the peer connections that one worker reads for both.
    for group in 0..GROUPS {
        let leader = known_leader(&cluster[0], group);
        let target = leader % 3 + 1;
        let path = format!("/v1/cluster/groups/{group}/leader");
        let body = format!(r#"{{"node_id": {target}}}"#);
        let (status, answer) = request(&cluster[leader - 1].address, "POST", &path, Some(&body));
        assert_eq!(status, 202, "move group {group} to {target}: {answer}");
        wait_until_leading(&cluster[target - 1], group);
    }
    read_back_on_every_member(&cluster, "w", 16);
    // Member 3 dies without warning; writes go on through the others; restarted on its data,
    // it catches up.
    drop(cluster.pop());
    for n in 16..24 {
        create(&cluster[n % 2].address, n);
    }
    cluster.push(Server::listening(spawn(2)));
    let addresses: Vec<&str> = cluster.iter().map(|m| m.address.as_str()).collect();
    common::wait_converged(&addresses, GROUPS, Duration::from_secs(20));
    for n in 0..24 {
        let path = format!("/v1/sessions/w%2F{n}?consistency=linearizable");
        let (status, answer) = retrying(&cluster[2].address, "GET", &path, None);
        assert_eq!(status, 200, "w/{n} on the restarted member: {answer}");
    }
    for member in cluster {
        member.stop();
    }
}

/// Linearizable and lease reads of the sessions `{prefix}/0..count` (created with their number
/// as `connection_id`) on every member of `cluster` see each of them at once.
fn read_back_on_every_member(cluster: &[Server], prefix: &str, count: usize) {
    for member in cluster {
        for n in 0..count {
            for consistency in ["linearizable", "lease"] {
                let path = format!("/v1/sessions/{prefix}%2F{n}?consistency={consistency}");
                let (status, answer) = retrying(&member.address, "GET", &path, None);
                assert_eq!(
                    status, 200,
                    "{consistency} {prefix}/{n} on {}: {answer}",
                    member.address
                );
                assert!(
                    answer.contains(&format!(r#""connection_id":{n}"#)),
                    "{answer}"
                );
            }
        }
    }
}

/// Waits up to 10 s until `member` says it leads `group`.
fn wait_until_leading(member: &Server, group: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, answer) = request(&member.address, "GET", "/v1/status", None);
        let status: serde_json::Value = serde_json::from_str(&answer).unwrap();
        if status["groups"][group as usize]["is_leader"] == true {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} never led group {group}",
            member.address
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The leader of `group` as `member` knows it, waiting up to 10 s for it to know one.
fn known_leader(member: &Server, group: u64) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, answer) = request(&member.address, "GET", "/v1/status", None);
        let status: serde_json::Value = serde_json::from_str(&answer).unwrap();
        match status["groups"][group as usize]["leader"].as_u64() {
            Some(leader) if leader != 0 => return leader as usize,
            _ => assert!(
                Instant::now() < deadline,
                "{} never knew group {group}'s leader: {answer}",
                member.address
            ),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
