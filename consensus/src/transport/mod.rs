//! How raft messages travel between nodes.
//!
//! A node hands each poll round's outgoing messages to its [`Transport`], already grouped per
//! destination (per-peer batching). The in-process network delivers them to another node in
//! the same process; [`TcpNetwork`] carries them between processes, one frame per batch
//! (`frame.rs` is the wire format).

#[cfg(feature = "testing")]
mod fault_network;
mod frame;
mod in_process;
mod tcp;

#[cfg(feature = "testing")]
pub use fault_network::{FaultConfig, FaultyNetwork};
pub use in_process::InProcessNetwork;
pub use tcp::{TcpNetwork, TcpNetworkConfig, TcpNetworkStats};

use concord_storage::GroupId;
use concord_storage::raft::prelude::Message;

use crate::NodeId;

/// A raft message of one group.
#[derive(Clone, Debug)]
pub struct GroupMessage {
    /// The group it belongs to.
    pub group: GroupId,
    /// The raft message (its `from` and `to` are node ids).
    pub message: Message,
    /// On a leader's messages: the highest index every voter has persisted, as the leader
    /// knows it (0 when it does not know). Entries up to it are on every voter, so no one will
    /// need them again: how far a follower may compact its log (there are no snapshots to send
    /// a voter that needs compacted entries).
    pub replicated_floor: u64,
}

/// Sends messages to peers. Sending never blocks the raft loop for long and may drop messages
/// (raft retries); it never reorders the messages of one call.
pub trait Transport: Send + Sync + 'static {
    /// Sends `messages`, all addressed to node `to`.
    fn send(&self, to: NodeId, messages: Vec<GroupMessage>);
}

/// The receiving side a node registers with a network.
pub trait MessageSink: Send + Sync + 'static {
    /// Delivers messages sent by node `from` to this node.
    fn deliver(&self, from: NodeId, messages: Vec<GroupMessage>);
}
