//! What a node publishes about each group, read without stopping the raft loop.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use concord_storage::GroupId;
use parking_lot::Mutex;

use crate::NodeId;
use crate::cache_padded::CachePadded;
use crate::membership::GroupMembers;
use crate::metrics::GroupGauges;

/// A snapshot of one group's progress.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupStatus {
    /// The group.
    pub group: GroupId,
    /// The leader this node knows of (0 = none).
    pub leader: NodeId,
    /// `true` if this node leads the group.
    pub is_leader: bool,
    /// Current term.
    pub term: u64,
    /// Highest index known committed.
    pub commit_index: u64,
    /// Highest index applied to the state machine.
    pub applied_index: u64,
    /// Highest index in the log.
    pub last_log_index: u64,
    /// `last_log_index - applied_index`.
    pub apply_lag: u64,
    /// Why the group stopped, if it did.
    pub stopped: Option<String>,
    /// While this node leads the group (raft): how far each voter's log is known to match
    /// the leader's, this node's included, as of the last tick; empty otherwise.
    pub voters: Vec<VoterProgress>,
    /// The group's voters and learners, as this node last applied its configuration.
    pub members: GroupMembers,
    /// `true` while this node fetches or installs a snapshot of the group.
    pub installing_snapshot: bool,
    /// `true` while this node, started without the group's data (wiped, or new), has not yet
    /// applied what its leader said the group had committed: it votes for no one until then,
    /// so the group survives one fewer failure meanwhile.
    pub catching_up: bool,
    /// `true` while the group sleeps on this node: nothing happened in it for a while, so it
    /// is not ticked and exchanges no heartbeats until something does.
    pub asleep: bool,
}

/// The part of a group's status that says whether it serves on this node and how far behind
/// it is, read without copying its lists: what a readiness probe or a summary of thousands of
/// groups needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupHealth {
    /// The leader this node knows of (0 = none).
    pub leader: NodeId,
    /// `true` if this node leads the group.
    pub is_leader: bool,
    /// `true` once the group stopped (see [`GroupStatus::stopped`] for why).
    pub stopped: bool,
    /// `last_log_index - applied_index`.
    pub apply_lag: u64,
    /// While this node leads the group: the most entries any voter is known to be behind
    /// (see [`GroupStatus::voter_lag`]); 0 otherwise.
    pub voter_lag: u64,
    /// `true` while this node fetches or installs a snapshot of the group.
    pub installing_snapshot: bool,
    /// See [`GroupStatus::catching_up`].
    pub catching_up: bool,
    /// Whether this node is in the group's configuration as it last applied it; `None` while
    /// it knows no configuration (a solo node's group, or one a joining member awaits the
    /// first snapshot of).
    pub member: Option<bool>,
    /// `true` while a membership change is under way (a joint configuration).
    pub changing_membership: bool,
    /// `true` while the group sleeps on this node.
    pub asleep: bool,
}

impl GroupHealth {
    /// The health a full status says.
    pub fn of(status: &GroupStatus, node: NodeId) -> Self {
        GroupHealth {
            leader: status.leader,
            is_leader: status.is_leader,
            stopped: status.stopped.is_some(),
            apply_lag: status.apply_lag,
            voter_lag: status.voter_lag(),
            installing_snapshot: status.installing_snapshot,
            catching_up: status.catching_up,
            member: (!status.members.is_empty()).then(|| status.members.stays(node)),
            changing_membership: status.members.is_joint(),
            asleep: status.asleep,
        }
    }
}

impl GroupStatus {
    /// While this node leads the group, the most entries any voter is known to be behind its
    /// last log index; 0 otherwise.
    pub fn voter_lag(&self) -> u64 {
        self.voters
            .iter()
            .map(|voter| self.last_log_index.saturating_sub(voter.matched_index))
            .max()
            .unwrap_or(0)
    }
}

/// How far one voter's log is known to match its leader's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VoterProgress {
    /// The voter.
    pub node: NodeId,
    /// The highest index known to be in its log.
    pub matched_index: u64,
}

/// Atomics the raft worker and the applier write and anyone may read, and the group's metric
/// handles.
pub(crate) struct SharedGroupStatus {
    pub(crate) leader: AtomicU64,
    pub(crate) is_leader: AtomicBool,
    pub(crate) term: AtomicU64,
    // The indexes move every round (commit and last log index on the raft thread, applied
    // index on the apply thread); each sits on lines of its own so that these writes do not
    // evict the leadership and stop flags every proposal reads.
    pub(crate) commit_index: CachePadded<AtomicU64>,
    pub(crate) applied_index: CachePadded<AtomicU64>,
    pub(crate) last_log_index: CachePadded<AtomicU64>,
    /// The applied index as of the state store's last flush (written once per flush): the
    /// log may be compacted below it, never past it.
    pub(crate) durable_applied_index: AtomicU64,
    pub(crate) stopped: Mutex<Option<String>>,
    /// See [`GroupStatus::voters`]; written by the worker once per tick while it leads,
    /// through [`SharedGroupStatus::set_voters`].
    voters: Mutex<Vec<VoterProgress>>,
    /// The least matched index of `voters` (`u64::MAX` while there are none), so that a
    /// voter's lag is read without the lock.
    least_matched_index: AtomicU64,
    /// See [`GroupStatus::members`]; written by the worker when the configuration changes.
    pub(crate) members: Mutex<GroupMembers>,
    /// See [`GroupStatus::installing_snapshot`].
    pub(crate) installing_snapshot: AtomicBool,
    /// See [`GroupStatus::catching_up`]; written by the worker after a message or an apply
    /// that may change it.
    pub(crate) catching_up: AtomicBool,
    /// See [`GroupStatus::asleep`].
    pub(crate) asleep: AtomicBool,
    /// Set once the group's configuration no longer has this node (a change removing it was
    /// applied): requests are refused at the door, readable without the lock.
    pub(crate) removed: AtomicBool,
    /// How many of the node's groups no longer have the node, shared by all of them: a node
    /// removed from the cluster is removed from every group, and warns once, not once per
    /// group.
    node_removals: Arc<AtomicUsize>,
    /// `stopped.is_some()`, readable without the lock on the proposal path.
    pub(crate) is_stopped: AtomicBool,
    /// Reads admitted and not yet answered (bounded by `NodeConfig::max_waiting_reads`).
    pub(crate) waiting_reads: AtomicUsize,
    /// `None` on a node with too many groups for gauges per group.
    pub(crate) gauges: Option<GroupGauges>,
}

impl SharedGroupStatus {
    /// `per_group_gauges`: the node has few enough groups for gauges per group;
    /// `node_removals`: the count of the node's groups that no longer have it, shared by the
    /// statuses of all its groups.
    pub(crate) fn new(
        group: GroupId,
        per_group_gauges: bool,
        node_removals: Arc<AtomicUsize>,
    ) -> Self {
        SharedGroupStatus {
            leader: AtomicU64::new(0),
            is_leader: AtomicBool::new(false),
            term: AtomicU64::new(0),
            commit_index: CachePadded::new(AtomicU64::new(0)),
            applied_index: CachePadded::new(AtomicU64::new(0)),
            last_log_index: CachePadded::new(AtomicU64::new(0)),
            durable_applied_index: AtomicU64::new(0),
            stopped: Mutex::new(None),
            voters: Mutex::new(Vec::new()),
            least_matched_index: AtomicU64::new(u64::MAX),
            members: Mutex::new(GroupMembers::default()),
            installing_snapshot: AtomicBool::new(false),
            catching_up: AtomicBool::new(false),
            asleep: AtomicBool::new(false),
            removed: AtomicBool::new(false),
            node_removals,
            is_stopped: AtomicBool::new(false),
            waiting_reads: AtomicUsize::new(0),
            gauges: per_group_gauges.then(|| GroupGauges::new(group)),
        }
    }

    /// Publishes what a group holds when its node opens it: the state store's applied index
    /// (durable: it is what survived) and the log's last index.
    pub(crate) fn opened(&self, applied_index: u64, last_log_index: u64) {
        self.applied_index.store(applied_index, Ordering::Release);
        self.durable_applied_index
            .store(applied_index, Ordering::Release);
        self.set_last_log_index(last_log_index);
    }

    /// Publishes the applied index after a batch applied.
    pub(crate) fn set_applied(&self, applied_index: u64) {
        self.applied_index.store(applied_index, Ordering::Release);
        if let Some(gauges) = &self.gauges {
            gauges.last_applied.set(applied_index as f64);
            let last_log_index = self.last_log_index.load(Ordering::Acquire);
            gauges.set_apply_lag(last_log_index, applied_index);
        }
    }

    /// Publishes the last log index after a persist.
    pub(crate) fn set_last_log_index(&self, last_log_index: u64) {
        self.last_log_index.store(last_log_index, Ordering::Release);
        if let Some(gauges) = &self.gauges {
            gauges.last_log_index.set(last_log_index as f64);
            let applied_index = self.applied_index.load(Ordering::Acquire);
            gauges.set_apply_lag(last_log_index, applied_index);
        }
    }

    /// Publishes leadership and term.
    pub(crate) fn set_leader(&self, leader: u64, is_leader: bool, term: u64) {
        self.leader.store(leader, Ordering::Release);
        self.is_leader.store(is_leader, Ordering::Release);
        self.term.store(term, Ordering::Release);
        if let Some(gauges) = &self.gauges {
            gauges.leader.set(leader as f64);
            gauges.term.set(term as f64);
        }
    }
    pub(crate) fn snapshot(&self, group: GroupId) -> GroupStatus {
        let applied_index = self.applied_index.load(Ordering::Acquire);
        let last_log_index = self.last_log_index.load(Ordering::Acquire);
        GroupStatus {
            group,
            leader: self.leader.load(Ordering::Acquire),
            is_leader: self.is_leader.load(Ordering::Acquire),
            term: self.term.load(Ordering::Acquire),
            commit_index: self.commit_index.load(Ordering::Acquire),
            applied_index,
            last_log_index,
            apply_lag: last_log_index.saturating_sub(applied_index),
            stopped: self.stopped.lock().clone(),
            voters: self.voters.lock().clone(),
            members: self.members.lock().clone(),
            installing_snapshot: self.installing_snapshot.load(Ordering::Acquire),
            catching_up: self.catching_up.load(Ordering::Acquire),
            asleep: self.asleep.load(Ordering::Acquire),
        }
    }

    /// [`GroupHealth`] from the atomics and the members' lock, copying nothing.
    pub(crate) fn health(&self) -> GroupHealth {
        let applied_index = self.applied_index.load(Ordering::Acquire);
        let last_log_index = self.last_log_index.load(Ordering::Acquire);
        let least_matched_index = self.least_matched_index.load(Ordering::Acquire);
        let (configured, changing_membership) = {
            let members = self.members.lock();
            (!members.is_empty(), members.is_joint())
        };
        GroupHealth {
            leader: self.leader.load(Ordering::Acquire),
            is_leader: self.is_leader.load(Ordering::Acquire),
            stopped: self.is_stopped(),
            apply_lag: last_log_index.saturating_sub(applied_index),
            voter_lag: last_log_index.saturating_sub(least_matched_index),
            installing_snapshot: self.installing_snapshot.load(Ordering::Acquire),
            catching_up: self.catching_up.load(Ordering::Acquire),
            member: configured.then(|| !self.removed.load(Ordering::Acquire)),
            changing_membership,
            asleep: self.asleep.load(Ordering::Acquire),
        }
    }

    /// Publishes how far each voter's log matches (empty: this node does not lead).
    pub(crate) fn set_voters(&self, voters: Vec<VoterProgress>) {
        let least_matched_index = voters
            .iter()
            .map(|voter| voter.matched_index)
            .min()
            .unwrap_or(u64::MAX);
        // The group's worker is the only writer of both.
        *self.voters.lock() = voters;
        self.least_matched_index
            .store(least_matched_index, Ordering::Release);
    }

    /// Publishes the members of `group`, as this node (`node`) applied its configuration.
    /// Returns whether this was the first of the node's groups to remove it (then it warns;
    /// the removals from its other groups are logged at debug).
    pub(crate) fn set_members(&self, group: GroupId, members: GroupMembers, node: NodeId) -> bool {
        let removed = !members.is_empty() && !members.stays(node);
        let was_removed = self.removed.swap(removed, Ordering::AcqRel);
        *self.members.lock() = members;
        match (was_removed, removed) {
            (false, true) if self.node_removals.fetch_add(1, Ordering::AcqRel) == 0 => {
                tracing::warn!(
                    node,
                    group,
                    "this node was removed from the group's membership; its removals from \
                     its other groups are logged at debug"
                );
                true
            }
            (false, true) => {
                tracing::debug!(
                    node,
                    group,
                    "this node was removed from the group's membership"
                );
                false
            }
            (true, false) => {
                self.node_removals.fetch_sub(1, Ordering::AcqRel);
                false
            }
            _ => false,
        }
    }

    /// Marks the group stopped with `reason` (the first reason wins).
    pub(crate) fn stop(&self, reason: String) {
        if self.stop_without_a_line(&reason) {
            tracing::error!(%reason, "group stopped");
        }
    }

    /// [`SharedGroupStatus::stop`] with no line in the log: whether this stopped the group.
    fn stop_without_a_line(&self, reason: &str) -> bool {
        let mut stopped = self.stopped.lock();
        if stopped.is_some() {
            return false;
        }
        *stopped = Some(reason.to_string());
        self.is_stopped.store(true, Ordering::Release);
        true
    }

    /// `true` once stopped; one atomic load, for the loop's every-round checks.
    pub(crate) fn is_stopped(&self) -> bool {
        self.is_stopped.load(Ordering::Acquire)
    }

    pub(crate) fn stopped_reason(&self) -> Option<String> {
        if !self.is_stopped.load(Ordering::Acquire) {
            return None;
        }
        self.stopped.lock().clone()
    }
}

/// Stops every group of `statuses` for one `reason`, with one line for all of them: a failed
/// log write or state flush stops every group of a worker or node at once, and a line each
/// would be thousands. Returns how many were running.
pub(crate) fn stop_groups<'a>(
    statuses: impl IntoIterator<Item = &'a SharedGroupStatus>,
    reason: &str,
) -> usize {
    let stopped = (statuses.into_iter())
        .filter(|status| status.stop_without_a_line(reason))
        .count();
    if stopped > 0 {
        tracing::error!(groups = stopped, %reason, "groups stopped");
    }
    stopped
}

#[cfg(test)]
mod tests {
    use concord_storage::raft::prelude::ConfState;

    use super::*;

    /// The statuses of `count` groups of one node, none of them led here.
    fn followers_of_one_node(count: GroupId) -> Vec<SharedGroupStatus> {
        let removals = Arc::new(AtomicUsize::new(0));
        (0..count)
            .map(|group| SharedGroupStatus::new(group, false, removals.clone()))
            .collect()
    }

    fn members(voters: &[NodeId]) -> GroupMembers {
        let mut conf_state = ConfState::default();
        conf_state.set_voters(voters.to_vec());
        GroupMembers::from_conf_state(&conf_state)
    }

    #[test]
    fn a_node_removed_from_every_group_warns_once() {
        let statuses = followers_of_one_node(3);
        for (group, status) in (0..).zip(&statuses) {
            assert!(!status.set_members(group, members(&[1, 2, 3]), 3));
        }
        let warned: Vec<bool> = (0..)
            .zip(&statuses)
            .map(|(group, status)| status.set_members(group, members(&[1, 2]), 3))
            .collect();
        assert_eq!(warned, [true, false, false], "one warning for three groups");
        assert!(statuses.iter().all(|s| s.removed.load(Ordering::Acquire)));
        // Told again, a group that removed the node already does not count it twice.
        assert!(!statuses[0].set_members(0, members(&[1, 2]), 3));
        // Added back to every group and removed again: a new removal, a new warning.
        for (group, status) in (0..).zip(&statuses) {
            assert!(!status.set_members(group, members(&[1, 2, 3]), 3));
        }
        assert!(statuses.iter().all(|s| !s.removed.load(Ordering::Acquire)));
        assert!(statuses[1].set_members(1, members(&[1, 2]), 3));
    }

    /// The health read from the atomics says what the full status says, in each state a
    /// readiness check branches on.
    #[test]
    fn a_groups_health_agrees_with_its_status() {
        const NODE: NodeId = 3;
        let status = &followers_of_one_node(1)[0];
        let agrees = |why: &str| {
            let health = status.health();
            assert_eq!(health, GroupHealth::of(&status.snapshot(0), NODE), "{why}");
            health
        };
        let fresh = agrees("a fresh group");
        assert_eq!((fresh.leader, fresh.member), (0, None));
        status.set_leader(NODE, true, 2);
        status.opened(5, 9);
        assert_eq!(agrees("led here, behind").apply_lag, 4);
        status.set_members(0, members(&[1, 2, NODE]), NODE);
        assert_eq!(agrees("a member").member, Some(true));
        let progress = |node, matched_index| VoterProgress {
            node,
            matched_index,
        };
        status.set_voters(vec![progress(1, 9), progress(2, 6), progress(NODE, 9)]);
        assert_eq!(agrees("a voter behind").voter_lag, 3);
        status.set_voters(vec![]);
        assert_eq!(agrees("no longer leading").voter_lag, 0);
        let mut joint = members(&[1, 2, NODE]);
        joint.outgoing_voters = vec![1, 2, 4];
        status.set_members(0, joint, NODE);
        assert!(agrees("changing membership").changing_membership);
        status.asleep.store(true, Ordering::Release);
        assert!(agrees("asleep").asleep);
        status.installing_snapshot.store(true, Ordering::Release);
        assert!(agrees("installing").installing_snapshot);
        status.set_members(0, members(&[1, 2]), NODE);
        assert_eq!(agrees("removed").member, Some(false));
        status.stop("log write failed".into());
        assert!(agrees("stopped").stopped);
    }

    #[test]
    fn groups_stopped_together_keep_the_first_reason_each() {
        let statuses = followers_of_one_node(4);
        statuses[1].stop("apply failed".into());
        assert_eq!(stop_groups(&statuses, "log write failed"), 3);
        let reasons: Vec<Option<String>> = statuses.iter().map(|s| s.stopped_reason()).collect();
        assert_eq!(reasons[1].as_deref(), Some("apply failed"));
        for reason in [&reasons[0], &reasons[2], &reasons[3]] {
            assert_eq!(reason.as_deref(), Some("log write failed"));
        }
        assert_eq!(stop_groups(&statuses, "again"), 0, "each stops once");
    }
}
