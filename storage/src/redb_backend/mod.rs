//! The redb backend: one redb file for the logs (a record per batch for all groups, synced with
//! `Durability::Immediate`) and one for the state (committed with `Durability::None`, made
//! durable by `flush`).

mod counting_file;
mod group_buckets;
mod log_record;
mod log_store;
mod record_locations;
mod state_store;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use crate::{StorageError, StorageResult};
use counting_file::CountingFile;

pub use log_store::RedbLogStore;
pub use state_store::RedbStateStore;

/// Page cache of a redb file unless its opener names another. redb's default (1 GiB) is sized
/// for a process that owns the machine; a node opens two files and leaves memory to the state
/// machine.
pub(crate) const DEFAULT_CACHE_BYTES: usize = 64 * 1024 * 1024;

/// Opens (or creates) the redb file at `path`, verifying every page checksum on open so that a
/// damaged file is reported instead of trusted. `syncs` counts the syncs that reach the file.
fn open_database(
    path: &Path,
    cache_bytes: usize,
    syncs: Arc<AtomicU64>,
    sync_metric: &'static str,
) -> StorageResult<redb::Database> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|source| StorageError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    let backend =
        CountingFile::new(file, syncs, sync_metric).map_err(|e| backend_error(path, e))?;
    open_database_on(path, cache_bytes, backend)
}

/// Opens (or creates) a redb database over `backend`; `path` names it in errors.
fn open_database_on(
    path: &Path,
    cache_bytes: usize,
    backend: impl redb::StorageBackend,
) -> StorageResult<redb::Database> {
    // redb documents that opening a damaged file without the integrity check "may panic"; the
    // check is on, and a panic that escapes anyway becomes an error, never a crash of the node.
    let opened = catch_unwind(AssertUnwindSafe(|| {
        redb::Builder::new()
            .set_cache_size(cache_bytes)
            .set_check_integrity_on_open(true)
            .create_with_backend(backend)
    }));
    match opened {
        Ok(Ok(db)) => Ok(db),
        Ok(Err(error)) => Err(backend_error(path, error)),
        Err(_) => Err(StorageError::corrupted(
            path,
            "redb panicked while opening the file",
        )),
    }
}

/// Converts any redb error into a [`StorageError`] naming the file; redb's corruption reports
/// become [`StorageError::Corrupted`].
fn backend_error(path: &Path, error: impl Into<redb::Error>) -> StorageError {
    let error: redb::Error = error.into();
    match error {
        redb::Error::Corrupted(detail) => StorageError::corrupted(path, detail),
        redb::Error::Io(source) if source.kind() == std::io::ErrorKind::InvalidData => {
            StorageError::corrupted(path, format!("not a redb file: {source}"))
        }
        redb::Error::Io(source) => StorageError::Io {
            path: path.to_path_buf(),
            source,
        },
        other => StorageError::Backend {
            backend: "redb",
            path: path.to_path_buf(),
            detail: other.to_string(),
        },
    }
}

/// `map_err` shorthand for redb results.
trait RedbResultExt<T> {
    fn at(self, path: &Path) -> StorageResult<T>;
}

impl<T, E: Into<redb::Error>> RedbResultExt<T> for Result<T, E> {
    fn at(self, path: &Path) -> StorageResult<T> {
        self.map_err(|error| backend_error(path, error))
    }
}
