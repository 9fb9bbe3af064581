//! A group switches modules exactly at an upgrade entry, remembers it in its data, and refuses
//! a bad module without changing anything.

use std::sync::Arc;

use bytes::Bytes;
use concord_consensus::{StateMachine, StateMachineFactory};
use concord_plugins::{
    ADMIN_COMMAND_UNKNOWN, PluginEngine, PluginEngineConfig, PluginRecord, PluginVersions,
    RESERVED_KEY_PREFIX, UPGRADE_REFUSED, bundled, encode_upgrade, read_plugin_record,
    wasm_identity,
};
use concord_storage::{GroupId, MemStateStore, StateStore, StateTransaction};

const KV_V2: &[u8] = include_bytes!("../../fixtures/plugins/kv-v2.wasm");
const GROUP: GroupId = 3;

fn put(key: &[u8], value: &[u8]) -> Bytes {
    let mut command = vec![1];
    command.extend_from_slice(&(key.len() as u16).to_le_bytes());
    command.extend_from_slice(key);
    command.extend_from_slice(value);
    Bytes::from(command)
}

fn get(key: &[u8]) -> Bytes {
    let mut command = vec![3];
    command.extend_from_slice(&(key.len() as u16).to_le_bytes());
    command.extend_from_slice(key);
    Bytes::from(command)
}

/// The kv plugin's versions, configured with v1.
fn kv_versions(engine: &PluginEngine) -> PluginVersions {
    let v1 = engine.load("kv", bundled::KV).unwrap();
    let identity = wasm_identity(v1.sha256());
    PluginVersions::new(
        "kv",
        identity,
        Arc::new(v1.clone()) as Arc<dyn StateMachineFactory>,
        Some(v1),
        Some(engine.clone()),
    )
}

/// Applies one entry of client commands in a transaction of its own and commits it.
fn apply(
    machine: &mut dyn StateMachine,
    store: &MemStateStore,
    index: u64,
    commands: &[Bytes],
) -> Vec<Result<Bytes, String>> {
    let mut txn = StateTransaction::new(store, GROUP);
    let results = machine.apply(&mut txn, commands).unwrap();
    txn.commit(index).unwrap();
    results
        .into_iter()
        .map(|r| r.map_err(|e| e.to_string()))
        .collect()
}

fn apply_admin(
    machine: &mut dyn StateMachine,
    store: &MemStateStore,
    index: u64,
    command: &Bytes,
) -> Result<Bytes, (u32, String)> {
    let mut txn = StateTransaction::new(store, GROUP);
    let result = machine.apply_admin(&mut txn, command).unwrap();
    txn.commit(index).unwrap();
    result.map_err(|e| (e.code, e.message))
}

#[test]
fn entries_before_the_upgrade_run_v1_and_after_it_v2_across_a_restart() {
    let engine = PluginEngine::new(PluginEngineConfig::default()).unwrap();
    let versions = kv_versions(&engine);
    let v1 = versions.base_identity().to_string();
    let store = MemStateStore::new();
    let mut machine = versions.create(GROUP).unwrap();
    apply(machine.as_mut(), &store, 1, &[put(b"a", b"one")]);
    assert_eq!(
        read_plugin_record(&store, GROUP).unwrap(),
        Some(PluginRecord {
            current: v1.clone(),
            base: v1.clone()
        }),
        "the first batch records the configured module"
    );

    // A bad module and an unknown admin command change nothing.
    let refused = apply_admin(
        machine.as_mut(),
        &store,
        2,
        &encode_upgrade(b"\0asm broken"),
    );
    assert_eq!(refused.unwrap_err().0, UPGRADE_REFUSED);
    let unknown = apply_admin(
        machine.as_mut(),
        &store,
        3,
        &Bytes::from_static(b"\x01\x09"),
    );
    assert_eq!(unknown.unwrap_err().0, ADMIN_COMMAND_UNKNOWN);
    assert_eq!(
        read_plugin_record(&store, GROUP).unwrap().unwrap().current,
        v1
    );

    let v2 = apply_admin(machine.as_mut(), &store, 4, &encode_upgrade(KV_V2)).unwrap();
    let v2 = String::from_utf8(v2.to_vec()).unwrap();
    assert_eq!(v2, wasm_identity(&sha256_hex(KV_V2)));
    apply(machine.as_mut(), &store, 5, &[put(b"b", b"two")]);
    assert_eq!(store.get(GROUP, b"a").unwrap().unwrap(), b"one");
    assert_eq!(store.get(GROUP, b"b").unwrap().unwrap(), b"v2:two");
    // v2's migration ran once, in the upgrade's transaction, told what it replaced.
    assert_eq!(
        store.get(GROUP, b"migrated-from").unwrap().unwrap(),
        v1.as_bytes()
    );
    assert_eq!(
        read_plugin_record(&store, GROUP).unwrap(),
        Some(PluginRecord {
            current: v2.clone(),
            base: v1.clone()
        })
    );

    // A restarted node configured with v1 runs what the data records: v2.
    let restarted_engine = PluginEngine::new(PluginEngineConfig::default()).unwrap();
    let mut restarted = kv_versions(&restarted_engine).create(GROUP).unwrap();
    apply(restarted.as_mut(), &store, 6, &[put(b"c", b"three")]);
    assert_eq!(store.get(GROUP, b"c").unwrap().unwrap(), b"v2:three");

    // Upgrading to what runs is a no-op; rolling back is another upgrade.
    let same = apply_admin(restarted.as_mut(), &store, 7, &encode_upgrade(KV_V2)).unwrap();
    assert_eq!(same, v2.as_bytes());
    apply_admin(restarted.as_mut(), &store, 8, &encode_upgrade(bundled::KV)).unwrap();
    apply(restarted.as_mut(), &store, 9, &[put(b"d", b"four")]);
    assert_eq!(store.get(GROUP, b"d").unwrap().unwrap(), b"four");
    assert_eq!(
        read_plugin_record(&store, GROUP).unwrap().unwrap().current,
        v1
    );
}

#[test]
fn a_plugin_cannot_touch_the_hosts_reserved_keys() {
    let engine = PluginEngine::new(PluginEngineConfig::default()).unwrap();
    let store = MemStateStore::new();
    let mut machine = kv_versions(&engine).create(GROUP).unwrap();
    let record_key = [RESERVED_KEY_PREFIX, b"plugin"].concat();
    let results = apply(
        machine.as_mut(),
        &store,
        1,
        &[put(&record_key, b"forged"), get(&record_key)],
    );
    assert!(
        results[0].as_ref().unwrap_err().contains("reserved"),
        "{results:?}"
    );
    assert!(
        results[1].is_err(),
        "a reserved key reads as absent: {results:?}"
    );
    let record = read_plugin_record(&store, GROUP).unwrap().unwrap();
    assert!(record.current.starts_with("sha256:"));
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A group running the native session logic applies quickly (its raft worker may apply a
/// small round itself) once it runs it; one running a wasm module never does.
#[test]
fn only_a_group_running_the_native_session_logic_applies_quickly() {
    let engine = PluginEngine::new(PluginEngineConfig::default()).unwrap();
    let native = Arc::new(|_group: GroupId| {
        Box::new(concord_plugins::NativeSessionMachine) as Box<dyn StateMachine>
    });
    let native_versions = PluginVersions::new(
        "session",
        concord_plugins::BUNDLED_SESSION_IDENTITY.into(),
        native,
        None,
        Some(engine.clone()),
    );
    let store = MemStateStore::new();
    let mut machine = native_versions.create(GROUP).unwrap();
    assert!(
        !machine.applies_quickly(),
        "before its first batch the group has not read which module its data records"
    );
    apply(
        machine.as_mut(),
        &store,
        1,
        &[Bytes::from_static(b"not a command")],
    );
    assert!(machine.applies_quickly());

    let wasm_store = MemStateStore::new();
    let mut wasm = kv_versions(&engine).create(GROUP).unwrap();
    apply(wasm.as_mut(), &wasm_store, 1, &[put(b"a", b"one")]);
    assert!(!wasm.applies_quickly());
}
