//! Three `concord` processes with a proxy on every raft link: a member cut off from the
//! others acknowledges no write (its groups' leaders move to the majority, which keeps
//! serving), and once the links heal it converges to the others' state, without any of the
//! writes it refused; a member cut off while a learner was added elsewhere does not refuse
//! that learner's promotion for a view it cannot bring up to date.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::partition_proxy::PartitionProxy;
use common::{
    Server, free_ports, request, retrying, spawn_member_with, try_request, wait_converged,
};

const GROUPS: u64 = 4;

/// Free loopback raft ports for `count` members (where each listens) and the proxy in front
/// of them (where the others dial it).
fn proxied(count: usize) -> (Vec<SocketAddr>, PartitionProxy) {
    let targets: Vec<SocketAddr> = free_ports(count)
        .iter()
        .map(|port| SocketAddr::from(([127, 0, 0, 1], *port)))
        .collect();
    let proxy = PartitionProxy::start(&targets);
    (targets, proxy)
}

/// `--initial-cluster` naming `nodes` at their proxies.
fn named(proxy: &PartitionProxy, nodes: std::ops::RangeInclusive<u64>) -> String {
    nodes
        .map(|node| format!("{node}={}", proxy.address(node)))
        .collect::<Vec<_>>()
        .join(",")
}

#[test]
fn a_member_cut_off_acknowledges_nothing_and_converges_after_healing() {
    let (targets, proxy) = proxied(3);
    let members = named(&proxy, 1..=3);
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let children: Vec<_> = (0..3)
        .map(|i| {
            let raft_addr = targets[i].to_string();
            let flags = [
                "--raft-addr",
                raft_addr.as_str(),
                "--proposal-timeout-ms",
                "2000",
                "--request-timeout-ms",
                "3000",
            ];
            spawn_member_with(dirs[i].path(), &members, i as u64 + 1, &flags)
        })
        .collect();
    let cluster: Vec<Server> = children.into_iter().map(Server::listening).collect();
    for n in 0..8 {
        let body = format!(r#"{{"client_id": "before/{n}", "broker_id": "b"}}"#);
        let (status, answer) =
            retrying(&cluster[n % 3].address, "POST", "/v1/sessions", Some(&body));
        assert_eq!(status, 201, "{answer}");
    }

    // Cut off the member leading the most groups.
    let (_, answer) = request(&cluster[0].address, "GET", "/v1/cluster/members", None);
    let led: serde_json::Value = serde_json::from_str(&answer).unwrap();
    let victim = led
        .as_array()
        .unwrap()
        .iter()
        .max_by_key(|m| m["leads"].as_u64().unwrap())
        .unwrap()["node_id"]
        .as_u64()
        .unwrap();
    proxy.isolate(victim);
    let cut_off = &cluster[victim as usize - 1];
    let majority: Vec<&Server> = (1..=3u64)
        .filter(|&n| n != victim)
        .map(|n| &cluster[n as usize - 1])
        .collect();

    // The cut-off member acknowledges nothing: every write through it is refused or times
    // out (in parallel, so that the test waits one timeout, not eight).
    let refused: Vec<(String, Option<u16>)> = std::thread::scope(|scope| {
        let writes: Vec<_> = (0..8)
            .map(|n| {
                let address = cut_off.address.clone();
                scope.spawn(move || {
                    let id = format!("minority/{n}");
                    let body = format!(r#"{{"client_id": "{id}", "broker_id": "b"}}"#);
                    let answer = try_request(&address, "POST", "/v1/sessions", &[], Some(&body));
                    (id, answer.ok().map(|(status, _)| status))
                })
            })
            .collect();
        writes.into_iter().map(|w| w.join().unwrap()).collect()
    });
    for (id, status) in &refused {
        assert!(
            matches!(status, Some(503) | Some(504)),
            "{id} through the cut-off member: {status:?}"
        );
    }
    // The majority elects leaders for every group and takes writes.
    for n in 0..8 {
        let body = format!(r#"{{"client_id": "during/{n}", "broker_id": "b"}}"#);
        let (status, answer) = retrying(
            &majority[n % 2].address,
            "POST",
            "/v1/sessions",
            Some(&body),
        );
        assert_eq!(status, 201, "{answer}");
    }
    // Past the proposal timeout nothing of the refused writes is left queued anywhere.
    std::thread::sleep(Duration::from_millis(2500));

    proxy.heal();
    let addresses: Vec<&str> = cluster.iter().map(|s| s.address.as_str()).collect();
    wait_converged(&addresses, GROUPS, Duration::from_secs(20));
    for address in &addresses {
        for n in 0..8 {
            let path = format!("/v1/sessions/during%2F{n}?consistency=stale");
            assert_eq!(
                request(address, "GET", &path, None).0,
                200,
                "during/{n} on {address}"
            );
            let path = format!("/v1/sessions/minority%2F{n}?consistency=stale");
            assert_eq!(
                request(address, "GET", &path, None).0,
                404,
                "minority/{n} on {address}"
            );
        }
    }
    for server in cluster {
        server.stop();
    }
}

/// A member whose view of the membership lags — cut off while a learner was added through
/// another member — does not refuse that learner's promotion as "not a member": it cannot
/// bring its view up to date, and says so (503 or 504: ask again); once healed, the same
/// member promotes it.
#[test]
fn a_member_behind_on_the_membership_does_not_refuse_a_promotion_it_cannot_check() {
    let (targets, proxy) = proxied(4);
    let dirs: Vec<tempfile::TempDir> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let spawn = |node: u64, members: &str, state: &str| {
        let raft_addr = targets[node as usize - 1].to_string();
        let flags = ["--raft-addr", &raft_addr, "--initial-cluster-state", state];
        spawn_member_with(dirs[node as usize - 1].path(), members, node, &flags)
    };
    let first_three = named(&proxy, 1..=3);
    let children: Vec<_> = (1..=3).map(|n| spawn(n, &first_three, "new")).collect();
    let mut cluster: Vec<Server> = children.into_iter().map(Server::listening).collect();
    let body = r#"{"client_id": "before", "broker_id": "b"}"#;
    let (status, answer) = retrying(&cluster[1].address, "POST", "/v1/sessions", Some(body));
    assert_eq!(status, 201, "{answer}");
    cluster.push(Server::listening(spawn(
        4,
        &named(&proxy, 1..=4),
        "existing",
    )));

    proxy.isolate(1);
    let add = format!(r#"{{"node_id": 4, "raft_addr": "{}"}}"#, proxy.address(4));
    let (status, answer) = request(
        &cluster[1].address,
        "POST",
        "/v1/cluster/members",
        Some(&add),
    );
    assert_eq!(status, 200, "{answer}");
    let promote = "/v1/cluster/members/4/promote";
    let (status, answer) = request(&cluster[0].address, "POST", promote, None);
    assert!(
        status == 503 || status == 504,
        "the cut-off member answered {status}: {answer}"
    );

    proxy.heal();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (status, answer) = request(&cluster[0].address, "POST", promote, None);
        if status == 200 {
            break;
        }
        // Until node 1 hears from the others again, it counts them down (a quorum refusal).
        let transient = status == 503 || status == 504 || answer.contains("lose quorum");
        assert!(
            transient && std::time::Instant::now() < deadline,
            "{status}: {answer}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for server in cluster {
        server.stop();
    }
}
