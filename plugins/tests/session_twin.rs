//! The session plugin and its native twin: the same seeded command log gives byte-identical
//! results and state, whatever the batch boundaries.

mod common;

use bytes::Bytes;
use common::random_session_command;
use concord_consensus::{CommandResult, StateMachine};
use concord_plugins::{NativeSessionMachine, PluginEngine, PluginEngineConfig, bundled};
use concord_storage::{KeyRange, KeyValue, MemStateStore, StateStore, StateTransaction};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Applies `commands` in batches whose sizes `next_batch` picks; returns every result.
fn run(
    machine: &mut dyn StateMachine,
    store: &MemStateStore,
    commands: &[Bytes],
    mut next_batch: impl FnMut() -> usize,
) -> Vec<CommandResult> {
    let mut results = Vec::new();
    let mut index = 0;
    let mut rest = commands;
    while !rest.is_empty() {
        let size = next_batch().clamp(1, rest.len());
        let (batch, tail) = rest.split_at(size);
        let mut txn = StateTransaction::new(store, 1);
        results.extend(machine.apply(&mut txn, batch).unwrap());
        index += 1;
        txn.commit(index).unwrap();
        rest = tail;
    }
    results
}

fn dump(store: &MemStateStore) -> Vec<KeyValue> {
    store.scan(1, &KeyRange::all(), usize::MAX).unwrap()
}

#[test]
fn wasm_and_native_reach_byte_identical_state() {
    let seed: u64 = std::env::var("CONCORD_TWIN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5e55_1017);
    println!("CONCORD_TWIN_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let commands: Vec<Bytes> = (0..3000u64)
        .map(|i| Bytes::from(random_session_command(&mut rng, 1_000_000 + i * 700)))
        .collect();

    let engine = PluginEngine::new(PluginEngineConfig::default()).unwrap();
    let plugin = engine.load("session", bundled::SESSION).unwrap();

    let store_a = MemStateStore::new();
    let mut sizes = StdRng::seed_from_u64(seed ^ 1);
    let results_a = run(&mut plugin.state_machine(), &store_a, &commands, || {
        sizes.random_range(1..64)
    });
    let store_b = MemStateStore::new();
    let results_b = run(&mut plugin.state_machine(), &store_b, &commands, || 7);
    let store_native = MemStateStore::new();
    let mut sizes = StdRng::seed_from_u64(seed ^ 2);
    let results_native = run(&mut NativeSessionMachine, &store_native, &commands, || {
        sizes.random_range(1..200)
    });

    assert_eq!(results_a, results_b);
    assert_eq!(results_a, results_native);
    let state = dump(&store_a);
    assert_eq!(state, dump(&store_b));
    assert_eq!(state, dump(&store_native));

    // The log must have exercised both outcomes, or the comparison proves little.
    let failures = results_a.iter().filter(|r| r.is_err()).count();
    assert!(failures > 300 && failures < 2700, "{failures} failures");
    assert!(state.len() > 10, "{} sessions left", state.len());
}
