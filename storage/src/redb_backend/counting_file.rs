//! A redb storage backend over a file that counts the syncs reaching it.
//!
//! Counting at this level, rather than counting our own commits, is what lets the benchmarks
//! and tests show that a batch spanning many groups really costs one sync of the file.

use std::fmt;
use std::fs::File;
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

/// The error type of redb's byte-level backend calls (without its experimental API).
type BackendIoError = std::io::Error;

/// redb's own file backend, with `sync_data` counted.
pub(super) struct CountingFile {
    inner: FileBackend,
    syncs: Arc<AtomicU64>,
    /// Histogram the duration of each sync is recorded in.
    sync_metric: &'static str,
}

impl CountingFile {
    pub(super) fn new(
        file: File,
        syncs: Arc<AtomicU64>,
        sync_metric: &'static str,
    ) -> Result<Self, redb::DatabaseError> {
        Ok(CountingFile {
            inner: FileBackend::new(file)?,
            syncs,
            sync_metric,
        })
    }
}

impl fmt::Debug for CountingFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CountingFile")
            .field("syncs", &self.syncs.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl StorageBackend for CountingFile {
    fn len(&self) -> Result<u64, BackendIoError> {
        self.inner.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), BackendIoError> {
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), BackendIoError> {
        self.inner.set_len(len)
    }

    fn sync_data(&self) -> Result<(), BackendIoError> {
        let started = std::time::Instant::now();
        let result = self.inner.sync_data();
        metrics::histogram!(self.sync_metric, "backend" => "redb")
            .record(started.elapsed().as_secs_f64());
        self.syncs.fetch_add(1, Ordering::Relaxed);
        result
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), BackendIoError> {
        self.inner.write(offset, data)
    }

    fn close(&self) -> Result<(), BackendIoError> {
        self.inner.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}
