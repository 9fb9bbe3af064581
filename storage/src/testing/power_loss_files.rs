//! Files on a disk that loses power, for the WAL: a directory tree in memory that keeps, for
//! each file, what its last sync made durable apart from what was written since, and for the
//! directory, which files its last sync made durable. From a chosen operation on, every write,
//! sync, creation, removal and rename fails (the power went out). A reboot finds the durable
//! files with their durable bytes plus any subset of the later writes, in order, the last of
//! them possibly torn at a sector boundary; a file created, removed or renamed since the last
//! directory sync may be gone or back. A process that dies while the machine runs on loses
//! nothing written.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::power_loss::{Change, apply, torn};
use crate::wal_backend::{WalDisk, WalFile};
use crate::{StorageResult, SyncMode, WalLogStore, WalOptions};

#[derive(Default)]
struct Inode {
    /// What the file's last sync made durable.
    durable: Vec<u8>,
    /// What a reader sees now.
    current: Vec<u8>,
}

#[derive(Default)]
struct Files {
    /// The directory entries now.
    names: BTreeMap<PathBuf, u64>,
    /// The directory entries the last directory sync made durable.
    durable_names: BTreeMap<PathBuf, u64>,
    inodes: BTreeMap<u64, Inode>,
    next_inode: u64,
    /// Writes not yet made durable by their file's sync, in the order they were made.
    pending: Vec<(u64, Change)>,
    /// Operations left before the power goes out; `None` never.
    operations_left: Option<u64>,
}

impl Files {
    fn spend_operation(&mut self) -> io::Result<()> {
        match &mut self.operations_left {
            Some(0) => Err(io::Error::other("the power is out")),
            Some(left) => {
                *left -= 1;
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn change(&mut self, inode: u64, change: Change) -> io::Result<()> {
        self.spend_operation()?;
        let file = self.inodes.get_mut(&inode).expect("an open file's inode");
        apply(&mut file.current, &change);
        self.pending.push((inode, change));
        Ok(())
    }

    fn sync(&mut self, inode: u64) -> io::Result<()> {
        self.spend_operation()?;
        let file = self.inodes.get_mut(&inode).expect("an open file's inode");
        file.durable = file.current.clone();
        self.pending.retain(|(of, _)| *of != inode);
        Ok(())
    }

    fn lookup(&self, path: &Path) -> io::Result<u64> {
        self.names
            .get(path)
            .copied()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, path.display().to_string()))
    }
}

/// A simulated disk of files; clones share it.
#[derive(Clone, Default)]
pub struct PowerLossFiles {
    files: Arc<Mutex<Files>>,
}

impl fmt::Debug for PowerLossFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PowerLossFiles")
    }
}

impl PowerLossFiles {
    /// An empty disk.
    pub fn new() -> PowerLossFiles {
        PowerLossFiles::default()
    }

    /// A WAL log store on this disk, in `dir`.
    pub fn open_wal(
        &self,
        dir: &Path,
        sync_mode: SyncMode,
        options: WalOptions,
    ) -> StorageResult<WalLogStore> {
        WalLogStore::open_on_disk(Arc::new(self.clone()), dir, sync_mode, options)
    }

    /// The power goes out after `operations` more writes, syncs, creations or removals: from
    /// then on each fails.
    pub fn cut_power_after(&self, operations: u64) {
        self.files.lock().unwrap().operations_left = Some(operations);
    }

    /// The process died (at the operation the power cut named) and the machine did not: the
    /// page cache keeps every write, durable or not yet, and operations go through again.
    pub fn restart_process(&self) {
        self.files.lock().unwrap().operations_left = None;
    }

    /// Writes made since their file's last sync.
    pub fn pending_writes(&self) -> usize {
        self.files.lock().unwrap().pending.len()
    }

    /// The disk a reboot finds: the files the last directory sync made durable, each with its
    /// durable bytes plus the writes since that `keep` picks (called with each write's
    /// position among all of them), the last one kept cut to `torn_sectors` sectors when that
    /// is `Some`.
    pub fn after_reboot(
        &self,
        mut keep: impl FnMut(usize) -> bool,
        torn_sectors: Option<usize>,
    ) -> PowerLossFiles {
        let files = self.files.lock().unwrap();
        let mut images: BTreeMap<u64, Vec<u8>> = files
            .inodes
            .iter()
            .map(|(&inode, file)| (inode, file.durable.clone()))
            .collect();
        let kept: Vec<&(u64, Change)> = files
            .pending
            .iter()
            .enumerate()
            .filter(|(position, _)| keep(*position))
            .map(|(_, write)| write)
            .collect();
        for (i, (inode, change)) in kept.iter().enumerate() {
            let image = images.get_mut(inode).expect("a written file's inode");
            match torn_sectors.filter(|_| i + 1 == kept.len()) {
                Some(sectors) => apply(image, &torn(change, sectors)),
                None => apply(image, change),
            }
        }
        let inodes = images
            .into_iter()
            .map(|(inode, image)| {
                let file = Inode {
                    durable: image.clone(),
                    current: image,
                };
                (inode, file)
            })
            .collect();
        PowerLossFiles {
            files: Arc::new(Mutex::new(Files {
                names: files.durable_names.clone(),
                durable_names: files.durable_names.clone(),
                inodes,
                next_inode: files.next_inode,
                pending: Vec::new(),
                operations_left: None,
            })),
        }
    }
}

impl WalDisk for PowerLossFiles {
    fn create_dir_all(&self, _dir: &Path) -> io::Result<()> {
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let files = self.files.lock().unwrap();
        Ok(files
            .names
            .keys()
            .filter(|path| path.parent() == Some(dir))
            .cloned()
            .collect())
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let files = self.files.lock().unwrap();
        let inode = files.lookup(path)?;
        Ok(files.inodes[&inode].current.clone())
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn WalFile>> {
        let inode = self.files.lock().unwrap().lookup(path)?;
        Ok(Box::new(SimulatedFile {
            files: self.files.clone(),
            inode,
        }))
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn WalFile>> {
        let mut files = self.files.lock().unwrap();
        if files.names.contains_key(path) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                path.display().to_string(),
            ));
        }
        files.spend_operation()?;
        let inode = files.next_inode;
        files.next_inode += 1;
        files.inodes.insert(inode, Inode::default());
        files.names.insert(path.to_path_buf(), inode);
        Ok(Box::new(SimulatedFile {
            files: self.files.clone(),
            inode,
        }))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut files = self.files.lock().unwrap();
        files.lookup(path)?;
        files.spend_operation()?;
        files.names.remove(path);
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut files = self.files.lock().unwrap();
        let inode = files.lookup(from)?;
        files.spend_operation()?;
        files.names.remove(from);
        files.names.insert(to.to_path_buf(), inode);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut files = self.files.lock().unwrap();
        files.spend_operation()?;
        let in_dir = |path: &PathBuf| path.parent() == Some(dir);
        let mut durable: BTreeMap<PathBuf, u64> = files
            .durable_names
            .iter()
            .filter(|(path, _)| !in_dir(path))
            .map(|(path, &inode)| (path.clone(), inode))
            .collect();
        durable.extend(
            files
                .names
                .iter()
                .filter(|(path, _)| in_dir(path))
                .map(|(path, &inode)| (path.clone(), inode)),
        );
        files.durable_names = durable;
        Ok(())
    }
}

/// An open file of a [`PowerLossFiles`].
struct SimulatedFile {
    files: Arc<Mutex<Files>>,
    inode: u64,
}

impl WalFile for SimulatedFile {
    fn len(&self) -> io::Result<u64> {
        let files = self.files.lock().unwrap();
        Ok(files.inodes[&self.inode].current.len() as u64)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut files = self.files.lock().unwrap();
        files.change(self.inode, Change::SetLen(len))
    }

    fn write_all_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let mut files = self.files.lock().unwrap();
        let write = Change::Write {
            offset,
            data: data.to_vec(),
        };
        files.change(self.inode, write)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.files.lock().unwrap().sync(self.inode)
    }

    fn sync_all(&self) -> io::Result<()> {
        self.files.lock().unwrap().sync(self.inode)
    }
}
