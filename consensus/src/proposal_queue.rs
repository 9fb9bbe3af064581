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
    pub(crate) kind: CommandKind,
    pub(crate) responder: Responder<Bytes>,
}

/// Whose command it is: a client's, batched with others into one entry, or the operator's
/// (`Consensus::propose_admin`), which goes into an entry of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CommandKind {
    Client,
    Admin,
}

/// Why a batch was not queued.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum BatchRefused {
    /// The queue has no room for it now.
    Full,
    /// The batch is larger than the queue.
    NeverFits {
        commands: usize,
        bytes: usize,
        capacity: usize,
        capacity_bytes: usize,
    },
}

/// A bounded FIFO of proposals for one group, in commands and in bytes. Full means
/// `Overloaded`, answered at once: queues never grow without bound.
pub(crate) struct ProposalQueue {
    queued: Mutex<Queued>,
    capacity: usize,
    capacity_bytes: usize,
}

#[derive(Default)]
struct Queued {
    commands: VecDeque<QueuedCommand>,
    /// Bytes of the commands queued.
    bytes: usize,
}

impl Queued {
    fn pop_front(&mut self) -> Option<QueuedCommand> {
        let command = self.commands.pop_front()?;
        self.bytes -= command.command.len();
        Some(command)
    }
}

impl ProposalQueue {
    pub(crate) fn new(capacity: usize, capacity_bytes: usize) -> Self {
        ProposalQueue {
            queued: Mutex::new(Queued {
                // Grown on first use, never before: a node may hold thousands of groups that
                // are never written to.
                commands: VecDeque::new(),
                bytes: 0,
            }),
            capacity,
            capacity_bytes,
        }
    }

    /// Queues `command`; returns it back if the queue is full (in commands or bytes; one
    /// command is always admitted into an empty queue). `Ok(true)` if the queue was empty
    /// before (the worker may need a wake-up).
    pub(crate) fn push(&self, command: QueuedCommand) -> Result<bool, QueuedCommand> {
        let mut queued = self.queued.lock();
        let was_empty = queued.commands.is_empty();
        let bytes = queued.bytes + command.command.len();
        if queued.commands.len() >= self.capacity || (!was_empty && bytes > self.capacity_bytes) {
            return Err(command);
        }
        queued.bytes = bytes;
        queued.commands.push_back(command);
        Ok(was_empty)
    }

    /// Queues every command of `batch`, in order, or none of them: `Err(BatchRefused::Full)`
    /// when they do not fit beside what is queued, `Err(BatchRefused::NeverFits)` when they
    /// would not fit an empty queue. `Ok(true)` if the queue was empty before.
    pub(crate) fn push_batch(&self, batch: Vec<QueuedCommand>) -> Result<bool, BatchRefused> {
        let batch_bytes: usize = batch.iter().map(|queued| queued.command.len()).sum();
        if batch.len() > self.capacity || batch_bytes > self.capacity_bytes {
            return Err(BatchRefused::NeverFits {
                commands: batch.len(),
                bytes: batch_bytes,
                capacity: self.capacity,
                capacity_bytes: self.capacity_bytes,
            });
        }
        let mut queued = self.queued.lock();
        let was_empty = queued.commands.is_empty();
        if queued.commands.len() + batch.len() > self.capacity
            || queued.bytes + batch_bytes > self.capacity_bytes
        {
            return Err(BatchRefused::Full);
        }
        queued.bytes += batch_bytes;
        queued.commands.extend(batch);
        Ok(was_empty)
    }

    /// Takes commands from the front for one entry: at most `max_commands`, and at most
    /// `max_bytes` of encoded commands (but always at least one); an admin command is taken
    /// alone. Records each command's queue wait in `queue_wait` (looked up once per round by
    /// the caller, not once per group). Returns `true` if commands remain queued.
    pub(crate) fn drain_entry(
        &self,
        max_commands: usize,
        max_bytes: usize,
        out: &mut Vec<QueuedCommand>,
        now: Instant,
        queue_wait: &metrics::Histogram,
    ) -> bool {
        let first_taken = out.len();
        let more_queued = {
            // Callers push while this lock is held: it covers the moves only.
            let mut queued = self.queued.lock();
            let mut bytes = 0usize;
            while let Some(next) = queued.commands.front() {
                let size = next.command.len() + PER_COMMAND_OVERHEAD_BYTES;
                let admin = next.kind == CommandKind::Admin;
                if out.len() > first_taken
                    && (admin
                        || out.len() - first_taken >= max_commands
                        || bytes + size > max_bytes)
                {
                    break;
                }
                bytes += size;
                out.extend(queued.pop_front());
                if admin {
                    break;
                }
            }
            !queued.commands.is_empty()
        };
        for command in &out[first_taken..] {
            queue_wait.record(now.duration_since(command.responder.enqueued_at));
        }
        more_queued
    }

    /// Number of queued commands.
    pub(crate) fn len(&self) -> usize {
        self.queued.lock().commands.len()
    }

    /// Removes the commands that have waited longer than `timeout` (they are at the front: the
    /// queue is in arrival order).
    pub(crate) fn take_expired(&self, timeout: std::time::Duration) -> Vec<QueuedCommand> {
        let mut queued = self.queued.lock();
        let mut expired = Vec::new();
        while queued
            .commands
            .front()
            .is_some_and(|c| c.responder.enqueued_at.elapsed() > timeout)
        {
            expired.extend(queued.pop_front());
        }
        expired
    }

    /// Removes every queued command (to answer them on shutdown or leadership loss).
    pub(crate) fn take_all(&self) -> Vec<QueuedCommand> {
        let mut queued = self.queued.lock();
        queued.bytes = 0;
        queued.commands.drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pending::Pending;

    fn commands(count: usize, bytes: usize) -> Vec<QueuedCommand> {
        let (_pending, responders) =
            Pending::<Vec<Result<Bytes, crate::ProposeError>>>::batch(0, count);
        responders
            .into_iter()
            .map(|responder| QueuedCommand {
                command: Bytes::from(vec![0u8; bytes]),
                kind: CommandKind::Client,
                responder,
            })
            .collect()
    }

    #[test]
    fn a_batch_is_queued_whole_or_not_at_all() {
        let queue = ProposalQueue::new(4, 1000);
        assert_eq!(queue.push_batch(commands(3, 10)), Ok(true));
        assert_eq!(queue.push_batch(commands(2, 10)), Err(BatchRefused::Full));
        assert_eq!(queue.len(), 3, "nothing of the refused batch was queued");
        assert_eq!(queue.push_batch(commands(1, 10)), Ok(false));
        queue.take_all();
        assert_eq!(
            queue.push_batch(commands(5, 10)),
            Err(BatchRefused::NeverFits {
                commands: 5,
                bytes: 50,
                capacity: 4,
                capacity_bytes: 1000
            })
        );
        assert!(matches!(
            queue.push_batch(commands(2, 600)),
            Err(BatchRefused::NeverFits { bytes: 1200, .. })
        ));
        assert_eq!(queue.push_batch(commands(2, 400)), Ok(true));
        assert_eq!(queue.push_batch(commands(1, 400)), Err(BatchRefused::Full));
    }
}
