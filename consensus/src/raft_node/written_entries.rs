//! [`WrittenEntries`]: the entries a group's round writes, kept until raft has read them back.
//!
//! raft-rs hands out committed entries only once they are persisted, and reads them from the
//! storage to do so: for a single voter, and for a follower whose append carried the commit,
//! that read comes right after the write, in `advance_append`. Through the log store each
//! such read is a lookup and a few cold cache lines per group, which thousands of groups with
//! a few entries each pay every round. Clones taken while the round is collected (the
//! entries are in cache then) answer it instead, and are dropped once raft has read them.

use concord_storage::raft::prelude::Entry;

/// Capacity kept between rounds, in entries: a group that once wrote a large batch does not
/// hold its buffer while it writes one entry a round, or sleeps.
const KEPT_CAPACITY_ENTRIES: usize = 16;

/// Clones of the entries of one group's write in flight, answerable once it is durable.
#[derive(Debug, Default)]
pub(crate) struct WrittenEntries {
    /// Consecutive entries, in index order.
    entries: Vec<Entry>,
    /// Whether the write carrying `entries` returned, so that the log store holds them.
    written: bool,
}

impl WrittenEntries {
    /// The round writes `entries` (consecutive), replacing any kept before.
    pub(crate) fn writing(&mut self, entries: &[Entry]) {
        self.forget();
        self.entries.extend_from_slice(entries);
    }

    /// The write carrying the entries passed to [`WrittenEntries::writing`] returned.
    pub(crate) fn written(&mut self) {
        self.written = true;
    }

    /// Drops the entries kept: raft has read what it needed.
    pub(crate) fn forget(&mut self) {
        self.written = false;
        self.entries.clear();
        if self.entries.capacity() > KEPT_CAPACITY_ENTRIES {
            self.entries = Vec::new();
        }
    }

    /// Drops the entries and the buffer: the group falls asleep, and may stay so for long.
    pub(crate) fn release(&mut self) {
        self.written = false;
        self.entries = Vec::new();
    }

    /// Clones of entries `low..high`, if they are all kept and written; `None` sends the
    /// caller to the log store.
    pub(crate) fn slice(&self, low: u64, high: u64) -> Option<Vec<Entry>> {
        let first = self.entries.first()?.index;
        let end = first + self.entries.len() as u64;
        if !self.written || low < first || high > end || low >= high {
            return None;
        }
        Some(self.entries[(low - first) as usize..(high - first) as usize].to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `count` entries of `term` from index `first` on.
    fn entries(first: u64, count: u64, term: u64) -> Vec<Entry> {
        concord_storage::testing::make_entries(1, first..=first + count - 1, term)
    }

    #[test]
    fn entries_are_answered_only_once_their_write_returned() {
        let mut written = WrittenEntries::default();
        written.writing(&entries(5, 3, 2));
        assert_eq!(written.slice(5, 8), None, "not written yet");
        written.written();
        assert_eq!(written.slice(5, 8), Some(entries(5, 3, 2)));
        assert_eq!(written.slice(6, 7), Some(entries(6, 1, 2)));
        written.forget();
        assert_eq!(written.slice(5, 8), None, "forgotten");
    }

    #[test]
    fn a_range_reaching_outside_the_kept_entries_goes_to_the_log_store() {
        let mut written = WrittenEntries::default();
        written.writing(&entries(5, 3, 2));
        written.written();
        assert_eq!(written.slice(4, 8), None);
        assert_eq!(written.slice(5, 9), None);
        assert_eq!(written.slice(6, 6), None);
    }

    #[test]
    fn a_new_write_replaces_the_kept_entries_and_waits_for_its_own_return() {
        let mut written = WrittenEntries::default();
        written.writing(&entries(5, 3, 2));
        written.written();
        // A new leader's entries replace a suffix from index 6.
        written.writing(&entries(6, 2, 3));
        assert_eq!(written.slice(6, 8), None);
        written.written();
        assert_eq!(written.slice(6, 8), Some(entries(6, 2, 3)));
        assert_eq!(written.slice(5, 8), None, "index 5 is not kept any more");
    }

    #[test]
    fn a_large_batch_does_not_keep_its_buffer() {
        let mut written = WrittenEntries::default();
        written.writing(&entries(1, 1000, 1));
        written.forget();
        assert!(written.entries.capacity() <= KEPT_CAPACITY_ENTRIES);
    }

    #[test]
    fn a_released_group_keeps_no_buffer() {
        let mut written = WrittenEntries::default();
        written.writing(&entries(1, 2, 1));
        written.written();
        written.release();
        assert_eq!(written.entries.capacity(), 0);
        assert_eq!(written.slice(1, 3), None);
    }
}
