//! [`RedbStateStore`]: state-machine data in one redb file.

use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use parking_lot::RwLock;
use redb::{Durability, ReadableDatabase, ReadableTable, TableDefinition};

use super::log_store::durable_empty_commit;
use super::{DEFAULT_CACHE_BYTES, RedbResultExt, open_database};
use crate::state_store::{check_applied_advances, check_distinct_groups};
use crate::write_set::check_write;
use crate::{
    BorrowedGroupCommit, GroupCommit, GroupId, GroupRestore, KeyRange, KeyValue, StateSnapshot,
    StateStore, StorageResult, WriteSet,
};

/// `(group, key) -> value`.
const DATA: TableDefinition<(u64, &[u8]), &[u8]> = TableDefinition::new("state_data");
/// `group -> applied index`.
const APPLIED: TableDefinition<u64, u64> = TableDefinition::new("state_applied");

/// The data table as a read transaction sees it.
type DataTable = redb::ReadOnlyTable<(u64, &'static [u8]), &'static [u8]>;

/// A [`StateStore`] in a redb file. Each commit is one redb write transaction with
/// `Durability::None` (no sync); [`StateStore::flush`] is one durable empty commit, which
/// persists all of them. Snapshots are redb read transactions: consistent by construction, and
/// streamed without copying the group.
pub struct RedbStateStore {
    /// The data table as of the last write, shared by every `get` and `scan`: beginning a read
    /// transaction and opening the table cost about as much as the lookup itself, and a
    /// session write reads before it writes. Every write replaces it before returning, so a
    /// reader that has seen a write's applied index reads what it wrote. `None` if opening it
    /// again failed (each read then opens its own). Declared first: dropped before `db`.
    latest: RwLock<Option<Arc<DataTable>>>,
    db: redb::Database,
    path: PathBuf,
}

impl std::fmt::Debug for RedbStateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStateStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl RedbStateStore {
    /// Opens or creates the state file at `path`, with a page cache of
    /// [`DEFAULT_STATE_CACHE_BYTES`](crate::DEFAULT_STATE_CACHE_BYTES).
    pub fn open(path: &Path) -> StorageResult<Self> {
        Self::open_with_cache(path, DEFAULT_CACHE_BYTES)
    }

    /// Opens or creates the state file at `path`, with a page cache of `cache_bytes` (redb's
    /// reads and the pages a write transaction changes share it).
    pub fn open_with_cache(path: &Path, cache_bytes: usize) -> StorageResult<Self> {
        let db = open_database(
            path,
            cache_bytes,
            Arc::new(AtomicU64::new(0)),
            "concord_state_sync_duration_seconds",
        )?;
        Self::over_database(db, path)
    }

    /// Opens or creates a state store over a redb `backend` of the caller's (a simulated disk,
    /// for the power-loss tests); `name` names it in errors.
    #[cfg(any(test, feature = "testing"))]
    pub fn open_on_backend(backend: impl redb::StorageBackend, name: &Path) -> StorageResult<Self> {
        let db = super::open_database_on(name, DEFAULT_CACHE_BYTES, backend)?;
        Self::over_database(db, name)
    }

    fn over_database(db: redb::Database, path: &Path) -> StorageResult<Self> {
        let txn = db.begin_write().at(path)?;
        txn.open_table(DATA).at(path)?;
        txn.open_table(APPLIED).at(path)?;
        txn.commit().at(path)?;
        let store = RedbStateStore {
            latest: RwLock::new(None),
            db,
            path: path.to_path_buf(),
        };
        store.renew_latest();
        Ok(store)
    }

    /// Opens the data table as it is now for the reads that follow (after every write).
    fn renew_latest(&self) {
        *self.latest.write() = self.open_data_table().ok();
    }

    /// The data table as of the last write.
    fn data_table(&self) -> StorageResult<Arc<DataTable>> {
        if let Some(table) = self.latest.read().as_ref() {
            return Ok(Arc::clone(table));
        }
        self.open_data_table()
    }

    /// The data table in a read transaction of its own.
    fn open_data_table(&self) -> StorageResult<Arc<DataTable>> {
        let path = self.path.as_path();
        let txn = self.db.begin_read().at(path)?;
        Ok(Arc::new(txn.open_table(DATA).at(path)?))
    }

    /// Writes each `(group, applied index, writes)` of `commits` in one write transaction,
    /// without a sync; an applied index that does not advance writes nothing of any group.
    fn write_groups<'w, W>(
        &self,
        commits: impl Iterator<Item = (GroupId, u64, W)>,
    ) -> StorageResult<()>
    where
        W: Iterator<Item = (&'w [u8], Option<&'w [u8]>)>,
    {
        let path = self.path.as_path();
        let mut txn = self.db.begin_write().at(path)?;
        txn.set_durability(Durability::None).at(path)?;
        {
            let mut applied = txn.open_table(APPLIED).at(path)?;
            let mut data = txn.open_table(DATA).at(path)?;
            for (group, applied_index, writes) in commits {
                // The insert hands back the index it replaced: one lookup per group, not two.
                let previous = applied
                    .insert(group, applied_index)
                    .at(path)?
                    .map_or(0, |v| v.value());
                check_applied_advances(group, previous, applied_index)?;
                for (key, value) in writes {
                    match value {
                        Some(value) => data.insert((group, key), value).at(path)?,
                        None => data.remove((group, key)).at(path)?,
                    };
                }
            }
        }
        // An error above drops the transaction uncommitted: nothing is written.
        txn.commit().at(path)?;
        self.renew_latest();
        Ok(())
    }
}

/// A bound on a `(group, key)` key of the data table.
type DataBound<'k> = Bound<(u64, &'k [u8])>;

/// The bounds of `range` within `group`'s part of the table.
fn group_bounds(group: GroupId, range: &KeyRange) -> (DataBound<'_>, DataBound<'_>) {
    let start = match &range.start {
        Bound::Included(key) => Bound::Included((group, key.as_slice())),
        Bound::Excluded(key) => Bound::Excluded((group, key.as_slice())),
        Bound::Unbounded => Bound::Included((group, &[][..])),
    };
    let end = match &range.end {
        Bound::Included(key) => Bound::Included((group, key.as_slice())),
        Bound::Excluded(key) => Bound::Excluded((group, key.as_slice())),
        Bound::Unbounded => match group.checked_add(1) {
            Some(next) => Bound::Excluded((next, &[][..])),
            None => Bound::Unbounded,
        },
    };
    (start, end)
}

impl StateStore for RedbStateStore {
    fn get(&self, group: GroupId, key: &[u8]) -> StorageResult<Option<Vec<u8>>> {
        let path = self.path.as_path();
        let table = self.data_table()?;
        Ok(table
            .get((group, key))
            .at(path)?
            .map(|v| v.value().to_vec()))
    }

    fn scan(&self, group: GroupId, range: &KeyRange, limit: usize) -> StorageResult<Vec<KeyValue>> {
        if range.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let path = self.path.as_path();
        let table = self.data_table()?;
        let mut out = Vec::new();
        for item in table
            .range(group_bounds(group, range))
            .at(path)?
            .take(limit)
        {
            let (key, value) = item.at(path)?;
            out.push((key.value().1.to_vec(), value.value().to_vec()));
        }
        Ok(out)
    }

    fn applied_index(&self, group: GroupId) -> StorageResult<u64> {
        let path = self.path.as_path();
        let txn = self.db.begin_read().at(path)?;
        let table = txn.open_table(APPLIED).at(path)?;
        Ok(table.get(group).at(path)?.map_or(0, |v| v.value()))
    }

    fn commit(&self, group: GroupId, writes: WriteSet, applied_index: u64) -> StorageResult<()> {
        self.write_groups(std::iter::once((group, applied_index, writes.iter())))
    }

    fn commit_groups(&self, commits: Vec<GroupCommit>) -> StorageResult<()> {
        check_distinct_groups(commits.iter().map(|c| c.group))?;
        self.write_groups(
            commits
                .iter()
                .map(|c| (c.group, c.applied_index, c.writes.iter())),
        )
    }

    fn commit_borrowed_groups(&self, commits: &[BorrowedGroupCommit<'_>]) -> StorageResult<()> {
        check_distinct_groups(commits.iter().map(|c| c.group))?;
        for &(key, value) in commits.iter().flat_map(|c| &c.writes) {
            check_write(key, value)?;
        }
        self.write_groups(
            commits
                .iter()
                .map(|c| (c.group, c.applied_index, c.writes.iter().copied())),
        )
    }

    fn flush(&self) -> StorageResult<()> {
        durable_empty_commit(&self.db, &self.path)
    }

    fn snapshot(&self, group: GroupId) -> StorageResult<StateSnapshot<'_>> {
        let path = self.path.as_path();
        let txn = self.db.begin_read().at(path)?;
        let applied_index = txn
            .open_table(APPLIED)
            .at(path)?
            .get(group)
            .at(path)?
            .map_or(0, |v| v.value());
        let table = txn.open_table(DATA).at(path)?;
        // The range keeps the read transaction alive: later commits do not show through.
        let range = table
            .range(group_bounds(group, &KeyRange::all()))
            .at(path)?;
        let records = range.map(move |item| {
            let (key, value) = item.at(path)?;
            Ok((key.value().1.to_vec(), value.value().to_vec()))
        });
        Ok(StateSnapshot {
            applied_index,
            records: Box::new(records),
        })
    }

    fn for_each_key(&self, group: GroupId, visit: &mut dyn FnMut(&[u8])) -> StorageResult<()> {
        let path = self.path.as_path();
        let txn = self.db.begin_read().at(path)?;
        let table = txn.open_table(DATA).at(path)?;
        for item in table
            .range(group_bounds(group, &KeyRange::all()))
            .at(path)?
        {
            let (key, _) = item.at(path)?;
            visit(key.value().1);
        }
        Ok(())
    }

    fn restore_groups(&self, restores: &mut [GroupRestore<'_>]) -> StorageResult<()> {
        check_distinct_groups(restores.iter().map(|restore| restore.group))?;
        let path = self.path.as_path();
        let mut txn = self.db.begin_write().at(path)?;
        // The log is cut at the snapshot once the restore returns: the state must survive a
        // crash from then on.
        txn.set_durability(Durability::Immediate).at(path)?;
        {
            let mut data = txn.open_table(DATA).at(path)?;
            let mut applied = txn.open_table(APPLIED).at(path)?;
            for restore in restores {
                let group = restore.group;
                data.retain_in(group_bounds(group, &KeyRange::all()), |_, _| false)
                    .at(path)?;
                for record in &mut *restore.records {
                    // An error drops the transaction uncommitted: nothing changes.
                    let (key, value) = record?;
                    data.insert((group, key.as_slice()), value.as_slice())
                        .at(path)?;
                }
                applied.insert(group, restore.applied_index).at(path)?;
            }
        }
        txn.commit().at(path)?;
        self.renew_latest();
        Ok(())
    }

    fn groups(&self) -> StorageResult<Vec<GroupId>> {
        let path = self.path.as_path();
        let txn = self.db.begin_read().at(path)?;
        let table = txn.open_table(APPLIED).at(path)?;
        let mut out = Vec::new();
        for item in table.iter().at(path)? {
            out.push(item.at(path)?.0.value());
        }
        Ok(out)
    }
}

impl Drop for RedbStateStore {
    fn drop(&mut self) {
        // A clean close makes every commit durable; there is no one left to report to.
        let _ = self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::RedbStateStore;

    /// The redb store hands over its keys itself, without the snapshot's copies.
    #[test]
    fn keys_are_visited_in_order_per_group() {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStateStore::open(&dir.path().join("state.redb")).unwrap();
        crate::testing::assert_keys_visited_in_order(&store);
    }

    /// The redb store writes borrowed commits itself (the write-back flush's path), not
    /// through the trait's copy into owned ones.
    #[test]
    fn borrowed_commits_are_all_or_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStateStore::open(&dir.path().join("state.redb")).unwrap();
        crate::testing::assert_borrowed_commits_are_all_or_nothing(&store);
    }
}
