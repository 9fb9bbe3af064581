//! The sled 0.34 backend: one sled database for the logs, one for the state.
//!
//! **Power-loss caveat.** sled 0.34 is pre-1.0: its on-disk format is not stable and its
//! authors do not claim crash safety under power loss; upstream has open reports of data lost
//! or a database refusing to open after a crash. Concord's crash tests kill the process
//! (SIGKILL), which sled survives, but they cannot cut power. Use redb where durability
//! matters; sled is here for comparison and for workloads that can rebuild from peers.

mod database;
mod keys;
mod log_store;
mod state_store;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::{StorageError, StorageResult};
use database::SledDatabase;

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
pub(crate) fn open_database(path: &Path) -> StorageResult<SledDatabase> {
    let config = sled::Config::new()
        .path(path)
        .cache_capacity(CACHE_BYTES)
        .mode(sled::Mode::HighThroughput);
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match catch_unwind(AssertUnwindSafe(|| config.open())) {
            Ok(Ok(db)) => return Ok(SledDatabase::new(db, path)),
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
            source: with_os_error_restored(source),
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

/// The system's error inside an I/O error sled handed on. sled keeps the first error of its
/// background flusher and hands a copy to every later call, made from the original's debug
/// text (`Os { code: 5, kind: Uncategorized, message: "Input/output error" }`); the copy is
/// turned back into the system's error, so the node's message reads as any other I/O error's
/// ("Input/output error (os error 5)"). Any other error is returned as it is.
fn with_os_error_restored(error: std::io::Error) -> std::io::Error {
    if error.raw_os_error().is_some() {
        return error;
    }
    let text = error.to_string();
    let code = text
        .strip_prefix("Os { code: ")
        .and_then(|rest| rest.split(',').next())
        .and_then(|code| code.parse::<i32>().ok());
    match code {
        Some(code) => std::io::Error::from_raw_os_error(code),
        None => error,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_io_error_sled_copied_reads_as_the_systems_error() {
        let original = std::io::Error::from_raw_os_error(5);
        let copied = std::io::Error::other(format!("{original:?}"));
        let error = backend_error(Path::new("/data/log.sled"), sled::Error::Io(copied));
        assert_eq!(
            error.to_string(),
            format!("I/O error on /data/log.sled: {original}")
        );
        assert!(error.to_string().ends_with("(os error 5)"), "{error}");
    }

    #[test]
    fn any_other_io_error_is_kept_as_it_is() {
        let error = backend_error(
            Path::new("/data/log.sled"),
            sled::Error::Io(std::io::Error::other("could not acquire lock")),
        );
        assert_eq!(
            error.to_string(),
            "I/O error on /data/log.sled: could not acquire lock"
        );
    }
}
