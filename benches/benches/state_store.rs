//! `StateStore::commit` by backend x puts per commit (150-byte values), no sync per commit.

use std::time::Duration;

use concord_bench::workload::StateWorkload;
use concord_storage::{BackendKind, StoreConfig, Stores};
use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

const VALUE_BYTES: usize = 150;

fn state_store_commit(c: &mut Criterion) {
    let scratch = std::path::Path::new("bench-scratch");
    std::fs::create_dir_all(scratch).unwrap();
    let mut bench = c.benchmark_group("StateStore::commit");
    bench
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for backend in BackendKind::ALL {
        for batch in [1u64, 64, 1024] {
            let dir = tempfile::Builder::new()
                .prefix("concord-criterion-")
                .tempdir_in(scratch)
                .unwrap();
            let stores = Stores::open(&StoreConfig::new(backend, dir.path())).unwrap();
            let mut workload = StateWorkload::new(batch, VALUE_BYTES);
            bench.throughput(Throughput::Elements(batch));
            let id = BenchmarkId::new(backend.name(), format!("batch={batch}"));
            bench.bench_function(id, |b| {
                b.iter_batched(
                    || workload.next_commit(),
                    |(writes, applied)| stores.state.commit(0, writes, applied).unwrap(),
                    BatchSize::SmallInput,
                )
            });
        }
    }
    bench.finish();
}

criterion_group!(benches, state_store_commit);
criterion_main!(benches);
