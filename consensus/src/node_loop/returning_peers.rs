//! Peers that come back: a member that restarted, or whose link was cut, and is up again.
//!
//! Why: a group asleep on its leader sends no heartbeat, so a member back from a restart
//! does not learn who leads it until its own election timeout ends and its pre-vote wakes
//! the group; it is not ready for one to two election timeouts. A leader that sees a peer come
//! back wakes the groups it leads and lets them sleep: each sends the peer a heartbeat at the
//! next tick, and they fall asleep again once it has their whole log.

use crate::NodeId;

/// The other nodes and whether each was up at the last look.
pub(super) struct ReturningPeers {
    me: NodeId,
    up: Vec<(NodeId, bool)>,
}

impl ReturningPeers {
    /// `peers`: the other nodes (the node itself is left out), each taken to be up, so that
    /// the first look finds only those that went down and came back since.
    pub(super) fn new(me: NodeId, peers: impl IntoIterator<Item = NodeId>) -> Self {
        let mut up: Vec<(NodeId, bool)> = (peers.into_iter())
            .filter(|&peer| peer != me)
            .map(|peer| (peer, true))
            .collect();
        up.sort_unstable();
        up.dedup();
        ReturningPeers { me, up }
    }

    /// Adds a node learned of since (a member a membership change added), taken to be up.
    pub(super) fn know(&mut self, peer: NodeId) {
        if peer == self.me {
            return;
        }
        if let Err(index) = self.up.binary_search_by_key(&peer, |&(node, _)| node) {
            self.up.insert(index, (peer, true));
        }
    }

    /// Looks at every peer: `true` if one that was down at the last look is up now.
    pub(super) fn any_returned(&mut self, is_up: impl Fn(NodeId) -> bool) -> bool {
        let mut returned = false;
        for (peer, was_up) in &mut self.up {
            let up = is_up(*peer);
            returned |= up && !*was_up;
            *was_up = up;
        }
        returned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_counted_back_once_after_it_was_seen_down() {
        let mut peers = ReturningPeers::new(1, [1, 2, 3]);
        assert!(!peers.any_returned(|_| true), "all up from the start");
        assert!(!peers.any_returned(|peer| peer != 3), "node 3 went down");
        assert!(!peers.any_returned(|peer| peer != 3), "still down");
        assert!(peers.any_returned(|_| true), "node 3 is back");
        assert!(!peers.any_returned(|_| true), "and counted once");
    }

    #[test]
    fn a_peer_learned_of_later_is_taken_to_be_up_and_the_node_itself_is_no_peer() {
        let mut peers = ReturningPeers::new(2, [1, 2]);
        peers.know(4);
        peers.know(4);
        peers.know(2);
        assert!(!peers.any_returned(|_| true));
        assert!(!peers.any_returned(|peer| peer != 4));
        assert!(peers.any_returned(|_| true));
        // Node 2 is this node: it is never looked at.
        assert!(!peers.any_returned(|peer| peer != 2));
    }
}
