//! raft-rs's `Storage` over Concord's [`LogStore`].

use std::sync::Arc;

use concord_engine::raft::prelude::{Entry, Snapshot};
use concord_engine::raft::{self, GetEntriesContext, RaftState, Storage};
use concord_engine::{GroupId, LogStore};

/// One group's view of the node's shared log store.
pub(crate) struct GroupStorage {
    pub(crate) group: GroupId,
    pub(crate) log: Arc<dyn LogStore>,
    /// The state store's applied index when the group started: the commit index is at least
    /// this (an applied entry was committed, even if the commit index was not persisted yet).
    pub(crate) applied_at_start: u64,
}

impl Storage for GroupStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        let state = self.log.group_state(self.group)?;
        let mut hard_state = state.hard_state;
        hard_state.commit = hard_state.commit.max(self.applied_at_start);
        Ok(RaftState::new(hard_state, state.conf_state))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let max_size = max_size.into().filter(|&max| max != raft::NO_LIMIT);
        Ok(self.log.entries(self.group, low, high, max_size)?)
    }

    fn term(&self, index: u64) -> raft::Result<u64> {
        Ok(self.log.term(self.group, index)?)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.log.first_index(self.group)?)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.log.last_index(self.group)?)
    }

    fn snapshot(&self, _request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        // Snapshots are not produced yet: a follower that fell behind a compacted log waits.
        Err(raft::Error::Store(
            raft::StorageError::SnapshotTemporarilyUnavailable,
        ))
    }
}
