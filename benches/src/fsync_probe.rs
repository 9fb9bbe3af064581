//! Raw `fdatasync` latency of the disk under a directory: the floor any synced write sits on.

use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::latency::Latencies;

/// Result of a probe.
#[derive(Debug, Serialize)]
pub struct FsyncProbe {
    /// Always `"fsync_probe"`.
    pub case: &'static str,
    /// Syncs performed.
    pub syncs: u64,
    /// Bytes written before each sync.
    pub write_bytes: usize,
    /// Syncs per second achieved back to back.
    pub syncs_per_sec: f64,
    /// Median sync latency.
    pub p50_us: u64,
    /// 99th percentile sync latency.
    pub p99_us: u64,
}

/// Writes `write_bytes` at the start of a scratch file in `dir` and `fdatasync`s it, again and
/// again for `duration`.
pub fn probe(dir: &Path, duration: Duration, write_bytes: usize) -> std::io::Result<FsyncProbe> {
    let path = dir.join("fsync-probe.tmp");
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)?;
    let block = vec![0x5Au8; write_bytes];
    let mut latencies = Latencies::new();
    let started = Instant::now();
    let mut syncs = 0u64;
    while started.elapsed() < duration {
        let begin = Instant::now();
        file.seek(SeekFrom::Start(0))?;
        file.write_all(&block)?;
        file.sync_data()?;
        latencies.record(begin.elapsed());
        syncs += 1;
    }
    let elapsed = started.elapsed().as_secs_f64();
    drop(file);
    std::fs::remove_file(&path)?;
    Ok(FsyncProbe {
        case: "fsync_probe",
        syncs,
        write_bytes,
        syncs_per_sec: syncs as f64 / elapsed,
        p50_us: latencies.quantile_us(0.50),
        p99_us: latencies.quantile_us(0.99),
    })
}
