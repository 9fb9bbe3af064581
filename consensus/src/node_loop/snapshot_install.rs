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
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use concord_storage::{GroupId, GroupRestore, SnapshotReader, StateStore};
use parking_lot::Mutex;

use super::install_marks::InstallMarks;
use crate::NodeId;
use crate::mailbox::{Mailbox, SnapshotEvent, SnapshotFailure};
use crate::transport::{SnapshotFetchError, Transport};

/// Snapshot fetches a node runs at once; other groups wait their turn. Each fetch is a
/// connection and a thread at either end and mostly waits on them, so a member catching up
/// thousands of small states fetches several at once; each writes to files, so memory does
/// not grow with this beyond the files' write buffers.
pub(crate) const MAX_CONCURRENT_FETCHES: usize = 8;

/// Fetches a node runs at once from one member: as many as a member sends at once (over TCP,
/// `transport/tcp/snapshot_serving.rs`), so that the fetches of one member catching up are not
/// refused for its own others.
pub(crate) const MAX_FETCHES_PER_MEMBER: usize = 4;

/// States one fetch asks one member for (one connection, one thread at either end; a peer
/// of an older version is asked for them one after another). A member catching up thousands
/// of small states pays those per batch rather than per state.
pub(crate) const MAX_STATES_PER_FETCH: usize = 32;

/// The write buffer of each file a fetch writes a state into.
const FETCH_FILE_BUFFER_BYTES: usize = 16 * 1024;

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
    /// Fetches running now, in all and per member asked.
    fetching: Mutex<Fetching>,
}

/// The fetches a node runs now.
#[derive(Default)]
struct Fetching {
    all: usize,
    /// `(member asked, fetches)`, for the members asked now.
    from: Vec<(NodeId, usize)>,
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
            fetching: Mutex::new(Fetching::default()),
        })
    }

    /// Takes a slot for a fetch from `from`, if one is free: fewer than
    /// [`MAX_CONCURRENT_FETCHES`] run, and fewer than [`MAX_FETCHES_PER_MEMBER`] from `from`.
    pub(crate) fn try_start(&self, from: NodeId) -> bool {
        let mut fetching = self.fetching.lock();
        if fetching.all >= MAX_CONCURRENT_FETCHES {
            return false;
        }
        let at = match fetching.from.iter().position(|&(node, _)| node == from) {
            Some(at) => at,
            None => {
                fetching.from.push((from, 0));
                fetching.from.len() - 1
            }
        };
        if fetching.from[at].1 >= MAX_FETCHES_PER_MEMBER {
            return false;
        }
        fetching.from[at].1 += 1;
        fetching.all += 1;
        true
    }

    /// Gives back the slot of a fetch from `from` that ended (or never began).
    pub(crate) fn finished(&self, from: NodeId) {
        let mut fetching = self.fetching.lock();
        fetching.all = fetching.all.saturating_sub(1);
        if let Some(at) = fetching.from.iter().position(|&(node, _)| node == from) {
            fetching.from[at].1 -= 1;
            if fetching.from[at].1 == 0 {
                fetching.from.swap_remove(at);
            }
        }
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

/// Fetches the states `requests` name (`(group, min index)`, all from node `from`) into a file
/// each, on a thread of its own, then tells the worker through `mailbox` how each went. The
/// caller took one slot with [`SnapshotFiles::try_start`] for the whole batch.
pub(crate) fn start_fetches(
    files: Arc<SnapshotFiles>,
    transport: Arc<dyn Transport>,
    mailbox: Arc<Mailbox>,
    from: NodeId,
    requests: Vec<(GroupId, u64)>,
) {
    let paths: Vec<PathBuf> = (requests.iter())
        .map(|&(group, _)| files.file_for(group))
        .collect();
    let fetch = {
        let (files, mailbox, requests) = (files.clone(), mailbox.clone(), requests.clone());
        move || {
            let started = Instant::now();
            let outcomes = fetch_all_into(transport.as_ref(), &paths, from, &requests);
            // Each state's share of the batch's time, so that the times add up to the thread's.
            let count = u32::try_from(requests.len()).unwrap_or(u32::MAX).max(1);
            let share = started.elapsed() / count;
            let mut events = Vec::with_capacity(requests.len());
            for ((&(group, min_index), path), fetched) in requests.iter().zip(paths).zip(outcomes) {
                let outcome = match &fetched {
                    Ok(()) => "fetched",
                    Err(SnapshotFailure::Refused(_)) => "refused",
                    Err(SnapshotFailure::Broken(_)) => "failed",
                };
                crate::metrics::snapshot_fetch(share, outcome);
                let event = match fetched {
                    Ok(()) => SnapshotEvent::Fetched { path, min_index },
                    Err(failure) => {
                        let _ = std::fs::remove_file(&path);
                        SnapshotEvent::Failed(failure)
                    }
                };
                events.push((group, event));
            }
            files.finished(from);
            report_all(&mailbox, events);
        }
    };
    let spawned = std::thread::Builder::new()
        .name(format!("concord-snapshot-fetch-{from}"))
        .spawn(fetch);
    if let Err(error) = spawned {
        files.finished(from);
        let events = (requests.iter())
            .map(|&(group, _)| {
                let reason = format!("cannot start a fetch thread: {error}");
                (
                    group,
                    SnapshotEvent::Failed(SnapshotFailure::Broken(reason)),
                )
            })
            .collect();
        report_all(&mailbox, events);
    }
}

/// Fetches `requests` from node `from`, each into its file of `paths`: one outcome per
/// request, in order. A file that cannot be made fails its request alone.
fn fetch_all_into(
    transport: &dyn Transport,
    paths: &[PathBuf],
    from: NodeId,
    requests: &[(GroupId, u64)],
) -> Vec<Result<(), SnapshotFailure>> {
    let local = |path: &Path, e: std::io::Error| {
        SnapshotFailure::Broken(format!("{}: {e}", path.display()))
    };
    let mut outcomes: Vec<Option<Result<(), SnapshotFailure>>> = Vec::new();
    let mut asked = Vec::new();
    let mut writers = Vec::new();
    for (at, path) in paths.iter().enumerate() {
        match File::create(path) {
            Ok(file) => {
                asked.push(at);
                writers.push(BufWriter::with_capacity(FETCH_FILE_BUFFER_BYTES, file));
                outcomes.push(None);
            }
            Err(error) => outcomes.push(Some(Err(local(path, error)))),
        }
    }
    let asked_requests: Vec<(GroupId, u64)> = asked.iter().map(|&at| requests[at]).collect();
    let fetched = if asked_requests.is_empty() {
        Vec::new()
    } else {
        let mut outs: Vec<&mut dyn Write> =
            (writers.iter_mut()).map(|w| w as &mut dyn Write).collect();
        transport.fetch_snapshots(from, &asked_requests, &mut outs)
    };
    for ((at, mut writer), result) in asked.into_iter().zip(writers).zip(fetched) {
        let outcome = result
            .map_err(|error| {
                let reason = format!("fetching from node {from}: {error}");
                match error {
                    SnapshotFetchError::Refused(_) => SnapshotFailure::Refused(reason),
                    SnapshotFetchError::Transfer(_) => SnapshotFailure::Broken(reason),
                }
            })
            .and_then(|()| writer.flush().map_err(|error| local(&paths[at], error)));
        outcomes[at] = Some(outcome);
    }
    (outcomes.into_iter())
        .map(|outcome| {
            outcome.unwrap_or_else(|| {
                Err(SnapshotFailure::Broken(format!(
                    "fetching from node {from}: the network answered fewer requests than asked"
                )))
            })
        })
        .collect()
}

/// Hands `events` about their groups to the worker at once.
fn report_all(mailbox: &Mailbox, events: Vec<(GroupId, SnapshotEvent)>) {
    mailbox.inbox.lock().snapshots.extend(events);
    mailbox.wake();
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

    /// One fetch into `path`.
    fn fetch_one(transport: &dyn Transport, path: &Path) -> Result<(), SnapshotFailure> {
        let paths = [path.to_path_buf()];
        let mut outcomes = fetch_all_into(transport, &paths, 2, &[(3, 10)]);
        assert_eq!(outcomes.len(), 1);
        outcomes.remove(0)
    }

    #[test]
    fn a_member_that_cannot_serve_a_state_now_is_told_apart_from_a_broken_fetch() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.snap");
        let busy = FailingFetches(|| {
            SnapshotFetchError::Refused("2 snapshots are being sent already".into())
        });
        match fetch_one(&busy, &path) {
            Err(SnapshotFailure::Refused(reason)) => {
                assert!(reason.contains("node 2"), "{reason}");
                assert!(reason.contains("being sent already"), "{reason}");
            }
            other => panic!("a busy member's refusal came back as {other:?}"),
        }
        let cut = FailingFetches(|| SnapshotFetchError::Transfer("connection reset".into()));
        assert!(matches!(
            fetch_one(&cut, &path),
            Err(SnapshotFailure::Broken(reason)) if reason.contains("connection reset")
        ));
        let nowhere = dir.path().join("no such directory").join("state.snap");
        assert!(matches!(
            fetch_one(&busy, &nowhere),
            Err(SnapshotFailure::Broken(_))
        ));
    }

    /// A network that serves every even group and refuses every odd one.
    struct EvenGroupsOnly;

    impl Transport for EvenGroupsOnly {
        fn send(&self, _to: NodeId, _messages: Vec<GroupMessage>) {}

        fn fetch_snapshot(
            &self,
            _from: NodeId,
            group: GroupId,
            _min_index: u64,
            out: &mut dyn Write,
        ) -> Result<(), SnapshotFetchError> {
            if group % 2 == 1 {
                return Err(SnapshotFetchError::Refused(format!("group {group} is odd")));
            }
            out.write_all(&exported(group, 5))
                .map_err(|error| SnapshotFetchError::Transfer(error.to_string()))
        }
    }

    /// A batch's outcomes come back one per request, in order, each state in its own file; a
    /// file that cannot be made fails only its own request.
    #[test]
    fn a_batch_answers_each_request_in_its_place() {
        let dir = tempfile::tempdir().unwrap();
        let mut paths: Vec<PathBuf> = (0..4)
            .map(|n| dir.path().join(format!("{n}.snap")))
            .collect();
        paths[3] = dir.path().join("no such directory").join("3.snap");
        let requests = [(10, 5), (11, 5), (12, 5), (14, 5)];
        let outcomes = fetch_all_into(&EvenGroupsOnly, &paths, 2, &requests);
        assert_eq!(outcomes.len(), 4);
        assert!(outcomes[0].is_ok() && outcomes[2].is_ok(), "{outcomes:?}");
        assert!(matches!(&outcomes[1], Err(SnapshotFailure::Refused(r)) if r.contains("odd")));
        assert!(matches!(&outcomes[3], Err(SnapshotFailure::Broken(_))));
        assert_eq!(std::fs::read(&paths[0]).unwrap(), exported(10, 5));
        assert_eq!(std::fs::read(&paths[2]).unwrap(), exported(12, 5));
    }

    #[test]
    fn fetch_slots_are_bounded_in_all_and_per_member() {
        let dir = tempfile::tempdir().unwrap();
        let files = SnapshotFiles::open(Some(dir.path()), 1).unwrap();
        let from_2 = (0..MAX_FETCHES_PER_MEMBER + 1)
            .filter(|_| files.try_start(2))
            .count();
        assert_eq!(from_2, MAX_FETCHES_PER_MEMBER);
        let others = (0..MAX_CONCURRENT_FETCHES)
            .filter(|n| files.try_start(3 + *n as NodeId % 2))
            .count();
        assert_eq!(others, MAX_CONCURRENT_FETCHES - MAX_FETCHES_PER_MEMBER);
        assert!(!files.try_start(5), "every slot is taken");
        files.finished(2);
        assert!(files.try_start(2), "member 2's freed slot");
        for member in [2, 2, 2, 2, 3, 3, 4, 4] {
            files.finished(member);
        }
        assert!(files.fetching.lock().from.is_empty());
        assert_eq!(files.fetching.lock().all, 0);
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
