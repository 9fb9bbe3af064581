//! [`TermRuns`]: the terms of a range of consecutive log entries, kept as runs of one term.
//!
//! raft-rs asks its storage for the term of recent entries several times per round. Terms
//! change only at elections, so a group's persisted log is nearly always one or two runs: kept
//! this way, answering costs no memory per entry, and the newest run (the one asked about
//! almost every time) sits inline, beside the rest of the group's storage adapter, rather
//! than at the far end of a buffer of its own.

use std::collections::VecDeque;

/// Older runs kept at most; past this the oldest are forgotten (their terms are then read
/// from the log store). Terms change at elections only, so this is rarely reached.
const MAX_OLDER_RUNS: usize = 1024;

/// The terms of the entries `known_from..=last`, as runs `(first index, term)`.
#[derive(Clone, Debug)]
pub(crate) struct TermRuns {
    /// The lowest index whose term is known. Nothing is known while `last < known_from`.
    known_from: u64,
    /// The highest index whose term is known.
    last: u64,
    /// The newest run: its first index and its term; it runs through `last`.
    newest: (u64, u64),
    /// The runs before `newest`, oldest first; each runs up to the next one's first index.
    older: VecDeque<(u64, u64)>,
}

impl Default for TermRuns {
    fn default() -> Self {
        TermRuns {
            known_from: 1,
            last: 0,
            newest: (0, 0),
            older: VecDeque::new(),
        }
    }
}

impl TermRuns {
    /// `true` if no term is known.
    pub(crate) fn is_empty(&self) -> bool {
        self.last < self.known_from
    }

    /// The highest index whose term is known, if any.
    pub(crate) fn last_index(&self) -> Option<u64> {
        (!self.is_empty()).then_some(self.last)
    }

    /// The term of the entry at `index`, if known.
    pub(crate) fn term(&self, index: u64) -> Option<u64> {
        if self.is_empty() || index < self.known_from || index > self.last {
            return None;
        }
        if index >= self.newest.0 {
            return Some(self.newest.1);
        }
        // The last older run that starts at or before `index`; the first one always does
        // (it starts at or before `known_from`).
        let after = self.older.partition_point(|&(first, _)| first <= index);
        after.checked_sub(1).map(|run| self.older[run].1)
    }

    /// Records the entry at `index` with `term`, the log's new last entry: what was known
    /// from `index` on is replaced (an append that conflicts replaces the log's suffix), and
    /// an index past the next one starts the knowledge afresh.
    pub(crate) fn push(&mut self, index: u64, term: u64) {
        self.truncate_from(index);
        if self.is_empty() || self.last + 1 != index {
            *self = TermRuns {
                known_from: index,
                last: index,
                newest: (index, term),
                older: VecDeque::new(),
            };
            return;
        }
        if term != self.newest.1 {
            self.older.push_back(self.newest);
            self.newest = (index, term);
            self.forget_beyond_bound();
        }
        self.last = index;
    }

    /// Records the entries `other` knows, appended after (or over a suffix of) these.
    pub(crate) fn extend(&mut self, other: &TermRuns) {
        if other.is_empty() {
            return;
        }
        let mut runs = other
            .older
            .iter()
            .chain(std::iter::once(&other.newest))
            .peekable();
        // The first run may start before what `other` knows.
        let mut start = other.known_from;
        while let Some(&(_, term)) = runs.next() {
            let end = runs.peek().map_or(other.last, |&&(next, _)| next - 1);
            self.push(start, term);
            self.last = end;
            start = end + 1;
        }
    }

    /// Forgets the terms of the entries from `index` on.
    pub(crate) fn truncate_from(&mut self, index: u64) {
        if self.is_empty() || index > self.last {
            return;
        }
        if index <= self.known_from {
            *self = TermRuns::default();
            return;
        }
        self.last = index - 1;
        while self.newest.0 > self.last {
            // Runs before `newest` reach back to `known_from`, which is at most `last`.
            match self.older.pop_back() {
                Some(run) => self.newest = run,
                None => break,
            }
        }
    }

    /// Forgets the terms of the entries below `index`.
    pub(crate) fn forget_below(&mut self, index: u64) {
        if self.is_empty() || index <= self.known_from {
            return;
        }
        if index > self.last {
            *self = TermRuns::default();
            return;
        }
        self.known_from = index;
        self.drop_runs_before_known();
    }

    /// Drops the older runs wholly below `known_from`.
    fn drop_runs_before_known(&mut self) {
        loop {
            let next_first = self.older.get(1).map_or(self.newest.0, |&(first, _)| first);
            if self.older.is_empty() || next_first > self.known_from {
                break;
            }
            self.older.pop_front();
        }
    }

    /// Keeps at most `MAX_OLDER_RUNS` older runs: the oldest go, and what they covered with
    /// them.
    fn forget_beyond_bound(&mut self) {
        if self.older.len() <= MAX_OLDER_RUNS {
            return;
        }
        self.older.pop_front();
        self.known_from = self
            .older
            .front()
            .map_or(self.newest.0, |&(first, _)| first);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// A per-entry model: what the runs must answer for every index.
    #[derive(Default)]
    struct Model(BTreeMap<u64, u64>);

    impl Model {
        fn push(&mut self, index: u64, term: u64) {
            self.0.retain(|&i, _| i < index);
            if self
                .0
                .keys()
                .next_back()
                .is_some_and(|&last| last + 1 != index)
            {
                self.0.clear();
            }
            self.0.insert(index, term);
        }

        fn forget_below(&mut self, index: u64) {
            if self.0.keys().next_back().is_some_and(|&last| index > last) {
                self.0.clear();
            }
            self.0.retain(|&i, _| i >= index);
        }

        fn truncate_from(&mut self, index: u64) {
            self.0.retain(|&i, _| i < index);
        }
    }

    /// A small deterministic generator, so that a failure replays.
    struct Steps(u64);

    impl Steps {
        fn below(&mut self, bound: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % bound
        }
    }

    fn check(runs: &TermRuns, model: &Model, around: u64) {
        for index in around.saturating_sub(40)..around + 40 {
            assert_eq!(
                runs.term(index),
                model.0.get(&index).copied(),
                "term of {index}"
            );
        }
        assert_eq!(runs.last_index(), model.0.keys().next_back().copied());
    }

    #[test]
    fn runs_answer_as_a_per_entry_record_would() {
        let mut steps = Steps(0x9e37_79b9_7f4a_7c15);
        let (mut runs, mut model) = (TermRuns::default(), Model::default());
        let (mut next, mut term) = (1u64, 1u64);
        for _ in 0..20_000 {
            match steps.below(20) {
                // Appends, sometimes in a new term (a follower catching up appends entries of
                // several terms at once).
                0..=11 => {
                    let mut batch = TermRuns::default();
                    for _ in 0..=steps.below(4) {
                        if steps.below(6) == 0 {
                            term += 1;
                        }
                        batch.push(next, term);
                        model.push(next, term);
                        next += 1;
                    }
                    if steps.below(2) == 0 {
                        runs.extend(&batch);
                    } else {
                        // The same entries one by one.
                        let first = batch.known_from;
                        for index in first..=batch.last {
                            runs.push(index, batch.term(index).unwrap());
                        }
                    }
                }
                // A conflicting append: a new leader's entries replace a suffix.
                12..=13 => {
                    term += 1;
                    next = next.saturating_sub(steps.below(6)).max(1);
                    runs.push(next, term);
                    model.push(next, term);
                    next += 1;
                }
                // Compaction.
                14..=16 => {
                    let below = next.saturating_sub(steps.below(30));
                    runs.forget_below(below);
                    model.forget_below(below);
                }
                // A gap (a snapshot restored the log further on).
                17 => {
                    next += 1 + steps.below(10);
                    runs.push(next, term);
                    model.push(next, term);
                    next += 1;
                }
                // A suffix forgotten.
                _ => {
                    let from = next.saturating_sub(steps.below(5));
                    runs.truncate_from(from);
                    model.truncate_from(from);
                }
            }
            check(&runs, &model, next);
        }
    }

    #[test]
    fn a_term_change_every_entry_keeps_the_newest_runs_only() {
        let mut runs = TermRuns::default();
        let count = MAX_OLDER_RUNS as u64 + 100;
        for index in 1..=count {
            runs.push(index, index);
        }
        assert_eq!(runs.older.len(), MAX_OLDER_RUNS);
        assert_eq!(runs.term(count), Some(count));
        assert_eq!(
            runs.term(count - MAX_OLDER_RUNS as u64),
            Some(count - MAX_OLDER_RUNS as u64)
        );
        // Forgotten, not answered wrongly.
        assert_eq!(runs.term(1), None);
    }

    #[test]
    fn one_term_costs_no_older_runs() {
        let mut runs = TermRuns::default();
        for index in 5..10_000 {
            runs.push(index, 7);
        }
        assert!(runs.older.is_empty());
        assert_eq!(runs.term(4), None);
        assert_eq!(runs.term(5), Some(7));
        assert_eq!(runs.term(9_999), Some(7));
        assert_eq!(runs.term(10_000), None);
    }
}
