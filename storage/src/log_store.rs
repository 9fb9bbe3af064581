//! The raft log of many groups behind one trait.

use raft::prelude::Entry;

use crate::{GroupId, GroupLogState, LogBatch, StorageResult, SyncMode};

/// Durable storage for the raft logs of many groups: entries, hard state, conf state and the
/// truncated (snapshot) index and term, per group.
///
/// Why one store for many groups: a node hosting hundreds of groups must not pay one disk sync
/// per group. Writes for all groups of a poll round go into one [`LogBatch`] and
/// [`LogStore::write`] commits it with **one** sync (group commit).
///
/// # Contract
///
/// - **Atomic batches.** `write` applies all operations of a batch or none. An invalid batch
///   (a hole, an append into the compacted prefix, compaction past the end) returns
///   [`crate::StorageError::InvalidRequest`] and changes nothing.
/// - **Durable on return.** Under [`SyncMode::Sync`], everything written is on stable storage
///   when `write` returns `Ok`, and the batch cost one sync, whatever the number of groups —
///   except a batch that only moves commit indexes (no entries, and no change of a term, a
///   vote, a configuration, a compaction or a snapshot), which is written without a sync
///   and becomes durable with the next batch that syncs, or [`LogStore::flush`]. A crash may
///   take such a batch back, never a later one without it, and never any other batch
///   acknowledged. Under [`SyncMode::NoSync`] nothing waits for the disk until
///   [`LogStore::flush`].
/// - **No holes.** Each group's log holds every index in `[first_index, last_index]`.
/// - **Truncated term.** `term(first_index - 1)` is always answered (0 for a new group), so raft
///   can match the entry just before the log.
/// - **Typed misses.** Reads below `first_index` return [`crate::StorageError::Compacted`];
///   reads above `last_index` return [`crate::StorageError::Unavailable`] — the errors raft-rs
///   expects (convert with `raft::Error::from`).
/// - **Unknown groups are empty.** A group never written to has first index 1, last index 0.
/// - **Serialized writes.** Concurrent `write` calls are serialized inside the store; reads may
///   run concurrently with a write and see the state before or after it, never a part of it.
/// - **Errors are final.** Any error other than the typed misses and `InvalidRequest` means the
///   store may be damaged; the caller must stop the groups using it.
pub trait LogStore: Send + Sync + 'static {
    /// Commits `batch` atomically; with [`SyncMode::Sync`], durably with one sync unless it
    /// only moves commit indexes (see the contract above).
    fn write(&self, mut batch: LogBatch) -> StorageResult<()> {
        self.write_from(&mut batch)
    }

    /// [`LogStore::write`] for a writer that builds a batch every round: commits what `batch`
    /// holds and leaves it empty, whether the write succeeded or not, with its allocation kept
    /// for the next round.
    fn write_from(&self, batch: &mut LogBatch) -> StorageResult<()>;

    /// Entries of `group` with indexes in `[low, high)`, stopping once their encoded size
    /// passes `max_bytes` (but always returning at least one entry if the range is not empty).
    ///
    /// `low < first_index` is `Compacted`; `high > last_index + 1` is `Unavailable`;
    /// `low > high` is `InvalidRequest`.
    fn entries(
        &self,
        group: GroupId,
        low: u64,
        high: u64,
        max_bytes: Option<u64>,
    ) -> StorageResult<Vec<Entry>>;

    /// The term of the entry at `index`, for `index` in `[first_index - 1, last_index]`.
    fn term(&self, group: GroupId, index: u64) -> StorageResult<u64>;

    /// Metadata of `group`'s log: hard state, conf state, truncated index and term, last index.
    fn group_state(&self, group: GroupId) -> StorageResult<GroupLogState>;

    /// The first readable index of `group` (truncated index + 1).
    fn first_index(&self, group: GroupId) -> StorageResult<u64> {
        Ok(self.group_state(group)?.first_index())
    }

    /// The last index of `group` (the truncated index if its log is empty).
    fn last_index(&self, group: GroupId) -> StorageResult<u64> {
        Ok(self.group_state(group)?.last_index)
    }

    /// Every group that has been written to, in ascending order.
    fn groups(&self) -> StorageResult<Vec<GroupId>>;

    /// Makes every write so far durable (a no-op for a store opened with [`SyncMode::Sync`]
    /// that has nothing pending, and for the memory backend).
    fn flush(&self) -> StorageResult<()>;

    /// The mode the store was opened with.
    fn sync_mode(&self) -> SyncMode;

    /// Number of syncs issued to the disk since the store was opened. For redb this counts the
    /// `sync_data` calls that reached the file; for sled, its flushes; the memory backend never
    /// syncs.
    fn sync_count(&self) -> u64;
}
