//! Serving a peer's snapshot request: the group's state streamed from a thread of its own,
//! in bounded chunks, or a refusal.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use concord_storage::GroupId;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::{Counters, PeerIo};
use crate::NodeId;
use crate::node_loop::event_lines::{EventLine, LINE_INTERVAL, SnapshotCounts};
use crate::transport::frame::{
    self, MAX_SNAPSHOT_CHUNK_BYTES, SNAPSHOT_REFUSED, SNAPSHOT_REQUEST_BYTES, SNAPSHOTS_REFUSED,
    SNAPSHOTS_STATE,
};
use crate::transport::{MessageSink, SnapshotFetchError};

/// Snapshot sends a node runs at once (a send: one state, or a batch of them on one
/// connection); a peer asking for more is refused and asks again later. Half a catching-up
/// member's fetches, so that two members serving it keep them all busy.
const MAX_SNAPSHOT_SENDS: usize = 4;

/// Bytes a snapshot send hands from its thread to the connection at a time.
const SNAPSHOT_CHUNK_BYTES: usize = 64 * 1024;

/// Chunks of a snapshot send waiting for the connection: memory stays bounded by this many
/// chunks, whatever the state's size.
const SNAPSHOT_CHUNKS_QUEUED: usize = 4;

/// What answering snapshot requests needs.
pub(super) struct SnapshotServing {
    /// The local node, which writes the group's state.
    pub(super) sink: Arc<OnceLock<Weak<dyn MessageSink>>>,
    pub(super) counters: Arc<Counters>,
    /// Snapshots being sent now (at most [`MAX_SNAPSHOT_SENDS`]).
    pub(super) sends: Arc<AtomicUsize>,
    /// How long the request may take to arrive, and each chunk to be taken by the peer.
    pub(super) timeout: Duration,
    /// Snapshots sent since the last line about them (`event_lines.rs`).
    pub(super) sent_line: Mutex<EventLine<SnapshotCounts>>,
}

/// Answers one snapshot request from `peer`: reads the request, then streams the group's
/// state, read from the node on a thread of its own (reading a large state must not hold up
/// the network's runtime) and written here in bounded chunks, or writes a refusal.
pub(super) async fn serve_snapshot(
    mut stream: Box<dyn PeerIo>,
    peer: NodeId,
    serving: Arc<SnapshotServing>,
) {
    let timeout = serving.timeout;
    let mut request = [0u8; SNAPSHOT_REQUEST_BYTES];
    let read = tokio::time::timeout(timeout, stream.read_exact(&mut request));
    if !matches!(read.await, Ok(Ok(_))) {
        return serving
            .counters
            .bad_frame(peer, "the snapshot request stalled".into());
    }
    let group = u64::from_le_bytes(request[..8].try_into().expect("8 bytes"));
    let min_index = u64::from_le_bytes(request[8..].try_into().expect("8 bytes"));
    let (chunks, to_write) = mpsc::channel::<Vec<u8>>(SNAPSHOT_CHUNKS_QUEUED);
    let sending = serving.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("concord-snapshot-send-{group}"))
        .spawn(move || {
            let out = ChunkWriter::plain(chunks);
            send_snapshot(out, peer, group, min_index, &sending)
        });
    if let Err(error) = spawned {
        let reason = format!("group {group} to node {peer}: cannot start a send thread: {error}");
        count_send(&serving, SnapshotCounts::failed(reason));
        write_what_is_left(&serving).await;
        return;
    }
    write_chunks(stream, to_write, &serving).await;
}

/// Answers several snapshot requests from `peer` on one connection (`frame.rs`, purpose 3):
/// reads them, then streams each group's state in turn, framed in chunks, or a refusal, from
/// one thread of its own. The batch is one send against [`MAX_SNAPSHOT_SENDS`].
pub(super) async fn serve_snapshots(
    mut stream: Box<dyn PeerIo>,
    peer: NodeId,
    serving: Arc<SnapshotServing>,
) {
    let read = tokio::time::timeout(serving.timeout, read_requests(&mut stream));
    let requests = match read.await {
        Ok(Ok(requests)) => requests,
        Ok(Err(reason)) => return serving.counters.bad_frame(peer, reason),
        Err(_) => {
            return serving
                .counters
                .bad_frame(peer, "the snapshot requests stalled".into());
        }
    };
    let (chunks, to_write) = mpsc::channel::<Vec<u8>>(SNAPSHOT_CHUNKS_QUEUED);
    let sending = serving.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("concord-snapshot-send-to-{peer}"))
        .spawn(move || {
            let mut out = ChunkWriter::framed(chunks);
            send_snapshots(&mut out, peer, &requests, &sending);
        });
    if let Err(error) = spawned {
        let reason = format!("states to node {peer}: cannot start a send thread: {error}");
        count_send(&serving, SnapshotCounts::failed(reason));
        write_what_is_left(&serving).await;
        return;
    }
    write_chunks(stream, to_write, &serving).await;
}

/// Reads the requests of a connection of purpose 3, their count checked before they are read.
async fn read_requests(stream: &mut Box<dyn PeerIo>) -> Result<Vec<(u64, u64)>, String> {
    let mut count = [0u8; 2];
    (stream.read_exact(&mut count).await).map_err(|e| format!("no snapshot requests: {e}"))?;
    let bytes = frame::snapshot_requests_bytes(count).map_err(|e| e.to_string())?;
    let mut requests = vec![0u8; bytes];
    (stream.read_exact(&mut requests).await)
        .map_err(|e| format!("the snapshot requests were cut short: {e}"))?;
    Ok(frame::decode_snapshot_requests(&requests))
}

/// Writes what the sending thread hands over to `stream`, each chunk within the timeout; a
/// peer that stops reading is let go (the sending thread sees its chunks refused).
async fn write_chunks(
    mut stream: Box<dyn PeerIo>,
    mut to_write: mpsc::Receiver<Vec<u8>>,
    serving: &SnapshotServing,
) {
    let timeout = serving.timeout;
    let mut peer_reads = true;
    while let Some(chunk) = to_write.recv().await {
        if !matches!(
            tokio::time::timeout(timeout, stream.write_all(&chunk)).await,
            Ok(Ok(()))
        ) {
            peer_reads = false;
            break;
        }
    }
    if peer_reads {
        // Flushes, and over TLS says the stream ended where it did (not cut off).
        let _ = tokio::time::timeout(timeout, stream.shutdown()).await;
    }
    drop(stream);
    drop(to_write);
    // The sending thread counted the send before it let the stream end.
    write_what_is_left(serving).await;
}

/// After a send was counted: if it was the last of a catch-up, the line for what the last
/// interval sent is written here, once the sends have been quiet for an interval (a send
/// counted later writes it otherwise).
async fn write_what_is_left(serving: &SnapshotServing) {
    tokio::time::sleep(LINE_INTERVAL).await;
    let left = serving.sent_line.lock().due_when_quiet(Instant::now());
    if let Some(counts) = left {
        write_sent_line(counts);
    }
}

/// A `Write` whose bytes go, in chunks of [`SNAPSHOT_CHUNK_BYTES`], to the task that writes
/// them to a peer's connection; blocks while [`SNAPSHOT_CHUNKS_QUEUED`] chunks wait. Framed,
/// each chunk begins with its length (the answer to several requests, `frame.rs`).
struct ChunkWriter {
    chunks: mpsc::Sender<Vec<u8>>,
    /// The chunk being filled, after [`ChunkWriter::header`] bytes kept for its length.
    pending: Vec<u8>,
    header: usize,
}

/// Bytes of a framed chunk's length.
const CHUNK_LENGTH_BYTES: usize = 4;

const _: () = assert!(SNAPSHOT_CHUNK_BYTES <= MAX_SNAPSHOT_CHUNK_BYTES);

impl ChunkWriter {
    fn plain(chunks: mpsc::Sender<Vec<u8>>) -> Self {
        ChunkWriter::with_header(chunks, 0)
    }

    fn framed(chunks: mpsc::Sender<Vec<u8>>) -> Self {
        ChunkWriter::with_header(chunks, CHUNK_LENGTH_BYTES)
    }

    fn with_header(chunks: mpsc::Sender<Vec<u8>>, header: usize) -> Self {
        let mut pending = Vec::with_capacity(header + SNAPSHOT_CHUNK_BYTES);
        pending.resize(header, 0);
        ChunkWriter {
            chunks,
            pending,
            header,
        }
    }

    fn send_pending(&mut self) -> std::io::Result<()> {
        let body = self.pending.len() - self.header;
        if body == 0 {
            return Ok(());
        }
        if self.header == CHUNK_LENGTH_BYTES {
            self.pending[..CHUNK_LENGTH_BYTES].copy_from_slice(&(body as u32).to_le_bytes());
        }
        let mut next = Vec::with_capacity(self.header + SNAPSHOT_CHUNK_BYTES);
        next.resize(self.header, 0);
        let chunk = std::mem::replace(&mut self.pending, next);
        self.send(chunk)
    }

    /// Sends `bytes` as they are, after what is pending: the markers between framed states.
    fn send_raw(&mut self, bytes: Vec<u8>) -> std::io::Result<()> {
        self.send_pending()?;
        self.send(bytes)
    }

    fn send(&self, bytes: Vec<u8>) -> std::io::Result<()> {
        self.chunks
            .blocking_send(bytes)
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let room = self.header + SNAPSHOT_CHUNK_BYTES - self.pending.len();
        let taken = buf.len().min(room);
        self.pending.extend_from_slice(&buf[..taken]);
        if self.pending.len() == self.header + SNAPSHOT_CHUNK_BYTES {
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
    serving: &SnapshotServing,
) {
    let sending = serving.sends.fetch_add(1, Ordering::AcqRel) + 1;
    let outcome = if sending > MAX_SNAPSHOT_SENDS {
        Err(SnapshotFetchError::Refused(format!(
            "{MAX_SNAPSHOT_SENDS} snapshots are being sent already"
        )))
    } else {
        match serving.sink.get().and_then(Weak::upgrade) {
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
    serving.sends.fetch_sub(1, Ordering::AcqRel);
    let sent = match outcome {
        Ok((applied_index, bytes)) => {
            let _ = out.flush();
            Counters::add(&serving.counters.bytes_sent, bytes);
            tracing::debug!(peer, group, applied_index, bytes, "sent a snapshot");
            SnapshotCounts::done(bytes)
        }
        Err(SnapshotFetchError::Refused(reason)) => {
            let reason = &reason.as_bytes()[..reason.len().min(1024)];
            let _ = out.write_all(SNAPSHOT_REFUSED);
            let _ = out.write_all(&(reason.len() as u16).to_le_bytes());
            let _ = out.write_all(reason);
            let _ = out.flush();
            SnapshotCounts::default()
        }
        Err(error) => {
            tracing::debug!(peer, group, %error, "a snapshot send failed");
            SnapshotCounts::failed(format!("group {group} to node {peer}: {error}"))
        }
    };
    count_send(serving, sent);
}

/// Streams the states `requests` name (`(group, min index)`) to `peer` through `out`, framed
/// (`frame.rs`, purpose 3): each a state or a refusal, in order. A state that fails midway
/// ends the answer there (the connection closes: the peer's fetches of it and of those after
/// it fail).
fn send_snapshots(
    out: &mut ChunkWriter,
    peer: NodeId,
    requests: &[(u64, u64)],
    serving: &SnapshotServing,
) {
    let sending = serving.sends.fetch_add(1, Ordering::AcqRel) + 1;
    let sink = serving.sink.get().and_then(Weak::upgrade);
    for &(group, min_index) in requests {
        let outcome = match &sink {
            _ if sending > MAX_SNAPSHOT_SENDS => Err((
                SnapshotFetchError::Refused(format!(
                    "{MAX_SNAPSHOT_SENDS} snapshot sends are under way already"
                )),
                0,
            )),
            None => Err((
                SnapshotFetchError::Refused("the node is not running".into()),
                0,
            )),
            Some(sink) => write_framed_state(out, sink.as_ref(), group, min_index),
        };
        let (sent, goes_on) = match outcome {
            Ok((applied_index, bytes)) => {
                Counters::add(&serving.counters.bytes_sent, bytes);
                tracing::debug!(peer, group, applied_index, bytes, "sent a snapshot");
                (SnapshotCounts::done(bytes), true)
            }
            // Nothing of the state went out: the refusal takes its place.
            Err((SnapshotFetchError::Refused(reason), 0)) => {
                let reason = &reason.as_bytes()[..reason.len().min(1024)];
                let mut refusal = vec![SNAPSHOTS_REFUSED];
                refusal.extend_from_slice(&(reason.len() as u16).to_le_bytes());
                refusal.extend_from_slice(reason);
                let sent = out.send_raw(refusal).is_ok();
                (SnapshotCounts::default(), sent)
            }
            Err((error, _)) => {
                tracing::debug!(peer, group, %error, "a snapshot send failed");
                let failed =
                    SnapshotCounts::failed(format!("group {group} to node {peer}: {error}"));
                (failed, false)
            }
        };
        count_send(serving, sent);
        if !goes_on {
            break;
        }
    }
    serving.sends.fetch_sub(1, Ordering::AcqRel);
}

/// Writes `group`'s state framed into `out`: the marker of a state, its chunks and the empty
/// chunk that ends it. The applied index and bytes sent, or the error and the bytes that went
/// out before it (none: the refusal may take the state's place).
fn write_framed_state(
    out: &mut ChunkWriter,
    sink: &dyn MessageSink,
    group: u64,
    min_index: u64,
) -> Result<(u64, u64), (SnapshotFetchError, u64)> {
    let mut state = FramedState { out, bytes: 0 };
    let written = sink.write_snapshot(group, min_index, &mut state);
    let bytes = state.bytes;
    let applied_index = match written {
        Ok(applied_index) => applied_index,
        Err(SnapshotFetchError::Refused(reason)) if bytes == 0 => {
            return Err((SnapshotFetchError::Refused(reason), 0));
        }
        Err(error) => {
            return Err((
                SnapshotFetchError::Transfer(error.to_string()),
                bytes.max(1),
            ));
        }
    };
    let transfer = |error: std::io::Error| {
        (
            SnapshotFetchError::Transfer(error.to_string()),
            bytes.max(1),
        )
    };
    if bytes == 0 {
        out.send_raw(vec![SNAPSHOTS_STATE]).map_err(transfer)?;
    }
    out.flush().map_err(transfer)?;
    out.send_raw(0u32.to_le_bytes().to_vec())
        .map_err(transfer)?;
    Ok((applied_index, bytes))
}

/// A state's bytes on their way into a framed answer: the marker of a state goes first, with
/// the first of them.
struct FramedState<'a> {
    out: &'a mut ChunkWriter,
    bytes: u64,
}

impl Write for FramedState<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes == 0 && !buf.is_empty() {
            self.out.send_raw(vec![SNAPSHOTS_STATE])?;
        }
        let written = self.out.write(buf)?;
        self.bytes += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// Counts a send's outcome in the line about sends, and writes the line if it is due.
fn count_send(serving: &SnapshotServing, sent: SnapshotCounts) {
    let now = Instant::now();
    let mut line = serving.sent_line.lock();
    line.add(&sent, now);
    if let Some(counts) = line.due(now) {
        write_sent_line(counts);
    }
}

fn write_sent_line(counts: SnapshotCounts) {
    match &counts.first_failure {
        None => tracing::info!(
            sent = counts.done,
            failed = counts.failed,
            bytes = counts.bytes,
            "snapshots sent"
        ),
        Some(first_failure) => tracing::warn!(
            sent = counts.done,
            failed = counts.failed,
            bytes = counts.bytes,
            %first_failure,
            "snapshots sent; some failed"
        ),
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
