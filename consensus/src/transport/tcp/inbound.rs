//! A peer's plain TCP connection read by the node's raft worker itself.
//!
//! Read on the network's runtime, a frame wakes a network thread, which hands the messages to
//! the raft worker and wakes it in turn: two wake-ups per frame, and on a virtual machine each
//! can cost tens of microseconds when it lands on an idle CPU. Read by the worker, a frame
//! wakes the thread that handles it, or none if the worker is watching for work. The worker
//! reads between its rounds without blocking (`node_loop/peer_reading.rs`); this file holds
//! the connection, and the checks every frame passes wherever it is read (`FrameTaking`,
//! also used by the runtime's reader in `receiving.rs`).

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

use super::{Counters, TcpNetworkConfig};
use crate::NodeId;
use crate::transport::frame::{self, LENGTH_BYTES};
use crate::transport::peer_table::PeerTable;
use crate::transport::{GroupMessage, MessageSink};

/// Frames one read of a connection delivers at most: a peer that sends without pause cannot
/// keep the worker from its rounds.
const MAX_FRAMES_PER_READ: usize = 64;

/// The read buffer's size while frames are small; a larger frame grows it to its own size
/// (never past the frame limit, checked first) until it is delivered.
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// A peer's connection that has sent its hello, offered to the node
/// ([`crate::transport::MessageSink::adopt`]) to be read on its raft worker.
pub struct PeerConnection {
    peer: NodeId,
    /// The wire version the peer's hello named.
    hello_version: u16,
    /// Non-blocking.
    stream: TcpStream,
    /// Bytes read and not yet delivered: `buffer[start..end]`, whole frames first.
    buffer: Vec<u8>,
    start: usize,
    end: usize,
    /// Since when the buffer has held part of a frame: it must arrive whole within the
    /// network's `frame_read_timeout`.
    partial_since: Option<Instant>,
    frames: FrameTaking,
    /// Counted open while this lives.
    _open: OpenInbound,
}

/// What a read of a connection left.
pub(crate) enum Reading {
    /// Still open; `more` if it stopped at its frame limit with more perhaps waiting.
    Open { more: bool },
    /// Closed, by the peer or for a bad frame (logged and counted): drop it.
    Closed,
}

impl PeerConnection {
    pub(super) fn new(
        peer: NodeId,
        hello_version: u16,
        stream: TcpStream,
        open: OpenInbound,
        frames: FrameTaking,
    ) -> Self {
        PeerConnection {
            peer,
            hello_version,
            stream,
            buffer: Vec::new(),
            start: 0,
            end: 0,
            partial_since: None,
            _open: open,
            frames,
        }
    }

    /// The socket, for the worker to watch for readiness.
    pub(crate) fn socket(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    /// The socket and its count as open back, for reading on the network's runtime: nothing
    /// was read from it yet.
    pub(super) fn into_parts(self) -> (TcpStream, OpenInbound) {
        (self.stream, self._open)
    }

    /// Reads what has arrived without blocking and delivers each whole frame to the node,
    /// checked as on the runtime. A socket is read until it would block (readiness is
    /// reported once per arrival) or until [`MAX_FRAMES_PER_READ`].
    pub(crate) fn read_arrived(&mut self, now: Instant) -> Reading {
        let mut frames = 0;
        loop {
            match self.deliver_buffered(&mut frames) {
                Ok(true) => return Reading::Open { more: true },
                Ok(false) => {}
                Err(()) => return Reading::Closed,
            }
            if self.end == self.buffer.len() {
                self.make_room();
            }
            match self.stream.read(&mut self.buffer[self.end..]) {
                Ok(0) => return Reading::Closed,
                Ok(read) => self.end += read,
                Err(error) if error.kind() == ErrorKind::WouldBlock => break,
                Err(error) if error.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Reading::Closed,
            }
        }
        if self.start == self.end {
            self.partial_since = None;
        } else {
            self.partial_since.get_or_insert(now);
        }
        let timeout = self.frames.config.frame_read_timeout;
        if self
            .partial_since
            .is_some_and(|since| now >= since + timeout)
        {
            let counters = &self.frames.counters;
            counters.bad_frame(self.peer, "the frame stalled".into());
            return Reading::Closed;
        }
        Reading::Open { more: false }
    }

    /// Delivers the whole frames in the buffer, counting them in `frames`: `Ok(true)` when
    /// the limit stopped it, `Err` when the connection is to close.
    fn deliver_buffered(&mut self, frames: &mut usize) -> Result<bool, ()> {
        let max_frame_bytes = self.frames.config.max_frame_bytes;
        while self.end - self.start >= LENGTH_BYTES {
            if *frames == MAX_FRAMES_PER_READ {
                return Ok(true);
            }
            let mut prefix = [0u8; LENGTH_BYTES];
            prefix.copy_from_slice(&self.buffer[self.start..self.start + LENGTH_BYTES]);
            let length = match frame::body_length(prefix, max_frame_bytes) {
                Ok(length) => length,
                Err(error) => {
                    self.frames.counters.bad_frame(self.peer, error.to_string());
                    return Err(());
                }
            };
            let frame_end = self.start + LENGTH_BYTES + length;
            if frame_end > self.end {
                // The rest has not arrived: make room for the whole frame.
                if frame_end - self.start > self.buffer.len() {
                    self.buffer.resize(LENGTH_BYTES + length, 0);
                    self.compact();
                }
                return Ok(false);
            }
            let body = &self.buffer[self.start + LENGTH_BYTES..frame_end];
            match self.frames.take(self.peer, self.hello_version, body) {
                Ok(messages) => self.frames.deliver(self.peer, messages),
                Err(FrameRefused::Bad(reason)) => {
                    self.frames.counters.bad_frame(self.peer, reason);
                    return Err(());
                }
                Err(FrameRefused::Closed) => return Err(()),
            }
            self.start = frame_end;
            self.partial_since = None;
            *frames += 1;
        }
        Ok(false)
    }

    /// Room to read into: the undelivered bytes moved to the front, and a buffer of at least
    /// [`READ_BUFFER_BYTES`]; one a large frame grew is let go once it is delivered.
    fn make_room(&mut self) {
        let pending = self.end - self.start;
        if self.buffer.len() > READ_BUFFER_BYTES && pending < READ_BUFFER_BYTES / 2 {
            let mut smaller = vec![0u8; READ_BUFFER_BYTES];
            smaller[..pending].copy_from_slice(&self.buffer[self.start..self.end]);
            self.buffer = smaller;
            self.start = 0;
            self.end = pending;
            return;
        }
        self.compact();
        if self.end == self.buffer.len() {
            let grown = (self.buffer.len() * 2).max(READ_BUFFER_BYTES);
            self.buffer.resize(grown, 0);
        }
    }

    fn compact(&mut self) {
        if self.start > 0 {
            self.buffer.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }
}

/// A peer's connection carrying frames to this node, counted open while it lives (see
/// `PeerTable::reachable`).
pub(super) struct OpenInbound {
    table: Arc<PeerTable>,
    node: NodeId,
}

impl OpenInbound {
    pub(super) fn new(table: &Arc<PeerTable>, node: NodeId) -> Self {
        table.inbound_opened(node);
        OpenInbound {
            table: table.clone(),
            node,
        }
    }
}

impl Drop for OpenInbound {
    fn drop(&mut self) {
        self.table.inbound_closed(self.node);
    }
}

/// What checking a peer's frames and delivering their messages needs, on the network's
/// runtime and on a raft worker alike.
pub(super) struct FrameTaking {
    pub(super) config: Arc<TcpNetworkConfig>,
    pub(super) table: Arc<PeerTable>,
    pub(super) sink: Arc<OnceLock<Weak<dyn MessageSink>>>,
    pub(super) counters: Arc<Counters>,
    /// The connection's peer's frames and bytes received, as metrics.
    pub(super) frames_received: metrics::Counter,
    pub(super) bytes_received: metrics::Counter,
}

/// Why a frame closes its connection.
pub(super) enum FrameRefused {
    /// Malformed or forged: logged and counted as a bad frame.
    Bad(String),
    /// The peer was removed, or speaks a version this node no longer takes (logged here).
    Closed,
}

impl FrameTaking {
    /// Decodes and checks a frame `body` from `peer` (whose hello named `hello_version`) and
    /// counts it received: its messages for the node, or why the connection closes. The one
    /// check of every frame, wherever it is read.
    pub(super) fn take(
        &self,
        peer: NodeId,
        hello_version: u16,
        body: &[u8],
    ) -> Result<Vec<GroupMessage>, FrameRefused> {
        let messages =
            frame::decode_body(body).map_err(|error| FrameRefused::Bad(error.to_string()))?;
        if let Some(forged) = messages.iter().find(|m| m.message.from != peer) {
            let claimed = forged.message.from;
            return Err(FrameRefused::Bad(format!(
                "a message claims to come from node {claimed}"
            )));
        }
        if !self.table.contains(peer) {
            tracing::info!(
                peer,
                "closed the connection of a node that is no longer a peer"
            );
            return Err(FrameRefused::Closed);
        }
        if !self.table.takes_version(hello_version) {
            tracing::warn!(
                peer,
                wire_version = hello_version,
                "closed the connection of a peer whose version misreads entries committed since"
            );
            return Err(FrameRefused::Closed);
        }
        self.table.heard(peer);
        let bytes = (LENGTH_BYTES + body.len()) as u64;
        Counters::add(&self.counters.frames_received, 1);
        Counters::add(&self.counters.bytes_received, bytes);
        self.frames_received.increment(1);
        self.bytes_received.increment(bytes);
        Ok(messages)
    }

    /// Hands `messages` from `peer` to the node (dropped if it is not set, as raft
    /// tolerates).
    pub(super) fn deliver(&self, peer: NodeId, messages: Vec<GroupMessage>) {
        if let Some(sink) = self.sink.get().and_then(Weak::upgrade) {
            sink.deliver(peer, messages);
        }
    }
}
