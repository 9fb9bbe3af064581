//! A worker thread's inbox and how to wake it.

use std::sync::OnceLock;
use std::thread::Thread;

use concord_engine::GroupId;
use parking_lot::Mutex;

use crate::pending::Responder;
use crate::transport::GroupMessage;

/// Inbound raft messages a worker holds at most before dropping more (raft resends).
pub(crate) const MAX_INBOX_MESSAGES: usize = 65_536;

/// Work handed to a worker thread by callers, peers and its applier.
#[derive(Default)]
pub(crate) struct Inbox {
    /// Groups whose proposal queue went from empty to non-empty.
    pub(crate) proposals: Vec<GroupId>,
    pub(crate) messages: Vec<GroupMessage>,
    pub(crate) reads: Vec<(GroupId, Responder<u64>)>,
    pub(crate) campaigns: Vec<GroupId>,
    pub(crate) shutdown: bool,
}

/// A worker's inbox and the handle to wake it.
pub(crate) struct Mailbox {
    pub(crate) inbox: Mutex<Inbox>,
    pub(crate) thread: OnceLock<Thread>,
}

impl Mailbox {
    pub(crate) fn new() -> Self {
        Mailbox {
            inbox: Mutex::new(Inbox::default()),
            thread: OnceLock::new(),
        }
    }

    /// Wakes the worker (cheap when it is awake: an atomic swap).
    pub(crate) fn wake(&self) {
        if let Some(thread) = self.thread.get() {
            thread.unpark();
        }
    }
}
