//! Which of a worker's groups sleep, kept so that a tick costs in proportion to the groups
//! awake rather than to all of them: a bit per awake group, the leader each sleeping group
//! watches, and how many sleeping groups watch each leader's node. A node of ten thousand
//! sleeping groups then reads a bit map (a bit per group) and a short list each tick, where
//! a record per group costs a cache miss per group on a machine whose idle memory has gone
//! cold.

use crate::NodeId;

/// The sleep record of positions `0..capacity`, every group awake at first.
pub(super) struct Sleepers {
    /// Per position: `None` while awake; while asleep, the leader whose node must stay heard
    /// from (0 where this node leads).
    watched: Vec<Option<NodeId>>,
    /// One bit per position, set while the group is awake.
    awake: Vec<u64>,
    /// Each leader node (not this one) some sleeping group watches, with how many do.
    watchers: Vec<(NodeId, usize)>,
}

impl Sleepers {
    pub(super) fn all_awake(capacity: usize) -> Sleepers {
        let mut awake = vec![u64::MAX; capacity.div_ceil(64)];
        if !capacity.is_multiple_of(64)
            && let Some(last) = awake.last_mut()
        {
            *last = (1u64 << (capacity % 64)) - 1;
        }
        Sleepers {
            watched: vec![None; capacity],
            awake,
            watchers: Vec::new(),
        }
    }

    /// Whether the group at `position` sleeps.
    pub(super) fn is_asleep(&self, position: usize) -> bool {
        self.watched[position].is_some()
    }

    /// Records that the group at `position` sleeps watching `leader` (`Some(0)`: this node
    /// leads it) or is awake (`None`). Returns `true` if that changed anything.
    pub(super) fn set(&mut self, position: usize, leader: Option<NodeId>) -> bool {
        let before = self.watched[position];
        if before == leader {
            return false;
        }
        if let Some(node) = before.filter(|&node| node != 0) {
            self.count_watcher(node, false);
        }
        if let Some(node) = leader.filter(|&node| node != 0) {
            self.count_watcher(node, true);
        }
        let (word, bit) = (position / 64, 1u64 << (position % 64));
        match leader {
            None => self.awake[word] |= bit,
            Some(_) => self.awake[word] &= !bit,
        }
        self.watched[position] = leader;
        true
    }

    fn count_watcher(&mut self, node: NodeId, joins: bool) {
        match self
            .watchers
            .iter()
            .position(|&(watched, _)| watched == node)
        {
            Some(index) if joins => self.watchers[index].1 += 1,
            Some(index) => {
                self.watchers[index].1 -= 1;
                if self.watchers[index].1 == 0 {
                    self.watchers.swap_remove(index);
                }
            }
            None if joins => self.watchers.push((node, 1)),
            None => debug_assert!(false, "a watcher of node {node} left without joining"),
        }
    }

    /// The leader nodes some sleeping group watches (never this node).
    pub(super) fn watched_nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.watchers.iter().map(|&(node, _)| node)
    }

    /// Replaces `positions` with those of the awake groups, in order.
    pub(super) fn awake_positions(&self, positions: &mut Vec<usize>) {
        positions.clear();
        for (word_index, &word) in self.awake.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                positions.push(word_index * 64 + bits.trailing_zeros() as usize);
                bits &= bits - 1;
            }
        }
    }

    /// Adds to `positions` those of the sleeping groups that watch one of `nodes`: a pass
    /// over every group's record, made only when a watched node fell silent.
    pub(super) fn watching_any_of(&self, nodes: &[NodeId], positions: &mut Vec<usize>) {
        for (position, watched) in self.watched.iter().enumerate() {
            if watched.is_some_and(|leader| nodes.contains(&leader)) {
                positions.push(position);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Sleepers;

    fn awake(sleepers: &Sleepers) -> Vec<usize> {
        let mut positions = Vec::new();
        sleepers.awake_positions(&mut positions);
        positions
    }

    #[test]
    fn every_position_starts_awake_and_leaves_the_awake_set_while_it_sleeps() {
        let mut sleepers = Sleepers::all_awake(130);
        assert_eq!(awake(&sleepers), (0..130).collect::<Vec<_>>());
        assert!(sleepers.set(0, Some(0)));
        assert!(sleepers.set(64, Some(2)));
        assert!(sleepers.set(129, Some(3)));
        assert!(!sleepers.set(129, Some(3)), "no change");
        let expected: Vec<usize> = (1..129).filter(|&p| p != 64).collect();
        assert_eq!(awake(&sleepers), expected);
        assert!(sleepers.is_asleep(64) && !sleepers.is_asleep(63));
        assert!(sleepers.set(64, None));
        assert!(awake(&sleepers).contains(&64));
    }

    #[test]
    fn watched_nodes_are_counted_and_this_node_is_never_one() {
        let mut sleepers = Sleepers::all_awake(10);
        sleepers.set(1, Some(2));
        sleepers.set(2, Some(2));
        sleepers.set(3, Some(3));
        sleepers.set(4, Some(0));
        let mut nodes: Vec<_> = sleepers.watched_nodes().collect();
        nodes.sort_unstable();
        assert_eq!(nodes, vec![2, 3]);
        // Group 2 now watches node 3; group 1 wakes: nobody watches node 2 any more.
        sleepers.set(2, Some(3));
        sleepers.set(1, None);
        assert_eq!(sleepers.watched_nodes().collect::<Vec<_>>(), vec![3]);
        let mut positions = vec![9];
        sleepers.watching_any_of(&[3], &mut positions);
        assert_eq!(positions, vec![9, 2, 3]);
    }
}
