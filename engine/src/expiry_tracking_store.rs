//! The state store of a node whose main groups run the session logic: the store beneath,
//! with every commit of a main group also told to the node's [`ExpiryIndex`] and every
//! restore making the group's index start again.
//!
//! The index is told before the commit is made: if the commit then fails, apply stops the
//! groups, and an entry the index holds for a write that never landed only costs a refused
//! removal (see `expiry_index.rs`).

use std::sync::Arc;

use concord_storage::{
    GroupCommit, GroupId, GroupRestore, KeyRange, KeyValue, StateSnapshot, StateStore,
    StorageResult, WriteSet,
};

use crate::expiry_index::{ExpiryIndex, SessionWrite};

pub(crate) struct ExpiryTrackingStore {
    inner: Arc<dyn StateStore>,
    index: Arc<ExpiryIndex>,
}

impl ExpiryTrackingStore {
    pub(crate) fn new(inner: Arc<dyn StateStore>, index: Arc<ExpiryIndex>) -> Self {
        ExpiryTrackingStore { inner, index }
    }

    fn record(&self, group: GroupId, writes: &WriteSet) {
        if self.index.covers(group) {
            self.index.record(
                group,
                writes
                    .iter_unordered()
                    .filter_map(|(key, value)| SessionWrite::of(key, value)),
            );
        }
    }
}

impl StateStore for ExpiryTrackingStore {
    fn get(&self, group: GroupId, key: &[u8]) -> StorageResult<Option<Vec<u8>>> {
        self.inner.get(group, key)
    }

    fn scan(&self, group: GroupId, range: &KeyRange, limit: usize) -> StorageResult<Vec<KeyValue>> {
        self.inner.scan(group, range, limit)
    }

    fn applied_index(&self, group: GroupId) -> StorageResult<u64> {
        self.inner.applied_index(group)
    }

    fn commit(&self, group: GroupId, writes: WriteSet, applied_index: u64) -> StorageResult<()> {
        self.record(group, &writes);
        self.inner.commit(group, writes, applied_index)
    }

    fn commit_groups(&self, commits: Vec<GroupCommit>) -> StorageResult<()> {
        for commit in &commits {
            self.record(commit.group, &commit.writes);
        }
        self.inner.commit_groups(commits)
    }

    fn flush(&self) -> StorageResult<()> {
        self.inner.flush()
    }

    fn wants_flush(&self) -> bool {
        self.inner.wants_flush()
    }

    fn commits_are_durable(&self) -> bool {
        self.inner.commits_are_durable()
    }

    fn snapshot(&self, group: GroupId) -> StorageResult<StateSnapshot<'_>> {
        self.inner.snapshot(group)
    }

    fn for_each_key(&self, group: GroupId, visit: &mut dyn FnMut(&[u8])) -> StorageResult<()> {
        self.inner.for_each_key(group, visit)
    }

    fn restore_groups(&self, restores: &mut [GroupRestore<'_>]) -> StorageResult<()> {
        let restored = self.inner.restore_groups(restores);
        for restore in restores.iter() {
            // The group's entries describe data that is gone (or, if the restore failed, may
            // be): walked again. Nothing commits to the group meanwhile: its replica holds
            // back the group's entries until the install is done.
            if self.index.covers(restore.group) {
                self.index.replaced(restore.group);
            }
        }
        restored
    }

    fn groups(&self) -> StorageResult<Vec<GroupId>> {
        self.inner.groups()
    }
}

#[cfg(test)]
mod tests {
    use concord_session::{Session, SessionFields};
    use concord_storage::MemStateStore;

    use super::*;

    fn record(client_id: &str, connection_id: u64) -> Vec<u8> {
        Session {
            client_id: client_id.into(),
            fields: SessionFields {
                session_expiry_interval_secs: 60,
                connection_id,
                ..SessionFields::default()
            },
            created_at_ms: 0,
            updated_at_ms: 1_000,
            version: 1,
        }
        .encode()
    }

    #[test]
    fn commits_of_main_groups_reach_the_index_and_a_restore_resets_it() {
        let index = Arc::new(ExpiryIndex::new(0..1));
        let store = ExpiryTrackingStore::new(Arc::new(MemStateStore::new()), index.clone());
        index.walked_page(0, None, None);
        index.walked_page(1, None, None);
        let mut writes = WriteSet::new();
        writes.put(b"s/gone", &record("gone", 0)).unwrap();
        writes.put(b"s/held", &record("held", 4)).unwrap();
        store
            .commit_groups(vec![GroupCommit {
                group: 0,
                writes: writes.clone(),
                applied_index: 1,
            }])
            .unwrap();
        // Group 1 is not a main group: its writes are not sessions.
        store.commit(1, writes, 1).unwrap();
        let due = index.due(0, 61_000, 10).unwrap();
        assert_eq!(due.len(), 1);
        assert_eq!(&*due[0].client_id, "gone");
        assert_eq!(index.due(1, 61_000, 10), Some(Vec::new()));
        store.restore(0, 5, &mut std::iter::empty()).unwrap();
        assert_eq!(
            index.due(0, 61_000, 10),
            None,
            "walked again after a restore"
        );
        assert_eq!(store.get(0, b"s/gone").unwrap(), None);
        index.walked_page(0, None, None);
        assert_eq!(index.due(0, 61_000, 10), Some(Vec::new()));
        store
            .restore_groups(&mut [GroupRestore {
                group: 0,
                applied_index: 9,
                records: &mut std::iter::empty(),
            }])
            .unwrap();
        assert_eq!(
            index.due(0, 61_000, 10),
            None,
            "walked again after a restore of several groups"
        );
    }
}
