//! [`SledStateStore`]: state-machine data in a sled database.

use std::ops::Bound;
use std::path::{Path, PathBuf};

use parking_lot::RwLock;

use super::keys::{TAG_META, data_prefix, meta_key, split_group, state_key};
use super::{SledDatabase, SledResultExt, open_database};
use crate::codec::{decode_applied_index, encode_applied_index};
use crate::key_range::prefix_successor;
use crate::state_store::{check_applied_advances, check_distinct_groups};
use crate::{
    GroupCommit, GroupId, GroupRestore, KeyRange, KeyValue, StateSnapshot, StateStore,
    StorageError, StorageResult, WriteSet,
};

/// A [`StateStore`] in a sled database. A commit is one atomic `apply_batch` holding the writes
/// and the applied index; [`StateStore::flush`] is sled's `flush`. sled has no read snapshots,
/// so [`StateStore::snapshot`] copies the group while commits wait. See the module docs for
/// sled's power-loss caveat.
#[derive(Debug)]
pub struct SledStateStore {
    db: SledDatabase,
    path: PathBuf,
    /// Commits hold this shared (they may run concurrently for different groups); a snapshot
    /// holds it exclusively while it copies, so it sees exactly one applied index.
    snapshot_guard: RwLock<()>,
}

impl SledStateStore {
    /// Opens or creates the state database at `path` (a directory).
    pub fn open(path: &Path) -> StorageResult<Self> {
        Ok(SledStateStore {
            db: open_database(path)?,
            path: path.to_path_buf(),
            snapshot_guard: RwLock::new(()),
        })
    }

    fn corrupted(&self, detail: String) -> StorageError {
        StorageError::corrupted(&self.path, detail)
    }

    fn read_applied(&self, group: GroupId) -> StorageResult<u64> {
        match self.db.get(meta_key(group)).at(&self.path)? {
            None => Ok(0),
            Some(value) => decode_applied_index(&value)
                .map_err(|d| self.corrupted(format!("group {group} applied index: {d}"))),
        }
    }

    /// The sled key range of `range` within `group`.
    fn group_range(&self, group: GroupId, range: &KeyRange) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
        let start = match &range.start {
            Bound::Included(key) => Bound::Included(state_key(group, key)),
            Bound::Excluded(key) => Bound::Excluded(state_key(group, key)),
            Bound::Unbounded => Bound::Included(data_prefix(group).to_vec()),
        };
        let end = match &range.end {
            Bound::Included(key) => Bound::Included(state_key(group, key)),
            Bound::Excluded(key) => Bound::Excluded(state_key(group, key)),
            Bound::Unbounded => match prefix_successor(&data_prefix(group)) {
                Some(next) => Bound::Excluded(next),
                None => Bound::Unbounded,
            },
        };
        (start, end)
    }

    fn scan_raw(
        &self,
        group: GroupId,
        range: &KeyRange,
        limit: usize,
    ) -> StorageResult<Vec<KeyValue>> {
        let mut out = Vec::new();
        for item in self.db.range(self.group_range(group, range)).take(limit) {
            let (key, value) = item.at(&self.path)?;
            out.push((key[9..].to_vec(), value.to_vec()));
        }
        Ok(out)
    }
}

impl StateStore for SledStateStore {
    fn get(&self, group: GroupId, key: &[u8]) -> StorageResult<Option<Vec<u8>>> {
        let value = self.db.get(state_key(group, key)).at(&self.path)?;
        Ok(value.map(|v| v.to_vec()))
    }

    fn scan(&self, group: GroupId, range: &KeyRange, limit: usize) -> StorageResult<Vec<KeyValue>> {
        if range.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        self.scan_raw(group, range, limit)
    }

    fn applied_index(&self, group: GroupId) -> StorageResult<u64> {
        self.read_applied(group)
    }

    fn commit(&self, group: GroupId, writes: WriteSet, applied_index: u64) -> StorageResult<()> {
        let _shared = self.snapshot_guard.read();
        check_applied_advances(group, self.read_applied(group)?, applied_index)?;
        let mut batch = sled::Batch::default();
        for (key, value) in writes.into_writes() {
            match value {
                Some(value) => batch.insert(state_key(group, &key), value),
                None => batch.remove(state_key(group, &key)),
            }
        }
        batch.insert(&meta_key(group), encode_applied_index(applied_index));
        self.db.apply_batch(batch).at(&self.path)
    }

    fn commit_groups(&self, commits: Vec<GroupCommit>) -> StorageResult<()> {
        check_distinct_groups(commits.iter().map(|c| c.group))?;
        let _shared = self.snapshot_guard.read();
        for commit in &commits {
            let current = self.read_applied(commit.group)?;
            check_applied_advances(commit.group, current, commit.applied_index)?;
        }
        let mut batch = sled::Batch::default();
        for commit in commits {
            for (key, value) in commit.writes.into_writes() {
                match value {
                    Some(value) => batch.insert(state_key(commit.group, &key), value),
                    None => batch.remove(state_key(commit.group, &key)),
                }
            }
            batch.insert(
                &meta_key(commit.group),
                encode_applied_index(commit.applied_index),
            );
        }
        self.db.apply_batch(batch).at(&self.path)
    }

    fn flush(&self) -> StorageResult<()> {
        self.db.flush().at(&self.path)?;
        Ok(())
    }

    fn snapshot(&self, group: GroupId) -> StorageResult<StateSnapshot<'_>> {
        let _exclusive = self.snapshot_guard.write();
        let applied_index = self.read_applied(group)?;
        let records = self.scan_raw(group, &KeyRange::all(), usize::MAX)?;
        Ok(StateSnapshot {
            applied_index,
            records: Box::new(records.into_iter().map(Ok)),
        })
    }

    fn restore_groups(&self, restores: &mut [GroupRestore<'_>]) -> StorageResult<()> {
        check_distinct_groups(restores.iter().map(|restore| restore.group))?;
        let _exclusive = self.snapshot_guard.write();
        let mut batch = sled::Batch::default();
        for restore in restores {
            let group = restore.group;
            for item in self.db.scan_prefix(data_prefix(group)) {
                let (key, _) = item.at(&self.path)?;
                batch.remove(key);
            }
            for record in &mut *restore.records {
                // An error returns before apply_batch: nothing changes.
                let (key, value) = record?;
                batch.insert(state_key(group, &key), value);
            }
            batch.insert(
                &meta_key(group),
                encode_applied_index(restore.applied_index),
            );
        }
        self.db.apply_batch(batch).at(&self.path)?;
        // The log is cut at the snapshot once the restore returns: the state must survive.
        self.db.flush().at(&self.path)?;
        Ok(())
    }

    fn groups(&self) -> StorageResult<Vec<GroupId>> {
        let mut out = Vec::new();
        for item in self.db.scan_prefix([TAG_META]) {
            let (key, _) = item.at(&self.path)?;
            if let Some((group, _)) = split_group(&key) {
                out.push(group);
            }
        }
        Ok(out)
    }
}
