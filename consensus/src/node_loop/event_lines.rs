//! Lines about what happens to many groups at once — leaderships moving when a member dies or
//! returns, snapshots a member that lost its data installs, or sends, a membership change every
//! group applies, groups of a member that lost its data waiting for the others' answers —
//! counted group by group
//! and written at most once per interval, rather than a line per group: a node of thousands
//! of groups would write thousands of lines per event. raft-rs's own line per group for every
//! step of an election is written at debug (`raft_node/logger.rs`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use concord_storage::GroupId;

use crate::NodeId;
use crate::membership::GroupMembers;

/// At most one line of a kind per this long.
pub(crate) const LINE_INTERVAL: Duration = Duration::from_secs(1);

/// Counts that one line reports.
pub(crate) trait LineCounts: Default {
    fn add(&mut self, other: &Self);
    fn is_empty(&self) -> bool;
}

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
}

impl LineCounts for LeadershipChanges {
    fn add(&mut self, other: &Self) {
        self.gained += other.gained;
        self.lost += other.lost;
    }

    fn is_empty(&self) -> bool {
        self.gained == 0 && self.lost == 0
    }
}

/// Snapshots installed, or not, by one node, or sent by one node to its peers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SnapshotCounts {
    /// Installed, or sent whole.
    pub(crate) done: u64,
    /// Failed (a broken transfer or install, to ask again), or a send that broke.
    pub(crate) failed: u64,
    /// The bytes of the states sent (a sender's count).
    pub(crate) bytes: u64,
    /// What went wrong with the first of the `failed`: the line names one cause, not one per
    /// group (a member that dies while thousands of groups fetch from it fails them all).
    pub(crate) first_failure: Option<String>,
}

impl SnapshotCounts {
    /// One snapshot installed, or sent whole (`bytes`: its size, for a sender).
    pub(crate) fn done(bytes: u64) -> Self {
        SnapshotCounts {
            done: 1,
            bytes,
            ..SnapshotCounts::default()
        }
    }

    /// One snapshot that failed, for the reason given.
    pub(crate) fn failed(reason: String) -> Self {
        SnapshotCounts {
            failed: 1,
            first_failure: Some(reason),
            ..SnapshotCounts::default()
        }
    }
}

impl LineCounts for SnapshotCounts {
    fn add(&mut self, other: &Self) {
        self.done += other.done;
        self.failed += other.failed;
        self.bytes += other.bytes;
        if self.first_failure.is_none() {
            self.first_failure.clone_from(&other.first_failure);
        }
    }

    fn is_empty(&self) -> bool {
        self.done == 0 && self.failed == 0
    }
}

/// Configuration changes a worker's groups applied, and the members after the last of them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ConfigChanges {
    pub(crate) changed: u64,
    pub(crate) members: GroupMembers,
}

impl LineCounts for ConfigChanges {
    fn add(&mut self, other: &Self) {
        self.changed += other.changed;
        if other.changed > 0 {
            self.members.clone_from(&other.members);
        }
    }

    fn is_empty(&self) -> bool {
        self.changed == 0
    }
}

/// Groups of a member that lost its data waiting, at one tick, for the other members to say
/// where each stands, and the members that never answered one of them. Unlike the counts
/// above, a line of them says how things stand now, not what happened since the last line:
/// it is written from one tick's waits, at most once per [`LinePace`]'s interval.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CatchUpWaits {
    pub(crate) groups: u64,
    pub(crate) first_group: Option<GroupId>,
    pub(crate) unanswered: BTreeSet<NodeId>,
}

impl CatchUpWaits {
    /// Counts `group`, waiting for `unanswered`.
    pub(crate) fn add(&mut self, group: GroupId, unanswered: &[NodeId]) {
        self.groups += 1;
        self.first_group.get_or_insert(group);
        self.unanswered.extend(unanswered);
    }
}

/// When a line may be written again: at once the first time, then at most once per interval.
/// A line of how things stand now asks it alone; an [`EventLine`] asks it only when it has
/// counts to write.
pub(crate) struct LinePace {
    last_line: Option<Instant>,
    interval: Duration,
}

impl LinePace {
    pub(crate) fn with_interval(interval: Duration) -> Self {
        LinePace {
            last_line: None,
            interval,
        }
    }

    /// Whether a line is due at `now`; `true` starts a new interval.
    pub(crate) fn due(&mut self, now: Instant) -> bool {
        let due = self.may_write(now);
        if due {
            self.written(now);
        }
        due
    }

    /// Whether a line may be written at `now`: none yet, or the last an interval old.
    fn may_write(&self, now: Instant) -> bool {
        (self.last_line).is_none_or(|last| now.saturating_duration_since(last) >= self.interval)
    }

    /// A line was written at `now`: the next waits an interval.
    fn written(&mut self, now: Instant) {
        self.last_line = Some(now);
    }
}

/// The counts of one kind of line since the last, and when that was.
pub(crate) struct EventLine<C> {
    unreported: C,
    last_added: Option<Instant>,
    /// At most one line per interval.
    pace: LinePace,
}

impl<C: LineCounts> EventLine<C> {
    /// A line written at most once per [`LINE_INTERVAL`].
    pub(crate) fn new() -> Self {
        EventLine::with_interval(LINE_INTERVAL)
    }

    /// A line written at most once per `interval`.
    pub(crate) fn with_interval(interval: Duration) -> Self {
        EventLine {
            unreported: C::default(),
            last_added: None,
            pace: LinePace::with_interval(interval),
        }
    }

    /// Adds `counts` at `now` (nothing, and no change to when the last were added, if they are
    /// empty: a refused snapshot request is not news).
    pub(crate) fn add(&mut self, counts: &C, now: Instant) {
        if counts.is_empty() {
            return;
        }
        self.unreported.add(counts);
        self.last_added = Some(now);
    }

    /// The counts to write at `now`, if there are any and the last line is an interval old
    /// (the first line is due at once). Taking them starts a new interval.
    pub(crate) fn due(&mut self, now: Instant) -> Option<C> {
        if self.pace.may_write(now) {
            self.take(now)
        } else {
            None
        }
    }

    /// The counts left to write at `now`, if nothing was added for an interval: the events
    /// are over, and what is left would otherwise wait for the next of them. For a caller
    /// that is not woken on a clock, an interval after its last `add`.
    pub(crate) fn due_when_quiet(&mut self, now: Instant) -> Option<C> {
        let quiet = (self.last_added)
            .is_some_and(|last| now.saturating_duration_since(last) >= self.pace.interval);
        if quiet { self.take(now) } else { None }
    }

    fn take(&mut self, now: Instant) -> Option<C> {
        if self.unreported.is_empty() {
            return None;
        }
        self.pace.written(now);
        Some(std::mem::take(&mut self.unreported))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_are_reported_at_most_once_per_interval_and_each_once() {
        let mut line = EventLine::new();
        let start = Instant::now();
        assert_eq!(line.due(start), None, "nothing changed");
        let mut round = LeadershipChanges::default();
        round.note(false, true);
        round.note(false, true);
        round.note(true, false);
        round.note(true, true);
        round.note(false, false);
        line.add(&round, start);
        let first = LeadershipChanges { gained: 2, lost: 1 };
        assert_eq!(
            line.due(start),
            Some(first),
            "the first line is due at once"
        );
        let soon = start + LINE_INTERVAL / 2;
        line.add(&LeadershipChanges { gained: 0, lost: 5 }, soon);
        assert_eq!(line.due(soon), None, "within the interval");
        line.add(&LeadershipChanges { gained: 1, lost: 0 }, soon);
        let later = start + LINE_INTERVAL;
        let second = LeadershipChanges { gained: 1, lost: 5 };
        assert_eq!(line.due(later), Some(second), "both rounds' changes, once");
        assert_eq!(line.due(later + LINE_INTERVAL), None);
    }

    #[test]
    fn a_line_of_a_longer_interval_counts_what_came_within_it() {
        let interval = 10 * LINE_INTERVAL;
        let mut line = EventLine::with_interval(interval);
        let start = Instant::now();
        let one = LeadershipChanges { gained: 1, lost: 0 };
        line.add(&one, start);
        assert_eq!(line.due(start), Some(one));
        for second in 1..10 {
            let now = start + LINE_INTERVAL * second;
            line.add(&one, now);
            assert_eq!(line.due(now), None, "{second} s in");
        }
        line.add(&one, start + interval);
        let ten = LeadershipChanges {
            gained: 10,
            lost: 0,
        };
        assert_eq!(line.due(start + interval), Some(ten));
    }

    #[test]
    fn what_is_left_is_written_once_nothing_was_added_for_an_interval() {
        let mut line = EventLine::new();
        let start = Instant::now();
        let sent = SnapshotCounts::done(100);
        line.add(&sent, start);
        assert_eq!(line.due(start), Some(sent.clone()));
        let soon = start + LINE_INTERVAL / 10;
        line.add(&sent, soon);
        line.add(&sent, soon);
        assert_eq!(line.due(soon), None, "within the interval");
        assert_eq!(line.due_when_quiet(soon), None, "just added");
        let just_before = soon + LINE_INTERVAL - Duration::from_millis(1);
        assert_eq!(
            line.due_when_quiet(just_before),
            None,
            "not quiet for an interval"
        );
        let both = SnapshotCounts {
            done: 2,
            bytes: 200,
            ..SnapshotCounts::default()
        };
        assert_eq!(line.due_when_quiet(soon + LINE_INTERVAL), Some(both));
        assert_eq!(
            line.due_when_quiet(soon + 2 * LINE_INTERVAL),
            None,
            "written once"
        );
        // Nothing added is not news: it does not put off what is left.
        let later = soon + 3 * LINE_INTERVAL;
        line.add(&sent, later);
        line.add(&SnapshotCounts::default(), later + LINE_INTERVAL / 2);
        assert_eq!(line.due_when_quiet(later + LINE_INTERVAL), Some(sent));
    }

    #[test]
    fn a_snapshot_line_counts_every_failure_and_names_the_first() {
        let mut line = EventLine::new();
        let start = Instant::now();
        line.add(&SnapshotCounts::done(0), start);
        line.add(&SnapshotCounts::failed("group 3: reset".into()), start);
        line.add(&SnapshotCounts::failed("group 4: reset".into()), start);
        let written = line.due(start).expect("a line");
        assert_eq!((written.done, written.failed), (1, 2));
        assert_eq!(written.first_failure.as_deref(), Some("group 3: reset"));
        let later = start + LINE_INTERVAL;
        line.add(&SnapshotCounts::failed("group 9: refused".into()), later);
        let next = line.due(later).expect("a line");
        assert_eq!(
            next.first_failure.as_deref(),
            Some("group 9: refused"),
            "each line names a failure of its own interval"
        );
        line.add(&SnapshotCounts::done(0), later + LINE_INTERVAL);
        let quiet = line.due(later + LINE_INTERVAL).expect("a line");
        assert_eq!(quiet.first_failure, None, "no failure in this interval");
    }

    #[test]
    fn a_waiting_line_counts_groups_names_every_silent_member_and_waits_its_interval() {
        let mut waits = CatchUpWaits::default();
        waits.add(4, &[3]);
        waits.add(9, &[2, 3]);
        assert_eq!(waits.groups, 2);
        assert_eq!(waits.first_group, Some(4));
        assert_eq!(waits.unanswered, BTreeSet::from([2, 3]));

        let mut line = LinePace::with_interval(10 * LINE_INTERVAL);
        let start = Instant::now();
        assert!(line.due(start), "the first line is due at once");
        for second in 1..10 {
            assert!(!line.due(start + LINE_INTERVAL * second), "{second} s in");
        }
        assert!(line.due(start + 10 * LINE_INTERVAL));
        assert!(!line.due(start + 10 * LINE_INTERVAL));
    }

    #[test]
    fn a_configuration_line_counts_every_change_and_shows_the_last_members() {
        let mut line = EventLine::new();
        let start = Instant::now();
        let members = |voters: &[u64]| {
            let mut conf_state = concord_storage::raft::prelude::ConfState::default();
            conf_state.set_voters(voters.to_vec());
            GroupMembers::from_conf_state(&conf_state)
        };
        for voters in [&[1, 2, 3][..], &[1, 2, 3, 4]] {
            let change = ConfigChanges {
                changed: 1,
                members: members(voters),
            };
            line.add(&change, start);
        }
        let written = line.due(start).expect("a line");
        assert_eq!(written.changed, 2);
        assert_eq!(written.members, members(&[1, 2, 3, 4]));
    }
}
