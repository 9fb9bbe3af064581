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

/// The most proposals held per group: a transfer lasts at most an election timeout, and
/// what arrives past this is dropped as raft-rs would have.
const MAX_HELD_PROPOSALS: usize = 1024;

/// The forwarded proposals held during a pending transfer, oldest first.
#[derive(Default)]
pub(crate) struct HeldProposals {
    messages: Vec<GroupMessage>,
}

impl HeldProposals {
    /// Holds `message`; `false` (and the message dropped) when as many are held as may be.
    pub(crate) fn hold(&mut self, message: GroupMessage) -> bool {
        if self.messages.len() >= MAX_HELD_PROPOSALS {
            return false;
        }
        self.messages.push(message);
        true
    }

    /// Whether any is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// Every proposal held, oldest first; none is held afterwards.
    pub(crate) fn take(&mut self) -> Vec<GroupMessage> {
        std::mem::take(&mut self.messages)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use concord_storage::raft::prelude::{Message, MessageType};

    fn proposal(from: u64) -> GroupMessage {
        let mut message = Message::default();
        message.set_msg_type(MessageType::MsgPropose);
        message.from = from;
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
}
