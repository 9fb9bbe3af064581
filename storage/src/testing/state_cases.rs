//! Conformance cases for [`crate::StateStore`].

use super::Harness;
use crate::{
    BackendKind, BorrowedGroupCommit, GroupCommit, GroupRestore, KeyRange, KeyValue, MemStateStore,
    StateStore, StateTransaction, StorageError, WriteSet, export_snapshot, import_snapshot,
};

fn kv(key: &[u8], value: &[u8]) -> KeyValue {
    (key.to_vec(), value.to_vec())
}

fn commit(store: &dyn StateStore, group: u64, pairs: &[(&[u8], &[u8])], applied: u64) {
    let mut writes = WriteSet::new();
    for (key, value) in pairs {
        writes.put(key, value).unwrap();
    }
    store.commit(group, writes, applied).expect("commit");
}

fn dump(store: &dyn StateStore, group: u64) -> Vec<KeyValue> {
    store.scan(group, &KeyRange::all(), usize::MAX).unwrap()
}

/// Committed writes read back; deletes remove; the applied index is recorded.
pub fn state_commit_and_read_back(kind: BackendKind) {
    let harness = Harness::new(kind);
    let stores = harness.open();
    let state = stores.state.as_ref();
    assert_eq!(state.applied_index(1).unwrap(), 0);
    commit(state, 1, &[(b"a", b"1"), (b"b", b"2")], 3);
    assert_eq!(state.get(1, b"a").unwrap(), Some(b"1".to_vec()));
    assert_eq!(state.get(1, b"zz").unwrap(), None);
    assert_eq!(state.applied_index(1).unwrap(), 3);
    let mut writes = WriteSet::new();
    writes.delete(b"a").unwrap();
    writes.put(b"b", b"").unwrap();
    state.commit(1, writes, 4).unwrap();
    assert_eq!(dump(state, 1), vec![kv(b"b", b"")]);
    state.flush().unwrap();
    assert_eq!(state.groups().unwrap(), vec![1]);
    for group in (100..164).rev() {
        commit(state, group, &[(b"a", b"1")], 1);
    }
    let mut expected = vec![1];
    expected.extend(100..164);
    assert_eq!(
        state.groups().unwrap(),
        expected,
        "groups are listed ascending"
    );
}

/// Every key of a group, and only its keys, visited in ascending order, deletes gone, the
/// same before and after a flush.
pub fn state_keys_are_visited_in_order_per_group(kind: BackendKind) {
    let harness = Harness::new(kind);
    let stores = harness.open();
    let state = stores.state.as_ref();
    assert_keys_visited_in_order(state);
}

/// The check of [`state_keys_are_visited_in_order_per_group`] on any store.
pub fn assert_keys_visited_in_order(state: &dyn StateStore) {
    let keys = |group| {
        let mut keys = Vec::new();
        state
            .for_each_key(group, &mut |key| keys.push(key.to_vec()))
            .expect("visit the keys");
        keys
    };
    assert!(keys(1).is_empty());
    commit(state, 1, &[(b"b", b"2"), (b"a", b"1"), (b"c", b"3")], 1);
    commit(state, 2, &[(b"a", b"other group")], 1);
    let mut writes = WriteSet::new();
    writes.delete(b"b").unwrap();
    state.commit(1, writes, 2).unwrap();
    assert_eq!(keys(1), vec![b"a".to_vec(), b"c".to_vec()]);
    state.flush().unwrap();
    assert_eq!(keys(1), vec![b"a".to_vec(), b"c".to_vec()]);
    assert_eq!(keys(2), vec![b"a".to_vec()]);
}

/// Borrowed commits write as owned ones do: puts, deletes and applied indexes of several
/// groups at once; a set with an applied index that does not advance, or a group named twice,
/// writes nothing.
pub fn state_borrowed_commits_are_all_or_nothing(kind: BackendKind) {
    let harness = Harness::new(kind);
    let stores = harness.open();
    assert_borrowed_commits_are_all_or_nothing(stores.state.as_ref());
}

/// The check of [`state_borrowed_commits_are_all_or_nothing`] on any store.
pub fn assert_borrowed_commits_are_all_or_nothing(state: &dyn StateStore) {
    commit(state, 1, &[(b"gone", b"0"), (b"kept", b"0")], 1);
    let borrowed =
        |group, writes: &[(&'static [u8], Option<&'static [u8]>)], applied| BorrowedGroupCommit {
            group,
            writes: writes.to_vec(),
            applied_index: applied,
        };
    state
        .commit_borrowed_groups(&[
            borrowed(1, &[(b"a", Some(b"1")), (b"gone", None)], 2),
            borrowed(2, &[(b"b", Some(b"2"))], 7),
        ])
        .unwrap();
    let expected_group_1 = vec![kv(b"a", b"1"), kv(b"kept", b"0")];
    assert_eq!(dump(state, 1), expected_group_1);
    assert_eq!(dump(state, 2), vec![kv(b"b", b"2")]);
    assert_eq!(state.applied_index(1).unwrap(), 2);
    assert_eq!(state.applied_index(2).unwrap(), 7);
    for bad in [
        vec![borrowed(3, &[(b"c", Some(b"3"))], 1), borrowed(2, &[], 7)],
        vec![borrowed(3, &[(b"c", Some(b"3"))], 1), borrowed(3, &[], 2)],
    ] {
        let error = state.commit_borrowed_groups(&bad).unwrap_err();
        assert!(
            matches!(error, StorageError::InvalidRequest { .. }),
            "{error}"
        );
        assert_eq!(dump(state, 3), vec![], "nothing of the set is written");
        assert_eq!(state.applied_index(3).unwrap(), 0);
    }
    let too_long = vec![b'k'; crate::MAX_KEY_BYTES + 1];
    for bad_key in [&too_long[..], b""] {
        let bad = [
            borrowed(3, &[(b"c", Some(b"3"))], 1),
            BorrowedGroupCommit {
                group: 4,
                writes: vec![(bad_key, Some(b"v"))],
                applied_index: 1,
            },
        ];
        assert!(state.commit_borrowed_groups(&bad).is_err());
        assert_eq!(dump(state, 3), vec![], "nothing of the set is written");
        assert_eq!(state.applied_index(4).unwrap(), 0);
    }
    state.flush().unwrap();
    assert_eq!(dump(state, 1), expected_group_1);
}

/// A commit that does not advance the applied index is refused and writes nothing: an entry
/// can never be applied twice.
pub fn state_applied_index_is_atomic_and_advances(kind: BackendKind) {
    let harness = Harness::new(kind);
    let stores = harness.open();
    let state = stores.state.as_ref();
    commit(state, 1, &[(b"k", b"v5")], 5);
    for stale in [5, 4] {
        let mut writes = WriteSet::new();
        writes.put(b"k", b"stale").unwrap();
        writes.put(b"new", b"stale").unwrap();
        let error = state.commit(1, writes, stale).unwrap_err();
        assert!(
            matches!(error, StorageError::InvalidRequest { .. }),
            "{error}"
        );
    }
    assert_eq!(dump(state, 1), vec![kv(b"k", b"v5")]);
    assert_eq!(state.applied_index(1).unwrap(), 5);
    // An empty write set still advances the index (a raft no-op entry).
    state.commit(1, WriteSet::new(), 6).unwrap();
    assert_eq!(state.applied_index(1).unwrap(), 6);
}

/// Scans return keys in byte order within the range, stop at the limit, and never cross into
/// another group, including the largest group id and keys full of 0xff.
pub fn state_scans_are_ordered_bounded_and_isolated(kind: BackendKind) {
    let harness = Harness::new(kind);
    let stores = harness.open();
    let state = stores.state.as_ref();
    let keys: [&[u8]; 6] = [b"s/b", b"s/a", b"s/c", b"t", b"s", &[0xff, 0xff]];
    for group in [0, 1, u64::MAX] {
        let pairs: Vec<(&[u8], &[u8])> = keys.iter().map(|k| (*k, *k)).collect();
        commit(state, group, &pairs, 1);
    }
    commit(state, 2, &[(b"s/zzz", b"other group")], 1);
    let got = |group: u64, range: KeyRange, limit: usize| -> Vec<Vec<u8>> {
        let pairs = state.scan(group, &range, limit).unwrap();
        pairs.into_iter().map(|(k, _)| k).collect()
    };
    for group in [0, 1, u64::MAX] {
        assert_eq!(
            got(group, KeyRange::prefix(b"s/"), 10),
            vec![b"s/a".to_vec(), b"s/b".to_vec(), b"s/c".to_vec()]
        );
        assert_eq!(got(group, KeyRange::prefix(b"s/"), 2).len(), 2);
        assert_eq!(got(group, KeyRange::all(), 100).len(), 6);
        assert_eq!(
            got(group, KeyRange::prefix(&[0xff]), 10),
            vec![vec![0xff, 0xff]]
        );
        assert_eq!(
            got(group, KeyRange::prefix(b"s/").after(b"s/a"), 10),
            vec![b"s/b".to_vec(), b"s/c".to_vec()]
        );
        assert_eq!(got(group, KeyRange::between(b"s/b", b"t"), 10).len(), 2);
        assert_eq!(got(group, KeyRange::between(b"t", b"s"), 10).len(), 0);
        assert_eq!(got(group, KeyRange::all(), 0).len(), 0);
    }
    assert_eq!(got(2, KeyRange::all(), 10), vec![b"s/zzz".to_vec()]);
    assert_eq!(got(3, KeyRange::all(), 10).len(), 0);
}

/// A transaction sees its own staged puts and deletes in gets and scans; the store sees
/// nothing until commit, and nothing at all if the transaction is dropped.
pub fn state_transaction_reads_its_own_writes(kind: BackendKind) {
    let harness = Harness::new(kind);
    let stores = harness.open();
    let state = stores.state.as_ref();
    commit(state, 1, &[(b"a", b"1"), (b"b", b"2"), (b"c", b"3")], 1);
    let mut txn = StateTransaction::new(state, 1);
    txn.delete(b"a").unwrap();
    txn.put(b"bb", b"22").unwrap();
    txn.put(b"c", b"33").unwrap();
    assert_eq!(txn.get(b"a").unwrap(), None);
    assert_eq!(txn.get(b"c").unwrap(), Some(b"33".to_vec()));
    assert_eq!(
        txn.scan(&KeyRange::all(), 2).unwrap(),
        vec![kv(b"b", b"2"), kv(b"bb", b"22")]
    );
    assert_eq!(state.get(1, b"a").unwrap(), Some(b"1".to_vec()));
    drop(txn);
    assert_eq!(dump(state, 1).len(), 3);
    let mut txn = StateTransaction::new(state, 1);
    txn.delete(b"a").unwrap();
    txn.commit(2).unwrap();
    assert_eq!(dump(state, 1), vec![kv(b"b", b"2"), kv(b"c", b"3")]);
}

/// A group exported as a snapshot stream restores into another group, and into another
/// backend, with the same data and applied index; a restore replaces what was there.
pub fn state_snapshot_stream_round_trip(kind: BackendKind) {
    let harness = Harness::new(kind);
    let stores = harness.open();
    let state = stores.state.as_ref();
    let values: Vec<(Vec<u8>, Vec<u8>)> = (0..500u32)
        .map(|i| {
            (
                format!("key/{i:05}").into_bytes(),
                vec![i as u8; (i % 37) as usize],
            )
        })
        .collect();
    let pairs: Vec<(&[u8], &[u8])> = values
        .iter()
        .map(|(k, v)| (k.as_slice(), v.as_slice()))
        .collect();
    commit(state, 1, &pairs, 77);
    commit(state, 2, &[(b"old", b"gone after restore")], 3);

    let mut stream = Vec::new();
    let summary = export_snapshot(state, 1, &mut stream).unwrap();
    assert_eq!((summary.applied_index, summary.records), (77, 500));
    assert_eq!(summary.bytes, stream.len() as u64);

    assert_eq!(
        import_snapshot(state, 2, &mut stream.as_slice()).unwrap(),
        77
    );
    assert_eq!(dump(state, 2), values);
    assert_eq!(state.applied_index(2).unwrap(), 77);
    assert_eq!(dump(state, 1), values, "the source is untouched");

    let other_backend = MemStateStore::new();
    import_snapshot(&other_backend, 9, &mut stream.as_slice()).unwrap();
    assert_eq!(dump(&other_backend, 9), values);
}

/// A snapshot reflects the moment it was taken even if commits follow before it is read.
pub fn state_snapshot_is_consistent_while_commits_continue(kind: BackendKind) {
    let harness = Harness::new(kind);
    let stores = harness.open();
    let state = stores.state.as_ref();
    commit(state, 1, &[(b"a", b"1"), (b"b", b"2")], 1);
    let snapshot = state.snapshot(1).unwrap();
    let mut writes = WriteSet::new();
    writes.delete(b"a").unwrap();
    writes.put(b"c", b"3").unwrap();
    state.commit(1, writes, 2).unwrap();
    assert_eq!(snapshot.applied_index, 1);
    let records: Vec<KeyValue> = snapshot.records.map(Result::unwrap).collect();
    assert_eq!(records, vec![kv(b"a", b"1"), kv(b"b", b"2")]);
}

/// A damaged stream (truncated, or one flipped byte) is refused and the group keeps its data.
pub fn state_bad_snapshot_stream_changes_nothing(kind: BackendKind) {
    let harness = Harness::new(kind);
    let stores = harness.open();
    let state = stores.state.as_ref();
    commit(state, 1, &[(b"a", b"1"), (b"b", b"2"), (b"c", b"3")], 9);
    commit(state, 2, &[(b"keep", b"me")], 4);
    let mut stream = Vec::new();
    export_snapshot(state, 1, &mut stream).unwrap();
    let mut flipped = stream.clone();
    let middle = stream.len() / 2;
    flipped[middle] ^= 0x01;
    for bad in [&stream[..stream.len() - 3], &flipped[..], b"not a snapshot"] {
        let error = import_snapshot(state, 2, &mut &bad[..]).unwrap_err();
        assert!(
            matches!(error, StorageError::InvalidSnapshot { .. }),
            "{error}"
        );
        assert_eq!(dump(state, 2), vec![kv(b"keep", b"me")]);
        assert_eq!(state.applied_index(2).unwrap(), 4);
    }
}

/// Several groups commit together; one invalid commit (an applied index that does not
/// advance, or a group named twice) refuses the whole set.
pub fn state_commit_groups_is_all_or_nothing(kind: BackendKind) {
    let harness = Harness::new(kind);
    let stores = harness.open();
    let state = stores.state.as_ref();
    commit(state, 2, &[(b"old", b"2")], 5);
    let group_commit = |group: u64, key: &[u8], applied: u64| {
        let mut writes = WriteSet::new();
        writes.put(key, b"v").unwrap();
        GroupCommit {
            group,
            writes,
            applied_index: applied,
        }
    };
    state
        .commit_groups(vec![group_commit(1, b"a", 1), group_commit(3, b"c", 9)])
        .unwrap();
    assert_eq!(state.get(1, b"a").unwrap(), Some(b"v".to_vec()));
    assert_eq!(state.applied_index(3).unwrap(), 9);
    for bad in [
        vec![group_commit(1, b"b", 2), group_commit(2, b"x", 5)],
        vec![group_commit(1, b"b", 2), group_commit(1, b"y", 3)],
    ] {
        let error = state.commit_groups(bad).unwrap_err();
        assert!(
            matches!(error, StorageError::InvalidRequest { .. }),
            "{error}"
        );
        assert_eq!(
            state.get(1, b"b").unwrap(),
            None,
            "nothing of the set is written"
        );
        assert_eq!(state.applied_index(1).unwrap(), 1);
    }
}

/// One group's part of a `restore_groups`.
fn restoring(
    group: u64,
    applied_index: u64,
    records: &mut dyn Iterator<Item = crate::StorageResult<KeyValue>>,
) -> GroupRestore<'_> {
    GroupRestore {
        group,
        applied_index,
        records,
    }
}

/// Several groups restored at once each hold what was sent and nothing else, with its
/// applied index; records that fail partway, or a group named twice, change no group.
pub fn state_restore_groups_is_all_or_nothing(kind: BackendKind) {
    let harness = Harness::new(kind);
    let stores = harness.open();
    let state = stores.state.as_ref();
    commit(state, 1, &[(b"old", b"1")], 4);
    commit(state, 2, &[(b"old", b"2"), (b"z", b"2")], 6);
    let sent = |group: u64| -> Vec<KeyValue> {
        (0..50u32)
            .map(|i| kv(format!("k/{i:03}").as_bytes(), &group.to_be_bytes()))
            .collect()
    };
    let failing = |good: Vec<KeyValue>| {
        good.into_iter()
            .map(Ok)
            .chain(std::iter::once(Err(StorageError::invalid(
                "the sender broke off",
            ))))
    };

    let (mut first, mut second) = (sent(1).into_iter().map(Ok), failing(sent(2)));
    let error = state
        .restore_groups(&mut [restoring(1, 40, &mut first), restoring(2, 60, &mut second)])
        .unwrap_err();
    assert!(error.to_string().contains("broke off"), "{error}");
    let (mut first, mut again) = (sent(1).into_iter().map(Ok), sent(1).into_iter().map(Ok));
    let error = state
        .restore_groups(&mut [restoring(1, 40, &mut first), restoring(1, 41, &mut again)])
        .unwrap_err();
    assert!(
        matches!(error, StorageError::InvalidRequest { .. }),
        "{error}"
    );
    assert_eq!(dump(state, 1), vec![kv(b"old", b"1")], "nothing restored");
    assert_eq!(state.applied_index(1).unwrap(), 4);
    assert_eq!(dump(state, 2).len(), 2);

    let (mut first, mut second, mut third) = (
        sent(1).into_iter().map(Ok),
        sent(2).into_iter().map(Ok),
        sent(3).into_iter().map(Ok),
    );
    state
        .restore_groups(&mut [
            restoring(1, 40, &mut first),
            restoring(2, 60, &mut second),
            restoring(3, 7, &mut third),
        ])
        .unwrap();
    state.flush().unwrap();
    for (group, applied) in [(1, 40), (2, 60), (3, 7)] {
        assert_eq!(dump(state, group), sent(group), "group {group}");
        assert_eq!(state.applied_index(group).unwrap(), applied);
    }
}
