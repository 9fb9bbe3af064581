//! Conformance cases for [`crate::LogStore`].

use protobuf::Message as _;
use raft::prelude::{ConfState, HardState, SnapshotMetadata};

use super::{Harness, make_entries};
use crate::{BackendKind, LogBatch, LogStore, StorageError};

fn append(log: &dyn LogStore, group: u64, indexes: std::ops::RangeInclusive<u64>, term: u64) {
    let mut batch = LogBatch::new();
    batch.append(group, make_entries(group, indexes, term));
    log.write(batch).expect("append");
}

fn terms(log: &dyn LogStore, group: u64, low: u64, high: u64) -> Vec<u64> {
    let entries = log.entries(group, low, high, None).expect("entries");
    entries.iter().map(|e| e.term).collect()
}

/// Appended entries read back equal, in order, with their terms and bounds.
pub fn log_append_and_read_back(kind: BackendKind) {
    let harness = Harness::new(kind);
    let stores = harness.open();
    let log = stores.log.as_ref();
    append(log, 1, 1..=10, 1);
    append(log, 1, 11..=12, 2);
    let read = log.entries(1, 1, 13, None).unwrap();
    let mut expected = make_entries(1, 1..=10, 1);
    expected.extend(make_entries(1, 11..=12, 2));
    assert_eq!(read, expected);
    assert_eq!(log.first_index(1).unwrap(), 1);
    assert_eq!(log.last_index(1).unwrap(), 12);
    assert_eq!(log.term(1, 10).unwrap(), 1);
    assert_eq!(log.term(1, 11).unwrap(), 2);
    assert_eq!(log.entries(1, 4, 6, None).unwrap(), expected[3..5].to_vec());
    assert_eq!(log.entries(1, 5, 5, None).unwrap(), vec![]);
}

/// `max_bytes` stops the read once the entries' encoded size passes it, but never below one
/// entry (raft-rs's rule).
pub fn log_entries_respect_the_byte_limit(kind: BackendKind) {
    let harness = Harness::new(kind);
    let stores = harness.open();
    let log = stores.log.as_ref();
    append(log, 1, 1..=10, 1);
    let all = log.entries(1, 1, 11, None).unwrap();
    let size = |n: usize| -> u64 { all[..n].iter().map(|e| u64::from(e.compute_size())).sum() };
    assert_eq!(log.entries(1, 1, 11, Some(0)).unwrap().len(), 1);
    assert_eq!(log.entries(1, 1, 11, Some(size(3))).unwrap().len(), 3);
    assert_eq!(log.entries(1, 1, 11, Some(size(3) + 1)).unwrap().len(), 3);
    assert_eq!(log.entries(1, 1, 11, Some(size(4) - 1)).unwrap().len(), 3);
    assert_eq!(log.entries(1, 1, 11, Some(u64::MAX)).unwrap().len(), 10);
}

/// Reads below the first index are `Compacted`, above the last are `Unavailable`, and both
/// convert to the raft-rs errors of the same name.
pub fn log_reads_outside_the_range_are_typed_misses(kind: BackendKind) {
    let harness = Harness::new(kind);
    let stores = harness.open();
    let log = stores.log.as_ref();
    append(log, 1, 1..=10, 1);
    let mut batch = LogBatch::new();
    batch.compact(1, 5);
    log.write(batch).unwrap();

    let compacted = log.entries(1, 3, 6, None).unwrap_err();
    assert!(matches!(
        compacted,
        StorageError::Compacted {
            index: 3,
            first_index: 5,
            ..
        }
    ));
    assert!(matches!(
        raft::Error::from(compacted),
        raft::Error::Store(raft::StorageError::Compacted)
    ));
    let unavailable = log.entries(1, 5, 12, None).unwrap_err();
    assert!(matches!(
        unavailable,
        StorageError::Unavailable { last_index: 10, .. }
    ));
    assert!(matches!(
        raft::Error::from(unavailable),
        raft::Error::Store(raft::StorageError::Unavailable)
    ));
    assert!(matches!(
        log.term(1, 3),
        Err(StorageError::Compacted { .. })
    ));
    assert!(matches!(
        log.term(1, 11),
        Err(StorageError::Unavailable { .. })
    ));
    assert!(matches!(
        log.entries(1, 8, 6, None),
        Err(StorageError::InvalidRequest { .. })
    ));
}

/// Appending at an index at or below the last replaces the suffix from that index on.
pub fn log_conflicting_suffix_is_replaced(kind: BackendKind) {
    let harness = Harness::new(kind);
    let stores = harness.open();
    let log = stores.log.as_ref();
    append(log, 1, 1..=10, 1);
    append(log, 1, 6..=8, 2);
    assert_eq!(log.last_index(1).unwrap(), 8);
    assert_eq!(terms(log, 1, 1, 9), vec![1, 1, 1, 1, 1, 2, 2, 2]);
    assert_eq!(
        log.entries(1, 6, 9, None).unwrap(),
        make_entries(1, 6..=8, 2)
    );
    assert!(matches!(
        log.term(1, 9),
        Err(StorageError::Unavailable { .. })
    ));
    // Replacing from the very first index works too.
    append(log, 1, 1..=2, 3);
    assert_eq!(terms(log, 1, 1, 3), vec![3, 3]);
    assert_eq!(log.last_index(1).unwrap(), 2);
}

/// A batch with any invalid operation (a hole, an append into the compacted prefix, a
/// compaction past the end) is refused whole: no other group or op of it is written.
pub fn log_invalid_batch_changes_nothing(kind: BackendKind) {
    let harness = Harness::new(kind);
    let stores = harness.open();
    let log = stores.log.as_ref();
    append(log, 1, 1..=3, 1);
    let mut batch = LogBatch::new();
    batch.append(2, make_entries(2, 1..=2, 1));
    batch.append(1, make_entries(1, 5..=6, 1));
    let error = log.write(batch).unwrap_err();
    assert!(
        matches!(error, StorageError::InvalidRequest { .. }),
        "{error}"
    );
    assert_eq!(log.last_index(2).unwrap(), 0);
    assert_eq!(log.last_index(1).unwrap(), 3);

    let mut batch = LogBatch::new();
    batch.compact(1, 3);
    log.write(batch).unwrap();
    for bad in [
        {
            let mut b = LogBatch::new();
            b.append(1, make_entries(1, 2..=4, 2));
            b
        },
        {
            let mut b = LogBatch::new();
            b.append(1, make_entries(1, 4..=4, 1));
            b.compact(1, 6);
            b
        },
    ] {
        assert!(matches!(
            log.write(bad),
            Err(StorageError::InvalidRequest { .. })
        ));
    }
    assert_eq!(log.last_index(1).unwrap(), 3);
    assert_eq!(log.first_index(1).unwrap(), 3);
}

/// Compaction removes the prefix below the compact index, keeps the term of the index before
/// it, is idempotent, and cannot pass the end of the log.
pub fn log_compaction_bounds(kind: BackendKind) {
    let harness = Harness::new(kind);
    let stores = harness.open();
    let log = stores.log.as_ref();
    append(log, 1, 1..=4, 1);
    append(log, 1, 5..=10, 2);
    let compact = |index: u64| {
        let mut batch = LogBatch::new();
        batch.compact(1, index);
        log.write(batch)
    };
    compact(6).unwrap();
    assert_eq!(log.first_index(1).unwrap(), 6);
    assert_eq!(
        log.term(1, 5).unwrap(),
        2,
        "term of the truncated index is kept"
    );
    assert!(matches!(
        log.term(1, 4),
        Err(StorageError::Compacted { .. })
    ));
    assert_eq!(
        log.entries(1, 6, 11, None).unwrap(),
        make_entries(1, 6..=10, 2)
    );
    compact(3).unwrap();
    assert_eq!(log.first_index(1).unwrap(), 6, "compacting less is a no-op");
    assert!(matches!(
        compact(12),
        Err(StorageError::InvalidRequest { .. })
    ));
    compact(11).unwrap();
    assert_eq!(log.first_index(1).unwrap(), 11);
    assert_eq!(log.last_index(1).unwrap(), 10);
    assert_eq!(log.term(1, 10).unwrap(), 2);
    assert_eq!(log.entries(1, 11, 11, None).unwrap(), vec![]);
    append(log, 1, 11..=11, 3);
    assert_eq!(terms(log, 1, 11, 12), vec![3]);
}

/// A group never written to is an empty log truncated at 0, as raft-rs expects.
pub fn log_new_group_is_empty(kind: BackendKind) {
    let harness = Harness::new(kind);
    let stores = harness.open();
    let log = stores.log.as_ref();
    assert_eq!(log.first_index(42).unwrap(), 1);
    assert_eq!(log.last_index(42).unwrap(), 0);
    assert_eq!(log.term(42, 0).unwrap(), 0);
    assert_eq!(log.entries(42, 1, 1, None).unwrap(), vec![]);
    assert!(matches!(
        log.term(42, 1),
        Err(StorageError::Unavailable { .. })
    ));
    assert_eq!(log.groups().unwrap(), Vec::<u64>::new());
    append(log, 42, 1..=1, 1);
    append(log, 7, 1..=1, 1);
    assert_eq!(log.groups().unwrap(), vec![7, 42]);
    // Ascending whatever the order of the writes and however the store keeps its groups.
    for group in (100..164).rev() {
        append(log, group, 1..=1, 1);
    }
    let mut expected = vec![7, 42];
    expected.extend(100..164);
    assert_eq!(log.groups().unwrap(), expected);
}

/// Hard state and conf state read back as written, per group.
pub fn log_hard_state_and_conf_state_round_trip(kind: BackendKind) {
    let harness = Harness::new(kind);
    let stores = harness.open();
    let log = stores.log.as_ref();
    let mut hard_state = HardState::default();
    hard_state.term = 5;
    hard_state.vote = 2;
    hard_state.commit = 0;
    let conf_state = ConfState::from((vec![1, 2, 3], vec![4]));
    let mut batch = LogBatch::new();
    batch.set_hard_state(1, hard_state.clone());
    batch.set_conf_state(1, conf_state.clone(), 9);
    batch.set_hard_state(2, HardState::default());
    log.write(batch).unwrap();
    let state = log.group_state(1).unwrap();
    assert_eq!(state.hard_state, hard_state);
    assert_eq!(state.conf_state, conf_state);
    assert_eq!(state.conf_state_index, 9);
    assert_eq!(log.group_state(2).unwrap().conf_state, ConfState::default());
}

/// Applying a snapshot drops the log and restarts it just after the snapshot's index.
pub fn log_apply_snapshot_restarts_the_log(kind: BackendKind) {
    let harness = Harness::new(kind);
    let stores = harness.open();
    let log = stores.log.as_ref();
    append(log, 1, 1..=5, 1);
    append(log, 2, 1..=5, 1);
    let mut metadata = SnapshotMetadata::default();
    metadata.index = 20;
    metadata.term = 4;
    metadata.set_conf_state(ConfState::from((vec![1, 2, 3], vec![])));
    let mut batch = LogBatch::new();
    batch.apply_snapshot(1, metadata.clone());
    log.write(batch).unwrap();
    let state = log.group_state(1).unwrap();
    assert_eq!((state.first_index(), state.last_index), (21, 20));
    assert_eq!(log.term(1, 20).unwrap(), 4);
    assert_eq!(&state.conf_state, metadata.get_conf_state());
    assert_eq!(state.conf_state_index, metadata.index);
    assert!(matches!(
        log.entries(1, 5, 6, None),
        Err(StorageError::Compacted { .. })
    ));
    assert!(matches!(
        log.write({
            let mut b = LogBatch::new();
            b.append(1, make_entries(1, 23..=23, 4));
            b
        }),
        Err(StorageError::InvalidRequest { .. })
    ));
    append(log, 1, 21..=22, 4);
    assert_eq!(terms(log, 1, 21, 23), vec![4, 4]);
    assert_eq!(log.last_index(2).unwrap(), 5, "other groups are untouched");
}

/// Writes and compacts away a larger log in a group of its own (1000): redb is left with free
/// pages, so that the batches after it do not grow its file, which syncs too.
fn leave_free_pages(log: &dyn LogStore) {
    let warm_up_group = 1000;
    append(log, warm_up_group, 1..=2000, 1);
    let mut batch = LogBatch::new();
    batch.compact(warm_up_group, 2001);
    log.write(batch).unwrap();
}

/// A batch spanning 16 groups is written with exactly one sync on disk backends (none on the
/// memory backend), and each group reads back only its own entries.
///
/// redb also syncs once when it grows its file (so a crash cannot leave a header pointing past
/// the end of the file); growth doubles the file and so is rare, but a new, tiny file grows
/// often. The case therefore first writes and compacts away a larger log, leaving free pages,
/// and then counts the syncs of steady-state batches.
pub fn log_batch_of_many_groups_costs_one_sync(kind: BackendKind) {
    let harness = Harness::new(kind);
    let stores = harness.open();
    let log = stores.log.as_ref();
    leave_free_pages(log);
    for round in 0..3u64 {
        let mut batch = LogBatch::new();
        for group in 0..16 {
            batch.append(group, make_entries(group, round * 4 + 1..=round * 4 + 4, 1));
            let mut hard_state = HardState::default();
            hard_state.term = 1;
            hard_state.commit = round * 4;
            batch.set_hard_state(group, hard_state);
        }
        let before = log.sync_count();
        log.write(batch).unwrap();
        let syncs = log.sync_count() - before;
        let expected = if kind.is_persistent() { 1 } else { 0 };
        assert_eq!(
            syncs, expected,
            "round {round}: syncs for one 16-group batch"
        );
    }
    for group in 0..16 {
        assert_eq!(
            log.entries(group, 1, 13, None).unwrap(),
            make_entries(group, 1..=12, 1)
        );
        assert_eq!(log.group_state(group).unwrap().hard_state.commit, 8);
    }
}

/// Under [`crate::SyncMode::Sync`] a batch that only moves commit indexes is written without a
/// sync (raft learns a lost commit index again); one that changes a vote, appends or compacts
/// syncs as before. What is written reads back either way (after `leave_free_pages`).
pub fn log_commit_only_batch_waits_for_the_next_sync(kind: BackendKind) {
    let harness = Harness::new(kind);
    let stores = harness.open();
    let log = stores.log.as_ref();
    leave_free_pages(log);
    let disk = if kind.is_persistent() { 1 } else { 0 };
    let hard_state = |term, vote, commit| {
        let mut hard_state = HardState::default();
        hard_state.term = term;
        hard_state.vote = vote;
        hard_state.commit = commit;
        hard_state
    };
    let syncs_of = |batch: LogBatch| {
        let before = log.sync_count();
        log.write(batch).unwrap();
        log.sync_count() - before
    };
    let mut batch = LogBatch::new();
    for group in 1..=2 {
        batch.append(group, make_entries(group, 1..=10, 1));
        batch.set_hard_state(group, hard_state(1, 1, 0));
    }
    assert_eq!(syncs_of(batch), disk, "appends and a new term");

    let mut batch = LogBatch::new();
    for group in 1..=2 {
        batch.set_hard_state(group, hard_state(1, 1, 6));
    }
    assert_eq!(syncs_of(batch), 0, "commit indexes only");
    assert_eq!(log.group_state(1).unwrap().hard_state, hard_state(1, 1, 6));

    let mut batch = LogBatch::new();
    batch.set_hard_state(1, hard_state(1, 1, 8));
    batch.set_hard_state(2, hard_state(2, 3, 6));
    assert_eq!(syncs_of(batch), disk, "a vote in a new term");
    assert_eq!(log.group_state(1).unwrap().hard_state.commit, 8);
    assert_eq!(log.group_state(2).unwrap().hard_state, hard_state(2, 3, 6));

    let mut batch = LogBatch::new();
    batch.set_hard_state(1, hard_state(1, 1, 9));
    batch.compact(1, 3);
    assert_eq!(syncs_of(batch), disk, "a compaction");

    let mut batch = LogBatch::new();
    batch.set_hard_state(1, hard_state(1, 1, 10));
    batch.append(2, make_entries(2, 11..=11, 2));
    assert_eq!(syncs_of(batch), disk, "an append");
    assert_eq!(log.group_state(1).unwrap().hard_state.commit, 10);
    assert_eq!(
        log.entries(1, 3, 11, None).unwrap(),
        make_entries(1, 3..=10, 1)
    );
}
