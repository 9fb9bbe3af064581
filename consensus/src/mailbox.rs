//! A worker thread's inbox and how to wake it.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering, fence};
use std::thread::Thread;

use concord_storage::GroupId;
use parking_lot::Mutex;

use crate::NodeId;
use crate::idle_spin::{IdleSpell, IdleSpin};
use crate::membership::MemberChange;
use crate::node_loop::peer_reading::PeerReading;
use crate::pending::{ReadResponder, Responder};
use crate::transport::{GroupMessage, PeerConnection};

/// Inbound raft messages a worker holds at most before dropping more (raft resends).
pub(crate) const MAX_INBOX_MESSAGES: usize = 65_536;

/// Work handed to a worker thread by callers, peers and its applier.
#[derive(Default)]
pub(crate) struct Inbox {
    /// Groups whose proposal queue went from empty to non-empty.
    pub(crate) proposals: Vec<GroupId>,
    pub(crate) messages: Vec<GroupMessage>,
    /// Read barriers: `(group, responder, served from a lease if the node holds one)`.
    pub(crate) reads: Vec<(GroupId, ReadResponder, bool)>,
    pub(crate) campaigns: Vec<GroupId>,
    /// Leaderships to hand over: `(group, to node)`.
    pub(crate) transfers: Vec<(GroupId, NodeId)>,
    /// Membership changes to propose, each answered once proposed (or refused).
    pub(crate) member_changes: Vec<(GroupId, MemberChange, Responder<()>)>,
    /// Hand every leadership this node holds to another voter, from now on (the node is
    /// about to stop).
    pub(crate) hand_over: bool,
    /// How snapshot fetches and installs went.
    pub(crate) snapshots: Vec<(GroupId, SnapshotEvent)>,
    /// Groups whose applied index the apply thread moved (a group may appear more than once).
    pub(crate) applied: Vec<GroupId>,
    /// Peers that restarted (`MessageSink::peer_restarted`): the worker takes them before
    /// the messages that came with them.
    pub(crate) restarted_peers: Vec<NodeId>,
    /// Peer connections for the worker to read (`node_loop/peer_reading.rs`).
    pub(crate) connections: Vec<PeerConnection>,
    pub(crate) shutdown: bool,
}

/// What happened to a snapshot a worker asked for.
pub(crate) enum SnapshotEvent {
    /// The state arrived in this file, applied through at least `min_index`.
    Fetched { path: PathBuf, min_index: u64 },
    /// The state is installed, applied through this index.
    Installed(u64),
    /// The fetch or the install did not happen; the worker asks again later.
    Failed(SnapshotFailure),
}

/// Why a snapshot a worker asked for is not installed.
#[derive(Debug)]
pub(crate) enum SnapshotFailure {
    /// The member asked cannot serve the state now: it sends as many as it may already, has
    /// not applied that far, or is stopping. Expected while members catch up.
    Refused(String),
    /// The transfer or the install went wrong.
    Broken(String),
}

/// A worker's inbox and the handle to wake it.
pub(crate) struct Mailbox {
    pub(crate) inbox: Mutex<Inbox>,
    pub(crate) thread: OnceLock<Thread>,
    /// Wakes the worker while it waits in its poll of peer connections rather than parked
    /// (set once the worker has such a poll: then it takes connections).
    waker: OnceLock<mio::Waker>,
    /// Set while the worker waits in that poll.
    in_poll: AtomicBool,
    /// Set while reads wait for apply progress, or while the apply queue is full and the
    /// worker holds entries back: only then does the apply thread wake the worker after each
    /// batch (raft learns the applied index on the worker's next round anyway). Saves a
    /// thread wake-up per applied batch under load.
    pub(crate) wake_on_apply: AtomicBool,
    /// Set by anyone who puts work in the inbox; cleared by the worker when it takes the
    /// inbox. Lets the worker check for work without the lock while it waits.
    pub(crate) has_work: AtomicBool,
}

impl Mailbox {
    pub(crate) fn new() -> Self {
        Mailbox {
            inbox: Mutex::new(Inbox::default()),
            thread: OnceLock::new(),
            waker: OnceLock::new(),
            in_poll: AtomicBool::new(false),
            wake_on_apply: AtomicBool::new(false),
            has_work: AtomicBool::new(false),
        }
    }

    /// Called by the apply thread after each batch with the groups it applied: the worker
    /// looks at those groups only. Wakes the worker only while it asked for it
    /// ([`Mailbox::ask_wake_on_apply`]).
    pub(crate) fn applied(&self, groups: &[GroupId]) {
        if !groups.is_empty() {
            self.inbox.lock().applied.extend_from_slice(groups);
        }
        // Pairs with the fence in `ask_wake_on_apply`: the messages this batch took from the
        // apply queue are ordered before this read of the ask.
        fence(Ordering::SeqCst);
        if self.wake_on_apply.load(Ordering::SeqCst) {
            self.wake();
        }
    }

    /// Asks the apply thread to wake the worker after each batch (`true`), or to stop. A
    /// worker that asks and then finds the apply queue still full is certain to be woken:
    /// either the apply thread reads the ask after it takes a message, or it took one before
    /// and the worker's next look at the queue finds the room.
    pub(crate) fn ask_wake_on_apply(&self, ask: bool) {
        self.wake_on_apply.store(ask, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    pub(crate) fn wake(&self) {
        // Pairs with the worker's store of `in_poll` and then load of `has_work` (both
        // sequentially consistent): either it sees the work, or this sees it in the poll.
        self.has_work.store(true, Ordering::SeqCst);
        if self.in_poll.load(Ordering::SeqCst) {
            if let Some(waker) = self.waker.get() {
                let _ = waker.wake();
            }
        } else if let Some(thread) = self.thread.get() {
            thread.unpark();
        }
    }

    /// The waker of the worker's poll of peer connections (`node_loop/peer_reading.rs`).
    pub(crate) fn set_waker(&self, waker: mio::Waker) {
        let _ = self.waker.set(waker);
    }

    /// Whether the worker can take peer connections (it has a poll to wait in).
    pub(crate) fn reads_connections(&self) -> bool {
        self.waker.get().is_some()
    }
}

impl Mailbox {
    /// Waits until work arrives or `deadline`: first yielding the CPU for as long as `spin`
    /// says while watching for work, then parked; `spin` learns from how soon work came.
    /// A worker reading peer connections watches them too, and waits in their poll rather
    /// than parked: a frame that arrives is read, and delivered, by this thread.
    pub(crate) fn wait(
        &self,
        deadline: std::time::Instant,
        spin: &mut IdleSpin,
        peers: &mut PeerReading,
    ) {
        // Work already here: the thread is not idle, and there is nothing to learn.
        if self.has_work.load(Ordering::Acquire) {
            return;
        }
        let mut spell = spin.begin(deadline);
        let work_came = self.watch_then_park(deadline, &mut spell, peers);
        spin.end(&spell, work_came);
    }

    /// Returns `true` if work arrived (rather than `deadline`).
    fn watch_then_park(
        &self,
        deadline: std::time::Instant,
        spell: &mut IdleSpell,
        peers: &mut PeerReading,
    ) -> bool {
        let reading = peers.is_reading();
        while spell.keep_watching() {
            if self.has_work.load(Ordering::Acquire) {
                return true;
            }
            if reading {
                peers.read_now();
            }
            std::thread::yield_now();
        }
        loop {
            if self.has_work.load(Ordering::Acquire) {
                return true;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            if reading {
                self.in_poll.store(true, Ordering::SeqCst);
                if !self.has_work.load(Ordering::SeqCst) {
                    peers.wait(deadline - now);
                }
                // What this thread delivers to itself needs no wake.
                self.in_poll.store(false, Ordering::SeqCst);
                peers.read_ready();
            } else {
                // May return early (a stale unpark token): look again.
                std::thread::park_timeout(deadline - now);
            }
        }
    }

    /// Takes everything in the inbox.
    pub(crate) fn take(&self) -> Inbox {
        let mut inbox = self.inbox.lock();
        self.has_work.store(false, Ordering::Release);
        std::mem::take(&mut *inbox)
    }
}
