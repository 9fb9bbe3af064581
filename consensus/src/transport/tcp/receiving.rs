//! What peers send: accepting their connections, checking each one's hello, handing a plain
//! one to the node to read on its raft worker (`inbound.rs`) or reading its frames here and
//! handing their messages to the node, with the checks every frame passes on either path
//! (`FrameTaking`, in `inbound.rs`); and asking the peers where an unknown node is.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::dialling::{Dialling, INITIAL_BACKOFF};
use super::inbound::{FrameRefused, FrameTaking, OpenInbound, PeerConnection};
use super::peer_lookup::{LookupOutcome, PeerLookup};
use super::snapshot_serving::{SnapshotServing, serve_snapshot, serve_snapshots};
use super::{Counters, PeerIo, TcpNetworkConfig, open_blocking};
use crate::NodeId;
use crate::transport::MessageSink;
use crate::transport::frame::{self, HELLO_HEAD_BYTES, Hello, LENGTH_BYTES, Purpose};
use crate::transport::peer_directory;
use crate::transport::peer_table::PeerTable;

/// What reading peer connections needs.
pub(super) struct Receiving {
    pub(super) config: Arc<TcpNetworkConfig>,
    pub(super) table: Arc<PeerTable>,
    pub(super) sink: Arc<OnceLock<Weak<dyn MessageSink>>>,
    pub(super) counters: Arc<Counters>,
    pub(super) client_urls: Arc<Mutex<BTreeMap<NodeId, String>>>,
    /// Answers the connections that ask for a snapshot.
    pub(super) snapshots: Arc<SnapshotServing>,
    /// Links a peer learned from another peer.
    pub(super) dialling: Arc<Dialling>,
    /// When this node may ask its peers where an unknown node is (`peer_lookup.rs`).
    pub(super) peer_lookup: Mutex<PeerLookup>,
    /// The incarnation of each peer's run whose hello this node read last.
    pub(super) incarnations: Mutex<HashMap<NodeId, u64>>,
}

impl Receiving {
    /// What checking and delivering `peer`'s frames needs (`inbound.rs`).
    fn frames(&self, peer: NodeId) -> FrameTaking {
        let label = peer.to_string();
        FrameTaking {
            config: self.config.clone(),
            table: self.table.clone(),
            sink: self.sink.clone(),
            counters: self.counters.clone(),
            frames_received: metrics::counter!(
                "concord_peer_frames_received_total", "peer" => label.clone()
            ),
            bytes_received: metrics::counter!("concord_peer_bytes_received_total", "peer" => label),
        }
    }

    /// Remembers the vote quiet `peer` said in its hello; says so in the log when it changed
    /// and is not this node's own (members configured with different ticks: the leases grow
    /// shorter, `raft_node/lease.rs`).
    fn hear_vote_quiet(&self, peer: NodeId, quiet: Option<Duration>) {
        if !self.table.hear_vote_quiet(peer, quiet) {
            return;
        }
        let own = self.config.vote_quiet;
        match quiet {
            Some(quiet) if quiet != own => tracing::warn!(
                node = self.config.node_id,
                peer,
                peer_vote_quiet_ms = quiet.as_millis() as u64,
                vote_quiet_ms = own.as_millis() as u64,
                "a peer keeps its vote for another time after hearing from a leader (its raft \
                 ticks or election timeout differ from this node's): leases last nine tenths \
                 of the shortest"
            ),
            Some(_) => {}
            None => tracing::info!(
                node = self.config.node_id,
                peer,
                "a peer of an older version does not say its vote quiet: leases take it to \
                 keep this node's"
            ),
        }
    }

    /// Remembers the incarnation `peer` said in its hello, and tells the node when it differs
    /// from the one said before: the peer restarted ([`MessageSink::peer_restarted`]). The
    /// node is told before this connection's first frame is read, and a hello of the same run
    /// on another connection waits here until it has been, so that the node hears of the
    /// restart before anything the new run sends.
    fn hear_incarnation(&self, peer: NodeId, incarnation: Option<u64>) {
        let Some(incarnation) = incarnation else {
            return;
        };
        let mut incarnations = self.incarnations.lock();
        let before = incarnations.insert(peer, incarnation);
        if before.is_none_or(|before| before == incarnation) {
            return;
        }
        tracing::info!(
            node = self.config.node_id,
            peer,
            "a peer restarted: the groups it led elect a leader again"
        );
        if let Some(sink) = self.sink.get().and_then(Weak::upgrade) {
            sink.peer_restarted(peer);
        }
    }

    /// Asks the known peers, on a blocking thread, where `node` is — a node that dialled this
    /// one without being known, perhaps a member added since this node's peers were written
    /// (`peer_directory.rs`) — within the limits of `peer_lookup.rs`.
    fn look_up_peer(self: &Arc<Self>, node: NodeId) {
        if !self.peer_lookup.lock().start(node, Instant::now()) {
            return;
        }
        self.counters.looked_up_a_peer();
        let receiving = self.clone();
        tokio::task::spawn_blocking(move || {
            let outcome = receiving.learn_peer(node);
            (receiving.peer_lookup.lock()).finished(node, outcome, Instant::now());
        });
    }

    /// Asks every known peer for the peers it knows; if each that answers names `node` at one
    /// address, links `node` there and keeps the address in the peers file, as a membership
    /// change would. A peer that does not name it may have removed it (one that lags the
    /// removal would otherwise bring a removed node back): then nothing is learned.
    fn learn_peer(&self, node: NodeId) -> LookupOutcome {
        let mut learned: Option<SocketAddr> = None;
        // Each peer that did not answer, and why (down, stalled, of an older build).
        let mut unanswered: Vec<(NodeId, String)> = Vec::new();
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
                    unanswered.push((peer.node, error.to_string()));
                    continue;
                }
            };
            let named = known.iter().find(|(known, _)| *known == node).map(|p| p.1);
            match (named, learned) {
                (Some(address), None) => learned = Some(address),
                (Some(address), Some(before)) if address == before => {}
                // A newcomer dialling before it is added, or a member removed: not news.
                (None, _) => {
                    tracing::info!(
                        node,
                        peer = peer.node,
                        "an unknown node dialled, and a peer asked where it is does not name it"
                    );
                    return LookupOutcome::NotNamed;
                }
                (Some(address), Some(before)) => {
                    tracing::warn!(
                        node,
                        peer = peer.node,
                        %address,
                        %before,
                        "an unknown node dialled, and the peers asked where it is disagree"
                    );
                    return LookupOutcome::Unsettled;
                }
            }
        }
        let Some(address) = learned else {
            // A node started again without its data and with a member list that names no
            // member up now: it learns nothing until one it names is up.
            tracing::warn!(
                node,
                ?unanswered,
                "an unknown node dialled, and no peer asked where it is answered"
            );
            return LookupOutcome::Unsettled;
        };
        if self.table.contains(node) {
            return LookupOutcome::Learned; // Added meanwhile, by a membership change.
        }
        tracing::info!(node, %address, "learned a member's address from the peers");
        if let Err(error) = self.table.record(node, Some(address)) {
            tracing::warn!(node, %error, "cannot keep the learned peer's address on disk");
        }
        self.dialling.link(node, address);
        LookupOutcome::Learned
    }
}

/// Accepts peer connections for as long as the network runs.
pub(super) async fn accept(listener: TcpListener, receiving: Arc<Receiving>) {
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
async fn read_hello<S: AsyncRead + Unpin>(
    stream: &mut S,
    receiving: &Arc<Receiving>,
) -> Result<Hello, String> {
    let Receiving { config, table, .. } = receiving.as_ref();
    let read = async {
        let mut head = [0u8; HELLO_HEAD_BYTES];
        stream
            .read_exact(&mut head)
            .await
            .map_err(|error| format!("no hello: {error}"))?;
        let (mut hello, rest_bytes) = Hello::decode_head(&head).map_err(|e| e.to_string())?;
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
        let mut rest = vec![0u8; rest_bytes];
        stream
            .read_exact(&mut rest)
            .await
            .map_err(|error| format!("no hello: {error}"))?;
        hello.set_rest(rest).map_err(|e| e.to_string())?;
        Ok(hello)
    };
    tokio::time::timeout(config.frame_read_timeout, read)
        .await
        .map_err(|_| "no hello in time".to_string())?
}

/// Reads one peer connection: the hello, then frames, each delivered to the node. A plain
/// connection carrying frames is offered to the node to read on its raft worker
/// (`inbound.rs`); this task reads the others, and those the node does not take.
async fn receive(stream: TcpStream, from: SocketAddr, receiving: Arc<Receiving>) {
    let Receiving {
        config, counters, ..
    } = receiving.as_ref();
    let (hello, stream) = match &config.tls {
        None => {
            let mut stream = stream;
            match read_hello(&mut stream, &receiving).await {
                Ok(hello) => (hello, Accepted::Plain(stream)),
                Err(reason) => return counters.refused(from, reason),
            }
        }
        Some(tls) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.server.clone());
            let mut stream: Box<dyn PeerIo> = match tokio::time::timeout(
                config.frame_read_timeout,
                acceptor.accept(stream),
            )
            .await
            {
                Ok(Ok(stream)) => Box::new(stream),
                Ok(Err(error)) => {
                    return counters.refused(from, format!("TLS handshake failed: {error}"));
                }
                Err(_) => return counters.refused(from, "no TLS handshake in time".into()),
            };
            match read_hello(&mut stream, &receiving).await {
                Ok(hello) => (hello, Accepted::Tls(stream)),
                Err(reason) => return counters.refused(from, reason),
            }
        }
    };
    let peer = hello.node_id;
    let hello_version = hello.wire_version;
    receiving.hear_vote_quiet(peer, hello.vote_quiet);
    receiving.hear_incarnation(peer, hello.incarnation);
    if !hello.client_url.is_empty() {
        receiving.client_urls.lock().insert(peer, hello.client_url);
    }
    let mut stream = match (hello.purpose, stream) {
        (Purpose::Snapshot, stream) => {
            return serve_snapshot(stream.boxed(), peer, receiving.snapshots.clone()).await;
        }
        (Purpose::Snapshots, stream) => {
            return serve_snapshots(stream.boxed(), peer, receiving.snapshots.clone()).await;
        }
        (Purpose::Peers, stream) => {
            let table = &receiving.table;
            let known: Vec<_> = table.peers().iter().map(|p| (p.node, p.address)).collect();
            let mut stream = stream.boxed();
            let _ = stream.write_all(&peer_directory::encode(&known)).await;
            let _ = stream.shutdown().await;
            return;
        }
        (Purpose::Messages, Accepted::Plain(stream)) => {
            return read_plain(stream, peer, hello_version, &receiving).await;
        }
        (Purpose::Messages, Accepted::Tls(stream)) => stream,
    };
    let _open = OpenInbound::new(&receiving.table, peer);
    let mut frames = FrameReading::new(peer, hello_version, receiving.frames(peer));
    while frames.next(&mut stream).await {}
}

/// A plain connection carrying messages: the node is offered it (`inbound.rs`) between two
/// frames once it is set (frames that arrive before are read here, and dropped as the
/// network drops them without a node); read here if the node does not take it.
async fn read_plain(
    mut stream: TcpStream,
    peer: NodeId,
    hello_version: u16,
    receiving: &Arc<Receiving>,
) {
    let mut open = OpenInbound::new(&receiving.table, peer);
    let mut frames = FrameReading::new(peer, hello_version, receiving.frames(peer));
    while receiving.sink.get().is_none() {
        if !frames.next(&mut stream).await {
            return;
        }
    }
    match offer_to_node(stream, open, peer, hello_version, receiving) {
        Some((kept, kept_open)) => (stream, open) = (kept, kept_open),
        None => return,
    }
    let _open = open;
    while frames.next(&mut stream).await {}
}

/// A connection whose hello was read.
enum Accepted {
    Plain(TcpStream),
    Tls(Box<dyn PeerIo>),
}

impl Accepted {
    fn boxed(self) -> Box<dyn PeerIo> {
        match self {
            Accepted::Plain(stream) => Box::new(stream),
            Accepted::Tls(stream) => stream,
        }
    }
}

/// Offers a plain connection carrying frames to the node, to read on its raft worker
/// (`inbound.rs`). Gives the stream back, and its count as open, if the node does not take
/// it; `None` once the node took it, or if the stream could not leave the runtime (it is
/// closed then, and the peer dials again).
fn offer_to_node(
    stream: TcpStream,
    open: OpenInbound,
    peer: NodeId,
    hello_version: u16,
    receiving: &Arc<Receiving>,
) -> Option<(TcpStream, OpenInbound)> {
    let Some(sink) = receiving.sink.get().and_then(Weak::upgrade) else {
        return Some((stream, open));
    };
    let stream = match stream.into_std() {
        Ok(stream) => stream,
        Err(error) => {
            tracing::debug!(peer, %error, "a peer connection could not leave the runtime");
            return None;
        }
    };
    let connection = Box::new(PeerConnection::new(
        peer,
        hello_version,
        stream,
        open,
        receiving.frames(peer),
    ));
    let Err(connection) = sink.adopt(connection) else {
        Counters::add(&receiving.counters.connections_read_by_node, 1);
        return None;
    };
    let (stream, open) = connection.into_parts();
    match TcpStream::from_std(stream) {
        Ok(stream) => Some((stream, open)),
        Err(error) => {
            tracing::debug!(peer, %error, "a peer connection could not return to the runtime");
            None
        }
    }
}

/// Reads a peer's frames on the runtime, one at a time, each delivered to the node.
struct FrameReading {
    peer: NodeId,
    /// The wire version the peer's hello named.
    hello_version: u16,
    frames: FrameTaking,
    body: Vec<u8>,
}

impl FrameReading {
    fn new(peer: NodeId, hello_version: u16, frames: FrameTaking) -> Self {
        FrameReading {
            peer,
            hello_version,
            frames,
            body: Vec::new(),
        }
    }

    /// Reads the next frame and delivers it: `false` once the connection closed, or a frame
    /// closed it.
    async fn next<S: AsyncRead + Unpin>(&mut self, stream: &mut S) -> bool {
        let FrameTaking {
            config, counters, ..
        } = &self.frames;
        let peer = self.peer;
        let mut prefix = [0u8; LENGTH_BYTES];
        // Between frames a connection may stay quiet; a frame once started must arrive whole.
        if stream.read_exact(&mut prefix).await.is_err() {
            return false; // Closed by the peer.
        }
        let length = match frame::body_length(prefix, config.max_frame_bytes) {
            Ok(length) => length,
            Err(error) => {
                counters.bad_frame(peer, error.to_string());
                return false;
            }
        };
        self.body.resize(length, 0);
        let read =
            tokio::time::timeout(config.frame_read_timeout, stream.read_exact(&mut self.body));
        match read.await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return false,
            Err(_) => {
                counters.bad_frame(peer, "the frame stalled".into());
                return false;
            }
        }
        match self.frames.take(peer, self.hello_version, &self.body) {
            Ok(messages) => self.frames.deliver(peer, messages),
            Err(FrameRefused::Bad(reason)) => {
                counters.bad_frame(peer, reason);
                return false;
            }
            Err(FrameRefused::Closed) => return false,
        }
        if self.body.capacity() > 4 * 1024 * 1024 && length < 1024 * 1024 {
            self.body = Vec::new(); // Let one large frame's buffer go.
        }
        true
    }
}
