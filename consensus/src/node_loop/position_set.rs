//! A set of group positions (indexes into a worker's groups) that is cheap to walk when it
//! holds few of many groups: the members in a list, and one flag per position so that adding
//! a member twice costs one read.

/// Positions `0..capacity`, each in the set at most once, walked in the order they joined.
pub(super) struct PositionSet {
    members: Vec<usize>,
    is_member: Vec<bool>,
}

impl PositionSet {
    /// Every position of `0..capacity` in the set.
    pub(super) fn full(capacity: usize) -> PositionSet {
        PositionSet {
            members: (0..capacity).collect(),
            is_member: vec![true; capacity],
        }
    }

    /// No position of `0..capacity` in the set.
    pub(super) fn empty(capacity: usize) -> PositionSet {
        PositionSet {
            members: Vec::new(),
            is_member: vec![false; capacity],
        }
    }

    /// The position joins the set unless it is in it already.
    pub(super) fn insert(&mut self, position: usize) {
        if !self.is_member[position] {
            self.is_member[position] = true;
            self.members.push(position);
        }
    }

    /// The members, in the order they joined.
    pub(super) fn members(&self) -> &[usize] {
        &self.members
    }

    /// Keeps only the members for which `keep` says `true`.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(usize) -> bool) {
        let is_member = &mut self.is_member;
        self.members.retain(|&position| {
            let kept = keep(position);
            is_member[position] = kept;
            kept
        });
    }
}

#[cfg(test)]
mod tests {
    use super::PositionSet;

    #[test]
    fn a_position_is_a_member_once_and_leaves_when_not_kept() {
        let mut set = PositionSet::full(4);
        set.retain(|position| position % 2 == 0);
        assert_eq!(set.members(), &[0, 2]);
        set.insert(3);
        set.insert(3);
        set.insert(0);
        assert_eq!(set.members(), &[0, 2, 3]);
        set.retain(|position| position != 0);
        set.insert(0);
        assert_eq!(set.members(), &[2, 3, 0]);
    }

    #[test]
    fn an_empty_set_takes_any_position_below_its_capacity() {
        let mut set = PositionSet::empty(3);
        assert!(set.members().is_empty());
        set.insert(2);
        set.insert(2);
        assert_eq!(set.members(), &[2]);
    }
}
