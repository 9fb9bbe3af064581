//! One group as its worker sees it: what the node loop keeps for every group whatever the
//! replication ([`GroupState`]), beside the replica that replicates it.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use concord_storage::GroupId;
use concord_storage::raft::prelude::Entry;

use crate::apply_callers::{CallersBuilder, CommittedProposal, ProposedEntry};
use crate::log_compaction::{EntrySizes, entry_payload_bytes};
use crate::node_loop::forward_tag::ForwardTag;
use crate::pending::ReadResponder;
use crate::proposal_queue::ProposalQueue;
use crate::status::SharedGroupStatus;
use crate::{NodeId, ProposeError};

/// How long entries forwarded before a snapshot install wait for their commit after it: one
/// committed past the snapshot arrives with the entries the leader sends next; one the
/// snapshot covers never does, and its caller is told the result is unknown.
const FORWARDED_AFTER_SNAPSHOT_WAIT: Duration = Duration::from_secs(1);

/// A group on a worker: the loop's bookkeeping and the replica.
pub(crate) struct Group<R> {
    pub(crate) state: GroupState,
    pub(crate) replica: R,
}

/// A read waiting for its ReadIndex, and whom it was last asked of.
pub(crate) struct WaitingRead {
    /// The reads of the group that arrived in the round this index was first asked in: one
    /// index, asked after all of them arrived, serves them all.
    pub(crate) responders: Vec<ReadResponder>,
    pub(crate) asked_at: Instant,
    /// The `(leader, term)` the read was last asked under: asked again when they change (a
    /// leader that steps down forgets the reads it was asked).
    pub(crate) asked_under: (NodeId, u64),
}

/// What the node loop keeps for a group, the same for raft and solo.
pub(crate) struct GroupState {
    pub(crate) id: GroupId,
    pub(crate) queue: Arc<ProposalQueue>,
    pub(crate) status: Arc<SharedGroupStatus>,
    /// Entries this node proposed, oldest first, not yet committed.
    pub(crate) proposed: VecDeque<ProposedEntry>,
    /// Entries this node forwarded to the leader, by forward id, oldest first: their index
    /// and term are learned when they commit (until then `index` is 0 and `term` the term they
    /// were forwarded in). One that never commits (lost with a leader) is answered `Timeout`
    /// and forgotten.
    pub(crate) forwarded: VecDeque<(u64, ProposedEntry)>,
    /// The id the next forwarded entry gets.
    next_forward_id: u64,
    /// After a snapshot install: forwarded entries with ids below the first value may be in
    /// the snapshot (applied there, their results unknown here); those still unmatched at
    /// the instant are answered `ResultUnknown`.
    forwarded_before_snapshot: Option<(u64, Instant)>,
    /// Reads waiting for their ReadIndex, by read id.
    pub(crate) reads_waiting_index: HashMap<u64, WaitingRead>,
    /// Reads that know their index, waiting for apply to reach it.
    pub(crate) reads_waiting_apply: Vec<(u64, ReadResponder)>,
    /// Sizes of the entries appended since start, for the byte bound of log compaction.
    pub(crate) entry_sizes: EntrySizes,
    /// The group's queue may hold more than one entry's worth: drain it again next round.
    pub(crate) more_queued: bool,
    /// The applied index the replica was last told about.
    pub(crate) advanced_applied: u64,
    /// Voter progress was published last tick (cleared once when this node stops leading).
    pub(crate) voters_published: bool,
    /// When this node last became the group's leader; `None` while it does not lead. The
    /// leader balance hands the groups led longest over first, so that one just moved here on
    /// purpose (an operator's transfer) is not sent straight back.
    pub(crate) leading_since: Option<Instant>,
}

impl GroupState {
    /// A group whose state store has applied through `applied`, counting its entries' sizes
    /// in `entry_sizes`.
    pub(crate) fn new(
        id: GroupId,
        queue: Arc<ProposalQueue>,
        status: Arc<SharedGroupStatus>,
        applied: u64,
        entry_sizes: EntrySizes,
    ) -> Self {
        GroupState {
            id,
            queue,
            status,
            proposed: VecDeque::new(),
            forwarded: VecDeque::new(),
            next_forward_id: super::forward_tag::first_forward_id(),
            forwarded_before_snapshot: None,
            reads_waiting_index: HashMap::new(),
            reads_waiting_apply: Vec::new(),
            entry_sizes,
            more_queued: false,
            advanced_applied: applied,
            voters_published: false,
            leading_since: None,
        }
    }

    /// `true` when nothing of this node waits on the group: no command queued or on its way,
    /// no read waiting, everything committed applied. A quiet group may sleep.
    pub(crate) fn is_quiet(&self) -> bool {
        !self.more_queued
            && self.proposed.is_empty()
            && self.forwarded.is_empty()
            && self.reads_waiting_index.is_empty()
            && self.reads_waiting_apply.is_empty()
            && self.advanced_applied >= self.status.commit_index.load(Ordering::Acquire)
            && self.queue.len() == 0
    }

    /// `true` if a caller of this node waits on the group before apply: a command queued (the
    /// queue is drained until empty once it was announced, so an empty `more_queued` means
    /// nothing queued long enough to matter), proposed or forwarded, or a read. (Callers whose
    /// entries went to the apply thread wait in the worker's `InApply`.)
    pub(crate) fn has_waiting(&self) -> bool {
        self.more_queued
            || !self.proposed.is_empty()
            || !self.forwarded.is_empty()
            || !self.reads_waiting_index.is_empty()
            || !self.reads_waiting_apply.is_empty()
    }

    /// `true` once the group stopped: it takes no more work.
    pub(crate) fn is_stopped(&self) -> bool {
        self.status.is_stopped()
    }

    /// Records entries about to be written to the log: their sizes (for compaction), the
    /// last log index, and when (`now`) this node's own proposals among them were persisted.
    pub(crate) fn appending(&mut self, entries: &[Entry], now: Instant) {
        self.entry_sizes
            .appended(entries.iter().map(|e| (e.index, entry_payload_bytes(e))));
        let Some(last) = entries.last() else {
            return;
        };
        self.status.set_last_log_index(last.index);
        let first = entries[0].index;
        for proposal in self.proposed.iter_mut().rev() {
            if proposal.index < first {
                break;
            }
            if proposal.index <= last.index {
                proposal.persisted_at = Some(now);
            }
        }
    }

    /// A read whose index was asked (or will be) under `asked_under`: it waits for the index.
    pub(crate) fn wait_for_index(
        &mut self,
        read_id: u64,
        responder: ReadResponder,
        asked_under: (NodeId, u64),
        now: Instant,
    ) {
        let read = WaitingRead {
            responders: vec![responder],
            asked_at: now,
            asked_under,
        };
        self.reads_waiting_index.insert(read_id, read);
    }

    /// Another read shares the index asked as `read_id` (it arrived before the index was
    /// asked); handed back if that read no longer waits for its index.
    pub(crate) fn join_read(
        &mut self,
        read_id: u64,
        responder: ReadResponder,
    ) -> Result<(), ReadResponder> {
        match self.reads_waiting_index.get_mut(&read_id) {
            Some(read) => {
                read.responders.push(responder);
                Ok(())
            }
            None => Err(responder),
        }
    }

    /// A read's index is known: its reads wait for apply to reach it.
    pub(crate) fn read_index_known(&mut self, read_id: u64, index: u64) {
        if let Some(read) = self.reads_waiting_index.remove(&read_id) {
            self.reads_waiting_apply
                .extend(read.responders.into_iter().map(|r| (index, r)));
        }
    }

    /// The `(leader, term)` this node knows now.
    pub(crate) fn leadership(&self) -> (NodeId, u64) {
        (
            self.status.leader.load(Ordering::Acquire),
            self.status.term.load(Ordering::Acquire),
        )
    }

    /// Entries this node has on their way to commit in the current term: its own, and those
    /// it forwarded to the current leader (one forwarded to an earlier leader may never
    /// commit, and must not hold new proposals back).
    pub(crate) fn in_flight(&self) -> usize {
        let term = self.status.term.load(Ordering::Acquire);
        self.proposed.len()
            + self
                .forwarded
                .iter()
                .filter(|(_, f)| f.term == term)
                .count()
    }

    /// Records an entry forwarded to the leader under `id` (from
    /// [`GroupState::take_forward_id`]).
    pub(crate) fn forwarding(&mut self, id: u64, entry: ProposedEntry) {
        self.forwarded.push_back((id, entry));
    }

    /// The id of the next entry this node forwards.
    pub(crate) fn take_forward_id(&mut self) -> u64 {
        let id = self.next_forward_id;
        self.next_forward_id += 1;
        id
    }

    /// Finds this node's forwarded entries among committed `entries` (by the tag in their
    /// context) and moves them to `proposals` with the index and term they committed at, their
    /// callers to `callers`.
    /// Forwarded entries of a term older than the last committed entry's are lost (a leader
    /// takes a forwarded entry only in the term it was forwarded in, and entries of a term
    /// commit before any of a later term): their callers are answered `Dropped`.
    pub(crate) fn match_forwarded(
        &mut self,
        node: NodeId,
        entries: &[Entry],
        callers: &mut CallersBuilder,
        proposals: &mut Vec<CommittedProposal>,
    ) {
        if self.forwarded.is_empty() {
            return;
        }
        let before = proposals.len();
        for entry in entries {
            let Some(tag) = ForwardTag::decode(&entry.context) else {
                continue;
            };
            if tag.node != node {
                continue;
            }
            let Some(position) = self.forwarded.iter().position(|(id, _)| *id == tag.id) else {
                continue;
            };
            let (_, mut proposal) = self.forwarded.remove(position).expect("found");
            proposal.index = entry.index;
            proposal.term = entry.term;
            proposals.push(callers.commit(self.id, proposal));
        }
        if proposals.len() > before {
            // Own and forwarded entries interleave after a change of leader.
            proposals.sort_unstable_by_key(|p| p.index);
        }
        let Some(newest_term) = entries.last().map(|e| e.term) else {
            return;
        };
        let dropped = ProposeError::Dropped { group: self.id };
        let unknown = ProposeError::ResultUnknown { group: self.id };
        let before_snapshot = self.forwarded_before_snapshot.map_or(0, |(below, _)| below);
        self.forwarded.retain_mut(|(id, proposal)| {
            if proposal.term >= newest_term {
                return true;
            }
            // Lost with its leader — unless a snapshot took it in.
            let answer = if *id < before_snapshot {
                &unknown
            } else {
                &dropped
            };
            proposal.answer_all(answer);
            false
        });
    }

    /// A snapshot was installed: entries this node forwarded and has not seen commit may be
    /// in it. They get a moment to commit past it; then their callers are told their results
    /// are unknown here (and never that they were dropped: they may have applied).
    pub(crate) fn snapshot_installed(&mut self, now: Instant) {
        if !self.forwarded.is_empty() {
            self.forwarded_before_snapshot =
                Some((self.next_forward_id, now + FORWARDED_AFTER_SNAPSHOT_WAIT));
        }
    }

    /// Answers `ResultUnknown` to forwarded entries a snapshot may have covered, once they had
    /// their moment to commit after it.
    fn answer_forwarded_before_snapshot(&mut self, now: Instant) {
        let Some((below, at)) = self.forwarded_before_snapshot else {
            return;
        };
        if now < at {
            return;
        }
        self.forwarded_before_snapshot = None;
        let unknown = ProposeError::ResultUnknown { group: self.id };
        self.forwarded.retain_mut(|(id, proposal)| {
            if *id >= below {
                return true;
            }
            proposal.answer_all(&unknown);
            false
        });
    }

    /// Takes this node's proposals whose entries are committed through `last`, to go to the
    /// apply thread with them (their callers into `callers`), and records the commit wait of
    /// the persisted ones (until `now`) in `commit_wait` (looked up once per round by the
    /// caller).
    pub(crate) fn committed_through(
        &mut self,
        last: u64,
        now: Instant,
        commit_wait: &metrics::Histogram,
        callers: &mut CallersBuilder,
    ) -> Vec<CommittedProposal> {
        let mut proposals = Vec::new();
        while self.proposed.front().is_some_and(|p| p.index <= last) {
            let proposal = self.proposed.pop_front().expect("checked");
            if let Some(persisted) = proposal.persisted_at {
                commit_wait.record(now.duration_since(persisted).as_secs_f64());
            }
            proposals.push(callers.commit(self.id, proposal));
        }
        proposals
    }

    /// Serves the reads whose index has applied. Returns `true` if reads still wait.
    pub(crate) fn applied_to(&mut self, applied: u64) -> bool {
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
    /// command or read is before apply: queued, proposed, forwarded, or waiting for an index.
    pub(crate) fn answer_expired(&mut self, timeout: Duration) {
        self.answer_forwarded_before_snapshot(Instant::now());
        let group = self.id;
        let error = ProposeError::Timeout {
            group,
            timeout_ms: timeout.as_millis() as u64,
        };
        for mut queued in self.queue.take_expired(timeout) {
            queued.responder.answer(Err(error.clone()));
        }
        // Proposals answered here stay listed until their index commits, so the lists are
        // bounded by the uncommitted tail.
        let forwarded = self.forwarded.iter_mut().map(|(_, proposal)| proposal);
        for proposal in self.proposed.iter_mut().chain(forwarded) {
            if proposal.oldest_enqueued_at.elapsed() <= timeout {
                continue;
            }
            for responder in &mut proposal.responders {
                responder.answer_if_expired(timeout, &error);
            }
        }
        // A forwarded entry nobody waits for any more is forgotten: it may never commit.
        self.forwarded.retain(|(_, proposal)| {
            proposal.oldest_enqueued_at.elapsed() <= timeout
                || proposal.responders.iter().any(|r| !r.is_answered())
        });
        let expired = |reader: &ReadResponder| reader.enqueued_at().elapsed() > timeout;
        self.reads_waiting_index.retain(|_, read| {
            read.responders.retain_mut(|responder| {
                if expired(responder) {
                    responder.answer(Err(error.clone()));
                    false
                } else {
                    true
                }
            });
            !read.responders.is_empty()
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
        let forwarded = self.forwarded.drain(..).map(|(_, proposal)| proposal);
        for mut proposal in self.proposed.drain(..).chain(forwarded) {
            proposal.answer_all(&error);
        }
        for (_, read) in self.reads_waiting_index.drain() {
            for mut responder in read.responders {
                responder.answer(Err(error.clone()));
            }
        }
        for (_, mut responder) in self.reads_waiting_apply.drain(..) {
            responder.answer(Err(error.clone()));
        }
    }
}
