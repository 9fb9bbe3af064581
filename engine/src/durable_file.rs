//! Small files the engine keeps beside the stores, replaced whole so that a crash leaves the
//! old contents or the new, never a mix, and marker files whose presence is what counts; each
//! change is synced with its directory, so that it survives a power loss.

use std::fs;
use std::io::Write;
use std::path::Path;

/// Writes `contents` to `path` through a temporary file beside it, synced, then renamed over
/// `path`, then the directory synced (so the rename itself survives a power loss).
pub(crate) fn replace(path: &Path, contents: &str) -> std::io::Result<()> {
    let temporary = path.with_extension("tmp");
    let mut file = fs::File::create(&temporary)?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()?;
    fs::rename(&temporary, path)?;
    sync_parent(path)
}

/// Creates `path` empty (a marker), synced with its directory.
pub(crate) fn create_marker(path: &Path) -> std::io::Result<()> {
    fs::File::create(path)?.sync_all()?;
    sync_parent(path)
}

/// Removes `path`, synced with its directory.
pub(crate) fn remove(path: &Path) -> std::io::Result<()> {
    fs::remove_file(path)?;
    sync_parent(path)
}

fn sync_parent(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(dir) => fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}
