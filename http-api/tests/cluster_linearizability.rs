//! What HTTP clients see of a cluster of three `concord` processes while one is killed with
//! SIGKILL and started again on its data: every history of creates, If-Match updates,
//! deletes and linearizable and lease reads on a few keys, through random members, must be
//! linearizable (the checker of `concord_engine::testing::linearizability`).
//!
//! `CONCORD_CLUSTER_LINEARIZABILITY_SEED=<s>` replays a run's choices (printed by every run).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Server, free_ports, initial_cluster, retrying, spawn_member, try_request};
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
    let members = initial_cluster(&free_ports(3));
    let children: Vec<_> = (0..3)
        .map(|i| spawn_member(dirs[i].path(), &members, i as u64 + 1))
        .collect();
    let mut cluster: Vec<Server> = children.into_iter().map(Server::listening).collect();
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
    let node = victim as u64 + 1;
    cluster[victim] = Server::listening(spawn_member(dirs[victim].path(), &members, node));
    addresses.lock().unwrap()[victim] = Some(cluster[victim].address.clone());
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
