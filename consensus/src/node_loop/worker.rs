//! The worker thread: the one poll loop over the groups it owns, for raft and solo alike.
//!
//! A round looks at the groups that are *active* — those that got something since the last
//! round (a message, a proposal, a read, an applied index, a tick) or still had work after it
//! — and leaves the others alone. Each round:
//! 1. take the inbox: step peer messages, note which queues to drain, start reads;
//! 2. drain each group's proposal queue into **one** entry per group;
//! 3. tick the clocks when due, and choose the logs to compact;
//! 4. collect what every group has ready: messages that may leave before the write are sent
//!    at once when the log syncs (a leader replicates while it persists), new entries, hard
//!    states and compactions of every group go into **one** `LogBatch`;
//! 5. write that batch — **one sync** for all groups;
//! 6. finish each group after the write: send the messages that had to wait for it (a
//!    follower acknowledges only what it has), then hand committed entries to the apply
//!    thread (never applied on this thread);
//! 7. tell the replicas what the apply thread applied, and serve reads that waited for it;
//! 8. answer everything that waited longer than the proposal timeout.
//!
//! What steps 3 and 8 do — the work on the clock — is `worker/periodic.rs`; where the
//! leaderships go (the balance on the clock, the hand-overs), `worker/leaderships.rs`; which
//! peers the network forgets, `worker/peer_forgetting.rs`.

mod leaderships;
mod peer_forgetting;
mod periodic;

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use concord_storage::raft::prelude::Entry;
use concord_storage::{GroupId, LogStore, Stores};

use super::NodeShared;
use super::event_lines::{ConfigChanges, EventLine, LeadershipChanges, LinePace, SnapshotCounts};
use super::group::Group;
use super::install_marks::InstallMarks;
use super::peer_reading::PeerReading;
use super::position_set::PositionSet;
use super::proposal_wave::ProposalWave;
use super::replica::{Outbox, Proposed, Replica, Round, StepOutcome};
use super::returning_peers::ReturningPeers;
use super::sleepers::Sleepers;
use super::snapshot_install::{self, SnapshotFiles};
use crate::apply::{Applier, ApplyMessage, ApplyStage, CommittedEntries};
use crate::apply_callers::{CallersBuilder, InApply, ProposedEntry};
use crate::id_map::IdMap;
use crate::idle_spin::IdleSpin;
use crate::mailbox::{Inbox, Mailbox};
use crate::mailbox::{SnapshotEvent, SnapshotFailure};
use crate::proposal_queue::{CommandKind, QueuedCommand};
use crate::state_flusher::StateFlusher;
use crate::status::{SharedGroupStatus, stop_groups};
use crate::transport::{GroupMessage, Transport};
use crate::{StartError, StateMachineFactory};
use peer_forgetting::StartedPeers;

/// How often waiting proposals and reads are checked against the timeout.
const TIMEOUT_SCAN_INTERVAL: Duration = Duration::from_millis(50);

/// At most one line per this long about groups still waiting for the others' answers: they
/// wait as long as the members named stay silent, and a line a second would fill the log.
const CATCH_UP_LINE_INTERVAL: Duration = Duration::from_secs(10);

/// The longest a proposal wave holds the worker's other groups back (`proposal_wave.rs`): a
/// tick, but no more than this when ticks are long, so that one group's slow quorum does not
/// hold every other group's writes for a long tick.
const WAVE_LIMIT_MAX: Duration = Duration::from_millis(100);

/// What a worker thread needs besides its groups.
pub(super) struct WorkerParts {
    pub(crate) index: usize,
    pub(crate) shared: Arc<NodeShared>,
    pub(crate) stores: Stores,
    pub(crate) factory: Arc<dyn StateMachineFactory>,
    /// Where messages to peers go; `None` for a node without peers.
    pub(crate) transport: Option<Arc<dyn Transport>>,
    /// Where fetched snapshots wait for their install.
    pub(crate) snapshot_files: Arc<SnapshotFiles>,
    /// The marks of installs whose snapshot the log has not recorded yet.
    pub(crate) install_marks: Arc<InstallMarks>,
    /// Names the worker thread `concord-{kind}-{node}-{index}` (its apply thread is
    /// `concord-apply-{node}-{index}`).
    pub(crate) kind: &'static str,
}

/// Starts the worker thread over `groups` and its apply thread; returns both handles.
pub(super) fn spawn<R: Replica>(
    parts: WorkerParts,
    groups: Vec<Group<R>>,
) -> Result<Vec<JoinHandle<()>>, StartError> {
    let WorkerParts {
        index,
        shared,
        stores,
        factory,
        transport,
        snapshot_files,
        install_marks,
        kind,
    } = parts;
    let config = &shared.config;
    let node = config.node_id;
    let mailbox = shared.entrance.mailboxes[index].clone();
    let wake = mailbox.clone();
    let installs = mailbox.clone();
    let statuses: IdMap<_> = groups
        .iter()
        .map(|g| (g.state.id, g.state.status.clone()))
        .collect();
    let flusher = StateFlusher::spawn(
        format!("concord-flush-{node}-{index}"),
        stores.state.clone(),
        statuses.clone(),
    )
    .map_err(StartError::Thread)?;
    let applier = Applier {
        store: stores.state.clone(),
        factory,
        statuses,
        flusher,
        on_applied: Box::new(move |groups| wake.applied(groups)),
        on_installed: Arc::new(move |group, event| {
            snapshot_install::report(&installs, group, event);
            installs.applied(&[group]);
        }),
        installer_name: format!("concord-install-{node}-{index}"),
        flush_interval: config.state_flush_interval,
        commits_are_durable: stores.state.commits_are_durable(),
        admin_entry_applied: std::cell::Cell::new(false),
        transport: transport.clone(),
        install_marks: install_marks.clone(),
    };
    let (apply_tx, apply_rx) = sync_channel(config.apply_queue_capacity);
    let apply_stage = Arc::new(ApplyStage::new(applier, config.idle_spin));
    let thread_stage = apply_stage.clone();
    let apply_thread = std::thread::Builder::new()
        .name(format!("concord-apply-{node}-{index}"))
        .spawn(move || thread_stage.run(apply_rx))
        .map_err(StartError::Thread)?;
    for group in &groups {
        group
            .state
            .status
            .set_members(group.state.id, group.replica.members(), node);
        publish_catching_up(&group.state.status, &group.replica);
    }
    let positions = groups
        .iter()
        .enumerate()
        .map(|(i, g)| (g.state.id, i))
        .collect();
    let send_before_write = stores.log.sync_mode().is_sync();
    let groups_may_sleep = config.sleep_after_ticks > 0
        && transport
            .as_ref()
            .is_some_and(|t| t.silent_for(node).is_some());
    let group_count = groups.len();
    // The first worker checks which of the peers the node starts knowing its groups name.
    let started_peers = match &transport {
        Some(transport) if index == 0 => transport.known_peers(),
        _ => Vec::new(),
    };
    let worker = Worker {
        send_before_write,
        snapshot_files,
        install_marks,
        mailbox: mailbox.clone(),
        index,
        shared: shared.clone(),
        log: stores.log,
        transport,
        groups,
        positions,
        apply_tx,
        apply_stage,
        apply_messages_sent: 0,
        next_read_id: super::forward_tag::first_forward_id(),
        pending_compactions: Vec::new(),
        next_timeout_scan: Instant::now() + TIMEOUT_SCAN_INTERVAL,
        next_balance: config
            .leader_balance_interval
            .map(|every| Instant::now() + every),
        handing_over: false,
        apply_backlog: VecDeque::new(),
        in_apply: InApply::default(),
        log_batch: concord_storage::LogBatch::new(),
        drained: Vec::new(),
        collected: Vec::new(),
        last_committing_groups: 0,
        active: PositionSet::full(group_count),
        may_wait: PositionSet::full(group_count),
        wave: ProposalWave::new(group_count, config.tick_interval.min(WAVE_LIMIT_MAX)),
        commit_owed: PositionSet::empty(group_count),
        commit_news_due: Instant::now(),
        installing: PositionSet::empty(group_count),
        fetch_due: false,
        sleepers_to_compact: PositionSet::empty(group_count),
        groups_may_sleep,
        ticks: 0,
        sleepers: Sleepers::all_awake(group_count),
        returning_peers: ReturningPeers::new(node, config.voters.iter().copied()),
        tick_positions: Vec::new(),
        peers: PeerReading::off(),
        leadership_line: EventLine::new(),
        snapshot_line: EventLine::new(),
        config_line: EventLine::new(),
        catch_up_line: LinePace::with_interval(CATCH_UP_LINE_INTERVAL),
        started_peers: StartedPeers::new(started_peers, Instant::now()),
    };
    // One worker of a node with a network reads the peers' connections; its poll exists
    // before the node does, so that the first connection offered is taken.
    let mut worker = worker;
    if index == 0 && worker.transport.is_some() {
        match PeerReading::start() {
            Ok((peers, waker)) => {
                worker.peers = peers;
                mailbox.set_waker(waker);
            }
            Err(error) => {
                tracing::warn!(%error, "cannot poll peer connections: the network reads them");
            }
        }
    }
    let worker_thread = std::thread::Builder::new()
        .name(format!("concord-{kind}-{node}-{index}"))
        .spawn(move || {
            let _ = mailbox.thread.set(std::thread::current());
            worker.run(&mailbox);
        })
        .map_err(StartError::Thread)?;
    Ok(vec![worker_thread, apply_thread])
}

/// What a panic said, if it said it in text.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

/// Publishes whether the group's replica is catching up (its callers do so when it changed): a
/// readiness probe must not take a member that refuses votes for one that could replace a
/// lost one.
fn publish_catching_up<R: Replica>(status: &SharedGroupStatus, replica: &R) {
    status
        .catching_up
        .store(replica.is_catching_up(), Ordering::Release);
}

/// Publishes how far each voter's log matches while the group's replica leads (cleared once
/// when it no longer does), for `GroupStatus::voters`.
fn publish_voters<R: Replica>(group: &mut Group<R>) {
    let voters = group.replica.voter_progress();
    if voters.is_empty() && !group.state.voters_published {
        return;
    }
    group.state.voters_published = !voters.is_empty();
    group.state.status.set_voters(voters);
}

struct Worker<R: Replica> {
    index: usize,
    /// This worker's own mailbox (snapshot fetch threads report into it).
    mailbox: Arc<Mailbox>,
    snapshot_files: Arc<SnapshotFiles>,
    /// Marks removed here once the log holds their snapshot (`install_marks.rs`).
    install_marks: Arc<InstallMarks>,
    shared: Arc<NodeShared>,
    log: Arc<dyn LogStore>,
    transport: Option<Arc<dyn Transport>>,
    groups: Vec<Group<R>>,
    positions: IdMap<usize>,
    apply_tx: SyncSender<ApplyMessage>,
    /// The apply stage the apply thread serves, which this worker may apply a small round in.
    apply_stage: Arc<ApplyStage>,
    /// Messages put into `apply_tx` so far.
    apply_messages_sent: u64,
    next_read_id: u64,
    /// `(position in groups, compact index)` to write with the next log batch.
    pending_compactions: Vec<(usize, u64)>,
    next_timeout_scan: Instant,
    /// When leaderships are next weighed (`None`: never).
    next_balance: Option<Instant>,
    /// The node is about to stop: every leadership goes to another voter.
    handing_over: bool,
    /// Committed entries the apply thread had no room for yet, oldest first. While any wait,
    /// no new entries are proposed; past `apply_queue_capacity` of them, nothing more is
    /// persisted either (backpressure), but the loop goes on answering reads and timeouts.
    apply_backlog: VecDeque<ApplyMessage>,
    /// The callers of the messages handed to the apply thread (or waiting for it), answered
    /// `Timeout` here if apply takes too long.
    in_apply: InApply,
    /// Sending before the write buys time only while the write waits for the disk; a log
    /// that does not sync writes about as fast as it sends, and one send per peer and round
    /// (one wake-up of each peer) is then the cheaper order.
    send_before_write: bool,
    /// The log batch of every round, emptied by each write: its allocation, sized by the
    /// busiest round, is made once rather than grown again every round.
    log_batch: concord_storage::LogBatch,
    /// The commands taken from a group's queue for one entry, emptied for each: its
    /// allocation, sized by the largest entry, is made once rather than grown every round.
    drained: Vec<QueuedCommand>,
    /// What the round's replicas collected before the write, by group position: emptied every
    /// round, its allocation kept (thousands of groups fill it every round).
    collected: Vec<(usize, R::Collected)>,
    /// Groups that committed entries in the last round: the next round's map of committed
    /// entries starts that large rather than growing group by group.
    last_committing_groups: usize,
    /// Positions of the groups a round looks at: those that got something (a message, a
    /// proposal, a read, an applied index, a tick) and those that still had work after the
    /// last round. A round does not touch the others: they have nothing to do.
    active: PositionSet,
    /// Positions of the groups a caller may wait on: those made active since the last timeout
    /// scan (callers join a group only while it is active) and those a caller waited on at
    /// that scan. The scan looks at these only, not at every group of a large node.
    may_wait: PositionSet,
    /// The groups that proposed since the wave began: while one of them has as many entries
    /// on their way to commit as it may, no group proposes (`proposal_wave.rs`).
    wave: ProposalWave,
    /// Positions of the groups whose followers are owed a new commit index
    /// (`Replica::commit_news_due`), told when it is due unless an append carried it.
    commit_owed: PositionSet,
    /// The earliest of their `Replica::commit_news_due`.
    commit_news_due: Instant,
    /// Positions of the groups installing a snapshot: the snapshot scan (every tick, and at
    /// the end of a round with `fetch_due`) looks at these only.
    installing: PositionSet,
    /// A fetch slot freed or a group began installing this round: fetches are started at the
    /// end of the round, not only at the next tick (a node that lost its data fetches one
    /// snapshot per group, and a tick's worth of waiting per slot added up).
    fetch_due: bool,
    /// Positions of sleeping groups whose compaction point may still move: a group joins
    /// when it falls asleep and leaves once everything it applied is durable (then nothing it
    /// holds changes until it wakes). The compaction scan looks at these, not every sleeper.
    sleepers_to_compact: PositionSet,
    /// Groups may sleep: the node has peers over a network that reports node liveness, and
    /// `sleep_after_ticks` is not 0.
    groups_may_sleep: bool,
    /// Which groups sleep, and the leader each watches (`sleepers.rs`): a tick passes over
    /// the awake groups only.
    sleepers: Sleepers,
    /// The peers and whether each was up at the last tick: one back wakes the groups this
    /// worker leads and lets sleep, so that it learns their leader (`returning_peers.rs`).
    returning_peers: ReturningPeers,
    /// The positions a tick (and then the compaction scan) looks at, emptied by each, its
    /// allocation kept.
    tick_positions: Vec<usize>,
    /// Ticks so far.
    ticks: u64,
    /// The peer connections this worker reads, and the poll it waits in while it has them.
    peers: PeerReading,
    /// Leaderships gained and lost since the last line about them (`event_lines.rs`).
    leadership_line: EventLine<LeadershipChanges>,
    /// Snapshots installed and failed since the last line about them.
    snapshot_line: EventLine<SnapshotCounts>,
    /// Configuration changes applied since the last line about them.
    config_line: EventLine<ConfigChanges>,
    /// When the line about groups still asking the others where they stand was last written.
    catch_up_line: LinePace,
    /// On the first worker: the peers the node started knowing, until a group names each or
    /// it is forgotten, and when the peers to forget are next checked
    /// (`worker/peer_forgetting.rs`).
    started_peers: StartedPeers,
}

impl<R: Replica> Worker<R> {
    /// Runs rounds until the node shuts down. If a round panics (a store that panics rather
    /// than fail, a bug), the worker's groups stop with the reason and every caller waiting
    /// on them is answered; the state a panic left half-changed is not used again.
    fn run(mut self, mailbox: &Mailbox) {
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.run_rounds(mailbox);
        }));
        if let Err(panic) = ran {
            // raft-rs panics on a few reads it cannot go on without: the failed read is the
            // reason then, not the panic it led to.
            let reason = match self.shared.log_read_failure.get() {
                Some(error) => format!("log read failed: {error}"),
                None => format!("the raft worker failed: {}", panic_message(panic.as_ref())),
            };
            self.fail(&reason);
            self.apply_backlog.clear();
            let _ = self.apply_tx.send(ApplyMessage::Shutdown);
            return;
        }
        self.stop_all("the node is shutting down");
        // What waits for the apply thread is committed: it goes first, then the shutdown.
        for message in self.apply_backlog.drain(..) {
            let _ = self.apply_tx.send(message);
        }
        let _ = self.apply_tx.send(ApplyMessage::Shutdown);
    }

    fn run_rounds(&mut self, mailbox: &Mailbox) {
        let config = self.shared.config.clone();
        let runtime = crate::metrics::RuntimeMetrics::new(config.node_id, self.index);
        runtime.alive_tasks.increment(2.0);
        if config.voters.len() == 1 {
            // A single voter need not wait for an election timeout.
            for group in &mut self.groups {
                group.replica.campaign();
            }
        }
        // The first tick comes at a random point of the interval. Nodes started together
        // would otherwise tick in step, and two followers whose randomized election timeouts
        // drew the same number of ticks would campaign at nearly the same moment:
        // each grants the other's pre-vote, both become candidates, the vote splits, and the
        // group waits a second election timeout for a leader.
        let mut next_tick =
            Instant::now() + crate::random::random_fraction_of(config.tick_interval);
        let mut busy = Duration::ZERO;
        let mut idle_spin = IdleSpin::new(config.idle_spin);
        let mut busy_window_started = Instant::now();
        loop {
            if self.peers.is_reading() {
                self.peers.read_now();
            }
            let inbox = mailbox.take();
            if inbox.shutdown {
                break;
            }
            let round_started = Instant::now();
            let apply_has_room = self.flush_apply_backlog();
            let mut worked = self.take_inbox(inbox);
            if apply_has_room {
                worked |= self.propose_queued(round_started);
            }
            if round_started >= next_tick {
                // The balance looks before the tick: a leader's tick may check its quorum,
                // which clears raft-rs's "recently active" marks until the next heartbeat is
                // answered (one leaves in the same tick when `election_ticks` is a multiple of
                // `heartbeat_ticks`). The replicas also count a voter that answered a heartbeat
                // within the election timeout as active (`heard_lately`), which covers other
                // ticks; looking before the tick keeps the marks whole where they suffice.
                self.move_leaderships(round_started);
                self.tick_groups();
                next_tick = round_started + config.tick_interval;
                worked = true;
                self.plan_compactions();
                self.ask_reads_again();
                self.forget_peers(round_started);
                self.fetch_snapshots(round_started);
                self.write_event_lines(round_started);
            }
            if !self.commit_owed.members().is_empty() && round_started >= self.commit_news_due {
                worked |= self.tell_owed_commits(round_started);
            }
            if self.apply_backlog.len() < config.apply_queue_capacity {
                worked |= self.write_round();
            }
            if std::mem::take(&mut self.fetch_due) {
                self.fetch_snapshots(Instant::now());
            }
            let reads_waiting = self.advance_applied();
            // While the apply queue is full, this thread proposes and writes nothing, and new
            // commands joining non-empty queues do not wake it: the apply thread must, once it
            // makes room (or the queued commands would wait for the next tick or timeout scan).
            let apply_full = !self.apply_backlog.is_empty();
            mailbox.ask_wake_on_apply(reads_waiting || apply_full);
            // Room made before the ask is found here.
            if apply_full && self.flush_apply_backlog() {
                worked = true;
            }
            if round_started >= self.next_timeout_scan {
                self.answer_timeouts();
            }
            if worked {
                busy += round_started.elapsed();
            }
            if busy_window_started.elapsed() >= Duration::from_secs(1) {
                let ratio = busy.as_secs_f64() / busy_window_started.elapsed().as_secs_f64();
                runtime.busy_ratio.set(ratio);
                // Queued commands have callers, whose groups are all in `may_wait`: an idle
                // node's thousands of groups are not read for this.
                let queued: usize = (self.may_wait.members().iter())
                    .map(|&position| self.groups[position].state.queue.len())
                    .sum();
                runtime.global_queue_depth.set(queued as f64);
                busy = Duration::ZERO;
                busy_window_started = Instant::now();
            }
            let has_more = self.retire_idle_groups();
            if !worked && !has_more {
                let mut deadline = next_tick.min(self.next_timeout_scan);
                // Commands held back by a wave go out when it commits (a message wakes this
                // thread) or when it is given up, which nothing else announces.
                if let Some(wave_deadline) = self.wave.deadline()
                    && wave_deadline > Instant::now()
                {
                    deadline = deadline.min(wave_deadline);
                }
                // Groups whose news an append carried meanwhile leave the list here, so that
                // they wake nobody.
                if !self.commit_owed.members().is_empty() {
                    if self.tell_owed_commits(Instant::now()) {
                        continue;
                    }
                    if !self.commit_owed.members().is_empty() {
                        deadline = deadline.min(self.commit_news_due);
                    }
                }
                mailbox.wait(deadline, &mut idle_spin, &mut self.peers);
            }
        }
        runtime.alive_tasks.decrement(2.0);
    }

    fn group_position(&self, group: GroupId) -> Option<usize> {
        self.positions.get(&group).copied()
    }

    /// The group at `position` has something to do: the rounds look at it until it has not.
    fn activate(&mut self, position: usize) {
        self.active.insert(position);
        self.may_wait.insert(position);
    }

    /// The group's position, marked active; `None` for a group this worker does not have.
    fn activate_group(&mut self, group: GroupId) -> Option<usize> {
        let position = self.group_position(group)?;
        self.activate(position);
        Some(position)
    }

    /// Notes the group at `position` if its followers are owed a new commit index.
    fn note_commit_owed(&mut self, position: usize) {
        let Some(due) = self.groups[position].replica.commit_news_due() else {
            return;
        };
        if self.commit_owed.members().is_empty() || due < self.commit_news_due {
            self.commit_news_due = due;
        }
        self.commit_owed.insert(position);
    }

    /// Tells the followers of every group whose commit news is due (no append carried it
    /// meanwhile); the others stay noted. Returns `true` if one was told: its appends go out
    /// with this round.
    fn tell_owed_commits(&mut self, now: Instant) -> bool {
        let mut told = false;
        let mut next_due: Option<Instant> = None;
        let groups = &mut self.groups;
        let active = &mut self.active;
        self.commit_owed.retain(|position| {
            let replica = &mut groups[position].replica;
            match replica.commit_news_due() {
                None => false,
                Some(due) if due <= now => {
                    replica.tell_commit();
                    active.insert(position);
                    told = true;
                    false
                }
                Some(due) => {
                    next_due = Some(next_due.map_or(due, |next| next.min(due)));
                    true
                }
            }
        });
        if let Some(due) = next_due {
            self.commit_news_due = due;
        }
        told
    }

    /// Ends the round: keeps active only the groups that still have work (queued commands,
    /// something ready, reads waiting for apply). Returns `true` if one of them can make
    /// progress in another round right away.
    fn retire_idle_groups(&mut self) -> bool {
        // A group at its in-flight limit waits for a commit, which arrives as a message and
        // wakes this thread: it is not "more work". While the apply thread has no room, queued
        // commands are not more work either.
        let max_in_flight = self.shared.config.max_in_flight_entries;
        let apply_has_room = self.apply_backlog.is_empty();
        let wave_holds = self.wave_holds(Instant::now());
        let mut has_more = false;
        for index in 0..self.active.members().len() {
            self.note_sleep(self.active.members()[index]);
        }
        let groups = &self.groups;
        self.active.retain(|position| {
            let Group { state, replica } = &groups[position];
            let stopped = state.is_stopped();
            let ready = !stopped && replica.has_ready();
            let can_propose = state.more_queued
                && !wave_holds
                && state.in_flight() < max_in_flight
                && !replica.is_transferring()
                && !replica.is_installing();
            has_more |= apply_has_room && !stopped && (can_propose || ready);
            !stopped && (state.more_queued || ready || !state.reads_waiting_apply.is_empty())
        });
        has_more
    }

    /// Every group here that one of `peers` led before it restarted forgets that leader and
    /// wakes; one follower per group campaigns soon (`raft_node/replica/restarted_leader.rs`).
    /// A pass over every group, made only when a peer restarted.
    fn forget_restarted_leaders(&mut self, peers: &[crate::NodeId]) {
        let mut forgot = 0usize;
        for position in 0..self.groups.len() {
            let Group { state, replica } = &mut self.groups[position];
            if state.is_stopped() {
                continue;
            }
            let group = state.id;
            if peers
                .iter()
                .any(|&peer| replica.forget_restarted_leader(group, peer))
            {
                forgot += 1;
                self.activate(position);
            }
        }
        tracing::debug!(
            node = self.shared.config.node_id,
            worker = self.index,
            ?peers,
            groups = forgot,
            "forgot the leaderships of restarted peers"
        );
    }

    /// Steps peer messages, notes which queues to drain, starts reads and campaigns.
    fn take_inbox(&mut self, inbox: Inbox) -> bool {
        let worked = !inbox.messages.is_empty()
            || !inbox.member_changes.is_empty()
            || !inbox.snapshots.is_empty()
            || !inbox.proposals.is_empty()
            || !inbox.reads.is_empty()
            || !inbox.campaigns.is_empty()
            || !inbox.transfers.is_empty()
            || !inbox.restarted_peers.is_empty();
        // Before the messages: they may come from the restarted peers' new runs.
        if !inbox.restarted_peers.is_empty() {
            self.forget_restarted_leaders(&inbox.restarted_peers);
        }
        for connection in inbox.connections {
            self.peers.adopt(connection);
        }
        for group in inbox.proposals {
            if let Some(position) = self.activate_group(group) {
                self.groups[position].state.more_queued = true;
            }
        }
        for message in inbox.messages {
            self.step(message);
        }
        for group in inbox.applied {
            self.activate_group(group);
        }
        for group in inbox.campaigns {
            if let Some(position) = self.activate_group(group)
                && !self.groups[position].replica.is_installing()
            {
                self.groups[position].replica.campaign();
            }
        }
        for (group, to) in inbox.transfers {
            if let Some(position) = self.activate_group(group) {
                self.groups[position].replica.transfer_leadership(to);
            }
        }
        for (group, change, mut responder) in inbox.member_changes {
            let Some(position) = self.activate_group(group) else {
                responder.answer(Err(crate::ProposeError::UnknownGroup { group }));
                continue;
            };
            let Group { state, replica } = &mut self.groups[position];
            let proposed = match state.status.stopped_reason() {
                Some(reason) => Err(crate::ProposeError::Stopped { group, reason }),
                None if replica.is_installing() || replica.is_transferring() => {
                    Err(crate::ProposeError::NotLeader {
                        group,
                        leader: None,
                    })
                }
                None => replica.propose_member_change(group, &change),
            };
            responder.answer(proposed);
        }
        for (group, event) in inbox.snapshots {
            // A fetch that ended (fetched or failed) freed its slot: another group's fetch may
            // start now. An install's end frees none; the scan it causes is a short one.
            self.fetch_due = true;
            self.snapshot_event(group, event);
        }
        if inbox.hand_over && !self.handing_over {
            self.handing_over = true;
            self.hand_over();
        }
        let now = Instant::now();
        // The read index asked this round, per group: a read of that group arriving in the same
        // round shares it, since it arrived before the index was asked. One ReadIndex (on a
        // leader of several voters, one round of heartbeats) serves them all.
        let mut asked_this_round: IdMap<u64> = IdMap::default();
        let (mut from_lease, mut through_quorum) = (0, 0);
        let peers_quiet = (self.transport.as_ref()).and_then(|t| t.shortest_peer_vote_quiet());
        for (group, mut responder, lease) in inbox.reads {
            let Some(position) = self.activate_group(group) else {
                responder.answer(Err(crate::ProposeError::UnknownGroup { group }));
                continue;
            };
            let read_id = self.next_read_id;
            self.next_read_id += 1;
            let Group { state, replica } = &mut self.groups[position];
            if let Some(reason) = state.status.stopped_reason() {
                responder.answer(Err(crate::ProposeError::Stopped { group, reason }));
                continue;
            }
            if replica.is_installing() {
                // Asked once the snapshot is in (see `ask_reads_again`).
                state.wait_for_index(read_id, responder, (0, 0), now);
                continue;
            }
            if let Err(error) = replica.check_serving(group) {
                responder.answer(Err(error));
                continue;
            }
            if lease {
                if let Some(index) = replica.lease_read_index(now, peers_quiet) {
                    state.reads_waiting_apply.push((index, responder));
                    from_lease += 1;
                    continue;
                }
                through_quorum += 1;
            }
            if let Some(&asked) = asked_this_round.get(&group) {
                match state.join_read(asked, responder) {
                    Ok(()) => continue,
                    Err(not_joined) => responder = not_joined,
                }
            }
            match replica.read_index(read_id) {
                Some(index) => state.reads_waiting_apply.push((index, responder)),
                None => {
                    let asked_under = state.leadership();
                    state.wait_for_index(read_id, responder, asked_under, now);
                    asked_this_round.insert(group, read_id);
                }
            }
        }
        crate::metrics::lease_reads(from_lease, through_quorum);
        worked
    }

    /// Records whether the group at `position` sleeps, for the ticks and for its status.
    fn note_sleep(&mut self, position: usize) {
        let Group { state, replica } = &mut self.groups[position];
        if replica.is_asleep() && !replica.leads() && replica.sleeping_leader().is_none() {
            // A follower that knows no leader has nobody to watch: its clock must run.
            replica.wake();
        }
        let sleeping = replica
            .is_asleep()
            .then(|| replica.sleeping_leader().unwrap_or(0));
        let was_asleep = self.sleepers.is_asleep(position);
        if self.sleepers.set(position, sleeping) {
            if !was_asleep {
                self.sleepers_to_compact.insert(position);
            }
            state
                .status
                .asleep
                .store(sleeping.is_some(), Ordering::Release);
        }
    }

    /// Steps one peer message into its group's replica (raft-rs ignores what a node that is
    /// not a member of the group sends, and the network what a node not in the cluster does).
    fn step(&mut self, message: GroupMessage) {
        if message.message.to != self.shared.config.node_id {
            crate::metrics::dropped_message("misaddressed");
            return;
        }
        let Some(position) = self.activate_group(message.group) else {
            crate::metrics::dropped_message("unknown_group");
            return;
        };
        let group = &mut self.groups[position];
        if group.state.is_stopped() {
            return;
        }
        if group.replica.is_installing() {
            crate::metrics::dropped_message("installing_snapshot");
            return;
        }
        let was_catching_up = group.replica.is_catching_up();
        let outcome = group.replica.step(message);
        if group.replica.is_catching_up() != was_catching_up {
            publish_catching_up(&group.state.status, &group.replica);
        }
        match outcome {
            StepOutcome::Stepped => {
                group.replica.accept_sleep(group.state.is_quiet());
                // Recorded at once, not at the round's end: a tick later in this iteration
                // would take a group asleep but recorded awake for one whose leader's node
                // fell silent, and wake it under a sleeping leader.
                if group.replica.is_asleep() && !self.sleepers.is_asleep(position) {
                    self.note_sleep(position);
                }
            }
            StepOutcome::Rejected(reason) => {
                tracing::debug!(group = group.state.id, %reason, "dropped a peer message");
                crate::metrics::dropped_message("rejected");
            }
            // A message raft-rs panicked on while this node's log failed a read: the read is
            // to blame, and every group stops for it.
            StepOutcome::Malformed(_) if self.shared.log_read_failure.get().is_some() => {
                self.stopped_on_a_failed_read();
                return;
            }
            StepOutcome::Malformed(reason) => {
                crate::metrics::dropped_message("malformed");
                group.state.status.stop(reason);
            }
        }
        self.note_commit_owed(position);
    }

    /// `true` while the worker's wave of proposals holds every group's commands back (at `now`).
    fn wave_holds(&mut self, now: Instant) -> bool {
        let max_in_flight = self.shared.config.max_in_flight_entries;
        let groups = &self.groups;
        self.wave.holds(now, |position| {
            groups[position].state.in_flight() >= max_in_flight
        })
    }

    /// Packs each group's queued commands into one entry (`now`: the round's clock).
    fn propose_queued(&mut self, now: Instant) -> bool {
        let config = &self.shared.config;
        let (max_commands, max_bytes) = (config.max_commands_per_entry, config.max_entry_bytes);
        let max_in_flight = config.max_in_flight_entries;
        if self.wave_holds(now) {
            return false;
        }
        let mut worked = false;
        let drained = &mut self.drained;
        let queue_wait = crate::metrics::proposal_queue_wait();
        for &position in self.active.members() {
            let Group { state, replica } = &mut self.groups[position];
            // With enough entries on their way to commit, commands wait and the next entry
            // carries more of them: under load, batches grow instead of rounds multiplying.
            if !state.more_queued
                || state.in_flight() >= max_in_flight
                || replica.is_transferring()
                || replica.is_installing()
            {
                continue;
            }
            worked = true;
            if let Some(reason) = state.status.stopped_reason() {
                state.more_queued = false;
                state.answer_stopped(&reason);
                continue;
            }
            drained.clear();
            state.more_queued =
                state
                    .queue
                    .drain_entry(max_commands, max_bytes, drained, now, &queue_wait);
            if drained.is_empty() {
                continue;
            }
            let data = match drained[0].kind {
                CommandKind::Admin => crate::command_batch::encode_admin(&drained[0].command),
                CommandKind::Client => {
                    crate::command_batch::encode(drained.iter().map(|q| q.command.as_ref()))
                }
            };
            let forward_id = state.take_forward_id();
            let proposed = replica
                .check_serving(state.id)
                .and_then(|()| replica.propose(state.id, data, forward_id));
            let oldest_enqueued_at = drained[0].responder.enqueued_at;
            match proposed {
                Ok(Proposed::Appended { index, term }) => {
                    let responders = drained.drain(..).map(|q| q.responder).collect();
                    state.proposed.push_back(ProposedEntry::new(
                        index,
                        term,
                        oldest_enqueued_at,
                        responders,
                    ));
                    self.wave.joined(position, now);
                }
                Ok(Proposed::Forwarded { term }) => {
                    let responders = drained.drain(..).map(|q| q.responder).collect();
                    let entry = ProposedEntry::new(0, term, oldest_enqueued_at, responders);
                    state.forwarding(forward_id, entry);
                    self.wave.joined(position, now);
                }
                Err(error) => {
                    for mut queued in drained.drain(..) {
                        queued.responder.answer(Err(error.clone()));
                    }
                }
            }
        }
        worked
    }

    /// Steps 4–6 of the round: collect, one write, finish. Returns `true` if it did anything.
    fn write_round(&mut self) -> bool {
        let mut round = Round::new(
            Instant::now(),
            std::mem::take(&mut self.log_batch),
            self.last_committing_groups,
        );
        let mut collected = std::mem::take(&mut self.collected);
        collected.clear();
        for &position in self.active.members() {
            let Group { state, replica } = &mut self.groups[position];
            if state.is_stopped() || !replica.has_ready() {
                continue;
            }
            if let Some(item) = replica.collect(state, &mut round) {
                collected.push((position, item));
            } else if replica.is_installing() {
                // A replica starts installing a snapshot only here: in a collect that takes
                // nothing into the round.
                self.installing.insert(position);
                self.fetch_due = true;
            }
        }
        self.leadership_line
            .add(&round.leadership_changes, round.now);
        // Only what a Ready carried can leave this round: with nothing collected there is
        // nothing to hold back (and the groups a failed read stopped collect nothing again).
        let collected_any = !collected.is_empty();
        if collected_any && self.stopped_on_a_failed_read() {
            return true;
        }
        if self.send_before_write {
            self.send(std::mem::take(&mut round.send_now));
        }
        let compactions = std::mem::take(&mut self.pending_compactions);
        if collected.is_empty() && compactions.is_empty() && round.committed.is_empty() {
            self.log_batch = round.batch;
            self.collected = collected;
            return false;
        }
        for &(position, compact_index) in &compactions {
            round
                .batch
                .compact(self.groups[position].state.id, compact_index);
        }
        if !round.batch.is_empty() {
            let entry_count = round.batch.entry_count();
            let started = Instant::now();
            self.shared.log_writes.began(self.index, started);
            let written = self.log.write_from(&mut round.batch);
            let took = started.elapsed();
            self.shared.log_writes.ended(self.index, took);
            self.log_batch = std::mem::take(&mut round.batch);
            if let Err(error) = written {
                self.log_write_failed(error);
                return true;
            }
            crate::metrics::log_append_batch(took, entry_count);
            if self
                .shared
                .config
                .slow_log_write
                .is_some_and(|limit| took > limit)
            {
                self.hand_over_after_slow_write(took);
            }
        }
        for (position, compact_index) in compactions {
            let group = &mut self.groups[position];
            group.replica.compacted(compact_index);
            group.state.entry_sizes.compacted(compact_index);
        }
        for (position, item) in collected.drain(..) {
            let Group { state, replica } = &mut self.groups[position];
            // A catch-up may end here too: once a snapshot's record is persisted.
            let was_catching_up = replica.is_catching_up();
            replica.persisted(state, &mut round, item);
            if was_catching_up && !replica.is_catching_up() {
                publish_catching_up(&state.status, replica);
            }
            self.note_commit_owed(position);
        }
        // The log holds these groups' snapshots now (written above).
        for group in round.snapshots_recorded.drain(..) {
            self.install_marks.unmark(group);
        }
        self.collected = collected;
        if !round.members_dropped.is_empty() {
            let dropped = std::mem::take(&mut round.members_dropped);
            self.shared.peers_removed.lock().extend(dropped);
        }
        if collected_any && self.stopped_on_a_failed_read() {
            return true;
        }
        let mut outbox = std::mem::take(&mut round.send_now);
        for (to, messages) in std::mem::take(&mut round.send_after_write) {
            outbox.entry(to).or_default().extend(messages);
        }
        self.send(outbox);
        if !self.apply_conf_changes(&round) {
            return true;
        }
        self.last_committing_groups = round.committed.len();
        self.hand_to_apply(std::mem::take(&mut round.committed), round.now);
        true
    }

    /// Applies the configuration changes among the round's committed entries to their
    /// replicas and persists each group's new configuration — with the index of the change
    /// that made it, so that a replay never applies a change twice — before the entries go to
    /// apply: the state can never be durable past a change whose configuration is not. Tells
    /// the network of members added and removed. Returns `false` if the write failed (every
    /// group of the worker stopped).
    fn apply_conf_changes(&mut self, round: &Round) -> bool {
        let mut batch = concord_storage::LogBatch::new();
        let mut added = Vec::new();
        let mut removed = Vec::new();
        let reachable = self.reachability();
        for (&group, entries) in round.committed.iter() {
            let Some(position) = self.group_position(group) else {
                continue;
            };
            let Group { state, replica } = &mut self.groups[position];
            if let Some(applied) = replica.apply_conf_changes(entries, &reachable) {
                let node = self.shared.config.node_id;
                let members = replica.members();
                // A removal leaves the member in the outgoing half of a joint configuration;
                // raft-rs's own entry leaving it carries no context: the members a change
                // drops are those the configuration no longer names, whichever entry did it.
                removed.extend(state.status.members.lock().dropped_in(&members, node));
                let changed = ConfigChanges {
                    changed: 1,
                    members: members.clone(),
                };
                self.config_line.add(&changed, round.now);
                state.status.set_members(group, members, node);
                batch.set_conf_state(group, applied.conf_state, applied.index);
                added.extend(applied.added);
            }
        }
        if batch.is_empty() {
            return true;
        }
        if let Err(error) = self.log.write(batch) {
            self.log_write_failed(error);
            return false;
        }
        if let Some(transport) = &self.transport {
            for (node, address) in added {
                transport.add_peer(node, &address);
            }
        }
        if !removed.is_empty() {
            self.shared.peers_removed.lock().extend(removed);
        }
        true
    }

    fn send(&self, outbox: Outbox) {
        let Some(transport) = &self.transport else {
            return;
        };
        for (to, messages) in outbox {
            transport.send(to, messages);
        }
    }

    /// Hands the round's committed entries of every group, with the proposals they carry, to
    /// the apply thread as **one** message: a round that committed in many groups costs one
    /// queue slot and one hand-off, not one per group. A small round the apply thread would
    /// take at once (it has nothing queued or in hand) is applied here instead, unless the
    /// round's groups have commands waiting.
    fn hand_to_apply(&mut self, committed: IdMap<Vec<Entry>>, now: Instant) {
        let mut groups = Vec::with_capacity(committed.len());
        let mut callers = CallersBuilder::default();
        let commit_wait = crate::metrics::commit_wait();
        for (group, entries) in committed {
            let Some(position) = self.group_position(group) else {
                continue;
            };
            let Some(last) = entries.last().map(|e| e.index) else {
                continue;
            };
            let state = &mut self.groups[position].state;
            let mut proposals = state.committed_through(last, now, &commit_wait, &mut callers);
            let node = self.shared.config.node_id;
            state.match_forwarded(node, &entries, &mut callers, &mut proposals);
            groups.push(CommittedEntries {
                group,
                entries,
                proposals,
            });
        }
        if groups.is_empty() {
            return;
        }
        let callers = callers.finish();
        if let Some(callers) = &callers {
            self.in_apply.push(callers);
        }
        // Applied here only when nothing else waits: with commands queued in the round's
        // groups, the worker's time goes to proposing them, and the apply thread's core to
        // applying.
        let apply_here = self.apply_backlog.is_empty()
            && crate::apply::is_small_round(&groups)
            && !self.commands_queued_in(&groups);
        let mut message = ApplyMessage::Apply { groups, callers };
        if apply_here {
            match (self.apply_stage).try_apply_here(message, self.apply_messages_sent) {
                Ok(()) => return,
                Err(refused) => message = refused,
            }
        }
        self.apply_backlog.push_back(message);
        self.flush_apply_backlog();
    }

    /// Whether any of the round's `groups` has commands waiting in its proposal queue.
    fn commands_queued_in(&self, groups: &[CommittedEntries]) -> bool {
        groups.iter().any(|committed| {
            self.group_position(committed.group)
                .is_some_and(|position| self.groups[position].state.queue.len() > 0)
        })
    }

    /// Moves what waits for the apply thread into its queue, as far as it has room. Returns
    /// `true` if nothing waits any more.
    fn flush_apply_backlog(&mut self) -> bool {
        while let Some(message) = self.apply_backlog.pop_front() {
            match self.apply_tx.try_send(message) {
                Ok(()) => self.apply_messages_sent += 1,
                Err(TrySendError::Full(message)) => {
                    self.apply_backlog.push_front(message);
                    return false;
                }
                Err(TrySendError::Disconnected(_)) => {
                    self.stop_every_group("the apply thread stopped");
                    self.apply_backlog.clear();
                }
            }
        }
        true
    }

    /// A fetched state goes to the apply thread, in order with the group's entries; the end of
    /// an install (or a failure) goes to the replica.
    fn snapshot_event(&mut self, group: GroupId, event: SnapshotEvent) {
        let Some(position) = self.activate_group(group) else {
            return;
        };
        match event {
            SnapshotEvent::Fetched { path, min_index } => {
                self.apply_backlog.push_back(ApplyMessage::InstallSnapshot {
                    group,
                    path,
                    min_index,
                });
                self.flush_apply_backlog();
            }
            SnapshotEvent::Installed(index) => {
                let now = Instant::now();
                self.snapshot_line.add(&SnapshotCounts::done(0), now);
                let Group { state, replica } = &mut self.groups[position];
                replica.snapshot_done(group, Ok(index));
                state.snapshot_installed(now);
            }
            SnapshotEvent::Failed(reason) => {
                // A refusal (a member busy sending others) is the normal course of a
                // catch-up, not a failure.
                if let SnapshotFailure::Broken(cause) = &reason {
                    let failed = SnapshotCounts::failed(format!("group {group}: {cause}"));
                    self.snapshot_line.add(&failed, Instant::now());
                }
                self.groups[position]
                    .replica
                    .snapshot_done(group, Err(reason));
            }
        }
    }

    /// Tells the replicas what the apply thread has applied, and serves reads that waited
    /// for it. Returns `true` if reads still wait for apply.
    fn advance_applied(&mut self) -> bool {
        let mut reads_waiting = false;
        for &position in self.active.members() {
            let Group { state, replica } = &mut self.groups[position];
            let applied = state.status.applied_index.load(Ordering::Acquire);
            if applied > state.advanced_applied {
                // A catch-up ends here once the target index is applied (or after the
                // persist that records it, below in `write_round`).
                let was_catching_up = replica.is_catching_up();
                replica.applied(applied);
                state.advanced_applied = applied;
                if was_catching_up && !replica.is_catching_up() {
                    publish_catching_up(&state.status, replica);
                }
            } else if state.reads_waiting_apply.is_empty() {
                continue;
            }
            reads_waiting |= state.applied_to(applied);
        }
        reads_waiting
    }

    /// The log can no longer be trusted: every group of this worker stops.
    fn log_write_failed(&mut self, error: concord_storage::StorageError) {
        self.fail(&format!("log write failed: {error}"));
    }

    /// If a read of the log failed (this round or another worker's), every group of this
    /// worker stops, before anything raft-rs built on the answer it got in its place
    /// (`raft_node/storage.rs`) is sent or applied. Returns `true` if they stopped.
    fn stopped_on_a_failed_read(&mut self) -> bool {
        let Some(error) = self.shared.log_read_failure.get() else {
            return false;
        };
        self.fail(&format!("log read failed: {error}"));
        true
    }

    /// A failure this worker cannot go on from: it says so to the node (`worker_failed`),
    /// and every group of it stops for `reason`, everyone waiting on them answered.
    fn fail(&mut self, reason: &str) {
        self.shared.worker_failed.store(true, Ordering::Release);
        self.stop_every_group(reason);
        self.stop_all(reason);
    }

    /// Stops every group of this worker for `reason`, in one line of the log.
    fn stop_every_group(&self, reason: &str) {
        stop_groups(self.groups.iter().map(|g| &*g.state.status), reason);
    }

    /// Answers everything queued or waiting with `Stopped`.
    fn stop_all(&mut self, reason: &str) {
        for group in &mut self.groups {
            group.state.answer_stopped(reason);
        }
    }
}
