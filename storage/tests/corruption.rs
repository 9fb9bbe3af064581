//! Damaged data directories: every case must end in a clear error naming the file and the
//! problem — never a panic, never a store that opens and silently lacks synced data.

use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use concord_storage::testing::{Harness, make_entries, open_sled_database};
use concord_storage::{BackendKind, LogBatch, StorageError, Stores, WriteSet};
use redb::ReadableTable as _;

/// Writes a small log (groups 1 and 2, entries 1..=50) and some state, then closes.
fn populate(harness: &Harness) {
    let stores = harness.open();
    for group in [1, 2] {
        let mut batch = LogBatch::new();
        batch.append(group, make_entries(group, 1..=50, 1));
        stores.log.write(batch).unwrap();
    }
    let mut writes = WriteSet::new();
    writes.put(b"key", b"value").unwrap();
    stores.state.commit(1, writes, 1).unwrap();
    stores.state.flush().unwrap();
}

fn open_error(harness: &Harness) -> StorageError {
    match Stores::open(&harness.config(concord_storage::SyncMode::Sync)) {
        Ok(_) => panic!("a damaged directory opened without complaint"),
        Err(error) => error,
    }
}

fn overwrite(path: &Path, offset: u64, bytes: &[u8]) {
    let mut file = OpenOptions::new().write(true).open(path).unwrap();
    file.seek(SeekFrom::Start(offset)).unwrap();
    file.write_all(bytes).unwrap();
    file.sync_all().unwrap();
}

#[test]
fn redb_truncated_log_file_is_reported_with_its_name() {
    let harness = Harness::new(BackendKind::Redb);
    populate(&harness);
    let path = harness.dir().join("log.redb");
    let len = std::fs::metadata(&path).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len / 3)
        .unwrap();
    let error = open_error(&harness);
    assert!(error.to_string().contains("log.redb"), "{error}");
}

#[test]
fn redb_garbage_over_the_log_file_is_reported_with_its_name() {
    let harness = Harness::new(BackendKind::Redb);
    populate(&harness);
    let path = harness.dir().join("log.redb");
    let len = std::fs::metadata(&path).unwrap().len();
    overwrite(&path, 512, &vec![0xA5; (len - 512) as usize]);
    let error = open_error(&harness);
    assert!(error.to_string().contains("log.redb"), "{error}");
}

#[test]
fn redb_file_that_is_not_a_database_is_reported() {
    let harness = Harness::new(BackendKind::Redb);
    populate(&harness);
    std::fs::write(harness.dir().join("state.redb"), b"this is not a redb file").unwrap();
    let error = open_error(&harness);
    assert!(matches!(error, StorageError::Corrupted { .. }), "{error}");
    assert!(error.to_string().contains("state.redb"), "{error}");
}

/// The redb log's records, opened behind the store's back.
const REDB_LOG_RECORDS: redb::TableDefinition<u64, &[u8]> =
    redb::TableDefinition::new("log_records");

/// A hole made behind the store's back (the record holding group 2's entries removed with redb
/// directly) is found on open.
#[test]
fn redb_hole_in_a_log_is_found_on_open() {
    let harness = Harness::new(BackendKind::Redb);
    populate(&harness);
    {
        let db = redb::Database::open(harness.dir().join("log.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut table = txn.open_table(REDB_LOG_RECORDS).unwrap();
            // populate wrote group 1, then group 2: the last record is group 2's.
            let last = table.last().unwrap().unwrap().0.value();
            table.remove(last).unwrap();
        }
        txn.commit().unwrap();
    }
    let error = open_error(&harness);
    assert!(matches!(error, StorageError::Corrupted { .. }), "{error}");
    let message = error.to_string();
    assert!(
        message.contains("log.redb") && message.contains("group 2"),
        "{message}"
    );
}

/// A damaged entry fails its checksum when the log is loaded: an error naming the file, not a
/// wrong entry.
#[test]
fn redb_damaged_entry_fails_its_checksum() {
    let harness = Harness::new(BackendKind::Redb);
    populate(&harness);
    {
        let db = redb::Database::open(harness.dir().join("log.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut table = txn.open_table(REDB_LOG_RECORDS).unwrap();
            let first = table.first().unwrap().unwrap().0.value();
            let mut value = table.get(first).unwrap().unwrap().value().to_vec();
            let last = value.len() - 1;
            value[last] ^= 0x10;
            table.insert(first, value.as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let error = open_error(&harness);
    assert!(matches!(error, StorageError::Corrupted { .. }), "{error}");
    let message = error.to_string();
    assert!(
        message.contains("log.redb") && message.contains("checksum"),
        "{message}"
    );
}

/// A hole made behind the store's back in sled is found on open.
#[test]
fn sled_hole_in_a_log_is_found_on_open() {
    let harness = Harness::new(BackendKind::Sled);
    populate(&harness);
    {
        let db = open_sled_database(&harness.dir().join("log.sled")).unwrap();
        let mut key = vec![1u8];
        key.extend_from_slice(&1u64.to_be_bytes());
        key.extend_from_slice(&30u64.to_be_bytes());
        assert!(db.remove(key).unwrap().is_some());
        db.flush().unwrap();
    }
    let error = open_error(&harness);
    assert!(matches!(error, StorageError::Corrupted { .. }), "{error}");
    assert!(error.to_string().contains("log.sled"), "{error}");
}

/// sled files overwritten with garbage give an error (sled may panic inside; it is caught).
#[test]
fn sled_garbage_files_are_an_error_not_a_crash() {
    let harness = Harness::new(BackendKind::Sled);
    populate(&harness);
    let dir = harness.dir().join("log.sled");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            let len = std::fs::metadata(&path).unwrap().len().max(64);
            std::fs::write(&path, vec![0x5A; len as usize]).unwrap();
        }
    }
    let error = open_error(&harness);
    assert!(error.to_string().contains("log.sled"), "{error}");
}

#[test]
fn garbage_format_marker_is_refused() {
    let harness = Harness::new(BackendKind::Redb);
    populate(&harness);
    std::fs::write(
        harness.dir().join(concord_storage::FORMAT_FILE),
        b"\x00\x01binary",
    )
    .unwrap();
    let error = open_error(&harness);
    assert!(
        matches!(error, StorageError::IncompatibleFormat { .. }),
        "{error}"
    );
}
