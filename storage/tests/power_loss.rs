//! Power loss under the redb log and the redb state store: each runs on a simulated disk
//! (`PowerLossDisk`) that, at a seeded write, loses power; the reboot finds what the last sync
//! made durable plus a seeded subset of the writes since, the last possibly torn. The log must
//! open, and hold every batch acknowledged before the power went out (and the one in flight
//! then, or not): nothing half-written is read back as valid. The state store must open at one
//! of its commits, every group at the same one, no earlier than its last acknowledged flush.
//!
//! `CONCORD_POWER_LOSS_CUTS=<n>` (default 40) power cuts; `CONCORD_POWER_LOSS_SEED=<s>`
//! replays a run.

use std::collections::BTreeMap;
use std::path::Path;

use concord_storage::testing::{PowerLossDisk, SeededRng, mixed_batch, same_log};
use concord_storage::{
    GroupCommit, KeyRange, LogStore, MemLogStore, RedbLogStore, RedbStateStore, StateStore,
    SyncMode, WriteSet,
};

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
}

/// The model log after the first `batches` batches of the stream.
fn model(batches: u64) -> MemLogStore {
    let log = MemLogStore::new();
    let mut last = [0; 3];
    for n in 0..batches {
        log.write(mixed_batch(n, &mut last)).unwrap();
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
        let mut last = [0; 3];
        let mut acknowledged = 0;
        let before = rng.below(30);
        for n in 0..before {
            log.write(mixed_batch(n, &mut last)).unwrap();
            acknowledged += 1;
        }
        disk.cut_power_after(rng.below(12));
        for n in before..before + 20 {
            if log.write(mixed_batch(n, &mut last)).is_err() {
                break;
            }
            acknowledged += 1;
        }
        let rebooted = reboot(&disk, &mut rng, &mut torn);
        drop(log);
        let reopened = RedbLogStore::open_on_backend(rebooted, name, SyncMode::Sync)
            .unwrap_or_else(|error| {
                panic!("cut {cut} (seed {seed}): the log did not open after power loss: {error}")
            });
        let found_acknowledged = same_log(&reopened, &model(acknowledged));
        let found_in_flight = same_log(&reopened, &model(acknowledged + 1));
        assert!(
            found_acknowledged || found_in_flight,
            "cut {cut} (seed {seed}): the log is neither the one after the {acknowledged} \
             acknowledged batches nor the one after the batch in flight"
        );
    }
    println!("power loss: {cuts} cuts ({torn} with a torn write), every acknowledged batch kept");
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
fn read_back(store: &RedbStateStore) -> StateModel {
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
    let (cuts, seed) = cuts_and_seed("the redb state store");
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
        let store = RedbStateStore::open_on_backend(disk.clone(), name).unwrap();
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
        "power loss under the state store: {cuts} cuts ({torn} with a torn write, \
         {past_last_flush} reopened past the last acknowledged flush), each at one commit"
    );
}
