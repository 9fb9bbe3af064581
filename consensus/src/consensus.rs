//! The replication layer as the engine sees it.

use std::time::Duration;

use bytes::Bytes;
use concord_storage::GroupId;

use crate::{GroupHealth, GroupStatus, NodeId, Pending, ProposeError};

/// Replicates commands per group and applies them to the group's state machine.
///
/// Two implementations: [`crate::RaftNode`] (raft-rs, many groups, in-process or networked
/// peers) and [`crate::SoloNode`] (one node, no raft: append, sync, apply with the same
/// batching), so the cost of raft itself can be measured against it.
pub trait Consensus: Send + Sync + 'static {
    /// Proposes `command` to `group`; the future resolves to the command's own result once it
    /// has applied on this node (or to why it did not). A follower forwards the command to
    /// the group's leader and answers with the result of its own apply of the entry.
    fn propose(&self, group: GroupId, command: Bytes) -> Pending<Bytes>;

    /// Proposes every command of `commands` to `group` as one batch: they are queued together
    /// (or refused together: `Overloaded` when the group's queue has no room for all of them),
    /// in order, and the future resolves once each has its own result, in the batch's order,
    /// each as [`Consensus::propose`] would have answered it alone. One future and one wake
    /// for the whole batch instead of one per command.
    fn propose_batch(
        &self,
        group: GroupId,
        commands: Vec<Bytes>,
    ) -> Pending<Vec<Result<Bytes, ProposeError>>>;

    /// Proposes an operator's command to `group` (replacing the state machine's logic, say):
    /// it goes into an entry of its own, and every replica hands it to
    /// [`crate::StateMachine::apply_admin`] instead of `apply`, so no client command can
    /// pass for one. Resolves like [`Consensus::propose`].
    fn propose_admin(&self, group: GroupId, command: Bytes) -> Pending<Bytes>;

    /// A linearizable read barrier (ReadIndex, asked of the leader on a follower): resolves to
    /// an applied index such that the group's state store on this node, read now, reflects
    /// every write acknowledged (by any node) before the call.
    fn read_barrier(&self, group: GroupId) -> Pending<u64>;

    /// A read barrier that skips the quorum round while this node leads `group` with a
    /// lease: it resolves once the local state has applied through the leader's commit
    /// index. Without a lease (a follower, a new leader, a leader cut off from its quorum for
    /// most of an election timeout, a leader handing its leadership over or, once it told a
    /// successor to take it, for the rest of that term, a node without check-quorum) it is
    /// [`Consensus::read_barrier`]. A lease holds while a quorum acknowledged a heartbeat
    /// sent within the last nine tenths of the election timeout less one tick: a follower
    /// votes for no other node until it has ticked an election timeout after a heartbeat (its
    /// first tick may come at once), and a member that restarts votes for no one for as many
    /// ticks, so this is safe while clocks run at rates within 10% of each other.
    fn lease_read_barrier(&self, group: GroupId) -> Pending<u64>;

    /// The status of `group` on this node.
    fn status(&self, group: GroupId) -> Result<GroupStatus, ProposeError>;

    /// Whether `group` serves on this node: [`Consensus::status`] without its lists, for
    /// checks over every group. The default derives it from the status of `node`, this node.
    fn health(&self, group: GroupId, node: NodeId) -> Result<GroupHealth, ProposeError> {
        self.status(group)
            .map(|status| GroupHealth::of(&status, node))
    }

    /// The groups this node hosts, ascending.
    fn groups(&self) -> Vec<GroupId>;

    /// How long the oldest log write still in progress on this node has been running; `None`
    /// while none is (and from an implementation that cannot tell). A write that does not
    /// return (a stalled disk) holds every group of its worker, and its callers, without
    /// anything else showing it.
    fn log_write_in_progress_for(&self) -> Option<Duration> {
        None
    }

    /// Whether this node's log writes stall: one has been running longer than
    /// [`crate::LOG_WRITE_STALLED_AFTER`], or one that did returned less than
    /// [`crate::LOG_WRITE_STALL_HOLD`] ago (`false` from an implementation that cannot tell).
    fn log_write_stalled(&self) -> bool {
        false
    }

    /// Stops accepting work, answers everything queued, flushes the stores and joins the
    /// threads. Idempotent.
    fn shutdown(&self);
}
