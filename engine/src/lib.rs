//! Concord's embeddable engine: many raft groups over one set of stores, each running a
//! WebAssembly (or native) state machine, behind an async API.
//!
//! [`Engine::open`] wires the storage backend (memory, sled, redb, or the WAL for the log),
//! consensus (raft-rs, or solo without raft), the state machine (a wasm plugin from a file or
//! bytes, the bundled session plugin, or its native twin) and `groups` groups. Each key routes
//! to a group by a fixed hash ([`group_of`]); writes go through the group's log, reads come
//! from the applied state after the check their [`Consistency`] asks for.
//!
//! ```
//! use concord_engine::{Consistency, Engine, EngineConfig, SessionFields, SessionPatch};
//!
//! # tokio::runtime::Runtime::new()?.block_on(async {
//! let dir = tempfile::tempdir()?;
//! let engine = Engine::open(EngineConfig::new(dir.path()))?; // WAL + redb, raft, session plugin
//! let sessions = engine.sessions()?;
//!
//! let fields = SessionFields { broker_id: "broker-1".into(), ..SessionFields::default() };
//! let created = sessions.create("dev/42", fields).await?;
//! let patch = SessionPatch { connection_id: Some(7), ..SessionPatch::default() };
//! let updated = sessions.update("dev/42", patch, Some(created.version)).await?;
//! assert_eq!(updated.version, 2);
//!
//! let read = sessions.get("dev/42", Consistency::Linearizable).await?;
//! assert_eq!(read.fields.connection_id, 7);
//! engine.shutdown()?; // answers what is queued, flushes, joins the threads
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The storage traits and backends are in [`storage`] (the `concord-storage` crate, re-exported
//! whole), so an embedder needs this one dependency.
//!
//! # Layout
//!
//! - `engine.rs`: [`Engine`] — open, propose, read, status, shutdown; `engine/opening.rs`: what
//!   opening checks and opens before consensus starts (stores, plugins, the node's settings).
//! - `engine_config.rs`: [`EngineConfig`], [`ConsensusKind`], [`StateMachineSource`],
//!   [`ServedPlugin`].
//! - `sessions.rs`: [`Sessions`], the typed session API.
//! - `plugin_client.rs`: [`PluginClient`], commands and key reads of a plugin served beside
//!   the main state machine over groups of its own.
//! - `routing.rs`: [`group_of`]; `group_layout.rs`: the group layout (counts and served
//!   plugins) recorded with the data.
//! - `consistency.rs`: [`Consistency`]; `engine_error.rs`: [`EngineError`].
//! - `membership.rs`: [`Engine::change_membership`] and the members.
//! - `backup.rs`: [`Engine::backup`], [`verify_backup`] and [`restore_backup`].
//! - `testing/` (the `testing` feature): a linearizability checker for histories of session
//!   operations, and `Engine::open_in_process` for clusters in one process.

mod backup;
mod consistency;
mod durable_file;
mod engine;
mod engine_config;
mod engine_error;
mod engine_health;
mod expiry_index;
mod expiry_index_builder;
mod expiry_tracking_store;
mod group_layout;
mod membership;
mod memory_member_record;
mod plugin_client;
mod routing;
mod sessions;
#[cfg(feature = "testing")]
pub mod testing;
mod vote_quiet_record;

pub use backup::{BackupSummary, restore_backup, verify_backup};
pub use concord_consensus::LOG_SYNC_FILE;
pub use concord_consensus::{LOG_WRITE_STALL_HOLD, LOG_WRITE_STALLED_AFTER};
pub use consistency::Consistency;
pub use engine::{Engine, StateDigest};
pub use engine_config::{
    ClusterConfig, ConsensusKind, EngineConfig, MAX_GROUPS, MAX_RAFT_TICK, MAX_RAFT_WORKERS,
    MIN_RAFT_TICK, MIN_STATE_CACHE_BYTES, PLUGIN_NAME_BYTES_MAX, PeerTlsFiles, ServedPlugin,
    StateMachineSource,
};
pub use engine_error::EngineError;
pub use engine_health::{EngineHealth, READY_APPLY_LAG_MAX};
pub use expiry_index::MAX_INDEXED_SESSIONS;
pub use group_layout::GROUP_LAYOUT_FILE;
pub use membership::{MemberInfo, MemberRole};
pub use plugin_client::PluginClient;
pub use routing::group_of;
pub use sessions::{EXPIRE_PAGE_SESSIONS, Sessions, is_session_error};
pub use vote_quiet_record::VOTE_QUIET_FILE;

pub use concord_consensus::{
    GroupHealth, GroupMembers, GroupStatus, MemberChange, NodeId, ProposeError, VoterProgress,
};
pub use concord_plugins::{FaultCounts, Plugin, PluginLimits, PluginStats};
pub use concord_session::{
    ExpireOutcome, LastWill, ListPage, PAGE_LIMIT_MAX, Session, SessionError, SessionFields,
    SessionPatch, code as session_code,
};
pub use concord_storage::{BackendKind, DEFAULT_STATE_CACHE_BYTES, SyncMode};

/// The storage core: traits and backends (its conformance suite is behind its `testing`
/// feature).
pub use concord_storage as storage;
