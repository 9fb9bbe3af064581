//! What varies between the raft and the solo node: the [`Replica`] of each group, which the
//! one node loop drives through the steps of a round.

use concord_storage::raft::prelude::{ConfState, Entry};
use concord_storage::{GroupId, LogBatch};

use super::event_lines::LeadershipChanges;
use super::group::GroupState;
use crate::id_map::IdMap;
use crate::mailbox::SnapshotFailure;
use crate::membership::{GroupMembers, MemberChange};
use crate::transport::GroupMessage;
use crate::{NodeId, ProposeError};

/// How one group is replicated: raft-rs's `RawNode`, or the raft-less solo log.
///
/// The node loop calls these in the order of a round: messages and reads, proposals, the
/// clock, then [`Replica::collect`] for every group with [`Replica::has_ready`], one log
/// write for all groups, and [`Replica::persisted`] for the groups collected.
pub(crate) trait Replica: Send + 'static {
    /// Steps a peer's message for this group.
    fn step(&mut self, message: GroupMessage) -> StepOutcome;

    /// Starts an election now (a single voter need not wait for the timeout).
    fn campaign(&mut self);

    /// `true` while this node leads the group.
    fn leads(&self) -> bool;

    /// While this node leads (raft): how far each voter's log matches, this node's included;
    /// empty otherwise.
    fn voter_progress(&self) -> Vec<crate::VoterProgress>;

    /// While this node leads: the voter best placed to take over (heard from lately and
    /// `reachable` now, with the most of the log; the lowest id among equals) and whether it
    /// has the whole log.
    fn successor(&self, reachable: &dyn Fn(NodeId) -> bool) -> Option<(NodeId, bool)>;

    /// While this node leads: `true` if voter `node` was heard from lately and has the whole
    /// log.
    fn caught_up(&self, node: NodeId) -> bool;

    /// `true` while this node leads and is handing the leadership over: commands wait in the
    /// queue (raft-rs would refuse them) and go to the new leader once it is known.
    fn is_transferring(&self) -> bool;

    /// While this node leads: hands the leadership to `node` (raft-rs's transfer: `node` gets
    /// the rest of the log, then starts an election at once; proposals are refused meanwhile).
    fn transfer_leadership(&mut self, node: NodeId);

    /// Advances the replica's clock by one tick.
    fn tick(&mut self);

    /// `Ok` if this node may take proposals and reads for the group now: it leads, or it
    /// knows the leader to forward them to. The refusal otherwise.
    fn check_serving(&self, group: GroupId) -> Result<(), ProposeError>;

    /// Proposes an entry carrying `data` (encoded commands): appended to this node's log if
    /// it leads, or forwarded to the leader tagged with `forward_id`, which the committed
    /// entry carries back (see [`ForwardTag`]).
    fn propose(
        &mut self,
        group: GroupId,
        data: Vec<u8>,
        forward_id: u64,
    ) -> Result<Proposed, ProposeError>;

    /// Starts (or asks again for) a read barrier. `Some(index)`: wait for apply to reach
    /// `index`; `None`: the index arrives later, through [`GroupState::read_index_known`] with
    /// `read_id`.
    fn read_index(&mut self, read_id: u64) -> Option<u64>;

    /// The index a read may be served at without asking a quorum, if this node holds a lease
    /// now: its commit index (wait for apply to reach it). `None`: ask with
    /// [`Replica::read_index`]. `peers_quiet`: the shortest vote quiet a peer said
    /// ([`Transport::shortest_peer_vote_quiet`](crate::transport::Transport::shortest_peer_vote_quiet)).
    fn lease_read_index(
        &self,
        now: std::time::Instant,
        peers_quiet: Option<std::time::Duration>,
    ) -> Option<u64>;

    /// `true` if the replica has something to persist, send or hand to apply.
    fn has_ready(&self) -> bool;

    /// What [`Replica::collect`] hands to [`Replica::persisted`] across the round's write. It
    /// travels with the round rather than in the replica: written and read back in the same
    /// round, it stays among the round's other buffers instead of on a line of each group's
    /// own that thousands of other groups' work evicts in between.
    type Collected: Send;

    /// Before the round's log write: puts the group's new entries and hard state into
    /// `round.batch`, the messages that may leave before the write into `round.send_now`, and
    /// committed entries into `round.committed`. Returns what [`Replica::persisted`] must be
    /// given after the write, if it must run.
    fn collect(&mut self, group: &mut GroupState, round: &mut Round) -> Option<Self::Collected>;

    /// After the round's log write is durable, with what `collect` returned: messages that had
    /// to wait for it, and entries that committed with it.
    fn persisted(&mut self, group: &mut GroupState, round: &mut Round, collected: Self::Collected);

    /// The entries below `compact_index` were removed from the log.
    fn compacted(&mut self, compact_index: u64);

    /// The apply thread applied through `applied_index`.
    fn applied(&mut self, applied_index: u64);

    /// `true` while a snapshot's state is being fetched and installed: raft's `Ready` carrying
    /// the snapshot is held, so nothing may touch the replica (no message, tick, proposal or
    /// read) until it is persisted; peers resend what they sent meanwhile.
    fn is_installing(&self) -> bool;

    /// A snapshot's state is to be fetched now: `(from node, min index)`; asked every tick.
    fn snapshot_wanted(&mut self, now: std::time::Instant) -> Option<(NodeId, u64)>;

    /// The node [`Replica::snapshot_wanted`] would name now, without taking the fetch: the
    /// worker batches the fetches due from one node.
    fn snapshot_source_due(&self, now: std::time::Instant) -> Option<NodeId> {
        let _ = now;
        None
    }

    /// The fetch and install of the state asked for by [`Replica::snapshot_wanted`] ended:
    /// the applied index installed, or why it was not (it is asked for again later).
    fn snapshot_done(&mut self, group: GroupId, outcome: Result<u64, SnapshotFailure>);

    /// The first index still in the group's log.
    fn first_index(&self) -> u64;

    /// How far the log may be compacted for replication's sake: entries above it may still
    /// be needed by a peer.
    fn replicated_bound(&self) -> u64;

    /// The group's members, as its raft configuration says (solo: none).
    fn members(&self) -> GroupMembers;

    /// Proposes a membership change: appended if this node leads (refused if it would lose
    /// quorum or another change is under way), forwarded to the leader otherwise.
    fn propose_member_change(
        &mut self,
        group: GroupId,
        change: &MemberChange,
    ) -> Result<(), ProposeError> {
        let _ = change;
        Err(ProposeError::Stopped {
            group,
            reason: "a node without raft has no membership to change".into(),
        })
    }

    /// `true` while the replica, started without its data, asks the other members where the
    /// group stands and then refuses votes until it holds what they reported (raft only).
    fn is_catching_up(&self) -> bool {
        false
    }

    /// While a replica catching up has asked the others for a while without enough answers
    /// (raft only): the members that never answered, for a line an operator reads (they may
    /// be down, cut off, or of a build that does not answer).
    fn catch_up_unanswered(&self) -> Option<Vec<NodeId>> {
        None
    }

    /// `true` while the group sleeps: it is not ticked and exchanges no heartbeats until a
    /// proposal, a read, a message or [`Replica::wake`] wakes it.
    fn is_asleep(&self) -> bool {
        false
    }

    /// Wakes a sleeping group: it is ticked again.
    fn wake(&mut self) {}

    /// While this node follows in a sleeping group: the leader whose node going silent must
    /// wake it.
    fn sleeping_leader(&self) -> Option<NodeId> {
        None
    }

    /// The node of `leader` restarted (`MessageSink::peer_restarted`). If this node follows
    /// `leader` in the group, it forgets that leader, wakes, and one follower per group
    /// campaigns soon (raft only: `raft_node/replica/restarted_leader.rs`). Returns `true`
    /// if it did.
    fn forget_restarted_leader(&mut self, group: GroupId, leader: NodeId) -> bool {
        let _ = (group, leader);
        false
    }

    /// After each tick of an awake group; `quiet`: the node loop has nothing queued or
    /// waiting for it. A leader whose log stayed still on every member for `after_ticks`
    /// ticks tells the members to sleep and sleeps. Returns `true` if it fell asleep.
    fn tick_toward_sleep(&mut self, quiet: bool, after_ticks: usize) -> bool {
        let _ = (quiet, after_ticks);
        false
    }

    /// When this leader must tell its followers of a commit index that no append has carried
    /// to them: `NodeConfig::commit_news_delay` after it became owed (`None`: nothing owed).
    /// The loop then calls [`Replica::tell_commit`].
    fn commit_news_due(&self) -> Option<std::time::Instant> {
        None
    }

    /// Tells the followers the commit index (an append to each, sent with the next round).
    fn tell_commit(&mut self) {}

    /// After a message was stepped: a follower its leader told to sleep sleeps if `quiet`
    /// and its log has everything the leader committed.
    fn accept_sleep(&mut self, quiet: bool) {
        let _ = quiet;
    }

    /// Applies the configuration changes among `entries` (just committed, in order) to the
    /// replica; what changed, for the worker to persist before the entries go to apply. A
    /// leader a change removes hands its leadership to a voter `reachable` says is up.
    fn apply_conf_changes(
        &mut self,
        entries: &[Entry],
        reachable: &dyn Fn(NodeId) -> bool,
    ) -> Option<ConfApplied> {
        let _ = (entries, reachable);
        None
    }
}

/// What the configuration changes among one group's committed entries did.
pub(crate) struct ConfApplied {
    /// The configuration after them.
    pub(crate) conf_state: ConfState,
    /// The index of the last of them.
    pub(crate) index: u64,
    /// Members added, with their peer addresses.
    pub(crate) added: Vec<(NodeId, String)>,
}

/// Where a proposed entry went.
pub(crate) enum Proposed {
    /// Appended to this node's log at `index` in `term`.
    Appended { index: u64, term: u64 },
    /// Sent to the leader of `term`; its index is learned when it commits. The leader takes
    /// it only in that term, so once an entry of a later term commits without it, it never
    /// will.
    Forwarded { term: u64 },
}

/// What stepping a peer's message did.
pub(crate) enum StepOutcome {
    Stepped,
    /// Refused and dropped (a stale term, a message this replica takes no messages of).
    Rejected(String),
    /// The replica's state may be half-updated: the group must stop.
    Malformed(String),
}

/// Outgoing messages of a round, per destination node.
pub(crate) type Outbox = IdMap<Vec<GroupMessage>>;

/// What one round's groups produce.
pub(crate) struct Round {
    /// When the round's write began: the one clock reading its groups share.
    pub(crate) now: std::time::Instant,
    /// New entries, hard states and compactions of every group: one write, one sync.
    pub(crate) batch: LogBatch,
    /// Messages that may leave before the log write (sent then when the log syncs: a leader
    /// replicates while it persists; otherwise together with `send_after_write`).
    pub(crate) send_now: Outbox,
    /// Messages sent once the write is durable (a follower acknowledges only what it has).
    pub(crate) send_after_write: Outbox,
    /// Committed entries per group, in order, for the apply thread.
    pub(crate) committed: IdMap<Vec<Entry>>,
    /// Leaderships the round's groups gained and lost.
    pub(crate) leadership_changes: LeadershipChanges,
    /// Members of a group's configuration that a snapshot the group installed no longer
    /// names (removed while this node was behind): the network forgets each once no group
    /// names it, as after a removal this node applies from the log.
    pub(crate) members_dropped: Vec<crate::NodeId>,
    /// Groups whose snapshot the round's write records: their install marks go once it is
    /// written (`install_marks.rs`).
    pub(crate) snapshots_recorded: Vec<GroupId>,
}

impl Round {
    /// An empty round at `now`, writing into `batch` (empty, kept for its allocation), with
    /// room for `committing_groups` groups' committed entries.
    pub(crate) fn new(now: std::time::Instant, batch: LogBatch, committing_groups: usize) -> Self {
        Round {
            now,
            batch,
            send_now: Outbox::default(),
            send_after_write: Outbox::default(),
            committed: IdMap::with_capacity_and_hasher(committing_groups, Default::default()),
            leadership_changes: LeadershipChanges::default(),
            members_dropped: Vec::new(),
            snapshots_recorded: Vec::new(),
        }
    }

    /// Queues committed entries of `group` for apply.
    pub(crate) fn push_committed(&mut self, group: GroupId, entries: Vec<Entry>) {
        if entries.is_empty() {
            return;
        }
        // Most groups commit once a round: their vector moves in rather than being copied.
        match self.committed.entry(group) {
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(entries);
            }
            std::collections::hash_map::Entry::Occupied(mut slot) => slot.get_mut().extend(entries),
        }
    }
}

/// Adds `messages` of `group` to `outbox`, per destination.
pub(crate) fn queue_messages(
    outbox: &mut Outbox,
    group: GroupId,
    replicated_floor: u64,
    messages: Vec<concord_storage::raft::prelude::Message>,
) {
    for message in messages {
        let to: NodeId = message.to;
        outbox.entry(to).or_default().push(GroupMessage {
            group,
            message,
            replicated_floor,
        });
    }
}
