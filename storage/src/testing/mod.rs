//! The conformance suite: one set of cases that every storage backend runs unchanged.
//!
//! A backend's test file is one line per group of cases:
//!
//! ```ignore
//! concord_storage::storage_conformance_tests!(concord_storage::BackendKind::Redb);
//! concord_storage::persistence_conformance_tests!(concord_storage::BackendKind::Redb);
//! ```
//!
//! Each case is also a public function taking a [`BackendKind`], so a new backend can call
//! them from its own harness. Cases panic (assert) on a broken contract: they are tests.

mod hooked_state;
mod hostile_bytes;
mod log_cases;
mod model_log;
mod persistence_cases;
mod power_loss;
mod power_loss_files;
mod seeded_rng;
mod state_cases;

use raft::prelude::Entry;
use tempfile::TempDir;

use crate::{BackendKind, DEFAULT_STATE_CACHE_BYTES, StoreConfig, Stores, SyncMode};

pub use hooked_state::{HookedState, StateCall, StateHook};
pub use hostile_bytes::hostile_inputs;
pub use log_cases::*;
pub use model_log::{assert_same_log, commit_only_batch, mixed_batch, same_log};
pub use persistence_cases::*;
pub use power_loss::PowerLossDisk;
pub use power_loss_files::PowerLossFiles;
pub use seeded_rng::SeededRng;
pub use state_cases::*;

/// A backend under test with its own temporary data directory.
pub struct Harness {
    kind: BackendKind,
    dir: TempDir,
}

impl Harness {
    /// A fresh, empty data directory for `kind`.
    pub fn new(kind: BackendKind) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("concord-conformance-")
            .tempdir()
            .expect("create a temporary directory");
        Harness { kind, dir }
    }

    /// The backend.
    pub fn kind(&self) -> BackendKind {
        self.kind
    }

    /// The data directory.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// The store config for this harness.
    pub fn config(&self, log_sync: SyncMode) -> StoreConfig {
        StoreConfig {
            backend: self.kind,
            data_dir: self.dir.path().to_path_buf(),
            log_sync,
            state_cache_bytes: DEFAULT_STATE_CACHE_BYTES,
        }
    }

    /// Opens the stores with every log write synced.
    pub fn open(&self) -> Stores {
        self.open_with(SyncMode::Sync)
    }

    /// Opens the stores with the given sync mode.
    pub fn open_with(&self, log_sync: SyncMode) -> Stores {
        Stores::open(&self.config(log_sync)).expect("open the stores")
    }
}

/// Opens the sled database directory at `path` as the sled backend does (waiting for the lock
/// a database dropped a moment ago still holds), for a test that changes it behind the store's
/// back.
pub fn open_sled_database(path: &std::path::Path) -> crate::StorageResult<sled::Db> {
    crate::sled_backend::open_database(path).map(|db| (*db).clone())
}

/// Entries `indexes` with `term`, each carrying a payload naming its group, index and term.
pub fn make_entries(group: u64, indexes: std::ops::RangeInclusive<u64>, term: u64) -> Vec<Entry> {
    indexes
        .map(|index| {
            let mut entry = Entry::default();
            entry.index = index;
            entry.term = term;
            entry.data = format!("g{group}/i{index}/t{term}").into_bytes().into();
            entry
        })
        .collect()
}

/// Generates one `#[test]` per storage conformance case for a backend.
#[macro_export]
macro_rules! storage_conformance_tests {
    ($kind:expr) => {
        $crate::storage_conformance_tests!(
            $kind,
            [
                log_append_and_read_back,
                log_entries_respect_the_byte_limit,
                log_reads_outside_the_range_are_typed_misses,
                log_conflicting_suffix_is_replaced,
                log_invalid_batch_changes_nothing,
                log_compaction_bounds,
                log_new_group_is_empty,
                log_hard_state_and_conf_state_round_trip,
                log_apply_snapshot_restarts_the_log,
                log_batch_of_many_groups_costs_one_sync,
                log_commit_only_batch_waits_for_the_next_sync,
                state_commit_and_read_back,
                state_keys_are_visited_in_order_per_group,
                state_applied_index_is_atomic_and_advances,
                state_scans_are_ordered_bounded_and_isolated,
                state_transaction_reads_its_own_writes,
                state_snapshot_stream_round_trip,
                state_snapshot_is_consistent_while_commits_continue,
                state_bad_snapshot_stream_changes_nothing,
                state_commit_groups_is_all_or_nothing,
                state_borrowed_commits_are_all_or_nothing,
                state_restore_groups_is_all_or_nothing,
            ]
        );
    };
    ($kind:expr, [$($case:ident),* $(,)?]) => {
        $(
            #[test]
            fn $case() {
                $crate::testing::$case($kind);
            }
        )*
    };
}

/// Generates one `#[test]` per persistence case (reopen, format marker) for a disk backend.
#[macro_export]
macro_rules! persistence_conformance_tests {
    ($kind:expr) => {
        $crate::storage_conformance_tests!(
            $kind,
            [
                reopen_keeps_every_synced_log_write,
                reopen_keeps_flushed_state,
                reopen_after_clean_close_keeps_unsynced_writes,
                reopen_after_clean_close_keeps_commit_only_writes,
                format_marker_guards_the_directory,
            ]
        );
    };
}
