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

/// Writes batches `0..count` into a WAL at `path` and closes it; returns the log of the first
/// `modelled` of them.
fn write_batches(path: &Path, count: u64, modelled: u64) -> MemLogStore {
    let model = MemLogStore::new();
    let mut last = [0u64; 3];
    let wal = WalLogStore::open_with(path, SyncMode::Sync, WalOptions::default()).unwrap();
    for n in 0..count {
        let next = mixed_batch(n, &mut last);
        if n < modelled {
            model.write(next.clone()).unwrap();
        }
        wal.write(next).unwrap();
    }
    model
}

/// Reopens the log at `path`, which must be `model`; writes batch `n` after it and reopens
/// again: the log must be `model` with batch `n`.
fn reopens_as_and_goes_on(path: &Path, model: &MemLogStore, n: u64) {
    let wal = WalLogStore::open_with(path, SyncMode::Sync, WalOptions::default()).unwrap();
    assert_same_log(&wal, model);
    let mut last = [0u64; 3];
    for group in 0..3u64 {
        last[group as usize] = model.last_index(group).unwrap();
    }
    let next = mixed_batch(n, &mut last);
    model.write(next.clone()).unwrap();
    wal.write(next).unwrap();
    drop(wal);
    let wal = WalLogStore::open_with(path, SyncMode::Sync, WalOptions::default()).unwrap();
    assert_same_log(&wal, model);
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
    let model = write_batches(&path, 10, 9);
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

    reopens_as_and_goes_on(&path, &model, 9);
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

/// Writes batches 0..8 synced, then 8 and 9 in one run, in `mode`; returns the segment, its
/// bytes, where the records of batches 8 and 9 start, and the log of batches 0..8.
fn two_records_after_eight(
    path: &Path,
    mode: SyncMode,
) -> (std::path::PathBuf, Vec<u8>, usize, usize, MemLogStore) {
    let segment = || {
        std::fs::read_dir(path)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path()
    };
    let model = MemLogStore::new();
    let mut last = [0u64; 3];
    let wal = WalLogStore::open_with(path, SyncMode::Sync, WalOptions::default()).unwrap();
    for n in 0..8 {
        let next = mixed_batch(n, &mut last);
        model.write(next.clone()).unwrap();
        wal.write(next).unwrap();
    }
    drop(wal);
    // The records' bytes are read while the store is open: what was written, synced or not.
    let wal = WalLogStore::open_with(path, mode, WalOptions::default()).unwrap();
    let mut images = vec![std::fs::read(segment()).unwrap()];
    for n in 8..10 {
        wal.write(mixed_batch(n, &mut last)).unwrap();
        images.push(std::fs::read(segment()).unwrap());
    }
    drop(wal);
    let first_difference = |a: &[u8], b: &[u8]| a.iter().zip(b).position(|(x, y)| x != y).unwrap();
    let record_8 = first_difference(&images[0], &images[1]);
    let record_9 = first_difference(&images[1], &images[2]);
    (segment(), images.pop().unwrap(), record_8, record_9, model)
}

/// A power cut within one unsynced window (no log sync) that lost batch 8's record but kept
/// batch 9's (a disk may keep any subset of the writes since its last sync): the log ends
/// before batch 8, the node starts, and batch 9's record never comes back — not even once a
/// record of the lost one's very length has been written in its place.
#[test]
fn a_record_kept_after_a_lost_one_in_its_window_is_dropped_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.wal");
    let (segment, mut cut, record_8, record_9, model) =
        two_records_after_eight(&path, SyncMode::NoSync);
    cut[record_8..record_9].fill(0);
    std::fs::write(&segment, &cut).unwrap();

    reopens_as_and_goes_on(&path, &model, 8);
}

/// The same window with batch 8's record torn (a byte flipped) rather than lost: the node
/// starts with the log before batch 8.
#[test]
fn a_torn_record_before_a_kept_one_in_its_window_ends_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.wal");
    let (segment, mut cut, record_8, record_9, model) =
        two_records_after_eight(&path, SyncMode::NoSync);
    cut[(record_8 + record_9) / 2] ^= 0xff;
    std::fs::write(&segment, &cut).unwrap();
    let wal = WalLogStore::open_with(&path, SyncMode::Sync, WalOptions::default()).unwrap();
    assert_same_log(&wal, &model);
}

/// With log sync, batch 9's record says the segment was synced past batch 8's: batch 8 was
/// acknowledged, and its record lost or torn is corruption, not a power cut.
#[test]
fn a_synced_record_lost_before_a_later_one_is_corruption() {
    for tear in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.wal");
        let (segment, mut cut, record_8, record_9, _) =
            two_records_after_eight(&path, SyncMode::Sync);
        if tear {
            cut[(record_8 + record_9) / 2] ^= 0xff;
        } else {
            cut[record_8..record_9].fill(0);
        }
        std::fs::write(&segment, &cut).unwrap();
        match WalLogStore::open_with(&path, SyncMode::Sync, WalOptions::default()) {
            Err(StorageError::Corrupted { detail, .. }) => {
                assert!(detail.contains("before the end of the log"), "{detail}");
            }
            Err(other) => panic!("unexpected error {other}"),
            Ok(_) => panic!("an acknowledged record lost (torn: {tear}) went unreported"),
        }
    }
}

/// A checkpoint the process died writing (its file still named `.partial`) is no part of the
/// log: opening removes it and replays the segments alone.
#[test]
fn a_checkpoint_left_partial_by_a_crash_is_removed_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.wal");
    let model = write_batches(&path, 10, 10);
    let partial = path.join(format!("{:016x}.wal.partial", newest_segment(&path) + 1));
    std::fs::write(&partial, b"half a checkpoint").unwrap();
    reopens_as_and_goes_on(&path, &model, 10);
    assert!(
        !partial.exists(),
        "the partial checkpoint was left in place"
    );
}
