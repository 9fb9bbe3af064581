//! `LogStore::write` by backend x sync x groups x entries per group (150-byte entries), and
//! one write that compacts every group of thousands (as a node's tick may).
//!
//! Throughput is in entries (groups for the compaction case); `concord-bench storage` reports
//! MB/s and syncs per write for the first cases.

use std::time::Duration;

use concord_bench::workload::LogWorkload;
use concord_storage::raft::prelude::Entry;
use concord_storage::{
    BackendKind, DEFAULT_STATE_CACHE_BYTES, LogBatch, LogStore, MemLogStore, StoreConfig, Stores,
    SyncMode,
};
use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

const PAYLOAD_BYTES: usize = 150;

fn log_store_write(c: &mut Criterion) {
    let scratch = std::path::Path::new("bench-scratch");
    std::fs::create_dir_all(scratch).unwrap();
    let mut bench = c.benchmark_group("LogStore::write");
    bench
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for backend in BackendKind::ALL {
        let modes = if backend.is_persistent() {
            vec![SyncMode::Sync, SyncMode::NoSync]
        } else {
            vec![SyncMode::NoSync]
        };
        for sync in modes {
            for groups in [1u64, 16] {
                for batch in [1u64, 64, 1024] {
                    let dir = tempfile::Builder::new()
                        .prefix("concord-criterion-")
                        .tempdir_in(scratch)
                        .unwrap();
                    let stores = Stores::open(&StoreConfig {
                        backend,
                        data_dir: dir.path().to_path_buf(),
                        log_sync: sync,
                        state_cache_bytes: DEFAULT_STATE_CACHE_BYTES,
                    })
                    .unwrap();
                    let mut workload = LogWorkload::new(groups, batch, PAYLOAD_BYTES);
                    bench.throughput(Throughput::Elements(workload.entries_per_batch()));
                    let sync_name = if sync.is_sync() { "sync" } else { "nosync" };
                    let id = BenchmarkId::new(
                        format!("{backend}/{sync_name}/groups={groups}"),
                        format!("batch={batch}"),
                    );
                    bench.bench_function(id, |b| {
                        b.iter_batched(
                            || workload.next_batch(),
                            |next| stores.log.write(next).unwrap(),
                            BatchSize::SmallInput,
                        )
                    });
                }
            }
        }
    }
    bench.finish();
}

/// Entries each group holds before the compacting write.
const ENTRIES_BEFORE_COMPACTION: u64 = 10;

/// One write in which every group appends an entry and compacts half of its log: the plan
/// finds each compaction's term among its own group's writes, so the write's time grows with
/// the groups, not with their square.
fn log_store_compact_every_group(c: &mut Criterion) {
    let mut bench = c.benchmark_group("LogStore::write compacting every group");
    bench
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let entry = |index| {
        let mut entry = Entry::default();
        entry.index = index;
        entry.term = 1;
        entry
    };
    for groups in [1024u64, 10_000] {
        let filled = || {
            let store = MemLogStore::new();
            let mut batch = LogBatch::new();
            for group in 0..groups {
                batch.append(group, (1..=ENTRIES_BEFORE_COMPACTION).map(entry).collect());
            }
            store.write(batch).unwrap();
            let mut compacting = LogBatch::new();
            for group in 0..groups {
                compacting.append(group, vec![entry(ENTRIES_BEFORE_COMPACTION + 1)]);
            }
            for group in 0..groups {
                compacting.compact(group, ENTRIES_BEFORE_COMPACTION / 2 + 1);
            }
            (store, compacting)
        };
        bench.throughput(Throughput::Elements(groups));
        bench.bench_function(BenchmarkId::new("mem", format!("groups={groups}")), |b| {
            b.iter_batched(
                filled,
                |(store, compacting)| {
                    store.write(compacting).unwrap();
                    store
                },
                BatchSize::PerIteration,
            )
        });
    }
    bench.finish();
}

criterion_group!(benches, log_store_write, log_store_compact_every_group);
criterion_main!(benches);
