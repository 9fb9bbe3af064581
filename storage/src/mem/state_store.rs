//! [`MemStateStore`]: state-machine data in memory.

use std::collections::{BTreeSet, HashMap};

use parking_lot::RwLock;

use super::group_values::GroupValues;
use crate::state_store::{check_applied_advances, check_distinct_groups};
use crate::{
    GroupCommit, GroupId, GroupRestore, KeyRange, KeyValue, StateSnapshot, StateStore,
    StorageResult, WriteSet,
};

/// A [`StateStore`] that keeps everything in memory; `flush` does nothing.
#[derive(Debug, Default)]
pub struct MemStateStore {
    /// A hash map: every read and commit looks its group up, and a node may hold thousands.
    groups: RwLock<HashMap<GroupId, MemGroupState, foldhash::fast::RandomState>>,
}

/// One group's data: values in a hash map for point reads and overwrites (split into shards
/// once large: `group_values.rs`), keys also in an ordered set for scans. An overwrite (the
/// common write of a session service) touches only the hash map; a tree of byte-string keys
/// costs a comparison per level on every lookup.
#[derive(Clone, Debug, Default)]
struct MemGroupState {
    applied_index: u64,
    values: GroupValues,
    order: BTreeSet<Vec<u8>>,
}

impl MemGroupState {
    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        if let Some(new_key) = self.values.insert(key, value) {
            self.order.insert(new_key);
        }
    }

    fn delete(&mut self, key: &[u8]) {
        if self.values.remove(key) {
            self.order.remove(key);
        }
    }

    fn apply(&mut self, writes: WriteSet) {
        for (key, value) in writes.into_writes_unordered() {
            match value {
                Some(value) => self.put(key, value),
                None => self.delete(&key),
            }
        }
    }

    /// Every pair in key order.
    fn into_sorted(mut self) -> impl Iterator<Item = KeyValue> {
        std::mem::take(&mut self.order).into_iter().map(move |key| {
            let value = self.values.take(&key).unwrap_or_default();
            (key, value)
        })
    }
}

impl MemStateStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

impl StateStore for MemStateStore {
    fn get(&self, group: GroupId, key: &[u8]) -> StorageResult<Option<Vec<u8>>> {
        let groups = self.groups.read();
        Ok(groups.get(&group).and_then(|g| g.values.get(key).cloned()))
    }

    fn scan(&self, group: GroupId, range: &KeyRange, limit: usize) -> StorageResult<Vec<KeyValue>> {
        if range.is_empty() {
            return Ok(Vec::new());
        }
        let groups = self.groups.read();
        let Some(state) = groups.get(&group) else {
            return Ok(Vec::new());
        };
        Ok(state
            .order
            .range::<[u8], _>(range.as_slices())
            .take(limit)
            .map(|key| {
                let value = state.values.get(key).cloned().unwrap_or_default();
                (key.clone(), value)
            })
            .collect())
    }

    fn applied_index(&self, group: GroupId) -> StorageResult<u64> {
        Ok(self
            .groups
            .read()
            .get(&group)
            .map_or(0, |g| g.applied_index))
    }

    fn commit(&self, group: GroupId, writes: WriteSet, applied_index: u64) -> StorageResult<()> {
        let mut groups = self.groups.write();
        let state = groups.entry(group).or_default();
        check_applied_advances(group, state.applied_index, applied_index)?;
        state.apply(writes);
        state.applied_index = applied_index;
        Ok(())
    }

    fn commit_groups(&self, commits: Vec<GroupCommit>) -> StorageResult<()> {
        check_distinct_groups(commits.iter().map(|c| c.group))?;
        let mut groups = self.groups.write();
        for commit in &commits {
            let current = groups.get(&commit.group).map_or(0, |g| g.applied_index);
            check_applied_advances(commit.group, current, commit.applied_index)?;
        }
        for commit in commits {
            let state = groups.entry(commit.group).or_default();
            state.apply(commit.writes);
            state.applied_index = commit.applied_index;
        }
        Ok(())
    }

    fn flush(&self) -> StorageResult<()> {
        Ok(())
    }

    fn commits_are_durable(&self) -> bool {
        true
    }

    fn snapshot(&self, group: GroupId) -> StorageResult<StateSnapshot<'_>> {
        // A copy is the simplest consistent view; memory stores are for tests and benchmarks.
        let state = self.groups.read().get(&group).cloned().unwrap_or_default();
        Ok(StateSnapshot {
            applied_index: state.applied_index,
            records: Box::new(state.into_sorted().map(Ok)),
        })
    }

    fn restore_groups(&self, restores: &mut [GroupRestore<'_>]) -> StorageResult<()> {
        check_distinct_groups(restores.iter().map(|restore| restore.group))?;
        // Every group's new state is built before any is put in place: an error changes nothing.
        let mut restored = Vec::with_capacity(restores.len());
        for restore in restores {
            let mut state = MemGroupState {
                applied_index: restore.applied_index,
                ..MemGroupState::default()
            };
            for record in &mut *restore.records {
                let (key, value) = record?;
                state.put(key, value);
            }
            restored.push((restore.group, state));
        }
        self.groups.write().extend(restored);
        Ok(())
    }

    fn groups(&self) -> StorageResult<Vec<GroupId>> {
        let mut groups: Vec<GroupId> = self.groups.read().keys().copied().collect();
        groups.sort_unstable();
        Ok(groups)
    }
}
