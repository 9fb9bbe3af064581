//! One group as its worker sees it: what the node loop keeps for every group whatever the
//! replication ([`GroupState`]), beside the replica that replicates it.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use concord_storage::GroupId;
use concord_storage::raft::prelude::Entry;

use crate::ProposeError;
use crate::apply::ProposedEntry;
use crate::log_compaction::{EntrySizes, entry_payload_bytes};
use crate::pending::ReadResponder;
use crate::proposal_queue::ProposalQueue;
use crate::status::SharedGroupStatus;

/// A group on a worker: the loop's bookkeeping and the replica.
pub(crate) struct Group<R> {
    pub(crate) state: GroupState,
    pub(crate) replica: R,
}

/// What the node loop keeps for a group, the same for raft and solo.
pub(crate) struct GroupState {
    pub(crate) id: GroupId,
    pub(crate) queue: Arc<ProposalQueue>,
    pub(crate) status: Arc<SharedGroupStatus>,
    /// Entries this node proposed, oldest first, not yet committed.
    pub(crate) proposed: VecDeque<ProposedEntry>,
    /// Entries this node proposed that were handed to the apply thread and have not applied
    /// yet: their callers are still answered `Timeout` if apply takes too long.
    pub(crate) applying: VecDeque<ProposedEntry>,
    /// Persist time of this node's proposed entries, for `raft_commit_wait_seconds`.
    pub(crate) persisted_at: VecDeque<(u64, Instant)>,
    /// Reads waiting for their ReadIndex, by read id.
    pub(crate) reads_waiting_index: HashMap<u64, ReadResponder>,
    /// Reads that know their index, waiting for apply to reach it.
    pub(crate) reads_waiting_apply: Vec<(u64, ReadResponder)>,
    /// Sizes of the entries appended since start, for the byte bound of log compaction.
    pub(crate) entry_sizes: EntrySizes,
    /// The group's queue may hold more than one entry's worth: drain it again next round.
    pub(crate) more_queued: bool,
    /// The applied index the replica was last told about.
    pub(crate) advanced_applied: u64,
}

impl GroupState {
    /// A group whose state store has applied through `applied`.
    pub(crate) fn new(
        id: GroupId,
        queue: Arc<ProposalQueue>,
        status: Arc<SharedGroupStatus>,
        applied: u64,
    ) -> Self {
        GroupState {
            id,
            queue,
            status,
            proposed: VecDeque::new(),
            applying: VecDeque::new(),
            persisted_at: VecDeque::new(),
            reads_waiting_index: HashMap::new(),
            reads_waiting_apply: Vec::new(),
            entry_sizes: EntrySizes::default(),
            more_queued: false,
            advanced_applied: applied,
        }
    }

    /// `true` once the group stopped: it takes no more work.
    pub(crate) fn is_stopped(&self) -> bool {
        self.status.is_stopped()
    }

    /// Records entries about to be written to the log: their sizes (for compaction), the
    /// last log index, and when this node's own proposals among them were persisted.
    pub(crate) fn appending(&mut self, entries: &[Entry]) {
        self.entry_sizes
            .appended(entries.iter().map(|e| (e.index, entry_payload_bytes(e))));
        let Some(last) = entries.last() else {
            return;
        };
        self.status.set_last_log_index(last.index);
        let now = Instant::now();
        for entry in entries {
            if self.proposed.back().is_some_and(|p| p.index >= entry.index) {
                self.persisted_at.push_back((entry.index, now));
            }
        }
    }

    /// A read's index is known: it waits for apply to reach it.
    pub(crate) fn read_index_known(&mut self, read_id: u64, index: u64) {
        if let Some(responder) = self.reads_waiting_index.remove(&read_id) {
            self.reads_waiting_apply.push((index, responder));
        }
    }

    /// This node no longer leads: reads waiting for an index it will never confirm are
    /// answered now (queued commands are refused on the next drain).
    pub(crate) fn lost_leadership(&mut self, error: &ProposeError) {
        for (_, mut responder) in self.reads_waiting_index.drain() {
            responder.answer(Err(error.clone()));
        }
    }

    /// Takes this node's proposals whose entries are committed through `last`, to go to the
    /// apply thread with them (a copy stays in `applying` for the timeout), and records the
    /// commit wait of the persisted ones.
    pub(crate) fn committed_through(&mut self, last: u64) -> Vec<ProposedEntry> {
        let mut proposals = Vec::new();
        while self.proposed.front().is_some_and(|p| p.index <= last) {
            let proposal = self.proposed.pop_front().expect("checked");
            self.applying.push_back(proposal.clone());
            proposals.push(proposal);
        }
        let now = Instant::now();
        while let Some(&(index, persisted)) = self.persisted_at.front() {
            if index > last {
                break;
            }
            self.status
                .metrics
                .commit_wait
                .record(now.duration_since(persisted).as_secs_f64());
            self.persisted_at.pop_front();
        }
        proposals
    }

    /// Serves the reads whose index has applied and forgets the proposals that applied (their
    /// callers were answered by the apply thread). Returns `true` if reads still wait.
    pub(crate) fn applied_to(&mut self, applied: u64) -> bool {
        while self.applying.front().is_some_and(|p| p.index <= applied) {
            self.applying.pop_front();
        }
        self.reads_waiting_apply.retain_mut(|(index, responder)| {
            if *index <= applied {
                responder.answer(Ok(applied));
                false
            } else {
                true
            }
        });
        !self.reads_waiting_apply.is_empty()
    }

    /// Answers `Timeout` to every caller that waited longer than `timeout`, wherever its
    /// command or read is: queued, proposed, being applied, or waiting for an index.
    pub(crate) fn answer_expired(&mut self, timeout: Duration) {
        let group = self.id;
        let error = ProposeError::Timeout {
            group,
            timeout_ms: timeout.as_millis() as u64,
        };
        for mut queued in self.queue.take_expired(timeout) {
            queued.responder.answer(Err(error.clone()));
        }
        // Proposals answered here stay listed until their index commits or applies, so the
        // lists are bounded by the uncommitted tail and the apply queue.
        for proposal in self.proposed.iter().chain(&self.applying) {
            if proposal.oldest_enqueued_at.elapsed() <= timeout {
                continue;
            }
            for responder in proposal.responders.lock().iter_mut() {
                if !responder.is_answered() && responder.enqueued_at.elapsed() > timeout {
                    responder.answer(Err(error.clone()));
                }
            }
        }
        let expired = |reader: &ReadResponder| reader.enqueued_at().elapsed() > timeout;
        self.reads_waiting_index.retain(|_, responder| {
            if expired(responder) {
                responder.answer(Err(error.clone()));
                false
            } else {
                true
            }
        });
        self.reads_waiting_apply.retain_mut(|(_, responder)| {
            if expired(responder) {
                responder.answer(Err(error.clone()));
                false
            } else {
                true
            }
        });
    }

    /// Answers everything queued or waiting with `Stopped`. Entries already handed to the
    /// apply thread are left to it: they are committed and it answers them.
    pub(crate) fn answer_stopped(&mut self, reason: &str) {
        let error = ProposeError::Stopped {
            group: self.id,
            reason: reason.to_string(),
        };
        for mut queued in self.queue.take_all() {
            queued.responder.answer(Err(error.clone()));
        }
        for proposal in self.proposed.drain(..) {
            for responder in proposal.responders.lock().iter_mut() {
                responder.answer(Err(error.clone()));
            }
        }
        self.applying.clear();
        for (_, mut responder) in self.reads_waiting_index.drain() {
            responder.answer(Err(error.clone()));
        }
        for (_, mut responder) in self.reads_waiting_apply.drain(..) {
            responder.answer(Err(error.clone()));
        }
    }
}
