//! Which peers the network forgets, checked by the first worker once a second. A node dials
//! every peer it knows, for as long as it runs, so a member gone for good must leave that list:
//! - a member that the configuration a group applies (from the log or from a snapshot) no
//!   longer names is forgotten once no group of this node names it (a group still behind the
//!   removal may need to answer it); the worker gathers them in `NodeShared::peers_removed`;
//! - a peer this node started knowing (its settings' member list, its peers file) that no
//!   group of this node names, once every group knows its configuration, is forgotten when
//!   nothing has come from it for [`SILENT_LIVENESS_TIMEOUTS`] liveness timeouts. That is a
//!   member removed while this node was away: one whose data was wiped starts with the list it
//!   was first given, and no group of it ever names the member as it leaves. The
//!   silence spares a live member that this node's groups have not caught up to (it talks to
//!   this node, if only through keepalives); forgetting one anyway would cost a lookup
//!   (`transport/peer_directory.rs`) when it next dials in.
//!
//! A peer named by some group at a check leaves the second list: should it go later, its
//! removal or a snapshot without it puts it on the first.

use std::time::{Duration, Instant};

use super::Worker;
use crate::NodeId;
use crate::node_loop::replica::Replica;

/// How many liveness timeouts a peer this node started knowing, and no group of it names, must
/// have been silent (since this node started, if never heard) before it is forgotten.
const SILENT_LIVENESS_TIMEOUTS: u32 = 10;

/// How often the first worker checks which peers to forget, while there are any to check:
/// each check reads the members of every group of the node.
const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// The peers this node started knowing that no check has yet found named by a group of this
/// node, nor forgotten (only the first worker fills it), and when the next check is due.
pub(super) struct StartedPeers {
    unconfirmed: Vec<NodeId>,
    started: Instant,
    next_check: Instant,
}

impl StartedPeers {
    /// `peers`, known at start, to be checked from now on.
    pub(super) fn new(peers: Vec<NodeId>, now: Instant) -> Self {
        StartedPeers {
            unconfirmed: peers,
            started: now,
            next_check: now,
        }
    }
}

impl<R: Replica> Worker<R> {
    /// On the first worker, at most once per [`CHECK_INTERVAL`]: forgets the removed members
    /// no group has any more, and the silent peers this node started knowing that none names.
    pub(super) fn forget_peers(&mut self, now: Instant) {
        if self.index != 0 || now < self.started_peers.next_check {
            return;
        }
        self.started_peers.next_check = now + CHECK_INTERVAL;
        self.forget_removed_peers();
        self.forget_silent_started_peers(now);
    }

    /// Tells the network to forget each member a configuration dropped (from the log or a
    /// snapshot) that no group of this node has any more.
    fn forget_removed_peers(&self) {
        let Some(transport) = self.transport.as_ref() else {
            return;
        };
        let mut removed = self.shared.peers_removed.lock();
        if removed.is_empty() {
            return;
        }
        removed.sort_unstable();
        removed.dedup();
        let groups = &self.shared.entrance.groups;
        removed.retain(|&node| {
            let kept = groups
                .values()
                .any(|handle| handle.status.members.lock().contains(node));
            if !kept {
                tracing::info!(
                    node,
                    "no group has the removed member any more; forgetting it"
                );
                transport.remove_peer(node);
            }
            kept
        });
    }

    /// Checks the peers this node started knowing, once every group of the node knows its
    /// configuration: one a group names stays known for good; one none names is forgotten
    /// once silent long enough.
    fn forget_silent_started_peers(&mut self, now: Instant) {
        let Some(transport) = self.transport.as_ref() else {
            return;
        };
        let started = &mut self.started_peers;
        if started.unconfirmed.is_empty() {
            return;
        }
        let mut named = vec![false; started.unconfirmed.len()];
        for handle in self.shared.entrance.groups.values() {
            let members = handle.status.members.lock();
            if members.is_empty() {
                // A group awaits its first configuration (a member that joined, or lost its
                // data, before its first snapshot): what it will name is not known yet.
                return;
            }
            for (named, &node) in named.iter_mut().zip(&started.unconfirmed) {
                *named |= members.contains(node);
            }
        }
        let silence_needed = self.shared.config.liveness_timeout * SILENT_LIVENESS_TIMEOUTS;
        let up_for = now.saturating_duration_since(started.started);
        let mut named = named.into_iter();
        started.unconfirmed.retain(|&node| {
            if named.next().unwrap_or(true) {
                return false;
            }
            let silent_for = transport.silent_for(node).unwrap_or(Duration::ZERO);
            if silent_for.min(up_for) < silence_needed {
                return true;
            }
            tracing::info!(
                node,
                silent_secs = silent_for.min(up_for).as_secs(),
                "no group of this node names a peer it started knowing, and the peer is \
                 silent: forgetting it (a member removed while this node was away)"
            );
            transport.remove_peer(node);
            false
        });
    }
}
