//! Power loss under the redb log, the WAL and the redb state store: each runs on a simulated
//! disk (`PowerLossDisk` for redb's file, `PowerLossFiles` for the WAL's directory of
//! segments) that, at a seeded write, loses power; the reboot finds what the last sync made
//! durable plus a seeded subset of the writes since, the last possibly torn (and, for the
//! WAL, the files the last directory sync made durable). A log must open, and hold every batch
//! acknowledged before the power went out (and the one in flight then, or not) except those
//! after its last sync that only moved commit indexes (it writes them without one); nothing
//! half-written is read back as valid; a WAL that does not sync each batch opens at a prefix
//! of its batches no shorter than its last flush. The state store must open at one of its
//! commits, every group at the same one, no earlier than its last acknowledged flush.
//!
//! `CONCORD_POWER_LOSS_CUTS=<n>` (default 40) power cuts; `CONCORD_POWER_LOSS_SEED=<s>`
//! replays a run.

use std::collections::BTreeMap;
use std::path::Path;

use concord_storage::testing::{
    PowerLossDisk, PowerLossFiles, SeededRng, commit_only_batch, mixed_batch, same_log,
};
use concord_storage::{
    GroupCommit, KeyRange, LogBatch, LogStore, MemLogStore, RedbLogStore, RedbStateStore,
    StateStore, SyncMode, WalOptions, WriteBackStateStore, WriteSet,
};

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
}

/// Batch `n` of the stream the synced logs are written with, and whether it must be durable
/// once acknowledged: every fourth batch only moves commit indexes, which a synced log writes
/// without a sync (the next sync makes it durable), the others append.
fn stream_batch(n: u64, last: &mut [u64; 3]) -> (LogBatch, bool) {
    if n % 4 == 3 {
        (commit_only_batch(n, last), false)
    } else {
        (mixed_batch(n, last), true)
    }
}

/// The model log after the first `batches` batches of the stream.
fn model(batches: u64) -> MemLogStore {
    let log = MemLogStore::new();
    let mut last = [0; 3];
    for n in 0..batches {
        log.write(stream_batch(n, &mut last).0).unwrap();
    }
    log
}

/// The disk as a reboot finds it: what was durable plus a seeded subset of the writes since,
/// the last of them torn at a seeded sector in half the cuts (counted in `torn`).
fn reboot(disk: &PowerLossDisk, rng: &mut SeededRng, torn: &mut u32) -> PowerLossDisk {
    let keep_mask = rng.next_u64();
    let torn_sectors = (rng.below(2) == 0).then(|| rng.below(8) as usize);
    if torn_sectors.is_some() && disk.pending_writes() > 0 {
        *torn += 1;
    }
    disk.after_reboot(|i| keep_mask & (1 << (i % 64)) != 0, torn_sectors)
}

/// Power cuts to run, and the seed (printed, to replay a run).
fn cuts_and_seed(what: &str) -> (u64, u64) {
    let cuts = env_number("CONCORD_POWER_LOSS_CUTS").unwrap_or(40);
    let seed = env_number("CONCORD_POWER_LOSS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1
    });
    println!("power loss under {what}: {cuts} cuts, CONCORD_POWER_LOSS_SEED={seed}");
    (cuts, seed)
}

#[test]
fn the_redb_log_keeps_every_acknowledged_batch_across_power_loss() {
    let (cuts, seed) = cuts_and_seed("the redb log");
    let mut rng = SeededRng::new(seed);
    let name = Path::new("power-loss.redb");
    let mut torn = 0;
    for cut in 0..cuts {
        let disk = PowerLossDisk::new();
        let log = RedbLogStore::open_on_backend(disk.clone(), name, SyncMode::Sync).unwrap();
        // Some batches go through; the power goes out a seeded number of disk writes later.
        // `durable`: the batches up to the last that had to be durable when acknowledged (or
        // the last flush).
        let mut last = [0; 3];
        let (mut acknowledged, mut durable) = (0, 0);
        let before = rng.below(30);
        for n in 0..before + 20 {
            if n == before {
                disk.cut_power_after(rng.below(12));
            }
            let (batch, must_be_durable) = stream_batch(n, &mut last);
            if log.write(batch).is_err() {
                break;
            }
            acknowledged += 1;
            if must_be_durable {
                durable = acknowledged;
            }
            if rng.below(6) == 0 {
                if log.flush().is_err() {
                    break;
                }
                durable = acknowledged;
            }
        }
        let rebooted = reboot(&disk, &mut rng, &mut torn);
        drop(log);
        let reopened = RedbLogStore::open_on_backend(rebooted, name, SyncMode::Sync)
            .unwrap_or_else(|error| {
                panic!("cut {cut} (seed {seed}): the log did not open after power loss: {error}")
            });
        assert!(
            (durable..=acknowledged + 1).any(|k| same_log(&reopened, &model(k))),
            "cut {cut} (seed {seed}): the log is none of those after {durable}..={} batches \
             ({acknowledged} acknowledged, the batches after the {durable}th only moved commit \
             indexes)",
            acknowledged + 1
        );
    }
    println!("power loss: {cuts} cuts ({torn} with a torn write), every acknowledged batch kept");
}

/// The WAL reboot: like [`reboot`], over its directory of segments.
fn reboot_files(disk: &PowerLossFiles, rng: &mut SeededRng, torn: &mut u32) -> PowerLossFiles {
    let keep_mask = rng.next_u64();
    let torn_sectors = (rng.below(2) == 0).then(|| rng.below(8) as usize);
    if torn_sectors.is_some() && disk.pending_writes() > 0 {
        *torn += 1;
    }
    disk.after_reboot(|i| keep_mask & (1 << (i % 64)) != 0, torn_sectors)
}

/// Segments of 2 KiB, a checkpoint after two: within a few dozen batches the WAL rotates,
/// checkpoints and deletes segments, so power cuts land in each of those too.
fn small_segments() -> WalOptions {
    WalOptions {
        segment_bytes: 2048,
        checkpoint_after_segments: 2,
    }
}

/// The model log after the batches `ids` of the stream, in that order.
fn model_of(ids: &[u64]) -> MemLogStore {
    let log = MemLogStore::new();
    let mut last = [0; 3];
    for &n in ids {
        log.write(stream_batch(n, &mut last).0).unwrap();
    }
    log
}

/// Where the stream stands after the batches `ids` (what `stream_batch` needs to go on).
fn stream_after(ids: &[u64]) -> [u64; 3] {
    let mut last = [0; 3];
    for &n in ids {
        stream_batch(n, &mut last);
    }
    last
}

/// Power cuts and process deaths in a row on one disk: each round writes batches of its own
/// (ids from `round * 1000`, so a record of an earlier round that came back would show) on from
/// where the log reopened.
const WAL_ROUNDS: u64 = 3;

/// How a round ends: the power goes out (and `torn` counts torn writes), or only the process
/// dies (every write stays in the page cache). The disk the log reopens on.
fn end_round(disk: PowerLossFiles, rng: &mut SeededRng, torn: &mut u32) -> PowerLossFiles {
    if rng.below(3) == 0 {
        disk.restart_process();
        disk
    } else {
        reboot_files(&disk, rng, torn)
    }
}

#[test]
fn the_wal_keeps_every_acknowledged_batch_across_power_loss() {
    let (cuts, seed) = cuts_and_seed("the WAL");
    let mut rng = SeededRng::new(seed);
    let dir = Path::new("/wal");
    let mut torn = 0;
    for cut in 0..cuts {
        let mut disk = PowerLossFiles::new();
        let mut log = disk
            .open_wal(dir, SyncMode::Sync, small_segments())
            .unwrap();
        let mut kept: Vec<u64> = Vec::new(); // The batches the log holds.
        for round in 0..WAL_ROUNDS {
            let mut last = stream_after(&kept);
            let mut acknowledged = kept.clone();
            // The batches up to the last that had to be durable when acknowledged.
            let mut durable = kept.len();
            let ids = round * 1000..round * 1000 + 100;
            let before = rng.below(60) as usize;
            // A checkpoint takes a few dozen operations: cuts land anywhere in one.
            let cut_after = rng.below(64);
            let mut in_flight = None;
            for (i, n) in ids.enumerate() {
                if i == before {
                    disk.cut_power_after(cut_after);
                }
                let (batch, must_be_durable) = stream_batch(n, &mut last);
                if i == before + 40 || log.write(batch).is_err() {
                    in_flight = Some(n);
                    break;
                }
                acknowledged.push(n);
                if must_be_durable {
                    durable = acknowledged.len();
                }
            }
            // Gone before the restart, as a dead process is: no close, no last sync.
            drop(log);
            disk = end_round(disk, &mut rng, &mut torn);
            log = disk
                .open_wal(dir, SyncMode::Sync, small_segments())
                .unwrap_or_else(|error| {
                    panic!(
                        "cut {cut}, round {round} (seed {seed}): the WAL did not open after \
                         power loss: {error}"
                    )
                });
            let mut written = acknowledged;
            written.extend(in_flight);
            let length = (durable..=written.len())
                .find(|&k| same_log(&log, &model_of(&written[..k])))
                .unwrap_or_else(|| {
                    panic!(
                        "cut {cut}, round {round} (seed {seed}): the WAL is none of the logs of \
                         the first {durable}..={} batches (the acknowledged ones after the \
                         {durable}th only moved commit indexes, the last was in flight)",
                        written.len()
                    )
                });
            written.truncate(length);
            kept = written;
        }
    }
    println!(
        "power loss under the WAL: {cuts} × {WAL_ROUNDS} cuts ({torn} with a torn write), \
         every acknowledged batch kept"
    );
}

#[test]
fn the_wal_without_sync_opens_at_a_prefix_no_shorter_than_its_last_flush() {
    let (cuts, seed) = cuts_and_seed("the WAL without sync");
    let mut rng = SeededRng::new(seed);
    let dir = Path::new("/wal");
    let (mut torn, mut past_last_flush) = (0, 0);
    for cut in 0..cuts {
        let mut disk = PowerLossFiles::new();
        let mut log = disk
            .open_wal(dir, SyncMode::NoSync, small_segments())
            .unwrap();
        let mut kept: Vec<u64> = Vec::new(); // The batches the log holds.
        for round in 0..WAL_ROUNDS {
            let mut last = stream_after(&kept);
            let mut written = kept.clone();
            let mut flushed = kept.len();
            // Half the cuts come within a few batches, before the round's first flush: what
            // the last round left unsynced is then still at stake.
            let batches = if rng.below(2) == 0 { 8 } else { 60 };
            let before = rng.below(batches) as usize;
            let cut_after = rng.below(64);
            for (i, n) in (round * 1000..round * 1000 + 100).enumerate() {
                if i == before {
                    disk.cut_power_after(cut_after);
                }
                if i == before + 40 {
                    break;
                }
                // A batch that failed may have reached the disk or not: counted as written.
                written.push(n);
                if log.write(stream_batch(n, &mut last).0).is_err() {
                    break;
                }
                if rng.below(5) == 0 {
                    if log.flush().is_err() {
                        break;
                    }
                    flushed = written.len();
                }
            }
            // Gone before the restart, as a dead process is: no close, no last sync.
            drop(log);
            disk = end_round(disk, &mut rng, &mut torn);
            log = disk
                .open_wal(dir, SyncMode::NoSync, small_segments())
                .unwrap_or_else(|error| {
                    panic!(
                        "cut {cut}, round {round} (seed {seed}): the WAL did not open after \
                         power loss: {error}"
                    )
                });
            let length = (flushed..=written.len())
                .find(|&k| same_log(&log, &model_of(&written[..k])))
                .unwrap_or_else(|| {
                    panic!(
                        "cut {cut}, round {round} (seed {seed}): the WAL opened as none of the \
                         logs of the first {flushed}..={} batches written",
                        written.len()
                    )
                });
            if length > flushed {
                past_last_flush += 1;
            }
            written.truncate(length);
            kept = written;
        }
    }
    println!(
        "power loss under the WAL without sync: {cuts} × {WAL_ROUNDS} cuts ({torn} with a torn \
         write, {past_last_flush} opened past the last flush), each at a prefix"
    );
}

/// Groups of the state stream.
const GROUPS: u64 = 3;

/// The state store's content and applied indexes after some steps of the stream.
#[derive(Clone, Debug, Default, PartialEq)]
struct StateModel {
    applied: [u64; GROUPS as usize],
    data: BTreeMap<(u64, Vec<u8>), Vec<u8>>,
}

/// Step `n` of the state stream: one transaction over one group, or every fourth over all
/// three; each group's writes put one key (values of up to 1.2 KB, so that steps span pages)
/// and every third step deletes another.
fn state_step(n: u64, model: &mut StateModel) -> Vec<GroupCommit> {
    let groups: Vec<u64> = if n % 4 == 3 {
        (0..GROUPS).collect()
    } else {
        vec![n % GROUPS]
    };
    groups
        .into_iter()
        .map(|group| {
            let mut writes = WriteSet::new();
            let key = format!("key-{}", (n * 7 + group) % 23).into_bytes();
            let value = format!("value {n} of group {group} ")
                .repeat(1 + (n % 5) as usize * 12)
                .into_bytes();
            writes.put(&key, &value).unwrap();
            model.data.insert((group, key), value);
            if n.is_multiple_of(3) {
                let gone = format!("key-{}", (n * 7 + group + 11) % 23).into_bytes();
                writes.delete(&gone).unwrap();
                model.data.remove(&(group, gone));
            }
            model.applied[group as usize] += 1;
            GroupCommit {
                group,
                writes,
                applied_index: model.applied[group as usize],
            }
        })
        .collect()
}

/// What the reopened store holds, in the model's shape.
fn read_back(store: &dyn StateStore) -> StateModel {
    let mut found = StateModel::default();
    for group in 0..GROUPS {
        found.applied[group as usize] = store.applied_index(group).unwrap();
        for (key, value) in store.scan(group, &KeyRange::all(), usize::MAX).unwrap() {
            found.data.insert((group, key), value);
        }
    }
    found
}

#[test]
fn the_redb_state_store_reopens_at_one_of_its_commits_across_power_loss() {
    reopens_at_one_of_its_commits_across_power_loss("the redb state store", |store| store);
}

#[test]
fn the_write_back_store_over_redb_reopens_at_one_of_its_commits_across_power_loss() {
    reopens_at_one_of_its_commits_across_power_loss(
        "the write-back store over redb",
        WriteBackStateStore::new,
    );
}

/// Commits and flushes through the store `wrap` makes of a redb state store on a disk that
/// loses power; the redb file reopened must hold one of the commits between the last
/// acknowledged flush and the last commit.
fn reopens_at_one_of_its_commits_across_power_loss<S: StateStore>(
    what: &str,
    wrap: fn(RedbStateStore) -> S,
) {
    let (cuts, seed) = cuts_and_seed(what);
    let mut rng = SeededRng::new(seed);
    let name = Path::new("power-loss-state.redb");
    // The model after each number of steps: states[k] is the store after k steps.
    let mut states = vec![StateModel::default()];
    let mut model = StateModel::default();
    let mut steps = Vec::new();
    for n in 0..60 {
        steps.push(state_step(n, &mut model));
        states.push(model.clone());
    }
    let (mut torn, mut past_last_flush) = (0, 0);
    for cut in 0..cuts {
        let disk = PowerLossDisk::new();
        let store = wrap(RedbStateStore::open_on_backend(disk.clone(), name).unwrap());
        // Steps committed (not synced) and flushed now and then; the power goes out a seeded
        // number of disk writes into the rest.
        let mut committed = 0;
        let mut flushed = 0;
        let before = rng.below(30) as usize;
        let mut power_cut_at = None;
        for (n, step) in steps.iter().enumerate() {
            if n == before {
                disk.cut_power_after(rng.below(12));
                power_cut_at = Some(n);
            }
            if power_cut_at.is_some_and(|at| n >= at + 20) {
                break;
            }
            if store.commit_groups(step.clone()).is_err() {
                // The step in flight may have reached the disk or not.
                committed = n + 1;
                break;
            }
            committed = n + 1;
            if rng.below(4) == 0 {
                if store.flush().is_err() {
                    break;
                }
                flushed = committed;
            }
        }
        let rebooted = reboot(&disk, &mut rng, &mut torn);
        drop(store);
        let reopened = RedbStateStore::open_on_backend(rebooted, name).unwrap_or_else(|error| {
            panic!(
                "cut {cut} (seed {seed}): the state store did not open after power loss: {error}"
            )
        });
        let found = read_back(&reopened);
        let at = (flushed..=committed)
            .find(|&k| states[k] == found)
            .unwrap_or_else(|| {
                panic!(
                    "cut {cut} (seed {seed}): the state store reopened as none of its commits \
                     {flushed}..={committed} (applied {:?}, {} keys)",
                    found.applied,
                    found.data.len()
                )
            });
        if at > flushed {
            past_last_flush += 1;
        }
    }
    println!(
        "power loss under {what}: {cuts} cuts ({torn} with a torn write, \
         {past_last_flush} reopened past the last acknowledged flush), each at one commit"
    );
}
