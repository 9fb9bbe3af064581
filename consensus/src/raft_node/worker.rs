//! One raft worker thread: the poll loop over the groups it owns.
//!
//! Each round:
//! 1. take the inbox (peer messages, proposal wake-ups, reads, campaigns) and step messages;
//! 2. drain each group's proposal queue into **one** raft entry per group;
//! 3. tick the clocks when due;
//! 4. collect the `Ready` of every group: send the leader's messages at once, queue committed
//!    entries for apply, and put every group's new entries and hard state into **one**
//!    `LogBatch`;
//! 5. write that batch — **one sync** for all groups;
//! 6. `advance_append` each group: send the messages that had to wait for the persist, queue
//!    newly committed entries;
//! 7. hand committed entries to the apply thread (never applied on this thread), and advance
//!    raft's applied index from what the apply thread reports;
//! 8. answer proposals and reads that waited longer than the proposal timeout.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{SyncSender, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use concord_storage::raft::prelude::{Entry, Message};
use concord_storage::raft::{self, RawNode, ReadState, StateRole};
use concord_storage::{GroupId, LogBatch, Stores};

use super::NodeShared;
use super::storage::GroupStorage;
use crate::apply::{Applier, ApplyMessage, ProposedEntry};
use crate::id_map::IdMap;
use crate::log_compaction::{EntrySizes, compact_index, entry_payload_bytes};
use crate::mailbox::Inbox;
use crate::pending::Responder;
use crate::proposal_queue::{ProposalQueue, QueuedCommand};
use crate::status::SharedGroupStatus;
use crate::transport::{GroupMessage, Transport};
use crate::{ProposeError, StartError, StateMachineFactory};

/// How often waiting proposals and reads are checked against the timeout.
const TIMEOUT_SCAN_INTERVAL: Duration = Duration::from_millis(50);

/// One group as its worker sees it.
struct GroupRuntime {
    id: GroupId,
    raw: RawNode<GroupStorage>,
    queue: Arc<ProposalQueue>,
    status: Arc<SharedGroupStatus>,
    /// Entries this node proposed, oldest first, waiting to commit.
    proposed: VecDeque<ProposedEntry>,
    /// Persist time of this node's proposed entries, for `raft_commit_wait_seconds`.
    persisted_at: VecDeque<(u64, Instant)>,
    /// Reads waiting for their ReadIndex, by context id.
    reads_waiting_index: HashMap<u64, Responder<u64>>,
    /// Reads that know their index, waiting for apply to reach it.
    reads_waiting_apply: Vec<(u64, Responder<u64>)>,
    /// The applied index raft was last told about.
    advanced_applied: u64,
    /// The commit index moved in `advance_append`: the hard state must be written again.
    commit_dirty: bool,
    /// The group's queue may hold more than one entry's worth: drain it again next round.
    more_queued: bool,
    /// Sizes of the entries appended since start, for the byte bound of log compaction.
    entry_sizes: EntrySizes,
    /// The highest index every voter has persisted, as a leader of this group last said:
    /// a follower compacts no further (0 until a leader says).
    replicated_floor: u64,
}

pub(crate) struct Worker {
    index: usize,
    shared: Arc<NodeShared>,
    stores: Stores,
    transport: Arc<dyn Transport>,
    groups: Vec<GroupRuntime>,
    positions: IdMap<usize>,
    applier: Option<Applier>,
    next_read_id: u64,
    /// `(position in groups, compact index)` to write with the next log batch.
    pending_compactions: Vec<(usize, u64)>,
}

impl Worker {
    pub(crate) fn new(
        index: usize,
        shared: Arc<NodeShared>,
        stores: Stores,
        factory: Arc<dyn StateMachineFactory>,
        transport: Arc<dyn Transport>,
    ) -> Result<Worker, StartError> {
        let config = &shared.config;
        let logger = super::logger::raft_logger(config.node_id);
        let mut groups = Vec::new();
        let mut statuses = IdMap::default();
        let mut owned: Vec<GroupId> = shared
            .entrance
            .groups
            .iter()
            .filter(|(_, handle)| handle.worker == index)
            .map(|(&group, _)| group)
            .collect();
        owned.sort_unstable();
        for group in owned {
            let handle = &shared.entrance.groups[&group];
            let applied = stores.state.applied_index(group)?;
            let raft_config = raft::Config {
                id: config.node_id,
                election_tick: config.election_ticks,
                heartbeat_tick: config.heartbeat_ticks,
                applied,
                max_size_per_msg: config.max_size_per_msg_bytes,
                max_inflight_msgs: config.max_inflight_msgs,
                check_quorum: config.check_quorum,
                pre_vote: config.pre_vote,
                ..Default::default()
            };
            let storage = GroupStorage::new(group, stores.log.clone(), applied)?;
            let raw = RawNode::new(&raft_config, storage, &logger)
                .map_err(|error| StartError::Raft(format!("group {group}: {error}")))?;
            handle
                .status
                .applied_index
                .store(applied, Ordering::Release);
            // What the state store holds at open is what survived: durable.
            handle
                .status
                .durable_applied_index
                .store(applied, Ordering::Release);
            handle
                .status
                .set_last_log_index(stores.log.last_index(group)?);
            statuses.insert(group, handle.status.clone());
            groups.push(GroupRuntime {
                id: group,
                raw,
                queue: handle.queue.clone(),
                status: handle.status.clone(),
                proposed: VecDeque::new(),
                persisted_at: VecDeque::new(),
                reads_waiting_index: HashMap::new(),
                reads_waiting_apply: Vec::new(),
                advanced_applied: applied,
                commit_dirty: false,
                more_queued: false,
                entry_sizes: EntrySizes::default(),
                replicated_floor: 0,
            });
        }
        let positions = groups.iter().enumerate().map(|(i, g)| (g.id, i)).collect();
        let mailbox = shared.entrance.mailboxes[index].clone();
        let applier = Applier {
            store: stores.state.clone(),
            factory,
            statuses,
            on_applied: Box::new(move || mailbox.applied()),
            flush_interval: config.state_flush_interval,
            idle_spin: config.idle_spin,
        };
        Ok(Worker {
            index,
            shared,
            stores,
            transport,
            groups,
            positions,
            applier: Some(applier),
            next_read_id: 1,
            pending_compactions: Vec::new(),
        })
    }

    /// Starts the worker thread and its apply thread.
    pub(crate) fn spawn(mut self) -> Result<Vec<JoinHandle<()>>, StartError> {
        let node = self.shared.config.node_id;
        let (apply_tx, apply_rx) = sync_channel(self.shared.config.apply_queue_capacity);
        let applier = self.applier.take().expect("spawned once");
        let apply_thread = std::thread::Builder::new()
            .name(format!("concord-apply-{node}-{}", self.index))
            .spawn(move || applier.run(apply_rx))
            .map_err(|e| StartError::Thread(e.to_string()))?;
        let mailbox = self.shared.entrance.mailboxes[self.index].clone();
        let raft_thread = std::thread::Builder::new()
            .name(format!("concord-raft-{node}-{}", self.index))
            .spawn(move || {
                let _ = mailbox.thread.set(std::thread::current());
                self.run(apply_tx);
            })
            .map_err(|e| StartError::Thread(e.to_string()))?;
        Ok(vec![raft_thread, apply_thread])
    }

    fn run(mut self, apply_tx: SyncSender<ApplyMessage>) {
        let config = self.shared.config.clone();
        let runtime = crate::metrics::RuntimeMetrics::new(config.node_id, self.index);
        runtime.alive_tasks.increment(2.0);
        if config.voters.len() == 1 {
            // A single voter need not wait for an election timeout.
            for group in &mut self.groups {
                let _ = group.raw.campaign();
            }
        }
        let mailbox = self.shared.entrance.mailboxes[self.index].clone();
        let mut next_tick = Instant::now() + config.tick_interval;
        let mut next_timeout_scan = Instant::now() + TIMEOUT_SCAN_INTERVAL;
        let mut busy = Duration::ZERO;
        let mut busy_window_started = Instant::now();
        loop {
            let inbox = mailbox.take();
            if inbox.shutdown {
                break;
            }
            let round_started = Instant::now();
            let mut worked = self.take_inbox(inbox);
            worked |= self.propose_queued();
            if round_started >= next_tick {
                for group in &mut self.groups {
                    if group.status.stopped_reason().is_none() {
                        group.raw.tick();
                    }
                }
                next_tick = round_started + config.tick_interval;
                worked = true;
                self.plan_compactions();
            }
            worked |= self.handle_readies(&apply_tx);
            self.advance_applied();
            if round_started >= next_timeout_scan {
                self.answer_timeouts(config.proposal_timeout);
                next_timeout_scan = round_started + TIMEOUT_SCAN_INTERVAL;
            }
            if worked {
                busy += round_started.elapsed();
            }
            if busy_window_started.elapsed() >= Duration::from_secs(1) {
                let ratio = busy.as_secs_f64() / busy_window_started.elapsed().as_secs_f64();
                runtime.busy_ratio.set(ratio);
                let queued: usize = self.groups.iter().map(|g| g.queue.len()).sum();
                runtime.global_queue_depth.set(queued as f64);
                busy = Duration::ZERO;
                busy_window_started = Instant::now();
            }
            // A group at its in-flight limit waits for a commit, which arrives as a message
            // and wakes this thread: it is not "more work".
            let max_in_flight = config.max_in_flight_entries;
            let has_more = self
                .groups
                .iter()
                .any(|g| (g.more_queued && g.proposed.len() < max_in_flight) || g.raw.has_ready());
            if !worked && !has_more {
                mailbox.wait(next_tick, config.idle_spin);
            }
        }
        self.stop_all("the node is shutting down");
        let _ = apply_tx.send(ApplyMessage::Shutdown);
        runtime.alive_tasks.decrement(2.0);
    }

    fn group_mut(&mut self, group: GroupId) -> Option<&mut GroupRuntime> {
        let position = *self.positions.get(&group)?;
        Some(&mut self.groups[position])
    }

    /// Steps peer messages, notes which queues to drain, registers reads and campaigns.
    fn take_inbox(&mut self, inbox: Inbox) -> bool {
        let worked = !inbox.messages.is_empty()
            || !inbox.proposals.is_empty()
            || !inbox.reads.is_empty()
            || !inbox.campaigns.is_empty();
        let node_id = self.shared.config.node_id;
        for GroupMessage {
            group,
            message,
            replicated_floor,
        } in inbox.messages
        {
            if message.to != node_id || !self.shared.config.voters.contains(&message.from) {
                crate::metrics::dropped_message("misaddressed");
                continue;
            }
            let Some(runtime) = self.group_mut(group) else {
                crate::metrics::dropped_message("unknown_group");
                continue;
            };
            if runtime.status.stopped_reason().is_some() {
                continue;
            }
            let from = message.from;
            let message_term = message.term;
            // raft-rs asserts on some impossible inputs (a commit index past the log, say). A
            // peer must not be able to crash the node with one: the group stops instead, since
            // its raft state may be half-updated.
            let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                runtime.raw.step(message)
            }));
            match stepped {
                Ok(Ok(())) => {
                    // Only the current leader's word counts; a floor never goes back (what
                    // every voter persisted stays persisted).
                    let raft = &runtime.raw.raft;
                    if from == raft.leader_id && message_term == raft.term {
                        runtime.replicated_floor = runtime.replicated_floor.max(replicated_floor);
                    }
                }
                Ok(Err(error)) => {
                    // A message raft-rs refuses (stale term, unknown peer) is dropped.
                    tracing::debug!(group, %error, "dropped a raft message");
                    crate::metrics::dropped_message("rejected");
                }
                Err(_) => {
                    crate::metrics::dropped_message("malformed");
                    runtime.status.stop(format!(
                        "raft rejected a malformed message from node {from} by panicking"
                    ));
                }
            }
        }
        for group in inbox.proposals {
            if let Some(runtime) = self.group_mut(group) {
                runtime.more_queued = true;
            }
        }
        for group in inbox.campaigns {
            if let Some(runtime) = self.group_mut(group) {
                let _ = runtime.raw.campaign();
            }
        }
        for (group, mut responder) in inbox.reads {
            let read_id = self.next_read_id;
            self.next_read_id += 1;
            let Some(runtime) = self.group_mut(group) else {
                responder.answer(Err(ProposeError::UnknownGroup { group }));
                continue;
            };
            if runtime.raw.raft.state != StateRole::Leader {
                responder.answer(Err(not_leader(runtime)));
                continue;
            }
            runtime.raw.read_index(read_id.to_le_bytes().to_vec());
            runtime.reads_waiting_index.insert(read_id, responder);
        }
        worked
    }

    /// Packs each group's queued commands into one raft entry.
    fn propose_queued(&mut self) -> bool {
        let config = &self.shared.config;
        let (max_commands, max_bytes) = (config.max_commands_per_entry, config.max_entry_bytes);
        let mut worked = false;
        let mut drained: Vec<QueuedCommand> = Vec::new();
        let max_in_flight = config.max_in_flight_entries;
        for runtime in &mut self.groups {
            // With enough entries on their way to commit, commands wait and the next entry
            // carries more of them: under load, batches grow instead of rounds multiplying.
            if !runtime.more_queued || runtime.proposed.len() >= max_in_flight {
                continue;
            }
            worked = true;
            drained.clear();
            runtime.more_queued = runtime
                .queue
                .drain_entry(max_commands, max_bytes, &mut drained);
            if drained.is_empty() {
                continue;
            }
            if runtime.raw.raft.state != StateRole::Leader {
                let error = not_leader(runtime);
                for mut queued in drained.drain(..) {
                    queued.responder.answer(Err(error.clone()));
                }
                continue;
            }
            let data = crate::command_batch::encode(drained.iter().map(|q| q.command.as_ref()));
            match runtime.raw.propose(Vec::new(), data) {
                Ok(()) => {
                    let index = runtime.raw.raft.raft_log.last_index();
                    let term = runtime.raw.raft.term;
                    let responders = drained.drain(..).map(|q| q.responder).collect();
                    runtime.proposed.push_back(ProposedEntry {
                        index,
                        term,
                        responders,
                    });
                }
                Err(error) => {
                    let answer = match error {
                        raft::Error::ProposalDropped => not_leader(runtime),
                        other => ProposeError::Stopped {
                            group: runtime.id,
                            reason: other.to_string(),
                        },
                    };
                    for mut queued in drained.drain(..) {
                        queued.responder.answer(Err(answer.clone()));
                    }
                }
            }
        }
        worked
    }

    /// Steps 4–7 of the round for every group with a `Ready`.
    fn handle_readies(&mut self, apply_tx: &SyncSender<ApplyMessage>) -> bool {
        let mut outbox: IdMap<Vec<GroupMessage>> = IdMap::default();
        let mut committed: IdMap<Vec<Entry>> = IdMap::default();
        let mut batch = LogBatch::new();
        let mut readies = Vec::new();
        for (position, runtime) in self.groups.iter_mut().enumerate() {
            if !runtime.raw.has_ready() || runtime.status.stopped_reason().is_some() {
                continue;
            }
            let mut ready = runtime.raw.ready();
            let group = runtime.id;
            if ready.ss().is_some() {
                publish_leadership(runtime);
            }
            let floor = replicated_floor(&runtime.raw.raft);
            queue_messages(&mut outbox, group, floor, ready.take_messages());
            if !ready.snapshot().is_empty() {
                runtime
                    .status
                    .stop("received a snapshot, which this version cannot install".into());
                continue;
            }
            push_committed(&mut committed, group, ready.take_committed_entries());
            for read in ready.take_read_states() {
                resolve_read_index(runtime, read);
            }
            let entries = ready.take_entries();
            let persisted: Vec<(u64, u64)> = entries.iter().map(|e| (e.index, e.term)).collect();
            runtime
                .entry_sizes
                .appended(entries.iter().map(|e| (e.index, entry_payload_bytes(e))));
            if let Some(last) = entries.last() {
                runtime.status.set_last_log_index(last.index);
                let now = Instant::now();
                for entry in &entries {
                    if runtime
                        .proposed
                        .back()
                        .is_some_and(|p| p.index >= entry.index)
                    {
                        runtime.persisted_at.push_back((entry.index, now));
                    }
                }
            }
            batch.append(group, entries);
            if ready.hs().is_some() || runtime.commit_dirty {
                batch.set_hard_state(group, runtime.raw.raft.hard_state());
                runtime.commit_dirty = false;
            }
            readies.push((position, ready, persisted));
        }
        if readies.is_empty() && self.pending_compactions.is_empty() {
            return false;
        }
        let compactions = std::mem::take(&mut self.pending_compactions);
        for &(position, compact_index) in &compactions {
            batch.compact(self.groups[position].id, compact_index);
        }
        if !batch.is_empty() {
            let entry_count = batch.entry_count();
            let started = Instant::now();
            if let Err(error) = self.stores.log.write(batch) {
                // The log can no longer be trusted: every group of this worker stops.
                let reason = format!("raft log write failed: {error}");
                for runtime in &self.groups {
                    runtime.status.stop(reason.clone());
                }
                self.stop_all(&reason);
                return true;
            }
            crate::metrics::log_append_batch(started.elapsed(), entry_count);
        }
        for (position, compact_index) in compactions {
            let runtime = &mut self.groups[position];
            runtime.raw.mut_store().compacted(compact_index);
            runtime.entry_sizes.compacted(compact_index);
        }
        for (position, mut ready, persisted) in readies {
            let runtime = &mut self.groups[position];
            let group = runtime.id;
            // raft reads what it just persisted from the storage after advance_append.
            runtime.raw.mut_store().persisted(&persisted);
            let floor = replicated_floor(&runtime.raw.raft);
            queue_messages(&mut outbox, group, floor, ready.take_persisted_messages());
            let mut light = runtime.raw.advance_append(ready);
            if let Some(commit) = light.commit_index() {
                runtime.status.commit_index.store(commit, Ordering::Release);
                runtime.commit_dirty = true;
            }
            queue_messages(&mut outbox, group, floor, light.take_messages());
            push_committed(&mut committed, group, light.take_committed_entries());
        }
        for (to, messages) in outbox {
            self.transport.send(to, messages);
        }
        for (group, entries) in committed {
            self.send_to_apply(apply_tx, group, entries);
        }
        true
    }

    /// Hands a group's committed entries, with the proposals they carry, to the apply thread.
    fn send_to_apply(
        &mut self,
        apply_tx: &SyncSender<ApplyMessage>,
        group: GroupId,
        entries: Vec<Entry>,
    ) {
        let Some(runtime) = self.group_mut(group) else {
            return;
        };
        let Some(last) = entries.last().map(|e| e.index) else {
            return;
        };
        let mut proposals = Vec::new();
        while runtime.proposed.front().is_some_and(|p| p.index <= last) {
            proposals.push(runtime.proposed.pop_front().expect("checked"));
        }
        let now = Instant::now();
        while let Some(&(index, persisted)) = runtime.persisted_at.front() {
            if index > last {
                break;
            }
            runtime
                .status
                .metrics
                .commit_wait
                .record(now.duration_since(persisted).as_secs_f64());
            runtime.persisted_at.pop_front();
        }
        let message = ApplyMessage::Apply {
            group,
            entries,
            proposals,
        };
        // A full apply queue blocks this worker: backpressure, not unbounded memory.
        if apply_tx.send(message).is_err() {
            runtime.status.stop("the apply thread stopped".into());
        }
    }

    /// Chooses the groups whose log can be compacted: below the state's durable applied index
    /// (a restart replays from there) and below what every voter has persisted (a voter
    /// catches up from the log, there being no snapshots; a follower that becomes leader must
    /// still hold what the others lack), keeping what `log_keep_entries` and `log_keep_bytes`
    /// say (`log_compaction.rs`).
    fn plan_compactions(&mut self) {
        let keep = self.shared.config.log_keep();
        for (position, runtime) in self.groups.iter().enumerate() {
            if runtime.status.stopped_reason().is_some() {
                continue;
            }
            // No further than the state's durable applied index, nor than what every voter
            // has: on a leader from its own view, on a follower from the leader's word.
            let durable = runtime.status.durable_applied_index.load(Ordering::Acquire);
            let raft = &runtime.raw.raft;
            let floor = if raft.state == StateRole::Leader {
                replicated_floor(raft)
            } else {
                runtime.replicated_floor
            };
            let bound = durable.min(floor);
            let first_index = raft.raft_log.store.first_index;
            if let Some(compact_index) =
                compact_index(bound, first_index, keep, &runtime.entry_sizes)
            {
                self.pending_compactions.push((position, compact_index));
            }
        }
    }

    /// Tells raft what the apply thread has applied, and serves reads that waited for it.
    fn advance_applied(&mut self) {
        let mut reads_waiting = false;
        for runtime in &mut self.groups {
            let applied = runtime.status.applied_index.load(Ordering::Acquire);
            if applied > runtime.advanced_applied {
                runtime.raw.advance_apply_to(applied);
                runtime.advanced_applied = applied;
            }
            if runtime.reads_waiting_apply.is_empty() {
                continue;
            }
            let mut waiting = std::mem::take(&mut runtime.reads_waiting_apply);
            waiting.retain_mut(|(index, responder)| {
                if *index <= applied {
                    responder.answer(Ok(applied));
                    false
                } else {
                    true
                }
            });
            reads_waiting |= !waiting.is_empty();
            runtime.reads_waiting_apply = waiting;
        }
        self.shared.entrance.mailboxes[self.index]
            .wake_on_apply
            .store(reads_waiting, Ordering::Release);
    }

    /// Answers everything that waited longer than `timeout`.
    fn answer_timeouts(&mut self, timeout: Duration) {
        let timeout_ms = timeout.as_millis() as u64;
        for runtime in &mut self.groups {
            let group = runtime.id;
            let expired = |responder_started: Instant| responder_started.elapsed() > timeout;
            // Commands still queued (a leader at its in-flight limit whose entry never
            // commits, say) time out too.
            for mut queued in runtime.queue.take_expired(timeout) {
                queued
                    .responder
                    .answer(Err(ProposeError::Timeout { group, timeout_ms }));
            }
            for proposal in &mut runtime.proposed {
                for responder in &mut proposal.responders {
                    if !responder.is_answered() && expired(responder.enqueued_at) {
                        responder.answer(Err(ProposeError::Timeout { group, timeout_ms }));
                    }
                }
            }
            // Proposals answered here stay in `proposed` until their index commits or is
            // overwritten, so the list is bounded by the log's uncommitted tail.
            runtime.reads_waiting_index.retain(|_, responder| {
                if expired(responder.enqueued_at) {
                    responder.answer(Err(ProposeError::Timeout { group, timeout_ms }));
                    false
                } else {
                    true
                }
            });
            runtime.reads_waiting_apply.retain_mut(|(_, responder)| {
                if expired(responder.enqueued_at) {
                    responder.answer(Err(ProposeError::Timeout { group, timeout_ms }));
                    false
                } else {
                    true
                }
            });
        }
    }

    /// Answers everything queued or waiting with `Stopped`.
    fn stop_all(&mut self, reason: &str) {
        for runtime in &mut self.groups {
            let error = ProposeError::Stopped {
                group: runtime.id,
                reason: reason.to_string(),
            };
            for mut queued in runtime.queue.take_all() {
                queued.responder.answer(Err(error.clone()));
            }
            for proposal in &mut runtime.proposed {
                for responder in &mut proposal.responders {
                    responder.answer(Err(error.clone()));
                }
            }
            runtime.proposed.clear();
            for (_, mut responder) in runtime.reads_waiting_index.drain() {
                responder.answer(Err(error.clone()));
            }
            for (_, mut responder) in runtime.reads_waiting_apply.drain(..) {
                responder.answer(Err(error.clone()));
            }
        }
    }
}

fn not_leader(runtime: &GroupRuntime) -> ProposeError {
    let leader = runtime.raw.raft.leader_id;
    ProposeError::NotLeader {
        group: runtime.id,
        leader: (leader != 0).then_some(leader),
    }
}

fn publish_leadership(runtime: &mut GroupRuntime) {
    let raft = &runtime.raw.raft;
    let is_leader = raft.state == StateRole::Leader;
    runtime
        .status
        .set_leader(raft.leader_id, is_leader, raft.term);
    if !is_leader {
        // Queued commands will be refused on the next drain; reads waiting for an index that
        // this node will never confirm get an answer now.
        let error = not_leader(runtime);
        for (_, mut responder) in runtime.reads_waiting_index.drain() {
            responder.answer(Err(error.clone()));
        }
    }
}

fn resolve_read_index(runtime: &mut GroupRuntime, read: ReadState) {
    let Ok(bytes) = <[u8; 8]>::try_from(read.request_ctx.as_slice()) else {
        return;
    };
    let read_id = u64::from_le_bytes(bytes);
    if let Some(responder) = runtime.reads_waiting_index.remove(&read_id) {
        runtime.reads_waiting_apply.push((read.index, responder));
    }
}

fn queue_messages(
    outbox: &mut IdMap<Vec<GroupMessage>>,
    group: GroupId,
    replicated_floor: u64,
    messages: Vec<Message>,
) {
    for message in messages {
        outbox.entry(message.to).or_default().push(GroupMessage {
            group,
            message,
            replicated_floor,
        });
    }
}

/// On a leader, the highest index every voter has persisted (its own included); 0 otherwise.
fn replicated_floor(raft: &raft::Raft<GroupStorage>) -> u64 {
    if raft.state != StateRole::Leader {
        return 0;
    }
    raft.prs()
        .iter()
        .map(|(_, progress)| progress.matched)
        .min()
        .unwrap_or(0)
}

fn push_committed(committed: &mut IdMap<Vec<Entry>>, group: GroupId, entries: Vec<Entry>) {
    if !entries.is_empty() {
        committed.entry(group).or_default().extend(entries);
    }
}
