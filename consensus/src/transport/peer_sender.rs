//! How a node sends to one peer over TCP: [`PeerSender`], shared by the node's workers and the
//! task that keeps the peer's connection.
//!
//! On a plain-TCP connection a worker encodes its round's frame and writes it to the socket itself when nothing waits
//! before it: a write to a peer costs one non-blocking system call on the worker and no
//! hand-off to the network's thread (which would be a thread wake-up on every hop of every
//! write). What the socket does not take at once waits in `unsent`, bounded in bytes, and the
//! connection's task writes it as the socket drains; frames never interleave because every
//! write happens under the one lock, in order. While there is no connection, and always over
//! TLS (whose state lives in the task), batches go through a bounded queue to the task.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::sync::{Notify, mpsc};

use super::GroupMessage;
use super::frame::{self, LENGTH_BYTES};
use crate::NodeId;

/// An encoded batch's capacity kept between frames at most; a larger buffer (left by one
/// large frame) is let go once it is empty.
const KEPT_CAPACITY_BYTES: usize = 1024 * 1024;

/// How a send went.
pub(super) enum SendOutcome {
    /// Written to the socket, or waiting in `unsent` for the task: `bytes` of frame.
    Sent { bytes: usize },
    /// No connection the workers may write to (not connected yet, reconnecting, or TLS): the
    /// messages are handed back for the task's queue.
    NotConnected(Vec<GroupMessage>),
    /// Dropped, for the reason given (raft resends what still matters).
    Dropped(&'static str),
}

/// The connection is gone (or a sender gave it up): the task dials again.
pub(super) struct Broken;

pub(super) struct PeerSender {
    /// Batches for the task: sent while workers may not write to the connection themselves.
    pub(super) queue: mpsc::Sender<Vec<GroupMessage>>,
    /// The peer's frame and byte counts in `/metrics`.
    pub(super) frames_sent: metrics::Counter,
    pub(super) bytes_sent: metrics::Counter,
    state: Mutex<SendState>,
    /// Wakes the connection's task: bytes wait in `unsent`, or the connection broke.
    wake_task: Notify,
    max_frame_bytes: usize,
    max_unsent_bytes: usize,
    /// Frames written (or buffered) by senders since the task last looked: the task sends a
    /// keepalive only when there were none.
    frames_since_keepalive: AtomicU64,
}

struct SendState {
    /// The connection workers may write to; `None` while there is none.
    stream: Option<Arc<TcpStream>>,
    /// Whole frames, of which the socket took the first `written` bytes; the rest waits.
    unsent: Vec<u8>,
    written: usize,
    /// The wire version the connection speaks.
    spoken: u16,
    /// A sender saw the connection fail: the task must dial again.
    broken: bool,
}

impl PeerSender {
    pub(super) fn new(
        peer: NodeId,
        queue: mpsc::Sender<Vec<GroupMessage>>,
        max_frame_bytes: usize,
        max_unsent_bytes: usize,
    ) -> Self {
        let label = peer.to_string();
        PeerSender {
            queue,
            frames_sent: metrics::counter!("concord_peer_frames_sent_total", "peer" => label.clone()),
            bytes_sent: metrics::counter!("concord_peer_bytes_sent_total", "peer" => label),
            state: Mutex::new(SendState {
                stream: None,
                unsent: Vec::new(),
                written: 0,
                spoken: 0,
                broken: false,
            }),
            wake_task: Notify::new(),
            max_frame_bytes,
            max_unsent_bytes: max_unsent_bytes.max(max_frame_bytes + LENGTH_BYTES),
            frames_since_keepalive: AtomicU64::new(0),
        }
    }

    /// Encodes `messages` as one frame and writes it, or leaves it for the task if frames
    /// wait before it or the socket is full. `takes_version` says whether the node still
    /// takes the version the connection speaks; if not, the connection is given up.
    pub(super) fn send(
        &self,
        messages: Vec<GroupMessage>,
        takes_version: impl Fn(u16) -> bool,
    ) -> SendOutcome {
        let mut state = self.state.lock();
        let Some(stream) = state.stream.clone() else {
            return SendOutcome::NotConnected(messages);
        };
        if !takes_version(state.spoken) {
            // Entries this node committed since would be misread on this connection.
            state.give_up();
            drop(state);
            self.wake_task.notify_one();
            return SendOutcome::Dropped("peer_version_too_old");
        }
        let others_waiting = state.waiting_bytes() > 0;
        let bytes = match self.encode(&mut state, &messages) {
            Ok(bytes) => bytes,
            Err(reason) => return SendOutcome::Dropped(reason),
        };
        self.frames_since_keepalive.fetch_add(1, Ordering::Relaxed);
        if others_waiting {
            // The task is writing what waits; this frame follows it.
            return SendOutcome::Sent { bytes };
        }
        if state.write_some(&stream).is_err() {
            state.give_up();
            drop(state);
            self.wake_task.notify_one();
            return SendOutcome::Dropped("connection_lost");
        }
        let left_waiting = state.waiting_bytes() > 0;
        drop(state);
        if left_waiting {
            self.wake_task.notify_one();
        }
        SendOutcome::Sent { bytes }
    }

    /// The task connected, speaking wire version `spoken`: from now on senders write to
    /// `stream`.
    pub(super) fn connected(&self, stream: Arc<TcpStream>, spoken: u16) {
        let mut state = self.state.lock();
        state.give_up();
        state.stream = Some(stream);
        state.spoken = spoken;
        state.broken = false;
    }

    /// The connection is closed (by the task, or a sender that saw it fail): senders hand
    /// their messages to the task's queue until the next [`PeerSender::connected`].
    pub(super) fn disconnected(&self) {
        self.state.lock().give_up();
    }

    /// Frames from the task's own queue (sent while there was no connection) or a keepalive:
    /// appended after what waits, written by the next [`PeerSender::flush`].
    pub(super) fn append(&self, messages: &[GroupMessage]) -> Result<usize, &'static str> {
        let mut state = self.state.lock();
        self.encode(&mut state, messages)
    }

    /// Writes what waits until the socket takes no more (`Ok(true)`: everything went) or the
    /// connection breaks.
    pub(super) fn flush(&self) -> Result<bool, Broken> {
        let mut state = self.state.lock();
        if state.broken {
            return Err(Broken);
        }
        let Some(stream) = state.stream.clone() else {
            return Err(Broken);
        };
        if let Err(broken) = state.write_some(&stream) {
            state.give_up();
            return Err(broken);
        }
        Ok(state.waiting_bytes() == 0)
    }

    /// Appends `messages` as one frame after what waits, within the frame and buffer limits.
    fn encode(
        &self,
        state: &mut SendState,
        messages: &[GroupMessage],
    ) -> Result<usize, &'static str> {
        let end = state.unsent.len();
        frame::encode_frame(messages, &mut state.unsent);
        let bytes = state.unsent.len() - end;
        if bytes - LENGTH_BYTES > self.max_frame_bytes {
            state.unsent.truncate(end);
            return Err("frame_too_large");
        }
        if state.waiting_bytes() > self.max_unsent_bytes {
            state.unsent.truncate(end);
            return Err("queue_full");
        }
        Ok(bytes)
    }

    /// Resolves when a sender left bytes for the task or saw the connection break.
    pub(super) async fn woken(&self) {
        self.wake_task.notified().await
    }

    /// `true` if no frame went out since the last call: the peer needs a keepalive.
    pub(super) fn quiet_since_last_look(&self) -> bool {
        self.frames_since_keepalive.swap(0, Ordering::Relaxed) == 0
    }
}

impl SendState {
    fn waiting_bytes(&self) -> usize {
        self.unsent.len() - self.written
    }

    /// Writes what waits until it is all written or the socket would block.
    fn write_some(&mut self, stream: &TcpStream) -> Result<(), Broken> {
        while self.written < self.unsent.len() {
            match stream.try_write(&self.unsent[self.written..]) {
                Ok(0) => return Err(Broken),
                Ok(n) => self.written += n,
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return Err(Broken),
            }
        }
        if self.written == self.unsent.len() {
            self.clear();
        } else if self.written > self.unsent.len() / 2 {
            // Moving the rest to the front costs less than what was written: amortized, each
            // byte moves a bounded number of times.
            self.unsent.drain(..self.written);
            self.written = 0;
        }
        Ok(())
    }

    fn clear(&mut self) {
        self.unsent.clear();
        self.written = 0;
        if self.unsent.capacity() > KEPT_CAPACITY_BYTES {
            self.unsent = Vec::new();
        }
    }

    fn give_up(&mut self) {
        self.stream = None;
        self.broken = true;
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use concord_storage::raft::prelude::{Entry, Message};
    use tokio::io::AsyncReadExt;

    use super::*;

    const FRAME_DATA_BYTES: usize = 64 * 1024;

    /// One message whose `replicated_floor` numbers it, carrying `FRAME_DATA_BYTES`.
    fn numbered(number: u64) -> Vec<GroupMessage> {
        let mut entry = Entry::default();
        entry.data = vec![number as u8; FRAME_DATA_BYTES].into();
        let mut message = Message::default();
        message.entries = vec![entry].into();
        vec![GroupMessage {
            group: 1,
            message,
            replicated_floor: number,
        }]
    }

    /// A connected loopback pair: the sending end (as the dialling task holds it) and the
    /// reading end.
    async fn pair() -> (Arc<TcpStream>, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dialled = TcpStream::connect(listener.local_addr().unwrap());
        let (dialled, accepted) = tokio::join!(dialled, listener.accept());
        (Arc::new(dialled.unwrap()), accepted.unwrap().0)
    }

    /// What the dialling task does between wake-ups: flush until everything went.
    async fn flush_all(sender: &PeerSender, stream: &TcpStream) {
        while !sender.flush().ok().expect("the connection holds") {
            stream.writable().await.unwrap();
        }
    }

    async fn read_frame(stream: &mut TcpStream) -> Vec<GroupMessage> {
        let mut prefix = [0u8; LENGTH_BYTES];
        stream.read_exact(&mut prefix).await.unwrap();
        let mut body = vec![0u8; frame::body_length(prefix, usize::MAX).unwrap()];
        stream.read_exact(&mut body).await.unwrap();
        frame::decode_body(&body).unwrap()
    }

    #[tokio::test]
    async fn frames_a_slow_peer_cannot_take_wait_in_order_within_the_byte_bound() {
        let (stream, mut peer) = pair().await;
        let (queue, _queued) = mpsc::channel(1);
        let max_unsent_bytes = 4 * 1024 * 1024;
        let sender = PeerSender::new(2, queue, 1024 * 1024, max_unsent_bytes);
        assert!(matches!(
            sender.send(numbered(0), |_| true),
            SendOutcome::NotConnected(_)
        ));
        sender.connected(stream.clone(), 3);

        // The peer reads nothing: the socket's buffers fill, then the sender's, then frames
        // are dropped.
        let mut sent = Vec::new();
        let mut dropped = 0;
        for number in 0..1000 {
            match sender.send(numbered(number), |_| true) {
                SendOutcome::Sent { .. } => sent.push(number),
                SendOutcome::Dropped(reason) => {
                    assert_eq!(reason, "queue_full");
                    dropped += 1;
                }
                SendOutcome::NotConnected(_) => panic!("connected"),
            }
        }
        assert!(dropped > 0, "the bound never held");
        let waiting = sender.state.lock().waiting_bytes();
        assert!(
            waiting > 0 && waiting <= max_unsent_bytes,
            "{waiting} bytes wait"
        );

        // The peer reads again: every frame taken arrives whole, once, in order.
        let reading = tokio::spawn(async move {
            let mut received = Vec::new();
            for _ in 0..sent.len() {
                let messages = read_frame(&mut peer).await;
                assert_eq!(messages.len(), 1);
                let data = &messages[0].message.entries[0].data;
                let number = messages[0].replicated_floor;
                assert!(data.len() == FRAME_DATA_BYTES && data.iter().all(|&b| b == number as u8));
                received.push(number);
            }
            assert_eq!(received, sent);
            peer
        });
        flush_all(&sender, &stream).await;
        let mut peer = reading.await.unwrap();

        // Once drained, a send goes straight to the socket.
        assert!(matches!(
            sender.send(numbered(7), |_| true),
            SendOutcome::Sent { .. }
        ));
        assert_eq!(sender.state.lock().waiting_bytes(), 0);
        assert_eq!(read_frame(&mut peer).await[0].replicated_floor, 7);

        // A version the node no longer takes gives the connection up.
        assert!(matches!(
            sender.send(numbered(8), |version| version > 3),
            SendOutcome::Dropped("peer_version_too_old")
        ));
        assert!(sender.flush().is_err());
        assert!(matches!(
            sender.send(numbered(9), |_| true),
            SendOutcome::NotConnected(_)
        ));
    }

    #[tokio::test]
    async fn a_closed_peer_breaks_the_connection_for_the_task() {
        let (stream, peer) = pair().await;
        let (queue, _queued) = mpsc::channel(1);
        let sender = PeerSender::new(2, queue, 1024 * 1024, 1024 * 1024);
        sender.connected(stream, 3);
        drop(peer);
        // The first writes after the close may still be taken by the kernel; a reset follows.
        let mut outcome = None;
        for number in 0..1000 {
            if let SendOutcome::Dropped(reason) = sender.send(numbered(number), |_| true) {
                outcome = Some(reason);
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        assert_eq!(outcome, Some("connection_lost"));
        // The task is told, and finds the connection given up.
        tokio::time::timeout(std::time::Duration::from_secs(5), sender.woken())
            .await
            .expect("the task is woken");
        assert!(sender.flush().is_err());
    }
}
