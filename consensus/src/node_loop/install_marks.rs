//! A durable mark, per group, of a snapshot's state going into the state store before the log
//! records the snapshot.
//!
//! A follower installs a fetched state into the state store and flushes it, and only then does
//! raft record the snapshot in the log (`snapshot_install.rs`). A crash in between leaves a
//! state ahead of what the log says is committed. Where the log also ends before the state,
//! the node sees it at start and restarts the log after the state (`recovery.rs`). But the log
//! may reach past the state: a follower sent a snapshot is one whose log does not match the
//! leader's at the snapshot's index, and it may hold entries of an old term there and after,
//! which no leader will commit. Raft would take every entry up to the state's applied index as
//! committed, and the node would stall in that group for good: it answers the leader's
//! appends as if it held the leader's entries there, and never takes them.
//!
//! So before the install touches the state store, a mark naming the snapshot's index is
//! written and synced, and once the log holds the snapshot the mark is removed. A mark found
//! at start, for a state at or past its index and a log that never recorded a snapshot there,
//! tells a log whose entries up to the state cannot be trusted; no entry of it past the
//! snapshot's index can be committed (it would then match the leader's log at that index), so
//! the log restarts after the state as when it ends before it.

use std::io::Write;
use std::path::{Path, PathBuf};

use concord_storage::{GroupId, StorageError, StorageResult};

/// How every mark's file name begins; the group id follows.
const PREFIX: &str = "installing-";

/// The marks of one node, in its snapshot directory; none where it has no directory of its own
/// (its files would not outlive the process).
#[derive(Debug)]
pub(crate) struct InstallMarks {
    dir: Option<PathBuf>,
}

impl InstallMarks {
    /// Marks kept in `dir`, the node's own snapshot directory (`None`: no marks).
    pub(crate) fn new(dir: Option<&Path>) -> InstallMarks {
        InstallMarks {
            dir: dir.map(Path::to_path_buf),
        }
    }

    fn path(dir: &Path, group: GroupId) -> PathBuf {
        dir.join(format!("{PREFIX}{group}"))
    }

    /// Records, durably, that `group`'s state is about to be replaced by a snapshot's at
    /// `index`: written beside, synced, renamed over any earlier mark, the directory synced.
    pub(crate) fn mark(&self, group: GroupId, index: u64) -> std::io::Result<()> {
        let Some(dir) = &self.dir else {
            return Ok(());
        };
        let path = Self::path(dir, group);
        let partial = path.with_extension("partial");
        let mut file = std::fs::File::create(&partial)?;
        file.write_all(format!("{index}\n").as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&partial, &path)?;
        std::fs::File::open(dir)?.sync_all()
    }

    /// Forgets `group`'s mark: the log holds the snapshot now. Not synced: a mark that
    /// outlives a crash names a snapshot the log holds, which the start's check sees.
    pub(crate) fn unmark(&self, group: GroupId) {
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_file(Self::path(dir, group));
        }
    }

    /// Every mark in `dir`: `(group, snapshot index)`. A mark that cannot be read is an error
    /// naming its file: taken for an install it would restart a log that may hold what this
    /// node acknowledged, and left out it may leave a group stalled.
    pub(crate) fn read_all(dir: &Path) -> StorageResult<Vec<(GroupId, u64)>> {
        let io = |path: &Path, source: std::io::Error| StorageError::Io {
            path: path.to_path_buf(),
            source,
        };
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(io(dir, error)),
        };
        let mut marks = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|error| io(dir, error))?;
            let name = entry.file_name();
            let Some(group) = name.to_str().and_then(|name| name.strip_prefix(PREFIX)) else {
                continue;
            };
            let path = entry.path();
            if group.ends_with(".partial") {
                // A mark whose write a crash cut short: its install never began.
                let _ = std::fs::remove_file(&path);
                continue;
            }
            let damaged = |detail: String| StorageError::Corrupted {
                path: path.clone(),
                detail: format!(
                    "{detail}; the file marks a snapshot's install into the state store (it \
                     holds the snapshot's index) that a crash may have cut short"
                ),
            };
            let group: GroupId = group
                .parse()
                .map_err(|_| damaged(format!("{group:?} after `{PREFIX}` is not a group id")))?;
            let text = std::fs::read_to_string(&path).map_err(|error| io(&path, error))?;
            let index: u64 = text.trim().parse().map_err(|_| {
                let shown: String = text.trim().chars().take(32).collect();
                damaged(format!("{shown:?} is not an index"))
            })?;
            marks.push((group, index));
        }
        marks.sort_unstable();
        Ok(marks)
    }

    /// Removes every mark in `dir`, once the start's check has read them and the logs are
    /// repaired.
    pub(crate) fn remove_all(dir: &Path, marks: &[(GroupId, u64)]) {
        for &(group, _) in marks {
            let _ = std::fs::remove_file(Self::path(dir, group));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_read_back_until_removed_and_damaged_ones_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let marks = InstallMarks::new(Some(dir.path()));
        marks.mark(7, 120).unwrap();
        marks.mark(3, 40).unwrap();
        marks.mark(7, 150).unwrap();
        std::fs::write(dir.path().join("state-7-1.snap"), b"a fetched state").unwrap();
        std::fs::write(dir.path().join("installing-9.partial"), b"12").unwrap();
        let read = InstallMarks::read_all(dir.path()).unwrap();
        assert_eq!(read, vec![(3, 40), (7, 150)]);
        assert!(
            !dir.path().join("installing-9.partial").exists(),
            "a mark cut short is removed"
        );
        marks.unmark(3);
        assert_eq!(InstallMarks::read_all(dir.path()).unwrap(), vec![(7, 150)]);
        InstallMarks::remove_all(dir.path(), &[(7, 150)]);
        assert!(InstallMarks::read_all(dir.path()).unwrap().is_empty());
        assert!(dir.path().join("state-7-1.snap").exists());

        std::fs::write(dir.path().join("installing-4"), b"twelve").unwrap();
        let error = InstallMarks::read_all(dir.path()).unwrap_err().to_string();
        assert!(error.contains("installing-4"), "{error}");
        assert!(error.contains("not an index"), "{error}");

        let missing = dir.path().join("never made");
        assert!(InstallMarks::read_all(&missing).unwrap().is_empty());
        // A node without a directory of its own keeps no marks.
        InstallMarks::new(None).mark(1, 1).unwrap();
    }
}
