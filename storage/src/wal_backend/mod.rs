//! The WAL backend for the raft log: an append-only file of write batches, one `fdatasync` per
//! batch (none for one that only moves commit indexes), with the live log kept in memory.
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
//! during it): replay stops there. Whatever follows the end of the log in the last segment is
//! zeroed, including records that reached the disk after one it lost in a power cut. Damage
//! anywhere else is corruption.
//!
//! Space: when the segments started since the last checkpoint exceed
//! [`WalOptions::checkpoint_after_segments`] (and twice the last checkpoint's size), the live
//! log of every group is written to a segment of its own as one record per group (a snapshot
//! reset followed by the live entries) and the older segments are deleted, so the files stay
//! within a small multiple of the live log. The checkpoint is written on a thread of its own
//! while records go on into the next segment (`checkpoint.rs`).

mod checkpoint;
mod disk;
mod record;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::live_log::{LiveLog, LogPersistence};
use crate::log_plan::LogPlan;
use crate::{GroupId, LogBatch, LogStore, MemLogStore, StorageError, StorageResult, SyncMode};
use checkpoint::{CheckpointPlan, PARTIAL_SUFFIX, RunningCheckpoint};
use record::Parsed;

pub(crate) use disk::{OsDisk, WalDisk, WalFile};

/// Tunables of a [`WalLogStore`].
#[derive(Clone, Copy, Debug)]
pub struct WalOptions {
    /// Size each segment file is preallocated to (a larger record gets a larger segment).
    pub segment_bytes: u64,
    /// Segments started since the last checkpoint began that trigger the next one (the next
    /// also waits for more than twice the last one's size).
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
pub type WalLogStore = LiveLog<WalFiles>;

/// The segment files beneath a [`WalLogStore`].
pub struct WalFiles {
    disk: Arc<dyn WalDisk>,
    dir: PathBuf,
    sync_mode: SyncMode,
    syncs: u64,
    options: WalOptions,
    /// Sequence numbers of the segment files, oldest first; the last one is written.
    segments: Vec<u64>,
    file: Box<dyn WalFile>,
    /// Where the next record goes in the current segment.
    offset: u64,
    /// How far the current segment is known synced (written into each record: see
    /// `record.rs`).
    synced_through: u64,
    /// Length of the current segment file.
    capacity: u64,
    /// Segments started since the last checkpoint began.
    segments_since_checkpoint: usize,
    /// The last checkpoint's size, in segments (the next one waits for more than twice that).
    checkpoint_segments: usize,
    /// The checkpoint being written, if one is.
    checkpoint: Option<RunningCheckpoint>,
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

impl LiveLog<WalFiles> {
    /// Opens or creates the WAL directory at `dir`, replaying every segment.
    pub fn open(dir: &Path, sync_mode: SyncMode) -> StorageResult<WalLogStore> {
        Self::open_with(dir, sync_mode, WalOptions::default())
    }

    /// [`WalLogStore::open`] with explicit options.
    pub fn open_with(
        dir: &Path,
        sync_mode: SyncMode,
        options: WalOptions,
    ) -> StorageResult<WalLogStore> {
        Self::open_on_disk(Arc::new(OsDisk), dir, sync_mode, options)
    }

    /// [`WalLogStore::open_with`] on the files of `disk`.
    pub(crate) fn open_on_disk(
        disk: Arc<dyn WalDisk>,
        dir: &Path,
        sync_mode: SyncMode,
        options: WalOptions,
    ) -> StorageResult<WalLogStore> {
        disk.create_dir_all(dir).map_err(io_error(dir))?;
        let mut sequences = Vec::new();
        for path in disk.list(dir).map_err(io_error(dir))? {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if name.ends_with(PARTIAL_SUFFIX) {
                // A checkpoint the process died writing: never part of the log.
                disk.remove(&path).map_err(io_error(&path))?;
                continue;
            }
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
            let end = replay_segment(disk.as_ref(), &path, &memory, last)?;
            if last {
                resume = Some((sequence, end));
            }
        }
        let files = match resume {
            Some((sequence, offset)) => {
                let path = segment_path(dir, sequence);
                let file = disk.open(&path).map_err(io_error(&path))?;
                let capacity = file.len().map_err(io_error(&path))?;
                // What was replayed may still sit in the page cache only (a process that
                // died without syncing): synced now, records after it can say so. So may the
                // segment's directory entry (a process that died while creating it): the
                // records about to go into it would be lost with it.
                file.sync_data().map_err(io_error(&path))?;
                disk.sync_dir(dir).map_err(io_error(dir))?;
                WalFiles {
                    disk,
                    dir: dir.to_path_buf(),
                    sync_mode,
                    syncs: 0,
                    options,
                    segments: sequences.clone(),
                    file,
                    offset,
                    synced_through: offset,
                    capacity,
                    segments_since_checkpoint: sequences.len(),
                    checkpoint_segments: 0,
                    checkpoint: None,
                }
            }
            None => {
                let (file, capacity) =
                    create_segment(disk.as_ref(), dir, 0, options.segment_bytes)?;
                WalFiles {
                    disk,
                    dir: dir.to_path_buf(),
                    sync_mode,
                    syncs: 0,
                    options,
                    segments: vec![0],
                    file,
                    offset: 0,
                    synced_through: 0,
                    capacity,
                    segments_since_checkpoint: 1,
                    checkpoint_segments: 0,
                    checkpoint: None,
                }
            }
        };
        Ok(LiveLog::new(memory, files, sync_mode))
    }
}

impl WalFiles {
    /// Appends `record` to the current segment, moving to a new one if it does not fit (and
    /// then restating in it how far the new segment is synced: not at all).
    fn append(&mut self, record: &mut [u8]) -> StorageResult<()> {
        if self.offset + record.len() as u64 > self.capacity {
            self.rotate(record.len() as u64 + 8)?;
            record::set_durable_through(record, self.synced_through);
        }
        let path = segment_path(&self.dir, *self.segments.last().expect("one segment"));
        self.file
            .write_all_at(record, self.offset)
            .map_err(io_error(&path))?;
        self.offset += record.len() as u64;
        Ok(())
    }

    /// Finishes the current segment and starts the next, at least `min_bytes` large.
    fn rotate(&mut self, min_bytes: u64) -> StorageResult<()> {
        let current = *self.segments.last().expect("one segment");
        self.start_segment(current + 1, min_bytes)
    }

    /// Finishes the current segment and starts segment `sequence`, at least `min_bytes` large.
    fn start_segment(&mut self, sequence: u64, min_bytes: u64) -> StorageResult<()> {
        let current = *self.segments.last().expect("one segment");
        // The segment just finished must be durable before records go to the next one:
        // replay treats damage before the last segment as corruption.
        self.file
            .sync_data()
            .map_err(io_error(&segment_path(&self.dir, current)))?;
        let size = self.options.segment_bytes.max(min_bytes);
        let (file, capacity) = create_segment(self.disk.as_ref(), &self.dir, sequence, size)?;
        self.file = file;
        self.capacity = capacity;
        self.offset = 0;
        self.synced_through = 0;
        self.segments.push(sequence);
        self.segments_since_checkpoint += 1;
        Ok(())
    }

    fn sync(&mut self) -> StorageResult<()> {
        let path = segment_path(&self.dir, *self.segments.last().expect("one segment"));
        let started = Instant::now();
        self.file.sync_data().map_err(io_error(&path))?;
        self.synced_through = self.offset;
        metrics::histogram!("concord_raft_log_sync_duration_seconds", "backend" => "wal")
            .record(started.elapsed().as_secs_f64());
        self.syncs += 1;
        Ok(())
    }

    /// Starts a checkpoint: the current segment is finished, the next sequence number is kept
    /// for the checkpoint, records go on in the one after it, and the live log as of now is
    /// written into the kept one on a thread of its own (`checkpoint.rs`).
    fn start_checkpoint(&mut self, live: &MemLogStore) -> StorageResult<()> {
        let current = *self.segments.last().expect("one segment");
        let sequence = current + 1;
        // The images are taken first: an error leaves the segments as they were.
        let images = live
            .groups()?
            .into_iter()
            .map(|group| group_image(live, group))
            .collect::<StorageResult<Vec<LogBatch>>>()?;
        self.start_segment(sequence + 1, 0)?;
        let replaced: Vec<u64> = self
            .segments
            .iter()
            .copied()
            .filter(|&s| s < sequence)
            .collect();
        self.checkpoint = Some(RunningCheckpoint::start(CheckpointPlan {
            disk: Arc::clone(&self.disk),
            dir: self.dir.clone(),
            sequence,
            images,
            replaced,
        })?);
        self.segments_since_checkpoint = 1;
        Ok(())
    }

    /// Takes in what the running checkpoint did, once it finished (or, with `wait`, waiting
    /// for it): its segment joins the list, the ones it deleted leave it. Its error, if any.
    fn collect_checkpoint(&mut self, wait: bool) -> StorageResult<()> {
        match &self.checkpoint {
            Some(running) if wait || running.is_finished() => {}
            _ => return Ok(()),
        }
        let running = self.checkpoint.take().expect("matched above");
        let outcome = running.finish(&self.dir);
        self.segments.retain(|s| !outcome.removed.contains(s));
        if let Some(sequence) = outcome.landed {
            let at = self.segments.partition_point(|&s| s < sequence);
            self.segments.insert(at, sequence);
            let segment_bytes = self.options.segment_bytes.max(1);
            self.checkpoint_segments = outcome.bytes.div_ceil(segment_bytes).max(1) as usize;
        }
        match outcome.error {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}

/// A batch that rebuilds `group`'s log, as it is in `live`, from nothing.
fn group_image(live: &MemLogStore, group: GroupId) -> StorageResult<LogBatch> {
    let state = live.group_state(group)?;
    let entries = live.entries(group, state.first_index(), state.last_index + 1, None)?;
    Ok(LogBatch::group_image(group, state, entries))
}

/// Creates segment `sequence`, preallocated (sparse) to `size` bytes, and makes its existence
/// durable.
fn create_segment(
    disk: &dyn WalDisk,
    dir: &Path,
    sequence: u64,
    size: u64,
) -> StorageResult<(Box<dyn WalFile>, u64)> {
    let path = segment_path(dir, sequence);
    let file = disk.create_new(&path).map_err(io_error(&path))?;
    file.set_len(size).map_err(io_error(&path))?;
    file.sync_all().map_err(io_error(&path))?;
    disk.sync_dir(dir).map_err(io_error(dir))?;
    Ok((file, size))
}

/// Replays the records of one segment into `memory`; returns where the log ends in it.
///
/// The log ends at zeros or at a damaged record. In the last segment, what lies past that end
/// was never acknowledged when it is a torn record with nothing valid after it, or when every
/// record that reached the disk after it was written before the segment was synced that far
/// (a power cut within one unsynced window): the tail is zeroed and the log goes on from the
/// end. Anything else — damage before the last segment, or before a point a later record says
/// was synced — is corruption, reported.
fn replay_segment(
    disk: &dyn WalDisk,
    path: &Path,
    memory: &MemLogStore,
    last: bool,
) -> StorageResult<u64> {
    let bytes = disk.read(path).map_err(io_error(path))?;
    let mut offset = 0usize;
    let mut damage = None;
    while offset < bytes.len() {
        match record::parse(&bytes[offset..]) {
            Parsed::Record { batch, len, .. } => {
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
                damage = Some(detail);
                break;
            }
        }
    }
    // The usual end: zeros to the end of the segment. Only otherwise is the rest searched.
    if damage.is_none() && bytes[offset..].iter().all(|&b| b == 0) {
        return Ok(offset as u64);
    }
    let later = records_after(&bytes, offset);
    let unacknowledged = match (&damage, later) {
        // Zeros, then bytes that are no record: in the last segment, the body of a lost
        // record, to be zeroed before anything is written over it.
        (None, Later::None) if !last => return Ok(offset as u64),
        (None, Later::None) => true,
        // A torn last record.
        (Some(_), Later::None) => last,
        (_, Later::SyncedThrough(through)) => last && through <= offset as u64,
        // Written by a version that did not record how far the segment was synced: only
        // zeros before them are taken for a lost write.
        (None, Later::Unknown) => last,
        (Some(_), Later::Unknown) => false,
    };
    if !unacknowledged {
        let what = damage.unwrap_or_else(|| "zeros".to_string());
        return Err(StorageError::corrupted(
            path,
            format!("{what} at byte {offset}, before the end of the log"),
        ));
    }
    // Zero the unacknowledged tail, so that it can never be read as records again (new
    // records will be written over it, and one of a lost record's length would otherwise bring
    // the next old one back).
    let file = disk.open(path).map_err(io_error(path))?;
    let len = bytes.len() as u64;
    file.set_len(offset as u64).map_err(io_error(path))?;
    file.set_len(len).map_err(io_error(path))?;
    file.sync_all().map_err(io_error(path))?;
    Ok(offset as u64)
}

/// What valid records lie in a segment past the point where its log ended.
enum Later {
    /// None.
    None,
    /// Some, the last written when the segment was synced through this byte.
    SyncedThrough(u64),
    /// Some, of a version that does not say how far the segment was synced.
    Unknown,
}

/// Looks for valid records in `bytes` after `end`: byte by byte up to the first one found (a
/// damaged record says nothing about where the next one starts), then record by record.
fn records_after(bytes: &[u8], end: usize) -> Later {
    let end_of_data = bytes.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
    let mut found = Later::None;
    let mut at = end + 1;
    while at < end_of_data {
        match record::parse(&bytes[at..]) {
            Parsed::Record {
                len,
                durable_through,
                ..
            } => {
                found = match (found, durable_through) {
                    (Later::Unknown, _) | (_, None) => Later::Unknown,
                    (Later::SyncedThrough(before), Some(through)) => {
                        Later::SyncedThrough(before.max(through))
                    }
                    (Later::None, Some(through)) => Later::SyncedThrough(through),
                };
                at += len;
            }
            _ => at += 1,
        }
    }
    found
}

impl LogPersistence for WalFiles {
    /// The batch's record, encoded before planning consumes the batch.
    type Prepared = Vec<u8>;

    fn prepare(&mut self, batch: &LogBatch) -> Vec<u8> {
        record::encode(batch, self.synced_through)
    }

    fn persist(
        &mut self,
        mut record: Vec<u8>,
        plan: &LogPlan,
        _live: &MemLogStore,
    ) -> StorageResult<()> {
        self.append(&mut record)?;
        // A record not synced here is synced with the next one that is (one file, written in
        // order), and until then is a tail a crash may lose: replay stops at its damage.
        if plan.syncs_under(self.sync_mode) {
            self.sync()?;
        }
        Ok(())
    }

    fn applied(&mut self, live: &MemLogStore) -> StorageResult<()> {
        self.collect_checkpoint(false)?;
        let threshold = self
            .options
            .checkpoint_after_segments
            .max(2 * self.checkpoint_segments + 1);
        if self.checkpoint.is_none() && self.segments_since_checkpoint > threshold {
            self.start_checkpoint(live)?;
        }
        Ok(())
    }

    fn flush(&mut self) -> StorageResult<()> {
        self.sync()
    }

    fn sync_count(&self) -> u64 {
        self.syncs
    }
}

impl Drop for WalFiles {
    fn drop(&mut self) {
        // A clean close keeps what a NoSync store wrote and lets a running checkpoint finish;
        // there is no one left to report to.
        let _ = self.collect_checkpoint(true);
        let _ = self.file.sync_data();
    }
}
