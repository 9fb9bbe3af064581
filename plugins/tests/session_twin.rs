//! The session plugin and its native twin: the same seeded command log gives byte-identical
//! results and state, whatever the batch boundaries.

use bytes::Bytes;
use concord_consensus::{CommandResult, StateMachine};
use concord_plugins::{NativeSessionMachine, PluginEngine, PluginEngineConfig, bundled};
use concord_session::{LastWill, SessionCommand, SessionFields, SessionPatch};
use concord_storage::{KeyRange, KeyValue, MemStateStore, StateStore, StateTransaction};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn random_fields(rng: &mut StdRng) -> SessionFields {
    SessionFields {
        session_expiry_interval_secs: *[0u32, 5, 60, u32::MAX].get(rng.random_range(0..4)).unwrap(),
        clean_start: rng.random(),
        last_will: rng.random_bool(0.5).then(|| LastWill {
            topic: format!("t/{}", rng.random_range(0..100)),
            payload: (0..rng.random_range(0..64)).map(|_| rng.random()).collect(),
            // Now and then out of bounds, to exercise INVALID_FIELD.
            qos: rng.random_range(0..4),
            retain: rng.random(),
            delay_interval_secs: rng.random_range(0..10),
        }),
        broker_id: format!("broker-{}", rng.random_range(0..3)),
        connection_id: rng.random(),
    }
}

fn random_command(rng: &mut StdRng, now_ms: u64) -> Vec<u8> {
    let client_id = format!(
        "{}{:02}",
        ["room/", "dev/", ""][rng.random_range(0..3)],
        rng.random_range(0..30)
    );
    let expected_version = rng.random_bool(0.3).then(|| rng.random_range(1..4));
    let command = match rng.random_range(0..100) {
        0..30 => SessionCommand::Create {
            client_id,
            fields: random_fields(rng),
            now_ms,
        },
        30..40 => SessionCommand::Get { client_id },
        40..50 => SessionCommand::Replace {
            client_id,
            fields: random_fields(rng),
            expected_version,
            now_ms,
        },
        50..65 => SessionCommand::Update {
            client_id,
            patch: SessionPatch {
                connection_id: rng.random_bool(0.5).then(|| rng.random()),
                clean_start: rng.random_bool(0.5).then(|| rng.random()),
                last_will: rng.random_bool(0.2).then_some(None),
                ..Default::default()
            },
            expected_version,
            now_ms,
        },
        65..75 => SessionCommand::Delete {
            client_id,
            expected_version,
        },
        75..85 => SessionCommand::List {
            prefix: ["room/", "dev/", ""][rng.random_range(0..3)].into(),
            start_after: rng.random_bool(0.3).then(|| "dev/10".into()),
            limit: rng.random_range(0..12),
        },
        85..90 => SessionCommand::Expire {
            now_ms,
            start_after: None,
            scan_limit: rng.random_range(1..50),
        },
        _ => {
            // Damaged bytes: a valid command cut short or flipped.
            let mut bytes = SessionCommand::Get { client_id }.encode();
            let cut = rng.random_range(0..bytes.len());
            bytes.truncate(cut);
            bytes.push(rng.random());
            return bytes;
        }
    };
    command.encode()
}

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
        .map(|i| Bytes::from(random_command(&mut rng, 1_000_000 + i * 700)))
        .collect();

    let engine = PluginEngine::new(PluginEngineConfig::default()).unwrap();
    let plugin = engine.load("session", bundled::SESSION).unwrap();

    let store_a = MemStateStore::new();
    let mut sizes = StdRng::seed_from_u64(seed ^ 1);
    let results_a = run(
        &mut plugin.instantiate().unwrap(),
        &store_a,
        &commands,
        || sizes.random_range(1..64),
    );
    let store_b = MemStateStore::new();
    let results_b = run(
        &mut plugin.instantiate().unwrap(),
        &store_b,
        &commands,
        || 7,
    );
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
