//! Membership changes between `concord` processes, under write load: grow 3 → 4 → 5 (one
//! node added with `concord member`, one through the HTTP API), shrink back to 2 removing a
//! leader, and no acknowledged write lost; a change that would lose quorum is refused. A member
//! that lost its data after a member was replaced rejoins with its old member list.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{
    Server, concord_command, free_ports, initial_cluster, request, retrying, spawn_member,
    spawn_member_with, try_request, wait_converged,
};
use serde_json::Value;

const GROUPS: u64 = 4;

fn json(answer: &str) -> Value {
    serde_json::from_str(answer).unwrap_or_else(|_| panic!("not JSON: {answer}"))
}

/// `concord member ...` against `endpoint`: its exit success and its output.
fn member_command(endpoint: &str, args: &[&str]) -> (bool, String) {
    concord_command("member", endpoint, args)
}

/// `(node, role)` of every member, as the member at `address` lists them.
fn roles(address: &str) -> Vec<(u64, String)> {
    let (status, answer) = request(address, "GET", "/v1/cluster/members", None);
    assert_eq!(status, 200, "{answer}");
    json(&answer)
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["node_id"].as_u64().unwrap(),
                m["role"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Moves group `group`'s leadership to `node`, asking whoever leads it (as `observer` sees
/// the group) until `node` does; fails the test after 10 s.
fn lead_group(servers: &[Option<Server>], observer: &str, group: u64, node: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, answer) = request(observer, "GET", "/v1/status", None);
        let leader = json(&answer)["groups"][group as usize]["leader"]
            .as_u64()
            .unwrap_or(0);
        if leader == node {
            return;
        }
        if let Some(Some(leader)) = servers.get((leader as usize).wrapping_sub(1)) {
            let path = format!("/v1/cluster/groups/{group}/leader");
            let body = format!(r#"{{"node_id": {node}}}"#);
            let _ = request(&leader.address, "POST", &path, Some(&body));
        }
        assert!(
            std::time::Instant::now() < deadline,
            "node {node} never led group {group}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn voters(ids: &[u64]) -> Vec<(u64, String)> {
    ids.iter().map(|&id| (id, "voter".to_string())).collect()
}

/// Members 1–3 of the cluster `first_three` started on the first three of `dirs`; a place
/// (`None`) for each member after them, started later.
fn first_three_of(dirs: &[tempfile::TempDir], first_three: &str) -> Vec<Option<Server>> {
    let children: Vec<_> = (0..3)
        .map(|i| spawn_member(dirs[i].path(), first_three, i as u64 + 1))
        .collect();
    children
        .into_iter()
        .map(|child| Some(Server::listening(child)))
        .chain((3..dirs.len()).map(|_| None))
        .collect()
}

#[test]
fn the_cluster_grows_to_five_and_shrinks_to_two_under_load() {
    let ports = free_ports(5);
    let all = initial_cluster(&ports);
    let first_three = initial_cluster(&ports[..3]);
    let dirs: Vec<tempfile::TempDir> = (0..5).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut servers = first_three_of(&dirs, &first_three);
    let address = |servers: &[Option<Server>], node: usize| {
        servers[node - 1].as_ref().unwrap().address.clone()
    };

    // Writers through members 2 and 3, which stay to the end.
    let stop = Arc::new(AtomicBool::new(false));
    let acknowledged = Arc::new(Mutex::new(Vec::new()));
    let targets = [address(&servers, 2), address(&servers, 3)];
    let writers: Vec<_> = (0..4)
        .map(|writer| {
            let (stop, acknowledged, targets) =
                (stop.clone(), acknowledged.clone(), targets.clone());
            std::thread::spawn(move || {
                let mut n = 0usize;
                while !stop.load(Ordering::Acquire) {
                    n += 1;
                    let client_id = format!("m{writer}-{n}");
                    let body = format!(r#"{{"client_id": "{client_id}", "broker_id": "b"}}"#);
                    let target = &targets[n % targets.len()];
                    if let Ok((201, _)) =
                        try_request(target, "POST", "/v1/sessions", &[], Some(&body))
                    {
                        acknowledged.lock().unwrap().push(client_id);
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));

    // Node 4 joins with `concord member`, node 5 through the API; each starts first, with
    // every member named and no configuration of its own.
    for node in [4u64, 5] {
        let index = node as usize - 1;
        let child = spawn_member_with(
            dirs[index].path(),
            &all,
            node,
            &["--initial-cluster-state", "existing"],
        );
        servers[index] = Some(Server::listening(child));
        let raft_addr = format!("127.0.0.1:{}", ports[index]);
        if node == 4 {
            let via = address(&servers, 2);
            let (ok, out) = member_command(&via, &["add", "4", &raft_addr]);
            assert!(ok, "{out}");
            assert!(out.contains("learner"), "{out}");
            let (ok, out) = member_command(&via, &["promote", "4"]);
            assert!(ok, "{out}");
        } else {
            let via = address(&servers, 3);
            let body = format!(r#"{{"node_id": 5, "raft_addr": "{raft_addr}"}}"#);
            let (status, answer) = request(&via, "POST", "/v1/cluster/members", Some(&body));
            assert_eq!(status, 200, "{answer}");
            let (status, answer) = request(&via, "POST", "/v1/cluster/members/5/promote", None);
            assert_eq!(status, 200, "{answer}");
        }
    }
    assert_eq!(roles(&address(&servers, 1)), voters(&[1, 2, 3, 4, 5]));
    // The newest member answers reads and writes like the others.
    let (status, answer) = retrying(
        &address(&servers, 5),
        "POST",
        "/v1/sessions",
        Some(r#"{"client_id": "via-5", "broker_id": "b"}"#),
    );
    assert_eq!(status, 201, "{answer}");
    acknowledged.lock().unwrap().push("via-5".into());

    // Shrink: 5 and 4, then node 1, made to lead a group first (the balance may have left it
    // none after 4 and 5 went).
    let via = address(&servers, 2);
    for node in [5usize, 4] {
        let path = format!("/v1/cluster/members/{node}");
        let (status, answer) = request(&via, "DELETE", &path, None);
        assert_eq!(status, 200, "{answer}");
        servers[node - 1].take().unwrap().stop();
    }
    lead_group(&servers, &via, 0, 1);
    let leads_of_1 = json(&request(&address(&servers, 1), "GET", "/v1/cluster/members", None).1)
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["node_id"] == 1)
        .map(|m| m["leads"].as_u64().unwrap());
    assert!(leads_of_1.is_some_and(|leads| leads > 0), "{leads_of_1:?}");
    let (ok, out) = member_command(&via, &["remove", "1"]);
    assert!(ok, "{out}");
    // The removed member, still running, sends its clients to the others and is not ready.
    let one = address(&servers, 1);
    let (status, answer) = request(
        &one,
        "POST",
        "/v1/sessions",
        Some(r#"{"client_id": "to-1", "broker_id": "b"}"#),
    );
    assert_eq!(status, 503, "{answer}");
    assert!(answer.contains("removed"), "{answer}");
    assert_eq!(request(&one, "GET", "/readyz", None).0, 503);
    servers[0].take().unwrap().stop();
    assert_eq!(roles(&via), voters(&[2, 3]));
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Release);
    for writer in writers {
        writer.join().unwrap();
    }

    // Every acknowledged write is on both members left.
    let (two, three) = (address(&servers, 2), address(&servers, 3));
    wait_converged(&[&two, &three], GROUPS, Duration::from_secs(20));
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(
        acknowledged.len() > 50,
        "too little load: {}",
        acknowledged.len()
    );
    for client_id in &acknowledged {
        let (status, answer) = retrying(&three, "GET", &format!("/v1/sessions/{client_id}"), None);
        assert_eq!(status, 200, "{client_id}: {answer}");
    }

    // Two voters, one killed: removing it needs both to commit the change; refused.
    let mut third = servers[2].take().unwrap();
    third.child.kill().unwrap();
    third.child.wait().unwrap();
    std::thread::sleep(Duration::from_secs(2)); // Longer than a member counts as up (1 s).
    let (status, answer) = request(&two, "DELETE", "/v1/cluster/members/3", None);
    assert_eq!(status, 409, "{answer}");
    assert!(answer.contains("quorum"), "{answer}");
    let (ok, out) = member_command(&two, &["remove", "2"]);
    assert!(!ok && out.contains("itself"), "{out}");
    servers[1].take().unwrap().stop();
}

/// A member whose data is lost is started again with the member list it was first given,
/// after the cluster replaced another member: the list lacks the new member and names the
/// removed one. It learns where the new member is from the members it knows, takes the groups
/// the new member leads, and is ready with everything written before.
#[test]
fn a_member_wiped_after_a_replacement_rejoins_with_its_old_member_list() {
    let ports = free_ports(4);
    let first_three = initial_cluster(&ports[..3]);
    let all = initial_cluster(&ports);
    let dirs: Vec<tempfile::TempDir> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut servers = first_three_of(&dirs, &first_three);
    let address = |servers: &[Option<Server>], node: usize| {
        servers[node - 1].as_ref().unwrap().address.clone()
    };
    for n in 0..8 {
        let body = format!(r#"{{"client_id": "before-{n}", "broker_id": "b"}}"#);
        let (status, answer) = retrying(
            &address(&servers, n % 3 + 1),
            "POST",
            "/v1/sessions",
            Some(&body),
        );
        assert_eq!(status, 201, "{answer}");
    }

    // Node 3 is replaced by node 4.
    let rejoin = ["--initial-cluster-state", "existing"];
    let child = spawn_member_with(dirs[3].path(), &all, 4, &rejoin);
    servers[3] = Some(Server::listening(child));
    let two = address(&servers, 2);
    let body = format!(r#"{{"node_id": 4, "raft_addr": "127.0.0.1:{}"}}"#, ports[3]);
    let (status, answer) = request(&two, "POST", "/v1/cluster/members", Some(&body));
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = request(&two, "POST", "/v1/cluster/members/4/promote", None);
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = request(&two, "DELETE", "/v1/cluster/members/3", None);
    assert_eq!(status, 200, "{answer}");
    servers[2].take().unwrap().stop();

    // Node 4 leads group 0.
    let four = address(&servers, 4);
    lead_group(&servers, &two, 0, 4);

    // Node 1 loses its data and starts again with the list it was first given.
    let mut one = servers[0].take().unwrap();
    one.child.kill().unwrap();
    one.child.wait().unwrap();
    std::fs::remove_dir_all(dirs[0].path()).unwrap();
    std::fs::create_dir(dirs[0].path()).unwrap();
    let child = spawn_member_with(dirs[0].path(), &first_three, 1, &rejoin);
    servers[0] = Some(Server::listening(child));
    let one = address(&servers, 1);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while request(&one, "GET", "/readyz", None).0 != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "node 1 never got ready: {}",
            request(&one, "GET", "/v1/status", None).1
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for n in 0..8 {
        let path = format!("/v1/sessions/before-{n}?consistency=stale");
        assert_eq!(request(&one, "GET", &path, None).0, 200, "before-{n}");
    }
    wait_converged(&[&one, &two, &four], GROUPS, Duration::from_secs(20));
    for server in servers.into_iter().flatten() {
        server.stop();
    }
}
