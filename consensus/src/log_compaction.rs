//! When a group's log is compacted, and how far: one rule for the raft and solo workers.
//!
//! Every backend but sled holds the live log in memory, and under load one entry carries
//! thousands of commands, so the applied tail a group keeps is bounded in entries *and* in
//! bytes.

use std::collections::VecDeque;

use concord_storage::raft::prelude::Entry;

/// What an entry holds in memory beyond its fixed fields.
pub(crate) fn entry_payload_bytes(entry: &Entry) -> u64 {
    (entry.data.len() + entry.context.len()) as u64
}

/// How much applied log a group keeps behind its compaction point.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LogKeep {
    /// Applied entries kept (compaction waits until as many more can go).
    pub entries: u64,
    /// Bytes of applied entries kept (compaction starts when twice as many are held).
    pub bytes: u64,
}

/// Marks [`EntrySizes`] places within the bytes a group keeps: the more, the closer a
/// compaction cuts to `LogKeep::bytes`, and the more often a busy group writes a mark.
const MARKS_PER_KEPT_BYTES: u64 = 16;

impl LogKeep {
    /// The step between two marks of a group's [`EntrySizes`] under this bound.
    pub(crate) fn size_step_bytes(&self) -> u64 {
        self.bytes / MARKS_PER_KEPT_BYTES
    }
}

/// The payload sizes of a group's entries appended since the worker started, counted in runs:
/// a mark at the first entry of each run of consecutive entries, a new run once the one
/// before holds `step_bytes`. A busy group of a node with thousands writes a mark every few
/// rounds instead of an element every round — each such write lands on memory the caches
/// dropped since the group's last round. Byte counts are exact from mark to mark and within
/// one run elsewhere (the compaction rule allows for it). Entries already in the log at start
/// are not counted: the entry bound compacts them.
#[derive(Debug, Default)]
pub(crate) struct EntrySizes {
    /// `(index, bytes of the counted entries before it)`, oldest first; the first is the oldest
    /// counted entry.
    marks: VecDeque<(u64, u64)>,
    /// Bytes a run holds at least before the next entry starts another (0: every entry is a
    /// run of its own, and every count exact).
    step_bytes: u64,
    /// The index of the last counted entry, when `marks` has any. This and `run_before` are
    /// kept beside the marks so that an append (every round of a busy group) reads none of
    /// them.
    last: u64,
    /// The bytes before the last mark (when there is one).
    run_before: u64,
    /// Bytes of all the counted entries.
    total: u64,
}

impl EntrySizes {
    /// Counts in runs of at least `step_bytes` (see [`LogKeep::size_step_bytes`]).
    pub(crate) fn new(step_bytes: u64) -> Self {
        EntrySizes {
            step_bytes,
            ..EntrySizes::default()
        }
    }

    /// Records appended entries as `(index, payload bytes)`, consecutive. An append at an
    /// index already recorded replaces it and everything after it, as the log does.
    pub(crate) fn appended(&mut self, entries: impl IntoIterator<Item = (u64, u64)>) {
        for (index, bytes) in entries {
            if !self.marks.is_empty() && self.last >= index {
                self.forget_from(index);
            }
            if self.marks.is_empty() || self.last + 1 != index {
                // Nothing known, or not contiguous (cannot happen with raft's appends): start
                // counting afresh.
                self.marks.clear();
                self.total = 0;
            }
            if self.marks.is_empty() || self.total - self.run_before >= self.step_bytes {
                self.marks.push_back((index, self.total));
                self.run_before = self.total;
            }
            self.last = index;
            self.total += bytes;
        }
    }

    /// A new leader's entries replace the counted ones from `index` on: their marks go, and so
    /// does the mark of a run that `index` cuts into (its bytes are no longer known), so the
    /// count undercounts by at most one run.
    fn forget_from(&mut self, index: u64) {
        let mut cut_at_a_mark = false;
        while let Some(&(mark, before)) = self.marks.back()
            && mark >= index
        {
            self.marks.pop_back();
            self.total = before;
            cut_at_a_mark = mark == index;
        }
        if !cut_at_a_mark && let Some((_, before)) = self.marks.pop_back() {
            self.total = before;
        }
        self.run_before = self.marks.back().map_or(0, |&(_, before)| before);
        self.last = index.saturating_sub(1);
    }

    /// Forgets the entries below `compact_index` (the mark of the run that holds it stays).
    pub(crate) fn compacted(&mut self, compact_index: u64) {
        while self.marks.len() >= 2 && self.marks[1].0 <= compact_index {
            self.marks.pop_front();
        }
    }

    /// Counted bytes before `index`: exact at a mark and past the last entry, the bytes before
    /// the run holding `index` elsewhere.
    fn before(&self, index: u64) -> u64 {
        let Some(&(_, first_before)) = self.marks.front() else {
            return 0;
        };
        if index > self.last {
            return self.total;
        }
        match self.marks.partition_point(|&(mark, _)| mark <= index) {
            0 => first_before,
            runs => self.marks[runs - 1].1,
        }
    }

    /// Bytes of the known entries in `from..=through`.
    fn bytes(&self, from: u64, through: u64) -> u64 {
        if from > through {
            return 0;
        }
        self.before(through + 1) - self.before(from)
    }

    /// The lowest mark from which the known entries through `through` take at most `budget`
    /// bytes (`through + 1` if no mark at or below `through` does, as when the entry at
    /// `through` alone exceeds it).
    fn lowest_start_within(&self, through: u64, budget: u64) -> u64 {
        let Some(&(front, _)) = self.marks.front() else {
            return 0;
        };
        if through < front {
            return front;
        }
        let end = self.before(through + 1);
        let position = self
            .marks
            .partition_point(|&(mark, before)| mark <= through && end - before > budget);
        match self.marks.get(position) {
            Some(&(mark, _)) if mark <= through => mark,
            _ => through + 1,
        }
    }
}

/// The index to compact a group's log to (entries below it go), or `None` if not worth it yet.
///
/// `bound` is the highest index that may go: the state's durable applied index (a restart
/// replays from there), and on a raft leader no more than every voter has replicated. Of the
/// applied entries up to `bound`, `keep.entries` stay, and compaction waits until as many can
/// go, so its cost is spread over that many; and once the kept entries hold more than twice
/// `keep.bytes`, they are cut to `keep.bytes` (as `sizes` counts them: within one of its runs)
/// — never past `bound` itself, which stays.
pub(crate) fn compact_index(
    bound: u64,
    first_index: u64,
    keep: LogKeep,
    sizes: &EntrySizes,
) -> Option<u64> {
    let by_count = (bound + 1).saturating_sub(keep.entries);
    let mut target = (by_count >= first_index + keep.entries).then_some(by_count);
    if sizes.bytes(first_index, bound) > keep.bytes.saturating_mul(2) {
        let by_bytes = sizes.lowest_start_within(bound, keep.bytes).min(bound);
        if by_bytes > first_index {
            target = Some(target.map_or(by_bytes, |by_count| by_count.max(by_bytes)));
        }
    }
    target
}

#[cfg(test)]
mod tests {
    use super::*;

    const BY_COUNT: LogKeep = LogKeep {
        entries: 4,
        bytes: u64::MAX / 4,
    };

    #[test]
    fn keeps_a_tail_and_waits_for_a_chunk_worth_compacting() {
        let none = EntrySizes::default();
        // Log from 1, bound 10, keep 4: entries 1..=6 go, 7..=10 stay.
        assert_eq!(compact_index(10, 1, BY_COUNT, &none), Some(7));
        assert_eq!(compact_index(7, 1, BY_COUNT, &none), None); // 4 < 1 + 4: not yet.
        assert_eq!(compact_index(8, 1, BY_COUNT, &none), Some(5));
        // Already compacted to 7: the next chunk needs bound 14.
        assert_eq!(compact_index(13, 7, BY_COUNT, &none), None);
        assert_eq!(compact_index(14, 7, BY_COUNT, &none), Some(11));
        assert_eq!(compact_index(0, 1, BY_COUNT, &none), None);
    }

    #[test]
    fn large_entries_are_compacted_by_bytes_long_before_the_entry_count() {
        let keep = LogKeep {
            entries: 1000,
            bytes: 300,
        };
        let mut sizes = EntrySizes::default();
        sizes.appended((1..=6).map(|index| (index, 100)));
        // 600 bytes through 6: not more than twice 300 yet.
        assert_eq!(compact_index(6, 1, keep, &sizes), None);
        sizes.appended([(7, 100)]);
        // 700 > 600: keep 300 bytes through 7, that is entries 5..=7.
        assert_eq!(compact_index(7, 1, keep, &sizes), Some(5));
        sizes.compacted(5);
        assert_eq!(compact_index(7, 5, keep, &sizes), None);
        // Only what the bound allows: entries past it are not applied yet.
        sizes.appended((8..=20).map(|index| (index, 100)));
        assert_eq!(compact_index(9, 5, keep, &sizes), None); // 500 bytes in 5..=9.
        assert_eq!(compact_index(12, 5, keep, &sizes), Some(10));
        // One entry larger than the budget: everything before it goes, it stays.
        sizes.compacted(10);
        sizes.appended([(21, 5000)]);
        assert_eq!(compact_index(21, 10, keep, &sizes), Some(21));
    }

    #[test]
    fn a_replaced_suffix_is_counted_once() {
        let mut sizes = EntrySizes::default();
        sizes.appended((1..=5).map(|index| (index, 10)));
        // A new leader's entries replace 4 and 5.
        sizes.appended([(4, 1000), (5, 1000), (6, 1000)]);
        assert_eq!(sizes.bytes(1, 6), 3030);
        assert_eq!(sizes.bytes(1, 3), 30);
        assert_eq!(sizes.lowest_start_within(6, 2000), 5);
        assert_eq!(sizes.lowest_start_within(6, 999), 7);
        // Sizes of entries from before the worker started are unknown: not counted.
        assert_eq!(sizes.bytes(0, 2), 20);
        sizes.compacted(3);
        assert_eq!(sizes.bytes(1, 6), 3010);
    }

    #[test]
    fn counted_in_runs_the_bytes_are_exact_at_marks_and_within_a_run_elsewhere() {
        // Runs of at least 250 bytes: entries of 100 bytes start a run every third entry.
        let mut sizes = EntrySizes::new(250);
        sizes.appended((1..=10).map(|index| (index, 100)));
        assert_eq!(sizes.marks, [(1, 0), (4, 300), (7, 600), (10, 900)]);
        assert_eq!(sizes.bytes(1, 10), 1000);
        assert_eq!(sizes.bytes(4, 9), 600);
        // Inside a run, the bytes before the run's mark: 5..=9 counts as 4..=9.
        assert_eq!(sizes.bytes(5, 9), 600);
        // 1000 bytes through 10, keep 400: the run from 7 (400 bytes) is the lowest that fits.
        assert_eq!(sizes.lowest_start_within(10, 400), 7);
        assert_eq!(sizes.lowest_start_within(10, 399), 10);
        let keep = LogKeep {
            entries: 1000,
            bytes: 400,
        };
        assert_eq!(compact_index(10, 1, keep, &sizes), Some(7));
        sizes.compacted(8);
        assert_eq!(sizes.marks, [(7, 600), (10, 900)]);
        // A new leader replaces 9 and 10: 10's mark goes, and so does the run from 7 that 9
        // cuts into; nothing counted is left, so the count starts afresh at 9.
        sizes.appended([(9, 50), (10, 50)]);
        assert_eq!(sizes.marks, [(9, 0)]);
        assert_eq!(sizes.bytes(9, 10), 100);
        // Cut into the run from 7 with runs before it: 7 is counted no more, 8 starts a run.
        let mut sizes = EntrySizes::new(250);
        sizes.appended((1..=10).map(|index| (index, 100)));
        sizes.appended([(8, 1000)]);
        assert_eq!(sizes.marks, [(1, 0), (4, 300), (8, 600)]);
        assert_eq!(sizes.bytes(1, 8), 1600);
    }
}
