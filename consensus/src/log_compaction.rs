//! When a group's log is compacted, and how far: one rule for the raft and solo workers.

/// The index to compact `group`'s log to (entries below it go), or `None` if not worth it yet.
///
/// `bound` is the highest index that may go: the state's durable applied index (a restart
/// replays from there), and on a raft leader no more than every voter has replicated. `keep`
/// applied entries up to `bound` stay, and compaction waits until at least `keep` entries can
/// go, so its cost is spread over that many.
pub(crate) fn compact_index(bound: u64, first_index: u64, keep: u64) -> Option<u64> {
    let compact_index = (bound + 1).saturating_sub(keep);
    (compact_index >= first_index + keep).then_some(compact_index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_a_tail_and_waits_for_a_chunk_worth_compacting() {
        // Log from 1, bound 10, keep 4: entries 1..=6 go, 7..=10 stay.
        assert_eq!(compact_index(10, 1, 4), Some(7));
        assert_eq!(compact_index(7, 1, 4), None); // 4 < 1 + 4: not yet.
        assert_eq!(compact_index(8, 1, 4), Some(5));
        // Already compacted to 7: the next chunk needs bound 14.
        assert_eq!(compact_index(13, 7, 4), None);
        assert_eq!(compact_index(14, 7, 4), Some(11));
        assert_eq!(compact_index(0, 1, 4), None);
    }
}
