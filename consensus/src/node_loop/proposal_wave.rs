//! Proposal waves: a worker's groups propose together, then wait together.
//!
//! Each group keeps at most `max_in_flight_entries` of its own entries on their way to commit,
//! so under load a group's commands gather while its entries are out and the next entry carries
//! them all. Across many groups that rule alone lets every round propose for whichever groups'
//! entries just committed: nearly every round of a leader then carries some group's new entry,
//! every such round's log write syncs, and each follower syncs once per such round too. A wave
//! carries the rule over to the worker: once groups have proposed, no group of the worker
//! proposes while one of them still has as many entries out as it may. Entries proposed
//! together are acknowledged in the same frames and commit in the same round, so the next wave
//! again takes every group that has commands: one sync per wave on the leader and on each
//! follower, as with one group.
//!
//! A wave that has not committed within its limit is given up: a group whose quorum is slow,
//! or a former leader whose entries wait for a new leader's commit, must not stall the worker's
//! other groups. Its groups go on waiting for their own entries; the others start a new wave
//! without them.

use std::time::{Duration, Instant};

use super::position_set::PositionSet;

/// The groups (by position) that proposed since the wave began, and when it began.
pub(super) struct ProposalWave {
    members: PositionSet,
    started: Option<Instant>,
    limit: Duration,
}

impl ProposalWave {
    /// No wave out, for a worker of `capacity` groups; a wave holds the others back for at
    /// most `limit`.
    pub(super) fn new(capacity: usize, limit: Duration) -> ProposalWave {
        ProposalWave {
            members: PositionSet::empty(capacity),
            started: None,
            limit,
        }
    }

    /// `true` while the worker's groups must keep their commands queued: a wave is out and
    /// younger than the limit (an older one is given up). Forgets the members, in the order
    /// they joined, for which `at_limit` (as many entries out as the group may have) is
    /// `false`, up to the first for which it is `true` (a held wave costs one look per call,
    /// not one per member); the wave is over once none is left.
    pub(super) fn holds(&mut self, now: Instant, at_limit: impl Fn(usize) -> bool) -> bool {
        let Some(started) = self.started else {
            return false;
        };
        if now >= started + self.limit {
            self.members.retain(|_| false);
            self.started = None;
            return false;
        }
        let mut held_by_one = false;
        self.members.retain(|position| {
            if held_by_one {
                return true;
            }
            held_by_one = at_limit(position);
            held_by_one
        });
        if self.members.members().is_empty() {
            self.started = None;
        }
        held_by_one
    }

    /// The group at `position` proposed at `now`: it joins the wave (a new one if none is out).
    pub(super) fn joined(&mut self, position: usize, now: Instant) {
        self.members.insert(position);
        self.started.get_or_insert(now);
    }

    /// When the wave out is given up, if one is out.
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.started.map(|started| started + self.limit)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::time::{Duration, Instant};

    use super::ProposalWave;

    #[test]
    fn a_wave_holds_until_its_last_member_committed() {
        let now = Instant::now();
        let mut wave = ProposalWave::new(4, Duration::from_millis(100));
        assert!(!wave.holds(now, |_| true), "no wave out yet");
        wave.joined(1, now);
        wave.joined(3, now);
        let out = RefCell::new(vec![false, true, false, true]);
        let at_limit = |position: usize| out.borrow()[position];
        assert!(wave.holds(now, at_limit));
        let looked = RefCell::new(Vec::new());
        assert!(wave.holds(now, |position| {
            looked.borrow_mut().push(position);
            at_limit(position)
        }));
        assert_eq!(
            *looked.borrow(),
            vec![1],
            "the first member at its limit is enough"
        );
        out.borrow_mut()[1] = false;
        assert!(wave.holds(now, at_limit), "group 3 still waits");
        out.borrow_mut()[3] = false;
        assert!(!wave.holds(now, at_limit));
        assert_eq!(wave.deadline(), None, "the wave is over");
    }

    #[test]
    fn a_wave_past_its_limit_is_given_up_and_the_next_one_starts_afresh() {
        let start = Instant::now();
        let limit = Duration::from_millis(100);
        let mut wave = ProposalWave::new(2, limit);
        wave.joined(0, start);
        assert_eq!(wave.deadline(), Some(start + limit));
        assert!(wave.holds(start + limit / 2, |_| true));
        // Group 0 is stuck: past the limit the wave no longer holds group 1 back.
        assert!(!wave.holds(start + limit, |_| true));
        assert_eq!(wave.deadline(), None);
        // Group 1 proposes: a new wave, without group 0, held by group 1 alone.
        let later = start + limit * 2;
        wave.joined(1, later);
        assert_eq!(wave.deadline(), Some(later + limit));
        assert!(wave.holds(later, |position| position == 1));
        assert!(!wave.holds(later, |position| position == 0));
        assert_eq!(wave.deadline(), None, "group 1 committed: the wave is over");
    }
}
