//! A backup of a node's state, taken while it serves, and a new data directory made from one.
//!
//! A backup holds every group's state machine data at the index the group had applied on the
//! node when its turn came, and the group layout the keys route by; not the raft log, the
//! membership or the node's identity. Restored, it makes the data directory of a node that
//! starts alone from that state; members are added to it as to any running node, and take
//! the state through snapshots.
//!
//! Layout (integers little-endian):
//!
//! ```text
//! magic "CNCDBKUP" | version u32 | layout_len u32 | layout (the group layout record's text)
//!     | groups u64
//! per group, from 0 up:  group u64 | the group's snapshot stream (snapshot_stream.rs)
//! trailer:  magic "CNCDBEND" | groups u64 | crc32 u32 (of every byte before the trailer)
//! ```
//!
//! A backup file may have been cut short, damaged on disk or made by something else: the reader
//! bounds every length before allocating, checks each group's stream as the stream's reader
//! does, and checks the trailer's count and checksum; a restore that meets any of that leaves
//! no data directory behind.
//!
//! A restore that is killed leaves no cleanup behind it, and a node must not serve the groups
//! it had restored so far as if they were all: the restore writes [`RESTORE_MARKER_FILE`] into
//! the directory before anything else and removes it last, an engine refuses to open a
//! directory holding it, and a restore into such a directory starts it over.

use std::fs;
use std::io::{Read, Write};
use std::path::Path;

use concord_storage::{
    BackendKind, GroupId, RESTORE_MARKER_FILE, SnapshotReader, StateStore, StorageResult,
    StoreConfig, Stores, write_snapshot,
};

use crate::EngineError;
use crate::durable_file;
use crate::group_layout::{self, GROUP_LAYOUT_FILE, GroupLayout};

const MAGIC: &[u8; 8] = b"CNCDBKUP";
const END_MAGIC: &[u8; 8] = b"CNCDBEND";
const BACKUP_VERSION: u32 = 1;
/// The layout record names each plugin once: far below this.
const MAX_LAYOUT_BYTES: usize = 64 * 1024;

/// What a backup holds, as written or as read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupSummary {
    /// Groups in the backup: the main state machine's, then each served plugin's.
    pub groups: u64,
    /// The main state machine's groups among them (the count keys route by).
    pub main_groups: u32,
    /// Each served plugin's name and group count, in order.
    pub plugins: Vec<(String, u32)>,
    /// Key-value records over all groups.
    pub records: u64,
    /// Bytes of the backup, trailer included.
    pub bytes: u64,
}

/// Writes the backup of every group in `layout` from `state`, each group from one consistent
/// view of it.
pub(crate) fn write_backup(
    state: &dyn StateStore,
    layout: &GroupLayout,
    out: &mut dyn Write,
) -> Result<BackupSummary, EngineError> {
    let mut out = ChecksummedWriter {
        out,
        crc: crc32fast::Hasher::new(),
        bytes: 0,
    };
    let text = layout.text();
    let groups = layout.total_groups();
    out.put(MAGIC)?;
    out.put(&BACKUP_VERSION.to_le_bytes())?;
    out.put(&(text.len() as u32).to_le_bytes())?;
    out.put(text.as_bytes())?;
    out.put(&groups.to_le_bytes())?;
    let mut records = 0;
    for group in 0..groups {
        out.put(&group.to_le_bytes())?;
        let written = write_snapshot(state.snapshot(group)?, &mut out)?;
        records += written.records;
    }
    let crc = out.crc.clone().finalize();
    out.put(END_MAGIC)?;
    out.put(&groups.to_le_bytes())?;
    out.put(&crc.to_le_bytes())?;
    out.out
        .flush()
        .map_err(|error| bad(format!("writing: {error}")))?;
    Ok(BackupSummary {
        groups,
        main_groups: layout.groups,
        plugins: layout.plugins.clone(),
        records,
        bytes: out.bytes,
    })
}

/// Reads a backup from `input` and checks it whole (every group's stream, the count, the
/// checksum) without storing anything: what a backup just written, or about to be restored,
/// is worth.
///
/// ```
/// let error = concord_engine::verify_backup(&mut &b"not a backup"[..]).unwrap_err();
/// assert!(error.to_string().contains("not a concord backup"), "{error}");
/// ```
pub fn verify_backup(input: &mut dyn Read) -> Result<BackupSummary, EngineError> {
    read_backup(input, &mut |_, reader| {
        for record in reader {
            record?;
        }
        Ok(())
    })
}

/// Makes a new data directory at `data_dir` for `backend` from the backup in `input`: every
/// group's state as the backup holds it and the backup's group layout, and no raft log. A node
/// served from it starts alone from that state (its logs start after each group's restored
/// index), with the group count and plugins the summary names.
///
/// `data_dir` must not exist or be empty, or hold a restore that did not finish (the process
/// was killed): that one is emptied and started over. If the backup turns out damaged, or
/// anything fails, the directory is removed again (emptied, if it existed) and the error says
/// why. Until the restore has finished, [`crate::Engine::open`] refuses the directory.
///
/// ```no_run
/// use concord_engine::{BackendKind, restore_backup};
///
/// let mut backup = std::fs::File::open("sessions.backup")?;
/// let summary = restore_backup(&mut backup, "restored".as_ref(), BackendKind::Wal)?;
/// println!("{} groups, {} records", summary.groups, summary.records);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn restore_backup(
    input: &mut dyn Read,
    data_dir: &Path,
    backend: BackendKind,
) -> Result<BackupSummary, EngineError> {
    if !backend.is_persistent() {
        return Err(bad(format!(
            "a restore makes a data directory; the {backend} backend keeps nothing on disk"
        )));
    }
    let existed = match fs::read_dir(data_dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                if !data_dir.join(RESTORE_MARKER_FILE).exists() {
                    return Err(bad(format!(
                        "{} is not empty: a restore makes a new data directory, it does not \
                         replace one",
                        data_dir.display()
                    )));
                }
                tracing::warn!(
                    data_dir = %data_dir.display(),
                    "a restore into this directory did not finish; starting it over"
                );
                empty_dir(data_dir)
                    .map_err(|error| bad(format!("{}: {error}", data_dir.display())))?;
            }
            true
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => false,
        Err(error) => return Err(bad(format!("{}: {error}", data_dir.display()))),
    };
    let restored = restore_into(input, data_dir, backend);
    if restored.is_err() {
        let _ = if existed {
            empty_dir(data_dir)
        } else {
            fs::remove_dir_all(data_dir)
        };
    }
    restored
}

fn restore_into(
    input: &mut dyn Read,
    data_dir: &Path,
    backend: BackendKind,
) -> Result<BackupSummary, EngineError> {
    let in_dir = |error: std::io::Error| bad(format!("{}: {error}", data_dir.display()));
    fs::create_dir_all(data_dir).map_err(in_dir)?;
    let marker = data_dir.join(RESTORE_MARKER_FILE);
    durable_file::create_marker(&marker).map_err(in_dir)?;
    let stores = Stores::open(&StoreConfig::new(backend, data_dir))?;
    let summary = read_backup(input, &mut |group, reader| {
        let applied_index = reader.applied_index();
        stores.state.restore(group, applied_index, reader)
    })?;
    stores.state.flush()?;
    drop(stores);
    let layout = GroupLayout {
        groups: summary.main_groups,
        plugins: summary.plugins.clone(),
    };
    group_layout::write(&data_dir.join(GROUP_LAYOUT_FILE), &layout)
        .map_err(|error| bad(format!("recording the group layout: {error}")))?;
    durable_file::remove(&marker).map_err(in_dir)?;
    Ok(summary)
}

/// Refuses a data directory that a restore did not finish: it holds some groups' state and not
/// others', and a node served from it would answer for data it does not have.
pub(crate) fn refuse_unfinished_restore(data_dir: &Path) -> Result<(), EngineError> {
    if data_dir.join(RESTORE_MARKER_FILE).exists() {
        return Err(bad(format!(
            "a restore into {} did not finish (it holds {RESTORE_MARKER_FILE}): run the \
             restore again, which starts it over",
            data_dir.display()
        )));
    }
    Ok(())
}

fn empty_dir(dir: &Path) -> std::io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            fs::remove_dir_all(path)?;
        } else {
            fs::remove_file(path)?;
        }
    }
    Ok(())
}

/// Reads a backup, handing each group's checked stream to `take_group` (which must read it
/// to its end), then checks the trailer.
fn read_backup(
    input: &mut dyn Read,
    take_group: &mut dyn FnMut(GroupId, &mut SnapshotReader<'_>) -> StorageResult<()>,
) -> Result<BackupSummary, EngineError> {
    let mut input = ChecksummedReader {
        input,
        crc: crc32fast::Hasher::new(),
        bytes: 0,
    };
    let mut magic = [0u8; 8];
    input.read_part(&mut magic, "magic")?;
    if &magic != MAGIC {
        return Err(bad("not a concord backup (bad magic)"));
    }
    let version = input.read_u32("version")?;
    if version != BACKUP_VERSION {
        return Err(bad(format!(
            "backup version {version} is not supported (this build reads {BACKUP_VERSION})"
        )));
    }
    let layout_len = input.read_u32("layout length")? as usize;
    if layout_len > MAX_LAYOUT_BYTES {
        return Err(bad(format!(
            "a group layout of {layout_len} bytes (at most {MAX_LAYOUT_BYTES})"
        )));
    }
    let mut text = vec![0u8; layout_len];
    input.read_part(&mut text, "group layout")?;
    let layout = std::str::from_utf8(&text)
        .ok()
        .and_then(group_layout::parse)
        .ok_or_else(|| bad("its group layout is damaged"))?;
    let groups = input.read_u64("group count")?;
    if groups != layout.total_groups() {
        return Err(bad(format!(
            "it counts {groups} groups, its layout {}",
            layout.total_groups()
        )));
    }
    let mut records = 0;
    for expected in 0..groups {
        let group = input.read_u64("group id")?;
        if group != expected {
            return Err(bad(format!("group {group} where group {expected} belongs")));
        }
        let mut reader = SnapshotReader::within(&mut input)
            .map_err(|error| bad(format!("group {group}: {error}")))?;
        take_group(group, &mut reader).map_err(|error| bad(format!("group {group}: {error}")))?;
        if reader.next().is_some() {
            return Err(bad(format!("group {group}: not read to its end")));
        }
        records += reader.records_read();
    }
    let crc = input.crc.clone().finalize();
    input.read_part(&mut magic, "trailer")?;
    if &magic != END_MAGIC {
        return Err(bad("no trailer after the last group"));
    }
    let counted = input.read_u64("trailer's group count")?;
    let recorded_crc = input.read_u32("trailer's checksum")?;
    if counted != groups || recorded_crc != crc {
        return Err(bad("the trailer does not match what came before it"));
    }
    let mut extra = [0u8; 1];
    match input.input.read(&mut extra) {
        Ok(0) => {}
        Ok(_) => return Err(bad("bytes follow the trailer")),
        Err(error) => return Err(bad(format!("reading: {error}"))),
    }
    Ok(BackupSummary {
        groups,
        main_groups: layout.groups,
        plugins: layout.plugins,
        records,
        bytes: input.bytes,
    })
}

fn bad(problem: impl Into<String>) -> EngineError {
    EngineError::Backup(problem.into())
}

/// Counts and checksums what passes to `out`.
struct ChecksummedWriter<'w> {
    out: &'w mut dyn Write,
    crc: crc32fast::Hasher,
    bytes: u64,
}

impl ChecksummedWriter<'_> {
    fn put(&mut self, bytes: &[u8]) -> Result<(), EngineError> {
        self.write_all(bytes)
            .map_err(|error| bad(format!("writing: {error}")))
    }
}

impl Write for ChecksummedWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let written = self.out.write(buf)?;
        self.crc.update(&buf[..written]);
        self.bytes += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// Counts and checksums what is read from `input`.
struct ChecksummedReader<'r> {
    input: &'r mut dyn Read,
    crc: crc32fast::Hasher,
    bytes: u64,
}

impl ChecksummedReader<'_> {
    fn read_part(&mut self, buf: &mut [u8], what: &str) -> Result<(), EngineError> {
        self.read_exact(buf).map_err(|error| {
            if error.kind() == std::io::ErrorKind::UnexpectedEof {
                bad(format!("it ends inside the {what} (cut short?)"))
            } else {
                bad(format!("reading the {what}: {error}"))
            }
        })
    }

    fn read_u32(&mut self, what: &str) -> Result<u32, EngineError> {
        let mut buf = [0u8; 4];
        self.read_part(&mut buf, what)?;
        Ok(u32::from_le_bytes(buf))
    }

    fn read_u64(&mut self, what: &str) -> Result<u64, EngineError> {
        let mut buf = [0u8; 8];
        self.read_part(&mut buf, what)?;
        Ok(u64::from_le_bytes(buf))
    }
}

impl Read for ChecksummedReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let read = self.input.read(buf)?;
        self.crc.update(&buf[..read]);
        self.bytes += read as u64;
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use concord_storage::{KeyValue, MemStateStore, WriteSet};

    use super::*;

    /// Three groups (two main, one plugin's): group 0 with 50 records, group 1 empty, group 2
    /// with one.
    fn backup_of_three_groups() -> (Vec<u8>, BackupSummary) {
        let state = MemStateStore::new();
        let mut writes = WriteSet::new();
        for i in 0..50u32 {
            writes
                .put(format!("key-{i:03}").as_bytes(), &[i as u8; 40])
                .unwrap();
        }
        state.commit(0, writes, 77).unwrap();
        let mut writes = WriteSet::new();
        writes.put(b"counter", b"9").unwrap();
        state.commit(2, writes, 5).unwrap();
        let layout = GroupLayout {
            groups: 2,
            plugins: vec![("counter".into(), 1)],
        };
        let mut backup = Vec::new();
        let summary = write_backup(&state, &layout, &mut backup).unwrap();
        (backup, summary)
    }

    fn snapshot_pairs(state: &dyn StateStore, group: GroupId) -> (u64, Vec<KeyValue>) {
        let snapshot = state.snapshot(group).unwrap();
        let pairs = snapshot.records.map(Result::unwrap).collect();
        (snapshot.applied_index, pairs)
    }

    #[test]
    fn a_restore_holds_what_the_backup_was_taken_from() {
        let (backup, written) = backup_of_three_groups();
        assert_eq!(written.groups, 3);
        assert_eq!(written.records, 51);
        assert_eq!(written.bytes, backup.len() as u64);
        assert_eq!(verify_backup(&mut &backup[..]).unwrap(), written);

        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().join("restored");
        let read = restore_backup(&mut &backup[..], &data_dir, BackendKind::Redb).unwrap();
        assert_eq!(read, written);
        let layout = fs::read_to_string(data_dir.join(GROUP_LAYOUT_FILE)).unwrap();
        assert_eq!(layout, "groups = 2\nplugin counter = 1\n");
        let stores = Stores::open(&StoreConfig::new(BackendKind::Redb, &data_dir)).unwrap();
        let (applied, pairs) = snapshot_pairs(stores.state.as_ref(), 0);
        assert_eq!(applied, 77);
        assert_eq!(pairs.len(), 50);
        assert_eq!(pairs[7], (b"key-007".to_vec(), vec![7u8; 40]));
        assert_eq!(snapshot_pairs(stores.state.as_ref(), 1), (0, vec![]));
        assert_eq!(
            snapshot_pairs(stores.state.as_ref(), 2),
            (5, vec![(b"counter".to_vec(), b"9".to_vec())])
        );
    }

    #[test]
    fn a_damaged_or_cut_backup_is_named_and_leaves_no_directory() {
        let (backup, _) = backup_of_three_groups();
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().join("restored");
        let mut damaged_copies: Vec<(String, Vec<u8>)> = Vec::new();
        for cut in [0, 5, 12, 30, backup.len() / 2, backup.len() - 1] {
            damaged_copies.push((format!("cut at {cut}"), backup[..cut].to_vec()));
        }
        for at in (0..backup.len()).step_by(97).chain([backup.len() - 3]) {
            let mut flipped = backup.clone();
            flipped[at] ^= 0x20;
            damaged_copies.push((format!("byte {at} flipped"), flipped));
        }
        let mut longer = backup.clone();
        longer.push(0);
        damaged_copies.push(("a byte added".into(), longer));
        for (what, damaged) in damaged_copies {
            let error = verify_backup(&mut &damaged[..]).unwrap_err();
            assert!(matches!(error, EngineError::Backup(_)), "{what}: {error}");
            let error =
                restore_backup(&mut &damaged[..], &data_dir, BackendKind::Redb).unwrap_err();
            assert!(matches!(error, EngineError::Backup(_)), "{what}: {error}");
            assert!(!data_dir.exists(), "{what}: the directory stayed");
        }
        // An empty directory given: emptied again, not removed.
        fs::create_dir(&data_dir).unwrap();
        let cut = &backup[..backup.len() - 1];
        restore_backup(&mut &cut[..], &data_dir, BackendKind::Wal).unwrap_err();
        assert_eq!(fs::read_dir(&data_dir).unwrap().count(), 0);
    }

    /// Reads its bytes, then panics where a killed process would have stopped.
    struct KilledAfter<'a> {
        bytes: &'a [u8],
        left: usize,
    }

    impl Read for KilledAfter<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            assert!(self.left > 0, "killed");
            let n = buf.len().min(self.left).min(self.bytes.len());
            buf[..n].copy_from_slice(&self.bytes[..n]);
            self.bytes = &self.bytes[n..];
            self.left -= n;
            Ok(n)
        }
    }

    #[test]
    fn a_restore_killed_midway_is_refused_by_the_engine_and_started_over() {
        let (backup, written) = backup_of_three_groups();
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().join("restored");
        // Past group 0's records, before the trailer: no cleanup runs after a kill.
        let mut killed = KilledAfter {
            bytes: &backup,
            left: backup.len() * 2 / 3,
        };
        let restore = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            restore_backup(&mut killed, &data_dir, BackendKind::Wal)
        }));
        assert!(restore.is_err(), "the reader stopped the restore");
        assert!(data_dir.join(RESTORE_MARKER_FILE).exists());

        let mut config = crate::EngineConfig::new(&data_dir);
        config.groups = 2;
        let message = match crate::Engine::open(config) {
            Ok(_) => panic!("a directory a restore did not finish was opened"),
            Err(refused) => refused.to_string(),
        };
        assert!(message.contains("did not finish"), "{message}");
        assert!(
            !data_dir.join(GROUP_LAYOUT_FILE).exists(),
            "the engine wrote nothing"
        );

        // The same restore again starts over and finishes.
        let read = restore_backup(&mut &backup[..], &data_dir, BackendKind::Wal).unwrap();
        assert_eq!(read, written);
        assert!(!data_dir.join(RESTORE_MARKER_FILE).exists());
        refuse_unfinished_restore(&data_dir).unwrap();
    }

    #[test]
    fn a_restore_refuses_a_directory_with_data_and_the_memory_backend() {
        let (backup, _) = backup_of_three_groups();
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("keep-me"), b"data").unwrap();
        let error = restore_backup(&mut &backup[..], dir.path(), BackendKind::Wal)
            .unwrap_err()
            .to_string();
        assert!(error.contains("is not empty"), "{error}");
        assert_eq!(fs::read(dir.path().join("keep-me")).unwrap(), b"data");
        let error = restore_backup(
            &mut &backup[..],
            &dir.path().join("new"),
            BackendKind::Memory,
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("keeps nothing on disk"), "{error}");
    }
}
