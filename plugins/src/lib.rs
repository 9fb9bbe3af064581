//! Concord's WebAssembly state-machine host (wasmtime), and the native twin of the session
//! plugin.
//!
//! # Layout
//!
//! - [`PluginEngine`] (`plugin_engine.rs`): one wasmtime engine per process — NaN
//!   canonicalization on, threads and relaxed SIMD off, fuel and epoch interruption on — with the
//!   host functions, the watchdog clock (`epoch_clock.rs`) and the pool instances come from;
//!   what its plugins share with it is `engine_shared.rs`. Compiled modules are cached on disk
//!   (`module_cache.rs`) keyed by the plugin's SHA-256 and the engine's compatibility hash,
//!   each entry checksummed.
//! - [`Plugin`] (`plugin.rs`): a checked module (exports, imports, ABI version), and the
//!   bounded wait for a free instance slot.
//! - [`WasmStateMachine`] (`wasm_machine.rs`): one call per batch, each in a fresh instance
//!   from the module's initial image; a faulting command fails alone, a host failure stops the
//!   group. [`Plugin::state_machine`] makes one, and through it a plugin is the consensus
//!   crate's `StateMachineFactory`.
//! - [`PluginStats`] (`plugin_stats.rs`): commands, faults by kind, fuel and apply time per
//!   plugin, as [`Plugin::stats`] and as `concord_plugin_*` metrics.
//! - `host_functions.rs`, `host_state.rs`, `command_scope.rs`: the `concord` imports, bound to
//!   the apply transaction; a command's writes stay apart until it succeeds.
//! - [`VersionedMachine`] (`versioned_machine.rs`): runs the module a group's data records
//!   (`plugin_identity.rs`, under the host's reserved keys, `reserved_keys.rs`) and switches
//!   at an upgrade entry (`upgrade_command.rs`); [`PluginVersions`] makes them and keeps the
//!   loaded versions.
//! - [`NativeSessionMachine`] (`native_session.rs`): the same session logic, compiled natively.
//! - [`bundled`]: the plugins Concord ships, built from `plugins/guest` (see
//!   `fixtures/build-plugins.sh`).
//!
//! ```
//! use bytes::Bytes;
//! use concord_consensus::StateMachine;
//! use concord_storage::{MemStateStore, StateTransaction};
//! use concord_plugins::{PluginEngine, PluginEngineConfig, bundled};
//!
//! let engine = PluginEngine::new(PluginEngineConfig::default())?;
//! let mut counter = engine.load("counter", bundled::COUNTER)?.state_machine();
//! let store = MemStateStore::new();
//! let mut txn = StateTransaction::new(&store, 1);
//! let results = counter.apply(&mut txn, &[Bytes::new(), Bytes::from(41i64.to_le_bytes().to_vec())])?;
//! assert_eq!(results[1].as_ref().unwrap().as_ref(), 42i64.to_le_bytes());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod command_scope;
mod engine_shared;
mod epoch_clock;
mod host_functions;
mod host_state;
mod limits;
mod load_error;
mod module_cache;
mod native_session;
mod plugin;
mod plugin_engine;
mod plugin_identity;
mod plugin_stats;
mod reserved_keys;
mod upgrade_command;
mod versioned_machine;
mod wasm_machine;

/// Error codes the host records for a command whose execution faulted (1000 and up).
pub use concord_plugin_abi::fault;
pub use concord_plugin_abi::fault::FAULT_CODE_BASE;
pub use limits::PluginLimits;
pub use load_error::LoadError;
pub use native_session::NativeSessionMachine;
pub use plugin::Plugin;
pub use plugin_engine::{INSTANCES_AT_ONCE_DEFAULT, PluginEngine, PluginEngineConfig};
pub use plugin_identity::{
    BUNDLED_SESSION_IDENTITY, PluginRecord, read_plugin_record, wasm_identity,
};
pub use plugin_stats::{FaultCounts, PluginStats};
pub use reserved_keys::{RESERVED_KEY_PREFIX, is_reserved_key};
pub use upgrade_command::{ADMIN_COMMAND_UNKNOWN, UPGRADE_REFUSED, encode_upgrade};
pub use versioned_machine::{PluginVersions, VersionedMachine};
pub use wasm_machine::WasmStateMachine;

/// The plugins Concord ships, as committed under `fixtures/plugins/` (rebuilt by
/// `fixtures/build-plugins.sh`). Embedded, so the server needs no file to start.
pub mod bundled {
    /// The MQTT-style session state machine (`concord-session`).
    pub const SESSION: &[u8] = include_bytes!("../../fixtures/plugins/session.wasm");
    /// Put, get, delete and compare-and-set.
    pub const KV: &[u8] = include_bytes!("../../fixtures/plugins/kv.wasm");
    /// A counter.
    pub const COUNTER: &[u8] = include_bytes!("../../fixtures/plugins/counter.wasm");
}
