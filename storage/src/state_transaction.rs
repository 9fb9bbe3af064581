//! Read-your-writes transactions over a [`StateStore`].

use crate::{GroupId, KeyRange, KeyValue, StateStore, StorageResult, WriteSet};

/// A transaction on one group: writes are staged in memory and reads see them, then
/// [`StateTransaction::commit`] hands them to the store together with the applied index.
///
/// Staging in memory keeps the store's write lock (redb allows one writer) held only for the
/// commit itself, not while a state machine runs. Dropping the transaction discards it.
///
/// ```
/// use concord_storage::{MemStateStore, StateStore, StateTransaction};
///
/// let store = MemStateStore::new();
/// let mut txn = StateTransaction::new(&store, 7);
/// txn.put(b"greeting", b"hello")?;
/// assert_eq!(txn.get(b"greeting")?.as_deref(), Some(&b"hello"[..]));
/// txn.commit(1)?;
/// assert_eq!(store.applied_index(7)?, 1);
/// # Ok::<(), concord_storage::StorageError>(())
/// ```
pub struct StateTransaction<'s> {
    store: &'s dyn StateStore,
    group: GroupId,
    writes: WriteSet,
}

impl<'s> StateTransaction<'s> {
    /// Starts a transaction on `group`.
    pub fn new(store: &'s dyn StateStore, group: GroupId) -> Self {
        StateTransaction {
            store,
            group,
            writes: WriteSet::new(),
        }
    }

    /// Starts a transaction on `group` expecting about `writes` distinct keys written (a hint:
    /// more are staged all the same).
    ///
    /// ```
    /// use concord_storage::{MemStateStore, StateTransaction};
    ///
    /// let store = MemStateStore::new();
    /// let mut txn = StateTransaction::with_capacity(&store, 7, 2);
    /// txn.put(b"a", b"1")?;
    /// txn.put(b"b", b"2")?;
    /// txn.put(b"c", b"3")?;
    /// txn.commit(1)?;
    /// # Ok::<(), concord_storage::StorageError>(())
    /// ```
    pub fn with_capacity(store: &'s dyn StateStore, group: GroupId, writes: usize) -> Self {
        StateTransaction {
            store,
            group,
            writes: WriteSet::with_capacity(writes),
        }
    }

    /// The group this transaction writes.
    pub fn group(&self) -> GroupId {
        self.group
    }

    /// The value of `key` as this transaction sees it.
    pub fn get(&self, key: &[u8]) -> StorageResult<Option<Vec<u8>>> {
        match self.writes.get(key) {
            Some(staged) => Ok(staged.map(<[u8]>::to_vec)),
            None => self.store.get(self.group, key),
        }
    }

    /// Stages `key = value`.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> StorageResult<()> {
        self.writes.put(key, value)
    }

    /// Stages the removal of `key`.
    pub fn delete(&mut self, key: &[u8]) -> StorageResult<()> {
        self.writes.delete(key)
    }

    /// Up to `limit` pairs of `range` as this transaction sees them, in key order.
    pub fn scan(&self, range: &KeyRange, limit: usize) -> StorageResult<Vec<KeyValue>> {
        self.writes.scan_over(range, limit, |base_limit| {
            self.store.scan(self.group, range, base_limit)
        })
    }

    /// Stages every write of `writes` on top of this transaction's (`writes` wins) and leaves
    /// `writes` empty. State machines use it to apply a command's writes only once the command
    /// has succeeded.
    pub fn merge(&mut self, writes: &mut WriteSet) {
        self.writes.merge(writes);
    }

    /// The staged writes.
    pub fn writes(&self) -> &WriteSet {
        &self.writes
    }

    /// The staged writes, for committing several groups together with
    /// [`StateStore::commit_groups`].
    pub fn into_writes(self) -> WriteSet {
        self.writes
    }

    /// Commits the staged writes with `applied_index` (see [`StateStore::commit`]).
    pub fn commit(self, applied_index: u64) -> StorageResult<()> {
        self.store.commit(self.group, self.writes, applied_index)
    }
}
