//! Where group leaderships should be: spread evenly over the voters (so that writes use every
//! node's disk and CPU), and away from a node that is shutting down (so that a rolling restart
//! waits for no election timeout).
//!
//! Every node hosts every group and knows each group's leader, so each decides alone, from
//! the same picture: a node leading more than its share hands one group to the voter leading
//! the fewest. Only a node above its share gives, and the receiver ends at most at the share,
//! so the moves stop once no node is above it.

use std::collections::BTreeMap;

use crate::NodeId;

/// The voter that should take one leadership from `me`, given the leader of every group
/// (0 for none): the voter leading the fewest groups (the lowest id among equals), if `me`
/// leads more than its share (the group count divided by the voters, rounded up) and the
/// move leaves the two closer. `voters` are those that can take one: the caller leaves out
/// the voters that are down.
pub(crate) fn balance_target(
    me: NodeId,
    voters: &[NodeId],
    leaders: impl IntoIterator<Item = NodeId>,
) -> Option<NodeId> {
    if voters.len() < 2 {
        return None;
    }
    let mut led: BTreeMap<NodeId, usize> = voters.iter().map(|&voter| (voter, 0)).collect();
    let mut groups = 0usize;
    for leader in leaders {
        groups += 1;
        if let Some(count) = led.get_mut(&leader) {
            *count += 1;
        }
    }
    let share = groups.div_ceil(voters.len());
    let mine = *led.get(&me)?;
    if mine <= share {
        return None;
    }
    let (target, fewest) = led
        .iter()
        .filter(|&(&voter, _)| voter != me)
        .map(|(&voter, &count)| (voter, count))
        .min_by_key(|&(voter, count)| (count, voter))?;
    (fewest + 1 < mine).then_some(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_above_its_share_gives_to_the_one_with_fewest() {
        // 8 groups over 3 voters: a share of 3.
        let leaders = [1, 1, 1, 1, 1, 2, 3, 3];
        assert_eq!(balance_target(1, &[1, 2, 3], leaders), Some(2));
        assert_eq!(balance_target(2, &[1, 2, 3], leaders), None);
        assert_eq!(balance_target(3, &[1, 2, 3], leaders), None);
    }

    #[test]
    fn the_moves_stop_once_every_node_is_within_its_share() {
        let voters = [1, 2, 3];
        let mut leaders = [1u64; 16];
        for _ in 0..100 {
            let moved = voters.iter().find_map(|&me| {
                let target = balance_target(me, &voters, leaders.iter().copied())?;
                let position = leaders.iter().position(|&l| l == me)?;
                leaders[position] = target;
                Some(())
            });
            if moved.is_none() {
                break;
            }
        }
        for voter in voters {
            let led = leaders.iter().filter(|&&l| l == voter).count();
            assert!((5..=6).contains(&led), "node {voter} leads {led} of 16");
        }
        assert!(
            voters
                .iter()
                .all(|&me| balance_target(me, &voters, leaders.iter().copied()).is_none())
        );
    }

    #[test]
    fn leaderless_groups_and_single_voters_move_nothing() {
        assert_eq!(balance_target(1, &[1], [1, 1, 1]), None);
        assert_eq!(balance_target(1, &[1, 2, 3], [0, 0, 1]), None);
        assert_eq!(balance_target(9, &[1, 2, 3], [9, 9, 9]), None);
    }
}
