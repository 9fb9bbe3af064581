//! Nodes in one process, talking through function calls: the shape of in-memory raft
//! benchmarks, and of tests.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use parking_lot::RwLock;

use std::io::Write;

use concord_storage::GroupId;

use super::{GroupMessage, MessageSink, SnapshotFetchError, Transport};
use crate::NodeId;

/// A registry of the nodes of one process. Messages to a node that is not registered (not
/// started, or shut down) are dropped, as a real network would.
#[derive(Default)]
pub struct InProcessNetwork {
    nodes: RwLock<HashMap<NodeId, Weak<dyn MessageSink>>>,
    /// How many times each node was registered: the connections it opened, as a network
    /// between processes would count them.
    registrations: RwLock<HashMap<NodeId, u64>>,
}

impl InProcessNetwork {
    /// An empty network.
    pub fn new() -> Arc<Self> {
        Arc::new(InProcessNetwork::default())
    }

    /// Makes `sink` reachable as node `id` (replacing an earlier registration). A node
    /// registered before is a node restarted: the others are told first
    /// ([`MessageSink::peer_restarted`]).
    pub fn register(&self, id: NodeId, sink: Weak<dyn MessageSink>) {
        let restarted = {
            let mut registrations = self.registrations.write();
            let count = registrations.entry(id).or_default();
            *count += 1;
            *count > 1
        };
        if restarted {
            let others: Vec<Arc<dyn MessageSink>> = (self.nodes.read().iter())
                .filter(|&(&node, _)| node != id)
                .filter_map(|(_, other)| other.upgrade())
                .collect();
            for other in others {
                other.peer_restarted(id);
            }
        }
        self.nodes.write().insert(id, sink);
    }

    /// Makes node `id` unreachable.
    pub fn unregister(&self, id: NodeId) {
        self.nodes.write().remove(&id);
    }

    /// The transport node `from` sends with.
    pub fn transport(self: &Arc<Self>, from: NodeId) -> Arc<dyn Transport> {
        Arc::new(InProcessTransport {
            network: self.clone(),
            from,
        })
    }

    /// A registered node is alive unless it says it is stuck ([`MessageSink::lives`]); one
    /// stuck, never registered, or gone has been silent forever.
    pub(crate) fn silent_for(&self, node: NodeId) -> std::time::Duration {
        let alive = self
            .nodes
            .read()
            .get(&node)
            .and_then(Weak::upgrade)
            .is_some_and(|sink| sink.lives());
        if alive {
            std::time::Duration::ZERO
        } else {
            std::time::Duration::MAX
        }
    }

    /// How many times `node` was registered.
    pub(crate) fn connections_opened_by(&self, node: NodeId) -> u64 {
        self.registrations.read().get(&node).copied().unwrap_or(0)
    }

    pub(crate) fn deliver(&self, from: NodeId, to: NodeId, messages: Vec<GroupMessage>) {
        let sink = self.nodes.read().get(&to).and_then(Weak::upgrade);
        if let Some(sink) = sink {
            sink.deliver(from, messages);
        }
    }

    /// Has node `from` write `group`'s state to `out`.
    pub(crate) fn fetch_snapshot(
        &self,
        from: NodeId,
        group: GroupId,
        min_index: u64,
        out: &mut dyn Write,
    ) -> Result<(), SnapshotFetchError> {
        let sink = self.nodes.read().get(&from).and_then(Weak::upgrade);
        let sink = sink
            .ok_or_else(|| SnapshotFetchError::Transfer(format!("node {from} is not reachable")))?;
        sink.write_snapshot(group, min_index, out).map(|_| ())
    }
}

struct InProcessTransport {
    network: Arc<InProcessNetwork>,
    from: NodeId,
}

impl Transport for InProcessTransport {
    fn send(&self, to: NodeId, messages: Vec<GroupMessage>) {
        self.network.deliver(self.from, to, messages);
    }

    fn silent_for(&self, node: NodeId) -> Option<std::time::Duration> {
        Some(self.network.silent_for(node))
    }

    fn connections_opened_by(&self, node: NodeId) -> u64 {
        self.network.connections_opened_by(node)
    }

    fn fetch_snapshot(
        &self,
        from: NodeId,
        group: GroupId,
        min_index: u64,
        out: &mut dyn Write,
    ) -> Result<(), SnapshotFetchError> {
        self.network.fetch_snapshot(from, group, min_index, out)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// A node that can say it is stuck.
    struct Node {
        lives: AtomicBool,
    }

    impl MessageSink for Node {
        fn deliver(&self, _from: NodeId, _messages: Vec<GroupMessage>) {}

        fn write_snapshot(
            &self,
            _group: GroupId,
            _min_index: u64,
            _out: &mut dyn Write,
        ) -> Result<u64, SnapshotFetchError> {
            Err(SnapshotFetchError::Refused("none here".into()))
        }

        fn lives(&self) -> bool {
            self.lives.load(Ordering::Acquire)
        }
    }

    #[test]
    fn a_node_that_says_it_is_stuck_is_silent_until_it_lives_again() {
        let network = InProcessNetwork::new();
        let node: Arc<Node> = Arc::new(Node {
            lives: AtomicBool::new(true),
        });
        let sink: Arc<dyn MessageSink> = node.clone();
        network.register(1, Arc::downgrade(&sink));
        assert_eq!(network.silent_for(1), std::time::Duration::ZERO);
        node.lives.store(false, Ordering::Release);
        assert_eq!(network.silent_for(1), std::time::Duration::MAX);
        node.lives.store(true, Ordering::Release);
        assert_eq!(network.silent_for(1), std::time::Duration::ZERO);
        drop(sink);
        drop(node);
        assert_eq!(network.silent_for(1), std::time::Duration::MAX);
        assert_eq!(network.silent_for(2), std::time::Duration::MAX);
    }
}
