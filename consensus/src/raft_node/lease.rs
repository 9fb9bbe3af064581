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
//! That window is the *follower's* ticks, which its own configuration sets: every member says
//! its window, its vote quiet, in the hello that opens its connections
//! (`transport/frame.rs`), and a leader's lease is nine tenths of the shortest of its own and
//! every peer's that said one. Members configured with different ticks then cost the leases
//! their length, never their safety, and the 10% stays for the clocks. A peer of an older
//! version says none and is taken to keep this node's own.
//!
//! An answer is matched to its heartbeat by the context raft-rs echoes back: a heartbeat that
//! leaves without one (no ReadIndex rides on it) is given a tag of its own. Heartbeats lost on
//! the way, or never answered (a follower asking for a snapshot answers none), then cost the
//! lease only their own credit; matched by order instead, every answer after them would be
//! credited to an older heartbeat for as long as the leadership lasts.
//!
//! The quiet is kept toward a leader, not toward its node's later runs: a follower told that
//! its leader's node restarted forgets that leader and votes at once
//! (`replica/restarted_leader.rs`). The lease it kept lived in the run that ended.
//!
//! A member that restarts forgets whom it heard from; `replica/mod.rs` has it hold back its
//! vote for as many ticks after it opens, as if it had just heard from a leader — and, if its
//! ticks were shortened across the restart, for the quiet it said before (`vote_hold.rs`),
//! which a leader that has not heard its new hello still counts on. A leader that sent a
//! `MsgTimeoutNow` holds no lease for the rest of its term (`replica/leader_news.rs`): its
//! receiver campaigns on it whenever it arrives, forced past its peers' quiet.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use concord_storage::raft::prelude::{Message, MessageType};

use crate::NodeId;

/// Heartbeat send times kept per peer while unanswered.
const MAX_UNANSWERED: usize = 64;

/// The start of the context given to a heartbeat that carries none, before its number.
const TAG_PREFIX: &[u8] = b"concord:lease:";

/// What a leader knows of its lease.
pub(crate) struct Lease {
    /// This node's vote quiet (`vote_quiet`): zero without check-quorum.
    own_quiet: Duration,
    /// Per peer, the contexts and send times of heartbeats not answered yet, oldest first.
    unanswered: HashMap<NodeId, VecDeque<(Bytes, Instant)>>,
    /// The number of the last tag given.
    last_tag: u64,
    /// Per peer, the send time of the latest heartbeat it answered.
    answered: HashMap<NodeId, Instant>,
}

/// A member's vote quiet: how long, having heard from a leader, it surely votes for no other
/// (`election_ticks - 1` ticks, module comment). Zero without check-quorum: it then votes
/// whenever asked, and no lease over it is safe.
pub(crate) fn vote_quiet(
    tick_interval: Duration,
    election_ticks: usize,
    check_quorum: bool,
) -> Duration {
    if !check_quorum {
        return Duration::ZERO;
    }
    let quiet_ticks = u32::try_from(election_ticks.saturating_sub(1)).unwrap_or(u32::MAX);
    tick_interval.saturating_mul(quiet_ticks)
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
    /// The lease of a node whose own vote quiet is `own_quiet` (`vote_quiet`).
    pub(crate) fn new(own_quiet: Duration) -> Self {
        Lease {
            own_quiet,
            unanswered: HashMap::new(),
            last_tag: 0,
            answered: HashMap::new(),
        }
    }

    /// Forgets everything: a new term, or this node no longer leads.
    pub(crate) fn reset(&mut self) {
        self.unanswered.clear();
        self.answered.clear();
    }

    /// `heartbeat` leaves at `at`: it is tagged if it carries no context, and recorded.
    pub(crate) fn heartbeat_sent(&mut self, heartbeat: &mut Message, at: Instant) {
        if heartbeat.context.is_empty() {
            self.last_tag += 1;
            let mut tag = TAG_PREFIX.to_vec();
            tag.extend_from_slice(&self.last_tag.to_be_bytes());
            heartbeat.context = tag.into();
        }
        let sent = self.unanswered.entry(heartbeat.to).or_default();
        if sent.len() == MAX_UNANSWERED {
            sent.pop_front();
        }
        sent.push_back((heartbeat.context.clone(), at));
    }

    /// `from` answered a heartbeat of this term whose context was `context`; returns when
    /// that heartbeat left. A context sent more than once (a ReadIndex's, asked again) is
    /// credited its first send time once; the heartbeats sent before the one answered are
    /// given up on (an answer to one of them later credits nothing).
    pub(crate) fn heartbeat_answered(&mut self, from: NodeId, context: &[u8]) -> Option<Instant> {
        let sent = self.unanswered.get_mut(&from)?;
        let position = sent.iter().position(|(sent, _)| sent.as_ref() == context)?;
        let sent_at = sent[position].1;
        sent.drain(..=position);
        sent.retain(|(sent, _)| sent.as_ref() != context);
        let answered = self.answered.entry(from).or_insert(sent_at);
        *answered = (*answered).max(sent_at);
        Some(sent_at)
    }

    /// `true` if `peer` answered a heartbeat of this term sent less than `window` before
    /// `now`.
    pub(crate) fn answered_within(&self, peer: NodeId, now: Instant, window: Duration) -> bool {
        (self.answered.get(&peer)).is_some_and(|&sent| now.saturating_duration_since(sent) < window)
    }

    /// How long the lease lasts after the heartbeat a quorum answered: nine tenths of the
    /// shortest of this node's vote quiet and `peers_quiet`, the shortest any peer said.
    pub(crate) fn duration(&self, peers_quiet: Option<Duration>) -> Duration {
        let quiet = peers_quiet.map_or(self.own_quiet, |peers| peers.min(self.own_quiet));
        quiet * 9 / 10
    }

    /// Whether the lease of leader `me` over `voters` still holds at `now`, when the shortest
    /// vote quiet a peer said is `peers_quiet`.
    pub(crate) fn holds(
        &self,
        me: NodeId,
        voters: &[NodeId],
        now: Instant,
        peers_quiet: Option<Duration>,
    ) -> bool {
        let duration = self.duration(peers_quiet);
        if duration.is_zero() {
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
        times[quorum - 1] + duration > now
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::storage::MemStorage;
    use raft::{RawNode, StateRole};

    /// The defaults' lease: ticks of 100 ms, an election timeout of 10 ticks.
    fn default_lease() -> Lease {
        Lease::new(vote_quiet(Duration::from_millis(100), 10, true))
    }

    /// Sends `lease`'s leader's heartbeat carrying `context` (empty: raft-rs's own) to `to` at
    /// `at`; returns the context it left with, which the answer echoes.
    fn send(lease: &mut Lease, to: NodeId, at: Instant, context: &[u8]) -> Bytes {
        let mut heartbeat = Message::default();
        heartbeat.set_msg_type(MessageType::MsgHeartbeat);
        heartbeat.to = to;
        heartbeat.context = context.to_vec().into();
        lease.heartbeat_sent(&mut heartbeat, at);
        heartbeat.context
    }

    #[test]
    fn a_quorum_answering_recent_heartbeats_holds_the_lease() {
        let start = Instant::now();
        let mut lease = default_lease();
        assert!(!lease.holds(1, &[1, 2, 3], start, None), "no answer yet");
        send(&mut lease, 2, start, b"");
        let to_3 = send(&mut lease, 3, start, b"");
        assert_eq!(lease.heartbeat_answered(3, &to_3), Some(start));
        assert!(lease.holds(1, &[1, 2, 3], start + Duration::from_millis(809), None));
        // Nine tenths of nine ticks after the heartbeat left, it is gone.
        assert!(!lease.holds(1, &[1, 2, 3], start + Duration::from_millis(810), None));
        // A single voter always holds it.
        assert!(default_lease().holds(1, &[1], start, None));
    }

    #[test]
    fn a_peer_with_a_shorter_quiet_shortens_the_lease() {
        let start = Instant::now();
        let mut lease = default_lease();
        let to_2 = send(&mut lease, 2, start, b"");
        lease.heartbeat_answered(2, &to_2);
        // A peer ticking every 50 ms keeps 450 ms of quiet: the lease is 405 ms, not 810.
        let peers_quiet = Some(Duration::from_millis(450));
        assert!(lease.holds(
            1,
            &[1, 2, 3],
            start + Duration::from_millis(404),
            peers_quiet
        ));
        assert!(!lease.holds(
            1,
            &[1, 2, 3],
            start + Duration::from_millis(405),
            peers_quiet
        ));
        // A longer one changes nothing: the lease is never longer than this node's own.
        let longer = Some(Duration::from_secs(9));
        assert!(lease.holds(1, &[1, 2, 3], start + Duration::from_millis(809), longer));
        assert!(!lease.holds(1, &[1, 2, 3], start + Duration::from_millis(810), longer));
        // A peer that keeps no quiet (no check-quorum) leaves no lease.
        assert!(!lease.holds(1, &[1, 2, 3], start, Some(Duration::ZERO)));
    }

    #[test]
    fn answered_within_counts_from_when_the_answered_heartbeat_left() {
        let start = Instant::now();
        let window = Duration::from_secs(1);
        let mut lease = default_lease();
        let to_2 = send(&mut lease, 2, start, b"");
        assert!(!lease.answered_within(2, start, window), "not answered yet");
        lease.heartbeat_answered(2, &to_2);
        assert!(lease.answered_within(2, start + Duration::from_millis(999), window));
        assert!(!lease.answered_within(2, start + window, window));
        assert!(
            !lease.answered_within(3, start, window),
            "sent nothing to node 3"
        );
        lease.reset();
        assert!(
            !lease.answered_within(2, start, window),
            "a new term forgets"
        );
    }

    #[test]
    fn without_check_quorum_there_is_no_lease() {
        let start = Instant::now();
        let mut lease = Lease::new(vote_quiet(Duration::from_millis(100), 10, false));
        let to_2 = send(&mut lease, 2, start, b"");
        lease.heartbeat_answered(2, &to_2);
        assert!(!lease.holds(1, &[1, 2, 3], start, None));
        assert!(!lease.holds(1, &[1], start, None));
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
            let lease = Lease::new(vote_quiet(tick, election_ticks, true)).duration(None);
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
        let first = send(&mut lease, 2, start, b"");
        let second = send(&mut lease, 2, start + Duration::from_millis(500), b"");
        assert_ne!(first, second, "each heartbeat is tagged apart");
        // The answer to the first heartbeat counts from when it left, whenever it arrives.
        lease.heartbeat_answered(2, &first);
        assert!(!lease.holds(1, &[1, 2, 3], start + Duration::from_millis(950), None));
        lease.heartbeat_answered(2, &second);
        assert!(lease.holds(1, &[1, 2, 3], start + Duration::from_millis(950), None));
        // An answer nobody asked for credits nothing; a reset forgets all.
        assert_eq!(lease.heartbeat_answered(3, &second), None);
        lease.reset();
        assert!(!lease.holds(1, &[1, 2, 3], start + Duration::from_millis(950), None));
    }

    #[test]
    fn five_voters_need_two_answers() {
        let start = Instant::now();
        let mut lease = default_lease();
        let sent: Vec<Bytes> = (2..=5)
            .map(|peer| send(&mut lease, peer, start, b""))
            .collect();
        lease.heartbeat_answered(4, &sent[2]);
        assert!(!lease.holds(1, &[1, 2, 3, 4, 5], start, None));
        lease.heartbeat_answered(5, &sent[3]);
        assert!(lease.holds(1, &[1, 2, 3, 4, 5], start, None));
    }

    #[test]
    fn a_heartbeat_never_answered_costs_only_its_own_credit() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut lease = default_lease();
        // Ten heartbeats lost on the way (or a follower that answers none while it asks for
        // a snapshot), then one answered: the answer counts from its own heartbeat.
        for ms in 0..10 {
            send(&mut lease, 2, at(ms * 100), b"");
        }
        let answered = send(&mut lease, 2, at(1000), b"");
        assert_eq!(lease.heartbeat_answered(2, &answered), Some(at(1000)));
        assert!(lease.holds(1, &[1, 2, 3], at(1500), None));
        // Answers out of order: one to a heartbeat older than one answered credits nothing.
        let older = send(&mut lease, 2, at(1100), b"");
        let newer = send(&mut lease, 2, at(1200), b"");
        assert_eq!(lease.heartbeat_answered(2, &newer), Some(at(1200)));
        assert_eq!(lease.heartbeat_answered(2, &older), None);
    }

    #[test]
    fn a_context_sent_twice_is_credited_its_first_send_once() {
        let start = Instant::now();
        let later = start + Duration::from_millis(300);
        let mut lease = default_lease();
        // A ReadIndex's context rides on heartbeats until a quorum answered it.
        let read = send(&mut lease, 2, start, b"read 7");
        assert_eq!(
            read.as_ref(),
            b"read 7",
            "a context of raft-rs's own is kept"
        );
        send(&mut lease, 2, later, b"read 7");
        assert_eq!(lease.heartbeat_answered(2, b"read 7"), Some(start));
        assert_eq!(lease.heartbeat_answered(2, b"read 7"), None);
    }
}
