//! How the replica of a member that lost the group's data catches up: it asks the other
//! members where the group stands, answers their questions, and takes part in elections again
//! once it holds what they answered (the rules are in `catch_up.rs`).

use concord_storage::raft;
use concord_storage::raft::prelude::{Message, MessageType};

use super::RaftReplica;
use crate::node_loop::replica::StepOutcome;
use crate::raft_node::catch_up::{self, CatchUp, Probing, Standing};

impl RaftReplica {
    /// `true` for a vote or pre-vote request from a candidate whose log has entries of some
    /// term while this node's log has none: the group has run, and this node cannot tell
    /// whether it acknowledged entries or voted before. A member whose data directory was
    /// lost and that was started again as a member of a new cluster (not as one joining a
    /// running cluster) is such a node; voting at once, it could elect a candidate missing
    /// committed entries (its empty log is behind every candidate's) or vote twice in a term.
    /// It catches up first instead, as a joining member does. In a new cluster the first
    /// candidates' logs are empty too, and the first election runs as usual.
    pub(super) fn asked_to_vote_blind(&self, message: &Message) -> bool {
        let vote = matches!(
            message.get_msg_type(),
            MessageType::MsgRequestVote | MessageType::MsgRequestPreVote
        );
        vote && message.log_term > 0 && self.raw.raft.raft_log.last_term() == 0
    }

    /// Whether `message` is a leader's append or heartbeat telling this node, whose log has no
    /// term (its data was lost, and it was started as at its first start), of commits past its
    /// log's end. Such a node is behind a group that has run: it catches up before it votes,
    /// as [`Self::asked_to_vote_blind`] would have it do at the first vote asked, and until
    /// then it is not ready (were it taken for caught up, another member could be taken down
    /// while the group's data is on fewer members than a quorum).
    pub(super) fn told_of_commits_blind(&self, message: &Message) -> bool {
        let from_leader = matches!(
            message.get_msg_type(),
            MessageType::MsgAppend | MessageType::MsgHeartbeat
        );
        let raft = &self.raw.raft;
        from_leader
            && message.term >= raft.term
            && raft.raft_log.last_term() == 0
            && message.commit > raft.raft_log.last_index()
    }

    /// Answers another member's question about where the group stands here, or records its
    /// answer to this node's; `None` for any other message. Neither wakes the group: the
    /// answer is read off raft's state, and a member catching up answers nothing (it does not
    /// know yet).
    pub(super) fn step_catch_up_question(&mut self, message: &Message) -> Option<StepOutcome> {
        let from = message.from;
        if catch_up::is_probe(message) {
            if self.catching_up.is_some() {
                return Some(StepOutcome::Rejected(
                    "asked where the group stands while catching up".into(),
                ));
            }
            let raft = &mut self.raw.raft;
            let conf = raft.prs().conf().to_conf_state();
            let last = (raft.raft_log.last_term(), raft.raft_log.last_index());
            let answer = catch_up::answer(raft.id, from, raft.term, last, &conf);
            raft.msgs.push(answer);
            return Some(StepOutcome::Stepped);
        }
        let answer = match catch_up::parse_answer(message)? {
            Ok(answer) => answer,
            Err(reason) => {
                return Some(StepOutcome::Rejected(format!(
                    "a malformed answer from node {from}: {reason}"
                )));
            }
        };
        let Some(CatchUp::Probing(probing)) = &mut self.catching_up else {
            return Some(StepOutcome::Rejected(
                "an answer to a question no longer asked".into(),
            ));
        };
        probing.record(from, answer);
        let me = self.raw.raft.id;
        if let Some((min_term, target_index)) = probing.verdict(me) {
            self.follow_after_probing(min_term, target_index);
        }
        Some(StepOutcome::Stepped)
    }

    /// Begins catching up by asking the other members where the group stands.
    pub(super) fn start_probing(&mut self) {
        self.catching_up = Some(CatchUp::Probing(Probing::default()));
        self.catch_up_ticks = 0;
        self.send_probes();
    }

    /// Asks every member not yet heard where the group stands.
    pub(super) fn send_probes(&mut self) {
        let Some(CatchUp::Probing(probing)) = &self.catching_up else {
            return;
        };
        let raft = &mut self.raw.raft;
        for peer in probing.to_ask(raft.id, &self.catch_up_peers) {
            raft.msgs.push(catch_up::probe(raft.id, peer));
        }
    }

    /// Enough members answered: takes the highest term they know (a leader of an older term
    /// is answered with it, and steps down) and follows, caught up past `target_index`.
    pub(super) fn follow_after_probing(&mut self, min_term: u64, target_index: u64) {
        let raft = &mut self.raw.raft;
        let min_term = min_term.max(raft.term);
        if min_term > raft.term {
            raft.become_follower(min_term, raft::INVALID_ID);
        }
        tracing::debug!(
            min_term,
            target_index,
            "the other members answered; following leaders of their term or later"
        );
        self.catching_up = Some(CatchUp::Following {
            min_term,
            target_index: target_index.max(1),
        });
        self.catch_up_ticks = 0;
        self.finish_catching_up();
    }

    /// Ends the catch-up once this node holds far enough (`CatchUp::caught_up`).
    pub(super) fn finish_catching_up(&mut self) {
        // A held snapshot's `Ready` waits to be persisted: raft's hard state must not change
        // before it is (raft-rs asserts it did not). The catch-up ends after its persist.
        let Some(catching_up) = self
            .catching_up
            .as_ref()
            .filter(|_| self.installing.is_none())
        else {
            return;
        };
        let raft = &self.raw.raft;
        let has_leader = raft.leader_id != raft::INVALID_ID;
        let standing = Standing {
            applied: self.state_applied,
            applied_term: raft.raft_log.term(self.state_applied).ok(),
            committed: raft.raft_log.committed,
            last_term: raft.raft_log.last_term(),
            term: raft.term,
            has_leader,
        };
        if !catching_up.caught_up(&standing) {
            return;
        }
        let min_term = match catching_up {
            CatchUp::Following { min_term, .. } => *min_term,
            CatchUp::Probing(_) => return,
        };
        tracing::debug!(
            applied_index = self.state_applied,
            "caught up after starting without data; taking part in elections again"
        );
        self.catching_up = None;
        // This node may have voted in `min_term` before it lost its data, for the leader it
        // follows now if that one won: recorded, the vote is never given to another.
        let raft = &mut self.raw.raft;
        if raft.term == min_term && raft.vote == raft::INVALID_ID && has_leader {
            raft.vote = raft.leader_id;
        }
    }

    /// Tells every other member that this node, started without the group's data, waits to
    /// hear from its leader: before it heard of a commit index, and after too, until it has
    /// applied through it (the snapshot it asked for, or the heartbeats after it, may have
    /// been lost while the group fell asleep on the leader, whose view of this node's log
    /// predates the loss of its data). A leader whose group sleeps sends nothing, and this
    /// node, catching up, can neither vote nor campaign: without this it could wait forever.
    /// The message is an append rejection of term 0, which raft-rs drops as stale and which
    /// wakes the group wherever it lands (anything but a heartbeat answer wakes a leader); the
    /// leader's heartbeats then bring this node its commit index, and it asks for a snapshot.
    pub(super) fn nudge_sleeping_leader(&mut self) {
        let raft = &mut self.raw.raft;
        for &peer in &self.catch_up_peers {
            let mut nudge = Message::default();
            nudge.set_msg_type(MessageType::MsgAppendResponse);
            nudge.to = peer;
            nudge.from = raft.id;
            nudge.term = 0;
            nudge.reject = true;
            raft.msgs.push(nudge);
        }
    }

    /// Starts catching up when `message` shows this node lost the group's data (asked to
    /// vote, or told of commits, with no log), and refuses what a member catching up must not
    /// step: every message while it asks the others, and votes and hand-overs while it
    /// follows. `None`: step it.
    pub(super) fn refused_while_catching_up(&mut self, message: &Message) -> Option<StepOutcome> {
        let from = message.from;
        if self.catching_up.is_none() && self.asked_to_vote_blind(message) {
            tracing::debug!(
                from,
                "asked to vote with no log of a group that has run: catching up first"
            );
            self.start_probing();
        }
        if self.catching_up.is_none() && self.told_of_commits_blind(message) {
            tracing::debug!(
                from,
                commit = message.commit,
                "told of commits past an empty log: catching up before voting"
            );
            self.start_probing();
        }
        match self.catching_up {
            None => {}
            Some(CatchUp::Probing(_)) => {
                return Some(StepOutcome::Rejected(
                    "this node, started without data, asks the other members where the group \
                     stands before it takes part"
                        .into(),
                ));
            }
            Some(CatchUp::Following { .. }) => {
                if matches!(
                    message.get_msg_type(),
                    MessageType::MsgRequestVote
                        | MessageType::MsgRequestPreVote
                        | MessageType::MsgTimeoutNow
                ) {
                    return Some(StepOutcome::Rejected(
                        "this node is catching up after starting without data".into(),
                    ));
                }
            }
        }
        None
    }
}
