//! What HTTP clients see of a cluster of three `concord` processes while one is killed with
//! SIGKILL and started again on its data, then one is cut off from the others (a proxy on
//! every raft link) and reconnected: every history of creates, If-Match updates, deletes and
//! linearizable and lease reads on a few keys, through random members — the cut-off one
//! included — must be linearizable (the checker of `concord_engine::testing::linearizability`).
//! And the lease between processes configured with different ticks: a leader whose ticks are
//! long, cut off from members whose ticks are short, stops serving lease reads before they
//! elect and write.
//!
//! `CONCORD_CLUSTER_LINEARIZABILITY_SEED=<s>` replays a run's choices (printed by every run).

mod common;

use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::partition_proxy::PartitionProxy;
use common::{
    Server, free_ports, metric_total, request, retrying, spawn_member_with, try_request,
    try_request_within,
};
use concord_engine::testing::linearizability::{self as checker, Event, Op, Outcome, Value};
use concord_storage::testing::SeededRng;

const KEYS: [&str; 3] = ["k0", "k1", "k2"];
const CLIENTS: usize = 6;

/// The members' HTTP addresses; `None` while one is down.
type Addresses = Arc<Mutex<Vec<Option<String>>>>;

/// What an answer tells the client: an outcome, or `None` if the operation certainly did
/// not happen (refused before the log: no leader, overloaded, dropped with its leader).
fn outcome_of(answer: std::io::Result<(u16, String)>, is_read: bool) -> Option<Outcome> {
    let Ok((status, body)) = answer else {
        // The connection died with the member: a write may have applied.
        return (!is_read).then_some(Outcome::Unknown);
    };
    let json: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let session = || {
        Some(Value {
            version: json["version"].as_u64()?,
            connection: json["connection_id"].as_u64()?,
        })
    };
    match status {
        200 | 201 => Some(Outcome::Done(session())),
        204 => Some(Outcome::Done(None)),
        404 => Some(Outcome::NotFound),
        409 => Some(Outcome::Exists),
        412 => Some(Outcome::Mismatch),
        _ if is_read => None,
        // `unavailable`: the group stopped under the write, which may have applied.
        503 if json["type"] == "urn:concord:problem:unavailable" => Some(Outcome::Unknown),
        503 => None,
        504 => Some(Outcome::Unknown),
        other => panic!("unexpected answer {other}: {body}"),
    }
}

fn client(
    addresses: Addresses,
    index: usize,
    seed: u64,
    start: Instant,
    stop: Arc<AtomicBool>,
    history: Arc<Mutex<Vec<Event>>>,
) {
    let mut rng = SeededRng::new(seed ^ (index as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut connection = (index as u64 + 1) << 32;
    while !stop.load(Ordering::Acquire) {
        let live: Vec<String> = addresses
            .lock()
            .unwrap()
            .iter()
            .flatten()
            .cloned()
            .collect();
        let address = &live[rng.below(live.len() as u64) as usize];
        let key = KEYS[rng.below(KEYS.len() as u64) as usize];
        connection += 1;
        let if_match = (rng.below(2) == 0).then(|| 1 + rng.below(4));
        let if_match_header = if_match.map(|v| format!("\"{v}\""));
        let mut headers: Vec<(&str, &str)> = Vec::new();
        if let Some(value) = &if_match_header {
            headers.push(("If-Match", value));
        }
        let path = format!("/v1/sessions/{key}");
        let (op, method, path, body) = match rng.below(20) {
            0..=4 => (
                Op::Create { connection },
                "POST",
                "/v1/sessions".to_string(),
                Some(format!(
                    r#"{{"client_id": "{key}", "connection_id": {connection}}}"#
                )),
            ),
            5..=10 => (
                Op::Update {
                    if_match,
                    connection,
                },
                "PATCH",
                path,
                Some(format!(r#"{{"connection_id": {connection}}}"#)),
            ),
            11..=12 => (Op::Delete { if_match }, "DELETE", path, None),
            n => {
                headers.clear();
                let consistency = if n % 2 == 0 { "linearizable" } else { "lease" };
                (
                    Op::Get,
                    "GET",
                    format!("{path}?consistency={consistency}"),
                    None,
                )
            }
        };
        let call_ns = start.elapsed().as_nanos() as u64;
        let answer = try_request(address, method, &path, &headers, body.as_deref());
        let return_ns = start.elapsed().as_nanos() as u64;
        let is_read = matches!(op, Op::Get);
        if let Some(outcome) = outcome_of(answer, is_read) {
            let return_ns = (outcome != Outcome::Unknown).then_some(return_ns);
            history.lock().unwrap().push(Event {
                client: index,
                key: key.to_string(),
                op,
                call_ns,
                return_ns,
                outcome,
            });
        }
    }
}

/// Three members' raft addresses, the proxy in front of them (which can cut a member off),
/// and the `--initial-cluster` that makes members reach each other through it.
fn proxied_members() -> (Vec<std::net::SocketAddr>, PartitionProxy, String) {
    let raft_addrs: Vec<std::net::SocketAddr> = free_ports(3)
        .iter()
        .map(|port| std::net::SocketAddr::from(([127, 0, 0, 1], *port)))
        .collect();
    let proxy = PartitionProxy::start(&raft_addrs);
    let members = (1..=3)
        .map(|node| format!("{node}={}", proxy.address(node)))
        .collect::<Vec<_>>()
        .join(",");
    (raft_addrs, proxy, members)
}

#[test]
fn what_clients_see_across_a_killed_and_restarted_member_is_linearizable() {
    let seed = std::env::var("CONCORD_CLUSTER_LINEARIZABILITY_SEED")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos() as u64
        });
    println!("cluster linearizability: CONCORD_CLUSTER_LINEARIZABILITY_SEED={seed}");
    let mut rng = SeededRng::new(seed);
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (raft_addrs, proxy, members) = proxied_members();
    let spawn = |i: usize| {
        let raft_addr = raft_addrs[i].to_string();
        // Short timeouts: a client of the cut-off member waits seconds, not fifteen.
        let flags = [
            "--raft-addr",
            raft_addr.as_str(),
            "--proposal-timeout-ms",
            "1500",
            "--request-timeout-ms",
            "2000",
        ];
        Server::listening(spawn_member_with(
            dirs[i].path(),
            &members,
            i as u64 + 1,
            &flags,
        ))
    };
    let mut cluster: Vec<Server> = (0..3).map(spawn).collect();
    let body = r#"{"client_id": "warm-up"}"#;
    assert_eq!(
        retrying(&cluster[0].address, "POST", "/v1/sessions", Some(body)).0,
        201
    );
    let addresses: Addresses = Arc::new(Mutex::new(
        cluster.iter().map(|s| Some(s.address.clone())).collect(),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let history = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|index| {
            let (addresses, stop, history) = (addresses.clone(), stop.clone(), history.clone());
            std::thread::spawn(move || client(addresses, index, seed, start, stop, history))
        })
        .collect();

    // A member dies without a word, stays down a moment, and comes back on its data.
    std::thread::sleep(Duration::from_millis(800 + rng.below(700)));
    let victim = rng.below(3) as usize;
    addresses.lock().unwrap()[victim] = None;
    cluster[victim].child.kill().unwrap();
    cluster[victim].child.wait().unwrap();
    std::thread::sleep(Duration::from_millis(300 + rng.below(700)));
    cluster[victim] = spawn(victim);
    addresses.lock().unwrap()[victim] = Some(cluster[victim].address.clone());
    std::thread::sleep(Duration::from_millis(1500));

    // The member leading the most groups is cut off from the others, clients still sending to
    // it (its leases must lapse before the others elect), then reconnected.
    let (_, answer) = request(&cluster[0].address, "GET", "/v1/cluster/members", None);
    let members_now: serde_json::Value = serde_json::from_str(&answer).unwrap_or_default();
    let cut_off = members_now
        .as_array()
        .and_then(|members| members.iter().max_by_key(|m| m["leads"].as_u64()))
        .and_then(|member| member["node_id"].as_u64())
        .unwrap_or(1 + rng.below(3));
    println!(
        "cluster linearizability: member {victim_node} killed, member {cut_off} cut off",
        victim_node = victim + 1
    );
    proxy.isolate(cut_off);
    std::thread::sleep(Duration::from_millis(1500 + rng.below(1500)));
    proxy.heal();
    std::thread::sleep(Duration::from_millis(1500));

    stop.store(true, Ordering::Release);
    for client in clients {
        client.join().unwrap();
    }
    let history = std::mem::take(&mut *history.lock().unwrap());
    let done = history
        .iter()
        .filter(|e| matches!(e.outcome, Outcome::Done(_)))
        .count();
    let unknown = history
        .iter()
        .filter(|e| e.outcome == Outcome::Unknown)
        .count();
    if let Err(violation) = checker::check(&history) {
        panic!("seed {seed}: {violation}");
    }
    assert!(done > 50, "seed {seed}: only {done} operations succeeded");
    println!(
        "cluster linearizability: {} operations checked ({unknown} without an answer), \
         0 violations",
        history.len()
    );
    for server in cluster {
        server.stop();
    }
}

/// Lease rounds of the clocks-apart test.
const LEASE_ROUNDS: u64 = 3;

/// Sends `op` on key `k` through `address` until it is done, each try in the history.
fn write_until_done(history: &Mutex<Vec<Event>>, address: &str, start: Instant, op: Op) {
    let (method, path, body) = match op {
        Op::Create { connection } => (
            "POST",
            "/v1/sessions",
            format!(r#"{{"client_id": "k", "connection_id": {connection}}}"#),
        ),
        Op::Update { connection, .. } => (
            "PATCH",
            "/v1/sessions/k",
            format!(r#"{{"connection_id": {connection}}}"#),
        ),
        other => panic!("not a write: {other:?}"),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let call_ns = start.elapsed().as_nanos() as u64;
        let answer = try_request(address, method, path, &[], Some(&body));
        let return_ns = start.elapsed().as_nanos() as u64;
        let outcome = outcome_of(answer, false);
        if let Some(outcome) = outcome {
            history.lock().unwrap().push(Event {
                client: 0,
                key: "k".into(),
                op: op.clone(),
                call_ns,
                return_ns: (outcome != Outcome::Unknown).then_some(return_ns),
                outcome,
            });
            if matches!(outcome, Outcome::Done(_)) {
                return;
            }
        }
        assert!(Instant::now() < deadline, "{method} {path} never done");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts member `i` (0-based) of a lease test's cluster, ticking every `tick_ms`, on its raft
/// port behind the proxy; proposals and requests give up well after an election.
fn spawn_lease_member(
    dirs: &[tempfile::TempDir],
    raft_addrs: &[std::net::SocketAddr],
    members: &str,
    i: usize,
    tick_ms: &str,
) -> Child {
    let raft_addr = raft_addrs[i].to_string();
    let flags = [
        "--raft-addr",
        raft_addr.as_str(),
        "--raft-tick-ms",
        tick_ms,
        "--proposal-timeout-ms",
        "1500",
        "--request-timeout-ms",
        "2000",
    ];
    spawn_member_with(dirs[i].path(), members, i as u64 + 1, &flags)
}

/// Waits until `address` serves writes, then creates `k` through it into `history`.
fn create_k(history: &Mutex<Vec<Event>>, address: &str, start: Instant) {
    let body = r#"{"client_id": "warm-up"}"#;
    assert_eq!(retrying(address, "POST", "/v1/sessions", Some(body)).0, 201);
    write_until_done(history, address, start, Op::Create { connection: 0 });
}

/// Reads `k` at `lease` through `address` back to back until 300 ms after `written` is set
/// (the others' write returned), each read answered into `history`. A read with no answer
/// within 100 ms waits for a quorum and is left out (it did nothing).
fn read_lease_until_after(
    history: &Mutex<Vec<Event>>,
    address: &str,
    start: Instant,
    written: &AtomicBool,
) {
    let mut after_write: Option<Instant> = None;
    while after_write.is_none_or(|at| at.elapsed() < Duration::from_millis(300)) {
        if after_write.is_none() && written.load(Ordering::Acquire) {
            after_write = Some(Instant::now());
        }
        let call_ns = start.elapsed().as_nanos() as u64;
        let path = "/v1/sessions/k?consistency=lease";
        // A read given up is not recorded: cut off, a read through a quorum never returns,
        // while one from the lease returns at once, even with two members starting beside.
        let limit = Duration::from_millis(100);
        let answer = try_request_within(address, "GET", path, &[], None, limit);
        let return_ns = start.elapsed().as_nanos() as u64;
        match answer.ok().map(|a| outcome_of(Ok(a), true)) {
            Some(Some(outcome @ Outcome::Done(Some(_)))) => {
                history.lock().unwrap().push(Event {
                    client: 1,
                    key: "k".into(),
                    op: Op::Get,
                    call_ns,
                    return_ns: Some(return_ns),
                    outcome,
                });
            }
            _ => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

/// Asks the leader of `group` to hand it to `node`, until `node` says it leads.
fn make_leader(addresses: &[String], group: usize, node: u64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    let own = &addresses[node as usize - 1];
    loop {
        let leader = common::leaders(own)[group];
        if leader == node {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "member {node} never led group {group}"
        );
        if leader != 0 {
            let body = format!(r#"{{"node_id": {node}}}"#);
            let path = format!("/v1/cluster/groups/{group}/leader");
            let _ = try_request(
                &addresses[leader as usize - 1],
                "POST",
                &path,
                &[],
                Some(&body),
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The lease reads the member at `address` served from a lease, by its metrics.
fn lease_reads_served(address: &str) -> f64 {
    let (_, metrics) = request(address, "GET", "/metrics", None);
    metric_total(
        &metrics,
        r#"concord_raft_lease_reads_total{served="lease"}"#,
    )
}

/// Makes member 1 lead `group` (`k`'s) and waits until its lease serves a read of `k`. A new
/// leader holds no lease until a quorum answered a heartbeat of its term, the first of which
/// leaves at its next tick; and the leader balance may hand the group on again (member 1
/// then leads more than its share), which ends the lease for the term. A lease test that cut
/// member 1 off a fixed time after it led counted no lease read in a few runs in a hundred.
fn lead_with_a_lease(addresses: &[String], group: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let path = "/v1/sessions/k?consistency=lease";
    loop {
        make_leader(addresses, group, 1);
        let served_before = lease_reads_served(&addresses[0]);
        let limit = Duration::from_secs(2);
        let answer = try_request_within(&addresses[0], "GET", path, &[], None, limit);
        let read = answer.is_ok_and(|(status, _)| status == 200);
        if read && lease_reads_served(&addresses[0]) > served_before {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "member 1 never served a lease read on group {group}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The lease between processes whose ticks differ. With p the percentage
/// `CONCORD_CLUSTER_TICKS_APART_PERCENT` (default 50), member 1 ticks every 100 ms / (1 - p)
/// and the others every 100 ms / (1 + p) (`--raft-tick-ms` 200 and 67): its own ticks would
/// give it a lease nearly three times longer than the others' quiet after its last heartbeat. Each round makes member 1 lead the
/// key's group, cuts it off from the others (a proxy on every raft link), reads `lease` on it
/// back to back, and writes through member 2 until the write is done; every read must be
/// linearizable with the writes. It holds because the others say their quiet in the hello and
/// member 1's lease is nine tenths of the shortest; a leader that went by its own ticks served
/// what the others' write replaced, and the checker said so, in every run tried at 50 and in
/// some at 20 (docs/RELIABILITY.md).
#[test]
fn a_cut_off_leader_process_stops_lease_reads_before_the_others_write_with_ticks_apart() {
    let apart_percent: f64 = std::env::var("CONCORD_CLUSTER_TICKS_APART_PERCENT")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(50.0);
    let apart = apart_percent / 100.0;
    let slow_tick_ms = (100.0 / (1.0 - apart)).round().to_string();
    let fast_tick_ms = (100.0 / (1.0 + apart)).round().to_string();
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (raft_addrs, proxy, members) = proxied_members();
    let cluster: Vec<Server> = (0..3)
        .map(|i| {
            let tick_ms = if i == 0 { &slow_tick_ms } else { &fast_tick_ms };
            spawn_lease_member(&dirs, &raft_addrs, &members, i, tick_ms)
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(Server::listening)
        .collect();
    let addresses: Vec<String> = cluster.iter().map(|s| s.address.clone()).collect();
    let start = Instant::now();
    let history = Mutex::new(Vec::new());
    create_k(&history, &addresses[0], start);
    // The members' four groups (`spawn_member_with`); member 1 is made to lead the key's.
    let group = concord_engine::group_of(b"k", 4) as usize;
    for round in 1..=LEASE_ROUNDS {
        make_leader(&addresses, group, 1);
        let own = Op::Update {
            if_match: None,
            connection: round * 10,
        };
        write_until_done(&history, &addresses[0], start, own);
        lead_with_a_lease(&addresses, group);
        proxy.isolate(1);
        let written = AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| read_lease_until_after(&history, &addresses[0], start, &written));
            let theirs = Op::Update {
                if_match: None,
                connection: round * 10 + 1,
            };
            write_until_done(&history, &addresses[1], start, theirs);
            written.store(true, Ordering::Release);
        });
        proxy.heal();
    }
    let history = history.into_inner().unwrap();
    let reads = history.iter().filter(|e| matches!(e.op, Op::Get)).count();
    println!(
        "ticks {apart_percent}% apart either way ({slow_tick_ms} and {fast_tick_ms} ms): \
         {reads} lease reads on the cut-off leader in {LEASE_ROUNDS} rounds"
    );
    if let Err(violation) = checker::check(&history) {
        let head: Vec<&str> = violation.lines().take(8).collect();
        panic!(
            "ticks {apart_percent}% apart either way: {}\n...",
            head.join("\n")
        );
    }
    assert!(
        reads > 0,
        "no lease read was served: the test tested nothing"
    );
    for server in cluster {
        server.stop();
    }
}

/// The lease across a restart that shortens the ticks. All three members tick every 200 ms:
/// a leader's lease lasts 1.62 s after a heartbeat a quorum answered. Member 1 leads the key's
/// group and is cut off; members 2 and 3 are killed at once and started again on their data
/// with ticks of 20 ms, so their own election timeouts are over after 0.2–0.4 s, while member
/// 1, which cannot hear their new hellos, still serves lease reads counting on the 1.8 s quiet
/// they said before. Each keeps that quiet in its data directory (`VOTE_QUIET`) and neither
/// votes nor campaigns until it has passed; then they elect and write through member 2. Every
/// lease read on member 1 must be linearizable with that write.
#[test]
fn a_cut_off_leader_process_stops_lease_reads_before_members_restarted_with_shorter_ticks_write() {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (raft_addrs, proxy, members) = proxied_members();
    // Only the processes are started here: both restarted members must start together (either
    // alone would wait for a leader before it listens).
    let spawn_process =
        |i: usize, tick_ms: &str| spawn_lease_member(&dirs, &raft_addrs, &members, i, tick_ms);
    let children: Vec<_> = (0..3).map(|i| spawn_process(i, "200")).collect();
    let mut cluster: Vec<Server> = children.into_iter().map(Server::listening).collect();
    let addresses: Vec<String> = cluster.iter().map(|s| s.address.clone()).collect();
    let start = Instant::now();
    let history = Mutex::new(Vec::new());
    create_k(&history, &addresses[0], start);
    let group = concord_engine::group_of(b"k", 4) as usize;
    make_leader(&addresses, group, 1);
    let own = Op::Update {
        if_match: None,
        connection: 10,
    };
    write_until_done(&history, &addresses[0], start, own);
    lead_with_a_lease(&addresses, group);
    proxy.isolate(1);
    let restarted_at = Instant::now();
    let written = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| read_lease_until_after(&history, &addresses[0], start, &written));
        for i in [1, 2] {
            cluster[i].child.kill().unwrap();
            cluster[i].child.wait().unwrap();
        }
        let children = [spawn_process(1, "20"), spawn_process(2, "20")];
        for (i, child) in [1, 2].into_iter().zip(children) {
            cluster[i] = Server::listening(child);
        }
        let theirs = Op::Update {
            if_match: None,
            connection: 11,
        };
        write_until_done(&history, &cluster[1].address, start, theirs);
        written.store(true, Ordering::Release);
    });
    let written_after = restarted_at.elapsed();
    proxy.heal();
    let history = history.into_inner().unwrap();
    let reads = history.iter().filter(|e| matches!(e.op, Op::Get)).count();
    println!(
        "ticks shortened from 200 to 20 ms across a restart: {reads} lease reads on the cut-off \
         leader; the restarted members wrote {written_after:?} after the cut"
    );
    if let Err(violation) = checker::check(&history) {
        let head: Vec<&str> = violation.lines().take(8).collect();
        panic!("ticks shortened across a restart: {}\n...", head.join("\n"));
    }
    assert!(
        reads > 0,
        "no lease read was served: the test tested nothing"
    );
    for server in cluster {
        server.stop();
    }
}
