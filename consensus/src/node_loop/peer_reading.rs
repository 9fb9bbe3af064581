//! The peer connections a raft worker reads itself (`transport/tcp/inbound.rs`), and the
//! poll it waits in while it has them.
//!
//! The worker reads between rounds without waiting, and while it is idle it waits in this
//! poll rather than parked: a frame wakes it directly, and so does anyone who puts work in
//! its mailbox (the mailbox's waker is registered here). One worker of a node reads every
//! connection; the messages go to each group's worker as they would from the network.

use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};

use crate::transport::PeerConnection;
use crate::transport::tcp::Reading;

/// The mailbox's waker; a connection's token is its slot plus one.
const WAKE_TOKEN: Token = Token(0);

/// Readiness events taken per wait at most; more wait for the next.
const EVENTS_PER_WAIT: usize = 64;

/// How often every connection is read even if the poll reported nothing of it: a frame that
/// stopped arriving midway is found stalled (and closed) only by reading.
const SWEEP_INTERVAL: Duration = Duration::from_millis(100);

/// A worker's peer connections and the poll it waits in.
pub(crate) struct PeerReading {
    /// `None`: this worker reads no connections (it parks instead).
    poll: Option<Poll>,
    events: Events,
    /// By slot; a closed connection leaves its slot empty for the next.
    connections: Vec<Option<PeerConnection>>,
    /// Slots that stopped at their frame limit: read again without waiting for readiness.
    more: Vec<usize>,
    /// Slots to read this pass, reused.
    ready: Vec<usize>,
    next_sweep: Instant,
}

impl PeerReading {
    /// A worker that reads no connections.
    pub(crate) fn off() -> Self {
        PeerReading {
            poll: None,
            events: Events::with_capacity(0),
            connections: Vec::new(),
            more: Vec::new(),
            ready: Vec::new(),
            next_sweep: Instant::now(),
        }
    }

    /// A worker's poll, and the waker in it for the worker's mailbox (which takes
    /// connections once it has it); the system may refuse one.
    pub(crate) fn start() -> std::io::Result<(Self, Waker)> {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKE_TOKEN)?;
        let reading = PeerReading {
            poll: Some(poll),
            events: Events::with_capacity(EVENTS_PER_WAIT),
            ..PeerReading::off()
        };
        Ok((reading, waker))
    }

    /// Whether this worker has connections to read (and then waits in the poll).
    pub(crate) fn is_reading(&self) -> bool {
        self.connections.iter().any(Option::is_some)
    }

    /// Starts reading `connection`: whatever it already holds is reported by the poll at once.
    pub(crate) fn adopt(&mut self, connection: PeerConnection) {
        let Some(poll) = &self.poll else {
            return; // Not offered to a worker without a poll: its mailbox has no waker.
        };
        let slot = match self.connections.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                self.connections.push(None);
                self.connections.len() - 1
            }
        };
        let fd = connection.socket();
        let registered =
            poll.registry()
                .register(&mut SourceFd(&fd), Token(slot + 1), Interest::READABLE);
        if let Err(error) = registered {
            // Dropped: the peer sees the connection close and dials again.
            tracing::warn!(%error, "cannot poll a peer connection");
            return;
        }
        self.connections[slot] = Some(connection);
        self.more.push(slot);
    }

    /// Reads, without waiting, what has arrived on the connections.
    pub(crate) fn read_now(&mut self) {
        self.wait(Duration::ZERO);
        self.read_ready();
    }

    /// Waits up to `timeout` for a frame or a wake of the mailbox, unless a connection is
    /// known to have more waiting; [`PeerReading::read_ready`] reads what it found.
    pub(crate) fn wait(&mut self, timeout: Duration) {
        let Some(poll) = &mut self.poll else {
            return;
        };
        let timeout = if self.more.is_empty() {
            timeout
        } else {
            Duration::ZERO
        };
        if let Err(error) = poll.poll(&mut self.events, Some(timeout)) {
            if error.kind() != std::io::ErrorKind::Interrupted {
                tracing::warn!(%error, "polling peer connections failed");
            }
            self.events.clear();
        }
        self.ready.append(&mut self.more);
        for event in self.events.iter() {
            if event.token() != WAKE_TOKEN {
                self.ready.push(event.token().0 - 1);
            }
        }
    }

    /// Reads what has arrived on the connections the last wait found ready (and on every
    /// connection once per [`SWEEP_INTERVAL`]), delivering their frames.
    pub(crate) fn read_ready(&mut self) {
        let Some(poll) = &self.poll else {
            return;
        };
        let now = Instant::now();
        if now >= self.next_sweep {
            self.next_sweep = now + SWEEP_INTERVAL;
            self.ready.extend(0..self.connections.len());
        }
        self.ready.sort_unstable();
        self.ready.dedup();
        for &slot in &self.ready {
            let Some(connection) = self.connections.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            match connection.read_arrived(now) {
                Reading::Open { more: true } => self.more.push(slot),
                Reading::Open { more: false } => {}
                Reading::Closed => {
                    let fd = connection.socket();
                    let _ = poll.registry().deregister(&mut SourceFd(&fd));
                    self.connections[slot] = None;
                }
            }
        }
        self.ready.clear();
    }
}
