//! Which groups `/v1/status` lists when asked for at most some, and the summary of all of
//! them it gives beside.
//!
//! Why: a node may run tens of thousands of groups. Listing each in every answer makes the
//! status page (which polls once a second) cost the node and the browser in proportion to the
//! group count, whether or not anything is wrong. With a limit, the answer lists the groups an
//! operator should look at first and counts the rest. Both are worked out from each group's
//! health, which copies no lists; only the groups listed are read in full.

use std::cmp::Reverse;

use concord_engine::GroupHealth;
use concord_engine::storage::GroupId;
use serde::{Deserialize, Serialize};

/// The most groups one answer may be asked to list: the engine's group limit.
pub(crate) const GROUP_LIMIT_MAX: usize = 65_536;

/// Counts over every group of the node, listed or not.
#[derive(Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct GroupSummaryJson {
    /// Groups this node runs.
    pub count: usize,
    /// Of them, listed in `groups`.
    pub listed: usize,
    /// Groups this node leads.
    pub led_here: usize,
    /// Groups whose leader this node does not know.
    pub without_leader: usize,
    /// Groups stopped on this node.
    pub stopped: usize,
    /// Groups this node fetches or installs a snapshot of.
    pub installing_snapshot: usize,
    /// Groups this node, started without their data, is catching up in (voting for no one).
    pub catching_up: usize,
    /// Groups in a joint configuration (a membership change under way).
    pub changing_membership: usize,
    /// Groups asleep on this node.
    pub asleep: usize,
    /// The largest `apply_lag` of any group.
    pub max_apply_lag: u64,
    /// Over the groups this node leads, the most entries any voter is behind.
    pub max_voter_lag: u64,
}

/// Counts `groups` (every group of the node, with its health); `listed` is how many the
/// answer lists.
pub(crate) fn summarize(groups: &[(GroupId, GroupHealth)], listed: usize) -> GroupSummaryJson {
    let mut summary = GroupSummaryJson {
        count: groups.len(),
        listed,
        ..GroupSummaryJson::default()
    };
    for (_, health) in groups {
        summary.led_here += usize::from(health.is_leader);
        summary.without_leader += usize::from(health.leader == 0);
        summary.stopped += usize::from(health.stopped);
        summary.installing_snapshot += usize::from(health.installing_snapshot);
        summary.catching_up += usize::from(health.catching_up);
        summary.changing_membership += usize::from(health.changing_membership);
        summary.asleep += usize::from(health.asleep);
        summary.max_apply_lag = summary.max_apply_lag.max(health.apply_lag);
        summary.max_voter_lag = summary.max_voter_lag.max(health.voter_lag);
    }
    summary
}

/// The ids of the `limit` groups of `groups` that most need an operator's eye, in id order:
/// stopped groups first, then those without a leader, then those installing a snapshot, then
/// those catching up, then those changing membership; within each, the most entries behind
/// (applying, or a voter behind its leader) first; then by id.
pub(crate) fn needing_attention_first(
    groups: &[(GroupId, GroupHealth)],
    limit: usize,
) -> Vec<GroupId> {
    // Each group's rank computed once, the first `limit` found without sorting the rest.
    let mut ranked: Vec<Rank> = groups
        .iter()
        .map(|(group, health)| rank(*group, health))
        .collect();
    let limit = limit.min(ranked.len());
    if limit > 0 && limit < ranked.len() {
        ranked.select_nth_unstable(limit - 1);
    }
    let mut chosen: Vec<GroupId> = ranked[..limit].iter().map(|&(_, _, group)| group).collect();
    chosen.sort_unstable();
    chosen
}

/// Where a group stands in the order of [`needing_attention_first`]: lower first.
type Rank = (u8, Reverse<u64>, GroupId);

fn rank(group: GroupId, health: &GroupHealth) -> Rank {
    let behind = health.apply_lag.max(health.voter_lag);
    (concern(health), Reverse(behind), group)
}

/// 0 for the gravest concern, 5 for none.
fn concern(health: &GroupHealth) -> u8 {
    if health.stopped {
        0
    } else if health.leader == 0 {
        1
    } else if health.installing_snapshot {
        2
    } else if health.catching_up {
        3
    } else if health.changing_membership {
        4
    } else {
        5
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use concord_engine::{GroupMembers, GroupStatus, VoterProgress};

    fn running(group: u64) -> GroupStatus {
        GroupStatus {
            group,
            leader: 1,
            is_leader: true,
            term: 2,
            commit_index: 10,
            applied_index: 10,
            last_log_index: 10,
            apply_lag: 0,
            stopped: None,
            voters: vec![],
            members: GroupMembers {
                voters: vec![1, 2, 3],
                learners: vec![],
                outgoing_voters: vec![],
            },
            installing_snapshot: false,
            catching_up: false,
            asleep: false,
        }
    }

    /// What `Engine::health` would say of `statuses`.
    fn health(statuses: &[GroupStatus]) -> Vec<(GroupId, GroupHealth)> {
        statuses
            .iter()
            .map(|status| (status.group, GroupHealth::of(status, 1)))
            .collect()
    }

    fn ids(statuses: Vec<GroupStatus>, limit: usize) -> Vec<GroupId> {
        needing_attention_first(&health(&statuses), limit)
    }

    #[test]
    fn a_limit_above_the_count_lists_every_group_in_order() {
        let statuses: Vec<GroupStatus> = (0..5).map(running).collect();
        assert_eq!(ids(statuses, 5), [0, 1, 2, 3, 4]);
        let statuses: Vec<GroupStatus> = (0..5).map(running).collect();
        assert_eq!(ids(statuses, 100), [0, 1, 2, 3, 4]);
    }

    #[test]
    fn the_groups_in_trouble_are_listed_before_the_healthy_ones() {
        let mut statuses: Vec<GroupStatus> = (0..10).map(running).collect();
        statuses[7].members.outgoing_voters = vec![1, 2, 3];
        statuses[6].installing_snapshot = true;
        statuses[5].leader = 0;
        statuses[5].is_leader = false;
        statuses[8].stopped = Some("the log write failed".into());
        statuses[2].catching_up = true;
        assert_eq!(ids(statuses, 5), [2, 5, 6, 7, 8]);
        let mut statuses: Vec<GroupStatus> = (0..10).map(running).collect();
        statuses[7].members.outgoing_voters = vec![1, 2, 3];
        statuses[2].catching_up = true;
        assert_eq!(ids(statuses, 1), [2]);
    }

    #[test]
    fn among_healthy_groups_the_furthest_behind_come_first() {
        let mut statuses: Vec<GroupStatus> = (0..10).map(running).collect();
        statuses[3].apply_lag = 40;
        statuses[9].voters = vec![
            VoterProgress {
                node: 1,
                matched_index: 10,
            },
            VoterProgress {
                node: 2,
                matched_index: 2,
            },
        ];
        statuses[4].apply_lag = 3;
        assert_eq!(ids(statuses, 2), [3, 9]);
        let mut statuses: Vec<GroupStatus> = (0..10).map(running).collect();
        statuses[4].apply_lag = 3;
        assert_eq!(ids(statuses, 3), [0, 1, 4]);
    }

    #[test]
    fn a_limit_of_zero_lists_nothing_and_the_summary_counts_everything() {
        let mut statuses: Vec<GroupStatus> = (0..6).map(running).collect();
        statuses[0].is_leader = false;
        statuses[0].leader = 2;
        statuses[1].leader = 0;
        statuses[1].is_leader = false;
        statuses[2].asleep = true;
        statuses[3].apply_lag = 7;
        statuses[4].voters = vec![VoterProgress {
            node: 3,
            matched_index: 1,
        }];
        statuses[5].stopped = Some("the state store failed".into());
        statuses[5].installing_snapshot = true;
        statuses[5].catching_up = true;
        statuses[5].members.outgoing_voters = vec![1];
        let summary = summarize(&health(&statuses), 0);
        assert_eq!(
            summary,
            GroupSummaryJson {
                count: 6,
                listed: 0,
                led_here: 4,
                without_leader: 1,
                stopped: 1,
                installing_snapshot: 1,
                catching_up: 1,
                changing_membership: 1,
                asleep: 1,
                max_apply_lag: 7,
                max_voter_lag: 9,
            }
        );
        assert!(ids(statuses, 0).is_empty());
    }
}
