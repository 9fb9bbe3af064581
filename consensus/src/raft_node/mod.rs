//! [`RaftNode`]: many raft-rs groups on dedicated worker threads, with entry batching, one
//! log write (one sync) per poll round for all of a worker's groups, and apply on separate
//! threads.

mod catch_up;
mod commit_news;
mod forwarded_requests;
mod held_proposals;
mod held_transfer;
mod lease;
mod logger;
mod replica;
mod sleep;
mod snapshot_receipt;
mod storage;
mod term_runs;
mod vote_hold;
mod written_entries;

pub(crate) use lease::vote_quiet;

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use concord_storage::{GroupId, LogBatch, StateStore, Stores};
use parking_lot::Mutex;

use crate::mailbox::MAX_INBOX_MESSAGES;
use crate::node_loop::NodeShared;
use crate::proposal_queue::CommandKind;
use crate::transport::{
    ADMIN_ENTRIES_WIRE_VERSION, GroupMessage, MessageSink, PeerConnection, SnapshotFetchError,
    Transport,
};
use crate::{
    Consensus, GroupMembers, GroupStatus, MemberChange, NodeConfig, NodeId, Pending, ProposeError,
    StartError, StateMachineFactory,
};
pub(crate) use replica::RaftReplica;
#[cfg(test)]
pub(crate) use storage::SnapshotTicket;

/// A raft node hosting many groups. See the crate docs for the write path.
pub struct RaftNode {
    shared: Arc<NodeShared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// What peers deliver to (see [`RaftNode::sink`]).
    peer_inbox: Arc<PeerInbox>,
    /// What the workers send with; asked which protocol version each peer speaks.
    transport: Arc<dyn Transport>,
}

/// The receiving side of a node, an allocation of its own: a network upgrades its weak
/// reference on every delivery, and that count must not share a cache line with what every
/// proposal reads (the node's own fields), or each delivery slows the callers down.
#[repr(align(128))]
struct PeerInbox {
    shared: Arc<NodeShared>,
    /// The state peers that fell behind are sent snapshots of.
    state: Arc<dyn StateStore>,
}

impl RaftNode {
    /// Opens every group from `stores` (recovering hard state, conf state, log and applied
    /// index), and starts the worker and apply threads.
    pub fn start(
        config: NodeConfig,
        stores: Stores,
        factory: Arc<dyn StateMachineFactory>,
        transport: Arc<dyn Transport>,
    ) -> Result<Arc<RaftNode>, StartError> {
        config.validate().map_err(StartError::Config)?;
        bootstrap_conf_state(&config, &stores)?;
        let shared = Arc::new(NodeShared::new(config));
        let logger = logger::raft_logger(shared.config.node_id);
        let log = stores.log.clone();
        let threads = crate::node_loop::start_workers(
            &shared,
            &stores,
            &factory,
            Some(transport.clone()),
            "raft",
            |group, applied| {
                let read_failure = shared.log_read_failure.clone();
                RaftReplica::open(
                    &shared.config,
                    group,
                    log.clone(),
                    applied,
                    read_failure,
                    &logger,
                )
            },
        )?;
        Ok(Arc::new(RaftNode {
            peer_inbox: Arc::new(PeerInbox {
                shared: shared.clone(),
                state: stores.state.clone(),
            }),
            shared,
            threads: Mutex::new(threads),
            transport,
        }))
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.shared.config.node_id
    }

    /// How long this node, having heard from a leader, refuses to vote for another
    /// ([`NodeConfig::vote_quiet`](crate::NodeConfig::vote_quiet)).
    pub fn vote_quiet(&self) -> Duration {
        self.shared.config.vote_quiet()
    }

    /// The receiving side to register with a network; it stops accepting messages when the
    /// node is dropped.
    pub fn sink(&self) -> Weak<dyn MessageSink> {
        let sink: Arc<dyn MessageSink> = self.peer_inbox.clone();
        Arc::downgrade(&sink)
    }

    /// Asks this node to start an election for `group` now (instead of waiting for the
    /// election timeout): benchmarks and tests use it to place leaders.
    pub fn campaign(&self, group: GroupId) -> Result<(), ProposeError> {
        let handle = self.shared.entrance.handle(group)?;
        let mailbox = &self.shared.entrance.mailboxes[handle.worker];
        mailbox.inbox.lock().campaigns.push(group);
        mailbox.wake();
        Ok(())
    }
}

impl RaftNode {
    /// Asks this node, if it leads `group`, to hand the leadership to voter `to` (raft-rs's
    /// transfer: `to` first receives what it lacks of the log). Returns at once; the move
    /// shows in [`Consensus::status`]. Refused with `NotLeader` if this node does not lead.
    pub fn transfer_leader(&self, group: GroupId, to: NodeId) -> Result<(), ProposeError> {
        let handle = self.shared.entrance.handle(group)?;
        let status = handle.status.snapshot(group);
        if !status.is_leader {
            return Err(ProposeError::NotLeader {
                group,
                leader: (status.leader != 0).then_some(status.leader),
            });
        }
        let mailbox = &self.shared.entrance.mailboxes[handle.worker];
        mailbox.inbox.lock().transfers.push((group, to));
        mailbox.wake();
        Ok(())
    }

    /// Proposes `change` to `group`'s membership; resolves once proposed (appended by this
    /// node if it leads, or forwarded to the leader), not once made: the change shows in
    /// [`GroupStatus::members`] when this node applies it. Refused (`Refused`) by a leader if
    /// it would lose quorum, if another change is under way, or if a learner to promote has
    /// not caught up; a change that is already in effect makes no difference when made again.
    pub fn propose_member_change(&self, group: GroupId, change: MemberChange) -> Pending<()> {
        if let MemberChange::AddLearner { address, .. } = &change
            && address.len() > crate::MAX_MEMBER_ADDRESS_BYTES
        {
            let reason = "the member's address is too long".to_string();
            return Pending::ready(group, Err(ProposeError::Refused { group, reason }));
        }
        let handle = match self.shared.entrance.handle(group) {
            Ok(handle) => handle,
            Err(error) => return Pending::ready(group, Err(error)),
        };
        let (pending, responder) = Pending::new(group);
        let mailbox = &self.shared.entrance.mailboxes[handle.worker];
        mailbox
            .inbox
            .lock()
            .member_changes
            .push((group, change, responder));
        mailbox.wake();
        pending
    }

    /// The voters of this node's groups, as their configurations say (all of them, once).
    pub fn voters(&self) -> Vec<NodeId> {
        self.shared.entrance.voters()
    }

    /// Whether `node` is up as this node counts it when it hands a leadership over: this node
    /// itself, or a peer connected to it and heard from within `liveness_timeout` (any peer,
    /// over a network that cannot tell).
    pub fn is_up(&self, node: NodeId) -> bool {
        let config = &self.shared.config;
        node == config.node_id || self.transport.reachable(node, config.liveness_timeout)
    }

    /// Refuses an admin entry for `group` unless every other member speaks a peer protocol
    /// version that applies one: a member of an older version would skip it while the others
    /// apply it (during a rolling upgrade, until the last member runs the new version).
    fn members_apply_admin_entries(&self, group: GroupId) -> Result<(), ProposeError> {
        let members = self
            .shared
            .entrance
            .handle(group)?
            .status
            .members
            .lock()
            .clone();
        let me = self.shared.config.node_id;
        let others = members
            .voters
            .iter()
            .chain(&members.learners)
            .chain(&members.outgoing_voters)
            .filter(|&&node| node != me);
        for &node in others {
            let reason = match self.transport.wire_version(node) {
                Some(version) if version >= ADMIN_ENTRIES_WIRE_VERSION => continue,
                Some(version) => format!(
                    "member {node} speaks peer protocol version {version}, which cannot apply \
                     admin entries (they need {ADMIN_ENTRIES_WIRE_VERSION}): upgrade it first"
                ),
                None => format!(
                    "member {node} has not connected to this node since it started, so \
                     whether it can apply admin entries is not known: retry once it is up"
                ),
            };
            return Err(ProposeError::Refused { group, reason });
        }
        Ok(())
    }

    /// Hands every leadership this node holds to other voters and waits (up to an election
    /// timeout, after which raft-rs gives up a transfer and a leader cut off from its quorum
    /// steps down) until none is left, so that its groups need no election when it stops.
    /// With no other voter up (the last member of a cluster to stop), there is nobody to hand
    /// to, and it does not wait.
    fn hand_over_leaderships(&self) {
        let config = &self.shared.config;
        let entrance = &self.shared.entrance;
        let voters = entrance.voters();
        if voters.len() < 2 || entrance.stopping.load(Ordering::Acquire) {
            return;
        }
        let another_voter_up = || {
            voters
                .iter()
                .any(|&voter| voter != config.node_id && self.is_up(voter))
        };
        if !another_voter_up() {
            return;
        }
        for mailbox in &entrance.mailboxes {
            mailbox.inbox.lock().hand_over = true;
            mailbox.wake();
        }
        let patience = config.tick_interval * config.election_ticks as u32;
        let deadline = Instant::now() + patience;
        let leads_any = || {
            entrance.groups.values().any(|handle| {
                handle.status.is_leader.load(Ordering::Acquire) && !handle.status.is_stopped()
            })
        };
        while leads_any() && another_voter_up() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if leads_any() {
            tracing::warn!(
                node = config.node_id,
                "some leaderships were not handed over in time; their groups will elect"
            );
        }
    }
}

impl Consensus for RaftNode {
    fn propose(&self, group: GroupId, command: Bytes) -> Pending<Bytes> {
        self.shared
            .entrance
            .propose(group, command, CommandKind::Client)
    }

    fn propose_batch(
        &self,
        group: GroupId,
        commands: Vec<Bytes>,
    ) -> Pending<Vec<Result<Bytes, ProposeError>>> {
        self.shared.entrance.propose_batch(group, commands)
    }

    fn propose_admin(&self, group: GroupId, command: Bytes) -> Pending<Bytes> {
        if let Err(error) = self.members_apply_admin_entries(group) {
            return Pending::ready(group, Err(error));
        }
        self.shared
            .entrance
            .propose(group, command, CommandKind::Admin)
    }

    fn read_barrier(&self, group: GroupId) -> Pending<u64> {
        self.shared.entrance.read_barrier(group, false)
    }

    fn lease_read_barrier(&self, group: GroupId) -> Pending<u64> {
        self.shared.entrance.read_barrier(group, true)
    }

    fn status(&self, group: GroupId) -> Result<GroupStatus, ProposeError> {
        self.shared.entrance.status(group)
    }

    fn health(
        &self,
        group: GroupId,
        _node: crate::NodeId,
    ) -> Result<crate::GroupHealth, ProposeError> {
        self.shared.entrance.health(group)
    }

    fn groups(&self) -> Vec<GroupId> {
        self.shared.entrance.groups()
    }

    fn log_write_in_progress_for(&self) -> Option<std::time::Duration> {
        self.shared.log_writes.longest_in_progress()
    }

    fn log_write_stalled(&self) -> bool {
        self.shared.log_writes.stalled()
    }

    fn shutdown(&self) {
        self.hand_over_leaderships();
        self.shared.entrance.shutdown(&self.threads);
    }
}

impl MessageSink for PeerInbox {
    fn deliver(&self, _from: NodeId, messages: Vec<GroupMessage>) {
        let workers = self.shared.entrance.mailboxes.len();
        let mut per_worker: Vec<Vec<GroupMessage>> = vec![Vec::new(); workers];
        for message in messages {
            match self.shared.entrance.groups.get(&message.group) {
                Some(handle) => per_worker[handle.worker].push(message),
                None => crate::metrics::dropped_message("unknown_group"),
            }
        }
        for (worker, messages) in per_worker.into_iter().enumerate() {
            if messages.is_empty() {
                continue;
            }
            let mailbox = &self.shared.entrance.mailboxes[worker];
            {
                let mut inbox = mailbox.inbox.lock();
                let room = MAX_INBOX_MESSAGES.saturating_sub(inbox.messages.len());
                if messages.len() > room {
                    for _ in room..messages.len() {
                        crate::metrics::dropped_message("inbox_full");
                    }
                }
                inbox.messages.extend(messages.into_iter().take(room));
            }
            mailbox.wake();
        }
    }

    fn peer_restarted(&self, node: NodeId) {
        for mailbox in &self.shared.entrance.mailboxes {
            let mut inbox = mailbox.inbox.lock();
            // Once per peer is enough: what the worker does for it does not add up.
            if !inbox.restarted_peers.contains(&node) {
                inbox.restarted_peers.push(node);
            }
            drop(inbox);
            mailbox.wake();
        }
    }

    fn adopt(&self, connection: Box<PeerConnection>) -> Result<(), Box<PeerConnection>> {
        // The first worker reads every connection (`node_loop/peer_reading.rs`).
        let Some(mailbox) = self.shared.entrance.mailboxes.first() else {
            return Err(connection);
        };
        // A worker that failed or stops reads nothing more: the network keeps the connection.
        let entrance = &self.shared.entrance;
        if !mailbox.reads_connections()
            || self.shared.worker_failed.load(Ordering::Acquire)
            || entrance.stopping.load(Ordering::Acquire)
        {
            return Err(connection);
        }
        mailbox.inbox.lock().connections.push(*connection);
        mailbox.wake();
        Ok(())
    }

    fn write_snapshot(
        &self,
        group: GroupId,
        min_index: u64,
        out: &mut dyn Write,
    ) -> Result<u64, SnapshotFetchError> {
        self.snapshot_of(group, min_index, out)
    }

    fn lives(&self) -> bool {
        !self.shared.worker_failed.load(Ordering::Acquire) && !self.shared.log_writes.stalled()
    }
}

impl PeerInbox {
    fn snapshot_of(
        &self,
        group: GroupId,
        min_index: u64,
        out: &mut dyn Write,
    ) -> Result<u64, SnapshotFetchError> {
        let refused = |reason: String| Err(SnapshotFetchError::Refused(reason));
        let Some(handle) = self.shared.entrance.groups.get(&group) else {
            return refused(format!("this node hosts no group {group}"));
        };
        if let Some(reason) = handle.status.stopped_reason() {
            return refused(format!("group {group} is stopped: {reason}"));
        }
        let applied = handle.status.applied_index.load(Ordering::Acquire);
        if applied < min_index {
            return refused(format!(
                "group {group} has applied through {applied} only, not {min_index}"
            ));
        }
        let summary = concord_storage::export_snapshot(self.state.as_ref(), group, out)
            .map_err(|error| SnapshotFetchError::Transfer(error.to_string()))?;
        Ok(summary.applied_index)
    }
}

impl Drop for RaftNode {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Gives every group that has never been configured the node's voters, identically on every
/// node (raft-rs's requirement for a group that starts without a snapshot) — unless the node
/// joins a cluster that runs already (`catch_up_before_voting`): then its groups start without
/// a configuration and take the one of the first snapshot their leader sends. A group whose
/// configuration was changed (by membership changes or a snapshot) keeps it, whatever the
/// node's settings say; one never changed must name the configured voters, or the node is
/// refused; a node that is a member of none of its groups was removed, and is refused.
fn bootstrap_conf_state(config: &NodeConfig, stores: &Stores) -> Result<(), StartError> {
    let mut batch = LogBatch::new();
    let mut removed_from = Vec::new();
    for &group in &config.groups {
        let state = stores.log.group_state(group)?;
        let members = GroupMembers::from_conf_state(&state.conf_state);
        if !members.is_empty() {
            let mut configured = config.voters.clone();
            configured.sort_unstable();
            if state.conf_state_index == 0 && members.voters != configured {
                // Never changed since the group was created: the data belongs to the cluster
                // it was created by, and a node started with another would vote by the wrong
                // quorum (or, alone, commit by itself what the others never see).
                return Err(StartError::Config(format!(
                    "group {group}'s data was written by a cluster of voters {:?}, but the \
                     configuration names {configured:?}",
                    members.voters
                )));
            }
            if !members.contains(config.node_id) {
                removed_from.push((group, members));
            }
            continue;
        }
        if state.last_index == 0 && !config.catch_up_before_voting {
            let conf_state = concord_storage::raft::prelude::ConfState::from((
                config.voters.clone(),
                Vec::<u64>::new(),
            ));
            batch.set_conf_state(group, conf_state, 0);
        }
    }
    if !removed_from.is_empty() && removed_from.len() == config.groups.len() {
        let (group, members) = &removed_from[0];
        return Err(StartError::Config(format!(
            "node {} was removed from the cluster its data belongs to (group {group}'s voters \
             are {:?}, its learners {:?}); start it with an empty data directory to join again",
            config.node_id, members.voters, members.learners
        )));
    }
    if !batch.is_empty() {
        stores.log.write(batch)?;
        stores.log.flush()?;
    }
    Ok(())
}
