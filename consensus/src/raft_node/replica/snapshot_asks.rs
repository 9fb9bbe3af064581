//! Snapshots on the replica's side: what a leader keeps of the log for followers sent a
//! snapshot's ticket, how a follower whose log was lost asks for one, and how a follower
//! holds a received one until its state is installed.

use concord_storage::raft::prelude::{Message, MessageType};
use concord_storage::raft::{Ready, StateRole};

use super::RaftReplica;
use crate::NodeId;
use crate::node_loop::group::GroupState;
use crate::raft_node::snapshot_receipt::SnapshotReceipt;

impl RaftReplica {
    /// On a leader, the highest index every voter that keeps up has persisted (its own
    /// included); 0 otherwise. A voter more than `snapshot_lag_entries` behind the last index
    /// does not count: it will be sent a snapshot rather than the log. A voter sent a
    /// snapshot's ticket counts as at the ticket's index until it gets past it: the entries
    /// after it are what it needs once the state is installed, and with them gone (the group
    /// writes on while it installs) it would be sent the whole state again.
    pub(super) fn leader_floor(&self) -> u64 {
        let raft = &self.raw.raft;
        if raft.state != StateRole::Leader {
            return 0;
        }
        let last_index = raft.raft_log.last_index();
        raft.prs()
            .iter()
            .map(|(&node, progress)| progress.matched.max(self.ticket_sent_to(node)))
            .filter(|&held| held + self.snapshot_lag_entries >= last_index)
            .min()
            .unwrap_or(last_index)
    }

    /// Records that a snapshot's ticket for `index` went to `to`.
    pub(super) fn ticket_sent(&mut self, to: NodeId, index: u64) {
        match self.tickets_sent.iter_mut().find(|(node, _)| *node == to) {
            Some(sent) => sent.1 = index,
            None => self.tickets_sent.push((to, index)),
        }
    }

    /// The index of the last snapshot ticket sent to `node` while leading (0: none).
    pub(super) fn ticket_sent_to(&self, node: NodeId) -> u64 {
        self.tickets_sent
            .iter()
            .find(|&&(to, _)| to == node)
            .map_or(0, |&(_, index)| index)
    }

    /// Tells leader `to`, which believes this node holds its log through `believed` while it
    /// holds it only through `last_index`, to send a snapshot: a rejected append that asks for
    /// one (raft-rs's own request needs a log of the current term, which a lost log lacks).
    /// Sent on every such heartbeat until the leader acts on it.
    pub(super) fn ask_for_snapshot(&mut self, to: NodeId, believed: u64, last_index: u64) {
        let raft = &mut self.raw.raft;
        let mut reply = Message::default();
        reply.set_msg_type(MessageType::MsgAppendResponse);
        reply.to = to;
        reply.from = raft.id;
        reply.term = raft.term;
        reply.index = believed;
        reply.reject = true;
        reply.reject_hint = last_index;
        // 0 would mean "no snapshot wanted".
        reply.request_snapshot = believed.max(1);
        raft.msgs.push(reply);
    }

    /// A log restarted after its state at start (`node_loop/recovery.rs`) holds term 0 at the
    /// restart point, which no leader's entry matches. The leader counts this node as holding
    /// that far (it acknowledged as much, or raft-rs acknowledges its commit index), so it
    /// drops raft-rs's rejection of its append as stale, forever. A rejection that reaches
    /// back to the restart point asks for a snapshot instead. (raft-rs's own
    /// `request_snapshot` needs a last entry of the current term, which this log lacks.)
    /// Called after every append a follower steps: the rejection is looked for first (there
    /// is rarely one), the restart point's term only then.
    pub(super) fn ask_for_snapshot_past_restart(&mut self, leader: NodeId) {
        let raft = &mut self.raw.raft;
        let restart_index = raft.raft_log.store().first_index - 1;
        let Some(rejection) = raft.msgs.iter().rposition(|reply| {
            reply.to == leader
                && reply.get_msg_type() == MessageType::MsgAppendResponse
                && reply.reject
                && reply.reject_hint <= restart_index
        }) else {
            return;
        };
        if restart_index > 0 && matches!(raft.raft_log.term(restart_index), Ok(0)) {
            raft.msgs[rejection].request_snapshot = restart_index;
        }
    }

    /// First sight of a snapshot in `ready`: holds it until the state is installed.
    pub(super) fn hold_snapshot(&mut self, group: &GroupState, ready: Ready) {
        let term = ready.snapshot().get_metadata().term;
        let mut receipt = Box::new(SnapshotReceipt::new(ready, self.raw.raft.leader_id));
        let durable = group
            .status
            .durable_applied_index
            .load(std::sync::atomic::Ordering::Acquire);
        if durable >= receipt.index() {
            // The state holds the snapshot already, durably: a leader sends a follower that
            // asked more than once a ticket for each ask, and the state the first one fetched
            // may be past the second one's index. Fetching it again would change nothing.
            tracing::debug!(
                group = group.id,
                index = receipt.index(),
                term,
                durable_applied_index = durable,
                "received a snapshot the state holds already"
            );
            receipt.installed();
            self.installing = Some(receipt);
            return;
        }
        tracing::debug!(
            group = group.id,
            index = receipt.index(),
            term,
            source = receipt.source(),
            "received a snapshot; fetching the state"
        );
        group
            .status
            .installing_snapshot
            .store(true, std::sync::atomic::Ordering::Release);
        self.installing = Some(receipt);
    }
}
