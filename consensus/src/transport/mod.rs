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
mod peer_directory;
mod peer_sender;
mod peer_table;
mod peer_tls;
pub(crate) mod tcp;

#[cfg(feature = "testing")]
pub use fault_network::{FaultConfig, FaultyNetwork};
pub use in_process::InProcessNetwork;
pub use peer_table::PeerInfo;
pub use peer_tls::{PeerTls, PeerTlsError};
pub use tcp::{PeerConnection, TcpNetwork, TcpNetworkConfig, TcpNetworkStats};

pub(crate) use frame::ADMIN_ENTRIES_WIRE_VERSION;
pub use frame::WIRE_VERSION;

use std::io::Write;

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
    /// On a leader's messages: the highest index every voter that keeps up has persisted, as
    /// the leader knows it (0 when it does not know). How far a follower may compact its log
    /// (a voter further behind is sent a snapshot).
    pub replicated_floor: u64,
}

/// Sends messages to peers. Sending never blocks the raft loop for long and may drop messages
/// (raft retries); it never reorders the messages of one call.
pub trait Transport: Send + Sync + 'static {
    /// Sends `messages`, all addressed to node `to`.
    fn send(&self, to: NodeId, messages: Vec<GroupMessage>);

    /// Fetches `group`'s state from node `from`, applied through at least `min_index`, and
    /// writes it to `out` as a snapshot stream (`concord_storage::snapshot_stream`). Blocks
    /// for as long as the transfer takes: never called on the raft loop. Memory stays bounded
    /// by the stream's buffers, whatever the state's size.
    fn fetch_snapshot(
        &self,
        from: NodeId,
        group: GroupId,
        min_index: u64,
        out: &mut dyn Write,
    ) -> Result<(), SnapshotFetchError>;

    /// Fetches several groups' states from node `from` as [`Transport::fetch_snapshot`]
    /// does, `requests[i]` (group and minimum index) into `outs[i]`: over one connection
    /// where the network and the peer can (a member catching up thousands of small states
    /// then pays a connection, and a thread at either end, per batch rather than per state),
    /// one after another otherwise. One result per request, in order.
    fn fetch_snapshots(
        &self,
        from: NodeId,
        requests: &[(GroupId, u64)],
        outs: &mut [&mut dyn Write],
    ) -> Vec<Result<(), SnapshotFetchError>> {
        fetch_one_by_one(self, from, requests, outs)
    }

    /// A membership change made `node` a member, reachable at `address` (as the change named
    /// it): the network reaches it from now on. Called again for a member already known, it
    /// takes the address given. Networks without addresses ignore it.
    fn add_peer(&self, node: NodeId, address: &str) {
        let _ = (node, address);
    }

    /// `node` is no longer a member of any group of this node: the network may forget it.
    fn remove_peer(&self, node: NodeId) {
        let _ = node;
    }

    /// The other nodes this network reaches: the members it started with and those membership
    /// changes added since (kept across restarts by a network that keeps a file). A node that
    /// lost its log learns from this that it is not alone, even when its settings name it
    /// alone. Networks within one process answer none.
    fn known_peers(&self) -> Vec<NodeId> {
        let mut peers = Vec::new();
        self.visit_known_peers(&mut |peer| peers.push(peer));
        peers
    }

    /// Calls `visit` with each of [`Transport::known_peers`], without collecting them: the
    /// raft workers ask on every tick.
    fn visit_known_peers(&self, visit: &mut dyn FnMut(NodeId)) {
        let _ = visit;
    }

    /// How many connections `node` has opened to this node since this network started. It
    /// grows when the peer restarts or a cut link heals, even when that happens between two
    /// looks at [`Transport::reachable`]; only its changes mean anything. `0`: none, or this
    /// network cannot tell.
    fn connections_opened_by(&self, node: NodeId) -> u64 {
        let _ = node;
        0
    }

    /// How long nothing has been heard from `node` at all — the node-level liveness signal
    /// that lets groups sleep: a follower of a sleeping group wakes when its leader's node
    /// falls silent. `None`: this network cannot tell, and groups never sleep over it.
    fn silent_for(&self, node: NodeId) -> Option<std::time::Duration> {
        let _ = node;
        None
    }

    /// Whether `node` is up and talking to this node now, so that a leadership handed to it
    /// would be taken: by default, whether it was heard from within `within` (and `true` over
    /// a network that cannot tell); a network that knows its connections also asks that
    /// `node`'s connection to this node is open (a member that stopped or crashed closed it).
    fn reachable(&self, node: NodeId, within: std::time::Duration) -> bool {
        self.silent_for(node).is_none_or(|silent| silent < within)
    }

    /// The version of the peer protocol `node` speaks, as it said when it last connected to
    /// this node (`None`: it has not, since this node started). Admin entries wait until every
    /// member of their group speaks one that applies them. Networks within one process carry
    /// messages between nodes of one build: they answer this build's version.
    fn wire_version(&self, node: NodeId) -> Option<u16> {
        let _ = node;
        Some(frame::WIRE_VERSION)
    }

    /// The shortest vote quiet a peer said when it connected: how long, having heard from a
    /// leader, it refuses to vote for another (`NodeConfig::vote_quiet`). A leader's lease
    /// is never longer than nine tenths of it. `None`: no peer said one (networks within one
    /// process, peers of older versions): each is taken to keep this node's own.
    fn shortest_peer_vote_quiet(&self) -> Option<std::time::Duration> {
        None
    }

    /// This node applied an entry that peers speaking a version older than `version` would
    /// misread: from now on, and after restarts when the network keeps a file, it takes no
    /// such peer. Called by the apply thread that applied the entry, before it answers anyone;
    /// must not block it.
    fn require_wire_version(&self, version: u16) {
        let _ = version;
    }
}

/// [`Transport::fetch_snapshots`] as one [`Transport::fetch_snapshot`] after another.
pub(crate) fn fetch_one_by_one<T: Transport + ?Sized>(
    transport: &T,
    from: NodeId,
    requests: &[(GroupId, u64)],
    outs: &mut [&mut dyn Write],
) -> Vec<Result<(), SnapshotFetchError>> {
    (requests.iter().zip(outs.iter_mut()))
        .map(|(&(group, min_index), out)| transport.fetch_snapshot(from, group, min_index, *out))
        .collect()
}

/// The receiving side a node registers with a network.
pub trait MessageSink: Send + Sync + 'static {
    /// Delivers messages sent by node `from` to this node.
    fn deliver(&self, from: NodeId, messages: Vec<GroupMessage>);

    /// Writes `group`'s state, applied through at least `min_index`, to `out` as a snapshot
    /// stream, for a peer that fell behind this node's log (see [`Transport::fetch_snapshot`]).
    fn write_snapshot(
        &self,
        group: GroupId,
        min_index: u64,
        out: &mut dyn Write,
    ) -> Result<u64, SnapshotFetchError>;

    /// Peer `node` restarted: a new run of it opened a connection (a network between
    /// processes knows by the incarnation in its hello, `frame.rs`; one within a process by a
    /// new registration). Whatever leaderships the old run held ended with it, and so did its
    /// leases: the groups it led here need not wait out an election timeout. Over TCP the
    /// node is told before anything the new run sends is delivered; within a process, when
    /// the new run registers, which may follow its first messages (it leads nothing then: a
    /// restarted member holds its vote for an election timeout).
    fn peer_restarted(&self, node: NodeId) {
        let _ = node;
    }

    /// Offers this node a peer's plain TCP connection, its hello read, to read on the node's
    /// own raft thread rather than on the network's runtime: a frame then wakes the thread
    /// that handles it (or none, if that thread is watching for work), not a network thread
    /// that hands it over. Gives it back if the node does not read connections; the network
    /// reads it then.
    fn adopt(&self, connection: Box<PeerConnection>) -> Result<(), Box<PeerConnection>> {
        Err(connection)
    }

    /// Whether this node works: `false` while its log writes stall (one has run longer than
    /// [`crate::LOG_WRITE_STALLED_AFTER`], now or less than [`crate::LOG_WRITE_STALL_HOLD`]
    /// ago: the rule of readiness), and once a worker stopped its groups for a failure (a log
    /// write that failed, a round that panicked). A network stops telling peers that such a
    /// node lives, so that it looks to them as a crashed node would: the groups it leads,
    /// sleeping ones included, elect leaders elsewhere, and none is handed to it.
    fn lives(&self) -> bool {
        true
    }
}

/// Encodes `messages` as one frame body of the TCP network's wire format (`frame.rs`), for a
/// carrier of its own (the benchmarks carry it over gRPC to compare).
pub fn encode_batch(messages: &[GroupMessage]) -> Vec<u8> {
    let mut frame = Vec::new();
    frame::encode_frame(messages, &mut frame);
    frame.split_off(frame::LENGTH_BYTES)
}

/// Decodes what [`encode_batch`] wrote; a malformed body is an error, never a panic.
pub fn decode_batch(body: &[u8]) -> Result<Vec<GroupMessage>, String> {
    frame::decode_body(body).map_err(|error| error.to_string())
}

/// Why a snapshot could not be fetched. The fetching node tries again later.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotFetchError {
    /// The peer cannot serve it now (not applied that far, busy, stopping, unknown group).
    #[error("the peer refused: {0}")]
    Refused(String),
    /// The transfer failed (connection, timeout, size limit, a write to `out`).
    #[error("snapshot transfer failed: {0}")]
    Transfer(String),
}
