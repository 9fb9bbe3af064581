//! Power loss under the redb log: the log runs on a simulated disk (`PowerLossDisk`) that,
//! at a seeded write, loses power; the reboot finds what the last sync made durable plus a
//! seeded subset of the writes since, the last possibly torn. The log must open, and hold every
//! batch acknowledged before the power went out (and the one in flight then, or not): nothing
//! half-written is read back as valid.
//!
//! `CONCORD_POWER_LOSS_CUTS=<n>` (default 40) power cuts; `CONCORD_POWER_LOSS_SEED=<s>`
//! replays a run.

use std::path::Path;

use concord_storage::testing::{PowerLossDisk, SeededRng, mixed_batch, same_log};
use concord_storage::{LogStore, MemLogStore, RedbLogStore, SyncMode};

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

#[test]
fn the_redb_log_keeps_every_acknowledged_batch_across_power_loss() {
    let cuts = env_number("CONCORD_POWER_LOSS_CUTS").unwrap_or(40);
    let seed = env_number("CONCORD_POWER_LOSS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1
    });
    println!("power loss: {cuts} cuts, CONCORD_POWER_LOSS_SEED={seed}");
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
        let pending = disk.pending_writes();
        let keep_mask = rng.next_u64();
        let torn_sectors = (rng.below(2) == 0).then(|| rng.below(8) as usize);
        if torn_sectors.is_some() && pending > 0 {
            torn += 1;
        }
        let rebooted = disk.after_reboot(|i| keep_mask & (1 << (i % 64)) != 0, torn_sectors);
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
