//! The state machine's data behind one trait.

use crate::{GroupId, KeyRange, KeyValue, StorageError, StorageResult, WriteSet};

/// Ordered key-value data of the state machines of many groups, each group in its own key
/// space, each stored together with the raft index it reflects (the applied index).
///
/// # Contract
///
/// - **Atomic with the applied index.** [`StateStore::commit`] makes a group's writes and its
///   new applied index visible together, or neither: after any crash, the data of a group is
///   exactly the data of some applied index, the one [`StateStore::applied_index`] reports. An
///   entry is therefore never applied twice.
/// - **The applied index only moves forward.** `commit` with an applied index not above the
///   current one is [`crate::StorageError::InvalidRequest`] and writes nothing.
/// - **Durability point.** `commit` does not wait for the disk: that is what makes per-batch
///   applies cheap. [`StateStore::flush`] makes every earlier commit durable. A flush may run
///   on another thread while commits go on (a backend with one writer makes them wait). After a crash the
///   store may be back at any flushed-or-later applied index; the raft log must therefore
///   keep (not compact) every entry after the applied index of the last flush, so the group can
///   replay it.
/// - **Consistent snapshots.** [`StateStore::snapshot`] sees one applied index and exactly the
///   data of that index, even while later commits go on; [`StateStore::restore`] replaces a
///   group's data and applied index atomically, and writes nothing if the records fail.
/// - **Groups are isolated.** Keys of one group are never visible in another; groups may be
///   committed concurrently from different threads.
pub trait StateStore: Send + Sync + 'static {
    /// The committed value of `key` in `group`.
    fn get(&self, group: GroupId, key: &[u8]) -> StorageResult<Option<Vec<u8>>>;

    /// Up to `limit` committed pairs of `group` within `range`, in ascending key order.
    fn scan(&self, group: GroupId, range: &KeyRange, limit: usize) -> StorageResult<Vec<KeyValue>>;

    /// The raft index that `group`'s committed data reflects (0 if never committed).
    fn applied_index(&self, group: GroupId) -> StorageResult<u64>;

    /// Applies `writes` to `group` and records `applied_index`, atomically, without a sync.
    fn commit(&self, group: GroupId, writes: WriteSet, applied_index: u64) -> StorageResult<()>;

    /// Commits several groups at once: each group's writes and applied index atomically, as
    /// [`StateStore::commit`] would, in one backend transaction where the backend has them
    /// (redb, sled, memory), so an apply round over many groups pays one commit. Every commit
    /// is checked before anything is written: if one is invalid, none is applied. A group
    /// must not appear twice.
    fn commit_groups(&self, commits: Vec<GroupCommit>) -> StorageResult<()>;

    /// Commits several groups' borrowed writes as [`StateStore::commit_groups`] would, all or
    /// nothing: for a caller that keeps its writes in a structure of its own (the write-back
    /// layer's flush) and would otherwise copy every key and value into a [`WriteSet`] first.
    /// The default does that copy; a backend that can write from borrowed slices overrides it.
    fn commit_borrowed_groups(&self, commits: &[BorrowedGroupCommit<'_>]) -> StorageResult<()> {
        let mut owned = Vec::with_capacity(commits.len());
        for commit in commits {
            let mut writes = WriteSet::with_capacity(commit.writes.len());
            for &(key, value) in &commit.writes {
                match value {
                    Some(value) => writes.put(key, value)?,
                    None => writes.delete(key)?,
                }
            }
            owned.push(GroupCommit {
                group: commit.group,
                writes,
                applied_index: commit.applied_index,
            });
        }
        self.commit_groups(owned)
    }

    /// Makes every earlier commit durable.
    fn flush(&self) -> StorageResult<()>;

    /// `true` when a commit leaves a flush nothing to do: a store that keeps nothing on disk
    /// holds each commit as durably as it ever will. Its applied index then counts as durable
    /// at every commit, and the log behind it is compacted without waiting for a flush —
    /// otherwise the log would hold every entry since the last flush in memory for nothing.
    fn commits_are_durable(&self) -> bool {
        false
    }

    /// `true` once the store holds so many commits in memory that a flush should start now
    /// rather than when its interval is up. A store that holds none in memory never does.
    fn wants_flush(&self) -> bool {
        false
    }

    /// A consistent view of `group`: its applied index and all its pairs in key order.
    fn snapshot(&self, group: GroupId) -> StorageResult<StateSnapshot<'_>>;

    /// Calls `visit` with every key of `group`, in ascending order, from one consistent view
    /// (as [`StateStore::snapshot`] sees it): for a caller that needs the keys alone, which a
    /// backend can hand over without copying a value.
    fn for_each_key(&self, group: GroupId, visit: &mut dyn FnMut(&[u8])) -> StorageResult<()> {
        for record in self.snapshot(group)?.records {
            visit(&record?.0);
        }
        Ok(())
    }

    /// Replaces all of `group`'s data with `records` (strictly ascending keys) and sets its
    /// applied index, atomically. If `records` yields an error, nothing changes and the error is
    /// returned. [`StateStore::restore_groups`] of the one group.
    fn restore(
        &self,
        group: GroupId,
        applied_index: u64,
        records: &mut dyn Iterator<Item = StorageResult<KeyValue>>,
    ) -> StorageResult<()> {
        self.restore_groups(&mut [GroupRestore {
            group,
            applied_index,
            records,
        }])
    }

    /// Restores several groups as [`StateStore::restore`] does one, all or nothing together:
    /// for a node installing many snapshots at once, which a backend writes in one transaction
    /// and one sync instead of one per group. If any group's records yield an error, or a group
    /// appears twice, nothing changes and the error is returned.
    fn restore_groups(&self, restores: &mut [GroupRestore<'_>]) -> StorageResult<()>;

    /// Every group that has committed data or an applied index, ascending.
    fn groups(&self) -> StorageResult<Vec<GroupId>>;
}

/// One group's part of [`StateStore::restore_groups`].
pub struct GroupRestore<'a> {
    /// The group.
    pub group: GroupId,
    /// Its applied index once restored.
    pub applied_index: u64,
    /// All its pairs, in strictly ascending key order.
    pub records: &'a mut dyn Iterator<Item = StorageResult<KeyValue>>,
}

impl std::fmt::Debug for GroupRestore<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupRestore")
            .field("group", &self.group)
            .field("applied_index", &self.applied_index)
            .finish_non_exhaustive()
    }
}

/// One group's part of [`StateStore::commit_groups`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupCommit {
    /// The group.
    pub group: GroupId,
    /// Its writes.
    pub writes: WriteSet,
    /// Its new applied index (must advance).
    pub applied_index: u64,
}

/// One group's part of [`StateStore::commit_borrowed_groups`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BorrowedGroupCommit<'a> {
    /// The group.
    pub group: GroupId,
    /// Its writes, each key once: `Some` a put, `None` a delete. Keys and values within the
    /// limits of [`WriteSet::put`], or the commit is refused.
    pub writes: Vec<(&'a [u8], Option<&'a [u8]>)>,
    /// Its new applied index (must advance).
    pub applied_index: u64,
}

/// Checks that no group appears twice in one commit of `groups`.
pub(crate) fn check_distinct_groups(
    groups: impl ExactSizeIterator<Item = GroupId>,
) -> StorageResult<()> {
    let mut seen = std::collections::HashSet::with_capacity(groups.len());
    for group in groups {
        if !seen.insert(group) {
            return Err(StorageError::invalid(format!(
                "group {group} appears twice in one commit"
            )));
        }
    }
    Ok(())
}

/// A consistent view of one group, produced by [`StateStore::snapshot`].
pub struct StateSnapshot<'a> {
    /// The applied index the records reflect.
    pub applied_index: u64,
    /// The group's pairs in ascending key order.
    pub records: Box<dyn Iterator<Item = StorageResult<KeyValue>> + 'a>,
}

impl std::fmt::Debug for StateSnapshot<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateSnapshot")
            .field("applied_index", &self.applied_index)
            .finish_non_exhaustive()
    }
}

/// The applied index must move forward: committing an index again would apply it twice.
pub(crate) fn check_applied_advances(group: GroupId, current: u64, new: u64) -> StorageResult<()> {
    if new <= current {
        return Err(StorageError::invalid(format!(
            "group {group}: applied index must advance past {current}, got {new}"
        )));
    }
    Ok(())
}
