//! SIGKILL under write load, then a restart on the same data: every acknowledged create,
//! patch and delete is there, on every disk backend, raft and solo, log sync on; with log sync
//! off the node still starts (what it acknowledged since its last sync may be lost).
//!
//! Each case prints its seed; `CONCORD_CRASH_SEED=<seed>` replays it (the same kill delays and
//! operation mix; the timing of the threads is the machine's). `CONCORD_CRASH_CYCLES=<n>`
//! (default 2) kills and restarts each case n times: hundreds for a long run (see
//! docs/RELIABILITY.md).

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Server, try_request};
use concord_storage::testing::SeededRng;

/// What the clients were told: the last acknowledged `connection_id` of each live session,
/// and the sessions whose deletion was acknowledged.
#[derive(Default)]
struct Acknowledged {
    live: BTreeMap<String, u64>,
    deleted: Vec<String>,
}

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
}

fn cycles() -> u64 {
    env_number("CONCORD_CRASH_CYCLES").unwrap_or(2)
}

fn seed_for(case: &str) -> u64 {
    env_number("CONCORD_CRASH_SEED").unwrap_or_else(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos() as u64;
        let mixed = case
            .bytes()
            .fold(nanos | 1, |h, b| h.rotate_left(7) ^ u64::from(b));
        mixed.max(1)
    })
}

fn start(dir: &std::path::Path, flags: &[&str]) -> Server {
    Server::start(dir, flags)
}

/// One writer: creates its own sessions, patches them with a rising `connection_id`, deletes
/// some; records what was acknowledged. Stops when `stop` is set or the server is gone.
fn writer(
    address: String,
    thread: u64,
    seed: u64,
    cycle: u64,
    stop: Arc<AtomicBool>,
    acknowledged: Arc<Mutex<Acknowledged>>,
) {
    let mut rng = SeededRng::new(seed ^ (thread + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ cycle);
    let mut mine: Vec<String> = Vec::new();
    let mut next_connection = 1u64;
    let mut created = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let choice = rng.below(10);
        let outcome = if mine.is_empty() || choice < 5 {
            let id = format!("c{cycle}-t{thread}-{created}");
            created += 1;
            let body = format!(r#"{{"client_id": "{id}", "connection_id": 1}}"#);
            try_request(&address, "POST", "/v1/sessions", &[], Some(&body)).map(|(status, _)| {
                if status == 201 {
                    acknowledged.lock().unwrap().live.insert(id.clone(), 1);
                    mine.push(id);
                }
            })
        } else if choice < 9 {
            let id = mine[rng.below(mine.len() as u64) as usize].clone();
            next_connection += 1;
            let body = format!(r#"{{"connection_id": {next_connection}}}"#);
            let path = format!("/v1/sessions/{id}");
            try_request(&address, "PATCH", &path, &[], Some(&body)).map(|(status, _)| {
                if status == 200 {
                    acknowledged
                        .lock()
                        .unwrap()
                        .live
                        .insert(id, next_connection);
                }
            })
        } else {
            let id = mine.swap_remove(rng.below(mine.len() as u64) as usize);
            let path = format!("/v1/sessions/{id}");
            let answer = try_request(&address, "DELETE", &path, &[], None);
            let mut acknowledged = acknowledged.lock().unwrap();
            match &answer {
                Ok((204, _)) => {
                    acknowledged.live.remove(&id);
                    acknowledged.deleted.push(id);
                }
                Ok(_) => {}
                // Unanswered, the delete may or may not have applied: the session is neither
                // expected nor expected gone.
                Err(_) => {
                    acknowledged.live.remove(&id);
                }
            }
            answer.map(|_| ())
        };
        if outcome.is_err() {
            // The server was killed: what was not answered was not acknowledged.
            return;
        }
    }
}

/// Kills the server with SIGKILL at a seeded moment under load from `writers` threads.
fn load_then_kill(
    mut server: Server,
    seed: u64,
    cycle: u64,
    rng: &mut SeededRng,
    acknowledged: &Arc<Mutex<Acknowledged>>,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|thread| {
            let (address, stop, acknowledged) =
                (server.address.clone(), stop.clone(), acknowledged.clone());
            std::thread::spawn(move || writer(address, thread, seed, cycle, stop, acknowledged))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(150 + rng.below(600)));
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.join().unwrap();
    }
}

/// Every acknowledged write is visible: live sessions at their acknowledged `connection_id` or
/// later (a write in flight at the kill may have applied), deleted ones gone.
fn verify(server: &Server, acknowledged: &Acknowledged, case: &str, seed: u64) -> usize {
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.request("GET", "/readyz", None).0 != 200 {
        assert!(Instant::now() < deadline, "{case} seed {seed}: never ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    for (id, connection) in &acknowledged.live {
        let (status, answer) = server.request("GET", &format!("/v1/sessions/{id}"), None);
        assert_eq!(
            status, 200,
            "{case} seed {seed}: acknowledged {id} lost: {answer}"
        );
        let session: serde_json::Value = serde_json::from_str(&answer).unwrap();
        let found = session["connection_id"].as_u64().unwrap();
        assert!(
            found >= *connection,
            "{case} seed {seed}: {id} at connection {found}, acknowledged {connection}"
        );
    }
    for id in &acknowledged.deleted {
        let (status, _) = server.request("GET", &format!("/v1/sessions/{id}"), None);
        assert_eq!(status, 404, "{case} seed {seed}: deleted {id} is back");
    }
    acknowledged.live.len() + acknowledged.deleted.len()
}

fn crash_cycles(backend: &str, consensus: &str) {
    let case = format!("{backend}/{consensus}");
    let seed = seed_for(&case);
    println!("crash recovery {case}: seed {seed} (CONCORD_CRASH_SEED={seed} replays it)");
    let mut rng = SeededRng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let flags = [
        "--backend",
        backend,
        "--consensus",
        consensus,
        "--groups",
        "4",
    ];
    let acknowledged = Arc::new(Mutex::new(Acknowledged::default()));
    let mut checked = 0;
    for cycle in 0..cycles() {
        let server = start(dir.path(), &flags);
        load_then_kill(server, seed, cycle, &mut rng, &acknowledged);
        let server = start(dir.path(), &flags);
        checked = verify(&server, &acknowledged.lock().unwrap(), &case, seed);
        server.stop();
    }
    println!(
        "crash recovery {case}: {} cycles, {checked} acknowledged writes verified",
        cycles()
    );
    assert!(checked > 0, "{case} seed {seed}: no write was acknowledged");
}

#[test]
fn acknowledged_writes_survive_sigkill_on_redb() {
    crash_cycles("redb", "raft");
    crash_cycles("redb", "solo");
}

#[test]
fn acknowledged_writes_survive_sigkill_on_the_wal() {
    crash_cycles("wal", "raft");
    crash_cycles("wal", "solo");
}

#[test]
fn acknowledged_writes_survive_sigkill_on_sled() {
    crash_cycles("sled", "raft");
    crash_cycles("sled", "solo");
}

/// Without log sync, a kill may lose what was acknowledged since the last sync, but the node
/// must start again on what it finds, and take writes.
#[test]
fn without_log_sync_a_killed_node_starts_again() {
    for backend in ["redb", "wal", "sled"] {
        let case = format!("{backend}/no-sync");
        let seed = seed_for(&case);
        println!("crash recovery {case}: seed {seed}");
        let mut rng = SeededRng::new(seed);
        let dir = tempfile::tempdir().unwrap();
        let flags = ["--backend", backend, "--log-sync", "false", "--groups", "4"];
        let acknowledged = Arc::new(Mutex::new(Acknowledged::default()));
        for cycle in 0..cycles() {
            let server = start(dir.path(), &flags);
            load_then_kill(server, seed, cycle, &mut rng, &acknowledged);
        }
        let server = start(dir.path(), &flags);
        let deadline = Instant::now() + Duration::from_secs(20);
        while server.request("GET", "/readyz", None).0 != 200 {
            assert!(Instant::now() < deadline, "{case} seed {seed}: never ready");
            std::thread::sleep(Duration::from_millis(50));
        }
        let (status, answer) = server.request(
            "POST",
            "/v1/sessions",
            Some(r#"{"client_id": "after-the-crash"}"#),
        );
        assert_eq!(status, 201, "{case} seed {seed}: {answer}");
        server.stop();
    }
}
