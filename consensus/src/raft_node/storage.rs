//! raft-rs's `Storage` over Concord's [`LogStore`].
//!
//! raft-rs asks its storage for the last index and for terms of recent entries many times per
//! round; on a disk backend each answer would be a read transaction. The worker is the only
//! writer of its groups' logs, so it tells the adapter what it persisted and the adapter
//! answers those questions from memory.
//!
//! A read of the log that fails (a disk error, not a compacted or missing index) is never
//! handed to raft-rs as an error, which it takes for a broken invariant and panics on: the
//! failure is recorded in the node's [`LogReadFailure`], raft-rs is told the entries are not
//! there for now, and the worker stops every group before anything raft-rs built on that
//! answer leaves the round (`node_loop/worker.rs`).

use std::collections::VecDeque;
use std::sync::Arc;

use concord_storage::raft::prelude::{ConfState, Entry, Snapshot};
use concord_storage::raft::{self, GetEntriesContext, RaftState, Storage};
use concord_storage::{GroupId, LogStore, StorageError};

use super::term_runs::TermRuns;
use super::written_entries::WrittenEntries;
use crate::NodeId;
use crate::node_loop::LogReadFailure;

/// One group's view of the node's shared log store.
pub(crate) struct GroupStorage {
    group: GroupId,
    /// This node: a snapshot's ticket names it as the node to fetch the state from.
    node: NodeId,
    log: Arc<dyn LogStore>,
    /// The highest index the state has applied, as the worker last said: a snapshot is taken
    /// at it (the state sent is at least that far).
    applied: u64,
    /// `(index, conf state)` of the configurations from the newest one at or below `applied`
    /// on, oldest first: a snapshot at `applied` carries the configuration of that index
    /// (raft applies a change when it commits, the state later).
    confs: VecDeque<(u64, ConfState)>,
    /// The state store's applied index when the group started: the commit index is at least
    /// this (an applied entry was committed, even if the commit index was not persisted yet).
    applied_at_start: u64,
    /// Terms of the persisted entries, from the first ones persisted since start (or the last
    /// compaction) on.
    terms: TermRuns,
    pub(crate) first_index: u64,
    last_index: u64,
    /// The entries of the write in flight, answering raft's read of them after it.
    written: WrittenEntries,
    /// Where a failed read of the log is recorded.
    read_failure: LogReadFailure,
}

impl GroupStorage {
    pub(crate) fn new(
        group: GroupId,
        node: NodeId,
        log: Arc<dyn LogStore>,
        applied_at_start: u64,
        read_failure: LogReadFailure,
    ) -> concord_storage::StorageResult<Self> {
        let state = log.group_state(group)?;
        Ok(GroupStorage {
            group,
            node,
            log,
            applied: applied_at_start,
            confs: VecDeque::from([(state.conf_state_index, state.conf_state.clone())]),
            applied_at_start,
            terms: TermRuns::default(),
            first_index: state.first_index(),
            last_index: state.last_index,
            written: WrittenEntries::default(),
            read_failure,
        })
    }

    /// `error`, from a read of the log, as raft-rs should see it. A compacted or missing
    /// index is an answer raft-rs expects; any other failure is recorded, and raft-rs gets
    /// `failed_read` in its place, an answer it goes on from without a panic.
    fn answer_for_raft<T>(
        &self,
        error: StorageError,
        failed_read: raft::Result<T>,
    ) -> raft::Result<T> {
        match error {
            StorageError::Compacted { .. } | StorageError::Unavailable { .. } => Err(error.into()),
            failure => {
                let _ = self.read_failure.set(failure);
                failed_read
            }
        }
    }

    /// The state applied through `applied`.
    pub(crate) fn set_applied(&mut self, applied: u64) {
        self.applied = applied;
        while self
            .confs
            .get(1)
            .is_some_and(|&(index, _)| index <= applied)
        {
            self.confs.pop_front();
        }
    }

    /// Raft applied the configuration change at `index`, which made `conf_state`.
    pub(crate) fn conf_changed(&mut self, index: u64, conf_state: ConfState) {
        self.confs.push_back((index, conf_state));
        self.set_applied(self.applied);
    }

    /// The configuration in effect at `index`, if it is still known.
    fn conf_at(&self, index: u64) -> Option<&ConfState> {
        self.confs
            .iter()
            .rev()
            .find(|&&(at, _)| at <= index)
            .map(|(_, conf)| conf)
    }

    /// The round writes `entries` to the log store: clones are kept to answer raft's read of
    /// them once they are persisted (see [`WrittenEntries`]).
    pub(crate) fn writing(&mut self, entries: &[Entry]) {
        self.written.writing(entries);
    }

    /// Raft has read back what it needed of the round's entries.
    pub(crate) fn forget_written(&mut self) {
        self.written.forget();
    }

    /// The group falls asleep: the buffer the rounds' entries were kept in goes too.
    pub(crate) fn release_written(&mut self) {
        self.written.release();
    }

    /// Records the entries the worker just persisted, by their terms (consecutive; a suffix
    /// from their first index on was replaced, as the log store does).
    pub(crate) fn persisted(&mut self, entries: &TermRuns) {
        self.written.written();
        self.terms.extend(entries);
        if let Some(last) = entries.last_index() {
            self.last_index = last;
        }
    }

    /// Records that the entries below `compact_index` were removed from the log store.
    pub(crate) fn compacted(&mut self, compact_index: u64) {
        self.first_index = self.first_index.max(compact_index);
        // Terms stay answerable from `first_index - 1` on, as the store answers them.
        self.terms.forget_below(self.first_index.saturating_sub(1));
    }

    /// Records a snapshot at `index` with `term` and configuration `conf_state` written to the
    /// log: the log restarts after it, followed by `entries` written with it.
    pub(crate) fn restored(
        &mut self,
        index: u64,
        term: u64,
        conf_state: ConfState,
        entries: &TermRuns,
    ) {
        self.confs.clear();
        self.confs.push_back((index, conf_state));
        self.first_index = index + 1;
        self.last_index = index;
        self.terms = TermRuns::default();
        self.terms.push(index, term);
        self.persisted(entries);
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
        context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let max_size = max_size.into().filter(|&max| max != raft::NO_LIMIT);
        if max_size.is_none()
            && let Some(entries) = self.written.slice(low, high)
        {
            return Ok(entries);
        }
        match self.log.entries(self.group, low, high, max_size) {
            Ok(entries) => Ok(entries),
            // Where it could fetch later (sending an append), raft-rs skips the follower this
            // time; anywhere else it takes a short read, none of the entries, and hands out or
            // counts nothing.
            Err(error) => {
                let failed_read = if context.can_async() {
                    Err(raft::Error::Store(
                        raft::StorageError::LogTemporarilyUnavailable,
                    ))
                } else {
                    Ok(Vec::new())
                };
                self.answer_for_raft(error, failed_read)
            }
        }
    }

    fn term(&self, index: u64) -> raft::Result<u64> {
        if index <= self.last_index
            && let Some(term) = self.terms.term(index)
        {
            return Ok(term);
        }
        // An unavailable term is an answer raft-rs goes on from on most of its paths.
        self.log.term(self.group, index).or_else(|error| {
            let failed_read = Err(raft::Error::Store(raft::StorageError::Unavailable));
            self.answer_for_raft(error, failed_read)
        })
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.first_index)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last_index)
    }

    /// A snapshot for a follower that needs entries this log no longer holds (or that joined
    /// without any): its metadata is the state's applied index (whose term the log still
    /// knows: it compacts no further) and the configuration in effect there, which must name
    /// the follower; its data is a ticket naming this node, which the follower fetches the
    /// state from, over a stream of its own (`Transport::fetch_snapshot`), so that the state
    /// never travels inside a raft message.
    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        let unavailable = || raft::Error::Store(raft::StorageError::SnapshotTemporarilyUnavailable);
        if self.applied == 0 || request_index > self.applied {
            return Err(unavailable());
        }
        let term = self.term(self.applied).map_err(|_| unavailable())?;
        let conf_state = self.conf_at(self.applied).ok_or_else(unavailable)?;
        let named = |ids: &[u64]| ids.contains(&to);
        if !(named(&conf_state.voters)
            || named(&conf_state.learners)
            || named(&conf_state.voters_outgoing))
        {
            // The change that adds `to` has committed but the state has not applied it yet.
            return Err(unavailable());
        }
        let mut snapshot = Snapshot::default();
        snapshot.data = SnapshotTicket { source: self.node }.encode().into();
        let metadata = snapshot.mut_metadata();
        metadata.index = self.applied;
        metadata.term = term;
        metadata.set_conf_state(conf_state.clone());
        Ok(snapshot)
    }
}

/// The data of a raft snapshot message: where the follower fetches the state from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SnapshotTicket {
    /// The node that made the snapshot.
    pub(crate) source: NodeId,
}

impl SnapshotTicket {
    const MAGIC: &'static [u8; 8] = b"CNCDTCKT";

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Self::MAGIC.to_vec();
        out.extend_from_slice(&self.source.to_le_bytes());
        out
    }

    /// The ticket in a snapshot's data, or `None` if the data is not one.
    pub(crate) fn decode(data: &[u8]) -> Option<SnapshotTicket> {
        let rest = data.strip_prefix(Self::MAGIC.as_slice())?;
        let source = u64::from_le_bytes(rest.try_into().ok()?);
        Some(SnapshotTicket { source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_tickets_are_refused_never_a_panic() {
        let valid = vec![SnapshotTicket { source: 3 }.encode()];
        for input in concord_storage::testing::hostile_inputs(&valid, 9, 2_000) {
            let _ = SnapshotTicket::decode(&input);
        }
    }
}
