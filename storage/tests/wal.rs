//! The WAL log store beyond the conformance suite: segment rotation, checkpoints, torn tails
//! and damage, with tiny segments so that every path runs.

use std::path::Path;

use concord_storage::testing::{assert_same_log, mixed_batch};
use concord_storage::{LogStore, MemLogStore, StorageError, SyncMode, WalLogStore, WalOptions};

const TINY: WalOptions = WalOptions {
    segment_bytes: 4096,
    checkpoint_after_segments: 3,
};

fn segment_count(dir: &Path) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

/// The highest segment sequence number in `dir`.
fn newest_segment(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            u64::from_str_radix(name.trim_end_matches(".wal"), 16).unwrap()
        })
        .max()
        .unwrap()
}

/// Hundreds of batches over 4 KiB segments: the log rotates and checkpoints, the files stay
/// bounded, and every reopen replays exactly the model's log.
#[test]
fn tiny_segments_rotate_checkpoint_and_replay() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.wal");
    let model = MemLogStore::new();
    let mut last = [0u64; 3];
    let mut most_segments = 0;
    for round in 0..5u64 {
        let wal = WalLogStore::open_with(&path, SyncMode::NoSync, TINY).unwrap();
        assert_same_log(&wal, &model);
        for n in round * 100..(round + 1) * 100 {
            let next = mixed_batch(n, &mut last);
            model.write(next.clone()).unwrap();
            wal.write(next).unwrap();
            most_segments = most_segments.max(segment_count(&path));
        }
        assert_same_log(&wal, &model);
    }
    assert!(newest_segment(&path) > 20, "the log hardly rotated");
    assert!(
        most_segments < 40,
        "checkpoints did not bound the files: {most_segments}"
    );
}

/// The last record cut short (a write the process died in) is dropped on reopen, its tail is
/// zeroed, and the log goes on from the record before it.
#[test]
fn torn_tail_is_dropped_and_the_log_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.wal");
    let model = MemLogStore::new();
    let mut last = [0u64; 3];
    {
        let wal = WalLogStore::open_with(&path, SyncMode::Sync, WalOptions::default()).unwrap();
        for n in 0..10 {
            let next = mixed_batch(n, &mut last);
            if n < 9 {
                model.write(next.clone()).unwrap();
            }
            wal.write(next).unwrap();
        }
    }
    // Damage the last record: flip its last written byte.
    let segment = std::fs::read_dir(&path)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut bytes = std::fs::read(&segment).unwrap();
    let end = bytes.iter().rposition(|&b| b != 0).unwrap();
    bytes[end] ^= 0xff;
    std::fs::write(&segment, &bytes).unwrap();

    let wal = WalLogStore::open_with(&path, SyncMode::Sync, WalOptions::default()).unwrap();
    assert_same_log(&wal, &model);
    let mut last = [0u64; 3];
    for group in 0..3u64 {
        last[group as usize] = model.last_index(group).unwrap();
    }
    let next = mixed_batch(9, &mut last);
    model.write(next.clone()).unwrap();
    wal.write(next).unwrap();
    drop(wal);
    let wal = WalLogStore::open_with(&path, SyncMode::Sync, WalOptions::default()).unwrap();
    assert_same_log(&wal, &model);
}

/// Damage before the end of the log is corruption, reported with the file's name.
#[test]
fn damage_before_the_end_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.wal");
    let mut last = [0u64; 3];
    {
        let wal = WalLogStore::open_with(&path, SyncMode::Sync, WalOptions::default()).unwrap();
        for n in 0..10 {
            wal.write(mixed_batch(n, &mut last)).unwrap();
        }
    }
    let segment = std::fs::read_dir(&path)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[20] ^= 0xff; // Inside the first record.
    std::fs::write(&segment, &bytes).unwrap();
    // In the last segment the damaged record ends the log: everything after it is dropped.
    // That is only acceptable for a torn tail, so the store must not open silently short:
    let error = WalLogStore::open_with(&path, SyncMode::Sync, WalOptions::default());
    match error {
        Err(StorageError::Corrupted { path, .. }) => {
            assert!(path.to_string_lossy().ends_with(".wal"), "{path:?}");
        }
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("a log damaged before its end opened without complaint"),
    }
}

/// A record lost in a power cut while a later one reached the disk (a disk may keep any subset
/// of the writes since the last sync): the log ends before the lost record, and what follows
/// it is zeroed at once. Left in place, the later record would come back on a later reopen,
/// as soon as the log had written a record of the lost one's length in its place.
#[test]
fn records_after_a_lost_one_never_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.wal");
    let segment = || {
        std::fs::read_dir(&path)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path()
    };
    // Batches 0..8, then 8, then 9, each in a run of its own: the bytes that change tell
    // where the records of batches 8 and 9 start.
    let model = MemLogStore::new();
    let mut last = [0u64; 3];
    let mut images = Vec::new();
    for run in [0..8u64, 8..9, 9..10] {
        let wal = WalLogStore::open_with(&path, SyncMode::Sync, WalOptions::default()).unwrap();
        for n in run {
            let next = mixed_batch(n, &mut last);
            if n < 8 {
                model.write(next.clone()).unwrap();
            }
            wal.write(next).unwrap();
        }
        drop(wal);
        images.push(std::fs::read(segment()).unwrap());
    }
    let first_difference = |a: &[u8], b: &[u8]| a.iter().zip(b).position(|(x, y)| x != y).unwrap();
    let record_8 = first_difference(&images[0], &images[1]);
    let record_9 = first_difference(&images[1], &images[2]);
    // The power cut kept batch 9's record and lost batch 8's.
    let mut cut = images[2].clone();
    cut[record_8..record_9].fill(0);
    std::fs::write(segment(), &cut).unwrap();

    let wal = WalLogStore::open_with(&path, SyncMode::Sync, WalOptions::default()).unwrap();
    assert_same_log(&wal, &model);
    // The log goes on with batch 8 again: a record of the very length of the lost one.
    let mut last = [0u64; 3];
    for group in 0..3u64 {
        last[group as usize] = model.last_index(group).unwrap();
    }
    let next = mixed_batch(8, &mut last);
    model.write(next.clone()).unwrap();
    wal.write(next).unwrap();
    drop(wal);
    let wal = WalLogStore::open_with(&path, SyncMode::Sync, WalOptions::default()).unwrap();
    assert_same_log(&wal, &model);
}
