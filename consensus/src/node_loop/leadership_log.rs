//! One log line per interval for the leaderships a worker's groups gained and lost, in place
//! of raft-rs's line per group for every step of an election (`raft_node/logger.rs` writes
//! those at debug): when a member of a node of thousands of groups dies or returns, thousands
//! of leaderships move at once.

use std::time::{Duration, Instant};

/// At most one line per this long.
const REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// Leaderships gained and lost, counted by one round's replicas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LeadershipChanges {
    pub(crate) gained: u64,
    pub(crate) lost: u64,
}

impl LeadershipChanges {
    /// Counts a group whose leadership went from `was_leader` to `is_leader`.
    pub(crate) fn note(&mut self, was_leader: bool, is_leader: bool) {
        match (was_leader, is_leader) {
            (false, true) => self.gained += 1,
            (true, false) => self.lost += 1,
            _ => {}
        }
    }

    fn is_empty(&self) -> bool {
        self.gained == 0 && self.lost == 0
    }
}

/// The changes since the last line, and when that was.
pub(crate) struct LeadershipLog {
    unreported: LeadershipChanges,
    last_report: Option<Instant>,
}

impl LeadershipLog {
    pub(crate) fn new() -> Self {
        LeadershipLog {
            unreported: LeadershipChanges::default(),
            last_report: None,
        }
    }

    pub(crate) fn add(&mut self, changes: LeadershipChanges) {
        self.unreported.gained += changes.gained;
        self.unreported.lost += changes.lost;
    }

    /// The changes to report at `now`, if there are any and the last line is an interval old
    /// (the first line is due at once); taking them starts a new interval.
    pub(crate) fn due(&mut self, now: Instant) -> Option<LeadershipChanges> {
        if self.unreported.is_empty() {
            return None;
        }
        if (self.last_report)
            .is_some_and(|last| now.saturating_duration_since(last) < REPORT_INTERVAL)
        {
            return None;
        }
        self.last_report = Some(now);
        Some(std::mem::take(&mut self.unreported))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_are_reported_at_most_once_per_interval_and_each_once() {
        let mut log = LeadershipLog::new();
        let start = Instant::now();
        assert_eq!(log.due(start), None, "nothing changed");
        let mut round = LeadershipChanges::default();
        round.note(false, true);
        round.note(false, true);
        round.note(true, false);
        round.note(true, true);
        round.note(false, false);
        log.add(round);
        let first = LeadershipChanges { gained: 2, lost: 1 };
        assert_eq!(log.due(start), Some(first), "the first line is due at once");
        log.add(LeadershipChanges { gained: 0, lost: 5 });
        let soon = start + REPORT_INTERVAL / 2;
        assert_eq!(log.due(soon), None, "within the interval");
        log.add(LeadershipChanges { gained: 1, lost: 0 });
        let later = start + REPORT_INTERVAL;
        let second = LeadershipChanges { gained: 1, lost: 5 };
        assert_eq!(log.due(later), Some(second), "both rounds' changes, once");
        assert_eq!(log.due(later + REPORT_INTERVAL), None);
    }
}
