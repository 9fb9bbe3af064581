//! Opening a data directory from what the disk holds, not from what the page cache remembers.
//!
//! When the kernel fails to write a cached page back to the disk, it reports the error once
//! (to an `fdatasync`, which stops the node) and, on Linux, keeps the page in its cache marked
//! clean. Until the cache lets it go (a reboot, memory pressure), every read of that part of the
//! file — by this process or the next one — returns bytes the disk does not hold. A node started
//! again on the same kernel would take them for durable: replay log records and read state pages
//! that a later reboot turns into a hole, and build durable writes on top of them (a redb file
//! whose every root then reads as corrupted, a log that ends at the hole). So before the stores
//! read anything, every file of the directory is synced (a disk that still fails refuses the
//! open) and its cached pages are dropped: the stores then read from the disk.

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::{StorageError, StorageResult};

/// Directory levels below the data directory walked at most (deeper ones are left alone): the
/// stores nest a level or two, and the walk stays bounded whatever else is put there.
const MAX_DEPTH: usize = 8;

/// Syncs every regular file under `dir` and asks the kernel to drop its cached pages, so that
/// what is read next comes from the disk. Symbolic links are not followed. Returns how many
/// files it went through.
pub(crate) fn forget_cached_pages(dir: &Path) -> StorageResult<usize> {
    let mut files = 0;
    let mut pending: Vec<(PathBuf, usize)> = vec![(dir.to_path_buf(), 0)];
    while let Some((dir, depth)) = pending.pop() {
        let listing = std::fs::read_dir(&dir).map_err(io_error(&dir))?;
        for item in listing {
            let item = item.map_err(io_error(&dir))?;
            let path = item.path();
            let kind = item.file_type().map_err(io_error(&path))?;
            if kind.is_dir() && depth < MAX_DEPTH {
                pending.push((path, depth + 1));
            } else if kind.is_file() {
                forget_file(&path)?;
                files += 1;
            }
        }
    }
    Ok(files)
}

fn forget_file(path: &Path) -> StorageResult<()> {
    let file = File::open(path).map_err(io_error(path))?;
    // Dirty pages (written by a process that died before its sync) are not dropped: write
    // them first. If that fails the disk still fails, and the open must too.
    file.sync_all().map_err(io_error(path))?;
    drop_cached_pages(&file).map_err(io_error(path))
}

#[cfg(target_os = "linux")]
fn drop_cached_pages(file: &File) -> std::io::Result<()> {
    rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::DontNeed).map_err(std::io::Error::from)
}

/// Elsewhere no portable call drops a file's cached pages: the sync before it is all there is.
#[cfg(not(target_os = "linux"))]
fn drop_cached_pages(_file: &File) -> std::io::Result<()> {
    Ok(())
}

fn io_error(path: &Path) -> impl Fn(std::io::Error) -> StorageError + '_ {
    move |source| StorageError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn every_file_below_the_directory_is_gone_through_and_links_are_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("elsewhere"), b"not ours").unwrap();
        std::fs::create_dir_all(dir.path().join("log.wal")).unwrap();
        let mut segment = File::create(dir.path().join("log.wal/0.wal")).unwrap();
        segment.write_all(&[7; 8192]).unwrap();
        std::fs::write(dir.path().join("state.redb"), b"state").unwrap();
        std::fs::write(dir.path().join("CONCORD_FORMAT"), b"marker").unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();

        assert_eq!(forget_cached_pages(dir.path()).unwrap(), 3);
        // What the files hold is unchanged.
        assert_eq!(
            std::fs::read(dir.path().join("log.wal/0.wal")).unwrap(),
            [7; 8192]
        );
    }

    #[test]
    fn a_directory_that_cannot_be_read_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        match forget_cached_pages(&missing) {
            Err(StorageError::Io { path, .. }) => assert_eq!(path, missing),
            other => panic!("expected an I/O error, got {other:?}"),
        }
    }
}
