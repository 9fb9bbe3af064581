//! Opening a node's log and state stores on a chosen backend.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use crate::{
    LogStore, MemLogStore, MemStateStore, RedbLogStore, RedbStateStore, SledLogStore,
    SledStateStore, StateStore, StorageResult, SyncMode, WalLogStore, WriteBackStateStore,
    data_dir::prepare_data_dir, page_cache::forget_cached_pages,
};

/// Which storage backend holds a node's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// Nothing on disk; everything is lost with the process.
    Memory,
    /// sled 0.34 (see its power-loss caveat in the crate docs).
    Sled,
    /// redb, the log and the state.
    Redb,
    /// The raft log in an append-only WAL (one `fdatasync` per batch, the live log in
    /// memory), the state in redb: what a new data directory gets when no backend is named
    /// (a log write costs one `fdatasync` and an append, where redb's rewrites pages).
    Wal,
}

impl BackendKind {
    /// Every backend, in the order benchmarks report them.
    pub const ALL: [BackendKind; 4] = [
        BackendKind::Memory,
        BackendKind::Sled,
        BackendKind::Redb,
        BackendKind::Wal,
    ];

    /// The short name used in configuration, benchmark output and the format marker.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Memory => "mem",
            BackendKind::Sled => "sled",
            BackendKind::Redb => "redb",
            BackendKind::Wal => "wal",
        }
    }

    /// `false` for the memory backend.
    pub fn is_persistent(self) -> bool {
        !matches!(self, BackendKind::Memory)
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BackendKind {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "mem" | "memory" => Ok(BackendKind::Memory),
            "sled" => Ok(BackendKind::Sled),
            "redb" => Ok(BackendKind::Redb),
            "wal" => Ok(BackendKind::Wal),
            other => Err(format!(
                "unknown backend {other:?}: expected mem, sled, redb or wal"
            )),
        }
    }
}

/// Where and how to open a node's stores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// The backend.
    pub backend: BackendKind,
    /// The node's data directory (unused by the memory backend).
    pub data_dir: PathBuf,
    /// Whether each log write waits for the disk.
    pub log_sync: SyncMode,
    /// Page cache of the state file on the redb and WAL backends (the others ignore it).
    pub state_cache_bytes: usize,
}

/// The state file's page cache unless a [`StoreConfig`] names another.
pub const DEFAULT_STATE_CACHE_BYTES: usize = crate::redb_backend::DEFAULT_CACHE_BYTES;

impl StoreConfig {
    /// A config for `backend` in `data_dir`, with every log write synced.
    pub fn new(backend: BackendKind, data_dir: impl Into<PathBuf>) -> Self {
        StoreConfig {
            backend,
            data_dir: data_dir.into(),
            log_sync: SyncMode::Sync,
            state_cache_bytes: DEFAULT_STATE_CACHE_BYTES,
        }
    }
}

/// A node's log store and state store, opened together from one data directory.
///
/// ```
/// use concord_storage::{BackendKind, StoreConfig, Stores};
///
/// let dir = tempfile::tempdir()?;
/// let stores = Stores::open(&StoreConfig::new(BackendKind::Redb, dir.path()))?;
/// assert!(stores.log.groups()?.is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Stores {
    /// The raft logs of every group.
    pub log: Arc<dyn LogStore>,
    /// The state-machine data of every group.
    pub state: Arc<dyn StateStore>,
}

impl fmt::Debug for Stores {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stores").finish_non_exhaustive()
    }
}

/// File (redb) or directory (sled) names inside the data directory.
const LOG_NAME: &str = "log";
const STATE_NAME: &str = "state";

impl Stores {
    /// Opens the stores described by `config`, creating the data directory if needed and
    /// checking its format marker.
    pub fn open(config: &StoreConfig) -> StorageResult<Stores> {
        let dir = &config.data_dir;
        if config.backend.is_persistent() {
            prepare_data_dir(dir, config.backend)?;
            // What a failed write-back left in the page cache must not be read as durable.
            forget_cached_pages(dir)?;
        }
        let (log, state): (Arc<dyn LogStore>, Arc<dyn StateStore>) = match config.backend {
            BackendKind::Memory => (Arc::new(MemLogStore::new()), Arc::new(MemStateStore::new())),
            BackendKind::Sled => (
                Arc::new(SledLogStore::open(
                    &dir.join(format!("{LOG_NAME}.sled")),
                    config.log_sync,
                )?),
                Arc::new(SledStateStore::open(
                    &dir.join(format!("{STATE_NAME}.sled")),
                )?),
            ),
            BackendKind::Redb => (
                Arc::new(RedbLogStore::open(
                    &dir.join(format!("{LOG_NAME}.redb")),
                    config.log_sync,
                )?),
                Arc::new(WriteBackStateStore::new(RedbStateStore::open_with_cache(
                    &dir.join(format!("{STATE_NAME}.redb")),
                    config.state_cache_bytes,
                )?)),
            ),
            BackendKind::Wal => (
                Arc::new(WalLogStore::open(
                    &dir.join(format!("{LOG_NAME}.wal")),
                    config.log_sync,
                )?),
                Arc::new(WriteBackStateStore::new(RedbStateStore::open_with_cache(
                    &dir.join(format!("{STATE_NAME}.redb")),
                    config.state_cache_bytes,
                )?)),
            ),
        };
        Ok(Stores { log, state })
    }
}
