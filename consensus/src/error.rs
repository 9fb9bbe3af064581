//! Errors a caller of [`crate::Consensus`] can get.

use concord_storage::GroupId;

use crate::{CommandError, NodeId};

/// Why a proposal or a read did not produce a result.
///
/// Each variant says whether the command may have applied ([`ProposeError::may_have_applied`]):
/// `NotLeader`, `Overloaded`, `Refused`, `UnknownGroup` and `TooLarge` are answered before anything is
/// queued, and `Dropped` after the command's entry was replaced or lost — none of them applied, so
/// they are safe to retry. `Timeout` and `Stopped` are unknown outcomes, as with any
/// replicated write: the command may apply later. `Command` applied with an error.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProposeError {
    /// This node cannot take the request now: it does not lead the group and cannot forward
    /// it (no leader is known, during an election; or the leader is handing over). `leader`
    /// names the leader when it is known.
    #[error("not the leader of group {group} (leader: {})", leader.map_or("unknown".to_string(), |l| format!("node {l}")))]
    NotLeader {
        /// The group.
        group: GroupId,
        /// The current leader, if known.
        leader: Option<NodeId>,
    },
    /// The group's proposal queue is full: retry later (HTTP 503 with Retry-After).
    #[error("group {group} is overloaded: its proposal queue is full")]
    Overloaded {
        /// The group.
        group: GroupId,
    },
    /// No answer within the proposal timeout. Unknown outcome: the command may still apply.
    #[error("group {group}: no result within {timeout_ms} ms")]
    Timeout {
        /// The group.
        group: GroupId,
        /// The timeout that passed.
        timeout_ms: u64,
    },
    /// Leadership changed before the proposal committed: its entry was replaced in the log by
    /// the new leader's, or (forwarded by a follower) it was lost with the leader it went to
    /// and an entry of a later term committed without it. It did not apply. Safe to retry.
    #[error("group {group}: the proposal was dropped by a leadership change; retry")]
    Dropped {
        /// The group.
        group: GroupId,
    },
    /// The group stopped (storage failure, shutdown); `reason` says why. Unknown outcome for a
    /// command that was already queued: it may have reached the log before the stop, and
    /// applies when the group runs again. A command refused at the door did not apply.
    #[error("group {group} is stopped: {reason}")]
    Stopped {
        /// The group.
        group: GroupId,
        /// Why it stopped.
        reason: String,
    },
    /// This node took the group's state from a snapshot instead of applying the entries it
    /// covers, and the command's entry is among them (one this node proposed), or may be (one
    /// it forwarded to the leader and did not see commit after the snapshot): it applied, or
    /// may have, and its result is not known here. Read the state to see its effect; do not
    /// assume it did not apply.
    #[error(
        "group {group}: the command applied, or may have, within a snapshot; its result is not known here"
    )]
    ResultUnknown {
        /// The group.
        group: GroupId,
    },
    /// The request is not valid now and was not made: a membership change that would lose
    /// quorum, one made while another is under way. Nothing applied.
    #[error("group {group} refused the request: {reason}")]
    Refused {
        /// The group.
        group: GroupId,
        /// Why.
        reason: String,
    },
    /// This node hosts no such group.
    #[error("this node hosts no group {group}")]
    UnknownGroup {
        /// The group.
        group: GroupId,
    },
    /// The command is larger than an entry may be.
    #[error("command of {bytes} bytes exceeds the limit of {limit_bytes} bytes")]
    TooLarge {
        /// The command's size.
        bytes: usize,
        /// The limit.
        limit_bytes: usize,
    },
    /// The command applied and the state machine answered with an error (deterministically, the
    /// same on every replica); its writes were discarded.
    #[error("command failed: {0}")]
    Command(CommandError),
}

impl ProposeError {
    /// `false` when the command certainly did not apply (safe to retry as is); `true` when it
    /// applied (`Command`, `ResultUnknown`) or may have (`Timeout`, `Stopped`).
    pub fn may_have_applied(&self) -> bool {
        match self {
            ProposeError::NotLeader { .. }
            | ProposeError::Overloaded { .. }
            | ProposeError::Dropped { .. }
            | ProposeError::Refused { .. }
            | ProposeError::UnknownGroup { .. }
            | ProposeError::TooLarge { .. } => false,
            ProposeError::Timeout { .. }
            | ProposeError::Stopped { .. }
            | ProposeError::ResultUnknown { .. }
            | ProposeError::Command(_) => true,
        }
    }
}
