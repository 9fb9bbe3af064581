//! The data directory of a node and its format marker.
//!
//! A node's data lives in one directory. Its `CONCORD_FORMAT` file says which format version
//! and which backend wrote it, so that a newer or older build, or the wrong backend, refuses
//! the directory with a clear message instead of misreading it.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::{BackendKind, StorageError, StorageResult};

/// Name of the marker file inside a data directory.
pub const FORMAT_FILE: &str = "CONCORD_FORMAT";
/// The on-disk format this build reads and writes. 2: the redb log stores one record per write
/// for all groups instead of one value per entry. 3: the redb log keeps its groups' metadata
/// in buckets of 64 groups instead of one value per group.
pub const FORMAT_VERSION: u32 = 3;
/// Present in a data directory while a restore from a backup into it has not finished: written
/// before anything else of the restore and removed last. A directory holding only it is still
/// new to [`prepare_data_dir`].
pub const RESTORE_MARKER_FILE: &str = "RESTORE_UNFINISHED";
/// Older formats this build reads: opening such a directory moves its marker to
/// [`FORMAT_VERSION`] (and the redb log moves its metadata into buckets), so that a build that
/// reads only the older format refuses it with a clear message rather than misreading it.
const UPGRADED_VERSIONS: [u32; 1] = [2];
const HEADER: &str = "concord data directory";

/// Creates `dir` if needed and checks (or, for a new directory, writes) its format marker.
///
/// A directory that holds files but no marker is refused: it is not ours to write into (a
/// temporary marker left by a first start that died writing it, and a restore's
/// [`RESTORE_MARKER_FILE`], do not count).
pub fn prepare_data_dir(dir: &Path, backend: BackendKind) -> StorageResult<()> {
    create_dir_durably(dir)?;
    let marker = dir.join(FORMAT_FILE);
    match fs::read_to_string(&marker) {
        Ok(text) => {
            let version = check_marker(dir, &text, backend)?;
            if version == FORMAT_VERSION {
                return Ok(());
            }
            write_marker(dir, &marker, backend)
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            // A process that died while writing the first marker leaves its temporary file
            // behind, and nothing else: the directory is still new.
            let temporary = temporary_marker(dir);
            let restoring = dir.join(RESTORE_MARKER_FILE);
            let mut listing = fs::read_dir(dir)
                .map_err(|source| io_error(dir, source))?
                .filter(|item| {
                    !matches!(item, Ok(item) if item.path() == temporary || item.path() == restoring)
                });
            if listing.next().is_some() {
                return Err(StorageError::IncompatibleFormat {
                    path: dir.to_path_buf(),
                    detail: format!(
                        "the directory is not empty and has no {FORMAT_FILE} file; \
                         refusing to write into a directory Concord did not create"
                    ),
                });
            }
            write_marker(dir, &marker, backend)
        }
        Err(source) => Err(io_error(&marker, source)),
    }
}

/// The backend named by `dir`'s format marker: `None` for a directory that has no marker (a
/// new one). A marker that cannot be read, of another format version, or naming no backend
/// this build knows is an error, as it is when the directory is opened.
///
/// ```
/// use concord_storage::{BackendKind, prepare_data_dir, recorded_backend};
///
/// let dir = tempfile::tempdir()?;
/// assert_eq!(recorded_backend(dir.path())?, None);
/// prepare_data_dir(dir.path(), BackendKind::Wal)?;
/// assert_eq!(recorded_backend(dir.path())?, Some(BackendKind::Wal));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn recorded_backend(dir: &Path) -> StorageResult<Option<BackendKind>> {
    let marker = dir.join(FORMAT_FILE);
    match fs::read_to_string(&marker) {
        Ok(text) => {
            let (_, written_by) = read_marker(dir, &text)?;
            written_by
                .parse()
                .map(Some)
                .map_err(|detail| StorageError::IncompatibleFormat {
                    path: dir.to_path_buf(),
                    detail,
                })
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(io_error(&marker, source)),
    }
}

/// Checks that the marker names `backend`; returns its format version.
fn check_marker(dir: &Path, text: &str, backend: BackendKind) -> StorageResult<u32> {
    let (version, written_by) = read_marker(dir, text)?;
    if written_by != backend.name() {
        return Err(StorageError::IncompatibleFormat {
            path: dir.to_path_buf(),
            detail: format!(
                "written by the {written_by} backend, opened as {}",
                backend.name()
            ),
        });
    }
    Ok(version)
}

/// Checks a marker's header and format version (this build's or one it upgrades); returns
/// the version and the backend it names.
fn read_marker(dir: &Path, text: &str) -> StorageResult<(u32, String)> {
    let incompatible = |detail: String| StorageError::IncompatibleFormat {
        path: dir.to_path_buf(),
        detail,
    };
    let mut lines = text.lines();
    if lines.next() != Some(HEADER) {
        return Err(incompatible(format!(
            "{FORMAT_FILE} is not a Concord format marker"
        )));
    }
    let mut version = None;
    let mut written_by = None;
    for line in lines {
        match line.split_once('=').map(|(k, v)| (k.trim(), v.trim())) {
            Some(("format_version", value)) => version = value.parse::<u32>().ok(),
            Some(("backend", value)) => written_by = Some(value.to_string()),
            _ => {}
        }
    }
    let version = version
        .ok_or_else(|| incompatible(format!("{FORMAT_FILE} has no valid format_version")))?;
    if version != FORMAT_VERSION && !UPGRADED_VERSIONS.contains(&version) {
        return Err(incompatible(format!(
            "written in format version {version}; this build reads format version \
             {FORMAT_VERSION} (and upgrades {UPGRADED_VERSIONS:?})"
        )));
    }
    let written_by =
        written_by.ok_or_else(|| incompatible(format!("{FORMAT_FILE} names no backend")))?;
    Ok((version, written_by))
}

/// Writes the marker durably: a temporary file, synced, renamed into place, directory synced.
fn write_marker(dir: &Path, marker: &Path, backend: BackendKind) -> StorageResult<()> {
    let text = format!(
        "{HEADER}\nformat_version = {FORMAT_VERSION}\nbackend = {}\n",
        backend.name()
    );
    let temporary = temporary_marker(dir);
    let mut file = fs::File::create(&temporary).map_err(|source| io_error(&temporary, source))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|source| io_error(&temporary, source))?;
    fs::rename(&temporary, marker).map_err(|source| io_error(marker, source))?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| io_error(dir, source))
}

/// Creates `dir` and whichever of its ancestors are missing, and syncs the parent of each one
/// created: the files synced inside a directory outlive a power cut only if its own entry does.
fn create_dir_durably(dir: &Path) -> StorageResult<()> {
    let missing: Vec<&Path> = dir
        .ancestors()
        .take_while(|path| !path.as_os_str().is_empty() && !path.exists())
        .collect();
    fs::create_dir_all(dir).map_err(|source| io_error(dir, source))?;
    for created in missing.iter().rev() {
        let parent = match created.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        fs::File::open(parent)
            .and_then(|parent| parent.sync_all())
            .map_err(|source| io_error(parent, source))?;
    }
    Ok(())
}

/// Where the marker is written before it is renamed into place.
fn temporary_marker(dir: &Path) -> PathBuf {
    dir.join(format!("{FORMAT_FILE}.tmp"))
}

fn io_error(path: &Path, source: std::io::Error) -> StorageError {
    StorageError::Io {
        path: PathBuf::from(path),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marker_with_version(dir: &Path, version: u32) {
        let text = format!("{HEADER}\nformat_version = {version}\nbackend = redb\n");
        fs::write(dir.join(FORMAT_FILE), text).unwrap();
    }

    #[test]
    fn an_older_format_this_build_reads_is_moved_to_the_current_one() {
        let dir = tempfile::tempdir().unwrap();
        marker_with_version(dir.path(), 2);
        assert_eq!(
            recorded_backend(dir.path()).unwrap(),
            Some(BackendKind::Redb)
        );
        prepare_data_dir(dir.path(), BackendKind::Redb).unwrap();
        let text = fs::read_to_string(dir.path().join(FORMAT_FILE)).unwrap();
        assert!(
            text.contains(&format!("format_version = {FORMAT_VERSION}")),
            "{text}"
        );
        // Moved only for the backend that wrote it.
        marker_with_version(dir.path(), 2);
        assert!(prepare_data_dir(dir.path(), BackendKind::Sled).is_err());
        let text = fs::read_to_string(dir.path().join(FORMAT_FILE)).unwrap();
        assert!(text.contains("format_version = 2"), "{text}");
    }

    #[test]
    fn missing_ancestors_are_created_too() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/b/data");
        prepare_data_dir(&dir, BackendKind::Redb).unwrap();
        assert_eq!(recorded_backend(&dir).unwrap(), Some(BackendKind::Redb));
        // Opening it again changes nothing.
        prepare_data_dir(&dir, BackendKind::Redb).unwrap();
    }

    #[test]
    fn a_restore_marker_alone_leaves_the_directory_new() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(RESTORE_MARKER_FILE), b"").unwrap();
        prepare_data_dir(dir.path(), BackendKind::Redb).unwrap();
        assert_eq!(
            recorded_backend(dir.path()).unwrap(),
            Some(BackendKind::Redb)
        );
        assert!(
            dir.path().join(RESTORE_MARKER_FILE).exists(),
            "left to the restore"
        );

        let other = tempfile::tempdir().unwrap();
        fs::write(other.path().join(RESTORE_MARKER_FILE), b"").unwrap();
        fs::write(other.path().join("notes.txt"), b"mine").unwrap();
        let error = prepare_data_dir(other.path(), BackendKind::Wal).unwrap_err();
        assert!(error.to_string().contains("not empty"), "{error}");
    }

    #[test]
    fn a_first_marker_write_cut_short_leaves_a_directory_that_opens() {
        let dir = tempfile::tempdir().unwrap();
        // What a crash between creating the temporary marker and its rename leaves.
        fs::write(dir.path().join(format!("{FORMAT_FILE}.tmp")), b"concord da").unwrap();
        prepare_data_dir(dir.path(), BackendKind::Wal).unwrap();
        assert_eq!(
            recorded_backend(dir.path()).unwrap(),
            Some(BackendKind::Wal)
        );
        assert!(!dir.path().join(format!("{FORMAT_FILE}.tmp")).exists());

        // Anything else beside it is still not ours to write into.
        let other = tempfile::tempdir().unwrap();
        fs::write(other.path().join(format!("{FORMAT_FILE}.tmp")), b"").unwrap();
        fs::write(other.path().join("notes.txt"), b"mine").unwrap();
        let error = prepare_data_dir(other.path(), BackendKind::Wal).unwrap_err();
        assert!(error.to_string().contains("not empty"), "{error}");
    }

    #[test]
    fn a_format_this_build_does_not_read_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        marker_with_version(dir.path(), 1);
        let error = prepare_data_dir(dir.path(), BackendKind::Redb).unwrap_err();
        assert!(error.to_string().contains("format version 1"), "{error}");
        let text = fs::read_to_string(dir.path().join(FORMAT_FILE)).unwrap();
        assert!(text.contains("format_version = 1"), "{text}");
    }
}
