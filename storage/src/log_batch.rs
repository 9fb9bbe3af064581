//! A write batch for the raft logs of many groups.

use raft::prelude::{ConfState, Entry, HardState, SnapshotMetadata};

use crate::{GroupId, GroupLogState};

/// One change to one group's log. Operations of a [`LogBatch`] apply in the order they were
/// added, so a batch can append, then compact, then record the hard state.
#[derive(Clone, Debug, PartialEq)]
pub enum LogOp {
    /// Append entries with consecutive indexes. If the first index is at or below the group's
    /// last index, the stored suffix from that index on is replaced (raft's conflict rule).
    Append(Vec<Entry>),
    /// Replace the group's hard state (term, vote, commit).
    SetHardState(HardState),
    /// Replace the group's conf state (voters, learners), made by the configuration change
    /// at log index `index` (0 for a group's first configuration).
    SetConfState {
        /// Voters and learners.
        conf_state: ConfState,
        /// The index of the change that made it.
        index: u64,
    },
    /// Remove every entry with an index below `compact_index`; `compact_index - 1` becomes the
    /// truncated index whose term stays readable.
    Compact {
        /// The first index that is kept.
        compact_index: u64,
    },
    /// Drop the whole log and restart it after a snapshot: the snapshot's index and term become
    /// the truncated index and term, its conf state becomes the group's conf state.
    ApplySnapshot(SnapshotMetadata),
}

/// A set of log operations, across any number of groups, that [`crate::LogStore::write`]
/// commits atomically with at most one sync: the unit of group commit.
///
/// ```
/// use concord_storage::{LogBatch, raft::prelude::{Entry, HardState}};
///
/// let mut batch = LogBatch::new();
/// for group in 0..16 {
///     let mut entry = Entry::default();
///     entry.index = 1;
///     entry.term = 1;
///     batch.append(group, vec![entry]);
///     let mut hard_state = HardState::default();
///     hard_state.term = 1;
///     batch.set_hard_state(group, hard_state);
/// }
/// assert_eq!(batch.entry_count(), 16);
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LogBatch {
    ops: Vec<(GroupId, LogOp)>,
    entry_count: usize,
}

impl LogBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// A batch that rebuilds `group`'s log from nothing: a snapshot reset to its truncated
    /// index, its live `entries`, its conf state and hard state. How the logs that keep their
    /// live log in memory (WAL, redb) load or checkpoint a group.
    pub(crate) fn group_image(group: GroupId, state: GroupLogState, entries: Vec<Entry>) -> Self {
        let mut metadata = SnapshotMetadata::default();
        metadata.index = state.truncated_index;
        metadata.term = state.truncated_term;
        metadata.set_conf_state(state.conf_state.clone());
        let mut batch = LogBatch::new();
        batch.apply_snapshot(group, metadata);
        batch.append(group, entries);
        batch.set_conf_state(group, state.conf_state, state.conf_state_index);
        batch.set_hard_state(group, state.hard_state);
        batch
    }

    /// Adds an append of `entries` to `group`'s log. An empty `entries` adds nothing.
    pub fn append(&mut self, group: GroupId, entries: Vec<Entry>) -> &mut Self {
        if !entries.is_empty() {
            self.entry_count += entries.len();
            self.ops.push((group, LogOp::Append(entries)));
        }
        self
    }

    /// Sets `group`'s hard state.
    pub fn set_hard_state(&mut self, group: GroupId, hard_state: HardState) -> &mut Self {
        self.ops.push((group, LogOp::SetHardState(hard_state)));
        self
    }

    /// Sets `group`'s conf state, made by the configuration change at log index `index` (0
    /// for the configuration a group is created with).
    pub fn set_conf_state(
        &mut self,
        group: GroupId,
        conf_state: ConfState,
        index: u64,
    ) -> &mut Self {
        self.ops
            .push((group, LogOp::SetConfState { conf_state, index }));
        self
    }

    /// Removes `group`'s entries below `compact_index`.
    pub fn compact(&mut self, group: GroupId, compact_index: u64) -> &mut Self {
        self.ops.push((group, LogOp::Compact { compact_index }));
        self
    }

    /// Restarts `group`'s log after the snapshot described by `metadata`.
    pub fn apply_snapshot(&mut self, group: GroupId, metadata: SnapshotMetadata) -> &mut Self {
        self.ops.push((group, LogOp::ApplySnapshot(metadata)));
        self
    }

    /// `true` when the batch holds no operation.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Number of operations.
    pub fn op_count(&self) -> usize {
        self.ops.len()
    }

    /// Number of entries appended, over all groups.
    pub fn entry_count(&self) -> usize {
        self.entry_count
    }

    /// The operations in order.
    pub fn ops(&self) -> &[(GroupId, LogOp)] {
        &self.ops
    }

    /// Takes the operations out, in order, leaving the batch empty with its allocation.
    pub fn drain_ops(&mut self) -> std::vec::Drain<'_, (GroupId, LogOp)> {
        self.entry_count = 0;
        self.ops.drain(..)
    }
}
