//! Conformance cases for disk backends: what survives closing and reopening, and the format
//! marker of the data directory.

use raft::prelude::{ConfState, HardState};

use super::{Harness, make_entries};
use crate::{
    BackendKind, FORMAT_FILE, FORMAT_VERSION, KeyRange, LogBatch, StorageError, StoreConfig,
    Stores, SyncMode, WriteSet,
};

/// Everything written with sync — appends, a truncated suffix, a compaction, hard and conf
/// state, many groups — reads back identically after the stores are closed and reopened.
pub fn reopen_keeps_every_synced_log_write(kind: BackendKind) {
    let harness = Harness::new(kind);
    let mut expected = Vec::new();
    {
        let stores = harness.open();
        for group in 1..=4u64 {
            let mut batch = LogBatch::new();
            batch.append(group, make_entries(group, 1..=20, 1));
            batch.append(group, make_entries(group, 15..=25, 2));
            batch.compact(group, 5);
            let mut hard_state = HardState::default();
            hard_state.term = 2;
            hard_state.vote = group;
            hard_state.commit = 18;
            batch.set_hard_state(group, hard_state);
            batch.set_conf_state(group, ConfState::from((vec![1, 2, 3], vec![])), 0);
            stores.log.write(batch).unwrap();
            expected.push((
                stores.log.group_state(group).unwrap(),
                stores.log.entries(group, 5, 26, None).unwrap(),
            ));
        }
    }
    let stores = harness.open();
    assert_eq!(stores.log.groups().unwrap(), vec![1, 2, 3, 4]);
    for (group, (state, entries)) in (1..=4u64).zip(expected) {
        assert_eq!(stores.log.group_state(group).unwrap(), state);
        assert_eq!(stores.log.entries(group, 5, 26, None).unwrap(), entries);
        assert_eq!(
            stores.log.term(group, 4).unwrap(),
            1,
            "truncated term survives"
        );
        assert_eq!(stores.log.term(group, 25).unwrap(), 2);
    }
}

/// State committed and flushed reads back after reopening, with its applied index.
pub fn reopen_keeps_flushed_state(kind: BackendKind) {
    let harness = Harness::new(kind);
    {
        let stores = harness.open();
        for applied in 1..=50u64 {
            let mut writes = WriteSet::new();
            writes
                .put(format!("k{applied:03}").as_bytes(), &applied.to_le_bytes())
                .unwrap();
            stores.state.commit(7, writes, applied).unwrap();
        }
        stores.state.flush().unwrap();
    }
    let stores = harness.open();
    assert_eq!(stores.state.applied_index(7).unwrap(), 50);
    let pairs = stores.state.scan(7, &KeyRange::all(), 100).unwrap();
    assert_eq!(pairs.len(), 50);
    assert_eq!(pairs[49].0, b"k050".to_vec());
}

/// A store opened without sync keeps its writes through a clean close (it flushes on drop).
pub fn reopen_after_clean_close_keeps_unsynced_writes(kind: BackendKind) {
    let harness = Harness::new(kind);
    {
        let stores = harness.open_with(SyncMode::NoSync);
        let mut batch = LogBatch::new();
        batch.append(1, make_entries(1, 1..=100, 1));
        stores.log.write(batch).unwrap();
        assert_eq!(stores.log.sync_mode(), SyncMode::NoSync);
        let mut writes = WriteSet::new();
        writes.put(b"k", b"v").unwrap();
        stores.state.commit(1, writes, 1).unwrap();
    }
    let stores = harness.open_with(SyncMode::NoSync);
    assert_eq!(stores.log.last_index(1).unwrap(), 100);
    assert_eq!(stores.state.get(1, b"k").unwrap(), Some(b"v".to_vec()));
}

/// A batch that only moved commit indexes, written without a sync under
/// [`SyncMode::Sync`], is on disk after a clean close.
pub fn reopen_after_clean_close_keeps_commit_only_writes(kind: BackendKind) {
    let harness = Harness::new(kind);
    let mut hard_state = HardState::default();
    hard_state.term = 1;
    {
        let stores = harness.open();
        let mut batch = LogBatch::new();
        batch.append(1, make_entries(1, 1..=10, 1));
        batch.set_hard_state(1, hard_state.clone());
        stores.log.write(batch).unwrap();
        hard_state.commit = 7;
        let mut batch = LogBatch::new();
        batch.set_hard_state(1, hard_state.clone());
        stores.log.write(batch).unwrap();
    }
    let stores = harness.open();
    assert_eq!(stores.log.group_state(1).unwrap().hard_state, hard_state);
}

/// The data directory refuses another backend, another format version, and a non-empty
/// directory that Concord did not create — each with a message that says so.
pub fn format_marker_guards_the_directory(kind: BackendKind) {
    let harness = Harness::new(kind);
    drop(harness.open());
    let other = if kind == BackendKind::Redb {
        BackendKind::Sled
    } else {
        BackendKind::Redb
    };
    let error = Stores::open(&StoreConfig::new(other, harness.dir())).unwrap_err();
    assert!(
        matches!(error, StorageError::IncompatibleFormat { .. }),
        "{error}"
    );
    assert!(error.to_string().contains(kind.name()), "{error}");

    let marker = harness.dir().join(FORMAT_FILE);
    let text = std::fs::read_to_string(&marker).unwrap();
    std::fs::write(
        &marker,
        text.replace(
            &format!("format_version = {FORMAT_VERSION}"),
            "format_version = 99",
        ),
    )
    .unwrap();
    let error = Stores::open(&harness.config(SyncMode::Sync)).unwrap_err();
    assert!(error.to_string().contains("format version 99"), "{error}");

    let foreign = tempfile::tempdir().unwrap();
    std::fs::write(foreign.path().join("somebody-elses-file"), b"data").unwrap();
    let error = Stores::open(&StoreConfig::new(kind, foreign.path())).unwrap_err();
    assert!(
        matches!(error, StorageError::IncompatibleFormat { .. }),
        "{error}"
    );
}
