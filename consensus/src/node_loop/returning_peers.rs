//! Peers that come back: a member that restarted, or whose link was cut, and is up again.
//!
//! Why: a group asleep on its leader sends no heartbeat, so a member back from a restart
//! does not learn who leads it until its own election timeout ends and its pre-vote wakes
//! the group; it is not ready for one to two election timeouts. A leader that sees a peer come
//! back wakes the groups it leads and lets them sleep: each sends the peer a heartbeat at the
//! next tick, and they fall asleep again once it has their whole log.
//!
//! The other way round, the peer back may have led groups that sleep here. If it restarted,
//! it leads none of them now, and a member quick to come back is never silent for long
//! enough to wake its followers the usual way (`Transport::silent_for`): they would sleep on
//! until something else woke them, and only then start the election timeout that replaces
//! the leader. So the followers here wake too. If the peer was only cut off and still leads,
//! it wakes those groups itself when it sees this node back, and its heartbeats keep the
//! followers from campaigning: they fall asleep again with it.
//!
//! A peer is back when it is up now and was down at the last look, or when it opened a
//! connection since: a member that restarts between two looks (a quick restart, or one whose
//! data was wiped) is never seen down, and its new connection is the only sign.

use crate::NodeId;

/// A peer as it was at the last look.
#[derive(Clone, Copy)]
struct LastLook {
    node: NodeId,
    up: bool,
    /// Connections it had opened to this node (`None`: not looked at yet).
    connections_opened: Option<u64>,
}

/// The other nodes and how each was at the last look.
pub(super) struct ReturningPeers {
    me: NodeId,
    peers: Vec<LastLook>,
}

impl ReturningPeers {
    /// `peers`: the other nodes (the node itself is left out), each taken to be up, so that
    /// the first look finds only those that went down and came back since.
    pub(super) fn new(me: NodeId, peers: impl IntoIterator<Item = NodeId>) -> Self {
        let mut returning = ReturningPeers {
            me,
            peers: Vec::new(),
        };
        for peer in peers {
            returning.know(peer);
        }
        returning
    }

    /// Adds a node learned of since (a member a membership change added), taken to be up.
    pub(super) fn know(&mut self, peer: NodeId) {
        if peer == self.me {
            return;
        }
        if let Err(index) = self.peers.binary_search_by_key(&peer, |look| look.node) {
            let look = LastLook {
                node: peer,
                up: true,
                connections_opened: None,
            };
            self.peers.insert(index, look);
        }
    }

    /// Looks at every peer, and adds to `returned` each that was down at the last look and is
    /// up now, or that is up and opened a connection since. `is_up` and `connections_opened`
    /// ask the network about one peer.
    pub(super) fn look(
        &mut self,
        is_up: impl Fn(NodeId) -> bool,
        connections_opened: impl Fn(NodeId) -> u64,
        returned: &mut Vec<NodeId>,
    ) {
        for look in &mut self.peers {
            let up = is_up(look.node);
            let opened = connections_opened(look.node);
            let reconnected = look
                .connections_opened
                .is_some_and(|before| before != opened);
            if up && (!look.up || reconnected) {
                returned.push(look.node);
            }
            look.up = up;
            look.connections_opened = Some(opened);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The peers a look finds back.
    fn back(
        peers: &mut ReturningPeers,
        is_up: impl Fn(NodeId) -> bool,
        opened: impl Fn(NodeId) -> u64,
    ) -> Vec<NodeId> {
        let mut returned = Vec::new();
        peers.look(is_up, opened, &mut returned);
        returned
    }

    #[test]
    fn a_peer_is_counted_back_once_after_it_was_seen_down() {
        let mut peers = ReturningPeers::new(1, [1, 2, 3]);
        let opened = |_| 1;
        let none: Vec<NodeId> = Vec::new();
        assert_eq!(
            back(&mut peers, |_| true, opened),
            none,
            "all up from the start"
        );
        assert_eq!(
            back(&mut peers, |peer| peer != 3, opened),
            none,
            "node 3 went down"
        );
        assert_eq!(
            back(&mut peers, |peer| peer != 3, opened),
            none,
            "still down"
        );
        assert_eq!(
            back(&mut peers, |_| true, opened),
            vec![3],
            "node 3 is back"
        );
        assert_eq!(back(&mut peers, |_| true, opened), none, "and counted once");
        // Two back at one look are both named.
        back(&mut peers, |peer| peer == 1, opened);
        assert_eq!(back(&mut peers, |_| true, opened), vec![2, 3]);
    }

    #[test]
    fn a_peer_that_reconnected_between_two_looks_is_back_though_never_seen_down() {
        let mut peers = ReturningPeers::new(1, [2, 3]);
        let before = |_| 4;
        let after = |peer| if peer == 3 { 5 } else { 4 };
        let none: Vec<NodeId> = Vec::new();
        assert_eq!(
            back(&mut peers, |_| true, before),
            none,
            "the first look sets the counts"
        );
        assert_eq!(back(&mut peers, |_| true, before), none, "nothing new");
        assert_eq!(
            back(&mut peers, |_| true, after),
            vec![3],
            "node 3 connected again"
        );
        assert_eq!(back(&mut peers, |_| true, after), none, "and counted once");
        // A new connection from a peer that is down again by the look is no return yet: it
        // counts when the peer is up.
        let later = |peer| if peer == 3 { 6 } else { 4 };
        assert_eq!(back(&mut peers, |peer| peer != 3, later), none);
        assert_eq!(back(&mut peers, |_| true, later), vec![3]);
    }

    #[test]
    fn a_peer_learned_of_later_is_taken_to_be_up_and_the_node_itself_is_no_peer() {
        let mut peers = ReturningPeers::new(2, [1, 2]);
        let opened = |_| 0;
        peers.know(4);
        peers.know(4);
        peers.know(2);
        let none: Vec<NodeId> = Vec::new();
        assert_eq!(back(&mut peers, |_| true, opened), none);
        assert_eq!(back(&mut peers, |peer| peer != 4, opened), none);
        assert_eq!(back(&mut peers, |_| true, opened), vec![4]);
        // Node 2 is this node: it is never looked at.
        assert_eq!(back(&mut peers, |peer| peer != 2, opened), none);
    }

    #[test]
    fn a_peer_learned_of_with_connections_already_opened_is_not_back_at_the_first_look() {
        let mut peers = ReturningPeers::new(1, [2]);
        let none: Vec<NodeId> = Vec::new();
        assert_eq!(back(&mut peers, |_| true, |_| 3), none);
        peers.know(5);
        let opened = |peer| if peer == 5 { 7 } else { 3 };
        assert_eq!(back(&mut peers, |_| true, opened), none);
    }
}
