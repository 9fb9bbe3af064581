//! The redb log store beyond the conformance suite: records die when their entries do, a
//! group that stops writing does not keep old records alive, and every reopen rebuilds
//! exactly the model's log from the records.

use std::path::Path;

use concord_storage::testing::{assert_same_log, make_entries, mixed_batch};
use concord_storage::{LogBatch, LogStore, MemLogStore, RedbLogStore, SyncMode};
use redb::{ReadableDatabase as _, ReadableTable as _, ReadableTableMetadata as _};

/// Records in the file, live or waiting to be deleted by the next write.
fn records_in_file(path: &Path) -> u64 {
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_read().unwrap();
    let definition: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("log_records");
    txn.open_table(definition).unwrap().len().unwrap()
}

/// Hundreds of batches with replaced suffixes and compactions: dead records go, and every
/// reopen loads the model's log.
#[test]
fn records_die_with_their_entries_and_every_reopen_loads_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.redb");
    let model = MemLogStore::new();
    let mut last = [0u64; 3];
    for round in 0..4u64 {
        let log = RedbLogStore::open(&path, SyncMode::NoSync).unwrap();
        assert_same_log(&log, &model);
        for n in round * 100..(round + 1) * 100 {
            let next = mixed_batch(n, &mut last);
            model.write(next.clone()).unwrap();
            log.write(next).unwrap();
        }
        assert_same_log(&log, &model);
        // Each group keeps about 20..30 entries of up to 4 per write: the live records are a
        // few dozen of the hundreds written.
        assert!(
            log.live_record_count() < 40,
            "dead records kept: {}",
            log.live_record_count()
        );
    }
    assert!(records_in_file(&path) < 45, "{}", records_in_file(&path));
}

/// Four groups write forty records each in turn and stop; a fifth writes on and compacts.
/// The stopped groups' records would stay forever, holding every other group's dead entries;
/// relocation copies their few live entries forward so that those records go, until the
/// records kept hold at most about twice the live entries.
#[test]
fn a_group_that_stops_writing_does_not_keep_old_records_alive() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.redb");
    let model = MemLogStore::new();
    let both = |batch: LogBatch, log: &RedbLogStore| {
        model.write(batch.clone()).unwrap();
        log.write(batch).unwrap();
    };
    {
        let log = RedbLogStore::open(&path, SyncMode::NoSync).unwrap();
        let mut busy_last = 0;
        for group in 1..=4u64 {
            for index in 1..=40 {
                let mut batch = LogBatch::new();
                batch.append(group, make_entries(group, index..=index, 1));
                // The busy group writes four entries alongside, so that its dead entries fill
                // most of these records.
                batch.append(9, make_entries(9, busy_last + 1..=busy_last + 4, 1));
                busy_last += 4;
                both(batch, &log);
            }
        }
        assert_eq!(log.live_record_count(), 160);
        assert_eq!(log.record_entry_counts(), (800, 800));
        for _ in 0..440 {
            let mut batch = LogBatch::new();
            busy_last += 1;
            batch.append(9, make_entries(9, busy_last..=busy_last, 1));
            if busy_last % 10 == 0 {
                batch.compact(9, busy_last - 10);
            }
            both(batch, &log);
        }
        // 160 stopped entries and the busy group's last 10 to 20 live; the records keep at
        // most twice that plus the slack, not the 800 the stopped groups' records held.
        let (kept, live) = log.record_entry_counts();
        assert!(live <= 180, "{live} live");
        assert!(kept <= 2 * live + 64, "{kept} entries kept for {live} live");
        assert!(
            log.live_record_count() < 160,
            "old records kept: {}",
            log.live_record_count()
        );
        assert_same_log(&log, &model);
    }
    assert!(records_in_file(&path) < 160, "{}", records_in_file(&path));
    let log = RedbLogStore::open(&path, SyncMode::NoSync).unwrap();
    assert_same_log(&log, &model);
}

const BUCKETS: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("log_group_buckets");
const LEGACY_GROUPS: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("log_groups");

/// One write of a thousand groups: their metadata goes into the buckets of 64 groups, one
/// key each, and a reopen reads it back.
#[test]
fn the_metadata_of_a_thousand_groups_is_sixteen_keys() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.redb");
    let model = MemLogStore::new();
    let mut batch = LogBatch::new();
    for group in 0..1024u64 {
        batch.append(group, make_entries(group, 1..=2, 1));
    }
    model.write(batch.clone()).unwrap();
    RedbLogStore::open(&path, SyncMode::NoSync)
        .unwrap()
        .write(batch)
        .unwrap();
    {
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_read().unwrap();
        assert_eq!(txn.open_table(BUCKETS).unwrap().len().unwrap(), 16);
    }
    let log = RedbLogStore::open(&path, SyncMode::NoSync).unwrap();
    assert_same_log(&log, &model);
}

/// Moves every group's metadata out of the buckets into one key per group, as files written
/// before the buckets held it (bucket: version u8, count u32, then per group: group u64,
/// length u32, the encoded metadata).
fn into_legacy_layout(path: &Path) {
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let buckets = txn.open_table(BUCKETS).unwrap();
        let mut legacy = txn.open_table(LEGACY_GROUPS).unwrap();
        for item in buckets.iter().unwrap() {
            let (_, value) = item.unwrap();
            let bytes = value.value();
            let count = u32::from_le_bytes(bytes[1..5].try_into().unwrap());
            let mut at = 5;
            for _ in 0..count {
                let group = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
                let len = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
                legacy
                    .insert(group, &bytes[at + 12..at + 12 + len])
                    .unwrap();
                at += 12 + len;
            }
        }
    }
    txn.delete_table(BUCKETS).unwrap();
    txn.commit().unwrap();
}

/// A file written before the buckets (one metadata key per group) opens with the same log;
/// opening moves the metadata into the buckets, and writes and reopens go on from there.
#[test]
fn a_file_with_a_metadata_key_per_group_opens_and_moves_to_buckets() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.redb");
    let model = MemLogStore::new();
    let mut last = [0u64; 3];
    let mut n = 0;
    let mut write_some = |log: &RedbLogStore| {
        for _ in 0..50 {
            let next = mixed_batch(n, &mut last);
            model.write(next.clone()).unwrap();
            log.write(next).unwrap();
            n += 1;
        }
    };
    write_some(&RedbLogStore::open(&path, SyncMode::NoSync).unwrap());
    into_legacy_layout(&path);
    {
        let log = RedbLogStore::open(&path, SyncMode::NoSync).unwrap();
        assert_same_log(&log, &model);
        write_some(&log);
    }
    {
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_read().unwrap();
        assert!(
            txn.open_table(LEGACY_GROUPS).is_err(),
            "the old table stayed"
        );
        assert_eq!(txn.open_table(BUCKETS).unwrap().len().unwrap(), 1);
    }
    let log = RedbLogStore::open(&path, SyncMode::NoSync).unwrap();
    assert_same_log(&log, &model);
}
