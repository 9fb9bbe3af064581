//! Turns a [`LogBatch`] into the physical changes every backend performs.
//!
//! The rules of a raft log (no holes, a conflicting suffix is replaced, compaction keeps the
//! term of the truncated index) live here once, so the three backends only have to delete
//! ranges, put entries and store metadata. A batch is checked completely before anything is
//! written: an invalid batch changes nothing.

use std::collections::HashMap;

use raft::prelude::Entry;

use crate::{GroupId, GroupLogState, LogBatch, LogOp, StorageError, StorageResult, SyncMode};

/// One physical change to the entries of a group.
#[derive(Debug)]
pub enum EntryMutation {
    /// Remove the entries with indexes in `[from, to)`.
    Delete { group: GroupId, from: u64, to: u64 },
    /// Store these entries (consecutive indexes, replacing nothing: deletes come first).
    Put { group: GroupId, entries: Vec<Entry> },
}

/// What a backend must do, in order, to commit a batch. Made again for every batch into the
/// same value, whose buffers keep their room: a node with thousands of groups plans a batch
/// of thousands of operations every round, and buffers that size, allocated and freed each
/// time, go back to the system and fault their pages in again.
#[derive(Debug, Default)]
pub struct LogPlan {
    /// Entry changes in the order they must be applied.
    pub mutations: Vec<EntryMutation>,
    /// The new metadata of every group the batch touched, once each, in the order the batch
    /// first touched them.
    pub states: Vec<(GroupId, GroupLogState)>,
    /// Whether the batch changes what raft needs to survive a crash (see
    /// [`LogPlan::syncs_under`]).
    must_sync: bool,
    /// Where each group's state is in `states`, while planning.
    positions: HashMap<GroupId, usize, foldhash::fast::RandomState>,
    /// Each group's mutations linked newest first, while planning.
    links: GroupLinks,
}

/// Links every mutation of a plan to the one before it of the same group, so that a
/// compaction looks for its term among its own group's writes only. Searched through the
/// whole plan instead, a round that compacts every group of thousands would take time in the
/// square of the group count.
#[derive(Debug, Default)]
struct GroupLinks {
    /// For each mutation, by position in `LogPlan::mutations`: the group's mutation before it.
    earlier: Vec<Option<usize>>,
    /// For each group, by position in `LogPlan::states`: its newest mutation.
    newest: Vec<Option<usize>>,
}

impl GroupLinks {
    fn clear(&mut self) {
        self.earlier.clear();
        self.newest.clear();
    }

    /// Pushes `mutation` of the group at `position` of the plan's states onto `mutations`.
    fn push(
        &mut self,
        mutations: &mut Vec<EntryMutation>,
        position: usize,
        mutation: EntryMutation,
    ) {
        self.earlier.push(self.newest[position]);
        self.newest[position] = Some(mutations.len());
        mutations.push(mutation);
    }

    /// The mutations of the group at `position`, newest first.
    fn newest_first<'a>(
        &'a self,
        mutations: &'a [EntryMutation],
        position: usize,
    ) -> impl Iterator<Item = &'a EntryMutation> + 'a {
        std::iter::successors(self.newest[position], |&at| self.earlier[at])
            .map(|at| &mutations[at])
    }
}

impl LogPlan {
    /// Whether a store opened with `mode` syncs this batch: under [`SyncMode::Sync`] it does
    /// unless the batch only moves commit indexes. Raft must find entries, terms, votes,
    /// configurations and a compacted or snapshot prefix after a crash exactly as it wrote
    /// them; a commit index that goes back is learned again from the leader (and a node never
    /// starts below the index its state applied). Such a batch is written without waiting
    /// for the disk and becomes durable with the next batch that syncs.
    pub fn syncs_under(&self, mode: SyncMode) -> bool {
        mode.is_sync() && self.must_sync
    }
}

/// Checks `batch` against the current metadata and turns it into the plan in `out` (whatever
/// it held before is dropped), taking the operations out of `batch` (left empty even if the
/// batch is refused; `out` then holds nothing to apply).
///
/// `current` gives a group's metadata before the batch; `stored_term` reads the term of a
/// stored entry (only called for compaction, for an index not written by the batch itself).
pub(crate) fn plan(
    out: &mut LogPlan,
    batch: &mut LogBatch,
    mut current: impl FnMut(GroupId) -> StorageResult<GroupLogState>,
    mut stored_term: impl FnMut(GroupId, u64) -> StorageResult<u64>,
) -> StorageResult<()> {
    out.mutations.clear();
    out.states.clear();
    out.positions.clear();
    out.links.clear();
    out.must_sync = false;
    out.mutations.reserve(batch.op_count());
    let planned = plan_ops(out, batch, &mut current, &mut stored_term);
    if planned.is_err() {
        out.mutations.clear();
        out.states.clear();
    }
    planned
}

fn plan_ops(
    out: &mut LogPlan,
    batch: &mut LogBatch,
    current: &mut impl FnMut(GroupId) -> StorageResult<GroupLogState>,
    stored_term: &mut impl FnMut(GroupId, u64) -> StorageResult<u64>,
) -> StorageResult<()> {
    // A batch holds a group's operations one after the other (its append, then its hard
    // state), so the group of the previous operation is checked before the map.
    let positions = &mut out.positions;
    let mut previous: Option<(GroupId, usize)> = None;
    for (group, op) in batch.drain_ops() {
        let position = match previous {
            Some((g, position)) if g == group => position,
            _ => match positions.get(&group) {
                Some(&position) => position,
                None => {
                    out.states.push((group, current(group)?));
                    out.links.newest.push(None);
                    positions.insert(group, out.states.len() - 1);
                    out.states.len() - 1
                }
            },
        };
        previous = Some((group, position));
        let state = &mut out.states[position].1;
        match op {
            LogOp::Append(entries) => {
                let (from, to) = check_append(group, state, &entries)?;
                if from <= state.last_index {
                    let replaced = EntryMutation::Delete {
                        group,
                        from,
                        to: state.last_index + 1,
                    };
                    out.links.push(&mut out.mutations, position, replaced);
                }
                state.last_index = to;
                let put = EntryMutation::Put { group, entries };
                out.links.push(&mut out.mutations, position, put);
                out.must_sync = true;
            }
            LogOp::SetHardState(hard_state) => {
                let before = &state.hard_state;
                if hard_state.term != before.term || hard_state.vote != before.vote {
                    out.must_sync = true;
                }
                state.hard_state = hard_state;
            }
            LogOp::SetConfState { conf_state, index } => {
                state.conf_state = conf_state;
                state.conf_state_index = index;
                out.must_sync = true;
            }
            LogOp::Compact { compact_index } => {
                if compact_index <= state.first_index() {
                    continue; // Already compacted that far: compaction is idempotent.
                }
                if compact_index > state.last_index + 1 {
                    return Err(StorageError::invalid(format!(
                        "group {group}: cannot compact to {compact_index}, last index is {}",
                        state.last_index
                    )));
                }
                let new_truncated = compact_index - 1;
                let written = out.links.newest_first(&out.mutations, position);
                let term = match term_in_plan(written, new_truncated) {
                    Some(term) => term,
                    None => stored_term(group, new_truncated)?,
                };
                let compacted = EntryMutation::Delete {
                    group,
                    from: state.first_index(),
                    to: compact_index,
                };
                out.links.push(&mut out.mutations, position, compacted);
                state.truncated_index = new_truncated;
                state.truncated_term = term;
                out.must_sync = true;
            }
            LogOp::ApplySnapshot(metadata) => {
                if state.entry_count() > 0 {
                    let dropped = EntryMutation::Delete {
                        group,
                        from: state.first_index(),
                        to: state.last_index + 1,
                    };
                    out.links.push(&mut out.mutations, position, dropped);
                }
                state.truncated_index = metadata.index;
                state.truncated_term = metadata.term;
                state.last_index = metadata.index;
                state.conf_state = metadata.get_conf_state().clone();
                state.conf_state_index = metadata.index;
                out.must_sync = true;
                // Entries queued earlier in this batch are gone with the rest of the log.
                let marker = EntryMutation::Delete {
                    group,
                    from: 0,
                    to: 0,
                };
                out.links.push(&mut out.mutations, position, marker);
            }
        }
    }
    // The marker deletes pushed by ApplySnapshot are empty ranges: drop them.
    out.mutations
        .retain(|m| !matches!(m, EntryMutation::Delete { from, to, .. } if from >= to));
    Ok(())
}

/// Validates an append and returns the index range `[first, last]` it writes.
fn check_append(
    group: GroupId,
    state: &GroupLogState,
    entries: &[Entry],
) -> StorageResult<(u64, u64)> {
    let first = entries
        .first()
        .expect("LogBatch never holds an empty append");
    let last = entries.last().expect("non-empty");
    if first.index <= state.truncated_index {
        return Err(StorageError::invalid(format!(
            "group {group}: append at index {} overlaps the compacted prefix (truncated at {})",
            first.index, state.truncated_index
        )));
    }
    if first.index > state.last_index + 1 {
        return Err(StorageError::invalid(format!(
            "group {group}: append at index {} leaves a hole after last index {}",
            first.index, state.last_index
        )));
    }
    for pair in entries.windows(2) {
        if pair[1].index != pair[0].index + 1 {
            return Err(StorageError::invalid(format!(
                "group {group}: appended entries jump from index {} to {}",
                pair[0].index, pair[1].index
            )));
        }
        if pair[1].term < pair[0].term {
            return Err(StorageError::invalid(format!(
                "group {group}: term goes back from {} to {} at index {}",
                pair[0].term, pair[1].term, pair[1].index
            )));
        }
    }
    Ok((first.index, last.index))
}

/// The term of `index` if an entry written earlier in this batch holds it, from the group's
/// own mutations newest first: the newest write wins, and a snapshot marker ends the search
/// because it dropped older writes.
fn term_in_plan<'a>(
    group_mutations_newest_first: impl Iterator<Item = &'a EntryMutation>,
    index: u64,
) -> Option<u64> {
    for mutation in group_mutations_newest_first {
        match mutation {
            EntryMutation::Put { entries, .. } => {
                let first = entries[0].index;
                if index >= first && index < first + entries.len() as u64 {
                    return Some(entries[(index - first) as usize].term);
                }
            }
            EntryMutation::Delete { from, to, .. } if from >= to => return None,
            EntryMutation::Delete { .. } => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(range: std::ops::RangeInclusive<u64>, term: u64) -> Vec<Entry> {
        range
            .map(|index| {
                let mut e = Entry::default();
                e.index = index;
                e.term = term;
                e
            })
            .collect()
    }

    fn snapshot_at(index: u64, term: u64) -> raft::prelude::SnapshotMetadata {
        let mut meta = raft::prelude::SnapshotMetadata::default();
        meta.index = index;
        meta.term = term;
        meta
    }

    fn empty(_: GroupId) -> StorageResult<GroupLogState> {
        Ok(GroupLogState::default())
    }

    fn plan_of(
        batch: &mut LogBatch,
        stored_term: impl FnMut(GroupId, u64) -> StorageResult<u64>,
    ) -> StorageResult<LogPlan> {
        let mut out = LogPlan::default();
        plan(&mut out, batch, empty, stored_term)?;
        Ok(out)
    }

    fn state_of(plan: &LogPlan, group: GroupId) -> &GroupLogState {
        let found = plan.states.iter().find(|(g, _)| *g == group);
        &found.expect("the batch touched the group").1
    }

    fn no_store(_: GroupId, _: u64) -> StorageResult<u64> {
        panic!("the plan should find the term in the batch")
    }

    #[test]
    fn compaction_takes_the_term_from_the_newest_write_in_the_batch() {
        let mut batch = LogBatch::new();
        batch.append(1, entries(1..=10, 1));
        batch.append(1, entries(5..=8, 2));
        batch.compact(1, 7);
        let plan = plan_of(&mut batch, no_store).unwrap();
        let state = state_of(&plan, 1);
        assert_eq!((state.truncated_index, state.truncated_term), (6, 2));
        assert_eq!(state.last_index, 8);
    }

    #[test]
    fn compaction_looks_only_at_its_own_groups_writes() {
        let mut batch = LogBatch::new();
        batch.append(1, entries(1..=10, 1));
        batch.append(2, entries(1..=10, 5));
        batch.append(3, entries(1..=4, 6));
        batch.apply_snapshot(3, snapshot_at(30, 7));
        batch.compact(2, 8);
        batch.compact(1, 5);
        // Group 4 wrote nothing in this batch: its term comes from the store even though
        // other groups wrote the same index.
        batch.compact(4, 3);
        let stored = |group| {
            let last_index = if group == 4 { 10 } else { 0 };
            Ok(GroupLogState {
                last_index,
                ..GroupLogState::default()
            })
        };
        let mut asked = Vec::new();
        let mut plan = LogPlan::default();
        let stored_term = |group, index| {
            asked.push((group, index));
            Ok(9)
        };
        super::plan(&mut plan, &mut batch, stored, stored_term).unwrap();
        assert_eq!(asked, vec![(4, 2)], "only group 4 reads the store");
        let term_at = |group| {
            let state = state_of(&plan, group);
            (state.truncated_index, state.truncated_term)
        };
        assert_eq!(term_at(1), (4, 1));
        assert_eq!(term_at(2), (7, 5));
        assert_eq!(term_at(4), (2, 9));
    }

    #[test]
    fn an_invalid_op_anywhere_rejects_the_whole_batch() {
        let mut batch = LogBatch::new();
        batch.append(1, entries(1..=3, 1));
        batch.append(2, entries(5..=6, 1));
        let error = plan_of(&mut batch, no_store).unwrap_err();
        assert!(error.to_string().contains("hole"), "{error}");
    }

    #[test]
    fn snapshot_drops_entries_written_before_it_in_the_batch() {
        let mut batch = LogBatch::new();
        batch.append(1, entries(1..=10, 1));
        batch.apply_snapshot(1, snapshot_at(20, 3));
        batch.compact(1, 21);
        let plan = plan_of(&mut batch, |_, _| Ok(99)).unwrap();
        let state = state_of(&plan, 1);
        assert_eq!(
            (
                state.truncated_index,
                state.truncated_term,
                state.last_index
            ),
            (20, 3, 20)
        );
    }
}
