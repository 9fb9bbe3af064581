//! Which record of the redb log holds the live copy of each entry, so that a record holding
//! none can be deleted, and an old record kept alive by a few entries can be relocated.
//!
//! A record is what one `LogStore::write` appended, for all its groups. An entry's copy dies
//! when the entry is compacted away, replaced by a conflicting append, dropped by a snapshot,
//! or copied into a newer record (relocation). A record whose copies are all dead is deleted
//! from the file by the next write.
//!
//! Relocation buys back space and costs writes (every live entry of a record relocated is
//! written again), so it runs only when the records kept hold more than twice the entries
//! still live, and moves only the oldest records of which at most half is live. A log whose
//! groups all write and compact alike never needs it; a group that stops writing leaves its
//! last records mostly dead once the others compact, and those go.

use std::collections::{BTreeMap, HashMap, VecDeque};

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

/// Entries the records kept may hold beyond twice the live ones before relocation starts.
const RELOCATION_SLACK_ENTRIES: u64 = 64;

/// The oldest records looked at for one write's relocations.
const RELOCATION_SCAN_RECORDS: usize = 64;

/// Groups keyed by id, hashed: every write looks up each group it appends to.
type ByGroup<V> = HashMap<GroupId, V, foldhash::fast::RandomState>;

#[derive(Debug, Default)]
pub(super) struct RecordLocations {
    /// Per group, the runs covering its live entries, in index order, without overlaps.
    groups: ByGroup<VecDeque<Run>>,
    /// Per record with live copies, its runs and entries.
    live: BTreeMap<RecordSeq, RecordCounts>,
    /// Entries the records in `live` hold, live or dead.
    kept_entries: u64,
    /// Entries whose live copy is in one of the records in `live`.
    live_entries: u64,
    /// Per record with live copies, the index ranges written into it, with their groups:
    /// relocating a record visits those groups' runs in those ranges only, not every group of
    /// the log. A list only grows (a range whose entries went stays until the record dies), so
    /// that writes and compactions, the hot path, never search it.
    listed: BTreeMap<RecordSeq, Vec<Listed>>,
    /// Records no run points at any more, not yet deleted from the file.
    dead: Vec<RecordSeq>,
}

/// What one record with live copies holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct RecordCounts {
    /// Runs pointing at it.
    runs: usize,
    /// Entries written in it, live or dead (on open, every entry decoded from it).
    entries: u64,
    /// Entries whose live copy it holds.
    live_entries: u64,
}

/// Entries `first..=last` of `group` were put in a record (written, or relocated into it).
/// Runs only shrink or split where entries went, so every run of the group still in the
/// record overlaps one of the ranges listed for it.
#[derive(Clone, Copy, Debug)]
struct Listed {
    group: GroupId,
    first: u64,
    last: u64,
}

impl RecordLocations {
    /// Records that entries `first..=last` of `group` are live in `record`. They must follow
    /// every live entry of the group (a backend removes what an append replaces first).
    pub fn add(&mut self, group: GroupId, first: u64, last: u64, record: RecordSeq) {
        debug_assert!(first <= last);
        let added = last - first + 1;
        self.kept_entries += added;
        self.live_entries += added;
        let counts = self.live.entry(record).or_default();
        counts.entries += added;
        counts.live_entries += added;
        let runs = self.groups.entry(group).or_default();
        debug_assert!(runs.back().is_none_or(|run| run.last < first));
        match runs.back_mut() {
            Some(previous) if previous.record == record && previous.last + 1 == first => {
                previous.last = last;
            }
            _ => {
                runs.push_back(Run {
                    first,
                    last,
                    record,
                });
                counts.runs += 1;
            }
        }
        self.list(record, group, first, last);
    }

    /// Records that entries `from..to` of `group` are gone.
    pub fn remove(&mut self, group: GroupId, from: u64, to: u64) {
        let Some(runs) = self.groups.get_mut(&group) else {
            return;
        };
        // Only the runs that overlap `from..to` change; compaction takes them from the front,
        // a conflicting append from the back.
        let start = runs.partition_point(|run| run.last < from);
        let end = runs.partition_point(|run| run.first < to);
        if start >= end {
            return;
        }
        let mut kept = Vec::with_capacity(2);
        for run in runs.drain(start..end) {
            // The counts only steer relocation: saturating, a miscount could never stop a write.
            let gone = run.last.min(to - 1) - run.first.max(from) + 1;
            self.live_entries = self.live_entries.saturating_sub(gone);
            let before = (run.first < from).then(|| Run {
                last: from - 1,
                ..run
            });
            let after = (run.last >= to).then_some(Run { first: to, ..run });
            // A run that goes entirely releases its record; one with a hole in the middle
            // leaves two pointing at it. Either way inside the ranges the record lists.
            let runs_change: isize = match (before, after) {
                (None, None) => -1,
                (Some(part), None) | (None, Some(part)) => {
                    kept.push(part);
                    0
                }
                (Some(low), Some(high)) => {
                    kept.push(low);
                    kept.push(high);
                    1
                }
            };
            let Some(counts) = self.live.get_mut(&run.record) else {
                continue;
            };
            counts.live_entries = counts.live_entries.saturating_sub(gone);
            counts.runs = counts.runs.saturating_add_signed(runs_change);
            if counts.runs == 0 {
                debug_assert_eq!(counts.live_entries, 0, "record {}", run.record);
                self.kept_entries = self.kept_entries.saturating_sub(counts.entries);
                self.live.remove(&run.record);
                self.listed.remove(&run.record);
                self.dead.push(run.record);
            }
        }
        for (offset, run) in kept.into_iter().enumerate() {
            runs.insert(start + offset, run);
        }
        if runs.is_empty() {
            self.groups.remove(&group);
        }
    }

    /// Points every run of record `from` at record `to` (their entries were copied there).
    pub fn relocate(&mut self, from: RecordSeq, to: RecordSeq) {
        let found = self.find_runs(from);
        let moved = found.len();
        // The new record lists the runs found, whichever way they were found.
        self.listed.remove(&from);
        for &(group, position) in &found {
            let Some(run) = self
                .groups
                .get_mut(&group)
                .and_then(|runs| runs.get_mut(position))
            else {
                continue;
            };
            run.record = to;
            let (first, last) = (run.first, run.last);
            self.list(to, group, first, last);
        }
        if moved > 0 {
            let old = self.live.remove(&from).unwrap_or_default();
            // The live entries are written again, into `to`; the old record's all go.
            self.kept_entries = self.kept_entries.saturating_sub(old.entries) + old.live_entries;
            let counts = self.live.entry(to).or_default();
            counts.runs += moved;
            counts.entries += old.live_entries;
            counts.live_entries += old.live_entries;
            self.dead.push(from);
        }
    }

    /// The runs whose live copies are in `record`, with their groups, ascending by group.
    pub fn runs_in(&self, record: RecordSeq) -> Vec<(GroupId, Run)> {
        self.find_runs(record)
            .into_iter()
            .map(|(group, position)| (group, self.groups[&group][position]))
            .collect()
    }

    /// `(group, position in the group's runs)` of every run in `record`, ascending: through
    /// the record's list when it finds as many runs as the record has live, otherwise (it
    /// should not happen, but a run missed would have its record deleted) by looking at every
    /// run of every group.
    fn find_runs(&self, record: RecordSeq) -> Vec<(GroupId, usize)> {
        let expected = self.live.get(&record).map_or(0, |counts| counts.runs);
        let listed = self.listed_runs(record);
        if listed.len() == expected {
            return listed;
        }
        self.scanned_runs(record)
    }

    /// The runs in `record` that its list leads to.
    fn listed_runs(&self, record: RecordSeq) -> Vec<(GroupId, usize)> {
        let mut found = Vec::new();
        for listed in self.listed.get(&record).into_iter().flatten() {
            let Some(runs) = self.groups.get(&listed.group) else {
                continue;
            };
            let start = first_run_ending_at_or_after(runs, listed.first);
            let overlapping = runs
                .range(start..)
                .take_while(|run| run.first <= listed.last);
            found.extend(
                overlapping
                    .enumerate()
                    .filter(|(_, run)| run.record == record)
                    .map(|(offset, _)| (listed.group, start + offset)),
            );
        }
        // Ranges listed for one group may overlap (an append after a conflicting one, in
        // one write): a run they share is found once.
        found.sort_unstable();
        found.dedup();
        found
    }

    /// The runs in `record`, found by looking at every run.
    fn scanned_runs(&self, record: RecordSeq) -> Vec<(GroupId, usize)> {
        let mut found = Vec::new();
        for (&group, runs) in &self.groups {
            for (position, run) in runs.iter().enumerate() {
                if run.record == record {
                    found.push((group, position));
                }
            }
        }
        found.sort_unstable();
        found
    }

    /// Notes that entries `first..=last` of `group` were put in `record`.
    fn list(&mut self, record: RecordSeq, group: GroupId, first: u64, last: u64) {
        self.listed
            .entry(record)
            .or_default()
            .push(Listed { group, first, last });
    }

    /// Up to `limit` of the oldest records to relocate, once the records kept hold more than
    /// twice the live entries (plus some slack): among the oldest few, those at most half live,
    /// whose relocation writes the least for the space it frees. Counts entries, not bytes:
    /// the entries of one log are alike enough for a bound on space.
    pub fn relocation_candidates(&self, limit: usize) -> Vec<RecordSeq> {
        if self.kept_entries <= 2 * self.live_entries + RELOCATION_SLACK_ENTRIES {
            return Vec::new();
        }
        self.live
            .iter()
            .take(RELOCATION_SCAN_RECORDS)
            .filter(|(_, counts)| 2 * counts.live_entries <= counts.entries)
            .map(|(&record, _)| record)
            .take(limit)
            .collect()
    }

    /// Notes that `record` holds `entries` entries in all, live or dead (on open, where only
    /// the live ones are added).
    pub fn note_written(&mut self, record: RecordSeq, entries: u64) {
        if let Some(counts) = self.live.get_mut(&record)
            && entries > counts.entries
        {
            self.kept_entries += entries - counts.entries;
            counts.entries = entries;
        }
    }

    /// Marks a record present in the file but referenced by no run (found on open) as dead.
    pub fn note_unreferenced(&mut self, record: RecordSeq) {
        if !self.live.contains_key(&record) {
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
        self.live.len()
    }

    /// `(entries the live records hold, live or dead; live entries)`.
    #[cfg(any(test, feature = "testing"))]
    pub fn entry_counts(&self) -> (u64, u64) {
        (self.kept_entries, self.live_entries)
    }

    #[cfg(test)]
    fn runs(&self, group: GroupId) -> Vec<Run> {
        self.groups
            .get(&group)
            .map(|runs| runs.iter().copied().collect())
            .unwrap_or_default()
    }
}

/// The position of the first of `runs` (ascending) that ends at or after index `first`,
/// searched from the front with steps that double: the records relocated are the oldest, so
/// their runs are at or near the front of each group's runs, found in a probe or two rather
/// than by a binary search over every run the group keeps.
fn first_run_ending_at_or_after(runs: &VecDeque<Run>, first: u64) -> usize {
    let mut bound = 1;
    while bound <= runs.len() && runs[bound - 1].last < first {
        bound *= 2;
    }
    // Everything before `bound / 2` ends before `first`; the answer is below `bound` or is
    // the length.
    let (mut low, mut high) = (bound / 2, bound.min(runs.len()));
    while low < high {
        let middle = low + (high - low) / 2;
        if runs[middle].last < first {
            low = middle + 1;
        } else {
            high = middle;
        }
    }
    low
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
    fn the_search_from_the_front_finds_what_a_binary_search_finds() {
        for count in 0..40u64 {
            // Runs of two entries each, 1-2, 3-4, ...
            let runs: VecDeque<Run> = (0..count).map(|n| run(2 * n + 1, 2 * n + 2, n)).collect();
            for first in 0..2 * count + 4 {
                assert_eq!(
                    first_run_ending_at_or_after(&runs, first),
                    runs.partition_point(|run| run.last < first),
                    "{count} runs, first {first}"
                );
            }
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
    fn a_run_listed_twice_in_its_record_is_found_once() {
        let mut locations = RecordLocations::default();
        // One write: an append, a conflicting one over its tail, and a second group.
        locations.add(1, 1, 10, 5);
        locations.remove(1, 8, 11);
        locations.add(1, 8, 12, 5);
        locations.add(2, 3, 4, 5);
        assert_eq!(locations.runs(1), vec![run(1, 12, 5)]);
        assert_eq!(locations.listed_runs(5), locations.scanned_runs(5));
        locations.relocate(5, 6);
        assert_eq!(locations.take_dead(), vec![5]);
        assert_eq!(locations.runs(1), vec![run(1, 12, 6)]);
        assert_eq!(locations.runs(2), vec![run(3, 4, 6)]);
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

    /// A log's life over many groups (appends, compactions, conflicting appends, holes,
    /// relocations) against a model of which record holds each live entry: the runs say the
    /// same, the counts of live runs are right, and every record's list finds exactly the
    /// runs a full scan finds.
    #[test]
    fn runs_and_lists_follow_a_model_of_the_log() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut locations = RecordLocations::default();
        // Per group: index -> record holding its live copy.
        let mut model: Vec<BTreeMap<u64, RecordSeq>> = vec![BTreeMap::new(); 12];
        let mut relocations = 0;
        for record in 0..600u64 {
            for old in locations.relocation_candidates(2) {
                let moved = locations.runs_in(old);
                for (group, run) in moved {
                    for index in run.first..=run.last {
                        assert_eq!(model[group as usize].insert(index, record), Some(old));
                    }
                }
                locations.relocate(old, record);
                relocations += 1;
            }
            for (group, entries) in model.iter_mut().enumerate() {
                let (first, last) = match (entries.first_key_value(), entries.last_key_value()) {
                    (Some((&first, _)), Some((&last, _))) => (first, last),
                    _ => (1, 0),
                };
                let group = group as GroupId;
                let remove = |locations: &mut RecordLocations,
                              entries: &mut BTreeMap<u64, RecordSeq>,
                              from: u64,
                              to: u64| {
                    locations.remove(group, from, to);
                    entries.retain(|&index, _| index < from || index >= to);
                };
                // Groups going idle: their last runs hold old records alive, which relocation
                // then moves.
                let idle_from = 40 + 30 * group;
                if group < 8 && (idle_from..idle_from + 200).contains(&record) {
                    continue;
                }
                let mut next = last + 1;
                match rng.random_range(0..20) {
                    0 if last >= first + 4 => {
                        // A conflicting append replaces the tail.
                        next = last - rng.random_range(0..4);
                        remove(&mut locations, entries, next, last + 1);
                    }
                    1 if last >= first + 8 => {
                        let hole = first + rng.random_range(2..6);
                        remove(&mut locations, entries, hole, hole + 2);
                    }
                    2..=8 => continue, // This group writes nothing to this record.
                    _ => {}
                }
                // Some runs long enough for a hole to split them.
                let count = rng.random_range(1..8);
                locations.add(group, next, next + count - 1, record);
                for index in next..next + count {
                    entries.insert(index, record);
                }
                let last = next + count - 1;
                if last > first + 16 {
                    // Compaction keeps about the last 10 entries.
                    let compact = last - 10 + rng.random_range(0..4);
                    remove(&mut locations, entries, first, compact);
                }
            }
            for (group, entries) in model.iter().enumerate() {
                let runs = locations.runs(group as GroupId);
                let expanded: BTreeMap<u64, RecordSeq> = runs
                    .iter()
                    .flat_map(|run| (run.first..=run.last).map(|index| (index, run.record)))
                    .collect();
                assert_eq!(&expanded, entries, "group {group} after record {record}");
            }
            for (&live, counts) in &locations.live {
                let scanned = locations.scanned_runs(live);
                assert_eq!(scanned.len(), counts.runs, "record {live}");
                assert_eq!(locations.listed_runs(live), scanned, "record {live}");
                let live_in_model = model
                    .iter()
                    .flat_map(|entries| entries.values())
                    .filter(|&&holder| holder == live)
                    .count() as u64;
                assert_eq!(counts.live_entries, live_in_model, "record {live}");
                assert!(counts.entries >= counts.live_entries, "record {live}");
            }
            let live_in_model: usize = model.iter().map(BTreeMap::len).sum();
            assert_eq!(locations.live_entries, live_in_model as u64);
            let kept: u64 = locations.live.values().map(|counts| counts.entries).sum();
            assert_eq!(locations.kept_entries, kept);
            locations.take_dead();
        }
        assert!(relocations > 10, "the run relocated {relocations} records");
    }

    #[test]
    fn a_list_that_misses_runs_is_not_trusted() {
        let mut locations = RecordLocations::default();
        locations.add(1, 1, 2, 5);
        locations.add(2, 7, 7, 5);
        // Were a list ever to lose a group, the record's live count would tell: a full scan
        // finds the runs, and relocation moves every one of them before the record goes.
        locations
            .listed
            .get_mut(&5)
            .unwrap()
            .retain(|listed| listed.group != 2);
        assert_eq!(
            locations.runs_in(5),
            vec![(1, run(1, 2, 5)), (2, run(7, 7, 5))]
        );
        locations.relocate(5, 6);
        assert_eq!(locations.take_dead(), vec![5]);
        assert_eq!(locations.runs(2), vec![run(7, 7, 6)]);
        assert_eq!(locations.listed_runs(6), locations.scanned_runs(6));
    }

    #[test]
    fn old_records_held_by_idle_groups_become_candidates() {
        let mut locations = RecordLocations::default();
        // Four groups wrote one entry to each of 20 records in turn, then stopped; a busy
        // group wrote nine entries to each of those records and compacted them all away since:
        // 80 records with one live entry in ten.
        let mut record = 0;
        for group in 1..=4 {
            for index in 1..=20 {
                locations.add(group, index, index, record);
                locations.add(9, 9 * record + 1, 9 * record + 9, record);
                record += 1;
            }
        }
        assert!(locations.relocation_candidates(2).is_empty(), "all live");
        locations.remove(9, 1, 9 * record + 1);
        assert_eq!(locations.live_entries, 80);
        assert_eq!(locations.kept_entries, 800);
        assert_eq!(locations.relocation_candidates(2), vec![0, 1]);
        // Only the oldest few are looked at.
        assert_eq!(
            locations.relocation_candidates(1000),
            (0..RELOCATION_SCAN_RECORDS as u64).collect::<Vec<_>>()
        );
        // Relocating them into one new record: 64 dead records go, 64 entries written again.
        for old in locations.relocation_candidates(1000) {
            locations.relocate(old, 100);
        }
        assert_eq!(locations.take_dead().len(), 64);
        assert_eq!(locations.live_entries, 80);
        assert_eq!(locations.kept_entries, 16 * 10 + 64);
        // 224 kept against 80 live is within twice plus the slack: nothing more to move.
        assert!(locations.relocation_candidates(2).is_empty());
        // One group moving alone never needs it.
        let mut alone = RecordLocations::default();
        for index in 1..=1000 {
            alone.add(1, index, index, index);
        }
        assert!(alone.relocation_candidates(2).is_empty());
    }

    /// Many groups writing to a random share of the records and compacting alike — a busy
    /// node with a thousand groups — keep their records without relocating any: the oldest
    /// records are mostly live, and moving them would write them again for little space.
    #[test]
    fn groups_that_write_and_compact_alike_are_never_relocated() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let mut locations = RecordLocations::default();
        let groups = 200u64;
        let mut last = vec![0u64; groups as usize];
        let mut first = vec![1u64; groups as usize];
        for record in 0..2000u64 {
            assert!(
                locations.relocation_candidates(2).is_empty(),
                "record {record}: {} kept, {} live",
                locations.kept_entries,
                locations.live_entries
            );
            for group in 0..groups {
                let g = group as usize;
                if rng.random_range(0..10) >= 3 {
                    continue;
                }
                locations.add(group, last[g] + 1, last[g] + 1, record);
                last[g] += 1;
                // Each keeps between 20 and 40 entries: compacts to 20 once it holds 40.
                if last[g] + 1 - first[g] >= 40 {
                    let to = last[g] + 1 - 20;
                    locations.remove(group, first[g], to);
                    first[g] = to;
                }
            }
            locations.take_dead();
        }
        assert!(
            locations.live_records() < 200,
            "{}",
            locations.live_records()
        );
    }
}
