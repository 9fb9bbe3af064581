//! The apply stage: committed entries are applied here, off the raft loop, and each waiting
//! caller is answered with its own result.
//!
//! An apply thread takes everything queued for it at once (bounded), runs each group's state
//! machine over that group's entries in the group's own transaction, and commits all the
//! groups together with one `StateStore::commit_groups` — one backend commit per round however
//! many groups it served, as the log side has one sync per round. A small round that finds the
//! apply thread with nothing to do is applied by the raft worker itself (`ApplyStage`).

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use concord_storage::raft::prelude::{Entry, EntryType};
use concord_storage::{GroupCommit, GroupId, StateStore, StateTransaction};
use parking_lot::Mutex;

use crate::apply_callers::{ApplyCallers, CommittedProposal, LockedCallers, RoundCallers};
use crate::command_batch::EntryKind;
use crate::id_map::IdMap;
use crate::idle_spin::{IdleSpell, IdleSpin};
use crate::install_thread::{InstallJob, InstallReport, InstallTarget, Installer};
use crate::metrics::ApplyMetrics;
use crate::node_loop::install_marks::InstallMarks;
use crate::node_loop::snapshot_install::{self, FetchedState};
use crate::state_flusher::StateFlusher;
use crate::status::SharedGroupStatus;
use crate::transport::Transport;
use crate::{ApplyError, CommandResult, ProposeError, StateMachine, StateMachineFactory};

/// Apply messages taken in one round at most (bounds the work between two commits).
const MAX_MESSAGES_PER_ROUND: usize = 256;

/// Most writes a group's transaction is sized for before it stages any.
const MAX_PRESIZED_WRITES: usize = 16 * 1024;

/// Work for an apply thread.
pub(crate) enum ApplyMessage {
    /// The entries one raft round committed, per group, and the callers of this node's
    /// proposals among them (`None` if there are none).
    Apply {
        groups: Vec<CommittedEntries>,
        callers: Option<Arc<ApplyCallers>>,
    },
    /// Install the state fetched into `path` as `group`'s (see `snapshot_install.rs`).
    InstallSnapshot {
        group: GroupId,
        path: std::path::PathBuf,
        min_index: u64,
    },
    /// Flush the state store and stop.
    Shutdown,
}

/// Committed entries of one group, in order, and this node's proposals among them.
pub(crate) struct CommittedEntries {
    pub(crate) group: GroupId,
    pub(crate) entries: Vec<Entry>,
    pub(crate) proposals: Vec<CommittedProposal>,
}

/// Told the groups whose applied index an apply round moved.
pub(crate) type AppliedCallback = Box<dyn Fn(&[GroupId]) + Send>;

/// What an apply thread needs.
pub(crate) struct Applier {
    pub(crate) store: Arc<dyn StateStore>,
    pub(crate) factory: Arc<dyn StateMachineFactory>,
    pub(crate) statuses: IdMap<Arc<SharedGroupStatus>>,
    /// Called after each round with the groups whose applied index moved, to let the raft
    /// worker advance them and serve their reads.
    pub(crate) on_applied: AppliedCallback,
    /// Tells the raft worker how a snapshot install went (and that the group's applied index
    /// moved); called on the install thread.
    pub(crate) on_installed: InstallReport,
    /// The name of the thread that installs snapshots (`concord-install-{node}-{index}`).
    pub(crate) installer_name: String,
    /// Makes the state durable every `flush_interval` (sooner when the store wants it) on a
    /// thread of its own.
    pub(crate) flusher: StateFlusher,
    pub(crate) flush_interval: Duration,
    /// The store's commits are as durable as they get (`StateStore::commits_are_durable`):
    /// each round publishes its applied indexes as durable, not the flusher.
    pub(crate) commits_are_durable: bool,
    /// Set when a round applies an admin entry, until the round tells the network (read and
    /// set only by the holder of the stage's lock).
    pub(crate) admin_entry_applied: Cell<bool>,
    /// The node's network, told when this node applied an admin entry (`None`: no network).
    pub(crate) transport: Option<Arc<dyn Transport>>,
    /// Where an install marks that it is about to replace a group's state (`install_marks.rs`).
    pub(crate) install_marks: Arc<InstallMarks>,
}

/// One group's work in a round: its entries and proposals, merged from every message.
#[derive(Default)]
struct GroupWork {
    entries: Vec<Entry>,
    proposals: Vec<CommittedProposal>,
}

/// One group's outcome before the round's commit.
struct Applied {
    group: GroupId,
    last_index: u64,
    entry_count: usize,
    answers: Vec<Answer>,
    proposals: Vec<CommittedProposal>,
}

/// The results of the commands of one proposed entry: `(position in proposals, results)`.
type Answer = (usize, Vec<CommandResult>);

/// One worker's apply stage: the applier and what it keeps between rounds, behind a lock.
/// The apply thread takes the lock for every round it applies; the worker takes it to apply a
/// small round itself when the apply thread has nothing queued and nothing in hand
/// ([`ApplyStage::try_apply_here`]), which spares the round's callers the hand-off to another
/// thread and that thread's wake-up.
pub(crate) struct ApplyStage {
    state: Mutex<ApplyState>,
    /// Messages the apply thread took from its queue and finished, counted under the lock:
    /// when it equals the messages the worker sent, nothing the worker handed over waits, and
    /// a round applied by the worker comes after all of them.
    finished_messages: AtomicU64,
    /// The longest the apply thread watches for work before it parks.
    idle_spin: Duration,
    flush_interval: Duration,
}

/// What the apply stage keeps between rounds.
struct ApplyState {
    applier: Applier,
    machines: IdMap<Box<dyn StateMachine>>,
    /// The stage is the only writer of its groups' state: it remembers their applied indexes
    /// instead of reading them back from the store every round. A group whose snapshot is
    /// being installed (by the install's thread) is left out until its next apply reads the
    /// store again.
    applied: IdMap<u64>,
    /// The thread that installs fetched snapshots, started at the first one.
    installer: Option<Installer>,
    /// The decoded commands of one entry, reused for every entry.
    commands: Vec<Bytes>,
    metrics: ApplyMetrics,
    last_flush: Instant,
    unflushed: bool,
}

/// Commands a round may carry for the worker to apply it itself: the worker's next round waits
/// for the apply, so only a round whose apply is short is taken off the apply thread.
const APPLY_HERE_MAX_COMMANDS: usize = 16;

/// Whether a round is small enough for the worker to apply it itself: a few commands, none an
/// admin's (an admin entry may do anything a machine allows: an upgrade loads a module).
pub(crate) fn is_small_round(groups: &[CommittedEntries]) -> bool {
    let mut commands = 0;
    for entry in groups.iter().flat_map(|g| g.entries.iter()) {
        commands += crate::command_batch::command_count(&entry.data);
        // A round of thousands of groups is found large at its first entries, not its last.
        if commands > APPLY_HERE_MAX_COMMANDS || crate::command_batch::is_admin(&entry.data) {
            return false;
        }
    }
    true
}

impl ApplyStage {
    /// The stage of `applier`, whose thread watches for work for up to `idle_spin` before it
    /// parks (`NodeConfig::idle_spin`).
    pub(crate) fn new(applier: Applier, idle_spin: Duration) -> Self {
        let flush_interval = applier.flush_interval;
        ApplyStage {
            state: Mutex::new(ApplyState {
                applier,
                machines: IdMap::default(),
                applied: IdMap::default(),
                installer: None,
                commands: Vec::new(),
                metrics: ApplyMetrics::new(),
                last_flush: Instant::now(),
                unflushed: false,
            }),
            finished_messages: AtomicU64::new(0),
            idle_spin,
            flush_interval,
        }
    }

    /// The apply thread: runs until `Shutdown` or until the sending side is gone.
    pub(crate) fn run(&self, inbox: Receiver<ApplyMessage>) {
        let mut idle_spin = IdleSpin::new(self.idle_spin);
        let mut shutting_down = false;
        while !shutting_down {
            match receive(&inbox, self.flush_interval, &mut idle_spin) {
                Ok(first) => {
                    let mut state = self.state.lock();
                    let (taken, shutdown) =
                        state.apply_queued(first, &mut || inbox.try_recv().ok());
                    shutting_down = shutdown;
                    self.finished_messages.fetch_add(taken, Ordering::Release);
                }
                Err(RecvTimeoutError::Timeout) => self.state.lock().start_flush_if_unflushed(),
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        let mut state = self.state.lock();
        // An install still running writes to the store: the last flush comes after it. Those
        // waiting behind it are not begun (see `Installer`).
        if let Some(installer) = state.installer.take() {
            installer.stop();
        }
        let ApplyState {
            applier, applied, ..
        } = &mut *state;
        applier.flusher.finish(applied);
    }

    /// Applies `message` on the calling thread (the worker) if its groups' machines apply
    /// quickly (`StateMachine::applies_quickly`) and the apply thread has finished all `sent`
    /// messages the worker gave it and is not in a round; otherwise hands `message` back, for
    /// the apply thread. The worker asks only for a small round ([`is_small_round`]).
    pub(crate) fn try_apply_here(
        &self,
        message: ApplyMessage,
        sent: u64,
    ) -> Result<(), ApplyMessage> {
        let ApplyMessage::Apply { groups, .. } = &message else {
            return Err(message);
        };
        if self.finished_messages.load(Ordering::Acquire) != sent {
            return Err(message);
        }
        let Some(mut state) = self.state.try_lock() else {
            return Err(message);
        };
        // Checked again under the lock: the apply thread counts what it finished before it
        // lets go of it. A group whose machine is not made yet goes to the apply thread too:
        // making one may load a plugin.
        let quick = |group: &CommittedEntries| {
            (state.machines.get(&group.group)).is_some_and(|machine| machine.applies_quickly())
        };
        if self.finished_messages.load(Ordering::Acquire) != sent || !groups.iter().all(quick) {
            return Err(message);
        }
        state.apply_queued(message, &mut || None);
        Ok(())
    }
}

impl ApplyState {
    /// Applies `first` and whatever `more` gives after it (bounded) as one round; returns how
    /// many messages it took and whether one of them was `Shutdown`.
    fn apply_queued(
        &mut self,
        first: ApplyMessage,
        more: &mut dyn FnMut() -> Option<ApplyMessage>,
    ) -> (u64, bool) {
        // Merge everything queued, per group, in arrival order; an install ends the round
        // (what came before it applies first).
        let mut round: BTreeMap<GroupId, GroupWork> = BTreeMap::new();
        let mut callers = RoundCallers::default();
        let mut install = None;
        let mut shutting_down = false;
        let mut next = Some(first);
        let mut taken = 0;
        while let Some(message) = next.take() {
            taken += 1;
            match message {
                ApplyMessage::Apply {
                    mut groups,
                    callers: message_callers,
                } => {
                    let proposals = groups.iter_mut().flat_map(|g| g.proposals.iter_mut());
                    callers.add(message_callers, proposals);
                    for committed in groups {
                        let work = round.entry(committed.group).or_default();
                        if work.entries.is_empty() {
                            work.entries = committed.entries;
                            work.proposals = committed.proposals;
                        } else {
                            work.entries.extend(committed.entries);
                            work.proposals.extend(committed.proposals);
                        }
                    }
                }
                ApplyMessage::InstallSnapshot {
                    group,
                    path,
                    min_index,
                } => install = Some((group, path, min_index)),
                ApplyMessage::Shutdown => shutting_down = true,
            }
            if taken < MAX_MESSAGES_PER_ROUND as u64 && !shutting_down && install.is_none() {
                next = more();
            }
        }
        let applier = &self.applier;
        if !round.is_empty() {
            applier.apply_round(
                &mut self.machines,
                &mut self.applied,
                &mut self.commands,
                &self.metrics,
                &callers,
                round,
            );
            self.unflushed = true;
        } else {
            // Messages were taken all the same: a worker waiting for room hears of it.
            (applier.on_applied)(&[]);
        }
        callers.release();
        if let Some((group, path, min_index)) = install {
            self.start_install(group, path, min_index);
        }
        // Every interval, or sooner when the store holds much in memory (a flush started on
        // the flusher's thread now spares the commits a flush of their own later).
        if self.unflushed
            && (self.last_flush.elapsed() >= self.applier.flush_interval
                || self.applier.store.wants_flush())
        {
            self.start_flush_if_unflushed();
        }
        (taken, shutting_down)
    }

    /// Installs the state fetched into `path` as `group`'s on the stage's install thread (see
    /// `install_thread.rs` and `snapshot_install.rs`), so that the other groups' rounds go on meanwhile: a large
    /// state takes a while to write. The group itself has nothing to apply until the raft
    /// worker hears the install is done — its replica holds the `Ready` that carries the
    /// snapshot until then — so nothing else writes to it meanwhile.
    fn start_install(&mut self, group: GroupId, path: std::path::PathBuf, min_index: u64) {
        let applier = &self.applier;
        let Some(status) = applier.statuses.get(&group).cloned() else {
            let failed = snapshot_install::abandon(&path, format!("no group {group} here"));
            return (applier.on_installed)(group, failed);
        };
        let current = match self.applied.get(&group) {
            Some(&index) => Ok(index),
            None => applier.store.applied_index(group),
        };
        // The machine may cache what the old state held; the store says where the group is
        // once the install is done.
        self.machines.remove(&group);
        self.applied.remove(&group);
        let applied = match current {
            Ok(applied) => applied,
            Err(error) => {
                let failed = snapshot_install::abandon(
                    &path,
                    format!("installing: reading the applied index: {error}"),
                );
                return (applier.on_installed)(group, failed);
            }
        };
        let job = InstallJob {
            state: FetchedState {
                group,
                path,
                min_index,
                applied,
            },
            status,
        };
        let queued = match self.installer() {
            Ok(installer) => installer
                .send(job)
                .map_err(|job| (job, "the install thread stopped".to_string())),
            Err(error) => Err((job, format!("cannot start the install thread: {error}"))),
        };
        if let Err((job, reason)) = queued {
            let failed = snapshot_install::abandon(&job.state.path, reason);
            (self.applier.on_installed)(group, failed);
        }
    }

    /// The stage's install thread, started at its first install.
    fn installer(&mut self) -> std::io::Result<&Installer> {
        if self.installer.is_none() {
            let target = InstallTarget {
                store: self.applier.store.clone(),
                marks: self.applier.install_marks.clone(),
                report: self.applier.on_installed.clone(),
            };
            self.installer = Some(Installer::spawn(
                self.applier.installer_name.clone(),
                target,
            )?);
        }
        Ok(self.installer.as_ref().expect("started above"))
    }

    /// Starts a flush of what was applied since the last one, unless one is running.
    fn start_flush_if_unflushed(&mut self) {
        if self.unflushed && self.applier.flusher.try_start(&self.applied) {
            self.unflushed = false;
            self.last_flush = Instant::now();
        }
    }
}

impl Applier {
    /// Applies every group of the round, commits them together, then answers.
    fn apply_round(
        &self,
        machines: &mut IdMap<Box<dyn StateMachine>>,
        applied_indexes: &mut IdMap<u64>,
        commands: &mut Vec<Bytes>,
        metrics: &ApplyMetrics,
        callers: &RoundCallers,
        round: BTreeMap<GroupId, GroupWork>,
    ) {
        let started = Instant::now();
        let mut commits = Vec::with_capacity(round.len());
        let mut applied = Vec::with_capacity(round.len());
        for (group, work) in round {
            let Some(status) = self.statuses.get(&group) else {
                continue;
            };
            let GroupWork { entries, proposals } = work;
            if status.stopped_reason().is_some() {
                finish_unapplied(status, group, &proposals, callers);
                continue;
            }
            let applied_index = match applied_indexes.get(&group) {
                Some(&index) => Ok(index),
                None => self.store.applied_index(group),
            };
            if let Ok(index) = applied_index {
                answer_covered_by_snapshot(group, index, &proposals, callers);
            }
            let outcome = applied_index.map_err(ApplyError::from).and_then(|index| {
                self.apply_group(machines, commands, group, index, &entries, &proposals)
            });
            match outcome {
                Ok(Some((commit, answers))) => {
                    applied.push(Applied {
                        group,
                        last_index: commit.applied_index,
                        entry_count: entries.len(),
                        answers,
                        proposals,
                    });
                    commits.push(commit);
                }
                Ok(None) => finish_unapplied(status, group, &proposals, callers),
                Err(error) => {
                    status.stop(format!("apply failed: {error}"));
                    machines.remove(&group);
                    applied_indexes.remove(&group);
                    finish_unapplied(status, group, &proposals, callers);
                }
            }
        }
        if commits.is_empty() {
            (self.on_applied)(&[]);
            return;
        }
        if let Err(error) = self.store.commit_groups(commits) {
            // Nothing of the round was recorded; the store cannot be trusted.
            let mut locked = callers.lock();
            for outcome in &applied {
                let status = &self.statuses[&outcome.group];
                status.stop(format!("state store commit failed: {error}"));
                machines.remove(&outcome.group);
                applied_indexes.remove(&outcome.group);
                finish(status, outcome.group, &outcome.proposals, &mut locked);
            }
            drop(locked);
            (self.on_applied)(&[]);
            return;
        }
        metrics
            .apply_batch_duration
            .record(started.elapsed().as_secs_f64());
        let entry_count: usize = applied.iter().map(|outcome| outcome.entry_count).sum();
        metrics.apply_batch_entries.record(entry_count as f64);
        let applied_groups: Vec<GroupId> = applied.iter().map(|outcome| outcome.group).collect();
        // Before anyone hears of the admin entry's result: from then on the network takes no
        // peer of a version that would misread one.
        if self.admin_entry_applied.take()
            && let Some(transport) = &self.transport
        {
            transport.require_wire_version(crate::transport::ADMIN_ENTRIES_WIRE_VERSION);
        }
        let mut locked = callers.lock();
        for outcome in applied {
            let status = &self.statuses[&outcome.group];
            // Published before anyone is answered: a caller that saw its result and then
            // reads the status sees its write applied.
            applied_indexes.insert(outcome.group, outcome.last_index);
            status.set_applied(outcome.last_index);
            if self.commits_are_durable {
                status
                    .durable_applied_index
                    .fetch_max(outcome.last_index, Ordering::AcqRel);
            }
            answer(
                &metrics.write_duration,
                &outcome.proposals,
                outcome.answers,
                &mut locked,
            );
            finish(status, outcome.group, &outcome.proposals, &mut locked);
        }
        drop(locked);
        (self.on_applied)(&applied_groups);
    }

    /// Runs `group`'s state machine over `entries` in a transaction of its own. Returns the
    /// commit to make and the results for the proposals the entries carry, or `None` if every
    /// entry was applied before.
    fn apply_group(
        &self,
        machines: &mut IdMap<Box<dyn StateMachine>>,
        commands: &mut Vec<Bytes>,
        group: GroupId,
        applied: u64,
        entries: &[Entry],
        proposals: &[CommittedProposal],
    ) -> Result<Option<(GroupCommit, Vec<Answer>)>, ApplyError> {
        let Some(last_index) = entries
            .last()
            .map(|e| e.index)
            .filter(|&last| last > applied)
        else {
            return Ok(None);
        };
        let fresh = entries.iter().filter(|e| e.index > applied);
        let machine = match machines.entry(group) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                entry.insert(self.factory.create(group)?)
            }
        };
        // Room for a write per command up front: a transaction's map regrown from empty cost
        // more than its writes when thousands of groups each apply a few commands a round.
        // Capped: the counts come from entries, and a hint must not allocate for a lie.
        let expected_writes = fresh
            .clone()
            .map(|e| crate::command_batch::command_count(&e.data))
            .sum::<usize>()
            .min(MAX_PRESIZED_WRITES);
        let mut txn = StateTransaction::with_capacity(self.store.as_ref(), group, expected_writes);
        let mut answers: Vec<Answer> = Vec::new();
        for entry in fresh {
            if entry.get_entry_type() != EntryType::EntryNormal || entry.data.is_empty() {
                continue; // A new leader's empty entry, or a conf change (no membership yet).
            }
            let results = match crate::command_batch::decode_into(&entry.data, commands) {
                Ok(EntryKind::Admin) => {
                    self.admin_entry_applied.set(true);
                    vec![machine.apply_admin(&mut txn, &commands[0])?]
                }
                Ok(EntryKind::Client) => {
                    let results = machine.apply(&mut txn, commands)?;
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
        // Let go of the last entry's bytes now rather than at the next entry.
        commands.clear();
        let commit = GroupCommit {
            group,
            writes: txn.into_writes(),
            applied_index: last_index,
        };
        Ok(Some((commit, answers)))
    }
}

/// Sends each command's result to its caller, recording its `write_duration`.
fn answer(
    write_duration: &metrics::Histogram,
    proposals: &[CommittedProposal],
    answers: Vec<Answer>,
    callers: &mut LockedCallers<'_>,
) {
    let now = Instant::now();
    for (position, results) in answers {
        let mut results = results.into_iter();
        for responder in callers.of(&proposals[position]) {
            let result = match results.next() {
                Some(Ok(bytes)) => Ok(bytes),
                Some(Err(error)) => Err(ProposeError::Command(error)),
                None => Err(ProposeError::Command(crate::CommandError::new(
                    0,
                    "the entry carrying this command was malformed",
                ))),
            };
            let latency = now.duration_since(responder.enqueued_at);
            write_duration.record(latency.as_secs_f64());
            responder.answer(result);
        }
    }
}

/// Answers the proposals whose entries the state has applied already: only a snapshot
/// installed over them moves the applied index past an entry this node did not apply, and
/// their results are not known here.
fn answer_covered_by_snapshot(
    group: GroupId,
    applied: u64,
    proposals: &[CommittedProposal],
    callers: &RoundCallers,
) {
    let mut covered = proposals.iter().filter(|p| p.index <= applied).peekable();
    if covered.peek().is_none() {
        return;
    }
    let mut locked = callers.lock();
    for proposal in covered {
        for responder in locked.of(proposal) {
            responder.answer(Err(ProposeError::ResultUnknown { group }));
        }
    }
}

/// [`finish`] for a group the round did not apply (stopped, nothing new, failed): the round's
/// callers are locked only if the group has proposals to answer.
fn finish_unapplied(
    status: &SharedGroupStatus,
    group: GroupId,
    proposals: &[CommittedProposal],
    callers: &RoundCallers,
) {
    if !proposals.is_empty() {
        finish(status, group, proposals, &mut callers.lock());
    }
}

/// Answers every proposal still unanswered: its entry was replaced by a new leader's
/// (`Dropped`), or the group stopped.
fn finish(
    status: &SharedGroupStatus,
    group: GroupId,
    proposals: &[CommittedProposal],
    callers: &mut LockedCallers<'_>,
) {
    if proposals.is_empty() {
        return;
    }
    let failure = match status.stopped_reason() {
        Some(reason) => ProposeError::Stopped { group, reason },
        None => ProposeError::Dropped { group },
    };
    for proposal in proposals {
        for responder in callers.of(proposal) {
            if !responder.is_answered() {
                responder.answer(Err(failure.clone()));
            }
        }
    }
}

/// Receives the next message: yields the CPU while watching the channel for as long as `spin`
/// says, then blocks for up to `timeout`; `spin` learns from how soon the message came.
fn receive(
    inbox: &Receiver<ApplyMessage>,
    timeout: Duration,
    spin: &mut IdleSpin,
) -> Result<ApplyMessage, RecvTimeoutError> {
    if let Some(taken) = take_waiting(inbox) {
        return taken;
    }
    let mut spell = spin.begin(Instant::now() + timeout);
    let received = watch_then_block(inbox, timeout, &mut spell);
    spin.end(&spell, received.is_ok());
    received
}

fn watch_then_block(
    inbox: &Receiver<ApplyMessage>,
    timeout: Duration,
    spell: &mut IdleSpell,
) -> Result<ApplyMessage, RecvTimeoutError> {
    while spell.keep_watching() {
        std::thread::yield_now();
        if let Some(taken) = take_waiting(inbox) {
            return taken;
        }
    }
    inbox.recv_timeout(timeout)
}

/// The message waiting in the channel, or its end; `None` while it is empty.
fn take_waiting(inbox: &Receiver<ApplyMessage>) -> Option<Result<ApplyMessage, RecvTimeoutError>> {
    match inbox.try_recv() {
        Ok(message) => Some(Ok(message)),
        Err(TryRecvError::Disconnected) => Some(Err(RecvTimeoutError::Disconnected)),
        Err(TryRecvError::Empty) => None,
    }
}
