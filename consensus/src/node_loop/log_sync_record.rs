//! The record, kept beside a node's stores, of whether its log has synced every write since
//! the log last matched the state.
//!
//! A node alone whose state has applied past the end of its log lost either an unsynced tail
//! of the log (expected after a crash of a run with log syncs off) or writes the log had
//! synced and acknowledged: its files were damaged (sled opens a damaged file as empty),
//! removed, or replaced by an older copy. The stores look the same either way; this record
//! tells the two apart (`recovery::check_logs_against_state`).
//!
//! The record says `log_sync = on` only once the log matches the state and every write since
//! is synced: a run with syncs on records it after the start's checks and a flush of the log
//! (what an earlier unsynced run left in the page cache is then on the disk). A run with
//! syncs off records `log_sync = off` after the same checks, before its first write.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use concord_storage::{StorageError, StorageResult, Stores, SyncMode};

/// The record's file name in a data directory.
pub const LOG_SYNC_FILE: &str = "LOG_SYNC";

/// What the record says: `Some(true)` when every log write since the log last matched the
/// state was synced, `Some(false)` when some run did not sync, `None` when there is no record
/// (a new data directory, or one written before the record existed: nothing is known).
pub(crate) fn read(path: &Path) -> StorageResult<Option<bool>> {
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(StorageError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    match text.trim() {
        "log_sync = on" => Ok(Some(true)),
        "log_sync = off" => Ok(Some(false)),
        other => Err(StorageError::Corrupted {
            path: path.to_path_buf(),
            detail: format!(
                "expected `log_sync = on` or `log_sync = off`, found {:?}; remove the file to \
                 start without knowing whether the log synced its writes before",
                other.chars().take(64).collect::<String>()
            ),
        }),
    }
}

/// Records this run's log sync mode once the start's checks have passed, if the record says
/// otherwise: before recording `on`, the log is flushed, so that nothing an earlier unsynced
/// run wrote can still be lost.
pub(crate) fn record_this_run(
    path: &Path,
    stores: &Stores,
    recorded: Option<bool>,
) -> StorageResult<()> {
    let synced = stores.log.sync_mode() == SyncMode::Sync;
    if recorded == Some(synced) {
        return Ok(());
    }
    if synced {
        stores.log.flush()?;
    }
    replace(
        path,
        if synced {
            "log_sync = on\n"
        } else {
            "log_sync = off\n"
        },
    )
}

/// Writes `contents` to `path` through a temporary file beside it, synced, then renamed over
/// `path`, then the directory synced: a crash leaves the old record or the new one.
fn replace(path: &Path, contents: &str) -> StorageResult<()> {
    let temporary = path.with_extension("tmp");
    let io_error = |path: PathBuf| move |source| StorageError::Io { path, source };
    let mut file = fs::File::create(&temporary).map_err(io_error(temporary.clone()))?;
    file.write_all(contents.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(io_error(temporary.clone()))?;
    fs::rename(&temporary, path).map_err(io_error(path.to_path_buf()))?;
    if let Some(dir) = path.parent() {
        fs::File::open(dir)
            .and_then(|dir| dir.sync_all())
            .map_err(io_error(dir.to_path_buf()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use concord_storage::BackendKind;
    use concord_storage::testing::Harness;

    use super::*;

    #[test]
    fn each_run_records_its_mode_and_a_damaged_record_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOG_SYNC_FILE);
        assert_eq!(read(&path).unwrap(), None);

        let stores = Harness::new(BackendKind::Redb);
        record_this_run(&path, &stores.open_with(SyncMode::NoSync), None).unwrap();
        assert_eq!(read(&path).unwrap(), Some(false));
        record_this_run(&path, &stores.open_with(SyncMode::Sync), Some(false)).unwrap();
        assert_eq!(read(&path).unwrap(), Some(true));
        assert!(!path.with_extension("tmp").exists());

        fs::write(&path, "log_sync = maybe").unwrap();
        let error = read(&path).unwrap_err();
        assert!(
            matches!(error, StorageError::Corrupted { .. }) && error.to_string().contains("maybe"),
            "{error}"
        );
    }
}
