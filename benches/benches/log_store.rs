//! `LogStore::write` by backend x sync x groups x entries per group (150-byte entries).
//!
//! Throughput is in entries; `concord-bench storage` reports MB/s and syncs per write for the
//! same cases.

use std::time::Duration;

use concord_bench::workload::LogWorkload;
use concord_storage::{BackendKind, DEFAULT_STATE_CACHE_BYTES, StoreConfig, Stores, SyncMode};
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

criterion_group!(benches, log_store_write);
criterion_main!(benches);
