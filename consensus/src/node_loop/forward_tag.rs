//! The tag a follower puts on what it forwards to its leader.

use crate::NodeId;

/// The tag a forwarded entry carries in its context: the node that forwarded it, the id it
/// gave it (so that the node recognises its entry when it commits and answers its callers
/// with the results of its own apply), and the term it was forwarded in (a leader takes it
/// only in that term). Read barriers of followers are tagged the same way, so that the
/// leader never confuses two nodes' reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ForwardTag {
    pub(crate) node: NodeId,
    pub(crate) id: u64,
    pub(crate) term: u64,
}

/// Where a node starts numbering what it forwards (entries and read barriers): a random
/// 64-bit value, drawn anew at every start. Numbering from 1 again after a restart would let
/// an entry this node forwarded before it stopped — still in its log, applied after the
/// restart — carry the tag of a new one in the same term and answer that one's caller with
/// its result (and a late answer to an old read barrier, a new read).
pub(crate) fn first_forward_id() -> u64 {
    // Leave room to count up without wrapping.
    crate::random::random_u64() >> 1
}

impl ForwardTag {
    pub(crate) const BYTES: usize = 24;

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::BYTES);
        out.extend_from_slice(&self.node.to_le_bytes());
        out.extend_from_slice(&self.id.to_le_bytes());
        out.extend_from_slice(&self.term.to_le_bytes());
        out
    }

    /// The tag in `context`, or `None` for a context that is not one (an entry the leader
    /// proposed itself carries none).
    pub(crate) fn decode(context: &[u8]) -> Option<ForwardTag> {
        if context.len() != Self::BYTES {
            return None;
        }
        let field = |at: usize| u64::from_le_bytes(context[at..at + 8].try_into().expect("8"));
        Some(ForwardTag {
            node: field(0),
            id: field(8),
            term: field(16),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_tags_are_refused_never_a_panic() {
        let valid = vec![
            ForwardTag {
                node: 2,
                id: 99,
                term: 5,
            }
            .encode(),
        ];
        for input in concord_storage::testing::hostile_inputs(&valid, 8, 2_000) {
            let _ = ForwardTag::decode(&input);
        }
    }
}
