//! [`TcpNetwork`]: peers over TCP, on a tokio runtime of the network's own (never the raft
//! threads, never the callers' runtime).
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

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use concord_storage::GroupId;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::frame::{
    self, HELLO_HEAD_BYTES, Hello, LENGTH_BYTES, MAX_CLIENT_URL_BYTES, OLDEST_WIRE_VERSION,
    Purpose, SNAPSHOT_REFUSED, SNAPSHOT_REQUEST_BYTES, WIRE_VERSION,
};
use super::peer_directory;
use super::peer_sender::{Broken, PeerSender, SendOutcome};
use super::peer_table::{self, PeerInfo, PeerLink, PeerTable};
use super::peer_tls::PeerTls;
use super::{GroupMessage, MessageSink, SnapshotFetchError, Transport};
use crate::NodeId;

/// The first wait before dialling a peer again; it doubles up to [`MAX_BACKOFF`].
const INITIAL_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Messages packed into one frame at most (besides the byte limit).
const MAX_MESSAGES_PER_FRAME: usize = 4096;

/// Snapshots a node sends at once; a peer asking for more is refused and asks again later.
const MAX_SNAPSHOT_SENDS: usize = 2;

/// How often at most a node asks its peers where a node it does not know is
/// (`peer_directory.rs`): every refused dial of an unknown node would ask otherwise.
const PEER_LOOKUP_INTERVAL: Duration = Duration::from_secs(1);

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
    /// How long a started frame (or the hello) may take to arrive in full.
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

    fn refused(&self, from: SocketAddr, reason: String) {
        tracing::warn!(%from, %reason, "refused a peer connection");
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
                snapshot_sends: network.snapshot_sends.clone(),
                dialling: network.dialling.clone(),
                peer_lookup: Mutex::new(PeerLookup::default()),
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

    fn fetch_snapshot(
        &self,
        from: NodeId,
        group: GroupId,
        min_index: u64,
        out: &mut dyn Write,
    ) -> Result<(), SnapshotFetchError> {
        let address = self
            .table
            .address(from)
            .ok_or_else(|| SnapshotFetchError::Transfer(format!("no address for node {from}")))?;
        let hello = Hello {
            wire_version: self.table.version_to_speak(from),
            purpose: Purpose::Snapshot,
            ..self.dialling.hello.clone()
        };
        let transfer = |error: std::io::Error| SnapshotFetchError::Transfer(error.to_string());
        let mut stream = open_blocking(
            address,
            self.config.tls.as_ref(),
            self.config.frame_read_timeout,
        )
        .map_err(transfer)?;
        let mut request = hello.encode();
        request.extend_from_slice(&group.to_le_bytes());
        request.extend_from_slice(&min_index.to_le_bytes());
        stream.write_all(&request).map_err(transfer)?;
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

/// What starting a peer's dialling task needs: shared by the network (the configured peers,
/// those membership changes add) and its receiving side (those learned from a peer).
struct Dialling {
    /// Where the dialling tasks run.
    runtime_handle: tokio::runtime::Handle,
    /// What this node says when it dials (each dial names the version it speaks to that peer).
    hello: Hello,
    table: Arc<PeerTable>,
    config: Arc<TcpNetworkConfig>,
    counters: Arc<Counters>,
    /// The local node, asked before each keepalive whether it lives.
    sink: Arc<OnceLock<Weak<dyn MessageSink>>>,
}

impl Dialling {
    /// Starts sending to `peer` at `address`: its sender and its dialling task.
    fn link(self: &Arc<Self>, peer: NodeId, address: SocketAddr) {
        let (queue, receiver) = mpsc::channel(self.config.send_queue_batches.max(1));
        let sender = Arc::new(PeerSender::new(
            peer,
            queue,
            self.config.max_frame_bytes,
            self.config.send_buffer_bytes,
        ));
        let dialer = self
            .runtime_handle
            .spawn(dial(
                Peer {
                    node: peer,
                    address,
                },
                receiver,
                sender.clone(),
                self.clone(),
            ))
            .abort_handle();
        self.table.insert(
            peer,
            PeerLink {
                address,
                sender,
                dialer,
            },
        );
    }
}

impl Drop for TcpNetwork {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A peer this node sends to.
#[derive(Clone, Copy)]
struct Peer {
    node: NodeId,
    address: SocketAddr,
}

/// How a connection's writing ended.
enum Ended {
    /// The connection broke or was given up: dial again.
    Reconnect,
    /// The network shut down.
    ShutDown,
}

/// Keeps a connection to `peer` and writes to it what workers leave for it: over plain TCP,
/// what their direct writes could not finish and what they queued while there was no
/// connection; over TLS, every batch (one frame per batch and whatever else is queued by then).
async fn dial(
    peer: Peer,
    mut queue: mpsc::Receiver<Vec<GroupMessage>>,
    sender: Arc<PeerSender>,
    dialling: Arc<Dialling>,
) {
    let Dialling {
        table,
        config,
        counters,
        ..
    } = &*dialling;
    let mut hello = dialling.hello.clone();
    let mut backoff = INITIAL_BACKOFF;
    let connections =
        metrics::counter!("concord_peer_connections_total", "peer" => peer.node.to_string());
    loop {
        // A peer one version behind refuses a newer hello: speak its version once it has
        // named it in a connection of its own.
        hello.wire_version = table.version_to_speak(peer.node);
        let spoken = hello.wire_version;
        let hello_bytes = hello.encode();
        let connection = match connect(peer.address, &hello_bytes, config.tls.as_ref()).await {
            Ok(connection) => connection,
            Err(error) => {
                tracing::debug!(peer = peer.node, address = %peer.address, %error, "cannot reach peer");
                // What waits meanwhile would be stale: raft resends what still matters.
                while let Ok(batch) = queue.try_recv() {
                    counters.dropped(batch.len(), "peer_unreachable");
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        let connected_at = Instant::now();
        Counters::add(&counters.connections, 1);
        connections.increment(1);
        Counters::add(&counters.bytes_sent, hello_bytes.len() as u64);
        let writing = Writing {
            peer,
            spoken,
            sender: &sender,
            table,
            config,
            counters,
            local_node: &dialling.sink,
        };
        let ended = match connection {
            Connection::Plain(stream) => writing.plain(Arc::new(stream), &mut queue).await,
            Connection::Tls(stream) => writing.tls(stream, &mut queue).await,
        };
        if let Ended::ShutDown = ended {
            return;
        }
        // A peer that takes the connection and then closes it at once (it refused the hello:
        // it does not know this node yet, say) is dialled again no faster than an unreachable
        // one; a connection that lasted starts the backoff over.
        if connected_at.elapsed() < MAX_BACKOFF {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        } else {
            backoff = INITIAL_BACKOFF;
        }
    }
}

/// What writing one connection to a peer needs.
struct Writing<'a> {
    peer: Peer,
    /// The wire version the connection's hello named.
    spoken: u16,
    sender: &'a PeerSender,
    table: &'a PeerTable,
    config: &'a TcpNetworkConfig,
    counters: &'a Counters,
    local_node: &'a OnceLock<Weak<dyn MessageSink>>,
}

impl Writing<'_> {
    /// Whether a keepalive may say this node lives: not while the node is stuck (see
    /// [`MessageSink::lives`]), so that its peers see it as silent as a crashed one. Before
    /// the node is set, the network speaks for it.
    fn local_node_lives(&self) -> bool {
        match self.local_node.get().map(Weak::upgrade) {
            Some(Some(node)) => node.lives(),
            Some(None) => false,
            None => true,
        }
    }

    /// Over plain TCP: workers write to `stream` themselves; this task writes what they
    /// left, what they queued, and keepalives.
    async fn plain(
        &self,
        stream: Arc<TcpStream>,
        queue: &mut mpsc::Receiver<Vec<GroupMessage>>,
    ) -> Ended {
        let sender = self.sender;
        sender.connected(stream.clone(), self.spoken);
        let mut keepalive = tokio::time::interval(self.config.keepalive_interval);
        keepalive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        keepalive.reset();
        loop {
            tokio::select! {
                batch = queue.recv() => {
                    let Some(mut batch) = batch else {
                        sender.disconnected();
                        return Ended::ShutDown;
                    };
                    // Batches queued while there was no connection (or in the moment one
                    // appeared): one frame for all of them.
                    take_queued(queue, &mut batch);
                    if !self.table.takes_version(self.spoken) {
                        self.counters.dropped(batch.len(), "peer_version_too_old");
                        sender.disconnected();
                        return Ended::Reconnect;
                    }
                    self.append(&batch);
                }
                () = sender.woken() => {}
                _ = keepalive.tick() => {
                    // Nothing carried for a while: an empty frame tells the peer this node
                    // lives.
                    if sender.quiet_since_last_look() && self.local_node_lives() {
                        self.append(&[]);
                    }
                }
            }
            loop {
                match sender.flush() {
                    Ok(true) => break,
                    Ok(false) => {
                        if stream.writable().await.is_err() {
                            sender.disconnected();
                            return Ended::Reconnect;
                        }
                    }
                    Err(Broken) => {
                        tracing::debug!(peer = self.peer.node, "peer connection lost");
                        return Ended::Reconnect;
                    }
                }
            }
        }
    }

    /// Appends one frame of `messages` after what waits for the plain connection.
    fn append(&self, messages: &[GroupMessage]) {
        match self.sender.append(messages) {
            Ok(bytes) => self.counters.sent_frame(self.sender, bytes),
            Err(reason) => self.counters.dropped(messages.len(), reason),
        }
    }

    /// Over TLS: every batch comes through the queue and is written here.
    async fn tls(
        &self,
        mut stream: Box<dyn PeerIo>,
        queue: &mut mpsc::Receiver<Vec<GroupMessage>>,
    ) -> Ended {
        let max_frame_bytes = self.config.max_frame_bytes;
        let mut frame = Vec::new();
        loop {
            // Nothing to carry for a while: an empty frame tells the peer this node lives.
            let mut batch =
                match tokio::time::timeout(self.config.keepalive_interval, queue.recv()).await {
                    Ok(Some(batch)) => batch,
                    Ok(None) => return Ended::ShutDown,
                    Err(_) if self.local_node_lives() => Vec::new(),
                    Err(_) => continue,
                };
            take_queued(queue, &mut batch);
            if !self.table.takes_version(self.spoken) {
                // Entries this node committed since would be misread on this connection.
                self.counters.dropped(batch.len(), "peer_version_too_old");
                return Ended::Reconnect;
            }
            frame.clear();
            frame::encode_frame(&batch, &mut frame);
            if frame.len() - LENGTH_BYTES > max_frame_bytes {
                self.counters.dropped(batch.len(), "frame_too_large");
                continue;
            }
            if let Err(error) = stream.write_all(&frame).await {
                tracing::debug!(peer = self.peer.node, %error, "peer connection lost");
                self.counters.dropped(batch.len(), "connection_lost");
                return Ended::Reconnect;
            }
            self.counters.sent_frame(self.sender, frame.len());
            if frame.capacity() > 4 * 1024 * 1024 && frame.len() < 1024 * 1024 {
                frame = Vec::new(); // Let one large frame's buffer go.
            }
        }
    }
}

/// Adds what else waits in `queue` to `batch`, up to a frame's worth of messages.
fn take_queued(queue: &mut mpsc::Receiver<Vec<GroupMessage>>, batch: &mut Vec<GroupMessage>) {
    while batch.len() < MAX_MESSAGES_PER_FRAME {
        match queue.try_recv() {
            Ok(more) => batch.extend(more),
            Err(_) => break,
        }
    }
}

/// A peer connection: plain TCP, or TLS over it.
trait PeerIo: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> PeerIo for T {}

/// A connection this node dialled, its hello sent.
enum Connection {
    Plain(TcpStream),
    Tls(Box<dyn PeerIo>),
}

async fn connect(
    address: SocketAddr,
    hello: &[u8],
    tls: Option<&PeerTls>,
) -> std::io::Result<Connection> {
    let mut stream = TcpStream::connect(address).await?;
    stream.set_nodelay(true)?;
    match tls {
        None => {
            stream.write_all(hello).await?;
            Ok(Connection::Plain(stream))
        }
        Some(tls) => {
            let name = rustls::pki_types::ServerName::IpAddress(address.ip().into());
            let connector = tokio_rustls::TlsConnector::from(tls.client.clone());
            let mut stream: Box<dyn PeerIo> = Box::new(connector.connect(name, stream).await?);
            stream.write_all(hello).await?;
            Ok(Connection::Tls(stream))
        }
    }
}

/// What reading peer connections needs.
struct Receiving {
    config: Arc<TcpNetworkConfig>,
    table: Arc<PeerTable>,
    sink: Arc<OnceLock<Weak<dyn MessageSink>>>,
    counters: Arc<Counters>,
    client_urls: Arc<Mutex<BTreeMap<NodeId, String>>>,
    /// Snapshots being sent now (at most [`MAX_SNAPSHOT_SENDS`]).
    snapshot_sends: Arc<AtomicUsize>,
    /// Links a peer learned from another peer.
    dialling: Arc<Dialling>,
    /// When this node last asked its peers where an unknown node is, and whether it still
    /// asks: one lookup at a time.
    peer_lookup: Mutex<PeerLookup>,
}

#[derive(Default)]
struct PeerLookup {
    last_started: Option<Instant>,
    running: bool,
}

impl Receiving {
    /// Asks the known peers, on a blocking thread, where `node` is — a node that dialled this
    /// one without being known, perhaps a member added since this node's peers were written
    /// (`peer_directory.rs`) — one lookup at a time, at most once per [`PEER_LOOKUP_INTERVAL`].
    fn look_up_peer(self: &Arc<Self>, node: NodeId) {
        {
            let mut lookup = self.peer_lookup.lock();
            let recent = lookup
                .last_started
                .is_some_and(|at| at.elapsed() < PEER_LOOKUP_INTERVAL);
            if lookup.running || recent {
                return;
            }
            *lookup = PeerLookup {
                last_started: Some(Instant::now()),
                running: true,
            };
        }
        let receiving = self.clone();
        tokio::task::spawn_blocking(move || {
            receiving.learn_peer(node);
            receiving.peer_lookup.lock().running = false;
        });
    }

    /// Asks every known peer for the peers it knows; if each that answers names `node` at one
    /// address, links `node` there and keeps the address in the peers file, as a membership
    /// change would. A peer that does not name it may have removed it (one that lags the
    /// removal would otherwise bring a removed node back): then nothing is learned.
    fn learn_peer(&self, node: NodeId) {
        let mut learned: Option<SocketAddr> = None;
        for peer in self.table.peers() {
            let hello = Hello {
                wire_version: self.table.version_to_speak(peer.node),
                purpose: Purpose::Peers,
                ..self.dialling.hello.clone()
            };
            let timeout = self.config.frame_read_timeout;
            let answer = open_blocking(peer.address, self.config.tls.as_ref(), timeout).and_then(
                |mut stream| {
                    stream.write_all(&hello.encode())?;
                    let deadline = Instant::now() + timeout;
                    let inner = std::io::BufReader::new(stream);
                    peer_directory::decode(&mut peer_directory::UntilDeadline { inner, deadline })
                },
            );
            let known = match answer {
                Ok(known) => known,
                Err(error) => {
                    // Down, or of a build that does not answer this request.
                    tracing::debug!(peer = peer.node, %error, "a peer did not say its peers");
                    continue;
                }
            };
            let named = known.iter().find(|(known, _)| *known == node).map(|p| p.1);
            match (named, learned) {
                (Some(address), None) => learned = Some(address),
                (Some(address), Some(before)) if address == before => {}
                _ => {
                    tracing::debug!(
                        node,
                        peer = peer.node,
                        "a peer does not name the node that dialled, or names another address"
                    );
                    return;
                }
            }
        }
        let Some(address) = learned else {
            tracing::debug!(node, "no peer answered");
            return;
        };
        if self.table.contains(node) {
            return; // Added meanwhile, by a membership change.
        }
        tracing::info!(node, %address, "learned a member's address from the peers");
        if let Err(error) = self.table.record(node, Some(address)) {
            tracing::warn!(node, %error, "cannot keep the learned peer's address on disk");
        }
        self.dialling.link(node, address);
    }
}

/// Accepts peer connections for as long as the network runs.
async fn accept(listener: TcpListener, receiving: Arc<Receiving>) {
    loop {
        match listener.accept().await {
            Ok((stream, from)) => {
                let _ = stream.set_nodelay(true);
                tokio::spawn(receive(stream, from, receiving.clone()));
            }
            Err(error) => {
                // Out of descriptors, say: wait a little rather than spin.
                tracing::warn!(%error, "cannot accept a peer connection");
                tokio::time::sleep(INITIAL_BACKOFF).await;
            }
        }
    }
}

/// Reads a connection's hello within the frame timeout: the peer it comes from, or why it is
/// refused.
async fn read_hello(
    stream: &mut Box<dyn PeerIo>,
    receiving: &Arc<Receiving>,
) -> Result<Hello, String> {
    let Receiving { config, table, .. } = receiving.as_ref();
    let read = async {
        let mut head = [0u8; HELLO_HEAD_BYTES];
        stream
            .read_exact(&mut head)
            .await
            .map_err(|error| format!("no hello: {error}"))?;
        let (mut hello, url_bytes) = Hello::decode_head(&head).map_err(|e| e.to_string())?;
        if hello.cluster_id != config.cluster_id {
            return Err(format!(
                "cluster {} (this node is in cluster {})",
                hello.cluster_id, config.cluster_id
            ));
        }
        if hello.node_id == config.node_id {
            return Err(format!("node {} is this node", hello.node_id));
        }
        if !table.contains(hello.node_id) {
            receiving.look_up_peer(hello.node_id);
            return Err(format!("node {} is not a peer", hello.node_id));
        }
        // Checked before the rest is read: another version may lay it out otherwise.
        table.hear_version(hello.node_id, hello.wire_version)?;
        let mut url = vec![0u8; url_bytes];
        stream
            .read_exact(&mut url)
            .await
            .map_err(|error| format!("no hello: {error}"))?;
        hello.set_client_url(url).map_err(|e| e.to_string())?;
        Ok(hello)
    };
    tokio::time::timeout(config.frame_read_timeout, read)
        .await
        .map_err(|_| "no hello in time".to_string())?
}

/// Reads one peer connection: the hello, then frames, each delivered to the node.
async fn receive(stream: TcpStream, from: SocketAddr, receiving: Arc<Receiving>) {
    let Receiving {
        config,
        table,
        sink,
        counters,
        client_urls,
        ..
    } = receiving.as_ref();
    let mut stream: Box<dyn PeerIo> = match &config.tls {
        None => Box::new(stream),
        Some(tls) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.server.clone());
            match tokio::time::timeout(config.frame_read_timeout, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => Box::new(stream),
                Ok(Err(error)) => {
                    return counters.refused(from, format!("TLS handshake failed: {error}"));
                }
                Err(_) => return counters.refused(from, "no TLS handshake in time".into()),
            }
        }
    };
    let hello = match read_hello(&mut stream, &receiving).await {
        Ok(hello) => hello,
        Err(reason) => return counters.refused(from, reason),
    };
    let peer = hello.node_id;
    let hello_version = hello.wire_version;
    if !hello.client_url.is_empty() {
        client_urls.lock().insert(peer, hello.client_url);
    }
    if hello.purpose == Purpose::Snapshot {
        return serve_snapshot(stream, peer, receiving.clone()).await;
    }
    if hello.purpose == Purpose::Peers {
        let known: Vec<_> = table.peers().iter().map(|p| (p.node, p.address)).collect();
        let _ = stream.write_all(&peer_directory::encode(&known)).await;
        let _ = stream.shutdown().await;
        return;
    }
    let _open = OpenInbound::new(table, peer);
    let label = peer.to_string();
    let frames_received =
        metrics::counter!("concord_peer_frames_received_total", "peer" => label.clone());
    let bytes_received = metrics::counter!("concord_peer_bytes_received_total", "peer" => label);
    let mut body = Vec::new();
    loop {
        let mut prefix = [0u8; LENGTH_BYTES];
        // Between frames a connection may stay quiet; a frame once started must arrive whole.
        if stream.read_exact(&mut prefix).await.is_err() {
            return; // Closed by the peer.
        }
        let length = match frame::body_length(prefix, config.max_frame_bytes) {
            Ok(length) => length,
            Err(error) => return counters.bad_frame(peer, error.to_string()),
        };
        body.resize(length, 0);
        let read = tokio::time::timeout(config.frame_read_timeout, stream.read_exact(&mut body));
        match read.await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return,
            Err(_) => return counters.bad_frame(peer, "the frame stalled".into()),
        }
        let messages = match frame::decode_body(&body) {
            Ok(messages) => messages,
            Err(error) => return counters.bad_frame(peer, error.to_string()),
        };
        if let Some(forged) = messages.iter().find(|m| m.message.from != peer) {
            let claimed = forged.message.from;
            return counters.bad_frame(
                peer,
                format!("a message claims to come from node {claimed}"),
            );
        }
        if !table.contains(peer) {
            tracing::info!(
                peer,
                "closed the connection of a node that is no longer a peer"
            );
            return;
        }
        if !table.takes_version(hello_version) {
            tracing::warn!(
                peer,
                wire_version = hello_version,
                "closed the connection of a peer whose version misreads entries committed since"
            );
            return;
        }
        table.heard(peer);
        Counters::add(&counters.frames_received, 1);
        Counters::add(&counters.bytes_received, (LENGTH_BYTES + length) as u64);
        frames_received.increment(1);
        bytes_received.increment((LENGTH_BYTES + length) as u64);
        if let Some(sink) = sink.get().and_then(Weak::upgrade) {
            sink.deliver(peer, messages);
        }
        if body.capacity() > 4 * 1024 * 1024 && length < 1024 * 1024 {
            body = Vec::new(); // Let one large frame's buffer go.
        }
    }
}

/// A peer's connection carrying frames to this node, counted open while it lives (see
/// `PeerTable::reachable`).
struct OpenInbound<'a> {
    table: &'a PeerTable,
    node: NodeId,
}

impl<'a> OpenInbound<'a> {
    fn new(table: &'a PeerTable, node: NodeId) -> Self {
        table.inbound_opened(node);
        OpenInbound { table, node }
    }
}

impl Drop for OpenInbound<'_> {
    fn drop(&mut self) {
        self.table.inbound_closed(self.node);
    }
}

/// Bytes a snapshot send hands from its thread to the connection at a time.
const SNAPSHOT_CHUNK_BYTES: usize = 64 * 1024;

/// Chunks of a snapshot send waiting for the connection: memory stays bounded by this many
/// chunks, whatever the state's size.
const SNAPSHOT_CHUNKS_QUEUED: usize = 4;

/// Answers one snapshot request from `peer`: reads the request, then streams the group's
/// state, read from the node on a thread of its own (reading a large state must not hold up
/// the network's runtime) and written here in bounded chunks, or writes a refusal.
async fn serve_snapshot(mut stream: Box<dyn PeerIo>, peer: NodeId, receiving: Arc<Receiving>) {
    let mut request = [0u8; SNAPSHOT_REQUEST_BYTES];
    let read = tokio::time::timeout(
        receiving.config.frame_read_timeout,
        stream.read_exact(&mut request),
    );
    if !matches!(read.await, Ok(Ok(_))) {
        return receiving
            .counters
            .bad_frame(peer, "the snapshot request stalled".into());
    }
    let group = u64::from_le_bytes(request[..8].try_into().expect("8 bytes"));
    let min_index = u64::from_le_bytes(request[8..].try_into().expect("8 bytes"));
    let (chunks, mut to_write) = mpsc::channel::<Vec<u8>>(SNAPSHOT_CHUNKS_QUEUED);
    let timeout = receiving.config.frame_read_timeout;
    let spawned = std::thread::Builder::new()
        .name(format!("concord-snapshot-send-{group}"))
        .spawn(move || {
            let out = ChunkWriter {
                chunks,
                pending: Vec::with_capacity(SNAPSHOT_CHUNK_BYTES),
            };
            send_snapshot(out, peer, group, min_index, &receiving)
        });
    if let Err(error) = spawned {
        tracing::warn!(%error, "cannot start a snapshot send");
        return;
    }
    while let Some(chunk) = to_write.recv().await {
        // A peer that stops reading is let go (the sending thread sees its chunks refused).
        if !matches!(
            tokio::time::timeout(timeout, stream.write_all(&chunk)).await,
            Ok(Ok(()))
        ) {
            return;
        }
    }
    // Flushes, and over TLS says the stream ended where it did (not cut off).
    let _ = tokio::time::timeout(timeout, stream.shutdown()).await;
}

/// A `Write` whose bytes go, in chunks of [`SNAPSHOT_CHUNK_BYTES`], to the task that writes
/// them to a peer's connection; blocks while [`SNAPSHOT_CHUNKS_QUEUED`] chunks wait.
struct ChunkWriter {
    chunks: mpsc::Sender<Vec<u8>>,
    pending: Vec<u8>,
}

impl ChunkWriter {
    fn send_pending(&mut self) -> std::io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.pending, Vec::with_capacity(SNAPSHOT_CHUNK_BYTES));
        self.chunks
            .blocking_send(chunk)
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let room = SNAPSHOT_CHUNK_BYTES - self.pending.len();
        let taken = buf.len().min(room);
        self.pending.extend_from_slice(&buf[..taken]);
        if self.pending.len() == SNAPSHOT_CHUNK_BYTES {
            self.send_pending()?;
        }
        Ok(taken)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send_pending()
    }
}

/// Streams `group`'s state to `peer` through `out`, or tells it why not.
fn send_snapshot(
    mut out: ChunkWriter,
    peer: NodeId,
    group: GroupId,
    min_index: u64,
    receiving: &Receiving,
) {
    let sending = receiving.snapshot_sends.fetch_add(1, Ordering::AcqRel) + 1;
    let outcome = if sending > MAX_SNAPSHOT_SENDS {
        Err(SnapshotFetchError::Refused(format!(
            "{MAX_SNAPSHOT_SENDS} snapshots are being sent already"
        )))
    } else {
        match receiving.sink.get().and_then(Weak::upgrade) {
            Some(sink) => {
                let mut counted = CountingWriter {
                    out: &mut out,
                    bytes: 0,
                };
                let written = sink.write_snapshot(group, min_index, &mut counted);
                let bytes = counted.bytes;
                written
                    .map(|applied| (applied, bytes))
                    .map_err(|error| (error, bytes))
            }
            None => Err((
                SnapshotFetchError::Refused("the node is not running".into()),
                0,
            )),
        }
        .map_err(|(error, bytes)| {
            if bytes > 0 {
                // Part of a stream went out: the peer's import fails on it.
                SnapshotFetchError::Transfer(error.to_string())
            } else {
                error
            }
        })
    };
    receiving.snapshot_sends.fetch_sub(1, Ordering::AcqRel);
    match outcome {
        Ok((applied_index, bytes)) => {
            let _ = out.flush();
            Counters::add(&receiving.counters.bytes_sent, bytes);
            tracing::info!(peer, group, applied_index, bytes, "sent a snapshot");
        }
        Err(SnapshotFetchError::Refused(reason)) => {
            let reason = &reason.as_bytes()[..reason.len().min(1024)];
            let _ = out.write_all(SNAPSHOT_REFUSED);
            let _ = out.write_all(&(reason.len() as u16).to_le_bytes());
            let _ = out.write_all(reason);
            let _ = out.flush();
        }
        Err(error) => tracing::warn!(peer, group, %error, "a snapshot send failed"),
    }
}

/// Counts the bytes written through it.
struct CountingWriter<'a> {
    out: &'a mut dyn Write,
    bytes: u64,
}

impl Write for CountingWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let written = self.out.write(buf)?;
        self.bytes += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}
