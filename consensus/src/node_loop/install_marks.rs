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
//!
//! The marks are lines appended to one file, `installing-log`, a line `<group> <index>` for
//! every install of a batch, in one write and one sync: a member catching up installs
//! thousands of snapshots, and a file per mark costs a sync of the file and one of the
//! directory. The file is emptied, without a sync, whenever no mark stands, and written anew
//! with the marks standing when it grows past a bound. A mark that outlives a crash, or the
//! file's emptying, names a snapshot the log holds or one a later mark in the file replaces
//! (the highest index of a group counts), which the start's check sees. A last line a crash
//! cut short is a mark whose sync never finished: its install never began. A node that stops
//! with no mark standing removes the file. Earlier versions wrote a file `installing-<group>`
//! per mark, holding the index; those are read too (and they refuse to start beside this file,
//! naming it).

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use concord_storage::{GroupId, StorageError, StorageResult};
use parking_lot::Mutex;

/// How every mark file's name begins.
const PREFIX: &str = "installing-";

/// The file of marks, after [`PREFIX`].
const LOG: &str = "log";

/// The size past which the file of marks is written anew with the marks standing alone.
const MAX_LOG_BYTES: u64 = 1024 * 1024;

/// The marks of one node, in its snapshot directory; none where it has no directory of its own
/// (its files would not outlive the process).
#[derive(Debug)]
pub(crate) struct InstallMarks {
    dir: Option<PathBuf>,
    log: Mutex<MarkLog>,
}

/// The file of marks as this process writes it.
#[derive(Debug, Default)]
struct MarkLog {
    /// Open for appending once the first mark is written.
    file: Option<File>,
    /// Bytes in the file.
    bytes: u64,
    /// A write to the file failed: what reached it is unknown, so the next mark writes the
    /// file anew rather than append after a line cut short.
    damaged: bool,
    /// Each group's mark standing: the snapshot's index.
    standing: HashMap<GroupId, u64>,
}

impl MarkLog {
    fn path(dir: &Path) -> PathBuf {
        dir.join(format!("{PREFIX}{LOG}"))
    }

    /// The file, opened for appending; created (and the directory synced, so that the file
    /// outlives a crash) if the start's check removed it.
    fn open(&mut self, dir: &Path) -> std::io::Result<&mut File> {
        let file = match self.file.take() {
            Some(file) => file,
            None => {
                let file = File::options()
                    .create(true)
                    .append(true)
                    .open(Self::path(dir))?;
                File::open(dir)?.sync_all()?;
                self.bytes = file.metadata()?.len();
                file
            }
        };
        Ok(self.file.insert(file))
    }

    /// Writes the file anew with the marks standing alone, beside it and renamed over it.
    fn rewrite(&mut self, dir: &Path) -> std::io::Result<()> {
        let path = Self::path(dir);
        let partial = path.with_extension("partial");
        let mut file = File::create(&partial)?;
        file.write_all(lines(self.standing.iter().map(|(&g, &i)| (g, i))).as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&partial, &path)?;
        File::open(dir)?.sync_all()?;
        self.file = None;
        self.damaged = false;
        self.open(dir).map(|_| ())
    }
}

/// The lines of `marks` in a file of marks.
fn lines(marks: impl Iterator<Item = (GroupId, u64)>) -> String {
    let mut text = String::new();
    for (group, index) in marks {
        text.push_str(&format!("{group} {index}\n"));
    }
    text
}

impl InstallMarks {
    /// Marks kept in `dir`, the node's own snapshot directory (`None`: no marks). The start's
    /// check has read and removed the marks there before (`InstallMarks::remove_all`).
    pub(crate) fn new(dir: Option<&Path>) -> InstallMarks {
        InstallMarks {
            dir: dir.map(Path::to_path_buf),
            log: Mutex::new(MarkLog::default()),
        }
    }

    /// Records, durably, that `group`'s state is about to be replaced by a snapshot's at
    /// `index`.
    #[cfg(test)]
    pub(crate) fn mark(&self, group: GroupId, index: u64) -> std::io::Result<()> {
        self.mark_all(&[(group, index)])
    }

    /// Records, durably, that each group's state is about to be replaced by a snapshot's at
    /// its index, in one write and one sync; each replaces the group's earlier mark.
    pub(crate) fn mark_all(&self, marks: &[(GroupId, u64)]) -> std::io::Result<()> {
        let Some(dir) = &self.dir else {
            return Ok(());
        };
        let mut log = self.log.lock();
        if log.damaged || log.bytes > MAX_LOG_BYTES {
            log.rewrite(dir)?;
        }
        let text = lines(marks.iter().copied());
        let file = log.open(dir)?;
        if let Err(error) = file
            .write_all(text.as_bytes())
            .and_then(|()| file.sync_data())
        {
            log.damaged = true;
            return Err(error);
        }
        log.bytes += text.len() as u64;
        log.standing.extend(marks.iter().copied());
        Ok(())
    }

    /// Forgets `group`'s mark: the log holds the snapshot now. The file is emptied once no
    /// mark stands.
    pub(crate) fn unmark(&self, group: GroupId) {
        let mut log = self.log.lock();
        if log.standing.remove(&group).is_none() || !log.standing.is_empty() {
            return;
        }
        if let Some(file) = &log.file {
            match file.set_len(0) {
                Ok(()) => log.bytes = 0,
                Err(_) => log.damaged = true,
            }
        }
    }

    /// Every mark in `dir`: `(group, snapshot index)`, the highest of a group's. A mark that
    /// cannot be read is an error naming its file: taken for an install it would restart a log
    /// that may hold what this node acknowledged, and left out it may leave a group stalled.
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
        let mut highest: HashMap<GroupId, u64> = HashMap::new();
        for entry in entries {
            let entry = entry.map_err(|error| io(dir, error))?;
            let name = entry.file_name();
            let Some(name) = name.to_str().and_then(|name| name.strip_prefix(PREFIX)) else {
                continue;
            };
            let path = entry.path();
            if name.ends_with(".partial") {
                // A mark, or a file of marks written anew, that a crash cut short: the file
                // it was to replace stands, if any.
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
            let text = std::fs::read(&path).map_err(|error| io(&path, error))?;
            let marks = if name == LOG {
                parse_log(&text).map_err(damaged)?
            } else {
                let group = parse_group(name)
                    .map_err(|_| damaged(format!("{name:?} after `{PREFIX}` is not a group id")))?;
                let text = String::from_utf8_lossy(&text);
                vec![(group, parse_index(text.trim()).map_err(damaged)?)]
            };
            for (group, index) in marks {
                let kept = highest.entry(group).or_insert(index);
                *kept = (*kept).max(index);
            }
        }
        let mut marks: Vec<(GroupId, u64)> = highest.into_iter().collect();
        marks.sort_unstable();
        Ok(marks)
    }

    /// Removes every mark file in `dir`, once the start's check has read them and the logs are
    /// repaired.
    pub(crate) fn remove_all(dir: &Path) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            if entry
                .file_name()
                .to_str()
                .is_some_and(|name| name.starts_with(PREFIX))
            {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

impl Drop for InstallMarks {
    /// Removes the file of marks if none stands: a node that stopped cleanly leaves no file,
    /// which an earlier version (which refuses to start beside a file it cannot read) would
    /// take for a mark.
    fn drop(&mut self) {
        let log = self.log.get_mut();
        if let (Some(dir), Some(_), true) = (&self.dir, &log.file, log.standing.is_empty()) {
            let _ = std::fs::remove_file(MarkLog::path(dir));
        }
    }
}

/// The marks of a file of marks, a line `<group> <index>` each. A last line without its end
/// is a mark whose sync never finished.
fn parse_log(bytes: &[u8]) -> Result<Vec<(GroupId, u64)>, String> {
    let complete = match bytes.iter().rposition(|&byte| byte == b'\n') {
        Some(end) => &bytes[..=end],
        None => &[][..],
    };
    let text = std::str::from_utf8(complete).map_err(|_| "the file is not text".to_string())?;
    let mut marks = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line_error = |what: String| format!("line {}: {what}", number + 1);
        let Some((group, index)) = line.split_once(' ') else {
            return Err(line_error(format!(
                "{:?} is not a group and an index",
                shown(line)
            )));
        };
        marks.push((
            parse_group(group).map_err(line_error)?,
            parse_index(index).map_err(line_error)?,
        ));
    }
    Ok(marks)
}

fn parse_group(text: &str) -> Result<GroupId, String> {
    text.parse()
        .map_err(|_| format!("{:?} is not a group id", shown(text)))
}

fn parse_index(text: &str) -> Result<u64, String> {
    text.parse()
        .map_err(|_| format!("{:?} is not an index", shown(text)))
}

/// At most the first 32 characters of `text`, for an error.
fn shown(text: &str) -> String {
    text.chars().take(32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_text(dir: &Path) -> String {
        std::fs::read_to_string(dir.join("installing-log")).unwrap()
    }

    #[test]
    fn marks_are_read_back_until_removed_and_damaged_ones_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let marks = InstallMarks::new(Some(dir.path()));
        marks.mark_all(&[(7, 120), (5, 30)]).unwrap();
        marks.mark(3, 40).unwrap();
        marks.mark(7, 150).unwrap();
        std::fs::write(dir.path().join("state-7-1.snap"), b"a fetched state").unwrap();
        std::fs::write(dir.path().join("installing-9.partial"), b"12").unwrap();
        let read = InstallMarks::read_all(dir.path()).unwrap();
        assert_eq!(read, vec![(3, 40), (5, 30), (7, 150)]);
        assert!(
            !dir.path().join("installing-9.partial").exists(),
            "a mark cut short is removed"
        );
        marks.unmark(5);
        marks.unmark(3);
        marks.unmark(11);
        assert_eq!(
            InstallMarks::read_all(dir.path()).unwrap(),
            vec![(3, 40), (5, 30), (7, 150)],
            "marks no longer standing stay in the file while one stands"
        );
        marks.unmark(7);
        assert_eq!(log_text(dir.path()), "", "emptied once none stands");
        marks.mark(2, 8).unwrap();
        assert_eq!(log_text(dir.path()), "2 8\n");
        drop(marks);
        assert_eq!(
            InstallMarks::read_all(dir.path()).unwrap(),
            vec![(2, 8)],
            "a mark standing at the stop stays"
        );
        let marks = InstallMarks::new(Some(dir.path()));
        marks.mark(2, 9).unwrap();
        marks.unmark(2);
        drop(marks);
        assert!(
            !dir.path().join("installing-log").exists(),
            "a stop with no mark standing leaves no file"
        );

        // A file of marks a crash cut short in its last line, beside an older mark of an
        // earlier version's form: the highest of each group's counts.
        std::fs::write(dir.path().join("installing-log"), b"7 90\n2 15\n7 80\n4 1").unwrap();
        std::fs::write(dir.path().join("installing-7"), b"60\n").unwrap();
        std::fs::write(dir.path().join("installing-2"), b"33\n").unwrap();
        assert_eq!(
            InstallMarks::read_all(dir.path()).unwrap(),
            vec![(2, 33), (7, 90)]
        );
        InstallMarks::remove_all(dir.path());
        assert!(InstallMarks::read_all(dir.path()).unwrap().is_empty());
        assert!(dir.path().join("state-7-1.snap").exists());

        for (name, text, named) in [
            ("installing-4", &b"twelve"[..], "not an index"),
            ("installing-log", b"4 12\n5\n", "line 2"),
            ("installing-log", b"four 12\n", "not a group id"),
            ("installing-log", b"4 -1\n", "not an index"),
            ("installing-log", b"4 1\n\xff\xfe\n", "not text"),
        ] {
            std::fs::write(dir.path().join(name), text).unwrap();
            let error = InstallMarks::read_all(dir.path()).unwrap_err().to_string();
            assert!(error.contains(name), "{error}");
            assert!(error.contains(named), "{error}");
            std::fs::remove_file(dir.path().join(name)).unwrap();
        }

        let missing = dir.path().join("never made");
        assert!(InstallMarks::read_all(&missing).unwrap().is_empty());
        // A node without a directory of its own keeps no marks.
        InstallMarks::new(None).mark(1, 1).unwrap();
    }

    #[test]
    fn a_file_of_marks_grown_past_its_bound_is_written_anew_with_the_marks_standing() {
        let dir = tempfile::tempdir().unwrap();
        let marks = InstallMarks::new(Some(dir.path()));
        marks.mark(1, 5).unwrap();
        let batch: Vec<(GroupId, u64)> = (100..200).map(|group| (group, 1_000_000)).collect();
        let mut rounds = 0;
        while std::fs::metadata(dir.path().join("installing-log"))
            .unwrap()
            .len()
            <= MAX_LOG_BYTES
        {
            marks.mark_all(&batch).unwrap();
            rounds += 1;
            assert!(rounds < 10_000, "the file never grew");
        }
        for &(group, _) in &batch {
            marks.unmark(group);
        }
        marks.mark(2, 6).unwrap();
        let text = log_text(dir.path());
        assert!(text.len() < 64, "{} bytes", text.len());
        assert_eq!(
            InstallMarks::read_all(dir.path()).unwrap(),
            vec![(1, 5), (2, 6)]
        );
    }

    #[test]
    fn marks_in_hostile_files_are_refused_by_name_never_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let valid = vec![b"7 90\n2 15\n".to_vec(), b"1 1\n".to_vec()];
        for bytes in concord_storage::testing::hostile_inputs(&valid, 11, 300) {
            std::fs::write(dir.path().join("installing-log"), &bytes).unwrap();
            if let Err(error) = InstallMarks::read_all(dir.path()) {
                assert!(error.to_string().contains("installing-log"), "{error}");
            }
        }
    }
}
