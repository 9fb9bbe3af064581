//! One group as a member knows it, in the shape `/v1/status` lists groups and
//! `/v1/cluster/groups/{group}` answers one (and `concord group show` reads).

use serde::{Deserialize, Serialize};

/// One group's state on this node.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct GroupJson {
    /// The group id.
    pub group: u64,
    /// The leader's node id (0 when unknown).
    pub leader: u64,
    /// Whether this node leads.
    pub is_leader: bool,
    /// The current term.
    pub term: u64,
    /// Highest committed log index.
    pub commit_index: u64,
    /// Highest applied log index.
    pub applied_index: u64,
    /// Highest log index.
    pub last_log_index: u64,
    /// `last_log_index - applied_index`.
    pub apply_lag: u64,
    /// Why the group stopped, if it did.
    pub stopped: Option<String>,
    /// On the leader: each voter's replication progress; empty elsewhere.
    pub voters: Vec<VoterJson>,
    /// The group's voters, as this node applied its configuration.
    pub voter_ids: Vec<u64>,
    /// The group's learners.
    pub learner_ids: Vec<u64>,
    /// `true` while a membership change is under way (a joint configuration).
    pub changing_membership: bool,
    /// `true` while this node fetches or installs a snapshot of the group.
    pub installing_snapshot: bool,
    /// `true` while this node, started without the group's data, has not yet applied what
    /// its leader said was committed: it votes for no one until then.
    pub catching_up: bool,
    /// `true` while the group sleeps on this node (idle: not ticked, no heartbeats).
    pub asleep: bool,
}

/// How far one voter's log matches its leader's.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct VoterJson {
    /// The voter.
    pub node_id: u64,
    /// The highest index known to be in its log.
    pub matched_index: u64,
    /// Entries of the leader's log it is not known to have.
    pub lag: u64,
}

/// One group's state on this node, as `/v1/status` and `/v1/cluster/groups/{group}` show it.
pub(crate) fn group_json(s: concord_engine::GroupStatus) -> GroupJson {
    GroupJson {
        group: s.group,
        leader: s.leader,
        is_leader: s.is_leader,
        term: s.term,
        commit_index: s.commit_index,
        applied_index: s.applied_index,
        last_log_index: s.last_log_index,
        apply_lag: s.apply_lag,
        voters: s
            .voters
            .iter()
            .map(|v| VoterJson {
                node_id: v.node,
                matched_index: v.matched_index,
                lag: s.last_log_index.saturating_sub(v.matched_index),
            })
            .collect(),
        changing_membership: s.members.is_joint(),
        voter_ids: s.members.voters,
        learner_ids: s.members.learners,
        installing_snapshot: s.installing_snapshot,
        catching_up: s.catching_up,
        asleep: s.asleep,
        stopped: s.stopped,
    }
}
