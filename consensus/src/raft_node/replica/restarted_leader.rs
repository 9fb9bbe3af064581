//! A leader whose node restarted: the groups it led elect again without waiting out a timeout.
//!
//! A follower that heard from its leader refuses every other candidate until an election
//! timeout has passed (raft-rs's check-quorum, on which the leader's lease rests: `lease.rs`),
//! and campaigns only once that timeout passes without a word. A leader whose node restarted
//! leads nothing any more and holds no lease: both lived in the run that ended. Yet its
//! followers, not told, wait out the whole timeout, and in a sleeping group, woken by the
//! restart, that timeout only begins then.
//!
//! Told by the network that the leader's node restarted (`MessageSink::peer_restarted`,
//! before anything its new run sends), each follower forgets that leader, so that it grants
//! votes at once, and one follower per group campaigns within [`CAMPAIGN_AFTER_TICKS`]
//! ticks: chosen by the group's id, so that the groups spread over the followers and no two
//! of them split a vote. The others keep their election clocks, held back a few ticks behind
//! the chosen one's, and elect as before should it be down.
//!
//! The restarted member itself holds its vote for an election timeout (`vote_hold.rs`), or
//! takes no part until it has caught up (`catching_up.rs`), so the chosen follower needs the
//! others' votes: its ticks of waiting give them time to hear of the restart too. One that
//! has not heard yet refuses the pre-vote, and the election comes at the usual timeout.
//!
//! Only the old run's leaderships end: the new run leads nothing before its vote hold ends,
//! and the network tells of the restart before it delivers anything of the new run.

use concord_storage::GroupId;
use concord_storage::raft::{self, StateRole};

use super::RaftReplica;
use crate::NodeId;
use crate::node_loop::replica::Replica as _;

/// Ticks after the restart is heard of before the chosen follower campaigns: time for the
/// other followers to hear of it too (each hears from the restarted node's own connection).
const CAMPAIGN_AFTER_TICKS: usize = 2;

impl RaftReplica {
    /// If this node follows `leader` in `group`, forgets it and wakes; the chosen follower
    /// (module comment) campaigns within [`CAMPAIGN_AFTER_TICKS`] ticks. Returns `true` if
    /// this node followed `leader`.
    pub(super) fn forget_leader_that_restarted(&mut self, group: GroupId, leader: NodeId) -> bool {
        let raft = &self.raw.raft;
        if raft.state != StateRole::Follower
            || leader == raft::INVALID_ID
            || raft.leader_id != leader
            || self.catching_up.is_some()
            || self.installing.is_some()
        {
            return false;
        }
        let conf = raft.prs().conf().to_conf_state();
        let voters = conf.voters.iter().chain(&conf.voters_outgoing).copied();
        let chosen = chosen_candidate(voters, leader, group) == Some(raft.id);
        self.wake();
        let raft = &mut self.raw.raft;
        raft.leader_id = raft::INVALID_ID;
        let timeout = raft.randomized_election_timeout();
        raft.election_elapsed = if chosen && raft.promotable() {
            raft.election_elapsed
                .max(timeout.saturating_sub(CAMPAIGN_AFTER_TICKS))
        } else {
            raft.election_elapsed
                .min(timeout.saturating_sub(2 * CAMPAIGN_AFTER_TICKS))
        };
        true
    }
}

/// The voter, other than `leader`, that campaigns first for `group`: the voters in order of
/// their ids, taken round by the group's id.
fn chosen_candidate(
    voters: impl Iterator<Item = NodeId>,
    leader: NodeId,
    group: GroupId,
) -> Option<NodeId> {
    let mut candidates: Vec<NodeId> = voters.filter(|&voter| voter != leader).collect();
    candidates.sort_unstable();
    candidates.dedup();
    let count = u64::try_from(candidates.len()).ok().filter(|&n| n > 0)?;
    let index = usize::try_from(group % count).ok()?;
    candidates.get(index).copied()
}

#[cfg(test)]
mod tests {
    use super::chosen_candidate;

    #[test]
    fn one_follower_per_group_is_chosen_and_the_groups_spread_over_them() {
        let voters = [3, 1, 2];
        let chosen: Vec<_> = (0..6)
            .map(|group| chosen_candidate(voters.iter().copied(), 1, group))
            .collect();
        assert_eq!(
            chosen,
            [Some(2), Some(3), Some(2), Some(3), Some(2), Some(3)]
        );
        // The same voter listed in both halves of a joint configuration counts once.
        let joint = [2, 3, 3, 4];
        let chosen: Vec<_> = (3..6)
            .map(|group| chosen_candidate(joint.into_iter(), 1, group))
            .collect();
        assert_eq!(chosen, [Some(2), Some(3), Some(4)]);
        assert_eq!(chosen_candidate([1].into_iter(), 1, 5), None);
        assert_eq!(chosen_candidate([].into_iter(), 1, 5), None);
    }
}
