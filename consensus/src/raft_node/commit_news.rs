//! What a leader's followers have been told of its commit index.
//!
//! Raft tells every follower of a new commit index at once, in an append of its own. Each
//! such append costs a frame each way, and a writer whose next command follows within a
//! moment would have carried the news in its own append. So a leader's new commit index waits
//! for the next append (raft-rs's `skip_bcast_commit`), and the node loop tells the followers
//! still owed it a short while later (`NodeConfig::commit_news_delay`) if no append did. A
//! follower that forwarded an entry waits for its commit to answer its own caller: it is told
//! at once. Followers' reads need no news: a read index comes with the heartbeat round that
//! confirms it, which carries the commit index.

use std::time::Instant;

use concord_storage::raft::prelude::{Message, MessageType};

use crate::NodeId;

/// Per follower, the highest commit index sent to it, and the last entry it forwarded that
/// it has not been told is committed; and the commit index owed since when. A few peers per
/// group: vectors, not maps.
#[derive(Debug, Default)]
pub(super) struct CommitNews {
    told: Vec<(NodeId, u64)>,
    forwarded: Vec<(NodeId, u64)>,
    owed: Option<(u64, Instant)>,
}

impl CommitNews {
    /// Notes the commit indexes that `messages`, leaving this leader, carry.
    pub(super) fn sent(&mut self, messages: &[Message]) {
        for message in messages {
            if matches!(
                message.get_msg_type(),
                MessageType::MsgAppend | MessageType::MsgHeartbeat
            ) {
                match self.told.iter_mut().find(|(node, _)| *node == message.to) {
                    Some((_, told)) => *told = (*told).max(message.commit),
                    None => self.told.push((message.to, message.commit)),
                }
            }
        }
    }

    /// `node` forwarded entries that now end at `last_index`.
    pub(super) fn forwarded(&mut self, node: NodeId, last_index: u64) {
        match self.forwarded.iter_mut().find(|(n, _)| *n == node) {
            Some((_, index)) => *index = (*index).max(last_index),
            None => self.forwarded.push((node, last_index)),
        }
    }

    /// The followers whose forwarded entries `committed` covers and who have not been told
    /// so: they are to be told now (and are not returned again for those entries).
    pub(super) fn forwarders_to_tell(&mut self, committed: u64) -> Vec<NodeId> {
        let mut due = Vec::new();
        let told = &self.told;
        self.forwarded.retain(|&(node, index)| {
            if index > committed {
                return true;
            }
            if told_to(told, node) < index {
                due.push(node);
            }
            false
        });
        due
    }

    /// Looks again at what is owed, the commit index now `committed` and `followers` each
    /// with the index its log matches the leader's through: a commit index owed keeps the time
    /// it became owed until every follower holding its entries has been told; then a newer
    /// one owed is owed from `now`. A follower behind the commit index is told with the
    /// entries it still lacks, so it is owed only what it holds.
    pub(super) fn note<I: Iterator<Item = (NodeId, u64)>>(
        &mut self,
        committed: u64,
        followers: impl Fn() -> I,
        now: impl FnOnce() -> Instant,
    ) {
        if let Some((index, _)) = self.owed
            && self.owes(index, followers())
        {
            return;
        }
        self.owed = self
            .owes(committed, followers())
            .then(|| (committed, now()));
    }

    /// Since when a commit index has been owed to a follower, if one is.
    pub(super) fn owed_since(&self) -> Option<Instant> {
        self.owed.map(|(_, since)| since)
    }

    /// Every follower was sent the commit index (in an append of its own).
    pub(super) fn told_all(&mut self) {
        self.owed = None;
    }

    /// Forgets everything: this node no longer leads, or leads in a new term.
    pub(super) fn clear(&mut self) {
        self.told.clear();
        self.forwarded.clear();
        self.owed = None;
    }

    fn owes(&self, committed: u64, followers: impl Iterator<Item = (NodeId, u64)>) -> bool {
        let mut followers = followers;
        followers.any(|(node, matched)| told_to(&self.told, node) < committed.min(matched))
    }
}

fn told_to(told: &[(NodeId, u64)], node: NodeId) -> u64 {
    told.iter()
        .find(|(n, _)| *n == node)
        .map_or(0, |&(_, index)| index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn append(to: NodeId, commit: u64) -> Message {
        let mut message = Message::default();
        message.set_msg_type(MessageType::MsgAppend);
        message.to = to;
        message.commit = commit;
        message
    }

    #[test]
    fn a_commit_index_is_owed_from_when_it_moved_until_a_message_carries_it() {
        let t0 = Instant::now();
        let later = t0 + std::time::Duration::from_millis(5);
        let mut news = CommitNews::default();
        news.sent(&[append(2, 5), append(3, 5)]);
        news.note(5, || [(2, 5), (3, 5)].into_iter(), || t0);
        assert_eq!(news.owed_since(), None);
        // Committed through 7; follower 3 holds only 6 so far.
        news.note(7, || [(2, 7), (3, 6)].into_iter(), || t0);
        assert_eq!(news.owed_since(), Some(t0));
        news.sent(&[append(2, 7)]);
        news.note(7, || [(2, 7), (3, 6)].into_iter(), || later);
        assert_eq!(news.owed_since(), Some(t0), "follower 3 still waits for 6");
        // Committed through 8 meanwhile: the older index keeps its time while it is owed.
        news.note(8, || [(2, 8), (3, 8)].into_iter(), || later);
        assert_eq!(news.owed_since(), Some(t0));
        // 7 reached follower 3: the newer index is owed from now.
        news.sent(&[append(3, 7)]);
        news.note(8, || [(2, 8), (3, 8)].into_iter(), || later);
        assert_eq!(news.owed_since(), Some(later));
        news.sent(&[append(2, 8), append(3, 8)]);
        news.note(8, || [(2, 8), (3, 8)].into_iter(), || later);
        assert_eq!(news.owed_since(), None);
        // An older commit index in a later message takes nothing back; responses and votes
        // carry no news.
        let mut vote = append(2, 9);
        vote.set_msg_type(MessageType::MsgRequestVote);
        news.sent(&[append(2, 3), vote]);
        news.note(9, || [(2, 9)].into_iter(), || later);
        assert_eq!(news.owed_since(), Some(later));
        news.told_all();
        assert_eq!(news.owed_since(), None);
    }

    #[test]
    fn a_forwarder_is_told_once_its_entries_commit_unless_it_was_told_already() {
        let mut news = CommitNews::default();
        news.forwarded(2, 10);
        news.forwarded(3, 12);
        assert!(news.forwarders_to_tell(9).is_empty());
        assert_eq!(news.forwarders_to_tell(11), vec![2]);
        // Told once: not again for the same entries.
        assert!(news.forwarders_to_tell(11).is_empty());
        // Follower 3 heard of index 12 in an append meanwhile.
        news.sent(&[append(3, 12)]);
        assert!(news.forwarders_to_tell(12).is_empty());
        news.forwarded(2, 14);
        news.clear();
        assert!(news.forwarders_to_tell(20).is_empty());
    }
}
