//! [`MemLogStore`]: raft logs in memory.

use std::collections::{HashMap, VecDeque};

use parking_lot::{Mutex, MutexGuard, RwLock};
use protobuf::Message as _;
use raft::prelude::Entry;

use crate::group_log_state::SizeBudget;
use crate::log_plan::{EntryMutation, LogPlan, plan};
use crate::{GroupId, GroupLogState, LogBatch, LogStore, StorageError, StorageResult, SyncMode};

/// A [`LogStore`] that keeps everything in memory. `write` never syncs; `flush` does nothing.
///
/// ```
/// use concord_storage::{LogBatch, LogStore, MemLogStore, raft::prelude::Entry};
///
/// let store = MemLogStore::new();
/// let mut entry = Entry::default();
/// entry.index = 1;
/// entry.term = 1;
/// let mut batch = LogBatch::new();
/// batch.append(3, vec![entry]);
/// store.write(batch)?;
/// assert_eq!(store.last_index(3)?, 1);
/// # Ok::<(), concord_storage::StorageError>(())
/// ```
#[derive(Debug, Default)]
pub struct MemLogStore {
    /// A hash map: raft-rs reads a group's entries and terms several times per round, and a
    /// node may hold thousands of groups.
    groups: RwLock<GroupLogs>,
    /// The plan of the batch being written, kept between writes for its buffers (see
    /// [`LogPlan`]). Locked before `groups` by whoever takes both.
    plan: Mutex<LogPlan>,
}

type GroupLogs = HashMap<GroupId, MemGroupLog, foldhash::fast::RandomState>;

#[derive(Debug, Default)]
struct MemGroupLog {
    state: GroupLogState,
    /// Entries `first_index..=last_index`; `entries[0].index == state.first_index()`.
    entries: VecDeque<Entry>,
}

impl MemGroupLog {
    /// Where `index` sits in `entries`, from the state: a read need not touch the first entry
    /// (a cache miss of its own when thousands of groups each read a few entries a round).
    /// Holds while the state matches the entries, so not between a plan's mutations and its
    /// states (`apply_plan_to` uses [`MemGroupLog::position_from_front`]); callers check the
    /// entry they find.
    fn position(&self, index: u64) -> usize {
        index.saturating_sub(self.state.first_index()) as usize
    }

    /// Where `index` sits in `entries`, from the first entry.
    fn position_from_front(&self, index: u64) -> usize {
        let front = self.entries.front().map_or(index, |e| e.index);
        (index - front) as usize
    }

    /// Where the entry at `index`, which the state says the log holds, sits in `entries`: a
    /// log whose entries and state disagree is reported, never answered with another index's
    /// entry.
    fn checked_position(&self, group: GroupId, index: u64) -> StorageResult<usize> {
        let position = self.position(index);
        match self.entries.get(position) {
            Some(entry) if entry.index == index => Ok(position),
            _ => Err(missing(group, index)),
        }
    }

    /// The entry at `index` (see [`MemGroupLog::checked_position`]).
    fn entry(&self, group: GroupId, index: u64) -> StorageResult<&Entry> {
        let position = self.checked_position(group, index)?;
        Ok(&self.entries[position])
    }
}

impl MemLogStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

impl MemLogStore {
    /// Checks `batch` against the current logs and turns it into the changes it makes, without
    /// making them. With [`MemLogStore::apply_plan`], lets a disk backend that keeps its live
    /// log here write the batch to disk in between; the caller serializes writes, so the plan
    /// still holds when it is applied.
    pub(crate) fn plan_batch(
        &self,
        batch: &mut LogBatch,
    ) -> StorageResult<MutexGuard<'_, LogPlan>> {
        let mut out = self.plan.lock();
        plan_against(&mut out, &self.groups.read(), batch)?;
        Ok(out)
    }

    /// Applies what [`MemLogStore::plan_batch`] planned.
    pub(crate) fn apply_plan(&self, mut plan: MutexGuard<'_, LogPlan>) {
        apply_plan_to(&mut self.groups.write(), &mut plan);
    }
}

fn plan_against(out: &mut LogPlan, groups: &GroupLogs, batch: &mut LogBatch) -> StorageResult<()> {
    plan(
        out,
        batch,
        |group| {
            Ok(groups
                .get(&group)
                .map(|g| g.state.clone())
                .unwrap_or_default())
        },
        |group, index| {
            let log = groups.get(&group).ok_or_else(|| missing(group, index))?;
            log.entry(group, index).map(|e| e.term)
        },
    )
}

fn apply_plan_to(groups: &mut GroupLogs, plan: &mut LogPlan) {
    for mutation in plan.mutations.drain(..) {
        match mutation {
            EntryMutation::Delete { group, from, to } => {
                let log = groups.entry(group).or_default();
                let (low, high) = (log.position_from_front(from), log.position_from_front(to));
                let high = high.min(log.entries.len());
                if low == 0 {
                    log.entries.drain(..high);
                } else {
                    log.entries.drain(low..high);
                }
            }
            EntryMutation::Put { group, entries } => {
                groups.entry(group).or_default().entries.extend(entries);
            }
        }
    }
    for (group, state) in plan.states.drain(..) {
        groups.entry(group).or_default().state = state;
    }
}

impl LogStore for MemLogStore {
    fn write_from(&self, batch: &mut LogBatch) -> StorageResult<()> {
        let mut plan = self.plan.lock();
        let mut groups = self.groups.write();
        plan_against(&mut plan, &groups, batch)?;
        apply_plan_to(&mut groups, &mut plan);
        Ok(())
    }

    fn entries(
        &self,
        group: GroupId,
        low: u64,
        high: u64,
        max_bytes: Option<u64>,
    ) -> StorageResult<Vec<Entry>> {
        let groups = self.groups.read();
        let Some(log) = groups.get(&group) else {
            GroupLogState::default().check_range(group, low, high)?;
            return Ok(Vec::new());
        };
        log.state.check_range(group, low, high)?;
        if low == high {
            return Ok(Vec::new());
        }
        let start = log.checked_position(group, low)?;
        let count = (high - low) as usize;
        if start + count > log.entries.len() {
            return Err(missing(group, high - 1));
        }
        let mut budget = SizeBudget::new(max_bytes);
        let mut out = Vec::with_capacity(count);
        for entry in log.entries.range(start..start + count) {
            if max_bytes.is_some() && !budget.take(u64::from(entry.compute_size())) {
                break;
            }
            out.push(entry.clone());
        }
        Ok(out)
    }

    fn term(&self, group: GroupId, index: u64) -> StorageResult<u64> {
        let groups = self.groups.read();
        let Some(log) = groups.get(&group) else {
            let term = GroupLogState::default().term_from_metadata(group, index)?;
            return Ok(term.unwrap_or_default());
        };
        if let Some(term) = log.state.term_from_metadata(group, index)? {
            return Ok(term);
        }
        log.entry(group, index).map(|e| e.term)
    }

    fn group_state(&self, group: GroupId) -> StorageResult<GroupLogState> {
        let groups = self.groups.read();
        Ok(groups
            .get(&group)
            .map(|g| g.state.clone())
            .unwrap_or_default())
    }

    fn first_index(&self, group: GroupId) -> StorageResult<u64> {
        // raft-rs asks often: answer without cloning the conf state.
        let groups = self.groups.read();
        Ok(groups.get(&group).map_or(1, |g| g.state.first_index()))
    }

    fn last_index(&self, group: GroupId) -> StorageResult<u64> {
        let groups = self.groups.read();
        Ok(groups.get(&group).map_or(0, |g| g.state.last_index))
    }

    fn groups(&self) -> StorageResult<Vec<GroupId>> {
        let mut groups: Vec<GroupId> = self.groups.read().keys().copied().collect();
        groups.sort_unstable();
        Ok(groups)
    }

    fn flush(&self) -> StorageResult<()> {
        Ok(())
    }

    fn sync_mode(&self) -> SyncMode {
        SyncMode::NoSync
    }

    fn sync_count(&self) -> u64 {
        0
    }
}

/// The metadata says an entry exists but the deque lacks it: a bug, reported, not a panic.
fn missing(group: GroupId, index: u64) -> StorageError {
    StorageError::corrupted("memory", format!("group {group}: entry {index} is missing"))
}
