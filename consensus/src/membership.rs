//! Membership changes: what an operator asks for (add a learner, promote it, remove a member),
//! how it travels through a group's log as a raft-rs `ConfChangeV2`, and the rule that refuses
//! a change that would leave a group without a quorum.
//!
//! Every change goes through joint consensus (an implicit transition: raft-rs enters the joint
//! configuration, then its leader proposes leaving it once applied). The entry's context names
//! the member and, for a learner added, its peer address: every replica learns where to reach
//! a new member from the same log entry that makes it one.

use concord_storage::raft::prelude::{
    ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2, ConfState,
};

use crate::NodeId;

/// Longest peer address a membership change carries.
pub const MAX_MEMBER_ADDRESS_BYTES: usize = 1024;

/// One change to a group's membership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberChange {
    /// Adds `node` as a learner (it receives the log, takes no part in quorums), reachable at
    /// `address` (its peer address, `host:port`).
    AddLearner {
        /// The new member.
        node: NodeId,
        /// Where its peers reach it.
        address: String,
    },
    /// Makes learner `node` a voter.
    Promote {
        /// The learner.
        node: NodeId,
    },
    /// Removes `node`, voter or learner.
    Remove {
        /// The member.
        node: NodeId,
    },
}

impl MemberChange {
    /// The member the change is about.
    pub fn node(&self) -> NodeId {
        match self {
            MemberChange::AddLearner { node, .. }
            | MemberChange::Promote { node }
            | MemberChange::Remove { node } => *node,
        }
    }

    /// The raft-rs change, entered through a joint configuration that raft-rs leaves by itself.
    pub(crate) fn conf_change(&self) -> ConfChangeV2 {
        let (change_type, node) = match self {
            MemberChange::AddLearner { node, .. } => (ConfChangeType::AddLearnerNode, *node),
            MemberChange::Promote { node } => (ConfChangeType::AddNode, *node),
            MemberChange::Remove { node } => (ConfChangeType::RemoveNode, *node),
        };
        let mut single = ConfChangeSingle::default();
        single.set_change_type(change_type);
        single.node_id = node;
        let mut change = ConfChangeV2::default();
        change.set_transition(ConfChangeTransition::Implicit);
        change.set_changes(vec![single].into());
        change
    }

    /// The entry context that travels with the change.
    pub(crate) fn context(&self) -> MemberContext {
        let address = match self {
            MemberChange::AddLearner { address, .. } => address.clone(),
            _ => String::new(),
        };
        MemberContext {
            node: self.node(),
            address,
        }
    }
}

/// A group's members, as its conf state says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupMembers {
    /// The voters (of the incoming configuration while joint).
    pub voters: Vec<NodeId>,
    /// The learners.
    pub learners: Vec<NodeId>,
    /// The voters of the outgoing configuration while the group is in a joint configuration
    /// (a change under way); empty otherwise.
    pub outgoing_voters: Vec<NodeId>,
}

impl GroupMembers {
    pub(crate) fn from_conf_state(conf_state: &ConfState) -> Self {
        let sorted = |ids: &[u64]| {
            let mut ids = ids.to_vec();
            ids.sort_unstable();
            ids
        };
        GroupMembers {
            voters: sorted(&conf_state.voters),
            learners: sorted(&conf_state.learners),
            outgoing_voters: sorted(&conf_state.voters_outgoing),
        }
    }

    /// `true` while a change is under way (a joint configuration).
    pub fn is_joint(&self) -> bool {
        !self.outgoing_voters.is_empty()
    }

    /// `true` if `node` takes part in the group in any role.
    pub fn contains(&self, node: NodeId) -> bool {
        self.voters.contains(&node)
            || self.learners.contains(&node)
            || self.outgoing_voters.contains(&node)
    }

    /// `true` if `node` is a voter of the incoming configuration or a learner: a member that
    /// stays once a change under way is made.
    pub fn stays(&self, node: NodeId) -> bool {
        self.voters.contains(&node) || self.learners.contains(&node)
    }

    /// The members, other than `node` (this one), that `next` no longer names, once each.
    pub(crate) fn dropped_in<'a>(
        &'a self,
        next: &'a GroupMembers,
        node: NodeId,
    ) -> impl Iterator<Item = NodeId> + 'a {
        let outgoing_only = self
            .outgoing_voters
            .iter()
            .filter(|member| !self.stays(**member));
        (self
            .voters
            .iter()
            .chain(&self.learners)
            .chain(outgoing_only))
        .copied()
        .filter(move |&member| member != node && !next.contains(member))
    }

    /// `true` if nothing is known yet (a member that joined and awaits its first snapshot).
    pub fn is_empty(&self) -> bool {
        self.voters.is_empty() && self.learners.is_empty() && self.outgoing_voters.is_empty()
    }

    /// `true` once `change` is in effect and the group has left the joint configuration.
    pub fn has_taken(&self, change: &MemberChange) -> bool {
        if self.is_joint() {
            return false;
        }
        match change {
            MemberChange::AddLearner { node, .. } => self.contains(*node),
            MemberChange::Promote { node } => self.voters.contains(node),
            MemberChange::Remove { node } => !self.contains(*node),
        }
    }

    /// The voters once `change` is made.
    pub fn voters_after(&self, change: &MemberChange) -> Vec<NodeId> {
        let mut voters = self.voters.clone();
        match change {
            MemberChange::AddLearner { .. } => {}
            MemberChange::Promote { node } => {
                if !voters.contains(node) {
                    voters.push(*node);
                    voters.sort_unstable();
                }
            }
            MemberChange::Remove { node } => voters.retain(|voter| voter != node),
        }
        voters
    }
}

/// Why `change` must not be made to a group whose members are `members`, if it must not:
/// the voters before or after it would have no quorum among the members `is_active` says are
/// up (joint consensus needs both to commit the change, and a group without a quorum takes no
/// write until enough of them return), or it would remove the last voter.
pub fn refuse_change(
    members: &GroupMembers,
    change: &MemberChange,
    is_active: impl Fn(NodeId) -> bool,
) -> Option<String> {
    let node = change.node();
    match change {
        MemberChange::AddLearner { .. } if members.voters.contains(&node) => {
            return Some(format!("node {node} is already a voter"));
        }
        MemberChange::Promote { .. } if !members.contains(node) => {
            return Some(format!(
                "node {node} is not a member: add it as a learner first"
            ));
        }
        _ => {}
    }
    let after = members.voters_after(change);
    if after.is_empty() {
        return Some(format!("removing node {node} would leave no voter"));
    }
    for (which, voters) in [("before", &members.voters), ("after", &after)] {
        let active = voters.iter().filter(|&&voter| is_active(voter)).count();
        let quorum = voters.len() / 2 + 1;
        if active < quorum {
            let down: Vec<NodeId> = voters.iter().copied().filter(|&v| !is_active(v)).collect();
            return Some(format!(
                "the change would lose quorum: {active} of the {} voters {which} it are up, \
                 {quorum} are needed (not up: {down:?})",
                voters.len()
            ));
        }
    }
    None
}

/// The context of a membership change entry: the member, and for a learner added its peer
/// address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MemberContext {
    pub(crate) node: NodeId,
    pub(crate) address: String,
}

impl MemberContext {
    const MAGIC: &'static [u8; 8] = b"CNCDMEMB";

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Self::MAGIC.to_vec();
        out.extend_from_slice(&self.node.to_le_bytes());
        out.extend_from_slice(&(self.address.len() as u16).to_le_bytes());
        out.extend_from_slice(self.address.as_bytes());
        out
    }

    /// The context in `bytes`, or `None` if they are not one.
    pub(crate) fn decode(bytes: &[u8]) -> Option<MemberContext> {
        let rest = bytes.strip_prefix(Self::MAGIC.as_slice())?;
        let node = u64::from_le_bytes(rest.get(..8)?.try_into().ok()?);
        let length = u16::from_le_bytes(rest.get(8..10)?.try_into().ok()?) as usize;
        let address = rest.get(10..)?;
        if address.len() != length || length > MAX_MEMBER_ADDRESS_BYTES || node == 0 {
            return None;
        }
        Some(MemberContext {
            node,
            address: String::from_utf8(address.to_vec()).ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(voters: &[u64], learners: &[u64]) -> GroupMembers {
        GroupMembers {
            voters: voters.to_vec(),
            learners: learners.to_vec(),
            outgoing_voters: Vec::new(),
        }
    }

    #[test]
    fn a_member_is_dropped_only_once_no_half_of_a_joint_configuration_names_it() {
        let node = 1;
        let before = members(&[1, 2, 3, 4], &[5]);
        // Removing 4 enters a joint configuration: 4 is still an outgoing voter.
        let joint = GroupMembers {
            voters: vec![1, 2, 3],
            learners: vec![5],
            outgoing_voters: vec![1, 2, 3, 4],
        };
        assert_eq!(before.dropped_in(&joint, node).count(), 0);
        // Leaving it (raft-rs's own entry, with no context) drops 4, once.
        let after = members(&[1, 2, 3], &[5]);
        assert_eq!(joint.dropped_in(&after, node).collect::<Vec<_>>(), [4]);
        // A snapshot without 4 and 5, nor this node, drops both others.
        let snapshot = members(&[2, 3], &[]);
        assert_eq!(
            before.dropped_in(&snapshot, node).collect::<Vec<_>>(),
            [4, 5]
        );
        // Nothing known before (a member awaiting its first snapshot): nothing dropped.
        assert_eq!(GroupMembers::default().dropped_in(&after, node).count(), 0);
    }

    #[test]
    fn a_change_that_would_lose_quorum_is_refused() {
        let three = members(&[1, 2, 3], &[4]);
        let all_up = |_| true;
        assert_eq!(
            refuse_change(&three, &MemberChange::Remove { node: 3 }, all_up),
            None
        );
        // Node 3 down: removing 2 leaves {1, 3} with one up of two.
        let three_down = |node| node != 3;
        let refused = refuse_change(&three, &MemberChange::Remove { node: 2 }, three_down);
        assert!(refused.unwrap().contains("lose quorum"));
        // Promoting a learner that is down: {1, 2, 3, 4} needs 3 up.
        let four_and_three_down = |node| node != 3 && node != 4;
        assert!(
            refuse_change(
                &three,
                &MemberChange::Promote { node: 4 },
                four_and_three_down
            )
            .is_some()
        );
        assert!(
            refuse_change(
                &members(&[1], &[]),
                &MemberChange::Remove { node: 1 },
                all_up
            )
            .unwrap()
            .contains("no voter")
        );
        assert!(refuse_change(&three, &MemberChange::Promote { node: 9 }, all_up).is_some());
        // Two voters, one down: removing the one down needs both to commit the change.
        let two = members(&[2, 3], &[]);
        let refused = refuse_change(&two, &MemberChange::Remove { node: 3 }, |n| n == 2);
        assert!(refused.unwrap().contains("voters before"));
    }

    #[test]
    fn a_change_is_taken_once_in_effect_outside_a_joint_configuration() {
        let change = MemberChange::Promote { node: 4 };
        assert!(!members(&[1, 2, 3], &[4]).has_taken(&change));
        assert!(members(&[1, 2, 3, 4], &[]).has_taken(&change));
        let mut joint = members(&[1, 2, 3, 4], &[]);
        joint.outgoing_voters = vec![1, 2, 3];
        assert!(!joint.has_taken(&change));
        assert!(members(&[1, 2], &[]).has_taken(&MemberChange::Remove { node: 3 }));
    }

    #[test]
    fn contexts_round_trip_and_garbage_is_none() {
        let context = MemberContext {
            node: 4,
            address: "127.0.0.1:7173".into(),
        };
        assert_eq!(
            MemberContext::decode(&context.encode()),
            Some(context.clone())
        );
        let bytes = context.encode();
        assert_eq!(MemberContext::decode(&bytes[..bytes.len() - 1]), None);
        assert_eq!(MemberContext::decode(b"CNCDMEMB"), None);
        assert_eq!(MemberContext::decode(&[]), None);
    }

    #[test]
    fn hostile_contexts_are_refused_never_a_panic() {
        let valid = vec![
            MemberContext {
                node: 4,
                address: "127.0.0.1:7004".into(),
            }
            .encode(),
        ];
        for input in concord_storage::testing::hostile_inputs(&valid, 6, 3_000) {
            let _ = MemberContext::decode(&input);
        }
    }
}
