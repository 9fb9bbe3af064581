//! What a leader takes from its peers through raft-rs: the proposals and reads a follower
//! forwards to it. A peer may forward its own command batches (under its own tag, in the term
//! they were forwarded in), well-formed membership changes, and reads under its own tag;
//! anything else would have this node answer another node's callers or append what no replica
//! can apply.

use concord_storage::raft::StateRole;
use concord_storage::raft::prelude::{ConfChangeV2, Entry, EntryType, Message, MessageType};
use protobuf::Message as _;

use crate::membership::{MemberChange, MemberContext};
use crate::node_loop::forward_tag::ForwardTag;

/// The membership change an entry proposes, if it is a well-formed one of Concord's.
pub(super) fn member_change_of(entry: &Entry) -> Option<MemberChange> {
    if entry.get_entry_type() != EntryType::EntryConfChangeV2 {
        return None;
    }
    let context = MemberContext::decode(&entry.context)?;
    let change = ConfChangeV2::parse_from_bytes(&entry.data).ok()?;
    let [single] = change.changes.as_slice() else {
        return None;
    };
    if single.node_id != context.node {
        return None;
    }
    let node = context.node;
    use concord_storage::raft::prelude::ConfChangeType;
    match single.get_change_type() {
        ConfChangeType::AddLearnerNode if !context.address.is_empty() => {
            Some(MemberChange::AddLearner {
                node,
                address: context.address,
            })
        }
        ConfChangeType::AddNode => Some(MemberChange::Promote { node }),
        ConfChangeType::RemoveNode => Some(MemberChange::Remove { node }),
        _ => None,
    }
}

/// Why a peer's forwarded proposal or read is refused, if it is: a peer may forward only its
/// own command batches (under its own tag) and well-formed membership changes, or it could
/// have this node answer another node's callers or append what no replica can apply; only to the
/// leader (a request is forwarded once: the sender asks again when it learns the leader);
/// and a proposal only in the term it was forwarded in (so that its sender knows it lost
/// once a later term commits).
pub(super) fn refused_request(message: &Message, role: StateRole, term: u64) -> Option<String> {
    let from = message.from;
    let forwarded = matches!(
        message.get_msg_type(),
        MessageType::MsgPropose | MessageType::MsgReadIndex
    );
    if forwarded && role != StateRole::Leader {
        return Some(format!(
            "node {from} forwarded a request to a node that does not lead"
        ));
    }
    let tagged_by_sender =
        |context: &[u8]| ForwardTag::decode(context).is_some_and(|t| t.node == from);
    let of_this_term = |context: &[u8]| ForwardTag::decode(context).is_some_and(|t| t.term == term);
    match message.get_msg_type() {
        MessageType::MsgPropose => {
            let ours = |e: &Entry| match e.get_entry_type() {
                EntryType::EntryNormal => tagged_by_sender(&e.context),
                _ => member_change_of(e).is_some(),
            };
            if !message.entries.iter().all(ours) {
                return Some(format!(
                    "node {from} forwarded an entry that is neither its own command batch nor \
                     a membership change"
                ));
            }
            let normal = |e: &&Entry| e.get_entry_type() == EntryType::EntryNormal;
            if !message
                .entries
                .iter()
                .filter(normal)
                .all(|e| of_this_term(&e.context))
            {
                return Some(format!(
                    "node {from} forwarded an entry of another term than {term}"
                ));
            }
            None
        }
        MessageType::MsgReadIndex => match message.entries.first() {
            Some(entry) if message.entries.len() == 1 && tagged_by_sender(&entry.data) => None,
            _ => Some(format!("node {from} forwarded a read without its own tag")),
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forwarded(msg_type: MessageType, from: u64, entry: Entry) -> Message {
        let mut message = Message::default();
        message.set_msg_type(msg_type);
        message.from = from;
        message.to = 1;
        message.entries = vec![entry].into();
        message
    }

    fn tagged(node: u64, entry_type: EntryType) -> Entry {
        let tag = ForwardTag {
            node,
            id: 7,
            term: 3,
        };
        let mut entry = Entry::default();
        entry.set_entry_type(entry_type);
        entry.context = tag.encode().into();
        entry.data = tag.encode().into();
        entry
    }

    #[test]
    fn a_leader_takes_a_peers_own_command_batches_and_reads() {
        let propose = forwarded(
            MessageType::MsgPropose,
            2,
            tagged(2, EntryType::EntryNormal),
        );
        assert_eq!(refused_request(&propose, StateRole::Leader, 3), None);
        let read = forwarded(
            MessageType::MsgReadIndex,
            2,
            tagged(2, EntryType::EntryNormal),
        );
        assert_eq!(refused_request(&read, StateRole::Leader, 3), None);
    }

    #[test]
    fn forwarded_configuration_changes_forged_tags_and_second_hops_are_refused() {
        let change = forwarded(
            MessageType::MsgPropose,
            2,
            tagged(2, EntryType::EntryConfChangeV2),
        );
        assert!(refused_request(&change, StateRole::Leader, 3).is_some());
        let forged = forwarded(
            MessageType::MsgPropose,
            2,
            tagged(3, EntryType::EntryNormal),
        );
        assert!(refused_request(&forged, StateRole::Leader, 3).is_some());
        let forged_read = forwarded(
            MessageType::MsgReadIndex,
            2,
            tagged(3, EntryType::EntryNormal),
        );
        assert!(refused_request(&forged_read, StateRole::Leader, 3).is_some());
        let untagged = forwarded(MessageType::MsgPropose, 2, Entry::default());
        assert!(refused_request(&untagged, StateRole::Leader, 3).is_some());
        // The sender's own batch of term 3, sent to a follower, or reaching a leader of term 4.
        let own_batch = forwarded(
            MessageType::MsgPropose,
            2,
            tagged(2, EntryType::EntryNormal),
        );
        assert!(refused_request(&own_batch, StateRole::Follower, 3).is_some());
        assert!(refused_request(&own_batch, StateRole::Leader, 4).is_some());
        // Everything else passes through to raft-rs.
        let append = forwarded(MessageType::MsgAppend, 2, Entry::default());
        assert_eq!(refused_request(&append, StateRole::Follower, 3), None);
    }
}
