//! What a leader keeps of its followers: the commit index each was told (`commit_news.rs`),
//! which of them answered lately, and the heartbeats and hand-overs its lease counts
//! (`lease.rs`).

use std::time::{Duration, Instant};

use concord_storage::raft::prelude::{Message, MessageType};
use concord_storage::raft::{self, StateRole};

use super::RaftReplica;
use crate::NodeId;

impl RaftReplica {
    /// Records the commit indexes `messages` carry to the followers (see `commit_news.rs`).
    pub(super) fn commit_news_leaving(&mut self, messages: &[Message]) {
        if self.leads_with_current_news() {
            self.commit_news.sent(messages);
        }
    }

    /// Whether this node leads, its commit news (`commit_news.rs`) begun anew if it leads in
    /// a term the news does not belong to.
    pub(super) fn leads_with_current_news(&mut self) -> bool {
        let raft = &self.raw.raft;
        if raft.state != StateRole::Leader {
            return false;
        }
        if self.commit_news_term != raft.term {
            self.commit_news.clear();
            self.commit_news_term = raft.term;
        }
        true
    }

    /// Whether this node leads in the term its commit news belongs to.
    pub(super) fn news_is_current(&self) -> bool {
        let raft = &self.raw.raft;
        raft.state == StateRole::Leader && self.commit_news_term == raft.term
    }

    /// Looks again at what the followers are owed of the commit index (`commit_news.rs`).
    pub(super) fn note_commit_news(&mut self) {
        if !self.news_is_current() {
            return;
        }
        let raft = &self.raw.raft;
        let followers = || {
            (raft.prs().iter())
                .filter(|&(&node, _)| node != raft.id)
                .map(|(&node, progress)| (node, progress.matched))
        };
        (self.commit_news).note(raft.raft_log.committed, followers, Instant::now);
    }

    /// Tells at once each follower whose forwarded entries committed: it answers its caller
    /// once it applies them.
    pub(super) fn tell_forwarders(&mut self) {
        if !self.news_is_current() {
            return;
        }
        let raft = &mut self.raw.raft;
        for node in self.commit_news.forwarders_to_tell(raft.raft_log.committed) {
            if raft.prs().get(node).is_some() {
                raft.send_append(node);
            }
        }
    }

    /// Records for the lease what leaves among `messages`: the heartbeats (tagged,
    /// `lease.rs`) and any hand-over (`hand_over_sent_term`).
    pub(super) fn lease_messages_leaving(&mut self, messages: &mut [Message], now: Instant) {
        let raft = &self.raw.raft;
        if raft.state != StateRole::Leader {
            return;
        }
        if self.lease_term != raft.term {
            self.lease.reset();
            self.lease_term = raft.term;
        }
        for message in messages {
            match message.get_msg_type() {
                MessageType::MsgHeartbeat => self.lease.heartbeat_sent(message, now),
                MessageType::MsgTimeoutNow => self.hand_over_sent_term = raft.term,
                _ => {}
            }
        }
    }

    /// While this node leads: whether voter `id` (whose progress is `progress`) answered it
    /// lately — raft-rs's "recently active" mark, or a heartbeat of this term answered within
    /// the election timeout. Each check of the quorum clears the marks until the next
    /// heartbeat is answered, which leaves up to `heartbeat_ticks - 1` ticks after the check
    /// when `election_ticks` is not a multiple of it; a leader that asked only the marks
    /// would find a group's voters idle at every balance that fell there in step, and refuse
    /// a membership change asked there for quorum. The answered heartbeats (`lease.rs`) are
    /// not cleared.
    pub(super) fn heard_lately(&self, id: NodeId, progress: &raft::Progress, now: Instant) -> bool {
        progress.recent_active
            || (self.lease_term == self.raw.raft.term
                && (self.lease).answered_within(id, now, self.election_timeout))
    }

    /// `true` if the lease holds in the voters' configuration (in both halves of a joint one),
    /// when the shortest vote quiet a peer said is `peers_quiet`.
    pub(super) fn lease_holds(&self, now: Instant, peers_quiet: Option<Duration>) -> bool {
        let raft = &self.raw.raft;
        let conf = raft.prs().conf().to_conf_state();
        self.lease.holds(raft.id, &conf.voters, now, peers_quiet)
            && (conf.voters_outgoing.is_empty()
                || (self.lease).holds(raft.id, &conf.voters_outgoing, now, peers_quiet))
    }
}
