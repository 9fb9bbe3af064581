//! [`MemStateStore`]: state-machine data in memory.

use std::collections::BTreeMap;

use parking_lot::RwLock;

use crate::state_store::{check_applied_advances, check_distinct_groups};
use crate::{
    GroupCommit, GroupId, KeyRange, KeyValue, StateSnapshot, StateStore, StorageResult, WriteSet,
};

/// A [`StateStore`] that keeps everything in memory; `flush` does nothing.
#[derive(Debug, Default)]
pub struct MemStateStore {
    groups: RwLock<BTreeMap<GroupId, MemGroupState>>,
}

#[derive(Clone, Debug, Default)]
struct MemGroupState {
    applied_index: u64,
    data: BTreeMap<Vec<u8>, Vec<u8>>,
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
        Ok(groups.get(&group).and_then(|g| g.data.get(key).cloned()))
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
            .data
            .range::<[u8], _>(range.as_slices())
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
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
        for (key, value) in writes.into_writes() {
            match value {
                Some(value) => state.data.insert(key, value),
                None => state.data.remove(&key),
            };
        }
        state.applied_index = applied_index;
        Ok(())
    }

    fn commit_groups(&self, commits: Vec<GroupCommit>) -> StorageResult<()> {
        check_distinct_groups(&commits)?;
        let mut groups = self.groups.write();
        for commit in &commits {
            let current = groups.get(&commit.group).map_or(0, |g| g.applied_index);
            check_applied_advances(commit.group, current, commit.applied_index)?;
        }
        for commit in commits {
            let state = groups.entry(commit.group).or_default();
            for (key, value) in commit.writes.into_writes() {
                match value {
                    Some(value) => state.data.insert(key, value),
                    None => state.data.remove(&key),
                };
            }
            state.applied_index = commit.applied_index;
        }
        Ok(())
    }

    fn flush(&self) -> StorageResult<()> {
        Ok(())
    }

    fn snapshot(&self, group: GroupId) -> StorageResult<StateSnapshot<'_>> {
        // A copy is the simplest consistent view; memory stores are for tests and benchmarks.
        let state = self.groups.read().get(&group).cloned().unwrap_or_default();
        Ok(StateSnapshot {
            applied_index: state.applied_index,
            records: Box::new(state.data.into_iter().map(Ok)),
        })
    }

    fn restore(
        &self,
        group: GroupId,
        applied_index: u64,
        records: &mut dyn Iterator<Item = StorageResult<KeyValue>>,
    ) -> StorageResult<()> {
        let mut data = BTreeMap::new();
        for record in records {
            let (key, value) = record?;
            data.insert(key, value);
        }
        self.groups.write().insert(
            group,
            MemGroupState {
                applied_index,
                data,
            },
        );
        Ok(())
    }

    fn groups(&self) -> StorageResult<Vec<GroupId>> {
        Ok(self.groups.read().keys().copied().collect())
    }
}
