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
use std::time::Instant;

use concord_storage::{GroupId, GroupRestore, SnapshotReader, StateStore};

use super::install_marks::InstallMarks;
use crate::NodeId;
use crate::mailbox::{Mailbox, SnapshotEvent, SnapshotFailure};
use crate::transport::{SnapshotFetchError, Transport};

/// Snapshot fetches a node runs at once; other groups wait their turn. Each fetch is a
/// connection and a thread at either end and mostly waits on them, so a member catching up
/// thousands of small states fetches several at once; each writes to a file, so memory does
/// not grow with this.
pub(crate) const MAX_CONCURRENT_FETCHES: usize = 8;

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
            let started = Instant::now();
            let fetched = fetch_into(transport.as_ref(), &path, group, from, min_index);
            let outcome = match &fetched {
                Ok(()) => "fetched",
                Err(SnapshotFailure::Refused(_)) => "refused",
                Err(SnapshotFailure::Broken(_)) => "failed",
            };
            crate::metrics::snapshot_fetch(started.elapsed(), outcome);
            let event = match fetched {
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

/// Gives up installing the state fetched into `path`: removes the file and says why, as the
/// event the worker is told (the leader sends the snapshot again).
pub(crate) fn abandon(path: &Path, reason: String) -> SnapshotEvent {
    let _ = std::fs::remove_file(path);
    SnapshotEvent::Failed(SnapshotFailure::Broken(reason))
}

/// A state fetched for `group` into `path`, for a snapshot at `min_index`, and the index the
/// group's state is at before its install.
#[derive(Debug)]
pub(crate) struct FetchedState {
    pub(crate) group: GroupId,
    pub(crate) path: PathBuf,
    pub(crate) min_index: u64,
    pub(crate) applied: u64,
}

/// Installs each state as its group's, replacing what the store holds, unless the store has
/// applied as far already; flushes the store; removes the files. Before the store is touched,
/// `marks` records each install durably (removed once the log holds the snapshot). The
/// states go in together, in one restore and one flush; if that fails, each is tried alone,
/// so that one state the store cannot take fails alone. Returns, per state in order, the
/// applied index its group's state is at now.
pub(crate) fn install_all(
    store: &dyn StateStore,
    marks: &InstallMarks,
    states: &[FetchedState],
) -> Vec<Result<u64, String>> {
    let outcomes = install_together(store, marks, states);
    for state in states {
        let _ = std::fs::remove_file(&state.path);
    }
    outcomes
}

fn install_together(
    store: &dyn StateStore,
    marks: &InstallMarks,
    states: &[FetchedState],
) -> Vec<Result<u64, String>> {
    let mut outcomes: Vec<Result<u64, String>> = Vec::with_capacity(states.len());
    let mut inputs = Vec::with_capacity(states.len());
    for (at, state) in states.iter().enumerate() {
        match File::open(&state.path) {
            Ok(file) => {
                inputs.push((at, BufReader::with_capacity(64 * 1024, file)));
                outcomes.push(Ok(state.applied));
            }
            Err(error) => outcomes.push(Err(format!("{}: {error}", state.path.display()))),
        }
    }
    // (position, the state's index, its records) of each state to restore.
    let mut restoring = Vec::with_capacity(inputs.len());
    for (at, input) in &mut inputs {
        let state = &states[*at];
        let reader = match SnapshotReader::new(input) {
            Ok(reader) => reader,
            Err(error) => {
                outcomes[*at] = Err(error.to_string());
                continue;
            }
        };
        let index = reader.applied_index();
        if index < state.min_index {
            outcomes[*at] = Err(format!(
                "the state sent is at index {index}, before the snapshot's {}",
                state.min_index
            ));
        } else if index > state.applied {
            restoring.push((*at, index, reader));
        }
    }
    if restoring.is_empty() {
        return outcomes;
    }
    let marked: Vec<(GroupId, u64)> = restoring
        .iter()
        .map(|&(at, _, _)| (states[at].group, states[at].min_index))
        .collect();
    let restored = marks
        .mark_all(&marked)
        .map_err(|e| format!("marking the install: {e}"))
        .and_then(|()| {
            let mut restores: Vec<GroupRestore<'_>> = restoring
                .iter_mut()
                .map(|(at, index, reader)| GroupRestore {
                    group: states[*at].group,
                    applied_index: *index,
                    records: reader,
                })
                .collect();
            store
                .restore_groups(&mut restores)
                .and_then(|()| store.flush())
                .map_err(|e| e.to_string())
        });
    let restored_at: Vec<(usize, u64)> = restoring
        .iter()
        .map(|&(at, index, _)| (at, index))
        .collect();
    match restored {
        Ok(()) => {
            for (at, index) in restored_at {
                outcomes[at] = Ok(index);
            }
        }
        Err(reason) if restored_at.len() == 1 => outcomes[restored_at[0].0] = Err(reason),
        Err(_) => {
            // One state the store could not take fails them all: each alone again, so that
            // only such a state fails.
            for (at, _) in restored_at {
                let alone = install_together(store, marks, std::slice::from_ref(&states[at]));
                if let Some(outcome) = alone.into_iter().next() {
                    outcomes[at] = outcome;
                }
            }
        }
    }
    outcomes
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

    /// A state of `group` at `applied` holding one pair, exported from a store of its own.
    fn exported(group: GroupId, applied: u64) -> Vec<u8> {
        let source = concord_storage::MemStateStore::new();
        let mut writes = concord_storage::WriteSet::new();
        writes.put(b"k", &group.to_be_bytes()).unwrap();
        source.commit(group, writes, applied).unwrap();
        let mut stream = Vec::new();
        concord_storage::export_snapshot(&source, group, &mut stream).unwrap();
        stream
    }

    #[test]
    fn states_installed_together_fail_one_by_one_and_leave_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let marks_dir = dir.path().join("marks");
        std::fs::create_dir(&marks_dir).unwrap();
        let marks = InstallMarks::new(Some(&marks_dir));
        let store = concord_storage::MemStateStore::new();
        let mut damaged = exported(4, 30);
        let middle = damaged.len() / 2;
        damaged[middle] ^= 0x01;
        // (group, bytes, the snapshot's index, the group's applied index now)
        let cases: Vec<(GroupId, Vec<u8>, u64, u64)> = vec![
            (1, exported(1, 10), 10, 0),
            (2, exported(2, 20), 20, 25), // the group applied past it already
            (3, exported(3, 5), 8, 0),    // a state before its snapshot
            (4, damaged, 30, 0),          // its records fail the whole set's restore
            (5, exported(5, 50), 48, 0),
        ];
        let mut states = Vec::new();
        for (group, bytes, min_index, applied) in cases {
            let path = dir.path().join(format!("{group}.snap"));
            std::fs::write(&path, bytes).unwrap();
            states.push(FetchedState {
                group,
                path,
                min_index,
                applied,
            });
        }
        states.push(FetchedState {
            group: 6,
            path: dir.path().join("never fetched.snap"),
            min_index: 1,
            applied: 0,
        });
        let outcomes = install_all(&store, &marks, &states);
        assert_eq!(outcomes[0], Ok(10));
        assert_eq!(outcomes[1], Ok(25));
        assert!(matches!(&outcomes[2], Err(reason) if reason.contains("before the snapshot's 8")));
        assert!(outcomes[3].is_err(), "{:?}", outcomes[3]);
        assert_eq!(outcomes[4], Ok(50));
        assert!(matches!(&outcomes[5], Err(reason) if reason.contains("never fetched")));
        for (group, applied) in [(1, 10), (5, 50)] {
            assert_eq!(store.applied_index(group).unwrap(), applied);
            assert_eq!(
                store.get(group, b"k").unwrap(),
                Some(group.to_be_bytes().to_vec())
            );
        }
        for group in [2, 3, 4] {
            assert_eq!(store.applied_index(group).unwrap(), 0, "group {group}");
        }
        assert_eq!(
            InstallMarks::read_all(&marks_dir).unwrap(),
            vec![(1, 10), (4, 30), (5, 48)],
            "each install that touched the store was marked first"
        );
        for state in &states {
            assert!(!state.path.exists(), "{} left behind", state.path.display());
        }
    }
}
