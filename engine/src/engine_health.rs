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

/// Whether one group serves on this node: it has a leader, runs, is caught up (within
/// [`READY_APPLY_LAG_MAX`] of its own log, and, started without its data, past what its leader
/// said was committed), installs no snapshot, and this node is still a member (a group
/// without members is a solo node's, which leads it, or one awaiting its first snapshot).
pub(crate) fn group_serves(health: &GroupHealth) -> bool {
    health.leader != 0
        && !health.stopped
        && health.apply_lag <= READY_APPLY_LAG_MAX
        && !health.installing_snapshot
        && !health.catching_up
        && health.member.unwrap_or(health.is_leader)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serving() -> GroupHealth {
        GroupHealth {
            leader: 2,
            is_leader: false,
            stopped: false,
            apply_lag: 0,
            voter_lag: 0,
            installing_snapshot: false,
            catching_up: false,
            member: Some(true),
            changing_membership: false,
            asleep: false,
        }
    }

    #[test]
    fn a_group_serves_only_caught_up() {
        assert!(group_serves(&serving()));
        let cases = [
            GroupHealth {
                leader: 0,
                ..serving()
            },
            GroupHealth {
                apply_lag: READY_APPLY_LAG_MAX + 1,
                ..serving()
            },
            GroupHealth {
                installing_snapshot: true,
                ..serving()
            },
            // Started without its data: its log is empty and it knows the leader, which is
            // all the other checks see.
            GroupHealth {
                catching_up: true,
                ..serving()
            },
            GroupHealth {
                member: Some(false),
                ..serving()
            },
        ];
        for health in cases {
            assert!(!group_serves(&health), "{health:?}");
        }
    }
}
