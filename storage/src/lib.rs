//! Concord's storage core: the raft log and the state machine's data of many raft groups,
//! behind two traits, with in-memory, sled and redb backends.
//!
//! ```
//! use concord_storage::raft::prelude::Entry;
//! use concord_storage::{BackendKind, LogBatch, StateTransaction, StoreConfig, Stores};
//!
//! let dir = tempfile::tempdir()?;
//! let stores = Stores::open(&StoreConfig::new(BackendKind::Redb, dir.path()))?;
//!
//! // One batch, two groups, one sync.
//! let mut batch = LogBatch::new();
//! for group in [1, 2] {
//!     let mut entry = Entry::default();
//!     entry.index = 1;
//!     entry.term = 1;
//!     entry.data = b"set x = 1".to_vec().into();
//!     batch.append(group, vec![entry]);
//! }
//! stores.log.write(batch)?;
//! assert_eq!(stores.log.entries(2, 1, 2, None)?[0].data.as_ref(), b"set x = 1");
//!
//! // Apply entry 1 of group 1: the data and the applied index commit together.
//! let mut txn = StateTransaction::new(stores.state.as_ref(), 1);
//! txn.put(b"x", b"1")?;
//! txn.commit(1)?;
//! assert_eq!(stores.state.get(1, b"x")?.as_deref(), Some(&b"1"[..]));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Layout
//!
//! - [`LogStore`] (`log_store.rs`): the contract of the raft log store; [`LogBatch`]
//!   (`log_batch.rs`) is its unit of group commit. The rules of a raft log (no holes, conflict
//!   truncation, compaction) are implemented once in `log_plan.rs`; backends only execute the
//!   plan.
//! - [`StateStore`] (`state_store.rs`): the contract of the state-machine store;
//!   [`StateTransaction`] adds read-your-writes staging, [`WriteSet`] holds the staged writes.
//! - `snapshot_stream.rs`: the portable byte stream a group's state travels in
//!   ([`export_snapshot`], [`import_snapshot`]).
//! - Backends: `mem/`, `sled_backend/`, `redb_backend/`, and `wal_backend/` (an append-only
//!   log file for the raft log, paired with redb for the state); [`Stores::open`] picks one from a
//!   [`StoreConfig`]; `data_dir.rs` guards the directory's format version.
//! - [`WriteBackStateStore`] (`write_back.rs`): commits held in memory and written beneath by
//!   each flush, so a flush never stops the committer; [`Stores::open`] puts redb's state
//!   store under one.
//! - `testing` (cargo feature `testing`): the conformance suite every backend runs unchanged,
//!   for this crate's tests and for other backends.

mod background_priority;
mod codec;
mod data_dir;
mod error;
mod group_log_state;
mod key_filter;
mod key_range;
mod live_log;
mod log_batch;
mod log_plan;
mod log_store;
mod mem;
mod page_cache;
mod redb_backend;
mod sled_backend;
mod snapshot_stream;
mod state_store;
mod state_transaction;
mod stores;
mod sync_mode;
mod wal_backend;
mod write_back;
mod write_set;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

/// The raft-rs crate this engine's log types come from (`Entry`, `HardState`, ...).
pub use raft;

pub use background_priority::lower_this_threads_priority;
pub use data_dir::{
    FORMAT_FILE, FORMAT_VERSION, RESTORE_MARKER_FILE, prepare_data_dir, recorded_backend,
};
pub use error::{StorageError, StorageResult};
pub use group_log_state::GroupLogState;
pub use key_range::{KeyRange, KeyValue};
pub use live_log::LiveLog;
pub use log_batch::{LogBatch, LogOp};
pub use log_store::LogStore;
pub use mem::{MemLogStore, MemStateStore};
pub use redb_backend::{RedbLogStore, RedbStateStore};
pub use sled_backend::{SledLogStore, SledStateStore};
pub use snapshot_stream::{
    SnapshotReader, SnapshotSummary, export_snapshot, import_snapshot, write_snapshot,
};
pub use state_store::{BorrowedGroupCommit, GroupCommit, GroupRestore, StateSnapshot, StateStore};
pub use state_transaction::StateTransaction;
pub use stores::{BackendKind, DEFAULT_STATE_CACHE_BYTES, StoreConfig, Stores};
pub use sync_mode::SyncMode;
pub use wal_backend::{WalLogStore, WalOptions};
pub use write_back::{DEFAULT_PENDING_LIMIT_BYTES, WriteBackStateStore};
pub use write_set::{MAX_KEY_BYTES, MAX_VALUE_BYTES, WriteSet};

/// Identifies a raft group. Each group has its own log and its own key space in the state.
pub type GroupId = u64;
