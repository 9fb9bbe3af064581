//! The wasm host: loading, limits, failure semantics, the module cache, the bundled plugins.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use concord_consensus::{ApplyError, CommandResult, StateMachine};
use concord_plugin_abi::fault;
use concord_plugins::{
    FaultCounts, LoadError, PluginEngine, PluginEngineConfig, PluginLimits, bundled,
};
use concord_storage::testing::{HookedState, StateCall};
use concord_storage::{KeyRange, MemStateStore, StateStore, StateTransaction, StorageError};

/// A plugin whose command's first byte picks its behaviour, after it puts its own bytes as a
/// key: 0 succeed, 1 loop for ever, 2 grow memory past any cap, 3 recurse without end,
/// 4 trap, 5 fail with code 7.
const HOSTILE: &str = r#"
(module
  (import "concord" "kv_put" (func $put (param i32 i32 i32 i32) (result i32)))
  (import "concord" "command_result" (func $result (param i32 i32 i32)))
  (memory (export "memory") 1)
  (func (export "concord_abi_version") (result i32) i32.const 1)
  (func (export "concord_alloc") (param i32) (result i32) i32.const 1024)
  (func $recurse (param i32) (result i32)
    local.get 0 i32.const 1 i32.add call $recurse)
  (func (export "concord_apply_batch") (param $ptr i32) (param $len i32) (result i32)
    (local $count i32) (local $cursor i32) (local $cmd i32) (local $clen i32)
    (local.set $count (i32.load (local.get $ptr)))
    (local.set $cursor (i32.add (local.get $ptr) (i32.const 4)))
    (block $done
      (loop $next
        (br_if $done (i32.eqz (local.get $count)))
        (local.set $clen (i32.load (local.get $cursor)))
        (local.set $cmd (i32.add (local.get $cursor) (i32.const 4)))
        (drop (call $put (local.get $cmd) (local.get $clen) (local.get $cmd) (local.get $clen)))
        (block $ok
          (block $fail
            (block $trap
              (block $recursion
                (block $grow
                  (block $spin
                    (br_table $ok $spin $grow $recursion $trap $fail $ok
                      (i32.load8_u (local.get $cmd))))
                  (loop $forever (br $forever)))
                (drop (memory.grow (i32.const 4000))))
              (drop (call $recurse (i32.const 0))))
            unreachable)
          (call $result (i32.const 7) (local.get $cmd) (local.get $clen))
          (local.set $clen (local.get $clen)))
        ;; Failed commands reported above; everything else reports success here, except
        ;; that a failed command must not be reported twice.
        (if (i32.ne (i32.load8_u (local.get $cmd)) (i32.const 5))
          (then (call $result (i32.const 0) (local.get $cmd) (local.get $clen))))
        (local.set $cursor (i32.add (local.get $cmd) (local.get $clen)))
        (local.set $count (i32.sub (local.get $count) (i32.const 1)))
        (br $next)))
    i32.const 0))
"#;

fn engine_with(limits: PluginLimits) -> PluginEngine {
    PluginEngine::new(PluginEngineConfig {
        limits,
        ..PluginEngineConfig::default()
    })
    .unwrap()
}

fn small_limits() -> PluginLimits {
    PluginLimits {
        fuel_per_command: 1_000_000,
        memory_bytes_max: 4 * 1024 * 1024,
        stack_bytes_max: 256 * 1024,
        watchdog: Duration::from_secs(30),
    }
}

fn code(result: &CommandResult) -> Option<u32> {
    result.as_ref().err().map(|e| e.code)
}

fn apply(
    machine: &mut dyn StateMachine,
    store: &dyn StateStore,
    index: u64,
    commands: &[&[u8]],
) -> Result<Vec<CommandResult>, ApplyError> {
    let commands: Vec<Bytes> = commands.iter().map(|c| Bytes::copy_from_slice(c)).collect();
    let mut txn = StateTransaction::new(store, 1);
    let results = machine.apply(&mut txn, &commands)?;
    txn.commit(index).unwrap();
    Ok(results)
}

#[test]
fn each_fault_fails_its_command_alone_and_drops_its_writes() {
    let engine = engine_with(small_limits());
    let plugin = engine
        .load("hostile", &wat::parse_str(HOSTILE).unwrap())
        .unwrap();
    let mut machine = plugin.state_machine();
    let store = MemStateStore::new();
    let batch: [&[u8]; 8] = [
        b"\0a", b"\x01b", b"\0c", b"\x02d", b"\x03e", b"\x04f", b"\x05g", b"\0h",
    ];
    let results = apply(&mut machine, &store, 1, &batch).unwrap();
    let codes: Vec<Option<u32>> = results.iter().map(code).collect();
    assert_eq!(
        codes,
        [
            None,
            Some(fault::OUT_OF_FUEL),
            None,
            Some(fault::MEMORY_LIMIT),
            Some(fault::STACK_OVERFLOW),
            Some(fault::TRAP),
            Some(7),
            None
        ]
    );
    assert_eq!(results[0].as_ref().unwrap().as_ref(), b"\0a");
    let keys: Vec<Vec<u8>> = store
        .scan(1, &KeyRange::all(), 100)
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(keys, [b"\0a".to_vec(), b"\0c".to_vec(), b"\0h".to_vec()]);

    // The machine keeps working after all that.
    let results = apply(&mut machine, &store, 2, &[b"\0z"]).unwrap();
    assert!(results[0].is_ok());
    assert_eq!(store.applied_index(1).unwrap(), 2);

    // Every outcome is counted once, by kind; the command that ran out of fuel burned its whole
    // budget, so the fuel count is at least that.
    let stats = plugin.stats();
    assert_eq!((stats.batches, stats.commands), (2, 9));
    assert_eq!(stats.command_errors, 1);
    assert_eq!(
        stats.faults,
        FaultCounts {
            out_of_fuel: 1,
            trap: 1,
            memory_limit: 1,
            stack_overflow: 1,
            abi_violation: 0,
        }
    );
    assert!(
        stats.fuel_used >= small_limits().fuel_per_command,
        "{stats:?}"
    );
    assert!(stats.apply_time > Duration::ZERO);
}

#[test]
fn the_watchdog_stops_the_group_instead_of_recording_an_outcome() {
    let engine = engine_with(PluginLimits {
        fuel_per_command: u64::MAX / 2,
        watchdog: Duration::from_millis(100),
        ..small_limits()
    });
    let plugin = engine
        .load("hostile", &wat::parse_str(HOSTILE).unwrap())
        .unwrap();
    let mut machine = plugin.state_machine();
    let store = MemStateStore::new();
    let error = apply(&mut machine, &store, 1, &[b"\0a", b"\x01spin"]).unwrap_err();
    assert!(
        matches!(&error, ApplyError::Fatal(message) if message.contains("watchdog")),
        "{error}"
    );
}

#[test]
fn a_store_failure_stops_the_group_and_records_nothing() {
    let engine = engine_with(small_limits());
    let plugin = engine.load("kv", bundled::KV).unwrap();
    let mut machine = plugin.state_machine();
    // A memory store whose reads fail once `failing` is set.
    let failing = Arc::new(AtomicBool::new(false));
    let reads_fail = Arc::clone(&failing);
    let store = Arc::new(HookedState::new(Box::new(move |call| {
        if call == StateCall::Read && reads_fail.load(Ordering::Relaxed) {
            return Err(StorageError::Io {
                path: "state".into(),
                source: std::io::Error::other("disk gone"),
            });
        }
        Ok(())
    })));
    let put = kv_command(1, b"k", b"v");
    apply(&mut machine, store.as_ref(), 1, &[&put]).unwrap();
    failing.store(true, Ordering::Relaxed);
    let get = kv_command(3, b"k", b"");
    let error = apply(&mut machine, store.as_ref(), 2, &[&get]).unwrap_err();
    assert!(
        matches!(error, ApplyError::Storage(StorageError::Io { .. })),
        "{error}"
    );
    assert_eq!(store.applied_index(1).unwrap(), 1);
}

/// `op u8 | key_len u16 | key | rest`, the kv plugin's encoding.
fn kv_command(op: u8, key: &[u8], rest: &[u8]) -> Vec<u8> {
    let mut command = vec![op];
    command.extend_from_slice(&(key.len() as u16).to_le_bytes());
    command.extend_from_slice(key);
    command.extend_from_slice(rest);
    command
}

#[test]
fn the_kv_plugin_puts_gets_deletes_and_compares() {
    let engine = engine_with(PluginLimits::default());
    let mut machine = engine.load("kv", bundled::KV).unwrap().state_machine();
    let store = MemStateStore::new();
    let mut cas_expect_v1 = vec![1u8];
    cas_expect_v1.extend_from_slice(&2u32.to_le_bytes());
    cas_expect_v1.extend_from_slice(b"v1v2");
    let mut cas_expect_absent = vec![0u8];
    cas_expect_absent.extend_from_slice(&0u32.to_le_bytes());
    cas_expect_absent.extend_from_slice(b"new");
    let commands = [
        kv_command(1, b"a", b"v1"),
        kv_command(3, b"a", b""),
        kv_command(4, b"a", &cas_expect_v1),
        kv_command(4, b"a", &cas_expect_v1), // a is v2 now: compare fails
        kv_command(4, b"b", &cas_expect_absent),
        kv_command(2, b"a", b""),
        kv_command(3, b"a", b""),
        vec![1, 200, 0, b'x'], // the key runs past the command
        kv_command(1, b"", b"empty key"),
    ];
    let commands: Vec<&[u8]> = commands.iter().map(Vec::as_slice).collect();
    let results = apply(&mut machine, &store, 1, &commands).unwrap();
    assert!(results[0].is_ok());
    assert_eq!(results[1].as_ref().unwrap().as_ref(), b"v1");
    assert!(results[2].is_ok());
    assert_eq!(code(&results[3]), Some(4));
    assert!(results[4].is_ok());
    assert_eq!(results[5].as_ref().unwrap().as_ref(), b"v2");
    assert_eq!(code(&results[6]), Some(2));
    assert_eq!(code(&results[7]), Some(1));
    assert!(results[8].is_err(), "an empty key is refused by the host");
    assert_eq!(store.get(1, b"b").unwrap().as_deref(), Some(&b"new"[..]));
    assert_eq!(store.get(1, b"a").unwrap(), None);
}

/// A plugin that grows its table to 3,000 entries, then answers each command with code 0 if
/// entries 5 and 2,500 are empty and 9 if not, and fills both: an instance that starts from
/// another's table (the first entry within the part of a slot reset in place, the second past
/// it) answers 9.
const TABLE_WRITER: &str = r#"
(module
  (import "concord" "command_result" (func $result (param i32 i32 i32)))
  (memory (export "memory") 1)
  (table $table 10 funcref)
  (func $marker)
  (elem declare func $marker)
  (func (export "concord_abi_version") (result i32) i32.const 1)
  (func (export "concord_alloc") (param i32) (result i32) i32.const 1024)
  (func (export "concord_apply_batch") (param $ptr i32) (param $len i32) (result i32)
    (local $count i32)
    (if (i32.lt_u (table.size $table) (i32.const 3000))
      (then (drop (table.grow $table (ref.null func)
        (i32.sub (i32.const 3000) (table.size $table))))))
    (local.set $count (i32.load (local.get $ptr)))
    (block $done
      (loop $next
        (br_if $done (i32.eqz (local.get $count)))
        (call $result
          (select (i32.const 0) (i32.const 9)
            (i32.and (ref.is_null (table.get $table (i32.const 5)))
                     (ref.is_null (table.get $table (i32.const 2500)))))
          (i32.const 0) (i32.const 0))
        (table.set $table (i32.const 5) (ref.func $marker))
        (table.set $table (i32.const 2500) (ref.func $marker))
        (local.set $count (i32.sub (local.get $count) (i32.const 1)))
        (br $next)))
    i32.const 0))
"#;

#[test]
fn every_batch_starts_from_the_modules_table() {
    let engine = engine_with(PluginLimits::default());
    let mut machine = engine
        .load("table-writer", &wat::parse_str(TABLE_WRITER).unwrap())
        .unwrap()
        .state_machine();
    let store = MemStateStore::new();
    for index in 1..=4 {
        let results = apply(&mut machine, &store, index, &[b"a", b"b"]).unwrap();
        // Within a batch the instance is the same one: the second command sees the first's.
        assert_eq!(
            code(&results[0]),
            None,
            "batch {index} saw an earlier table"
        );
        assert_eq!(code(&results[1]), Some(9), "batch {index}");
    }
}

#[test]
fn the_counter_plugin_counts_and_refuses_overflow() {
    let engine = engine_with(PluginLimits::default());
    let mut machine = engine
        .load("counter", bundled::COUNTER)
        .unwrap()
        .state_machine();
    let store = MemStateStore::new();
    let max = i64::MAX.to_le_bytes();
    let results = apply(
        &mut machine,
        &store,
        1,
        &[b"", &5i64.to_le_bytes(), &max, b"bad"],
    )
    .unwrap();
    assert_eq!(results[0].as_ref().unwrap().as_ref(), 1i64.to_le_bytes());
    assert_eq!(results[1].as_ref().unwrap().as_ref(), 6i64.to_le_bytes());
    assert_eq!(code(&results[2]), Some(2));
    assert_eq!(code(&results[3]), Some(1));
    assert_eq!(
        store.get(1, b"counter").unwrap(),
        Some(6i64.to_le_bytes().to_vec())
    );
}

#[test]
fn bad_modules_are_refused_with_the_problem_named() {
    let engine = engine_with(PluginLimits::default());
    let load = |wat_text: &str| {
        engine
            .load("bad", &wat::parse_str(wat_text).unwrap())
            .unwrap_err()
    };

    let not_wasm = engine.load("bad", b"#!/bin/sh\necho hi\n").unwrap_err();
    assert!(matches!(not_wasm, LoadError::NotWasm(_)), "{not_wasm}");

    let truncated = engine
        .load("bad", &bundled::KV[..bundled::KV.len() / 2])
        .unwrap_err();
    assert!(matches!(truncated, LoadError::Invalid(_)), "{truncated}");

    let exports = r#"(module (memory (export "memory") 1)
        (func (export "concord_abi_version") (result i32) i32.const VERSION)
        (func (export "concord_alloc") (param i32) (result i32) i32.const 0)
        APPLY)"#;
    let apply_ok =
        r#"(func (export "concord_apply_batch") (param i32 i32) (result i32) i32.const 0)"#;

    let missing = load(&exports.replace("VERSION", "1").replace("APPLY", ""));
    assert!(
        matches!(
            &missing,
            LoadError::Export {
                name: "concord_apply_batch",
                ..
            }
        ),
        "{missing}"
    );
    let mistyped = load(&exports.replace("VERSION", "1").replace(
        "APPLY",
        r#"(func (export "concord_apply_batch") (param i32) (result i32) i32.const 0)"#,
    ));
    assert!(matches!(&mistyped, LoadError::Export { .. }), "{mistyped}");
    let version = load(&exports.replace("VERSION", "2").replace("APPLY", apply_ok));
    assert!(
        matches!(
            version,
            LoadError::AbiVersion {
                found: 2,
                expected: 1
            }
        ),
        "{version}"
    );
    let import = load(
        r#"(module (import "wasi_snapshot_preview1" "fd_write" (func (param i32)))
        (memory (export "memory") 1))"#,
    );
    assert!(
        matches!(&import, LoadError::Import { module, .. } if module == "wasi_snapshot_preview1"),
        "{import}"
    );
    let no_memory =
        load(r#"(module (func (export "concord_abi_version") (result i32) i32.const 1))"#);
    assert!(
        matches!(&no_memory, LoadError::Export { name: "memory", .. }),
        "{no_memory}"
    );
    assert!(no_memory.to_string().contains("memory"));

    // A plugin whose start function traps is refused too.
    let trap_at_start = load(
        r#"(module (memory (export "memory") 1)
        (func $boom unreachable) (start $boom)
        (func (export "concord_abi_version") (result i32) i32.const 1)
        (func (export "concord_alloc") (param i32) (result i32) i32.const 0)
        (func (export "concord_apply_batch") (param i32 i32) (result i32) i32.const 0))"#,
    );
    assert!(
        matches!(trap_at_start, LoadError::Start(_)),
        "{trap_at_start}"
    );
}

#[test]
fn a_plugin_that_breaks_the_abi_fails_the_command_not_the_node() {
    // Reports a result from outside its memory, then nothing for the other commands.
    let liar = r#"(module
        (import "concord" "command_result" (func $result (param i32 i32 i32)))
        (memory (export "memory") 1)
        (func (export "concord_abi_version") (result i32) i32.const 1)
        (func (export "concord_alloc") (param i32) (result i32) i32.const 0)
        (func (export "concord_apply_batch") (param i32 i32) (result i32)
          (call $result (i32.const 0) (i32.const 70000) (i32.const 10))
          i32.const 0))"#;
    let engine = engine_with(small_limits());
    let mut machine = engine
        .load("liar", &wat::parse_str(liar).unwrap())
        .unwrap()
        .state_machine();
    let store = MemStateStore::new();
    let results = apply(&mut machine, &store, 1, &[b"one", b"two"]).unwrap();
    assert_eq!(
        results.iter().map(code).collect::<Vec<_>>(),
        [Some(fault::ABI_VIOLATION), Some(fault::ABI_VIOLATION)]
    );
}

#[test]
fn compiled_modules_are_cached_on_disk_and_damaged_entries_recompiled() {
    let dir = tempfile::tempdir().unwrap();
    let config = PluginEngineConfig {
        limits: PluginLimits::default(),
        module_cache_dir: Some(dir.path().join("modules")),
        ..PluginEngineConfig::default()
    };
    let engine = PluginEngine::new(config.clone()).unwrap();
    let plugin = engine.load("counter", bundled::COUNTER).unwrap();
    let entries: Vec<_> = std::fs::read_dir(dir.path().join("modules"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(entries.len(), 1);
    let name = entries[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(name.starts_with(plugin.sha256()), "{name}");

    // A second engine (a restart) loads from the entry; a damaged entry is recompiled.
    let engine = PluginEngine::new(config.clone()).unwrap();
    let mut machine = engine
        .load("counter", bundled::COUNTER)
        .unwrap()
        .state_machine();
    let store = MemStateStore::new();
    assert!(apply(&mut machine, &store, 1, &[b""]).unwrap()[0].is_ok());
    std::fs::write(&entries[0], b"garbage").unwrap();
    let engine = PluginEngine::new(config.clone()).unwrap();
    let mut machine = engine
        .load("counter", bundled::COUNTER)
        .unwrap()
        .state_machine();
    assert_eq!(
        apply(&mut machine, &store, 2, &[b""]).unwrap()[0]
            .as_ref()
            .unwrap()
            .as_ref(),
        2i64.to_le_bytes()
    );
    let sound_entry = std::fs::read(&entries[0]).unwrap();
    assert_ne!(sound_entry, b"garbage");

    // One flipped bit in the compiled code: wasmtime's own header check would pass it, the
    // checksum does not; the entry is recompiled and rewritten.
    let mut flipped = sound_entry.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x10;
    std::fs::write(&entries[0], &flipped).unwrap();
    let engine = PluginEngine::new(config.clone()).unwrap();
    let mut machine = engine
        .load("counter", bundled::COUNTER)
        .unwrap()
        .state_machine();
    assert!(apply(&mut machine, &store, 3, &[b""]).unwrap()[0].is_ok());
    assert_eq!(std::fs::read(&entries[0]).unwrap(), sound_entry);

    // Cut short, as by a crash of a writer that did not sync: recompiled too.
    std::fs::write(&entries[0], &sound_entry[..sound_entry.len() / 3]).unwrap();
    let engine = PluginEngine::new(config).unwrap();
    engine.load("counter", bundled::COUNTER).unwrap();
    assert_eq!(std::fs::read(&entries[0]).unwrap(), sound_entry);
}
