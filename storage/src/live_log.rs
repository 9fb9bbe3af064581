//! [`LiveLog`]: a [`LogStore`] whose live log is held in memory, over a [`LogPersistence`]
//! that makes each batch durable. The WAL and redb logs are both this, with their own files
//! beneath: "check the batch, persist it, then apply it to memory" is written once, here.

use parking_lot::Mutex;
use raft::prelude::Entry;

use crate::log_plan::LogPlan;
use crate::{GroupId, GroupLogState, LogBatch, LogStore, MemLogStore, StorageResult, SyncMode};

/// How a log held in memory is kept on disk. Writes reach it one at a time (the store holds
/// it under a lock), each already checked: what it persists is sure to apply.
pub trait LogPersistence: Send + 'static {
    /// What [`LogPersistence::persist`] needs of the batch itself, taken before checking the
    /// batch consumes it (the WAL's encoded record).
    type Prepared;

    /// Takes from `batch` what persisting it needs.
    fn prepare(&mut self, batch: &LogBatch) -> Self::Prepared;

    /// Writes the batch: durably, with one sync, if [`LogPlan::syncs_under`] the store's mode,
    /// and otherwise without waiting for the disk. `plan` is what the batch does to `live`,
    /// which still holds the log as it was before it.
    fn persist(
        &mut self,
        prepared: Self::Prepared,
        plan: &LogPlan,
        live: &MemLogStore,
    ) -> StorageResult<()>;

    /// Runs once `plan` was applied to `live` (the WAL checkpoints here).
    fn applied(&mut self, live: &MemLogStore) -> StorageResult<()>;

    /// Makes every write so far durable.
    fn flush(&mut self) -> StorageResult<()>;

    /// Syncs issued to the disk since opening.
    fn sync_count(&self) -> u64;
}

/// A log store that answers reads from memory and persists writes through `P`.
pub struct LiveLog<P> {
    live: MemLogStore,
    persistence: Mutex<P>,
    sync_mode: SyncMode,
}

impl<P> std::fmt::Debug for LiveLog<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveLog")
            .field("persistence", &std::any::type_name::<P>())
            .field("sync_mode", &self.sync_mode)
            .finish_non_exhaustive()
    }
}

impl<P: LogPersistence> LiveLog<P> {
    /// A store over `live`, the log `persistence` loaded from disk.
    pub(crate) fn new(live: MemLogStore, persistence: P, sync_mode: SyncMode) -> Self {
        LiveLog {
            live,
            persistence: Mutex::new(persistence),
            sync_mode,
        }
    }

    /// Runs `read` on the persistence layer (for tests of its own bookkeeping).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn with_persistence<T>(&self, read: impl FnOnce(&P) -> T) -> T {
        read(&self.persistence.lock())
    }
}

impl<P: LogPersistence> LogStore for LiveLog<P> {
    fn write_from(&self, batch: &mut LogBatch) -> StorageResult<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut persistence = self.persistence.lock();
        let prepared = persistence.prepare(batch);
        // Checked whole before anything is written: an invalid batch changes nothing, on disk
        // either. Writes are serialized by the lock, so the plan still holds below.
        let plan = self.live.plan_batch(batch)?;
        persistence.persist(prepared, &plan, &self.live)?;
        self.live.apply_plan(plan);
        persistence.applied(&self.live)
    }

    fn entries(
        &self,
        group: GroupId,
        low: u64,
        high: u64,
        max_bytes: Option<u64>,
    ) -> StorageResult<Vec<Entry>> {
        self.live.entries(group, low, high, max_bytes)
    }

    fn term(&self, group: GroupId, index: u64) -> StorageResult<u64> {
        self.live.term(group, index)
    }

    fn group_state(&self, group: GroupId) -> StorageResult<GroupLogState> {
        self.live.group_state(group)
    }

    fn first_index(&self, group: GroupId) -> StorageResult<u64> {
        self.live.first_index(group)
    }

    fn last_index(&self, group: GroupId) -> StorageResult<u64> {
        self.live.last_index(group)
    }

    fn groups(&self) -> StorageResult<Vec<GroupId>> {
        self.live.groups()
    }

    fn flush(&self) -> StorageResult<()> {
        self.persistence.lock().flush()
    }

    fn sync_mode(&self) -> SyncMode {
        self.sync_mode
    }

    fn sync_count(&self) -> u64 {
        self.persistence.lock().sync_count()
    }
}
