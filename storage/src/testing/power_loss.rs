//! A disk that loses power: a redb storage backend in memory that keeps what the last sync made
//! durable apart from what was written since, and can fail every write from a chosen one on
//! (the power went out). The image a reboot finds is what was durable plus any subset of the
//! later writes, in any order, the last of them possibly torn at a sector boundary: what a
//! disk with a volatile cache may leave.

use std::fmt;
use std::sync::{Arc, Mutex};

use redb::StorageBackend;

/// Bytes a disk writes atomically: a torn write stops at one of these boundaries.
const SECTOR_BYTES: usize = 512;

/// One write a disk was asked for.
#[derive(Clone, Debug)]
pub(super) enum Change {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Default)]
struct Disk {
    /// What the last sync made durable.
    durable: Vec<u8>,
    /// What was asked since, in order.
    pending: Vec<Change>,
    /// What a reader sees now: `durable` with `pending` applied.
    current: Vec<u8>,
    /// Writes (and syncs) left before the power goes out; `None` never.
    writes_left: Option<u64>,
}

pub(super) fn apply(image: &mut Vec<u8>, change: &Change) {
    match change {
        Change::Write { offset, data } => {
            let start = *offset as usize;
            if image.len() < start + data.len() {
                image.resize(start + data.len(), 0);
            }
            image[start..start + data.len()].copy_from_slice(data);
        }
        Change::SetLen(len) => image.resize(*len as usize, 0),
    }
}

/// `change` as a power cut may leave it: a write cut to its first `sectors` sectors.
pub(super) fn torn(change: &Change, sectors: usize) -> Change {
    match change {
        Change::Write { offset, data } => Change::Write {
            offset: *offset,
            data: data[..(sectors * SECTOR_BYTES).min(data.len())].to_vec(),
        },
        Change::SetLen(_) => change.clone(),
    }
}

/// A simulated disk; clones share it.
#[derive(Clone, Default)]
pub struct PowerLossDisk {
    disk: Arc<Mutex<Disk>>,
}

impl fmt::Debug for PowerLossDisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PowerLossDisk")
    }
}

impl PowerLossDisk {
    /// An empty disk.
    pub fn new() -> PowerLossDisk {
        PowerLossDisk::default()
    }

    /// The power goes out after `writes` more writes or syncs: from then on each fails.
    pub fn cut_power_after(&self, writes: u64) {
        self.disk.lock().unwrap().writes_left = Some(writes);
    }

    /// The disk a reboot finds: what was durable, plus the writes since that `keep` picks
    /// (called with each write's position among them), the last one kept cut to
    /// `torn_sectors` sectors when that is `Some`.
    pub fn after_reboot(
        &self,
        mut keep: impl FnMut(usize) -> bool,
        torn_sectors: Option<usize>,
    ) -> PowerLossDisk {
        let disk = self.disk.lock().unwrap();
        let mut image = disk.durable.clone();
        let kept: Vec<&Change> = disk
            .pending
            .iter()
            .enumerate()
            .filter(|(position, _)| keep(*position))
            .map(|(_, change)| change)
            .collect();
        for (i, change) in kept.iter().enumerate() {
            match torn_sectors.filter(|_| i + 1 == kept.len()) {
                Some(sectors) => apply(&mut image, &torn(change, sectors)),
                None => apply(&mut image, change),
            }
        }
        PowerLossDisk {
            disk: Arc::new(Mutex::new(Disk {
                durable: image.clone(),
                pending: Vec::new(),
                current: image,
                writes_left: None,
            })),
        }
    }

    /// Writes made since the last sync.
    pub fn pending_writes(&self) -> usize {
        self.disk.lock().unwrap().pending.len()
    }

    fn out_of_power(disk: &mut Disk) -> Result<(), std::io::Error> {
        match &mut disk.writes_left {
            Some(0) => Err(std::io::Error::other("the power is out")),
            Some(left) => {
                *left -= 1;
                Ok(())
            }
            None => Ok(()),
        }
    }
}

impl StorageBackend for PowerLossDisk {
    fn len(&self) -> Result<u64, std::io::Error> {
        Ok(self.disk.lock().unwrap().current.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        let disk = self.disk.lock().unwrap();
        let start = offset as usize;
        let bytes = disk
            .current
            .get(start..start + out.len())
            .ok_or_else(|| std::io::Error::other("a read past the end of the disk"))?;
        out.copy_from_slice(bytes);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        let mut disk = self.disk.lock().unwrap();
        Self::out_of_power(&mut disk)?;
        let change = Change::SetLen(len);
        apply(&mut disk.current, &change);
        disk.pending.push(change);
        Ok(())
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        let mut disk = self.disk.lock().unwrap();
        Self::out_of_power(&mut disk)?;
        disk.durable = disk.current.clone();
        disk.pending.clear();
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        let mut disk = self.disk.lock().unwrap();
        Self::out_of_power(&mut disk)?;
        let change = Change::Write {
            offset,
            data: data.to_vec(),
        };
        apply(&mut disk.current, &change);
        disk.pending.push(change);
        Ok(())
    }
}
