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

/// The payload sizes of a group's entries appended since the worker started, contiguous,
/// oldest first. Entries already in the log at start are not counted: the entry bound
/// compacts them.
#[derive(Debug, Default)]
pub(crate) struct EntrySizes {
    /// `(index, bytes of the entries before it)`, counted from the oldest known entry.
    before: VecDeque<(u64, u64)>,
    /// The index of the last entry in `before`, when it has any. Kept beside the deque so that
    /// an append (every round of a busy group) writes to its buffer without reading it.
    last: u64,
    /// Bytes of all the entries in `before`.
    total: u64,
}

impl EntrySizes {
    /// Records appended entries as `(index, payload bytes)`, consecutive. An append at an
    /// index already recorded replaces it and everything after it, as the log does.
    pub(crate) fn appended(&mut self, entries: impl IntoIterator<Item = (u64, u64)>) {
        for (index, bytes) in entries {
            if !self.before.is_empty() && self.last >= index {
                while let Some(&(last, before)) = self.before.back()
                    && last >= index
                {
                    self.before.pop_back();
                    self.total = before;
                }
                self.last = self.before.back().map_or(0, |&(last, _)| last);
            }
            if self.before.is_empty() || self.last + 1 != index {
                // Nothing known, or not contiguous (cannot happen with raft's appends): start
                // counting afresh.
                self.before.clear();
                self.total = 0;
            }
            self.before.push_back((index, self.total));
            self.last = index;
            self.total += bytes;
        }
    }

    /// Forgets the entries below `compact_index`.
    pub(crate) fn compacted(&mut self, compact_index: u64) {
        while self
            .before
            .front()
            .is_some_and(|&(index, _)| index < compact_index)
        {
            self.before.pop_front();
        }
    }

    /// Counted bytes before `index` (which lies within the known entries or just past them).
    fn before(&self, index: u64) -> u64 {
        let Some(&(front, _)) = self.before.front() else {
            return 0;
        };
        match self.before.get((index.saturating_sub(front)) as usize) {
            Some(&(_, before)) if index >= front => before,
            _ if index < front => self.before[0].1,
            _ => self.total,
        }
    }

    /// Bytes of the known entries in `from..=through`.
    fn bytes(&self, from: u64, through: u64) -> u64 {
        if from > through {
            return 0;
        }
        self.before(through + 1) - self.before(from)
    }

    /// The lowest index from which the known entries through `through` take at most
    /// `budget` bytes (`through + 1` if the entry at `through` alone exceeds it).
    fn lowest_start_within(&self, through: u64, budget: u64) -> u64 {
        let Some(&(front, _)) = self.before.front() else {
            return 0;
        };
        if through < front {
            return front;
        }
        let end = self.before(through + 1);
        let position = self
            .before
            .partition_point(|&(index, before)| index <= through && end - before > budget);
        front + position as u64
    }
}

/// The index to compact a group's log to (entries below it go), or `None` if not worth it yet.
///
/// `bound` is the highest index that may go: the state's durable applied index (a restart
/// replays from there), and on a raft leader no more than every voter has replicated. Of the
/// applied entries up to `bound`, `keep.entries` stay, and compaction waits until as many can
/// go, so its cost is spread over that many; and once the kept entries hold more than twice
/// `keep.bytes`, they are cut to `keep.bytes` — never past `bound` itself, which stays.
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
}
