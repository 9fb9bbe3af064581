//! What a fresh plugin instance per batch costs, and the floor under it: one batch of one
//! command applied by the smallest plugin the host accepts (one 64 KiB page of memory, no
//! data, no allocator, one import: what it costs is the instance), by the kv and session
//! plugins, and by the session logic compiled natively (no instance at all).

use std::time::Duration;

use bytes::Bytes;
use concord_consensus::StateMachine;
use concord_plugins::{NativeSessionMachine, PluginEngine, PluginEngineConfig, bundled};
use concord_session::{SessionCommand, SessionFields};
use concord_storage::{MemStateStore, StateTransaction};
use criterion::{Criterion, criterion_group, criterion_main};

/// Reports an empty result for the one command of its batch, and does nothing else.
const SMALLEST: &str = r#"(module
  (import "concord" "command_result" (func $result (param i32 i32 i32)))
  (memory (export "memory") 1)
  (func (export "concord_abi_version") (result i32) i32.const 1)
  (func (export "concord_alloc") (param i32) (result i32) i32.const 1024)
  (func (export "concord_apply_batch") (param i32 i32) (result i32)
    (call $result (i32.const 0) (i32.const 0) (i32.const 0))
    i32.const 0))"#;

fn kv_put() -> Bytes {
    let mut command = vec![1, 3, 0];
    command.extend_from_slice(b"key");
    command.extend_from_slice(&[7u8; 150]);
    Bytes::from(command)
}

fn session_create() -> Bytes {
    let command = SessionCommand::Create {
        client_id: "bench/1".into(),
        fields: SessionFields {
            session_expiry_interval_secs: 60,
            clean_start: false,
            last_will: None,
            broker_id: "broker".into(),
            connection_id: 1,
        },
        now_ms: 1,
    };
    Bytes::from(command.encode())
}

fn one_command_batches(c: &mut Criterion) {
    let engine = PluginEngine::new(PluginEngineConfig::default()).unwrap();
    let smallest = wat::parse_str(SMALLEST).unwrap();
    let cases: Vec<(&str, Box<dyn StateMachine>, Bytes)> = vec![
        (
            "smallest plugin",
            Box::new(engine.load("smallest", &smallest).unwrap().state_machine()),
            Bytes::new(),
        ),
        (
            "kv plugin, put",
            Box::new(engine.load("kv", bundled::KV).unwrap().state_machine()),
            kv_put(),
        ),
        (
            "session plugin, create",
            Box::new(
                engine
                    .load("session", bundled::SESSION)
                    .unwrap()
                    .state_machine(),
            ),
            session_create(),
        ),
        (
            "session native, create",
            Box::new(NativeSessionMachine),
            session_create(),
        ),
    ];
    let store = MemStateStore::new();
    let mut bench = c.benchmark_group("one batch of one command");
    bench
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for (name, mut machine, command) in cases {
        let commands = [command];
        bench.bench_function(name, |b| {
            b.iter(|| {
                // A fresh transaction each time: the session create finds no session.
                let mut txn = StateTransaction::new(&store, 1);
                machine.apply(&mut txn, &commands).unwrap()
            })
        });
    }
    bench.finish();
}

criterion_group!(benches, one_command_batches);
criterion_main!(benches);
