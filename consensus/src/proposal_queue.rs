//! The bounded queue of commands waiting for a group's next raft entry.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::command_batch::PER_COMMAND_OVERHEAD_BYTES;
use crate::pending::Responder;

/// A command and the responder of its caller.
pub(crate) struct QueuedCommand {
    pub(crate) command: Bytes,
    pub(crate) responder: Responder<Bytes>,
}

/// A bounded FIFO of proposals for one group. Full means `Overloaded`, answered at once:
/// queues never grow without bound.
pub(crate) struct ProposalQueue {
    commands: Mutex<VecDeque<QueuedCommand>>,
    capacity: usize,
}

impl ProposalQueue {
    pub(crate) fn new(capacity: usize) -> Self {
        ProposalQueue {
            commands: Mutex::new(VecDeque::with_capacity(capacity.min(1024))),
            capacity,
        }
    }

    /// Queues `command`; returns it back if the queue is full. `Ok(true)` if the queue was
    /// empty before (the worker may need a wake-up).
    pub(crate) fn push(&self, command: QueuedCommand) -> Result<bool, QueuedCommand> {
        let mut commands = self.commands.lock();
        if commands.len() >= self.capacity {
            return Err(command);
        }
        let was_empty = commands.is_empty();
        commands.push_back(command);
        Ok(was_empty)
    }

    /// Takes commands from the front for one entry: at most `max_commands`, and at most
    /// `max_bytes` of encoded commands (but always at least one). Records each command's
    /// queue wait. Returns `true` if commands remain queued.
    pub(crate) fn drain_entry(
        &self,
        max_commands: usize,
        max_bytes: usize,
        out: &mut Vec<QueuedCommand>,
    ) -> bool {
        let first_taken = out.len();
        let more_queued = {
            // Callers push while this lock is held: it covers the moves only.
            let mut commands = self.commands.lock();
            let mut bytes = 0usize;
            while let Some(next) = commands.front() {
                let size = next.command.len() + PER_COMMAND_OVERHEAD_BYTES;
                if out.len() > first_taken
                    && (out.len() - first_taken >= max_commands || bytes + size > max_bytes)
                {
                    break;
                }
                bytes += size;
                out.extend(commands.pop_front());
            }
            !commands.is_empty()
        };
        let now = Instant::now();
        let queue_wait = crate::metrics::proposal_queue_wait();
        for command in &out[first_taken..] {
            queue_wait.record(now.duration_since(command.responder.enqueued_at));
        }
        more_queued
    }

    /// Number of queued commands.
    pub(crate) fn len(&self) -> usize {
        self.commands.lock().len()
    }

    /// Removes the commands that have waited longer than `timeout` (they are at the front: the
    /// queue is in arrival order).
    pub(crate) fn take_expired(&self, timeout: std::time::Duration) -> Vec<QueuedCommand> {
        let mut commands = self.commands.lock();
        let mut expired = Vec::new();
        while commands
            .front()
            .is_some_and(|c| c.responder.enqueued_at.elapsed() > timeout)
        {
            expired.extend(commands.pop_front());
        }
        expired
    }

    /// Removes every queued command (to answer them on shutdown or leadership loss).
    pub(crate) fn take_all(&self) -> Vec<QueuedCommand> {
        self.commands.lock().drain(..).collect()
    }
}
