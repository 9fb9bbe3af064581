//! What peers send: accepting their connections, checking each one's hello, reading its
//! frames and handing their messages to the node; and asking the peers where an unknown node is.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::dialling::{Dialling, INITIAL_BACKOFF};
use super::snapshot_serving::{SnapshotServing, serve_snapshot};
use super::{Counters, PeerIo, TcpNetworkConfig, open_blocking};
use crate::NodeId;
use crate::transport::MessageSink;
use crate::transport::frame::{self, HELLO_HEAD_BYTES, Hello, LENGTH_BYTES, Purpose};
use crate::transport::peer_directory;
use crate::transport::peer_table::PeerTable;

/// How often at most a node asks its peers where a node it does not know is
/// (`peer_directory.rs`): every refused dial of an unknown node would ask otherwise.
const PEER_LOOKUP_INTERVAL: Duration = Duration::from_secs(1);

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
    /// When this node last asked its peers where an unknown node is, and whether it still
    /// asks: one lookup at a time.
    pub(super) peer_lookup: Mutex<PeerLookup>,
}

#[derive(Default)]
pub(super) struct PeerLookup {
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
        return serve_snapshot(stream, peer, receiving.snapshots.clone()).await;
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
