//! Whether a node serves, read from each group's health: what a readiness probe and a status
//! summary of thousands of groups need, without copying any group's lists.

use concord_consensus::GroupHealth;
use concord_storage::GroupId;

/// The apply lag (entries) up to which a group counts as caught up for
/// [`crate::Engine::is_ready`].
pub const READY_APPLY_LAG_MAX: u64 = 64;

/// Every group's health and the readiness it adds up to, read in one pass
/// ([`crate::Engine::health`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineHealth {
    /// What [`crate::Engine::is_ready`] would say, judged on `groups` as read here.
    pub ready: bool,
    /// Each group's health, by id.
    pub groups: Vec<(GroupId, GroupHealth)>,
}

/// Whether one group serves on this node: it has a leader, runs, is caught up, installs no
/// snapshot, and this node is still a member (a group without members is a solo node's,
/// which leads it, or one awaiting its first snapshot).
pub(crate) fn group_serves(health: &GroupHealth) -> bool {
    health.leader != 0
        && !health.stopped
        && health.apply_lag <= READY_APPLY_LAG_MAX
        && !health.installing_snapshot
        && health.member.unwrap_or(health.is_leader)
}
