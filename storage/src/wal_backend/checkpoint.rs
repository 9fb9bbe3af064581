//! A checkpoint of the WAL, written on a thread of its own while records go on being appended.
//!
//! A checkpoint writes the live log of every group (one image record per group) so that the
//! segments before it can be deleted. The live log can be large (every entry not yet applied
//! durably, plus what the node keeps for lagging followers): written on the raft thread it held
//! every write of the node for the time of writing and syncing it. So the writer only takes the
//! images (entries are shared, not copied) and hands them here.
//!
//! Ordering, which replay relies on: the writer syncs the segment it was writing (`N - 1`),
//! reserves sequence `N` for the checkpoint and goes on in a new segment `N + 1`. The images
//! are the live log as of the end of segment `N - 1`, so replaying segments `..N - 1`, then
//! `N`, then `N + 1..` gives the live log with or without the segments before `N`. The
//! checkpoint is written under a name replay ignores (`N.wal.partial`), synced, renamed to
//! `N.wal`, and the rename made durable; only then are the segments before it deleted, newest
//! first, each deletion durable before the next (a crash among them leaves a prefix of the old
//! history, which the checkpoint then resets). A crash before the rename leaves a partial file,
//! which opening removes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use super::disk::WalDisk;
use super::{io_error, record, segment_path};
use crate::{LogBatch, StorageError, StorageResult};

/// The suffix of a checkpoint being written; opening the WAL removes such files.
pub(super) const PARTIAL_SUFFIX: &str = ".partial";

/// The most a checkpoint writes between two syncs of its file.
const SYNC_EVERY_BYTES: usize = 4 * 1024 * 1024;

/// A checkpoint on its way to disk.
pub(super) struct RunningCheckpoint {
    thread: JoinHandle<CheckpointOutcome>,
}

/// What a checkpoint did, whether or not it finished.
pub(super) struct CheckpointOutcome {
    /// The checkpoint's sequence number, if its segment landed.
    pub(super) landed: Option<u64>,
    /// Its size, in bytes.
    pub(super) bytes: u64,
    /// The older segments it deleted.
    pub(super) removed: Vec<u64>,
    pub(super) error: Option<StorageError>,
}

/// What a checkpoint writes and replaces.
pub(super) struct CheckpointPlan {
    pub(super) disk: Arc<dyn WalDisk>,
    pub(super) dir: PathBuf,
    /// The sequence number reserved for the checkpoint.
    pub(super) sequence: u64,
    /// One image per group: the live log as of the end of the segment before `sequence`.
    pub(super) images: Vec<LogBatch>,
    /// The segments before `sequence`, deleted once the checkpoint is durable.
    pub(super) replaced: Vec<u64>,
}

impl RunningCheckpoint {
    /// Starts writing `plan` on a thread of its own.
    pub(super) fn start(plan: CheckpointPlan) -> StorageResult<RunningCheckpoint> {
        let dir = plan.dir.clone();
        let thread = std::thread::Builder::new()
            .name("concord-wal-checkpoint".into())
            .spawn(move || {
                crate::background_priority::lower_this_threads_priority();
                write(plan)
            })
            .map_err(io_error(&dir))?;
        Ok(RunningCheckpoint { thread })
    }

    /// `true` once the checkpoint finished (landed or failed).
    pub(super) fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Waits for the checkpoint and says what it did.
    pub(super) fn finish(self, dir: &Path) -> CheckpointOutcome {
        self.thread.join().unwrap_or_else(|_| CheckpointOutcome {
            landed: None,
            bytes: 0,
            removed: Vec::new(),
            error: Some(StorageError::Backend {
                backend: "wal",
                path: dir.to_path_buf(),
                detail: "the checkpoint thread panicked".into(),
            }),
        })
    }
}

/// The name a checkpoint has while it is written.
pub(super) fn partial_path(dir: &Path, sequence: u64) -> PathBuf {
    let mut name = segment_path(dir, sequence).into_os_string();
    name.push(PARTIAL_SUFFIX);
    PathBuf::from(name)
}

fn write(plan: CheckpointPlan) -> CheckpointOutcome {
    let mut outcome = CheckpointOutcome {
        landed: None,
        bytes: 0,
        removed: Vec::new(),
        error: None,
    };
    if let Err(error) = write_and_replace(&plan, &mut outcome) {
        outcome.error = Some(error);
    }
    outcome
}

fn write_and_replace(plan: &CheckpointPlan, outcome: &mut CheckpointOutcome) -> StorageResult<()> {
    let disk = plan.disk.as_ref();
    let dir = plan.dir.as_path();
    let partial = partial_path(dir, plan.sequence);
    let file = disk.create_new(&partial).map_err(io_error(&partial))?;
    let mut offset = 0u64;
    for image in &plan.images {
        // The file becomes a segment only whole, so its records say nothing of it was synced.
        let encoded = record::encode(image, 0);
        // Synced piece by piece: a sync of the log's own segment meanwhile may have to wait
        // for this file's unsynced data (the file system writes it out first), so at most a
        // piece of it is left at any time. After each piece the thread rests as long as the
        // piece took: a checkpoint takes twice as long but at most half of a core and of the
        // disk, which the node's own threads need more.
        for piece in encoded.chunks(SYNC_EVERY_BYTES) {
            let started = Instant::now();
            file.write_all_at(piece, offset)
                .map_err(io_error(&partial))?;
            offset += piece.len() as u64;
            file.sync_data().map_err(io_error(&partial))?;
            std::thread::sleep(started.elapsed());
        }
    }
    file.sync_all().map_err(io_error(&partial))?;
    drop(file);
    let path = segment_path(dir, plan.sequence);
    disk.rename(&partial, &path).map_err(io_error(&path))?;
    disk.sync_dir(dir).map_err(io_error(dir))?;
    outcome.landed = Some(plan.sequence);
    outcome.bytes = offset;
    for &sequence in plan.replaced.iter().rev() {
        let path = segment_path(dir, sequence);
        disk.remove(&path).map_err(io_error(&path))?;
        disk.sync_dir(dir).map_err(io_error(dir))?;
        outcome.removed.push(sequence);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::{Condvar, Mutex};
    use std::time::Duration;

    use super::*;
    use crate::testing::{assert_same_log, mixed_batch};
    use crate::wal_backend::disk::{OsDisk, WalFile};
    use crate::{LogStore, MemLogStore, SyncMode, WalLogStore, WalOptions};

    /// The operating system's files, but a checkpoint's file is created only once the test
    /// opens the gate (or after a long wait, which the test then reports).
    #[derive(Default)]
    struct GatedDisk {
        gate: Mutex<Gate>,
        changed: Condvar,
    }

    #[derive(Default)]
    struct Gate {
        checkpoint_waiting: bool,
        open: bool,
        waited_out: bool,
    }

    impl GatedDisk {
        fn wait_for_the_gate(&self) {
            let mut gate = self.gate.lock().unwrap();
            gate.checkpoint_waiting = true;
            self.changed.notify_all();
            let (mut gate, timeout) = self
                .changed
                .wait_timeout_while(gate, Duration::from_secs(10), |g| !g.open)
                .unwrap();
            gate.waited_out = timeout.timed_out();
        }

        fn open_the_gate(&self) {
            self.gate.lock().unwrap().open = true;
            self.changed.notify_all();
        }
    }

    impl WalDisk for GatedDisk {
        fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
            OsDisk.create_dir_all(dir)
        }
        fn list(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
            OsDisk.list(dir)
        }
        fn read(&self, path: &Path) -> std::io::Result<Vec<u8>> {
            OsDisk.read(path)
        }
        fn open(&self, path: &Path) -> std::io::Result<Box<dyn WalFile>> {
            OsDisk.open(path)
        }
        fn create_new(&self, path: &Path) -> std::io::Result<Box<dyn WalFile>> {
            if path.to_string_lossy().ends_with(PARTIAL_SUFFIX) {
                self.wait_for_the_gate();
            }
            OsDisk.create_new(path)
        }
        fn remove(&self, path: &Path) -> std::io::Result<()> {
            OsDisk.remove(path)
        }
        fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
            OsDisk.rename(from, to)
        }
        fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
            OsDisk.sync_dir(dir)
        }
    }

    /// Writes go on, and are acknowledged, while a checkpoint is held back; once it lands the
    /// segments it replaced are gone and the log replays whole.
    #[test]
    fn records_go_on_while_a_checkpoint_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.wal");
        let disk = Arc::new(GatedDisk::default());
        let options = WalOptions {
            segment_bytes: 4096,
            checkpoint_after_segments: 2,
        };
        let wal = WalLogStore::open_on_disk(disk.clone(), &path, SyncMode::Sync, options).unwrap();
        let model = MemLogStore::new();
        let mut last = [0u64; 3];
        let mut n = 0;
        while !disk.gate.lock().unwrap().checkpoint_waiting {
            assert!(n < 2000, "no checkpoint started");
            let batch = mixed_batch(n, &mut last);
            model.write(batch.clone()).unwrap();
            wal.write(batch).unwrap();
            n += 1;
        }
        for _ in 0..100 {
            let batch = mixed_batch(n, &mut last);
            model.write(batch.clone()).unwrap();
            wal.write(batch).unwrap();
            n += 1;
        }
        assert!(
            !disk.gate.lock().unwrap().waited_out,
            "a write waited for the checkpoint"
        );
        disk.open_the_gate();
        drop(wal);
        assert!(
            !segment_path(&path, 0).exists(),
            "the first segment outlived the checkpoint that replaced it"
        );
        let reopened = WalLogStore::open_with(&path, SyncMode::Sync, options).unwrap();
        assert_same_log(&reopened, &model);
    }
}
