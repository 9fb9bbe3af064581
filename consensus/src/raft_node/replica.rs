//! A group replicated by raft-rs: the [`Replica`] over a `RawNode`, following raft-rs's
//! documented `Ready` order — messages first (a leader replicates while it persists), then
//! entries and hard state persisted, then the messages that waited for the persist.

use std::sync::Arc;

use concord_storage::raft::{self, RawNode, Ready, StateRole};
use concord_storage::{GroupId, LogStore};

use super::storage::GroupStorage;
use crate::node_loop::group::GroupState;
use crate::node_loop::replica::{Replica, Round, StepOutcome, queue_messages};
use crate::transport::GroupMessage;
use crate::{NodeConfig, ProposeError, StartError};

/// One raft group on this node.
pub(crate) struct RaftReplica {
    raw: RawNode<GroupStorage>,
    /// The commit index moved in `advance_append`: the hard state must be written again.
    commit_dirty: bool,
    /// The `Ready` collected before the round's write, with the `(index, term)` of the
    /// entries it persists, finished after the write.
    in_flight: Option<(Ready, Vec<(u64, u64)>)>,
    /// The highest index every voter has persisted, as a leader of this group last said:
    /// a follower compacts no further (0 until a leader says).
    replicated_floor: u64,
}

impl RaftReplica {
    /// Opens `group` from `log`; the state store has applied through `applied`.
    pub(crate) fn open(
        config: &NodeConfig,
        group: GroupId,
        log: Arc<dyn LogStore>,
        applied: u64,
        logger: &slog::Logger,
    ) -> Result<Self, StartError> {
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
        let storage = GroupStorage::new(group, log, applied)?;
        let raw = RawNode::new(&raft_config, storage, logger)
            .map_err(|source| StartError::Raft { group, source })?;
        Ok(RaftReplica {
            raw,
            commit_dirty: false,
            in_flight: None,
            replicated_floor: 0,
        })
    }

    fn not_leader(&self, group: GroupId) -> ProposeError {
        let leader = self.raw.raft.leader_id;
        ProposeError::NotLeader {
            group,
            leader: (leader != 0).then_some(leader),
        }
    }

    /// On a leader, the highest index every voter has persisted (its own included); 0
    /// otherwise.
    fn leader_floor(&self) -> u64 {
        let raft = &self.raw.raft;
        if raft.state != StateRole::Leader {
            return 0;
        }
        raft.prs()
            .iter()
            .map(|(_, progress)| progress.matched)
            .min()
            .unwrap_or(0)
    }

    fn publish_leadership(&self, group: &mut GroupState) {
        let raft = &self.raw.raft;
        let is_leader = raft.state == StateRole::Leader;
        group
            .status
            .set_leader(raft.leader_id, is_leader, raft.term);
        if !is_leader {
            group.lost_leadership(&self.not_leader(group.id));
        }
    }
}

impl Replica for RaftReplica {
    fn step(&mut self, message: GroupMessage) -> StepOutcome {
        let GroupMessage {
            message,
            replicated_floor,
            ..
        } = message;
        let from = message.from;
        let message_term = message.term;
        // raft-rs asserts on some impossible inputs (a commit index past the log, say). A peer
        // must not be able to crash the node with one: the group stops instead, since its raft
        // state may be half-updated.
        let raw = &mut self.raw;
        let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| raw.step(message)));
        match stepped {
            Ok(Ok(())) => {
                // Only the current leader's word counts; a floor never goes back (what every
                // voter persisted stays persisted).
                let raft = &self.raw.raft;
                if from == raft.leader_id && message_term == raft.term {
                    self.replicated_floor = self.replicated_floor.max(replicated_floor);
                }
                StepOutcome::Stepped
            }
            // A message raft-rs refuses (stale term, unknown peer) is dropped.
            Ok(Err(error)) => StepOutcome::Rejected(error.to_string()),
            Err(_) => StepOutcome::Malformed(format!(
                "raft rejected a malformed message from node {from} by panicking"
            )),
        }
    }

    fn campaign(&mut self) {
        let _ = self.raw.campaign();
    }

    fn tick(&mut self) {
        self.raw.tick();
    }

    fn check_leader(&self, group: GroupId) -> Result<(), ProposeError> {
        if self.raw.raft.state == StateRole::Leader {
            Ok(())
        } else {
            Err(self.not_leader(group))
        }
    }

    fn propose(&mut self, group: GroupId, data: Vec<u8>) -> Result<(u64, u64), ProposeError> {
        match self.raw.propose(Vec::new(), data) {
            Ok(()) => Ok((self.raw.raft.raft_log.last_index(), self.raw.raft.term)),
            Err(raft::Error::ProposalDropped) => Err(self.not_leader(group)),
            Err(other) => Err(ProposeError::Stopped {
                group,
                reason: other.to_string(),
            }),
        }
    }

    fn read_index(&mut self, read_id: u64) -> Option<u64> {
        self.raw.read_index(read_id.to_le_bytes().to_vec());
        None
    }

    fn has_ready(&self) -> bool {
        self.raw.has_ready()
    }

    fn collect(&mut self, group: &mut GroupState, round: &mut Round) -> bool {
        let mut ready = self.raw.ready();
        if ready.ss().is_some() {
            self.publish_leadership(group);
        }
        let floor = self.leader_floor();
        queue_messages(&mut round.send_now, group.id, floor, ready.take_messages());
        if !ready.snapshot().is_empty() {
            group
                .status
                .stop("received a snapshot, which this version cannot install".into());
            return false;
        }
        round.push_committed(group.id, ready.take_committed_entries());
        for read in ready.take_read_states() {
            if let Ok(bytes) = <[u8; 8]>::try_from(read.request_ctx.as_slice()) {
                group.read_index_known(u64::from_le_bytes(bytes), read.index);
            }
        }
        let entries = ready.take_entries();
        group.appending(&entries);
        let persisting = entries.iter().map(|e| (e.index, e.term)).collect();
        round.batch.append(group.id, entries);
        if ready.hs().is_some() || self.commit_dirty {
            round
                .batch
                .set_hard_state(group.id, self.raw.raft.hard_state());
            self.commit_dirty = false;
        }
        self.in_flight = Some((ready, persisting));
        true
    }

    fn persisted(&mut self, group: &mut GroupState, round: &mut Round) {
        let Some((mut ready, persisting)) = self.in_flight.take() else {
            return;
        };
        // raft reads what it just persisted from the storage after advance_append.
        self.raw.mut_store().persisted(&persisting);
        let floor = self.leader_floor();
        let after_write = &mut round.send_after_write;
        queue_messages(
            after_write,
            group.id,
            floor,
            ready.take_persisted_messages(),
        );
        let mut light = self.raw.advance_append(ready);
        if let Some(commit) = light.commit_index() {
            group
                .status
                .commit_index
                .store(commit, std::sync::atomic::Ordering::Release);
            self.commit_dirty = true;
        }
        queue_messages(after_write, group.id, floor, light.take_messages());
        round.push_committed(group.id, light.take_committed_entries());
    }

    fn compacted(&mut self, compact_index: u64) {
        self.raw.mut_store().compacted(compact_index);
    }

    fn applied(&mut self, applied_index: u64) {
        self.raw.advance_apply_to(applied_index);
    }

    fn first_index(&self) -> u64 {
        self.raw.raft.raft_log.store.first_index
    }

    fn replicated_bound(&self) -> u64 {
        // A voter catches up from the log (there are no snapshots yet), and a follower that
        // becomes leader must still hold what the others lack: on a leader from its own view,
        // on a follower from the leader's word.
        if self.raw.raft.state == StateRole::Leader {
            self.leader_floor()
        } else {
            self.replicated_floor
        }
    }
}
