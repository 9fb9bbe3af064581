//! Small files the engine keeps beside the stores, replaced whole so that a crash leaves the
//! old contents or the new, never a mix.

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
    if let Some(dir) = path.parent() {
        fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}
