//! [`TcpNetwork`]: peers over TCP, on a tokio runtime of the network's own (never the callers'
//! runtime), except what the node's raft threads do themselves: write their rounds' frames
//! (over plain TCP) and read their peers' plain connections.
//!
//! Each node dials each peer once for what it sends (one connection per direction): the
//! connection opens with a hello (wire version, cluster id, node id, the node's client URL),
//! then carries frames
//! (`frame.rs`), each holding every message a worker round had for that peer. Sending never
//! blocks the raft loop: over plain TCP the worker writes its frame to the socket without
//! blocking and leaves what the socket does not take to the connection's task
//! (`peer_sender.rs`); over TLS, and while there is no connection, batches go into a bounded
//! queue per peer. Either way what does not fit is dropped and counted (raft resends). A
//! broken connection is dialled again with a capped backoff. What arrives is checked before it is believed: a hello of
//! another cluster, version or an unknown node, a frame over the size limit, a malformed or
//! stalled frame, or a message that claims to come from another node than the connection's
//! closes the connection, with a log line and a counter; the node goes on serving. A node
//! refused as unknown may be a member added after this node's peers were written: the
//! refusing node asks its peers where it is (`peer_directory.rs`) and dials it if one knows.
//!
//! This file holds the network and its counters; what this node sends is in `dialling.rs`,
//! what peers send in `receiving.rs` (a plain connection, once its hello is read, is handed
//! to the node's raft worker to read: `inbound.rs`), and the answer to a peer's snapshot
//! request in `snapshot_serving.rs`.

mod dialling;
mod inbound;
mod peer_lookup;
mod receiving;
mod snapshot_serving;

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use concord_storage::GroupId;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;

pub use self::inbound::PeerConnection;
pub(crate) use self::inbound::Reading;

use self::dialling::Dialling;
use self::peer_lookup::PeerLookup;
use self::receiving::{Receiving, accept};
use self::snapshot_serving::SnapshotServing;
use super::frame::{
    self, Hello, MAX_CLIENT_URL_BYTES, OLDEST_WIRE_VERSION, Purpose, SNAPSHOT_REFUSED, WIRE_VERSION,
};
use super::peer_sender::{PeerSender, SendOutcome};
use super::peer_table::{self, PeerInfo, PeerTable};
use super::peer_tls::PeerTls;
use super::{GroupMessage, MessageSink, SnapshotFetchError, Transport};
use crate::NodeId;
use crate::node_loop::event_lines::{EventLine, LineCounts};

/// Settings of a [`TcpNetwork`].
#[derive(Clone, Debug)]
pub struct TcpNetworkConfig {
    /// Every node of the cluster says the same; a peer with another is refused.
    pub cluster_id: u64,
    /// This node.
    pub node_id: NodeId,
    /// The peer address of every other node.
    pub peers: BTreeMap<NodeId, SocketAddr>,
    /// Largest frame body, sent or accepted; a larger announced length closes the connection.
    pub max_frame_bytes: usize,
    /// Batches queued per peer while it has no connection (and always over TLS); beyond,
    /// they are dropped.
    pub send_queue_batches: usize,
    /// Bytes of frames per peer waiting for a slow connection; beyond, batches are dropped.
    /// At least one frame of `max_frame_bytes` always fits.
    pub send_buffer_bytes: usize,
    /// How long a started frame (or the hello) may take to arrive in full, and a dial (the
    /// connect and the TLS handshake) to complete.
    pub frame_read_timeout: Duration,
    /// Where this node's clients reach it (its HTTP URL, say), told to every peer in the hello
    /// so that any node can name any other's (see [`TcpNetwork::client_urls`]). At most 1024
    /// bytes; empty if there is none.
    pub client_url: String,
    /// Largest snapshot stream accepted from a peer; a larger one is cut off and refused.
    pub max_snapshot_bytes: u64,
    /// Where the network keeps the peers membership changes taught it (added, moved,
    /// removed), replayed over `peers` when it starts; `None`: kept in memory only.
    pub peers_file: Option<PathBuf>,
    /// Mutual TLS on every peer connection (`None`: plain TCP). Every member of a cluster
    /// must use it, or none.
    pub tls: Option<PeerTls>,
    /// A connection with nothing to carry sends an empty frame this often: the node-level
    /// liveness signal behind `Transport::silent_for`, which lets idle groups sleep without
    /// heartbeats. Keep it well under the nodes' `liveness_timeout`.
    pub keepalive_interval: Duration,
    /// This node's vote quiet, said to every peer in the hello: its node's
    /// [`NodeConfig::vote_quiet`](crate::NodeConfig::vote_quiet), which
    /// [`TcpNetworkConfig::new`] takes from the default ticks and election timeout. Set it whenever the
    /// node's ticks or election timeout differ from the defaults: the peers' leases trust it.
    pub vote_quiet: Duration,
}

impl TcpNetworkConfig {
    /// Defaults for `node_id` of `cluster_id`, reaching `peers`.
    pub fn new(cluster_id: u64, node_id: NodeId, peers: BTreeMap<NodeId, SocketAddr>) -> Self {
        TcpNetworkConfig {
            cluster_id,
            node_id,
            peers,
            max_frame_bytes: 64 * 1024 * 1024,
            send_queue_batches: 1024,
            send_buffer_bytes: 16 * 1024 * 1024,
            frame_read_timeout: Duration::from_secs(10),
            client_url: String::new(),
            max_snapshot_bytes: 64 * 1024 * 1024 * 1024,
            peers_file: None,
            tls: None,
            keepalive_interval: Duration::from_millis(250),
            vote_quiet: crate::NodeConfig::new(node_id, Vec::new(), Vec::new()).vote_quiet(),
        }
    }
}

/// Counts of what a [`TcpNetwork`] sent, received and refused since it started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TcpNetworkStats {
    /// Frames written to peers.
    pub frames_sent: u64,
    /// Bytes written to peers (frames and hellos).
    pub bytes_sent: u64,
    /// Frames read from peers and delivered.
    pub frames_received: u64,
    /// Bytes of the frames delivered.
    pub bytes_received: u64,
    /// Messages dropped on the sending side: a full queue, an unknown peer, a lost connection.
    pub messages_dropped: u64,
    /// Connections to peers established (the first and every reconnection).
    pub connections: u64,
    /// Incoming connections refused at the hello (another cluster or version, an unknown node,
    /// not a Concord peer).
    pub connections_refused: u64,
    /// Incoming connections closed for a bad frame (too large, malformed, stalled, forged).
    pub bad_frames: u64,
    /// Incoming connections the node took to read on its raft worker
    /// ([`MessageSink::adopt`]); the network reads the others.
    pub connections_read_by_node: u64,
    /// Lookups started to ask the peers where a node that dialled without being known is.
    pub peer_lookups: u64,
}

/// Refused connections are logged at `warn` at most once per this interval, counting those
/// refused since the last such line (each of those at `debug`): a peer refused on every dial
/// — a removed member left running dials about once a second — or a hostile host would
/// otherwise fill the log.
const REFUSAL_LINE_INTERVAL: Duration = Duration::from_secs(10);

/// Connections refused since the last line about them, and the first of them.
#[derive(Default)]
struct Refusals {
    refused: u64,
    first: Option<(SocketAddr, String)>,
}

impl LineCounts for Refusals {
    fn add(&mut self, other: &Self) {
        self.refused += other.refused;
        if self.first.is_none() {
            self.first = other.first.clone();
        }
    }

    fn is_empty(&self) -> bool {
        self.refused == 0
    }
}

/// The line about refused connections, at most one per [`REFUSAL_LINE_INTERVAL`].
struct RefusalLine(Mutex<EventLine<Refusals>>);

impl Default for RefusalLine {
    fn default() -> Self {
        RefusalLine(Mutex::new(EventLine::with_interval(REFUSAL_LINE_INTERVAL)))
    }
}

#[derive(Default)]
struct Counters {
    frames_sent: AtomicU64,
    bytes_sent: AtomicU64,
    frames_received: AtomicU64,
    bytes_received: AtomicU64,
    messages_dropped: AtomicU64,
    connections: AtomicU64,
    connections_refused: AtomicU64,
    bad_frames: AtomicU64,
    connections_read_by_node: AtomicU64,
    peer_lookups: AtomicU64,
    refusal_line: RefusalLine,
}

impl Counters {
    fn add(counter: &AtomicU64, by: u64) {
        counter.fetch_add(by, Ordering::Relaxed);
    }

    fn dropped(&self, messages: usize, reason: &'static str) {
        Self::add(&self.messages_dropped, messages as u64);
        metrics::counter!("concord_peer_dropped_messages_total", "reason" => reason)
            .increment(messages as u64);
    }

    fn looked_up_a_peer(&self) {
        Self::add(&self.peer_lookups, 1);
        metrics::counter!("concord_peer_lookups_total").increment(1);
    }

    fn refused(&self, from: SocketAddr, reason: String) {
        tracing::debug!(%from, %reason, "refused a peer connection");
        let this_one = Refusals {
            refused: 1,
            first: Some((from, reason)),
        };
        let due = {
            let mut line = self.refusal_line.0.lock();
            let now = std::time::Instant::now();
            line.add(&this_one, now);
            line.due(now)
        };
        if let Some(Refusals {
            refused,
            first: Some((from, reason)),
        }) = due
        {
            tracing::warn!(
                %from,
                %reason,
                refused,
                "refused peer connections (how many since the last such line, and the first \
                 of them; one such line per 10 s at most, every refusal at debug)"
            );
        }
        Self::add(&self.connections_refused, 1);
        metrics::counter!("concord_peer_connections_refused_total").increment(1);
    }

    /// A frame of `bytes` went to the peer of `sender` (or waits in its buffer).
    fn sent_frame(&self, sender: &PeerSender, bytes: usize) {
        Self::add(&self.frames_sent, 1);
        Self::add(&self.bytes_sent, bytes as u64);
        sender.frames_sent.increment(1);
        sender.bytes_sent.increment(bytes as u64);
    }

    fn bad_frame(&self, from: NodeId, reason: String) {
        tracing::warn!(peer = from, %reason, "closed a peer connection");
        Self::add(&self.bad_frames, 1);
        metrics::counter!("concord_peer_bad_frames_total").increment(1);
    }
}

/// A node's peer network over TCP: the listener for what peers send, and a dialling task per
/// peer for what this node sends.
///
/// ```no_run
/// # use std::collections::BTreeMap;
/// # use concord_consensus::transport::{TcpNetwork, TcpNetworkConfig};
/// let listener = std::net::TcpListener::bind("127.0.0.1:7170")?;
/// let peers = BTreeMap::from([(2, "127.0.0.1:7171".parse()?), (3, "127.0.0.1:7172".parse()?)]);
/// let network = TcpNetwork::start(TcpNetworkConfig::new(42, 1, peers), listener)?;
/// // RaftNode::start(config, stores, factory, network.transport())?, then:
/// // network.deliver_to(node.sink());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct TcpNetwork {
    node_id: NodeId,
    config: Arc<TcpNetworkConfig>,
    /// This node's client URL and each peer's, as its hello said.
    client_urls: Arc<Mutex<BTreeMap<NodeId, String>>>,
    local_addr: SocketAddr,
    /// Every peer this node sends to.
    table: Arc<PeerTable>,
    /// Starts the dialling task of a peer.
    dialling: Arc<Dialling>,
    sink: Arc<OnceLock<Weak<dyn MessageSink>>>,
    counters: Arc<Counters>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    /// Snapshots being sent now (the receiving side counts them).
    snapshot_sends: Arc<AtomicUsize>,
}

impl TcpNetwork {
    /// Starts serving `listener` (bound by the caller, so that it can learn a free port before
    /// the peers are known) and dialling every peer.
    pub fn start(
        config: TcpNetworkConfig,
        listener: std::net::TcpListener,
    ) -> std::io::Result<Arc<TcpNetwork>> {
        if config.client_url.len() > MAX_CLIENT_URL_BYTES {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("the client URL is longer than {MAX_CLIENT_URL_BYTES} bytes"),
            ));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(format!("concord-peer-{}", config.node_id))
            .enable_io()
            .enable_time()
            .build()?;
        let local_addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let sink: Arc<OnceLock<Weak<dyn MessageSink>>> = Arc::new(OnceLock::new());
        let counters = Arc::new(Counters::default());
        let mut known_urls = BTreeMap::new();
        if !config.client_url.is_empty() {
            known_urls.insert(config.node_id, config.client_url.clone());
        }
        let client_urls = Arc::new(Mutex::new(known_urls));
        let mut peers = config.peers.clone();
        let oldest_taken = match &config.peers_file {
            Some(path) => peer_table::replay_file(path, &mut peers)?,
            None => OLDEST_WIRE_VERSION,
        };
        let table = Arc::new(PeerTable::new(config.peers_file.clone(), oldest_taken));
        let snapshot_sends = Arc::new(AtomicUsize::new(0));
        let config = Arc::new(config);
        let hello = Hello {
            wire_version: WIRE_VERSION,
            cluster_id: config.cluster_id,
            node_id: config.node_id,
            purpose: Purpose::Messages,
            client_url: config.client_url.clone(),
            vote_quiet: Some(config.vote_quiet),
            incarnation: Some(crate::random::random_u64()),
        };
        let dialling = Arc::new(Dialling {
            runtime_handle: runtime.handle().clone(),
            hello,
            table: table.clone(),
            config: config.clone(),
            counters: counters.clone(),
            sink: sink.clone(),
        });
        let network = TcpNetwork {
            node_id: config.node_id,
            config: config.clone(),
            client_urls,
            local_addr,
            table,
            dialling,
            sink,
            counters,
            snapshot_sends,
            runtime: Mutex::new(Some(runtime)),
        };
        for (&peer, &address) in &peers {
            if peer != config.node_id {
                network.dialling.link(peer, address);
            }
        }
        // Accepting starts only once every peer is in the table: a peer that dialled the bound
        // listener early would otherwise be refused as unknown.
        {
            let _entered = network.dialling.runtime_handle.enter();
            let listener = TcpListener::from_std(listener)?;
            let receiving = Receiving {
                config: config.clone(),
                table: network.table.clone(),
                sink: network.sink.clone(),
                counters: network.counters.clone(),
                client_urls: network.client_urls.clone(),
                snapshots: Arc::new(SnapshotServing {
                    sink: network.sink.clone(),
                    counters: network.counters.clone(),
                    sends: network.snapshot_sends.clone(),
                    timeout: config.frame_read_timeout,
                    sent_line: Mutex::new(EventLine::new()),
                }),
                dialling: network.dialling.clone(),
                peer_lookup: Mutex::new(PeerLookup::default()),
                incarnations: Mutex::new(HashMap::new()),
            };
            network
                .dialling
                .runtime_handle
                .spawn(accept(listener, Arc::new(receiving)));
        }
        Ok(Arc::new(network))
    }

    /// Snapshots this node is sending to peers now.
    pub fn snapshots_sending(&self) -> usize {
        self.snapshot_sends.load(Ordering::Acquire)
    }

    /// The peers this node sends to, with when each was last heard from.
    pub fn peers(&self) -> Vec<PeerInfo> {
        self.table.peers()
    }

    /// The address peers reach this node at (the real port when the listener took port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The transport this node's raft sends with.
    pub fn transport(self: &Arc<Self>) -> Arc<dyn Transport> {
        self.clone()
    }

    /// Where received messages go (the node's [`crate::RaftNode::sink`]); messages that
    /// arrive before it is set are dropped, as raft tolerates. Set once.
    pub fn deliver_to(&self, sink: Weak<dyn MessageSink>) {
        let _ = self.sink.set(sink);
    }

    /// The client URL of every node whose hello this node received, its own included (a
    /// peer that never connected, or has no URL, is absent).
    pub fn client_urls(&self) -> BTreeMap<NodeId, String> {
        self.client_urls.lock().clone()
    }

    /// What was sent, received and refused so far.
    pub fn stats(&self) -> TcpNetworkStats {
        let c = &self.counters;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        TcpNetworkStats {
            frames_sent: load(&c.frames_sent),
            bytes_sent: load(&c.bytes_sent),
            frames_received: load(&c.frames_received),
            bytes_received: load(&c.bytes_received),
            messages_dropped: load(&c.messages_dropped),
            connections: load(&c.connections),
            connections_refused: load(&c.connections_refused),
            connections_read_by_node: load(&c.connections_read_by_node),
            peer_lookups: load(&c.peer_lookups),
            bad_frames: load(&c.bad_frames),
        }
    }

    /// Closes every connection and stops the network's threads. Idempotent.
    pub fn shutdown(&self) {
        if let Some(runtime) = self.runtime.lock().take() {
            self.table.stop_links();
            runtime.shutdown_background();
        }
    }
}

impl Transport for TcpNetwork {
    fn visit_known_peers(&self, visit: &mut dyn FnMut(NodeId)) {
        self.table.visit_nodes(&mut |node| {
            if node != self.node_id {
                visit(node);
            }
        });
    }

    fn connections_opened_by(&self, node: NodeId) -> u64 {
        self.table.connections_opened_by(node)
    }

    fn send(&self, to: NodeId, messages: Vec<GroupMessage>) {
        let count = messages.len();
        let Some(sender) = self.table.sender(to) else {
            self.counters.dropped(count, "unknown_peer");
            tracing::debug!(node = self.node_id, to, "no address for this peer");
            return;
        };
        match sender.send(messages, |version| self.table.takes_version(version)) {
            SendOutcome::Sent { bytes } => self.counters.sent_frame(&sender, bytes),
            SendOutcome::NotConnected(messages) => {
                if sender.queue.try_send(messages).is_err() {
                    self.counters.dropped(count, "queue_full");
                }
            }
            SendOutcome::Dropped(reason) => self.counters.dropped(count, reason),
        }
    }

    fn add_peer(&self, node: NodeId, address: &str) {
        if node == self.node_id {
            return;
        }
        let Ok(address) = address.parse::<SocketAddr>() else {
            tracing::warn!(
                node,
                address,
                "a membership change named an address that is not host:port; ignored"
            );
            return;
        };
        if self.table.address(node) == Some(address) {
            return;
        }
        tracing::info!(node, %address, "a new peer");
        if let Err(error) = self.table.record(node, Some(address)) {
            tracing::warn!(node, %error, "cannot keep the new peer's address on disk");
        }
        self.dialling.link(node, address);
    }

    fn silent_for(&self, node: NodeId) -> Option<Duration> {
        Some(self.table.silent_for(node))
    }

    fn reachable(&self, node: NodeId, within: Duration) -> bool {
        self.table.reachable(node, within)
    }

    fn wire_version(&self, node: NodeId) -> Option<u16> {
        self.table.wire_version(node)
    }

    fn shortest_peer_vote_quiet(&self) -> Option<Duration> {
        self.table.shortest_vote_quiet()
    }

    fn require_wire_version(&self, version: u16) {
        if !self.table.raise_oldest_taken(version) {
            return;
        }
        tracing::info!(
            node = self.node_id,
            wire_version = version,
            "this node applied entries older peers misread: it takes no peer speaking less"
        );
        let table = self.table.clone();
        // A synced file write: off the apply thread that called.
        self.dialling.runtime_handle.spawn_blocking(move || {
            if let Err(error) = table.record_oldest_taken(version) {
                tracing::warn!(%error, "cannot keep the oldest peer version taken on disk");
            }
        });
    }

    fn remove_peer(&self, node: NodeId) {
        if self.table.remove(node) {
            tracing::info!(node, "forgot a removed peer");
            if let Err(error) = self.table.record(node, None) {
                tracing::warn!(node, %error, "cannot keep the peer's removal on disk");
            }
        }
    }

    fn fetch_snapshots(
        &self,
        from: NodeId,
        requests: &[(GroupId, u64)],
        outs: &mut [&mut dyn Write],
    ) -> Vec<Result<(), SnapshotFetchError>> {
        // A peer whose hello said it answers several requests on one connection; one not
        // heard from yet, or of an older version, is asked one request at a time.
        let batches = self
            .table
            .wire_version(from)
            .is_some_and(|version| version >= frame::SNAPSHOTS_WIRE_VERSION);
        if !batches || requests.len() < 2 {
            return super::fetch_one_by_one(self, from, requests, outs);
        }
        let count = requests.len().min(frame::MAX_SNAPSHOT_REQUESTS);
        let mut results = Vec::with_capacity(requests.len());
        if let Err(error) =
            self.fetch_batch(from, &requests[..count], &mut outs[..count], &mut results)
        {
            let reason = match &error {
                SnapshotFetchError::Refused(reason) | SnapshotFetchError::Transfer(reason) => {
                    reason.clone()
                }
            };
            results.push(Err(error));
            while results.len() < requests.len() {
                results.push(Err(SnapshotFetchError::Transfer(reason.clone())));
            }
        }
        // More requests than one connection carries: the rest one at a time.
        for (&(group, min_index), out) in requests.iter().zip(outs.iter_mut()).skip(results.len()) {
            results.push(self.fetch_snapshot(from, group, min_index, *out));
        }
        results
    }

    fn fetch_snapshot(
        &self,
        from: NodeId,
        group: GroupId,
        min_index: u64,
        out: &mut dyn Write,
    ) -> Result<(), SnapshotFetchError> {
        let transfer = |error: std::io::Error| SnapshotFetchError::Transfer(error.to_string());
        let mut request = group.to_le_bytes().to_vec();
        request.extend_from_slice(&min_index.to_le_bytes());
        let stream = self.snapshot_connection(from, Purpose::Snapshot, &request)?;
        let mut reader = std::io::BufReader::with_capacity(64 * 1024, stream);
        let mut magic = [0u8; 8];
        reader.read_exact(&mut magic).map_err(transfer)?;
        if &magic == SNAPSHOT_REFUSED {
            let mut length = [0u8; 2];
            reader.read_exact(&mut length).map_err(transfer)?;
            let mut reason = vec![0u8; u16::from_le_bytes(length) as usize];
            reader.read_exact(&mut reason).map_err(transfer)?;
            return Err(SnapshotFetchError::Refused(
                String::from_utf8_lossy(&reason).into_owned(),
            ));
        }
        out.write_all(&magic).map_err(transfer)?;
        // The stream's own checks (checksum, count, key order) run when it is imported; here
        // only its size is bounded.
        let limit = self.config.max_snapshot_bytes;
        let copied = std::io::copy(&mut reader.by_ref().take(limit), out).map_err(transfer)?;
        if copied == limit {
            return Err(SnapshotFetchError::Transfer(format!(
                "the snapshot exceeds the limit of {limit} bytes"
            )));
        }
        Counters::add(&self.counters.bytes_received, copied + 8);
        Ok(())
    }
}

impl TcpNetwork {
    /// A blocking connection to node `from` for snapshots: its hello (of `purpose`) and
    /// `request` written.
    fn snapshot_connection(
        &self,
        from: NodeId,
        purpose: Purpose,
        request: &[u8],
    ) -> Result<Box<dyn ReadWrite>, SnapshotFetchError> {
        let transfer = |error: std::io::Error| SnapshotFetchError::Transfer(error.to_string());
        let address = self
            .table
            .address(from)
            .ok_or_else(|| SnapshotFetchError::Transfer(format!("no address for node {from}")))?;
        let hello = Hello {
            wire_version: self.table.version_to_speak(from),
            purpose,
            ..self.dialling.hello.clone()
        };
        let mut stream = open_blocking(
            address,
            self.config.tls.as_ref(),
            self.config.frame_read_timeout,
        )
        .map_err(transfer)?;
        let mut opening = hello.encode();
        opening.extend_from_slice(request);
        stream.write_all(&opening).map_err(transfer)?;
        Ok(stream)
    }

    /// Fetches `requests` from node `from` over one connection (`frame.rs`, purpose 3),
    /// pushing one result per request onto `results` as each answer ends; an error ends the
    /// connection, and the requests left without a result are the caller's to fail.
    fn fetch_batch(
        &self,
        from: NodeId,
        requests: &[(GroupId, u64)],
        outs: &mut [&mut dyn Write],
        results: &mut Vec<Result<(), SnapshotFetchError>>,
    ) -> Result<(), SnapshotFetchError> {
        let transfer = |error: std::io::Error| SnapshotFetchError::Transfer(error.to_string());
        let request = frame::encode_snapshot_requests(requests);
        let stream = self.snapshot_connection(from, Purpose::Snapshots, &request)?;
        let mut reader = std::io::BufReader::with_capacity(64 * 1024, stream);
        let limit = self.config.max_snapshot_bytes;
        for out in outs.iter_mut() {
            let mut marker = [0u8; 1];
            reader.read_exact(&mut marker).map_err(transfer)?;
            match marker[0] {
                frame::SNAPSHOTS_REFUSED => {
                    let mut length = [0u8; 2];
                    reader.read_exact(&mut length).map_err(transfer)?;
                    let mut reason = vec![0u8; u16::from_le_bytes(length) as usize];
                    reader.read_exact(&mut reason).map_err(transfer)?;
                    let reason = String::from_utf8_lossy(&reason).into_owned();
                    results.push(Err(SnapshotFetchError::Refused(reason)));
                }
                frame::SNAPSHOTS_STATE => {
                    let bytes = copy_chunks(&mut reader, &mut **out, limit)?;
                    Counters::add(&self.counters.bytes_received, bytes);
                    results.push(Ok(()));
                }
                other => {
                    return Err(SnapshotFetchError::Transfer(format!(
                        "node {from} answered a snapshot request with {other}, neither a state \
                         nor a refusal"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// Copies a framed state's chunks from `reader` to `out` until the empty chunk that ends it:
/// each chunk's length is checked against [`frame::MAX_SNAPSHOT_CHUNK_BYTES`] and the
/// state's against `limit` before it is read. The state's bytes.
fn copy_chunks(
    reader: &mut impl Read,
    out: &mut dyn Write,
    limit: u64,
) -> Result<u64, SnapshotFetchError> {
    let transfer = |error: std::io::Error| SnapshotFetchError::Transfer(error.to_string());
    let mut total: u64 = 0;
    loop {
        let mut length = [0u8; 4];
        reader.read_exact(&mut length).map_err(transfer)?;
        let length = u64::from(u32::from_le_bytes(length));
        if length == 0 {
            return Ok(total);
        }
        if length > frame::MAX_SNAPSHOT_CHUNK_BYTES as u64 {
            return Err(SnapshotFetchError::Transfer(format!(
                "a snapshot chunk of {length} bytes exceeds the limit of {} bytes",
                frame::MAX_SNAPSHOT_CHUNK_BYTES
            )));
        }
        total += length;
        if total >= limit {
            return Err(SnapshotFetchError::Transfer(format!(
                "the snapshot exceeds the limit of {limit} bytes"
            )));
        }
        let copied = std::io::copy(&mut reader.by_ref().take(length), out).map_err(transfer)?;
        if copied != length {
            return Err(SnapshotFetchError::Transfer(
                "the snapshot stream was cut short".into(),
            ));
        }
    }
}

/// The blocking side of a snapshot fetch or a peers request: plain TCP, or TLS over it.
trait ReadWrite: Read + Write + Send {}
impl<T: Read + Write + Send> ReadWrite for T {}

/// A blocking connection to a peer at `address` (TLS over it if `tls`) whose every read and
/// write gives up after `timeout`.
fn open_blocking(
    address: SocketAddr,
    tls: Option<&PeerTls>,
    timeout: Duration,
) -> std::io::Result<Box<dyn ReadWrite>> {
    let tcp = std::net::TcpStream::connect_timeout(&address, timeout)?;
    tcp.set_read_timeout(Some(timeout))?;
    tcp.set_write_timeout(Some(timeout))?;
    Ok(match tls {
        None => Box::new(tcp),
        Some(tls) => {
            let name = rustls::pki_types::ServerName::IpAddress(address.ip().into());
            let connection = rustls::ClientConnection::new(tls.client.clone(), name)
                .map_err(std::io::Error::other)?;
            Box::new(rustls::StreamOwned::new(connection, tcp))
        }
    })
}

impl Drop for TcpNetwork {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A peer connection: plain TCP, or TLS over it.
trait PeerIo: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> PeerIo for T {}
