//! A leader's lease: how long it may serve reads without asking a quorum.
//!
//! With check-quorum, a follower that heard from its leader votes for no other node for a
//! whole election timeout (raft-rs ignores vote requests meanwhile). So once a quorum answered
//! a heartbeat the leader sent at time `t`, no other leader can exist before `t` plus the
//! election timeout by the followers' clocks. The lease ends earlier, at `t` plus nine tenths
//! of it: clocks may run at rates up to 10% apart. Messages are assumed to take less than the
//! lease to arrive. Times are the *send* times of the heartbeats answered, never the time the
//! answers arrived.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::NodeId;

/// Heartbeat send times kept per peer while unanswered.
const MAX_UNANSWERED: usize = 64;

/// What a leader knows of its lease.
pub(crate) struct Lease {
    duration: Duration,
    /// Per peer, the send times of heartbeats not answered yet, oldest first. Answers come in
    /// order; one answering a heartbeat whose record was dropped is credited to an earlier
    /// send time, which only shortens the lease.
    unanswered: HashMap<NodeId, VecDeque<Instant>>,
    /// Per peer, the send time of the latest heartbeat it answered.
    answered: HashMap<NodeId, Instant>,
}

impl Lease {
    /// A lease of nine tenths of `election_timeout`.
    pub(crate) fn new(election_timeout: Duration) -> Self {
        Lease {
            duration: election_timeout * 9 / 10,
            unanswered: HashMap::new(),
            answered: HashMap::new(),
        }
    }

    /// Forgets everything: a new term, or this node no longer leads.
    pub(crate) fn reset(&mut self) {
        self.unanswered.clear();
        self.answered.clear();
    }

    /// A heartbeat to `to` leaves at `at`.
    pub(crate) fn heartbeat_sent(&mut self, to: NodeId, at: Instant) {
        let sent = self.unanswered.entry(to).or_default();
        if sent.len() == MAX_UNANSWERED {
            sent.pop_front();
        }
        sent.push_back(at);
    }

    /// `from` answered a heartbeat of this term; returns when that heartbeat left.
    pub(crate) fn heartbeat_answered(&mut self, from: NodeId) -> Option<Instant> {
        let sent_at = self
            .unanswered
            .get_mut(&from)
            .and_then(VecDeque::pop_front)?;
        let answered = self.answered.entry(from).or_insert(sent_at);
        *answered = (*answered).max(sent_at);
        Some(sent_at)
    }

    /// Whether the lease of leader `me` over `voters` still holds at `now`.
    pub(crate) fn holds(&self, me: NodeId, voters: &[NodeId], now: Instant) -> bool {
        if voters.len() <= 1 {
            return true;
        }
        let mut times: Vec<Instant> = voters
            .iter()
            .filter_map(|&voter| {
                if voter == me {
                    Some(now)
                } else {
                    self.answered.get(&voter).copied()
                }
            })
            .collect();
        let quorum = voters.len() / 2 + 1;
        if times.len() < quorum {
            return false;
        }
        times.sort_unstable_by(|a, b| b.cmp(a));
        times[quorum - 1] + self.duration > now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quorum_answering_recent_heartbeats_holds_the_lease() {
        let start = Instant::now();
        let mut lease = Lease::new(Duration::from_millis(1000));
        assert!(!lease.holds(1, &[1, 2, 3], start), "no answer yet");
        lease.heartbeat_sent(2, start);
        lease.heartbeat_sent(3, start);
        lease.heartbeat_answered(3);
        assert!(lease.holds(1, &[1, 2, 3], start + Duration::from_millis(899)));
        // Nine tenths of the election timeout after the heartbeat left, it is gone.
        assert!(!lease.holds(1, &[1, 2, 3], start + Duration::from_millis(900)));
        // A single voter always holds it.
        assert!(Lease::new(Duration::from_secs(1)).holds(1, &[1], start));
    }

    #[test]
    fn answers_count_from_when_the_heartbeat_left_not_when_they_arrive() {
        let start = Instant::now();
        let mut lease = Lease::new(Duration::from_millis(1000));
        lease.heartbeat_sent(2, start);
        lease.heartbeat_sent(2, start + Duration::from_millis(500));
        // The first answer is for the first heartbeat, whenever it arrives.
        lease.heartbeat_answered(2);
        assert!(!lease.holds(1, &[1, 2, 3], start + Duration::from_millis(950)));
        lease.heartbeat_answered(2);
        assert!(lease.holds(1, &[1, 2, 3], start + Duration::from_millis(950)));
        // An answer nobody asked for credits nothing; a reset forgets all.
        lease.heartbeat_answered(3);
        lease.reset();
        assert!(!lease.holds(1, &[1, 2, 3], start + Duration::from_millis(950)));
    }

    #[test]
    fn five_voters_need_two_answers() {
        let start = Instant::now();
        let mut lease = Lease::new(Duration::from_millis(1000));
        for peer in 2..=5 {
            lease.heartbeat_sent(peer, start);
        }
        lease.heartbeat_answered(4);
        assert!(!lease.holds(1, &[1, 2, 3, 4, 5], start));
        lease.heartbeat_answered(5);
        assert!(lease.holds(1, &[1, 2, 3, 4, 5], start));
    }
}
