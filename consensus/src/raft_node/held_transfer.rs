//! A leadership handed to this node before it could take it: held until it can.
//!
//! A leader hands its leadership over with `MsgTimeoutNow`: the receiver campaigns at once.
//! raft-rs refuses to campaign while a configuration change is committed but not applied, and
//! drops the message. The hand-over that most often meets this is a leader's own removal: it
//! learns first that the change committed, hands over in that round, and the message arrives
//! with (or just after) the append that tells the successor of the commit — before its state
//! applied it. Dropped, the group waits for an election timeout with no leader. Held here
//! until raft's applied index passes the change, the message is stepped then: to raft, a
//! message that took a few milliseconds longer to arrive.

use std::time::{Duration, Instant};

use concord_storage::raft::prelude::{EntryType, Message, MessageType};
use concord_storage::raft::{GetEntriesContext, RaftLog, Storage};

use crate::NodeId;

/// A `MsgTimeoutNow` held for the configuration change before it to apply.
pub(crate) struct HeldTransfer {
    from: NodeId,
    term: u64,
    /// Past this, the message is dropped as raft-rs would have: the group elects a leader
    /// the usual way.
    until: Instant,
}

impl HeldTransfer {
    /// Holds `message` (a `MsgTimeoutNow` of the current term) for at most `longest`.
    pub(crate) fn hold(message: &Message, longest: Duration, now: Instant) -> HeldTransfer {
        HeldTransfer {
            from: message.from,
            term: message.term,
            until: now + longest,
        }
    }

    /// The message to step now, addressed to `to`; `None` if it waited too long.
    pub(crate) fn release(self, to: NodeId, now: Instant) -> Option<Message> {
        if now > self.until {
            return None;
        }
        let mut message = Message::default();
        message.set_msg_type(MessageType::MsgTimeoutNow);
        message.from = self.from;
        message.to = to;
        message.term = self.term;
        Some(message)
    }
}

/// Whether the log holds a configuration change that is committed and not yet applied, the
/// condition under which raft-rs does not campaign (read the same way raft-rs reads it).
pub(crate) fn conf_change_unapplied<S: Storage>(log: &RaftLog<S>) -> bool {
    if log.applied >= log.committed {
        return false;
    }
    let first = log.unstable.maybe_first_index().unwrap_or(log.applied + 1);
    let context = GetEntriesContext::empty(false);
    match log.slice(first, log.committed + 1, None, context) {
        Ok(entries) => entries.iter().any(|entry| {
            matches!(
                entry.get_entry_type(),
                EntryType::EntryConfChange | EntryType::EntryConfChangeV2
            )
        }),
        // Entries raft cannot read: raft-rs would stop on them; holding changes nothing.
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_transfer_is_released_as_sent_unless_it_waited_too_long() {
        let mut sent = Message::default();
        sent.set_msg_type(MessageType::MsgTimeoutNow);
        sent.from = 2;
        sent.to = 3;
        sent.term = 7;
        let now = Instant::now();
        let longest = Duration::from_millis(100);
        let released = HeldTransfer::hold(&sent, longest, now)
            .release(3, now + longest)
            .unwrap();
        assert_eq!(released, sent);
        let late = HeldTransfer::hold(&sent, longest, now).release(3, now + longest * 2);
        assert!(late.is_none());
    }
}
