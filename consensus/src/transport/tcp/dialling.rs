//! What this node sends: a dialling task per peer keeps one connection to it and writes what
//! the node's workers leave for it, with keepalives while there is nothing to carry.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::{Counters, PeerIo, TcpNetworkConfig};
use crate::NodeId;
use crate::transport::frame::{self, Hello, LENGTH_BYTES};
use crate::transport::peer_sender::{Broken, PeerSender};
use crate::transport::peer_table::{PeerLink, PeerTable};
use crate::transport::peer_tls::PeerTls;
use crate::transport::{GroupMessage, MessageSink};

/// The first wait before dialling a peer again; it doubles up to [`MAX_BACKOFF`].
pub(super) const INITIAL_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// A peer unreachable this long is named in a warning (once per outage): the dialler keeps
/// trying, but an operator should know that the peer is down or refuses this node.
const UNREACHABLE_WARN_AFTER: Duration = Duration::from_secs(30);

/// Messages packed into one frame at most (besides the byte limit).
const MAX_MESSAGES_PER_FRAME: usize = 4096;

/// What starting a peer's dialling task needs: shared by the network (the configured peers,
/// those membership changes add) and its receiving side (those learned from a peer).
pub(super) struct Dialling {
    /// Where the dialling tasks run.
    pub(super) runtime_handle: tokio::runtime::Handle,
    /// What this node says when it dials (each dial names the version it speaks to that peer).
    pub(super) hello: Hello,
    pub(super) table: Arc<PeerTable>,
    pub(super) config: Arc<TcpNetworkConfig>,
    pub(super) counters: Arc<Counters>,
    /// The local node, asked before each keepalive whether it lives.
    pub(super) sink: Arc<OnceLock<Weak<dyn MessageSink>>>,
}

impl Dialling {
    /// Starts sending to `peer` at `address`: its sender and its dialling task.
    pub(super) fn link(self: &Arc<Self>, peer: NodeId, address: SocketAddr) {
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
    let mut outage = Outage::default();
    let connections =
        metrics::counter!("concord_peer_connections_total", "peer" => peer.node.to_string());
    loop {
        // A peer of an older version refuses a newer hello: speak its version once it has
        // named it in a connection of its own.
        hello.wire_version = table.version_to_speak(peer.node);
        let spoken = hello.wire_version;
        let hello_bytes = hello.encode();
        // A dial that hangs (a peer that takes the connection and never answers the TLS
        // handshake, a lost SYN) is given up like a refused one.
        let dialled = tokio::time::timeout(
            config.frame_read_timeout,
            connect(peer.address, &hello_bytes, config.tls.as_ref()),
        )
        .await
        .unwrap_or_else(|_| {
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no connection within the frame read timeout",
            ))
        });
        let connection = match dialled {
            Ok(connection) => connection,
            Err(error) => {
                tracing::debug!(peer = peer.node, address = %peer.address, %error, "cannot reach peer");
                outage.failed(peer, &error.to_string());
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
            outage.failed(
                peer,
                "it closed each connection at once (it may not know this node)",
            );
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        } else {
            outage.ended();
            backoff = INITIAL_BACKOFF;
        }
    }
}

/// How long a peer has been out of reach, for the one warning an outage gets.
#[derive(Default)]
struct Outage {
    /// When the first failed dial of this outage was; `None` while the peer is reached.
    since: Option<Instant>,
    /// The warning was logged.
    warned: bool,
}

impl Outage {
    /// A dial failed, or its connection ended at once, for `why`.
    fn failed(&mut self, peer: Peer, why: &str) {
        let since = *self.since.get_or_insert_with(Instant::now);
        if !self.warned && since.elapsed() >= UNREACHABLE_WARN_AFTER {
            self.warned = true;
            tracing::warn!(
                peer = peer.node,
                address = %peer.address,
                unreachable_secs = since.elapsed().as_secs(),
                last_error = why,
                "cannot reach a peer; still dialling it"
            );
        }
    }

    /// A connection lasted: the peer was reached, and a later outage gets its own warning.
    fn ended(&mut self) {
        *self = Outage::default();
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
                readable = stream.readable() => {
                    let mut unexpected = [0u8; 64];
                    let read = readable.and_then(|()| stream.try_read(&mut unexpected));
                    if let Some(reason) = read_ends_connection(read) {
                        tracing::debug!(peer = self.peer.node, reason, "peer connection lost");
                        sender.disconnected();
                        return Ended::Reconnect;
                    }
                }
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
        let mut unexpected = [0u8; 64];
        loop {
            let next = tokio::select! {
                next = tokio::time::timeout(self.config.keepalive_interval, queue.recv()) => next,
                // Cancelling this read when a batch comes first loses nothing: no bytes are
                // expected.
                read = stream.read(&mut unexpected) => {
                    if let Some(reason) = read_ends_connection(read) {
                        tracing::debug!(peer = self.peer.node, reason, "peer connection lost");
                        return Ended::Reconnect;
                    }
                    continue;
                }
            };
            // Nothing to carry for a while: an empty frame tells the peer this node lives.
            let mut batch = match next {
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

/// Why a read on a connection this node dialled ends it; `None` if nothing was there to read.
/// A peer only reads what this node dials, so the one thing to read is the end of the
/// connection (it refused the hello, or stopped): watching for it notices the end at once,
/// where a write would fail only at the second frame after it, and a connection with nothing
/// to carry writes no sooner than its next keepalive. Bytes from the peer break the protocol
/// and end the connection too.
fn read_ends_connection(read: std::io::Result<usize>) -> Option<String> {
    match read {
        Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => None,
        Ok(0) => Some("the peer closed the connection".to_string()),
        Ok(_) => Some("the peer wrote on a connection it only reads".to_string()),
        Err(error) => Some(error.to_string()),
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
