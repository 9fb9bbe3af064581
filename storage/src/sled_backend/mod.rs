//! The sled 0.34 backend: one sled database for the logs, one for the state.
//!
//! **Power-loss caveat.** sled 0.34 is pre-1.0: its on-disk format is not stable and its
//! authors do not claim crash safety under power loss; upstream has open reports of data lost
//! or a database refusing to open after a crash. Concord's crash tests kill the process
//! (SIGKILL), which sled survives, but they cannot cut power. Use redb where durability
//! matters; sled is here for comparison and for workloads that can rebuild from peers.

mod keys;
mod log_store;
mod state_store;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use crate::{StorageError, StorageResult};

pub use log_store::SledLogStore;
pub use state_store::SledStateStore;

/// Page cache of each sled database (sled's default is 1 GiB).
const CACHE_BYTES: u64 = 64 * 1024 * 1024;

/// Opens (or creates) the sled database directory at `path`. sled may panic on a damaged
/// directory; that becomes [`StorageError::Corrupted`] instead of a crash of the node.
fn open_database(path: &Path) -> StorageResult<sled::Db> {
    let config = sled::Config::new()
        .path(path)
        .cache_capacity(CACHE_BYTES)
        .mode(sled::Mode::HighThroughput);
    match catch_unwind(AssertUnwindSafe(|| config.open())) {
        Ok(Ok(db)) => Ok(db),
        Ok(Err(error)) => Err(backend_error(path, error)),
        Err(_) => Err(StorageError::corrupted(
            path,
            "sled panicked while opening the database",
        )),
    }
}

fn backend_error(path: &Path, error: sled::Error) -> StorageError {
    match error {
        sled::Error::Io(source) => StorageError::Io {
            path: path.to_path_buf(),
            source,
        },
        sled::Error::Corruption { at, .. } => {
            StorageError::corrupted(path, format!("sled found corruption at {at:?}"))
        }
        other => StorageError::Backend {
            backend: "sled",
            path: path.to_path_buf(),
            detail: other.to_string(),
        },
    }
}

/// `map_err` shorthand for sled results.
trait SledResultExt<T> {
    fn at(self, path: &Path) -> StorageResult<T>;
}

impl<T> SledResultExt<T> for Result<T, sled::Error> {
    fn at(self, path: &Path) -> StorageResult<T> {
        self.map_err(|error| backend_error(path, error))
    }
}
