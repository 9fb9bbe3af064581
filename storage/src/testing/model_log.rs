//! A deterministic stream of log batches and a comparison against [`MemLogStore`], for the
//! tests of log stores that keep their live log in memory and rebuild it on open.

use raft::prelude::HardState;

use super::make_entries;
use crate::{LogBatch, LogStore};

/// Batch `n` of a deterministic stream over three groups: appends of one to four entries, a
/// replaced suffix now and then, a compaction now and then, hard states. `last` holds each
/// group's last index and is moved along.
pub fn mixed_batch(n: u64, last: &mut [u64; 3]) -> LogBatch {
    let mut batch = LogBatch::new();
    for group in 0..3u64 {
        let g = group as usize;
        let mut first = last[g] + 1;
        if n % 7 == group && last[g] > 10 {
            first -= 2;
        }
        let count = 1 + (n + group) % 4;
        batch.append(
            group,
            make_entries(group, first..=first + count - 1, 1 + n / 20),
        );
        last[g] = first + count - 1;
        let mut hard_state = HardState::default();
        hard_state.term = 1 + n / 20;
        hard_state.commit = last[g] - 1;
        batch.set_hard_state(group, hard_state);
        if n.is_multiple_of(11) && last[g] > 30 {
            batch.compact(group, last[g] - 20);
        }
    }
    batch
}

/// A batch that only moves each group's commit index to its last entry (`last`), in the term
/// [`mixed_batch`] gives batch `n - 1`: what a store opened with [`crate::SyncMode::Sync`]
/// writes without a sync, after that batch.
pub fn commit_only_batch(n: u64, last: &[u64; 3]) -> LogBatch {
    let mut batch = LogBatch::new();
    for group in 0..3u64 {
        let mut hard_state = HardState::default();
        hard_state.term = 1 + n.saturating_sub(1) / 20;
        hard_state.commit = last[group as usize];
        batch.set_hard_state(group, hard_state);
    }
    batch
}

/// Asserts that `found` holds the same groups, metadata and entries as `model`.
pub fn assert_same_log(found: &dyn LogStore, model: &dyn LogStore) {
    assert_eq!(found.groups().unwrap(), model.groups().unwrap());
    for group in model.groups().unwrap() {
        let state = model.group_state(group).unwrap();
        assert_eq!(found.group_state(group).unwrap(), state, "group {group}");
        let (low, high) = (state.first_index(), state.last_index + 1);
        assert_eq!(
            found.entries(group, low, high, None).unwrap(),
            model.entries(group, low, high, None).unwrap(),
            "group {group}"
        );
    }
}

/// Whether `found` holds the same groups, metadata and entries as `model`.
pub fn same_log(found: &dyn LogStore, model: &dyn LogStore) -> bool {
    let (Ok(found_groups), Ok(groups)) = (found.groups(), model.groups()) else {
        return false;
    };
    found_groups == groups
        && groups.iter().all(|&group| {
            let state = model.group_state(group).unwrap();
            let (low, high) = (state.first_index(), state.last_index + 1);
            found.group_state(group).ok() == Some(state)
                && found.entries(group, low, high, None).ok()
                    == model.entries(group, low, high, None).ok()
        })
}
