//! The redb log store beyond the conformance suite: records die when their entries do, a
//! group that stops writing does not keep old records alive, and every reopen rebuilds
//! exactly the model's log from the records.

use std::path::Path;

use concord_storage::testing::{assert_same_log, make_entries, mixed_batch};
use concord_storage::{LogBatch, LogStore, MemLogStore, RedbLogStore, SyncMode};
use redb::{ReadableDatabase as _, ReadableTableMetadata as _};

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
/// relocation copies their few live entries forward so that those records go.
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
        for group in 1..=4u64 {
            for index in 1..=40 {
                let mut batch = LogBatch::new();
                batch.append(group, make_entries(group, index..=index, 1));
                // The busy group writes alongside, so that its dead entries fill these records.
                batch.append(
                    9,
                    make_entries(9, (group - 1) * 40 + index..=(group - 1) * 40 + index, 1),
                );
                both(batch, &log);
            }
        }
        assert_eq!(log.live_record_count(), 160);
        for index in 161..=600u64 {
            let mut batch = LogBatch::new();
            batch.append(9, make_entries(9, index..=index, 1));
            if index % 10 == 0 {
                batch.compact(9, index - 10);
            }
            both(batch, &log);
        }
        // The widest group spans 40 records: at most 2 * 40 + 16 stay, not the 160 + 10 the
        // stopped groups and the busy one would otherwise keep.
        assert!(
            log.live_record_count() <= 96,
            "old records kept: {}",
            log.live_record_count()
        );
        assert_same_log(&log, &model);
    }
    assert!(records_in_file(&path) <= 100, "{}", records_in_file(&path));
    let log = RedbLogStore::open(&path, SyncMode::NoSync).unwrap();
    assert_same_log(&log, &model);
}
