//! Where group leaderships should be: spread evenly over the voters (so that writes use every
//! node's disk and CPU), and away from a node that is shutting down (so that a rolling restart
//! waits for no election timeout).
//!
//! Every node hosts every group and knows each group's leader, so each decides alone, from
//! the same picture: the nodes leading more than their share (the group count over the
//! voters, rounded up) hand their excess to the nodes leading fewer, matched in one order all
//! nodes compute alike, so that two givers do not both fill the same gap. Only a node above
//! its share gives, and a receiver ends at most at the share, so the moves stop once no node
//! is above it. A worker moves at most [`BALANCE_MOVES_MAX`] leaderships per balance: a member
//! back from a restart leads its share of a thousand groups within a few intervals, not one
//! group per interval.

use std::collections::BTreeMap;

use crate::NodeId;

/// The most leaderships one worker hands over per balance interval. Each is an election on
/// its new leader and a moment in which its group takes no write; this many at once stay a
/// small part of a round.
pub(crate) const BALANCE_MOVES_MAX: usize = 64;

/// How many leaderships `me` should hand to which voters, given the leader of every group (0
/// for none): none unless `me` leads more than its share. `voters` are those that can take
/// one: the caller leaves out the voters that are down. Every giver's excess goes to the
/// voters below the share, those leading the fewest first (the lowest id among equals), the
/// givers taken in id order.
pub(crate) fn balance_moves(
    me: NodeId,
    voters: &[NodeId],
    leaders: impl IntoIterator<Item = NodeId>,
) -> Vec<(NodeId, usize)> {
    if voters.len() < 2 || !voters.contains(&me) {
        return Vec::new();
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
    if led[&me] <= share {
        return Vec::new();
    }
    let mut receivers: Vec<(NodeId, usize)> = (led.iter())
        .filter(|&(_, &count)| count < share)
        .map(|(&voter, &count)| (voter, count))
        .collect();
    receivers.sort_by_key(|&(voter, count)| (count, voter));
    let mut gaps: Vec<(NodeId, usize)> = (receivers.into_iter())
        .map(|(voter, count)| (voter, share - count))
        .collect();
    let mut moves = Vec::new();
    for (&giver, &count) in led.iter().filter(|&(_, &count)| count > share) {
        let mut excess = count - share;
        for (receiver, gap) in gaps.iter_mut().filter(|(_, gap)| *gap > 0) {
            if excess == 0 {
                break;
            }
            let moved = excess.min(*gap);
            excess -= moved;
            *gap -= moved;
            if giver == me {
                moves.push((*receiver, moved));
            }
        }
        if giver == me {
            break;
        }
    }
    moves
}

/// The voters a node hands its leaderships to as it shuts down (or finds its disk slow), with
/// how many groups each leads, so that the leaderships spread over them instead of all going
/// to one: a rolling restart then leaves every other node with its part of the load, and the
/// node back from it takes its share from all of them at once.
pub(crate) struct HandOverTargets {
    led: BTreeMap<NodeId, usize>,
}

impl HandOverTargets {
    /// `takers`: the voters that may take a leadership (up, and not the node itself);
    /// `leaders`: the leader of every group of the node (0 for none).
    pub(crate) fn new(takers: &[NodeId], leaders: impl IntoIterator<Item = NodeId>) -> Self {
        let mut led: BTreeMap<NodeId, usize> = takers.iter().map(|&taker| (taker, 0)).collect();
        for leader in leaders {
            if let Some(count) = led.get_mut(&leader) {
                *count += 1;
            }
        }
        HandOverTargets { led }
    }

    /// Of the takers `fits` accepts (for a group: those with its whole log), the one leading
    /// the fewest groups, the lowest id among equals.
    pub(crate) fn fewest_led(&self, fits: impl Fn(NodeId) -> bool) -> Option<NodeId> {
        (self.led.iter())
            .filter(|&(&taker, _)| fits(taker))
            .min_by_key(|&(&taker, &count)| (count, taker))
            .map(|(&taker, _)| taker)
    }

    /// Counts one more leadership handed to `taker`.
    pub(crate) fn handed(&mut self, taker: NodeId) {
        if let Some(count) = self.led.get_mut(&taker) {
            *count += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handed_over_leaderships_spread_over_the_takers() {
        // Node 1 leads 7 groups and shuts down; node 3 already leads 2, node 2 none.
        let mut targets = HandOverTargets::new(&[2, 3], [1, 1, 1, 1, 1, 1, 1, 3, 3]);
        let mut handed = Vec::new();
        for _ in 0..7 {
            let taker = targets.fewest_led(|_| true).unwrap();
            targets.handed(taker);
            handed.push(taker);
        }
        assert_eq!(handed, [2, 2, 2, 3, 2, 3, 2]);
    }

    #[test]
    fn a_taker_without_the_whole_log_is_passed_over() {
        let mut targets = HandOverTargets::new(&[2, 3], []);
        targets.handed(2);
        targets.handed(2);
        assert_eq!(targets.fewest_led(|_| true), Some(3));
        assert_eq!(targets.fewest_led(|taker| taker == 2), Some(2));
        assert_eq!(targets.fewest_led(|_| false), None);
        // A stranger counts nothing.
        targets.handed(9);
        assert_eq!(targets.fewest_led(|taker| taker == 9), None);
    }

    fn led_by(leaders: &[NodeId], voter: NodeId) -> usize {
        leaders.iter().filter(|&&l| l == voter).count()
    }

    #[test]
    fn a_node_above_its_share_gives_its_excess_to_those_with_fewest() {
        // 8 groups over 3 voters: a share of 3.
        let leaders = [1, 1, 1, 1, 1, 2, 3, 3];
        assert_eq!(balance_moves(1, &[1, 2, 3], leaders), vec![(2, 2)]);
        assert_eq!(balance_moves(2, &[1, 2, 3], leaders), vec![]);
        assert_eq!(balance_moves(3, &[1, 2, 3], leaders), vec![]);
    }

    #[test]
    fn two_givers_fill_a_restarted_members_gap_without_overfilling_it() {
        // 1024 groups over 3 voters (a share of 342), the third back from a restart.
        let leaders: Vec<NodeId> = (0..1024).map(|g| if g < 512 { 1 } else { 2 }).collect();
        let voters = [1, 2, 3];
        let one = balance_moves(1, &voters, leaders.iter().copied());
        let two = balance_moves(2, &voters, leaders.iter().copied());
        assert_eq!(one, vec![(3, 170)]);
        assert_eq!(two, vec![(3, 170)]);
        assert_eq!(balance_moves(3, &voters, leaders.iter().copied()), vec![]);
    }

    #[test]
    fn one_giver_spreads_over_several_gaps_fewest_first() {
        // 12 groups over 4 voters: a share of 3.
        let leaders = [1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3];
        assert_eq!(
            balance_moves(1, &[1, 2, 3, 4], leaders),
            vec![(4, 3), (3, 2), (2, 1)]
        );
    }

    #[test]
    fn the_moves_stop_once_every_node_is_within_its_share() {
        let voters = [1, 2, 3, 4, 5];
        let mut leaders = [1u64; 103];
        leaders[100..].copy_from_slice(&[2, 2, 3]);
        for _ in 0..10 {
            // Every node decides from the same picture, then the moves happen.
            let picture = leaders;
            let moves: Vec<(NodeId, Vec<(NodeId, usize)>)> = voters
                .iter()
                .map(|&me| (me, balance_moves(me, &voters, picture.iter().copied())))
                .collect();
            if moves.iter().all(|(_, moves)| moves.is_empty()) {
                break;
            }
            for (giver, moves) in moves {
                for (receiver, count) in moves {
                    for _ in 0..count {
                        let position = leaders.iter().position(|&l| l == giver).unwrap();
                        leaders[position] = receiver;
                    }
                }
            }
        }
        // A share of 21: nobody above it, and the one that gave ends at it.
        for voter in voters {
            let led = led_by(&leaders, voter);
            assert!(led <= 21, "node {voter} leads {led} of 103");
        }
        assert_eq!(led_by(&leaders, 1), 21);
        assert!(
            voters
                .iter()
                .all(|&me| balance_moves(me, &voters, leaders.iter().copied()).is_empty())
        );
    }

    #[test]
    fn leaderless_groups_single_voters_and_strangers_move_nothing() {
        assert_eq!(balance_moves(1, &[1], [1, 1, 1]), vec![]);
        assert_eq!(balance_moves(1, &[1, 2, 3], [0, 0, 1]), vec![]);
        assert_eq!(balance_moves(9, &[1, 2, 3], [9, 9, 9]), vec![]);
    }
}
