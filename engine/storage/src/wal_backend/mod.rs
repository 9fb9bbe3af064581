//! The WAL backend for the raft log: an append-only file of write batches, one `fdatasync` per
//! batch, with the live log kept in memory.
//!
//! Why: a redb commit rewrites B-tree pages and a header around its syncs, several times the
//! cost of a bare `fdatasync` (docs/BENCHMARKS.md). Appending one record and syncing it costs
//! about one. The state machine's data stays in redb (`BackendKind::Wal` pairs this log
//! with a redb state store).
//!
//! Layout: a directory of segment files `<16 hex digits>.wal`, each preallocated (sparse) to
//! [`WalOptions::segment_bytes`], holding records (see `record.rs`) one after the other; zeros
//! end the written part. Reopening replays every segment in order into memory. A damaged record
//! at the very end of the last segment is a write that was never acknowledged (the process died
//! during it): replay stops there and the tail is zeroed. Damage anywhere else is corruption.
//!
//! Space: when the segments written since the last checkpoint reach
//! [`WalOptions::checkpoint_after_segments`], the live log of every group is written to a new
//! segment as one record per group (a snapshot reset followed by the live entries) and the
//! older segments are deleted, so the files stay within a small multiple of the live log.

mod record;

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;
use raft::prelude::Entry;

use crate::{
    GroupId, GroupLogState, LogBatch, LogStore, MemLogStore, StorageError, StorageResult, SyncMode,
};
use record::Parsed;

/// Tunables of a [`WalLogStore`].
#[derive(Clone, Copy, Debug)]
pub struct WalOptions {
    /// Size each segment file is preallocated to (a larger record gets a larger segment).
    pub segment_bytes: u64,
    /// Segments written since the last checkpoint that trigger the next one.
    pub checkpoint_after_segments: usize,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            segment_bytes: 64 * 1024 * 1024,
            checkpoint_after_segments: 4,
        }
    }
}

/// A [`LogStore`] in an append-only write-ahead log. Reads are served from memory.
pub struct WalLogStore {
    /// The live log: the model every record is applied to.
    memory: MemLogStore,
    writer: Mutex<Writer>,
    dir: PathBuf,
    sync_mode: SyncMode,
    syncs: AtomicU64,
}

impl std::fmt::Debug for WalLogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalLogStore")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

struct Writer {
    options: WalOptions,
    /// Sequence numbers of the segment files, oldest first; the last one is written.
    segments: Vec<u64>,
    file: File,
    /// Where the next record goes in the current segment.
    offset: u64,
    /// Length of the current segment file.
    capacity: u64,
    segments_since_checkpoint: usize,
    /// Segments the last checkpoint took (the next one waits for more than twice that).
    checkpoint_segments: usize,
}

fn segment_path(dir: &Path, sequence: u64) -> PathBuf {
    dir.join(format!("{sequence:016x}.wal"))
}

fn io_error(path: &Path) -> impl Fn(std::io::Error) -> StorageError + '_ {
    move |source| StorageError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn sync_dir(dir: &Path) -> StorageResult<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error(dir))
}

impl WalLogStore {
    /// Opens or creates the WAL directory at `dir`, replaying every segment.
    pub fn open(dir: &Path, sync_mode: SyncMode) -> StorageResult<Self> {
        Self::open_with(dir, sync_mode, WalOptions::default())
    }

    /// [`WalLogStore::open`] with explicit options.
    pub fn open_with(dir: &Path, sync_mode: SyncMode, options: WalOptions) -> StorageResult<Self> {
        fs::create_dir_all(dir).map_err(io_error(dir))?;
        let mut sequences = Vec::new();
        for item in fs::read_dir(dir).map_err(io_error(dir))? {
            let path = item.map_err(io_error(dir))?.path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            match name
                .strip_suffix(".wal")
                .and_then(|hex| u64::from_str_radix(hex, 16).ok())
            {
                Some(sequence) => sequences.push(sequence),
                None => {
                    return Err(StorageError::corrupted(
                        &path,
                        "unexpected file in the WAL directory",
                    ));
                }
            }
        }
        sequences.sort_unstable();
        let memory = MemLogStore::new();
        let mut resume = None;
        for (position, &sequence) in sequences.iter().enumerate() {
            let last = position + 1 == sequences.len();
            let path = segment_path(dir, sequence);
            let end = replay_segment(&path, &memory, last)?;
            if last {
                resume = Some((sequence, end));
            }
        }
        let writer = match resume {
            Some((sequence, offset)) => {
                let path = segment_path(dir, sequence);
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .map_err(io_error(&path))?;
                let capacity = file.metadata().map_err(io_error(&path))?.len();
                Writer {
                    options,
                    segments: sequences.clone(),
                    file,
                    offset,
                    capacity,
                    segments_since_checkpoint: sequences.len(),
                    checkpoint_segments: 0,
                }
            }
            None => {
                let (file, capacity) = create_segment(dir, 0, options.segment_bytes)?;
                Writer {
                    options,
                    segments: vec![0],
                    file,
                    offset: 0,
                    capacity,
                    segments_since_checkpoint: 1,
                    checkpoint_segments: 0,
                }
            }
        };
        Ok(WalLogStore {
            memory,
            writer: Mutex::new(writer),
            dir: dir.to_path_buf(),
            sync_mode,
            syncs: AtomicU64::new(0),
        })
    }

    /// Appends `record` to the current segment, moving to a new one if it does not fit.
    fn append(&self, writer: &mut Writer, record: &[u8]) -> StorageResult<()> {
        if writer.offset + record.len() as u64 > writer.capacity {
            self.rotate(writer, record.len() as u64 + 8)?;
        }
        let path = segment_path(&self.dir, *writer.segments.last().expect("one segment"));
        writer
            .file
            .write_all_at(record, writer.offset)
            .map_err(io_error(&path))?;
        writer.offset += record.len() as u64;
        Ok(())
    }

    /// Finishes the current segment and starts the next, at least `min_bytes` large.
    fn rotate(&self, writer: &mut Writer, min_bytes: u64) -> StorageResult<()> {
        let current = *writer.segments.last().expect("one segment");
        // The segment just finished must be durable before records go to the next one:
        // replay treats damage before the last segment as corruption.
        writer
            .file
            .sync_data()
            .map_err(io_error(&segment_path(&self.dir, current)))?;
        let size = writer.options.segment_bytes.max(min_bytes);
        let (file, capacity) = create_segment(&self.dir, current + 1, size)?;
        writer.file = file;
        writer.capacity = capacity;
        writer.offset = 0;
        writer.segments.push(current + 1);
        writer.segments_since_checkpoint += 1;
        Ok(())
    }

    fn sync(&self, writer: &Writer) -> StorageResult<()> {
        let path = segment_path(&self.dir, *writer.segments.last().expect("one segment"));
        let started = Instant::now();
        writer.file.sync_data().map_err(io_error(&path))?;
        metrics::histogram!("concord_raft_log_sync_duration_seconds", "backend" => "wal")
            .record(started.elapsed().as_secs_f64());
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Writes the live log to a fresh segment and deletes the older ones.
    fn checkpoint(&self, writer: &mut Writer) -> StorageResult<()> {
        // The checkpoint starts a segment of its own, so the older ones can go whole.
        self.rotate(writer, 0)?;
        let first_new = *writer.segments.last().expect("one segment");
        for group in self.memory.groups()? {
            let record = record::encode(&self.group_image(group)?);
            self.append(writer, &record)?;
        }
        self.sync(writer)?;
        // Only now, with the checkpoint durable, may the history it replaces go.
        for sequence in writer.segments.iter().copied().filter(|&s| s < first_new) {
            let path = segment_path(&self.dir, sequence);
            fs::remove_file(&path).map_err(io_error(&path))?;
        }
        sync_dir(&self.dir)?;
        writer.segments.retain(|&s| s >= first_new);
        writer.checkpoint_segments = writer.segments.len();
        writer.segments_since_checkpoint = writer.segments.len();
        Ok(())
    }

    /// A batch that rebuilds `group`'s log, as it is in memory, from nothing.
    fn group_image(&self, group: GroupId) -> StorageResult<LogBatch> {
        let state = self.memory.group_state(group)?;
        let entries =
            self.memory
                .entries(group, state.first_index(), state.last_index + 1, None)?;
        Ok(LogBatch::group_image(group, state, entries))
    }
}

/// Creates segment `sequence`, preallocated (sparse) to `size` bytes, and makes its existence
/// durable.
fn create_segment(dir: &Path, sequence: u64, size: u64) -> StorageResult<(File, u64)> {
    let path = segment_path(dir, sequence);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(io_error(&path))?;
    file.set_len(size).map_err(io_error(&path))?;
    file.sync_all().map_err(io_error(&path))?;
    sync_dir(dir)?;
    Ok((file, size))
}

/// Replays the records of one segment into `memory`; returns where the written part ends.
/// In the last segment, a damaged record with nothing valid after it ends the log (a torn,
/// unacknowledged write) and the tail from it on is zeroed.
fn replay_segment(path: &Path, memory: &MemLogStore, last: bool) -> StorageResult<u64> {
    let bytes = fs::read(path).map_err(io_error(path))?;
    let mut offset = 0usize;
    while offset < bytes.len() {
        match record::parse(&bytes[offset..]) {
            Parsed::Record { batch, len } => {
                memory.write(batch).map_err(|error| {
                    StorageError::corrupted(
                        path,
                        format!("the record at byte {offset} does not apply: {error}"),
                    )
                })?;
                offset += len;
            }
            Parsed::End => break,
            Parsed::Damaged(detail) => {
                // A torn write can only damage the last record: everything after it was never
                // written (zeros). A valid record further on means this one was damaged later.
                let end_of_data = bytes.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
                let valid_after = (offset + 1..end_of_data)
                    .any(|at| matches!(record::parse(&bytes[at..]), Parsed::Record { .. }));
                if !last || valid_after {
                    return Err(StorageError::corrupted(
                        path,
                        format!("{detail} at byte {offset}, before the end of the log"),
                    ));
                }
                // Zero the torn tail so that it can never be read as records again.
                let file = OpenOptions::new()
                    .write(true)
                    .open(path)
                    .map_err(io_error(path))?;
                let len = bytes.len() as u64;
                file.set_len(offset as u64).map_err(io_error(path))?;
                file.set_len(len).map_err(io_error(path))?;
                file.sync_all().map_err(io_error(path))?;
                break;
            }
        }
    }
    Ok(offset as u64)
}

impl LogStore for WalLogStore {
    fn write(&self, batch: LogBatch) -> StorageResult<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut writer = self.writer.lock();
        let record = record::encode(&batch);
        // Check the batch before logging it: an invalid batch must change nothing, on disk
        // either. Writes are serialized by the lock, so the plan still holds below.
        let plan = self.memory.plan_batch(batch)?;
        self.append(&mut writer, &record)?;
        if self.sync_mode.is_sync() {
            self.sync(&writer)?;
        }
        self.memory.apply_plan(plan);
        let threshold = writer
            .options
            .checkpoint_after_segments
            .max(2 * writer.checkpoint_segments + 1);
        if writer.segments_since_checkpoint > threshold {
            self.checkpoint(&mut writer)?;
        }
        Ok(())
    }

    fn entries(
        &self,
        group: GroupId,
        low: u64,
        high: u64,
        max_bytes: Option<u64>,
    ) -> StorageResult<Vec<Entry>> {
        self.memory.entries(group, low, high, max_bytes)
    }

    fn term(&self, group: GroupId, index: u64) -> StorageResult<u64> {
        self.memory.term(group, index)
    }

    fn group_state(&self, group: GroupId) -> StorageResult<GroupLogState> {
        self.memory.group_state(group)
    }

    fn first_index(&self, group: GroupId) -> StorageResult<u64> {
        self.memory.first_index(group)
    }

    fn last_index(&self, group: GroupId) -> StorageResult<u64> {
        self.memory.last_index(group)
    }

    fn groups(&self) -> StorageResult<Vec<GroupId>> {
        self.memory.groups()
    }

    fn flush(&self) -> StorageResult<()> {
        let writer = self.writer.lock();
        self.sync(&writer)
    }

    fn sync_mode(&self) -> SyncMode {
        self.sync_mode
    }

    fn sync_count(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }
}

impl Drop for WalLogStore {
    fn drop(&mut self) {
        // A clean close keeps what a NoSync store wrote; there is no one left to report to.
        let _ = self.writer.lock().file.sync_data();
    }
}
