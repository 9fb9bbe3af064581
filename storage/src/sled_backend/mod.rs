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
use std::time::{Duration, Instant};

use crate::{StorageError, StorageResult};

pub use log_store::SledLogStore;
pub use state_store::SledStateStore;

/// Page cache of each sled database (sled's default is 1 GiB).
const CACHE_BYTES: u64 = 64 * 1024 * 1024;

/// How long an open waits for the directory's lock: a database this process dropped a
/// moment ago holds it until sled's background flusher lets go.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// Opens (or creates) the sled database directory at `path`. sled may panic on a damaged
/// directory; that becomes [`StorageError::Corrupted`] instead of a crash of the node. A
/// directory locked by a database still closing is waited for, up to [`LOCK_WAIT`]; one
/// locked longer (another process uses it) is an error.
pub(crate) fn open_database(path: &Path) -> StorageResult<sled::Db> {
    let config = sled::Config::new()
        .path(path)
        .cache_capacity(CACHE_BYTES)
        .mode(sled::Mode::HighThroughput);
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match catch_unwind(AssertUnwindSafe(|| config.open())) {
            Ok(Ok(db)) => return Ok(db),
            Ok(Err(sled::Error::Io(error)))
                if error.to_string().contains("could not acquire lock")
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(Err(error)) => return Err(backend_error(path, error)),
            Err(_) => {
                return Err(StorageError::corrupted(
                    path,
                    "sled panicked while opening the database",
                ));
            }
        }
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
