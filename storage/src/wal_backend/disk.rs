//! The file operations the WAL makes, behind a trait: the operating system's files in use, a
//! simulated disk that loses power in tests (`testing::PowerLossFiles`).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// A directory tree of files, as the WAL uses it.
pub(crate) trait WalDisk: Send + Sync + 'static {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// The paths of the entries of `dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>>;
    /// A whole file's bytes.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// An existing file, to read and write.
    fn open(&self, path: &Path) -> io::Result<Box<dyn WalFile>>;
    /// A new file (an error if `path` exists).
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn WalFile>>;
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Renames `from` to `to` (replacing nothing: `to` does not exist).
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes the entries of `dir` (files created and removed) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// One open file.
pub(crate) trait WalFile: Send {
    fn len(&self) -> io::Result<u64>;
    fn set_len(&self, len: u64) -> io::Result<()>;
    fn write_all_at(&self, data: &[u8], offset: u64) -> io::Result<()>;
    /// Makes the file's data durable (`fdatasync`).
    fn sync_data(&self) -> io::Result<()>;
    /// Makes the file's data and metadata durable (`fsync`).
    fn sync_all(&self) -> io::Result<()>;
}

/// The operating system's files.
pub(crate) struct OsDisk;

impl WalDisk for OsDisk {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        std::fs::read_dir(dir)?
            .map(|item| item.map(|item| item.path()))
            .collect()
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn WalFile>> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(Box::new(file))
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn WalFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        Ok(Box::new(file))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

impl WalFile for File {
    fn len(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }

    fn write_all_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(self, data, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        File::sync_data(self)
    }

    fn sync_all(&self) -> io::Result<()> {
        File::sync_all(self)
    }
}
