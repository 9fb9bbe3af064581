//! Proposals a follower forwarded to this leader while it was handing its leadership over:
//! held until the hand-over ends.
//!
//! raft-rs drops a proposal that reaches a leader with a transfer pending, and says nothing to
//! the follower that forwarded it. If the transfer succeeds, the new leader's term tells the
//! follower its write was lost (it answers `Dropped`, safe to retry). If it gives up — the
//! voter named never campaigns: it cannot hear the leader, or it is still catching up after
//! starting without data and refuses — the term stays, nothing tells the follower, and its
//! caller waits for the proposal timeout. Held here, the proposals are stepped once no transfer
//! is pending: to raft, messages that took a moment longer to arrive. Stepped on a node that no
//! longer leads, they are refused as any request forwarded to a non-leader is.

use crate::transport::GroupMessage;

/// The most proposals held per group, and the most bytes of their entries: a transfer lasts
/// at most an election timeout, and what arrives past either is dropped as raft-rs would have.
const MAX_HELD_PROPOSALS: usize = 1024;
const MAX_HELD_BYTES: usize = 16 << 20;

/// The forwarded proposals held during a pending transfer, oldest first.
#[derive(Default)]
pub(crate) struct HeldProposals {
    messages: Vec<GroupMessage>,
    /// Bytes of the held messages' entries (data and context).
    bytes: usize,
}

impl HeldProposals {
    /// Holds `message`; `false` (and the message dropped) when it would pass either bound.
    pub(crate) fn hold(&mut self, message: GroupMessage) -> bool {
        let bytes: usize = (message.message.entries.iter())
            .map(|entry| entry.data.len() + entry.context.len())
            .sum();
        if self.messages.len() >= MAX_HELD_PROPOSALS || self.bytes + bytes > MAX_HELD_BYTES {
            return false;
        }
        self.bytes += bytes;
        self.messages.push(message);
        true
    }

    /// Whether any is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// Every proposal held, oldest first; none is held afterwards.
    pub(crate) fn take(&mut self) -> Vec<GroupMessage> {
        self.bytes = 0;
        std::mem::take(&mut self.messages)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use concord_storage::raft::prelude::{Entry, Message, MessageType};

    fn proposal(from: u64) -> GroupMessage {
        proposal_of(from, 0)
    }

    fn proposal_of(from: u64, data_bytes: usize) -> GroupMessage {
        let mut message = Message::default();
        message.set_msg_type(MessageType::MsgPropose);
        message.from = from;
        let mut entry = Entry::default();
        entry.data = vec![7; data_bytes].into();
        message.entries = vec![entry].into();
        GroupMessage {
            group: 1,
            message,
            replicated_floor: 0,
        }
    }

    #[test]
    fn proposals_are_held_in_order_up_to_the_bound() {
        let mut held = HeldProposals::default();
        assert!(held.is_empty());
        for from in 0..MAX_HELD_PROPOSALS as u64 {
            assert!(held.hold(proposal(from)));
        }
        assert!(!held.hold(proposal(9999)), "one past the bound is dropped");
        let taken = held.take();
        assert_eq!(taken.len(), MAX_HELD_PROPOSALS);
        assert!(
            taken
                .iter()
                .enumerate()
                .all(|(i, m)| m.message.from == i as u64)
        );
        assert!(held.is_empty());
    }

    #[test]
    fn proposals_are_held_up_to_the_byte_bound() {
        let mut held = HeldProposals::default();
        assert!(held.hold(proposal_of(1, MAX_HELD_BYTES - 10)));
        assert!(!held.hold(proposal_of(2, 11)), "past the byte bound");
        assert!(held.hold(proposal_of(3, 10)));
        assert_eq!(held.take().len(), 2);
        assert!(
            held.hold(proposal_of(4, MAX_HELD_BYTES)),
            "take frees the bytes"
        );
    }
}
