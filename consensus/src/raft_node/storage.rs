//! raft-rs's `Storage` over Concord's [`LogStore`].
//!
//! raft-rs asks its storage for the last index and for terms of recent entries many times per
//! round; on a disk backend each answer would be a read transaction. The worker is the only
//! writer of its groups' logs, so it tells the adapter what it persisted and the adapter
//! answers those questions from memory.

use std::collections::VecDeque;
use std::sync::Arc;

use concord_storage::raft::prelude::{Entry, Snapshot};
use concord_storage::raft::{self, GetEntriesContext, RaftState, Storage};
use concord_storage::{GroupId, LogStore};

/// Terms of persisted entries kept in memory, per group.
const RECENT_TERMS: usize = 4096;

/// One group's view of the node's shared log store.
pub(crate) struct GroupStorage {
    group: GroupId,
    log: Arc<dyn LogStore>,
    /// The state store's applied index when the group started: the commit index is at least
    /// this (an applied entry was committed, even if the commit index was not persisted yet).
    applied_at_start: u64,
    /// `(index, term)` of the most recently persisted entries, contiguous, oldest first.
    recent_terms: VecDeque<(u64, u64)>,
    pub(crate) first_index: u64,
    last_index: u64,
}

impl GroupStorage {
    pub(crate) fn new(
        group: GroupId,
        log: Arc<dyn LogStore>,
        applied_at_start: u64,
    ) -> concord_storage::StorageResult<Self> {
        let state = log.group_state(group)?;
        Ok(GroupStorage {
            group,
            log,
            applied_at_start,
            recent_terms: VecDeque::new(),
            first_index: state.first_index(),
            last_index: state.last_index,
        })
    }

    /// Records entries the worker just persisted (consecutive; a suffix from their first
    /// index on was replaced, as the log store does).
    pub(crate) fn persisted(&mut self, entries: &[(u64, u64)]) {
        let Some(&(first, _)) = entries.first() else {
            return;
        };
        while self
            .recent_terms
            .back()
            .is_some_and(|&(index, _)| index >= first)
        {
            self.recent_terms.pop_back();
        }
        if self
            .recent_terms
            .back()
            .is_some_and(|&(index, _)| index + 1 != first)
        {
            self.recent_terms.clear(); // Not contiguous: start over.
        }
        self.recent_terms.extend(entries.iter().copied());
        while self.recent_terms.len() > RECENT_TERMS {
            self.recent_terms.pop_front();
        }
        self.last_index = entries.last().map_or(self.last_index, |&(index, _)| index);
    }

    /// Records that the entries below `compact_index` were removed from the log store.
    pub(crate) fn compacted(&mut self, compact_index: u64) {
        self.first_index = self.first_index.max(compact_index);
        // Terms stay answerable from `first_index - 1` on, as the store answers them.
        while self
            .recent_terms
            .front()
            .is_some_and(|&(index, _)| index + 1 < self.first_index)
        {
            self.recent_terms.pop_front();
        }
    }

    fn cached_term(&self, index: u64) -> Option<u64> {
        let &(front, _) = self.recent_terms.front()?;
        let offset = index.checked_sub(front)? as usize;
        self.recent_terms.get(offset).map(|&(_, term)| term)
    }
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
        if index <= self.last_index
            && let Some(term) = self.cached_term(index)
        {
            return Ok(term);
        }
        Ok(self.log.term(self.group, index)?)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.first_index)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last_index)
    }

    fn snapshot(&self, _request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        // Snapshots are not produced yet: a follower that fell behind a compacted log waits.
        Err(raft::Error::Store(
            raft::StorageError::SnapshotTemporarilyUnavailable,
        ))
    }
}
