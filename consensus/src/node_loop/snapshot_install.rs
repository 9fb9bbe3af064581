//! A follower's side of a snapshot: fetch the state from a peer into a file (on a thread of
//! its own), install it into the state store (handed by the group's apply thread, once the
//! entries before it are applied, to the apply stage's install thread, so that the worker's
//! other groups go on applying), then let raft record the snapshot in the log.
//!
//! The state is installed and flushed before the log records the snapshot: a crash in
//! between leaves a state ahead of its log, which the node repairs at start
//! (`recovery.rs`), and a crash before leaves the old state and the leader sends the snapshot
//! again. A crash mid-install changes nothing: `StateStore::restore` is all or nothing.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use concord_storage::{GroupId, SnapshotReader, StateStore};

use super::install_marks::InstallMarks;
use crate::NodeId;
use crate::mailbox::{Mailbox, SnapshotEvent, SnapshotFailure};
use crate::transport::{SnapshotFetchError, Transport};

/// Snapshot fetches a node runs at once; other groups wait their turn.
pub(crate) const MAX_CONCURRENT_FETCHES: usize = 4;

/// Tells the snapshot file sets of this process apart: several nodes of one process may share
/// the temporary directory, and a node id.
static NEXT_FILE_SET: AtomicU64 = AtomicU64::new(0);

/// Where fetched states wait for their install. A fetched state that a shutdown leaves
/// uninstalled is removed with the set.
pub(crate) struct SnapshotFiles {
    dir: PathBuf,
    /// How every file name of this set begins.
    prefix: String,
    /// Names each fetch's file apart.
    next_file: AtomicU64,
    /// Fetches running now.
    pub(crate) fetching: AtomicUsize,
}

impl SnapshotFiles {
    /// Files in `dir` (created if missing) — a directory of this node's own, whose leftovers
    /// from a crash are removed now — or in the system's temporary directory.
    pub(crate) fn open(dir: Option<&Path>, node: NodeId) -> std::io::Result<SnapshotFiles> {
        let owned = dir.is_some();
        let dir = dir.map_or_else(std::env::temp_dir, Path::to_path_buf);
        std::fs::create_dir_all(&dir)?;
        if owned {
            for entry in std::fs::read_dir(&dir)? {
                let path = entry?.path();
                if path.extension().is_some_and(|e| e == "snap") {
                    std::fs::remove_file(&path)?;
                }
            }
        }
        let pid = std::process::id();
        let set = NEXT_FILE_SET.fetch_add(1, Ordering::Relaxed);
        Ok(SnapshotFiles {
            dir,
            prefix: format!("concord-{pid}-{set}-node-{node}-group-"),
            next_file: AtomicU64::new(0),
            fetching: AtomicUsize::new(0),
        })
    }

    /// Takes a fetch slot, if one is free.
    pub(crate) fn try_start(&self) -> bool {
        self.fetching
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |running| {
                (running < MAX_CONCURRENT_FETCHES).then_some(running + 1)
            })
            .is_ok()
    }

    fn file_for(&self, group: GroupId) -> PathBuf {
        let n = self.next_file.fetch_add(1, Ordering::Relaxed);
        self.dir.join(format!("{}{group}-{n}.snap", self.prefix))
    }
}

impl Drop for SnapshotFiles {
    /// Removes the states fetched but not installed. Every fetch thread holds the set, so none
    /// is writing a file now.
    fn drop(&mut self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            if name
                .to_str()
                .is_some_and(|name| name.starts_with(&self.prefix))
            {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

/// Fetches `group`'s state from node `from` into a file on a thread of its own, then tells the
/// worker through `mailbox`. The caller took a slot with [`SnapshotFiles::try_start`].
pub(crate) fn start_fetch(
    files: Arc<SnapshotFiles>,
    transport: Arc<dyn Transport>,
    mailbox: Arc<Mailbox>,
    group: GroupId,
    from: NodeId,
    min_index: u64,
) {
    let path = files.file_for(group);
    let fetch = {
        let files = files.clone();
        let mailbox = mailbox.clone();
        move || {
            let event = match fetch_into(transport.as_ref(), &path, group, from, min_index) {
                Ok(()) => SnapshotEvent::Fetched { path, min_index },
                Err(failure) => {
                    let _ = std::fs::remove_file(&path);
                    SnapshotEvent::Failed(failure)
                }
            };
            files.fetching.fetch_sub(1, Ordering::AcqRel);
            report(&mailbox, group, event);
        }
    };
    let spawned = std::thread::Builder::new()
        .name(format!("concord-snapshot-fetch-{group}"))
        .spawn(fetch);
    if let Err(error) = spawned {
        files.fetching.fetch_sub(1, Ordering::AcqRel);
        report(
            &mailbox,
            group,
            SnapshotEvent::Failed(SnapshotFailure::Broken(format!(
                "cannot start a fetch thread: {error}"
            ))),
        );
    }
}

fn fetch_into(
    transport: &dyn Transport,
    path: &Path,
    group: GroupId,
    from: NodeId,
    min_index: u64,
) -> Result<(), SnapshotFailure> {
    let local = |e: std::io::Error| SnapshotFailure::Broken(format!("{}: {e}", path.display()));
    let file = File::create(path).map_err(local)?;
    let mut out = BufWriter::with_capacity(64 * 1024, file);
    transport
        .fetch_snapshot(from, group, min_index, &mut out)
        .map_err(|error| {
            let reason = format!("fetching from node {from}: {error}");
            match error {
                SnapshotFetchError::Refused(_) => SnapshotFailure::Refused(reason),
                SnapshotFetchError::Transfer(_) => SnapshotFailure::Broken(reason),
            }
        })?;
    out.flush().map_err(local)
}

/// Hands `event` about `group` to the worker.
pub(crate) fn report(mailbox: &Mailbox, group: GroupId, event: SnapshotEvent) {
    mailbox.inbox.lock().snapshots.push((group, event));
    mailbox.wake();
}

/// Installs the state in `path` as `group`'s, replacing what the store holds, unless the
/// store has applied as far already; flushes it; removes the file. Before the store is
/// touched, `marks` records the install durably (removed once the log holds the snapshot).
/// Returns the applied index the group's state is at now.
pub(crate) fn install(
    store: &dyn StateStore,
    marks: &InstallMarks,
    group: GroupId,
    path: &Path,
    min_index: u64,
    applied: u64,
) -> Result<u64, String> {
    let installed = File::open(path)
        .map_err(|e| format!("{}: {e}", path.display()))
        .and_then(|file| {
            let mut input = BufReader::with_capacity(64 * 1024, file);
            let mut reader = SnapshotReader::new(&mut input).map_err(|e| e.to_string())?;
            let index = reader.applied_index();
            if index < min_index {
                return Err(format!(
                    "the state sent is at index {index}, before the snapshot's {min_index}"
                ));
            }
            if index <= applied {
                return Ok(applied);
            }
            marks
                .mark(group, min_index)
                .map_err(|e| format!("marking the install: {e}"))?;
            store
                .restore(group, index, &mut reader)
                .map_err(|e| e.to_string())?;
            store.flush().map_err(|e| e.to_string())?;
            Ok(index)
        });
    let _ = std::fs::remove_file(path);
    installed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::GroupMessage;

    /// A network whose every fetch ends with the error it was made with.
    struct FailingFetches(fn() -> SnapshotFetchError);

    impl Transport for FailingFetches {
        fn send(&self, _to: NodeId, _messages: Vec<GroupMessage>) {}

        fn fetch_snapshot(
            &self,
            _from: NodeId,
            _group: GroupId,
            _min_index: u64,
            _out: &mut dyn Write,
        ) -> Result<(), SnapshotFetchError> {
            Err((self.0)())
        }
    }

    #[test]
    fn a_member_that_cannot_serve_a_state_now_is_told_apart_from_a_broken_fetch() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.snap");
        let busy = FailingFetches(|| {
            SnapshotFetchError::Refused("2 snapshots are being sent already".into())
        });
        match fetch_into(&busy, &path, 3, 2, 10) {
            Err(SnapshotFailure::Refused(reason)) => {
                assert!(reason.contains("node 2"), "{reason}");
                assert!(reason.contains("being sent already"), "{reason}");
            }
            other => panic!("a busy member's refusal came back as {other:?}"),
        }
        let cut = FailingFetches(|| SnapshotFetchError::Transfer("connection reset".into()));
        assert!(matches!(
            fetch_into(&cut, &path, 3, 2, 10),
            Err(SnapshotFailure::Broken(reason)) if reason.contains("connection reset")
        ));
        let nowhere = dir.path().join("no such directory").join("state.snap");
        assert!(matches!(
            fetch_into(&busy, &nowhere, 3, 2, 10),
            Err(SnapshotFailure::Broken(_))
        ));
    }

    #[test]
    fn a_set_removes_its_uninstalled_states_and_no_other_sets_files() {
        let dir = tempfile::tempdir().unwrap();
        let first = SnapshotFiles::open(Some(dir.path()), 1).unwrap();
        let second = SnapshotFiles::open(Some(dir.path()), 1).unwrap();
        let (left, kept) = (first.file_for(7), second.file_for(7));
        assert_ne!(
            left, kept,
            "two sets of the same node name their files apart"
        );
        std::fs::write(&left, b"a state fetched, never installed").unwrap();
        std::fs::write(&kept, b"a state being fetched").unwrap();
        drop(first);
        assert!(!left.exists());
        assert!(kept.exists());
        drop(second);
        assert!(!kept.exists());
    }
}
