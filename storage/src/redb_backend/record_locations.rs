//! Which record of the redb log holds the live copy of each entry, so that a record holding
//! none can be deleted, and an old record kept alive by a few entries can be relocated.
//!
//! A record is what one `LogStore::write` appended, for all its groups. An entry's copy dies
//! when the entry is compacted away, replaced by a conflicting append, dropped by a snapshot,
//! or copied into a newer record (relocation). A record whose copies are all dead is deleted
//! from the file by the next write.

use std::collections::{BTreeMap, VecDeque};

use crate::GroupId;

/// Key of a record in the redb log: records are numbered in the order they were written.
pub(super) type RecordSeq = u64;

/// Consecutive live entries of one group whose copies are in the same record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Run {
    pub first: u64,
    pub last: u64,
    pub record: RecordSeq,
}

/// Records kept beyond twice what the longest-lived group spans before the oldest is relocated.
const RELOCATION_SLACK_RECORDS: usize = 16;

#[derive(Debug, Default)]
pub(super) struct RecordLocations {
    /// Per group, the runs covering its live entries, in index order, without overlaps.
    groups: BTreeMap<GroupId, VecDeque<Run>>,
    /// Per record with live copies, how many runs point at it.
    live_runs: BTreeMap<RecordSeq, usize>,
    /// Records no run points at any more, not yet deleted from the file.
    dead: Vec<RecordSeq>,
}

impl RecordLocations {
    /// Records that entries `first..=last` of `group` are live in `record`. They must follow
    /// every live entry of the group (a backend removes what an append replaces first).
    pub fn add(&mut self, group: GroupId, first: u64, last: u64, record: RecordSeq) {
        debug_assert!(first <= last);
        let runs = self.groups.entry(group).or_default();
        debug_assert!(runs.back().is_none_or(|run| run.last < first));
        if let Some(previous) = runs.back_mut()
            && previous.record == record
            && previous.last + 1 == first
        {
            previous.last = last;
            return;
        }
        runs.push_back(Run {
            first,
            last,
            record,
        });
        *self.live_runs.entry(record).or_default() += 1;
    }

    /// Records that entries `from..to` of `group` are gone.
    pub fn remove(&mut self, group: GroupId, from: u64, to: u64) {
        let Some(runs) = self.groups.get_mut(&group) else {
            return;
        };
        let mut kept = VecDeque::with_capacity(runs.len());
        let mut released = Vec::new();
        for run in runs.drain(..) {
            if run.last < from || run.first >= to {
                kept.push_back(run);
                continue;
            }
            let before = (run.first < from).then(|| Run {
                last: from - 1,
                ..run
            });
            let after = (run.last >= to).then_some(Run { first: to, ..run });
            match (before, after) {
                (None, None) => released.push(run.record),
                (Some(part), None) | (None, Some(part)) => kept.push_back(part),
                (Some(low), Some(high)) => {
                    // A hole in the middle of a run: the record is now pointed at twice.
                    kept.push_back(low);
                    kept.push_back(high);
                    *self.live_runs.entry(run.record).or_default() += 1;
                }
            }
        }
        *runs = kept;
        if runs.is_empty() {
            self.groups.remove(&group);
        }
        for record in released {
            self.release(record);
        }
    }

    /// Points every run of record `from` at record `to` (their entries were copied there).
    pub fn relocate(&mut self, from: RecordSeq, to: RecordSeq) {
        let mut moved = 0;
        for runs in self.groups.values_mut() {
            for run in runs.iter_mut().filter(|run| run.record == from) {
                run.record = to;
                moved += 1;
            }
        }
        if moved > 0 {
            self.live_runs.remove(&from);
            *self.live_runs.entry(to).or_default() += moved;
            self.dead.push(from);
        }
    }

    /// The runs whose live copies are in `record`, with their groups.
    pub fn runs_in(&self, record: RecordSeq) -> Vec<(GroupId, Run)> {
        let mut out = Vec::new();
        for (&group, runs) in &self.groups {
            out.extend(
                runs.iter()
                    .filter(|run| run.record == record)
                    .map(|run| (group, *run)),
            );
        }
        out
    }

    /// Up to `limit` of the oldest records to relocate, if the records kept alive exceed twice
    /// what the group spanning the most records needs (plus some slack). When every group moves
    /// at a similar pace that never happens; when one group stops writing, the records of its
    /// last entries hold the other groups' dead entries on disk, and relocating its few live
    /// entries into the next record lets those records go.
    pub fn relocation_candidates(&self, limit: usize) -> Vec<RecordSeq> {
        let widest_group_runs = self.groups.values().map(VecDeque::len).max().unwrap_or(0);
        let allowed = 2 * widest_group_runs + RELOCATION_SLACK_RECORDS;
        // The write asking is about to add a record of its own.
        let excess = (self.live_runs.len() + 1).saturating_sub(allowed);
        self.live_runs
            .keys()
            .copied()
            .take(excess.min(limit))
            .collect()
    }

    /// Marks a record present in the file but referenced by no run (found on open) as dead.
    pub fn note_unreferenced(&mut self, record: RecordSeq) {
        if !self.live_runs.contains_key(&record) {
            self.dead.push(record);
        }
    }

    /// Records to delete from the file; the caller puts them back if its write fails.
    pub fn take_dead(&mut self) -> Vec<RecordSeq> {
        std::mem::take(&mut self.dead)
    }

    /// Returns records whose deletion did not commit.
    pub fn restore_dead(&mut self, records: Vec<RecordSeq>) {
        self.dead.extend(records);
    }

    /// How many records hold live copies.
    #[cfg(any(test, feature = "testing"))]
    pub fn live_records(&self) -> usize {
        self.live_runs.len()
    }

    fn release(&mut self, record: RecordSeq) {
        if let Some(count) = self.live_runs.get_mut(&record) {
            *count -= 1;
            if *count == 0 {
                self.live_runs.remove(&record);
                self.dead.push(record);
            }
        }
    }

    #[cfg(test)]
    fn runs(&self, group: GroupId) -> Vec<Run> {
        self.groups
            .get(&group)
            .map(|runs| runs.iter().copied().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(first: u64, last: u64, record: RecordSeq) -> Run {
        Run {
            first,
            last,
            record,
        }
    }

    #[test]
    fn appends_to_the_same_record_merge_and_a_record_dies_with_its_last_run() {
        let mut locations = RecordLocations::default();
        locations.add(1, 1, 3, 10);
        locations.add(1, 4, 5, 10);
        locations.add(2, 1, 1, 10);
        locations.add(1, 6, 9, 11);
        assert_eq!(locations.runs(1), vec![run(1, 5, 10), run(6, 9, 11)]);
        // Compaction of group 1 through 5 leaves record 10 alive for group 2.
        locations.remove(1, 1, 6);
        assert!(locations.take_dead().is_empty());
        locations.remove(2, 1, 2);
        assert_eq!(locations.take_dead(), vec![10]);
        assert_eq!(locations.live_records(), 1);
    }

    #[test]
    fn a_conflicting_append_trims_the_tail_and_a_middle_hole_splits_a_run() {
        let mut locations = RecordLocations::default();
        locations.add(1, 1, 10, 1);
        locations.remove(1, 8, 11);
        locations.add(1, 8, 12, 2);
        assert_eq!(locations.runs(1), vec![run(1, 7, 1), run(8, 12, 2)]);
        locations.remove(1, 3, 5);
        assert_eq!(
            locations.runs(1),
            vec![run(1, 2, 1), run(5, 7, 1), run(8, 12, 2)]
        );
        locations.remove(1, 1, 3);
        assert!(
            locations.take_dead().is_empty(),
            "record 1 still holds 5..=7"
        );
        locations.remove(1, 5, 8);
        assert_eq!(locations.take_dead(), vec![1]);
    }

    #[test]
    fn relocation_moves_every_run_of_a_record_and_kills_it() {
        let mut locations = RecordLocations::default();
        locations.add(1, 1, 2, 5);
        locations.add(2, 7, 7, 5);
        locations.add(2, 8, 9, 6);
        let mut moved = locations.runs_in(5);
        moved.sort_by_key(|(group, _)| *group);
        assert_eq!(moved, vec![(1, run(1, 2, 5)), (2, run(7, 7, 5))]);
        locations.relocate(5, 9);
        assert_eq!(locations.take_dead(), vec![5]);
        assert_eq!(locations.runs(2), vec![run(7, 7, 9), run(8, 9, 6)]);
        locations.remove(2, 7, 10);
        locations.remove(1, 1, 3);
        let mut dead = locations.take_dead();
        dead.sort_unstable();
        assert_eq!(dead, vec![6, 9]);
    }

    #[test]
    fn old_records_held_by_idle_groups_become_candidates() {
        let mut locations = RecordLocations::default();
        // Four groups that each wrote 20 records in turn, then stopped.
        let mut record = 0;
        for group in 1..=4 {
            for index in 1..=20 {
                locations.add(group, index, index, record);
                record += 1;
            }
        }
        // 80 live records and the next write's; the widest group spans 20: 81 > 2 * 20 + 16
        // by 25.
        assert_eq!(
            locations.relocation_candidates(100),
            (0..25).collect::<Vec<_>>()
        );
        assert_eq!(locations.relocation_candidates(2), vec![0, 1]);
        // One group moving alone never needs it.
        let mut alone = RecordLocations::default();
        for index in 1..=1000 {
            alone.add(1, index, index, index);
        }
        assert!(alone.relocation_candidates(2).is_empty());
    }
}
