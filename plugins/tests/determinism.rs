//! Determinism is enforced by the host, not asked of the plugin: two hosts apply the same log,
//! one fresh and one after thousands of batches and faults, and must give the same result for
//! every command and byte-identical state — for the bundled plugins and for one that keeps a
//! counter in a static and leaks memory on purpose (`fixtures/plugins/stateful.wasm`).

mod common;

use bytes::Bytes;
use concord_consensus::{CommandResult, StateMachine};
use concord_plugins::{PluginEngine, PluginEngineConfig, PluginLimits, bundled, fault};
use concord_storage::{GroupId, KeyRange, KeyValue, MemStateStore, StateStore, StateTransaction};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const STATEFUL: &[u8] = include_bytes!("../../fixtures/plugins/stateful.wasm");

/// The group the compared log is applied to; the prior history goes to another one.
const LOG_GROUP: GroupId = 1;
const HISTORY_GROUP: GroupId = 2;

/// Both hosts run with these limits (replicas must): a small memory cap, so that the history's
/// oversized commands fault and a leak in a long-lived instance would reach it.
fn limits() -> PluginLimits {
    PluginLimits {
        memory_bytes_max: 4 * 1024 * 1024,
        ..PluginLimits::default()
    }
}

/// A log: entries of commands, each entry applied as one batch in one transaction.
type Log = Vec<Vec<Bytes>>;

fn random_log(
    rng: &mut StdRng,
    entries: usize,
    mut command: impl FnMut(&mut StdRng, u64) -> Vec<u8>,
) -> Log {
    let mut now_ms = 1_000_000;
    (0..entries)
        .map(|_| {
            (0..rng.random_range(1..64))
                .map(|_| {
                    now_ms += 700;
                    Bytes::from(command(rng, now_ms))
                })
                .collect()
        })
        .collect()
}

fn random_kv_command(rng: &mut StdRng, _now_ms: u64) -> Vec<u8> {
    let key = format!("k{}", rng.random_range(0..20)).into_bytes();
    let op: u8 = rng.random_range(1..6); // 5 is not an operation
    let mut command = vec![op];
    command.extend_from_slice(&(key.len() as u16).to_le_bytes());
    command.extend_from_slice(&key);
    match op {
        1 => command.extend((0..rng.random_range(0..40)).map(|_| rng.random::<u8>())),
        4 => {
            command.push(rng.random_range(0..2));
            command.extend_from_slice(&0u32.to_le_bytes());
            command.extend_from_slice(b"new");
        }
        _ => {}
    }
    if rng.random_bool(0.05) {
        command.truncate(rng.random_range(0..command.len()));
    }
    command
}

fn random_counter_command(rng: &mut StdRng, _now_ms: u64) -> Vec<u8> {
    match rng.random_range(0..10) {
        0 => Vec::new(),
        1 => vec![7; 3],                      // malformed
        2 => i64::MAX.to_le_bytes().to_vec(), // overflows once the total is positive
        _ => rng.random_range(-50i64..50).to_le_bytes().to_vec(),
    }
}

fn random_stateful_command(rng: &mut StdRng, _now_ms: u64) -> Vec<u8> {
    (0..rng.random_range(0..16)).map(|_| rng.random()).collect()
}

/// Applies `log` to `group`, one transaction per entry; returns every command's result.
fn apply(
    machine: &mut dyn StateMachine,
    store: &MemStateStore,
    group: GroupId,
    log: &Log,
) -> Vec<CommandResult> {
    let mut results = Vec::new();
    for (index, entry) in log.iter().enumerate() {
        let mut txn = StateTransaction::new(store, group);
        let entry_results = machine.apply(&mut txn, entry).unwrap();
        assert_eq!(entry_results.len(), entry.len());
        results.extend(entry_results);
        txn.commit(index as u64 + 1).unwrap();
    }
    results
}

fn dump(store: &MemStateStore, group: GroupId) -> Vec<KeyValue> {
    store.scan(group, &KeyRange::all(), usize::MAX).unwrap()
}

/// What the experienced host applied before the log: many batches of the same kind of
/// commands, with commands too large for the memory cap among them.
fn history(rng: &mut StdRng, command: impl FnMut(&mut StdRng, u64) -> Vec<u8>) -> Log {
    let mut log = random_log(rng, 2000, command);
    for entry in log.iter_mut().step_by(50) {
        entry.push(Bytes::from(vec![1u8; 5 * 1024 * 1024]));
    }
    log
}

/// Runs `log` on a fresh host and on one with a history; both must agree on everything.
fn assert_same_on_both_hosts(
    wasm: &[u8],
    log: &Log,
    history: &Log,
) -> (Vec<CommandResult>, Vec<KeyValue>) {
    let config = PluginEngineConfig {
        limits: limits(),
        ..PluginEngineConfig::default()
    };
    let fresh_engine = PluginEngine::new(config.clone()).unwrap();
    let fresh_store = MemStateStore::new();
    let mut fresh = fresh_engine.load("plugin", wasm).unwrap().state_machine();
    let fresh_results = apply(&mut fresh, &fresh_store, LOG_GROUP, log);

    let experienced_engine = PluginEngine::new(config).unwrap();
    let experienced_store = MemStateStore::new();
    let mut experienced = experienced_engine
        .load("plugin", wasm)
        .unwrap()
        .state_machine();
    let history_results = apply(&mut experienced, &experienced_store, HISTORY_GROUP, history);
    let memory_faults = history_results
        .iter()
        .filter(|r| matches!(r, Err(e) if e.code == fault::MEMORY_LIMIT))
        .count();
    assert_eq!(
        memory_faults,
        history.len().div_ceil(50),
        "the history's faults"
    );
    let experienced_results = apply(&mut experienced, &experienced_store, LOG_GROUP, log);

    assert_eq!(fresh_results.len(), experienced_results.len());
    for (position, (a, b)) in fresh_results.iter().zip(&experienced_results).enumerate() {
        assert_eq!(a, b, "command {position} answered differently");
    }
    let state = dump(&fresh_store, LOG_GROUP);
    assert_eq!(state, dump(&experienced_store, LOG_GROUP));
    (fresh_results, state)
}

fn seed() -> u64 {
    let seed = std::env::var("CONCORD_DETERMINISM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0xde7e_2013);
    println!("CONCORD_DETERMINISM_SEED={seed}");
    seed
}

#[test]
fn session_plugin_answers_the_same_whatever_came_before() {
    let mut rng = StdRng::seed_from_u64(seed());
    let log = random_log(&mut rng, 60, common::random_session_command);
    let history = history(&mut rng, common::random_session_command);
    let (results, state) = assert_same_on_both_hosts(bundled::SESSION, &log, &history);
    assert!(results.iter().any(|r| r.is_ok()) && results.iter().any(|r| r.is_err()));
    assert!(!state.is_empty());
}

#[test]
fn kv_plugin_answers_the_same_whatever_came_before() {
    let mut rng = StdRng::seed_from_u64(seed() ^ 1);
    let log = random_log(&mut rng, 60, random_kv_command);
    let history = history(&mut rng, random_kv_command);
    let (results, state) = assert_same_on_both_hosts(bundled::KV, &log, &history);
    assert!(results.iter().any(|r| r.is_ok()) && results.iter().any(|r| r.is_err()));
    assert!(!state.is_empty());
}

#[test]
fn counter_plugin_answers_the_same_whatever_came_before() {
    let mut rng = StdRng::seed_from_u64(seed() ^ 2);
    let log = random_log(&mut rng, 60, random_counter_command);
    let history = history(&mut rng, random_counter_command);
    let (results, state) = assert_same_on_both_hosts(bundled::COUNTER, &log, &history);
    assert!(results.iter().any(|r| r.is_ok()) && results.iter().any(|r| r.is_err()));
    assert_eq!(state.len(), 1);
}

/// The plugin counts the commands its instance applied and leaks 4 KiB per command: the host
/// starts every batch from the module's initial image, so the count restarts at each entry on
/// both hosts, and the leak never outlives its batch (a long-lived instance would reach the
/// 4 MiB cap within the history's first thousand commands).
#[test]
fn a_plugin_keeping_state_in_its_instance_gets_the_same_answers_on_both_hosts() {
    let mut rng = StdRng::seed_from_u64(seed() ^ 3);
    let log = random_log(&mut rng, 200, random_stateful_command);
    let history = history(&mut rng, random_stateful_command);
    let (results, state) = assert_same_on_both_hosts(STATEFUL, &log, &history);
    let mut results = results.into_iter();
    for entry in &log {
        for expected_count in 0..entry.len() as u64 {
            let answer = results.next().unwrap().unwrap();
            assert_eq!(answer.as_ref(), expected_count.to_le_bytes());
        }
    }
    assert_eq!(state.len(), 1);
}
