//! An open sled database that closes without panicking on a failing disk.
//!
//! sled 0.34 closes a database when its last handle drops: it writes what it buffers and then
//! syncs its file, unwrapping the sync's result. On a failing disk a node stopping (on the
//! failure, or asked to) then ended in that panic after it had said why it stops. So a
//! database closes here: flushed first, then its file synced once by this code; if either
//! fails, the handle is leaked and sled's close never runs — nothing more can be made durable,
//! and what was acknowledged was synced before. Otherwise sled's close runs, with a panic of
//! it caught (a disk that fails only some calls may still fail its sync).

use std::fs::File;
use std::ops::Deref;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

/// A sled database, open until dropped.
#[derive(Debug)]
pub(crate) struct SledDatabase {
    db: Option<sled::Db>,
    path: PathBuf,
}

impl SledDatabase {
    /// `db`, opened from the directory `path`.
    pub(crate) fn new(db: sled::Db, path: &Path) -> SledDatabase {
        SledDatabase {
            db: Some(db),
            path: path.to_path_buf(),
        }
    }

    /// Whether the database's file takes a sync now (sled keeps its data in `db`).
    fn file_syncs(&self) -> bool {
        File::open(self.path.join("db"))
            .and_then(|file| file.sync_all())
            .is_ok()
    }
}

impl Deref for SledDatabase {
    type Target = sled::Db;

    fn deref(&self) -> &sled::Db {
        // Taken only by `drop`.
        self.db
            .as_ref()
            .expect("a sled database is open until dropped")
    }
}

impl Drop for SledDatabase {
    fn drop(&mut self) {
        let Some(db) = self.db.take() else {
            return;
        };
        // A clean close keeps what a store wrote without a sync; there is no one left to
        // report a failure to.
        if db.flush().is_err() || !self.file_syncs() {
            std::mem::forget(db);
            return;
        }
        let _ = catch_unwind(AssertUnwindSafe(move || drop(db)));
    }
}
