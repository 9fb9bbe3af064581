//! [`SoloNode`]: one node, no raft. Commands are batched into entries, appended to the log
//! with one sync per round for all groups, and applied off the loop — the same pipeline as
//! [`crate::RaftNode`] without replication, so the two can be compared and raft's own cost
//! seen.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;

use bytes::Bytes;
use concord_storage::raft::prelude::Entry;
use concord_storage::{GroupId, LogStore, Stores};
use parking_lot::Mutex;

use crate::mailbox::SnapshotFailure;
use crate::node_loop::NodeShared;
use crate::node_loop::group::GroupState;
use crate::node_loop::replica::{Proposed, Replica, Round, StepOutcome};
use crate::proposal_queue::CommandKind;
use crate::transport::GroupMessage;
use crate::{
    Consensus, GroupStatus, NodeConfig, NodeId, Pending, ProposeError, StartError,
    StateMachineFactory,
};

/// The term every solo entry carries: there are no elections.
const SOLO_TERM: u64 = 1;

/// A single node that appends, syncs and applies without raft.
pub struct SoloNode {
    shared: Arc<NodeShared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl SoloNode {
    /// Opens every group from `stores`, re-applies logged entries the state has not seen, and
    /// starts the worker and apply threads. `config.voters` must be just this node.
    pub fn start(
        config: NodeConfig,
        stores: Stores,
        factory: Arc<dyn StateMachineFactory>,
    ) -> Result<Arc<SoloNode>, StartError> {
        config.validate().map_err(StartError::Config)?;
        if config.voters != [config.node_id] {
            return Err(StartError::Config(
                "a solo node's voters must be exactly itself".into(),
            ));
        }
        let shared = Arc::new(NodeShared::new(config));
        for handle in shared.entrance.groups.values() {
            // Always the leader: there is nobody else.
            handle
                .status
                .set_leader(shared.config.node_id, true, SOLO_TERM);
        }
        let log = stores.log.clone();
        let threads = crate::node_loop::start_workers(
            &shared,
            &stores,
            &factory,
            None,
            "solo",
            |group, applied| SoloReplica::open(group, log.clone(), applied),
        )?;
        Ok(Arc::new(SoloNode {
            shared,
            threads: Mutex::new(threads),
        }))
    }
}

impl Consensus for SoloNode {
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
        self.shared.entrance.shutdown(&self.threads);
    }
}

impl Drop for SoloNode {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// One group's log on a solo node: each proposal is the next entry, committed once written.
struct SoloReplica {
    log: Arc<dyn LogStore>,
    last_index: u64,
    /// The first index still in the log (entries below it were compacted).
    first_index: u64,
    /// Entries proposed this round, to be written.
    proposed: Vec<Entry>,
    /// Entries logged but not applied before the node stopped, `(first, last)`: applied first.
    replay: Option<(u64, u64)>,
}

impl SoloReplica {
    fn open(group: GroupId, log: Arc<dyn LogStore>, applied: u64) -> Result<Self, StartError> {
        let state = log.group_state(group)?;
        let replay = (state.last_index > applied).then_some((applied + 1, state.last_index));
        Ok(SoloReplica {
            log,
            last_index: state.last_index,
            first_index: state.first_index(),
            proposed: Vec::new(),
            replay,
        })
    }
}

impl Replica for SoloReplica {
    /// The entries in the round's write: committed once it is durable.
    type Collected = Vec<Entry>;

    fn step(&mut self, _message: GroupMessage) -> StepOutcome {
        StepOutcome::Rejected("a solo node has no peers".into())
    }

    fn campaign(&mut self) {}

    fn leads(&self) -> bool {
        true
    }

    fn voter_progress(&self) -> Vec<crate::VoterProgress> {
        Vec::new()
    }

    fn successor(&self, _reachable: &dyn Fn(NodeId) -> bool) -> Option<(NodeId, bool)> {
        None
    }

    fn caught_up(&self, _node: NodeId) -> bool {
        false
    }

    fn is_transferring(&self) -> bool {
        false
    }

    fn transfer_leadership(&mut self, _node: NodeId) {}

    fn tick(&mut self) {}

    fn check_serving(&self, _group: GroupId) -> Result<(), ProposeError> {
        Ok(())
    }

    fn propose(
        &mut self,
        _group: GroupId,
        data: Vec<u8>,
        _forward_id: u64,
    ) -> Result<Proposed, ProposeError> {
        let mut entry = Entry::default();
        entry.index = self.last_index + 1;
        entry.term = SOLO_TERM;
        entry.data = data.into();
        self.last_index = entry.index;
        self.proposed.push(entry);
        Ok(Proposed::Appended {
            index: self.last_index,
            term: SOLO_TERM,
        })
    }

    fn lease_read_index(
        &self,
        _now: std::time::Instant,
        _peers_quiet: Option<std::time::Duration>,
    ) -> Option<u64> {
        // The only node: everything proposed so far is applied before the read is served.
        Some(self.last_index)
    }

    fn read_index(&mut self, _read_id: u64) -> Option<u64> {
        // Everything proposed so far is applied before the read is served.
        Some(self.last_index)
    }

    fn has_ready(&self) -> bool {
        !self.proposed.is_empty() || self.replay.is_some()
    }

    fn collect(&mut self, group: &mut GroupState, round: &mut Round) -> Option<Vec<Entry>> {
        if let Some((first, last)) = self.replay.take() {
            match self.log.entries(group.id, first, last + 1, None) {
                Ok(entries) => round.push_committed(group.id, entries),
                Err(error) => {
                    group
                        .status
                        .stop(format!("cannot read the log to replay it: {error}"));
                    return None;
                }
            }
        }
        if self.proposed.is_empty() {
            return None;
        }
        let writing = std::mem::take(&mut self.proposed);
        group.appending(&writing, round.now);
        round.batch.append(group.id, writing.clone());
        Some(writing)
    }

    fn persisted(&mut self, group: &mut GroupState, round: &mut Round, entries: Vec<Entry>) {
        if let Some(last) = entries.last() {
            group
                .status
                .commit_index
                .store(last.index, Ordering::Release);
        }
        round.push_committed(group.id, entries);
    }

    fn compacted(&mut self, compact_index: u64) {
        self.first_index = self.first_index.max(compact_index);
    }

    fn applied(&mut self, _applied_index: u64) {}

    fn is_installing(&self) -> bool {
        false
    }

    fn snapshot_wanted(&mut self, _now: std::time::Instant) -> Option<(NodeId, u64)> {
        None
    }

    fn snapshot_done(&mut self, _group: GroupId, _outcome: Result<u64, SnapshotFailure>) {}

    fn first_index(&self) -> u64 {
        self.first_index
    }

    fn replicated_bound(&self) -> u64 {
        u64::MAX
    }

    fn members(&self) -> crate::GroupMembers {
        crate::GroupMembers::default() // No raft configuration.
    }
}
