//! A leader's lease: how long it may serve reads without asking a quorum.
//!
//! With check-quorum, a follower that heard from its leader votes for no other node until it
//! has ticked a whole election timeout's ticks (raft-rs ignores vote requests meanwhile). Its
//! first tick may come at once after the message, so the quiet that is certain is one tick
//! shorter: `election_ticks - 1` tick intervals. So once a quorum answered a heartbeat the
//! leader sent at time `t`, no other leader can exist before `t` plus that quiet window by the
//! followers' clocks. The lease ends earlier, at `t` plus nine tenths of it: clocks may run at
//! rates up to 10% apart. Times are the *send* times of the heartbeats answered, never the
//! time the answers arrived, so how long a message takes only shortens the lease.
//!
//! A member that restarts forgets whom it heard from; `replica.rs` has it hold back its vote
//! for as many ticks after it opens, as if it had just heard from a leader.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use concord_storage::raft::prelude::{Message, MessageType};

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

/// How long a lease lasts: nine tenths of the quiet a follower keeps after a heartbeat
/// (`election_ticks - 1` ticks, module comment). Zero without check-quorum: followers then
/// vote whenever asked, and no lease is safe.
pub(crate) fn lease_duration(
    tick_interval: Duration,
    election_ticks: usize,
    check_quorum: bool,
) -> Duration {
    if !check_quorum {
        return Duration::ZERO;
    }
    let quiet_ticks = u32::try_from(election_ticks.saturating_sub(1)).unwrap_or(u32::MAX);
    tick_interval.saturating_mul(quiet_ticks) * 9 / 10
}

/// `true` for the messages a member keeping its quiet for a lease ignores: a vote or pre-vote
/// request of a later term than `term`, unless it comes of a hand-over the leader asked for
/// (a leader handing over serves no lease reads). raft-rs ignores the same while it heard
/// from a leader within the election timeout.
pub(super) fn holds_vote_back_from(message: &Message, term: u64) -> bool {
    let vote = matches!(
        message.get_msg_type(),
        MessageType::MsgRequestVote | MessageType::MsgRequestPreVote
    );
    vote && message.term > term && message.context.as_ref() != raft::CAMPAIGN_TRANSFER
}

impl Lease {
    /// A lease of `duration` (`lease_duration`).
    pub(crate) fn new(duration: Duration) -> Self {
        Lease {
            duration,
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
        if self.duration.is_zero() {
            return false;
        }
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
    use raft::storage::MemStorage;
    use raft::{RawNode, StateRole};

    /// The defaults' lease: ticks of 100 ms, an election timeout of 10 ticks.
    fn default_lease() -> Lease {
        Lease::new(lease_duration(Duration::from_millis(100), 10, true))
    }

    #[test]
    fn a_quorum_answering_recent_heartbeats_holds_the_lease() {
        let start = Instant::now();
        let mut lease = default_lease();
        assert!(!lease.holds(1, &[1, 2, 3], start), "no answer yet");
        lease.heartbeat_sent(2, start);
        lease.heartbeat_sent(3, start);
        lease.heartbeat_answered(3);
        assert!(lease.holds(1, &[1, 2, 3], start + Duration::from_millis(809)));
        // Nine tenths of nine ticks after the heartbeat left, it is gone.
        assert!(!lease.holds(1, &[1, 2, 3], start + Duration::from_millis(810)));
        // A single voter always holds it.
        assert!(default_lease().holds(1, &[1], start));
    }

    #[test]
    fn without_check_quorum_there_is_no_lease() {
        let start = Instant::now();
        let mut lease = Lease::new(lease_duration(Duration::from_millis(100), 10, false));
        lease.heartbeat_sent(2, start);
        lease.heartbeat_answered(2);
        assert!(!lease.holds(1, &[1, 2, 3], start));
        assert!(!lease.holds(1, &[1], start));
    }

    /// Ticks a raft-rs follower that just stepped its leader's heartbeat takes before it
    /// grants a vote to another candidate.
    fn ticks_until_a_follower_votes(election_ticks: usize) -> usize {
        let config = raft::Config {
            id: 2,
            election_tick: election_ticks,
            heartbeat_tick: 1,
            check_quorum: true,
            ..Default::default()
        };
        let storage = MemStorage::new_with_conf_state((vec![1, 2, 3], vec![]));
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let mut follower = RawNode::new(&config, storage, &logger).unwrap();
        let mut heartbeat = Message::default();
        heartbeat.set_msg_type(MessageType::MsgHeartbeat);
        (heartbeat.from, heartbeat.to, heartbeat.term) = (1, 2, 1);
        follower.step(heartbeat).unwrap();
        assert_eq!(follower.raft.state, StateRole::Follower);
        for ticks in 0..4 * election_ticks {
            let mut vote = Message::default();
            vote.set_msg_type(MessageType::MsgRequestVote);
            // A term above any the follower may reach campaigning itself meanwhile.
            (vote.from, vote.to, vote.term) = (3, 2, 100);
            (vote.index, vote.log_term) = (100, 1);
            follower.step(vote).unwrap();
            let granted = (follower.raft.msgs.iter()).any(|message| {
                message.get_msg_type() == MessageType::MsgRequestVoteResponse && !message.reject
            });
            if granted {
                return ticks;
            }
            follower.raft.msgs.clear();
            follower.tick();
        }
        panic!("the follower never voted");
    }

    #[test]
    fn the_lease_ends_before_a_follower_that_answered_may_vote_for_another() {
        let tick = Duration::from_millis(100);
        for election_ticks in [2, 10, 100] {
            let ticks = ticks_until_a_follower_votes(election_ticks);
            assert_eq!(ticks, election_ticks, "raft-rs's quiet after a heartbeat");
            // The first of those ticks may come just after the heartbeat arrived; the lease
            // must also allow for clocks that run 10% apart.
            let quiet = tick * (ticks as u32 - 1);
            let lease = lease_duration(tick, election_ticks, true);
            assert!(lease > Duration::ZERO);
            assert!(
                lease <= quiet * 9 / 10,
                "{election_ticks} ticks: {lease:?} against {quiet:?}"
            );
        }
    }

    #[test]
    fn a_member_keeping_quiet_ignores_only_later_votes_not_handed_over() {
        let vote = |kind: MessageType, term: u64, context: &[u8]| {
            let mut message = Message::default();
            message.set_msg_type(kind);
            message.term = term;
            message.context = context.to_vec().into();
            message
        };
        assert!(holds_vote_back_from(
            &vote(MessageType::MsgRequestVote, 3, b""),
            2
        ));
        assert!(holds_vote_back_from(
            &vote(MessageType::MsgRequestPreVote, 3, b""),
            2
        ));
        assert!(!holds_vote_back_from(
            &vote(MessageType::MsgRequestVote, 2, b""),
            2
        ));
        let handed_over = vote(MessageType::MsgRequestVote, 3, raft::CAMPAIGN_TRANSFER);
        assert!(!holds_vote_back_from(&handed_over, 2));
        assert!(!holds_vote_back_from(
            &vote(MessageType::MsgAppend, 3, b""),
            2
        ));
    }

    #[test]
    fn answers_count_from_when_the_heartbeat_left_not_when_they_arrive() {
        let start = Instant::now();
        let mut lease = default_lease();
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
        let mut lease = default_lease();
        for peer in 2..=5 {
            lease.heartbeat_sent(peer, start);
        }
        lease.heartbeat_answered(4);
        assert!(!lease.holds(1, &[1, 2, 3, 4, 5], start));
        lease.heartbeat_answered(5);
        assert!(lease.holds(1, &[1, 2, 3, 4, 5], start));
    }
}
