//! What the worker does on the clock rather than because something arrived: each tick, the
//! groups' raft clocks and the scans that go with them (compactions, reads to ask again,
//! snapshots to fetch; the leader balance is `leaderships.rs`, the peers to forget
//! `peer_forgetting.rs`); every
//! `TIMEOUT_SCAN_INTERVAL`, the callers waited on too long. Each scan looks only at the
//! groups that concern it: the tick and the compaction scan at the awake groups
//! (`sleepers.rs`; the compaction scan also at the few sleepers whose point may still move,
//! the tick at the sleepers whose leader's node fell silent), the timeout, read and snapshot
//! scans at the worker's position sets.

use std::sync::atomic::Ordering;
use std::time::Instant;

use concord_storage::GroupId;

use super::{TIMEOUT_SCAN_INTERVAL, Worker, publish_voters};
use crate::log_compaction::{LogKeep, compact_index};
use crate::node_loop::event_lines::CatchUpWaits;
use crate::node_loop::group::Group;
use crate::node_loop::replica::Replica;
use crate::node_loop::snapshot_install;

/// Sleeping groups whose compaction point may still move are considered once in this many
/// ticks (their log does not grow; the state's flush that lets it move comes every few
/// seconds).
const SLEEPING_COMPACTION_TICKS: u64 = 64;

/// The index to compact `group`'s log to, or `None`: below the state's durable applied index
/// (a restart replays from there) and below what replication still needs (the replica's
/// bound), keeping what `keep` says. A stopped group is never compacted, nor one installing a
/// snapshot (below).
fn compaction_point<R: Replica>(group: &Group<R>, keep: LogKeep) -> Option<u64> {
    // An install publishes the state's durable index from its own thread, before the worker
    // persists the `Ready` that moves the log past it: until then the log store holds the old
    // log (or none), and a compaction to that index would reach past its end, a log write the
    // store refuses, which stops the node.
    if group.state.is_stopped() || group.replica.is_installing() {
        return None;
    }
    let durable = group
        .state
        .status
        .durable_applied_index
        .load(Ordering::Acquire);
    let bound = durable.min(group.replica.replicated_bound());
    compact_index(
        bound,
        group.replica.first_index(),
        keep,
        &group.state.entry_sizes,
    )
}

impl<R: Replica> Worker<R> {
    /// Ticks every awake group; a leader whose group stayed still long enough puts it to
    /// sleep. A sleeping follower whose leader's node fell silent wakes and ticks again, so
    /// that an election replaces a dead leader; when a peer comes back, the sleeping groups led
    /// here wake, so that the peer hears who leads them, and so do those that the peer led, so
    /// that an election replaces it if it restarted (`returning_peers.rs`). Groups that lost
    /// their data and still wait for the others' answers are named in a warning, at most one
    /// per interval.
    pub(super) fn tick_groups(&mut self) {
        let config = &self.shared.config;
        let sleep_after_ticks = if self.groups_may_sleep {
            config.sleep_after_ticks
        } else {
            0
        };
        let liveness_timeout = config.liveness_timeout;
        let mut positions = std::mem::take(&mut self.tick_positions);
        self.sleepers.awake_positions(&mut positions);
        // The leaders whose sleeping groups wake: those whose node fell silent (asked once per
        // watched node and tick, not once per sleeping group), so that the followers here
        // elect; and when peers came back, they and this node (0).
        let mut wake_watchers_of: Vec<crate::NodeId> = match &self.transport {
            Some(transport) => (self.sleepers.watched_nodes())
                .filter(|&node| {
                    (transport.silent_for(node)).is_some_and(|silent| silent >= liveness_timeout)
                })
                .collect(),
            None => Vec::new(),
        };
        if self.groups_may_sleep {
            let silent = wake_watchers_of.len();
            self.peers_that_came_back(&mut wake_watchers_of);
            if wake_watchers_of.len() > silent {
                wake_watchers_of.push(0);
            }
        }
        if !wake_watchers_of.is_empty() {
            self.sleepers
                .watching_any_of(&wake_watchers_of, &mut positions);
        }
        let mut catch_up_waits = CatchUpWaits::default();
        for &position in &positions {
            let Group { state, replica } = &mut self.groups[position];
            if state.is_stopped() || replica.is_installing() {
                continue;
            }
            if replica.is_asleep() {
                tracing::debug!(
                    group = state.id,
                    "waking: the leader's node fell silent, or a peer came back"
                );
                replica.wake();
            }
            replica.tick();
            if let Some(unanswered) = replica.catch_up_unanswered() {
                catch_up_waits.add(state.id, &unanswered);
            }
            if sleep_after_ticks > 0 {
                replica.tick_toward_sleep(state.is_quiet(), sleep_after_ticks);
            }
            self.note_sleep(position);
            publish_voters(&mut self.groups[position]);
            self.activate(position);
        }
        self.tick_positions = positions;
        if catch_up_waits.groups > 0 && self.catch_up_line.due(Instant::now()) {
            tracing::warn!(
                node = self.shared.config.node_id,
                worker = self.index,
                groups = catch_up_waits.groups,
                first_group = catch_up_waits.first_group,
                unanswered = ?catch_up_waits.unanswered,
                "groups that lost their data still ask the other members where each stands, \
                 and take no part until enough answer: the members named never answered (down, \
                 cut off, or of a build that does not answer)"
            );
        }
    }

    /// Adds to `returned` the peers that were down (stopped, crashed or cut off) at the last
    /// tick and are up now, by the network's word (`Transport::reachable`), and those up that
    /// connected again since (`Transport::connections_opened_by`). Peers added by membership
    /// changes are learned from the network's list.
    fn peers_that_came_back(&mut self, returned: &mut Vec<crate::NodeId>) {
        let Some(transport) = &self.transport else {
            return;
        };
        let returning = &mut self.returning_peers;
        transport.visit_known_peers(&mut |peer| returning.know(peer));
        let within = self.shared.config.liveness_timeout;
        returning.look(
            |peer| transport.reachable(peer, within),
            |peer| transport.connections_opened_by(peer),
            returned,
        );
    }

    /// Asks again for the ReadIndex of reads whose leader or term changed since they were
    /// asked (a leader that steps down forgets them), or that waited an election timeout (a
    /// new leader ignores reads until it commits in its term; a message may be lost). Reads
    /// are idempotent: asking twice is harmless.
    pub(super) fn ask_reads_again(&mut self) {
        let config = &self.shared.config;
        let patience = config.tick_interval * config.election_ticks as u32;
        let now = Instant::now();
        // A read waiting for its index is a caller waiting: its group is in `may_wait`.
        for index in 0..self.may_wait.members().len() {
            let position = self.may_wait.members()[index];
            let Group { state, replica } = &mut self.groups[position];
            if state.reads_waiting_index.is_empty() || state.is_stopped() || replica.is_installing()
            {
                continue;
            }
            let leadership = state.leadership();
            if leadership.0 == 0 {
                continue;
            }
            let mut asked = false;
            for (&read_id, read) in state.reads_waiting_index.iter_mut() {
                if read.asked_under != leadership || now.duration_since(read.asked_at) >= patience {
                    read.asked_under = leadership;
                    read.asked_at = now;
                    let _ = replica.read_index(read_id);
                    asked = true;
                }
            }
            if asked {
                self.activate(position);
            }
        }
    }

    /// The lines about what happened to many of this worker's groups since the last
    /// (`event_lines.rs`): leaderships gained and lost, snapshots installed, configuration
    /// changes applied. The groups it leads are counted only then, from the leadership each
    /// group published, which is where the changes were counted.
    pub(super) fn write_event_lines(&mut self, now: Instant) {
        let node = self.shared.config.node_id;
        if let Some(changes) = self.leadership_line.due(now) {
            let leads = (self.groups.iter())
                .filter(|group| group.state.status.is_leader.load(Ordering::Acquire))
                .count();
            tracing::info!(
                node,
                worker = self.index,
                gained = changes.gained,
                lost = changes.lost,
                leads,
                groups = self.groups.len(),
                "leaderships changed"
            );
        }
        if let Some(snapshots) = self.snapshot_line.due(now) {
            let installing = self.installing.members().len();
            match &snapshots.first_failure {
                None => tracing::info!(
                    node,
                    worker = self.index,
                    installed = snapshots.done,
                    failed = snapshots.failed,
                    installing,
                    "snapshots installed"
                ),
                Some(first_failure) => tracing::warn!(
                    node,
                    worker = self.index,
                    installed = snapshots.done,
                    failed = snapshots.failed,
                    installing,
                    %first_failure,
                    "snapshots installed; some failed and are asked for again"
                ),
            }
        }
        if let Some(changes) = self.config_line.due(now) {
            tracing::info!(
                node,
                worker = self.index,
                changed = changes.changed,
                members = ?changes.members,
                "configurations changed"
            );
        }
    }

    /// Starts the snapshot fetches groups ask for, as far as fetch slots are free: on every
    /// tick (a fetch that failed waits to be asked again), and at the end of a round in which a
    /// slot freed or a group began installing. Each fetch takes a slot while one is free;
    /// past that, the fetches due join one from the same member, up to
    /// [`snapshot_install::MAX_STATES_PER_FETCH`] states on its connection.
    pub(super) fn fetch_snapshots(&mut self, now: Instant) {
        let Some(transport) = &self.transport else {
            return;
        };
        let (groups, snapshot_files) = (&mut self.groups, &self.snapshot_files);
        let mut batches: Vec<(crate::NodeId, Vec<(GroupId, u64)>)> = Vec::new();
        self.installing.retain(|position| {
            let group = &mut groups[position];
            if !group.replica.is_installing() {
                return false;
            }
            if group.state.is_stopped() {
                return true;
            }
            let Some(from) = group.replica.snapshot_source_due(now) else {
                return true;
            };
            // A free slot first (a few large states are fetched side by side), then a batch
            // from the same member with room; with neither, the fetch stays due.
            let batch = if snapshot_files.try_start(from) {
                batches.push((from, Vec::new()));
                batches.len() - 1
            } else {
                let open = batches.iter().position(|(source, batch)| {
                    *source == from && batch.len() < snapshot_install::MAX_STATES_PER_FETCH
                });
                match open {
                    Some(index) => index,
                    None => return true,
                }
            };
            if let Some((_, min_index)) = group.replica.snapshot_wanted(now) {
                batches[batch].1.push((group.state.id, min_index));
            }
            true
        });
        for (from, requests) in batches {
            if requests.is_empty() {
                snapshot_files.finished(from);
                continue;
            }
            snapshot_install::start_fetches(
                snapshot_files.clone(),
                transport.clone(),
                self.mailbox.clone(),
                from,
                requests,
            );
        }
    }

    /// Chooses the groups whose log can be compacted (the rule: `log_compaction.rs`); the
    /// compactions go with the next log batch. Awake groups are looked at every tick; sleeping
    /// ones only while their point may still move (`sleepers_to_compact`), on every
    /// `SLEEPING_COMPACTION_TICKS`-th tick.
    pub(super) fn plan_compactions(&mut self) {
        let keep = self.shared.config.log_keep();
        self.ticks = self.ticks.wrapping_add(1);
        // The awake groups as of now (those the tick just put to sleep are not among them: a
        // compaction of theirs waits for the sleepers' scan).
        let mut positions = std::mem::take(&mut self.tick_positions);
        self.sleepers.awake_positions(&mut positions);
        for &position in &positions {
            if let Some(compact_index) = compaction_point(&self.groups[position], keep) {
                self.pending_compactions.push((position, compact_index));
            }
        }
        self.tick_positions = positions;
        if !self.ticks.is_multiple_of(SLEEPING_COMPACTION_TICKS) {
            return;
        }
        let (groups, sleepers, pending) =
            (&self.groups, &self.sleepers, &mut self.pending_compactions);
        self.sleepers_to_compact.retain(|position| {
            // One that woke is the awake scan's again.
            if !sleepers.is_asleep(position) {
                return false;
            }
            let group = &groups[position];
            if let Some(compact_index) = compaction_point(group, keep) {
                pending.push((position, compact_index));
            }
            // While it sleeps nothing is applied: once what it applied is durable, its bound
            // (and so its point) stays where it is until it wakes.
            let status = &group.state.status;
            let applied = status.applied_index.load(Ordering::Acquire);
            status.durable_applied_index.load(Ordering::Acquire) < applied
                && !group.state.is_stopped()
        });
    }

    /// Answers everything that waited longer than the proposal timeout, and everything that
    /// waits on a stopped group.
    pub(super) fn answer_timeouts(&mut self) {
        let timeout = self.shared.config.proposal_timeout;
        let groups = &mut self.groups;
        self.may_wait.retain(|position| {
            let state = &mut groups[position].state;
            if !state.has_waiting() {
                return false;
            }
            match state.status.stopped_reason() {
                Some(reason) => state.answer_stopped(&reason),
                None => state.answer_expired(timeout),
            }
            state.has_waiting()
        });
        self.in_apply.answer_expired(timeout);
        self.next_timeout_scan = Instant::now() + TIMEOUT_SCAN_INTERVAL;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use concord_storage::raft::prelude::{Message, MessageType};
    use concord_storage::{LogBatch, LogStore, MemLogStore};

    use super::*;
    use crate::NodeConfig;
    use crate::log_compaction::EntrySizes;
    use crate::node_loop::group::GroupState;
    use crate::node_loop::replica::Round;
    use crate::proposal_queue::ProposalQueue;
    use crate::raft_node::{RaftReplica, SnapshotTicket};
    use crate::status::SharedGroupStatus;
    use crate::transport::GroupMessage;

    /// Node 2's group 0, new and empty, handed leader 1's snapshot at index 10 (voters 1, 2
    /// and 3) with a replicated floor of 10, and taken as far as its install.
    fn installing_follower() -> Group<RaftReplica> {
        let config = NodeConfig::new(2, vec![1, 2, 3], vec![0]);
        let log: Arc<dyn LogStore> = Arc::new(MemLogStore::new());
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let mut replica =
            RaftReplica::open(&config, 0, log, 0, Default::default(), &logger).unwrap();
        let status = Arc::new(SharedGroupStatus::new(0, false, Default::default()));
        let queue = Arc::new(ProposalQueue::new(16, 1 << 20));
        let mut state = GroupState::new(0, queue, status, 0, EntrySizes::new(0));
        let mut message = Message::default();
        message.set_msg_type(MessageType::MsgSnapshot);
        (message.from, message.to, message.term) = (1, 2, 2);
        let snapshot = message.mut_snapshot();
        snapshot.data = SnapshotTicket { source: 1 }.encode().into();
        let metadata = snapshot.mut_metadata();
        (metadata.index, metadata.term) = (10, 2);
        metadata.mut_conf_state().set_voters(vec![1, 2, 3]);
        replica.step(GroupMessage {
            group: 0,
            message,
            replicated_floor: 10,
        });
        let mut round = Round::new(Instant::now(), LogBatch::new(), 1);
        assert!(replica.collect(&mut state, &mut round).is_none());
        assert!(replica.is_installing(), "the snapshot's Ready is held");
        Group { state, replica }
    }

    #[test]
    fn a_group_is_not_compacted_while_it_installs_a_snapshot() {
        let group = installing_follower();
        let keep = LogKeep {
            entries: 1,
            bytes: u64::MAX / 4,
        };
        assert_eq!(compaction_point(&group, keep), None);
        // The install is done: its thread has published the state's durable index, and the
        // worker has not heard yet. The log still ends at 0.
        let status = &group.state.status;
        status.durable_applied_index.store(10, Ordering::Release);
        assert_eq!(
            compaction_point(&group, keep),
            None,
            "a compaction to 10 would reach past the end of an empty log"
        );
    }
}
