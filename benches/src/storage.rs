//! The `storage` benchmark: log appends and state commits on every backend, side by side.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use concord_storage::{BackendKind, DEFAULT_STATE_CACHE_BYTES, StoreConfig, Stores, SyncMode};
use serde::Serialize;

use crate::latency::Latencies;
use crate::report::{human_rate, print_json};
use crate::workload::{LogWorkload, StateWorkload};

/// What to run.
#[derive(Clone, Debug)]
pub struct StorageBenchConfig {
    /// Backends to compare.
    pub backends: Vec<BackendKind>,
    /// Entries per group in each log write (and puts per state commit).
    pub batch_sizes: Vec<u64>,
    /// Groups in each log write.
    pub groups: Vec<u64>,
    /// Sync modes for the disk backends (the memory backend never syncs and runs once).
    pub sync_modes: Vec<SyncMode>,
    /// How long each case runs.
    pub duration: Duration,
    /// Bytes of each entry's payload and each state value.
    pub payload_bytes: usize,
    /// Where the scratch data directories go (must be on the disk being measured).
    pub scratch_dir: PathBuf,
    /// State commits put keys never written before (the state grows for the whole case)
    /// instead of rewriting a fixed set of keys.
    pub fresh_keys: bool,
}

/// One log-append case.
#[derive(Debug, Serialize)]
pub struct LogAppendResult {
    /// Always `"log_append"`.
    pub case: &'static str,
    /// Backend name.
    pub backend: &'static str,
    /// Whether each write was synced.
    pub sync: bool,
    /// Groups per write.
    pub groups: u64,
    /// Entries per group per write.
    pub batch: u64,
    /// Payload bytes per entry.
    pub payload_bytes: usize,
    /// Writes (LogStore::write calls) completed.
    pub writes: u64,
    /// Entries appended.
    pub entries: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Entries appended per second.
    pub entries_per_sec: f64,
    /// Payload megabytes (10^6) appended per second.
    pub mb_per_sec: f64,
    /// Writes per second.
    pub writes_per_sec: f64,
    /// Syncs that reached the disk.
    pub syncs: u64,
    /// Syncs per write (1.0 is group commit working).
    pub syncs_per_write: f64,
    /// Median write latency.
    pub p50_us: u64,
    /// 99th percentile write latency.
    pub p99_us: u64,
}

/// One state-commit case.
#[derive(Debug, Serialize)]
pub struct StateCommitResult {
    /// Always `"state_commit"`.
    pub case: &'static str,
    /// Backend name.
    pub backend: &'static str,
    /// Puts per commit.
    pub batch: u64,
    /// Value bytes per put.
    pub payload_bytes: usize,
    /// Every put a new key (the state grows), not a rewrite of one of 100,000 keys.
    pub fresh_keys: bool,
    /// Commits completed.
    pub commits: u64,
    /// Puts applied.
    pub writes: u64,
    /// Wall-clock seconds, including the final flush.
    pub seconds: f64,
    /// Puts applied per second.
    pub writes_per_sec: f64,
    /// Commits per second.
    pub commits_per_sec: f64,
    /// Median commit latency.
    pub p50_us: u64,
    /// 99th percentile commit latency.
    pub p99_us: u64,
    /// The longest commit: a pause of the store (a table growing, a page cache evicting).
    pub max_us: u64,
}

/// Runs every case of `config`, printing table lines and JSON lines as each case finishes.
pub fn run(config: &StorageBenchConfig) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(&config.scratch_dir)?;
    let probe = crate::fsync_probe::probe(&config.scratch_dir, Duration::from_secs(1), 4096)?;
    println!(
        "fsync probe: {} syncs/s, p50 {} us, p99 {} us",
        human_rate(probe.syncs_per_sec),
        probe.p50_us,
        probe.p99_us
    );
    print_json(&probe);

    println!(
        "{:<6} {:<5} {:>6} {:>6} {:>10} {:>9} {:>9} {:>11} {:>8} {:>8}",
        "log",
        "sync",
        "groups",
        "batch",
        "entries/s",
        "MB/s",
        "writes/s",
        "syncs/write",
        "p50_us",
        "p99_us"
    );
    for &backend in &config.backends {
        let modes: Vec<SyncMode> = if backend.is_persistent() {
            config.sync_modes.clone()
        } else {
            vec![SyncMode::NoSync]
        };
        for sync in modes {
            for &groups in &config.groups {
                for &batch in &config.batch_sizes {
                    let result = log_append_case(config, backend, sync, groups, batch)?;
                    println!(
                        "{:<6} {:<5} {:>6} {:>6} {:>10} {:>9.1} {:>9} {:>11.3} {:>8} {:>8}",
                        result.backend,
                        if result.sync { "on" } else { "off" },
                        result.groups,
                        result.batch,
                        human_rate(result.entries_per_sec),
                        result.mb_per_sec,
                        human_rate(result.writes_per_sec),
                        result.syncs_per_write,
                        result.p50_us,
                        result.p99_us
                    );
                    print_json(&result);
                }
            }
        }
    }

    println!(
        "{:<6} {:>6} {:>6} {:>10} {:>10} {:>8} {:>8} {:>8}",
        "state", "batch", "keys", "puts/s", "commits/s", "p50_us", "p99_us", "max_us"
    );
    for &backend in &config.backends {
        for &batch in &config.batch_sizes {
            let result = state_commit_case(config, backend, batch)?;
            println!(
                "{:<6} {:>6} {:>6} {:>10} {:>10} {:>8} {:>8} {:>8}",
                result.backend,
                result.batch,
                if result.fresh_keys { "fresh" } else { "cycled" },
                human_rate(result.writes_per_sec),
                human_rate(result.commits_per_sec),
                result.p50_us,
                result.p99_us,
                result.max_us
            );
            print_json(&result);
        }
    }
    Ok(())
}

fn log_append_case(
    config: &StorageBenchConfig,
    backend: BackendKind,
    sync: SyncMode,
    groups: u64,
    batch: u64,
) -> Result<LogAppendResult, Box<dyn std::error::Error>> {
    let dir = tempfile::Builder::new()
        .prefix("concord-bench-")
        .tempdir_in(&config.scratch_dir)?;
    let stores = Stores::open(&StoreConfig {
        backend,
        data_dir: dir.path().to_path_buf(),
        log_sync: sync,
        state_cache_bytes: DEFAULT_STATE_CACHE_BYTES,
    })?;
    let mut workload = LogWorkload::new(groups, batch, config.payload_bytes);
    // Warm up until the log reached its steady size (compaction keeps it bounded), so that the
    // measurement sees steady state, not a file growing from nothing.
    let warm_up_started = Instant::now();
    while warm_up_started.elapsed() < config.duration / 4 || workload.compactions() < groups {
        stores.log.write(workload.next_batch())?;
        if warm_up_started.elapsed() > config.duration * 4 {
            break;
        }
    }
    let mut latencies = Latencies::new();
    let syncs_before = stores.log.sync_count();
    let started = Instant::now();
    let mut writes = 0u64;
    while started.elapsed() < config.duration {
        let next = workload.next_batch();
        let begin = Instant::now();
        stores.log.write(next)?;
        latencies.record(begin.elapsed());
        writes += 1;
    }
    let seconds = started.elapsed().as_secs_f64();
    let syncs = stores.log.sync_count() - syncs_before;
    let entries = writes * workload.entries_per_batch();
    Ok(LogAppendResult {
        case: "log_append",
        backend: backend.name(),
        sync: sync.is_sync(),
        groups,
        batch,
        payload_bytes: config.payload_bytes,
        writes,
        entries,
        seconds,
        entries_per_sec: entries as f64 / seconds,
        mb_per_sec: (writes * workload.payload_bytes_per_batch()) as f64 / seconds / 1e6,
        writes_per_sec: writes as f64 / seconds,
        syncs,
        syncs_per_write: syncs as f64 / writes.max(1) as f64,
        p50_us: latencies.quantile_us(0.50),
        p99_us: latencies.quantile_us(0.99),
    })
}

fn state_commit_case(
    config: &StorageBenchConfig,
    backend: BackendKind,
    batch: u64,
) -> Result<StateCommitResult, Box<dyn std::error::Error>> {
    let dir = tempfile::Builder::new()
        .prefix("concord-bench-")
        .tempdir_in(&config.scratch_dir)?;
    let stores = Stores::open(&StoreConfig::new(backend, dir.path()))?;
    let mut workload = if config.fresh_keys {
        StateWorkload::fresh(batch, config.payload_bytes)
    } else {
        StateWorkload::new(batch, config.payload_bytes)
    };
    let mut latencies = Latencies::new();
    let started = Instant::now();
    let mut commits = 0u64;
    while started.elapsed() < config.duration {
        let (writes, applied_index) = workload.next_commit();
        let begin = Instant::now();
        stores.state.commit(0, writes, applied_index)?;
        latencies.record(begin.elapsed());
        commits += 1;
    }
    stores.state.flush()?;
    let seconds = started.elapsed().as_secs_f64();
    Ok(StateCommitResult {
        case: "state_commit",
        backend: backend.name(),
        batch,
        payload_bytes: config.payload_bytes,
        fresh_keys: config.fresh_keys,
        commits,
        writes: commits * batch,
        seconds,
        writes_per_sec: (commits * batch) as f64 / seconds,
        commits_per_sec: commits as f64 / seconds,
        p50_us: latencies.quantile_us(0.50),
        p99_us: latencies.quantile_us(0.99),
        max_us: latencies.max_us(),
    })
}
