//! The apply stage: committed entries are applied here, off the raft loop, one state-store
//! transaction per batch, and each waiting caller is answered with its own result.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use concord_engine::raft::prelude::{Entry, EntryType};
use concord_engine::{GroupId, StateStore, StateTransaction};

use crate::pending::Responder;
use crate::status::SharedGroupStatus;
use crate::{ApplyError, CommandResult, ProposeError, StateMachine, StateMachineFactory};

/// Proposals of this node that went into one entry, waiting for it to apply.
pub(crate) struct ProposedEntry {
    /// The entry's index and the term it was proposed in: if the committed entry at that index
    /// has another term, a new leader replaced it and the proposals were dropped.
    pub(crate) index: u64,
    pub(crate) term: u64,
    /// One responder per command, in the entry's order.
    pub(crate) responders: Vec<Responder<Bytes>>,
}

/// Work for an apply thread.
pub(crate) enum ApplyMessage {
    /// Committed entries of one group, in order, and the proposals whose entries are among them.
    Apply {
        group: GroupId,
        entries: Vec<Entry>,
        proposals: Vec<ProposedEntry>,
    },
    /// Flush the state store and stop.
    Shutdown,
}

/// What an apply thread needs.
pub(crate) struct Applier {
    pub(crate) store: Arc<dyn StateStore>,
    pub(crate) factory: Arc<dyn StateMachineFactory>,
    pub(crate) statuses: HashMap<GroupId, Arc<SharedGroupStatus>>,
    /// Called after each applied batch, to let the raft worker advance and serve reads.
    pub(crate) on_applied: Box<dyn Fn() + Send>,
    pub(crate) flush_interval: Duration,
    /// See `NodeConfig::idle_spin`.
    pub(crate) idle_spin: Duration,
}

impl Applier {
    /// Runs until `Shutdown` or until the sending side is gone.
    pub(crate) fn run(self, inbox: Receiver<ApplyMessage>) {
        let mut machines: HashMap<GroupId, Box<dyn StateMachine>> = HashMap::new();
        let mut last_flush = Instant::now();
        let mut unflushed = false;
        loop {
            let message = match receive(&inbox, self.flush_interval, self.idle_spin) {
                Ok(message) => message,
                Err(RecvTimeoutError::Timeout) => {
                    if unflushed {
                        self.flush();
                        unflushed = false;
                        last_flush = Instant::now();
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            };
            match message {
                ApplyMessage::Apply {
                    group,
                    entries,
                    proposals,
                } => {
                    self.apply(&mut machines, group, entries, proposals);
                    unflushed = true;
                    if last_flush.elapsed() >= self.flush_interval {
                        self.flush();
                        unflushed = false;
                        last_flush = Instant::now();
                    }
                }
                ApplyMessage::Shutdown => break,
            }
        }
        self.flush();
    }

    fn flush(&self) {
        if let Err(error) = self.store.flush() {
            for status in self.statuses.values() {
                status.stop(format!("state store flush failed: {error}"));
            }
        }
    }

    fn apply(
        &self,
        machines: &mut HashMap<GroupId, Box<dyn StateMachine>>,
        group: GroupId,
        entries: Vec<Entry>,
        mut proposals: Vec<ProposedEntry>,
    ) {
        let Some(status) = self.statuses.get(&group) else {
            return;
        };
        if let Some(reason) = status.stopped_reason() {
            answer_all(&mut proposals, ProposeError::Stopped { group, reason });
            return;
        }
        let started = Instant::now();
        match self.apply_batch(machines, group, &entries, &mut proposals) {
            Ok(Some((last_index, answers))) => {
                // Published before anyone is answered: a caller that saw its result and then
                // reads the status sees its write applied.
                status.set_applied(last_index);
                answer(status, &mut proposals, answers);
                status
                    .metrics
                    .apply_batch_duration
                    .record(started.elapsed().as_secs_f64());
                status
                    .metrics
                    .apply_batch_entries
                    .record(entries.len() as f64);
            }
            Ok(None) => {}
            Err(error) => {
                status.stop(format!("apply failed: {error}"));
                machines.remove(&group);
            }
        }
        // Anything not answered by now lost its entry to a new leader, or the group stopped.
        let failure = match status.stopped_reason() {
            Some(reason) => ProposeError::Stopped { group, reason },
            None => ProposeError::Dropped { group },
        };
        answer_all(&mut proposals, failure);
        (self.on_applied)();
    }

    /// Applies `entries` in one transaction. Returns the new applied index and the results for
    /// the proposals the entries carry, or `None` if every entry was applied before.
    fn apply_batch(
        &self,
        machines: &mut HashMap<GroupId, Box<dyn StateMachine>>,
        group: GroupId,
        entries: &[Entry],
        proposals: &mut [ProposedEntry],
    ) -> Result<Option<(u64, Vec<Answer>)>, ApplyError> {
        let applied = self.store.applied_index(group)?;
        let fresh: Vec<&Entry> = entries.iter().filter(|e| e.index > applied).collect();
        let Some(last) = fresh.last() else {
            return Ok(None);
        };
        let last_index = last.index;
        let machine = match machines.entry(group) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                entry.insert(self.factory.create(group)?)
            }
        };
        let mut txn = StateTransaction::new(self.store.as_ref(), group);
        let mut answers: Vec<Answer> = Vec::new();
        for entry in fresh {
            if entry.get_entry_type() != EntryType::EntryNormal || entry.data.is_empty() {
                continue; // A new leader's empty entry, or a conf change (no membership yet).
            }
            let results = match crate::command_batch::decode(&entry.data) {
                Ok(commands) => {
                    let results = machine.apply(&mut txn, &commands)?;
                    if results.len() != commands.len() {
                        return Err(ApplyError::Fatal(format!(
                            "state machine returned {} results for {} commands",
                            results.len(),
                            commands.len()
                        )));
                    }
                    results
                }
                // Every replica decodes the same bytes the same way: a deterministic failure of
                // every command in the entry, and the group goes on.
                Err(reason) => {
                    tracing::warn!(group, index = entry.index, %reason, "malformed entry");
                    Vec::new()
                }
            };
            if let Some(position) = proposals
                .iter()
                .position(|p| p.index == entry.index && p.term == entry.term)
            {
                answers.push((position, results));
            }
        }
        txn.commit(last_index)?;
        Ok(Some((last_index, answers)))
    }
}

/// The results of the commands of one proposed entry: `(position in proposals, results)`.
type Answer = (usize, Vec<CommandResult>);

/// Sends each command's result to its caller.
fn answer(status: &SharedGroupStatus, proposals: &mut [ProposedEntry], answers: Vec<Answer>) {
    for (position, results) in answers {
        let proposal = &mut proposals[position];
        let mut results = results.into_iter();
        for responder in &mut proposal.responders {
            let result = match results.next() {
                Some(Ok(bytes)) => Ok(bytes),
                Some(Err(error)) => Err(ProposeError::Command(error)),
                None => Err(ProposeError::Command(crate::CommandError::new(
                    0,
                    "the entry carrying this command was malformed",
                ))),
            };
            let latency = responder.enqueued_at.elapsed();
            status.metrics.write_duration.record(latency.as_secs_f64());
            responder.answer(result);
        }
    }
}

fn answer_all(proposals: &mut [ProposedEntry], error: ProposeError) {
    for proposal in proposals {
        for responder in &mut proposal.responders {
            if !responder.is_answered() {
                responder.answer(Err(error.clone()));
            }
        }
    }
}

/// Receives the next message: yields the CPU for `idle_spin` while watching the channel, then
/// blocks for up to `timeout`.
fn receive(
    inbox: &Receiver<ApplyMessage>,
    timeout: Duration,
    idle_spin: Duration,
) -> Result<ApplyMessage, RecvTimeoutError> {
    let yield_until = Instant::now() + idle_spin;
    loop {
        match inbox.try_recv() {
            Ok(message) => return Ok(message),
            Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
            Err(TryRecvError::Empty) if Instant::now() < yield_until => std::thread::yield_now(),
            Err(TryRecvError::Empty) => return inbox.recv_timeout(timeout),
        }
    }
}
