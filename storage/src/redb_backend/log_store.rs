//! [`RedbLogStore`]: raft logs in one redb file, one record per write for all groups.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use raft::prelude::Entry;
use redb::{Durability, ReadableDatabase, ReadableTable, TableDefinition};

use super::group_buckets::{GroupBuckets, MetadataUpdates, bucket_of, decode_bucket};
use super::log_record::{self, RecordWriter};
use super::record_locations::{RecordLocations, RecordSeq};
use super::{DEFAULT_CACHE_BYTES, RedbResultExt, open_database};
use crate::codec::{decode_group_state, encode_group_state_into};
use crate::live_log::{LiveLog, LogPersistence};
use crate::log_plan::{EntryMutation, LogPlan};
use crate::{
    GroupId, GroupLogState, LogBatch, LogStore, MemLogStore, StorageError, StorageResult, SyncMode,
};

/// `sequence -> record`: the entries one write appended, for all its groups (`log_record.rs`).
const RECORDS: TableDefinition<u64, &[u8]> = TableDefinition::new("log_records");
/// `bucket -> encoded GroupLogState of each of its groups`: which indexes of the records are
/// live (`group_buckets.rs`).
const GROUP_BUCKETS: TableDefinition<u64, &[u8]> = TableDefinition::new("log_group_buckets");
/// `group -> encoded GroupLogState`: where files written before the buckets keep the groups'
/// metadata. Opening moves it into the buckets.
const LEGACY_GROUPS: TableDefinition<u64, &[u8]> = TableDefinition::new("log_groups");

/// Old records relocated at most per write, so that a write's cost stays bounded.
const RELOCATIONS_PER_WRITE: usize = 2;

/// A [`LogStore`] in a redb file. Each [`LogStore::write`] is one redb write transaction; under
/// [`SyncMode::Sync`] it commits with `Durability::Immediate`, which is one `fdatasync` of the
/// file (counted by [`LogStore::sync_count`]), unless the batch only moves commit indexes
/// (`Durability::None`: the next durable commit makes it durable too).
///
/// Layout: the entries a write appends, for all its groups, are **one record** under the next
/// sequence number, beside the metadata of the groups it touched, in buckets of 64 groups. A
/// write therefore changes one place of the records' B-tree whatever the number of groups
/// (keyed by `(group, index)`, each commit wrote one B-tree path per group it touched;
/// docs/BENCHMARKS.md has the figures), and one key per bucket of the metadata. The live log
/// is kept in memory (raft compacts it), so reads never go to the file. A record is deleted
/// once none of its entries is live (compacted, replaced by a conflicting append or a
/// snapshot); a group that stops writing would keep its last records, and with them other
/// groups' dead entries, so once the records kept hold more than twice the live entries, the
/// oldest records at most half live are relocated (their live entries copied into the next
/// record).
///
/// Opening reads every record, keeps for each live index its newest copy, and checks that every
/// group's log is whole (no holes); damage is [`StorageError::Corrupted`] naming the file. A
/// file written with one metadata key per group (before the buckets) has its metadata moved
/// into buckets, in one durable transaction, when it is opened.
pub type RedbLogStore = LiveLog<RedbLogFile>;

/// The redb file beneath a [`RedbLogStore`], and which of its records hold live entries.
pub struct RedbLogFile {
    db: redb::Database,
    path: PathBuf,
    sync_mode: SyncMode,
    syncs: Arc<AtomicU64>,
    /// Sequence number of the next record.
    next_record: RecordSeq,
    locations: RecordLocations,
    /// The last record's buffer, cleared and written again by the next write: a record of
    /// hundreds of KiB allocated afresh every write cost the raft thread page faults and the
    /// zeroing of fresh pages. Kept only up to `KEPT_RECORD_BUFFER_BYTES`.
    record_buffer: Vec<u8>,
    /// Every group's metadata as the file holds it: a bucket is written whole from it.
    group_buckets: GroupBuckets,
    /// The metadata a write changes, and a bucket's bytes: buffers kept between writes.
    metadata_updates: MetadataUpdates,
    bucket_buffer: Vec<u8>,
    /// Whether a commit since the last durable one was not synced (every commit under
    /// `SyncMode::NoSync`; one that only moved commit indexes under `SyncMode::Sync`).
    unsynced_commits: bool,
}

/// The largest record buffer kept from one write to the next.
const KEPT_RECORD_BUFFER_BYTES: usize = 8 * 1024 * 1024;

impl LiveLog<RedbLogFile> {
    /// Opens or creates the log file at `path`.
    pub fn open(path: &Path, sync_mode: SyncMode) -> StorageResult<RedbLogStore> {
        let syncs = Arc::new(AtomicU64::new(0));
        let db = open_database(
            path,
            DEFAULT_CACHE_BYTES,
            syncs.clone(),
            "concord_raft_log_sync_duration_seconds",
        )?;
        Self::over_database(db, path, sync_mode, syncs)
    }

    /// Opens or creates a log over a redb `backend` of the caller's (a simulated disk, for the
    /// power-loss tests); `name` names it in errors.
    #[cfg(any(test, feature = "testing"))]
    pub fn open_on_backend(
        backend: impl redb::StorageBackend,
        name: &Path,
        sync_mode: SyncMode,
    ) -> StorageResult<RedbLogStore> {
        let db = super::open_database_on(name, DEFAULT_CACHE_BYTES, backend)?;
        Self::over_database(db, name, sync_mode, Arc::new(AtomicU64::new(0)))
    }

    fn over_database(
        db: redb::Database,
        path: &Path,
        sync_mode: SyncMode,
        syncs: Arc<AtomicU64>,
    ) -> StorageResult<RedbLogStore> {
        create_tables(&db, path)?;
        let loaded = load(&db, path)?;
        let mut file = RedbLogFile {
            db,
            path: path.to_path_buf(),
            sync_mode,
            syncs,
            next_record: loaded.next_record,
            locations: loaded.locations,
            record_buffer: Vec::new(),
            group_buckets: loaded.group_buckets,
            metadata_updates: MetadataUpdates::default(),
            bucket_buffer: Vec::new(),
            unsynced_commits: false,
        };
        if !loaded.legacy_groups.is_empty() {
            file.move_legacy_metadata(&loaded.legacy_groups)?;
        }
        Ok(LiveLog::new(loaded.memory, file, sync_mode))
    }

    /// How many records hold live entries (for tests of space reclamation).
    #[cfg(any(test, feature = "testing"))]
    pub fn live_record_count(&self) -> usize {
        self.with_persistence(|file| file.locations.live_records())
    }

    /// `(entries the live records hold, live or dead; live entries)` (for tests of space
    /// reclamation).
    #[cfg(any(test, feature = "testing"))]
    pub fn record_entry_counts(&self) -> (u64, u64) {
        self.with_persistence(|file| file.locations.entry_counts())
    }
}

fn create_tables(db: &redb::Database, path: &Path) -> StorageResult<()> {
    let txn = db.begin_write().at(path)?;
    txn.open_table(RECORDS).at(path)?;
    txn.open_table(GROUP_BUCKETS).at(path)?;
    txn.commit().at(path)
}

/// What opening found in the file.
struct Loaded {
    memory: MemLogStore,
    next_record: RecordSeq,
    locations: RecordLocations,
    group_buckets: GroupBuckets,
    /// Groups whose metadata was in the table of files written before the buckets.
    legacy_groups: Vec<GroupId>,
}

/// Rebuilds the live log, the records' bookkeeping and the metadata buckets from the file.
fn load(db: &redb::Database, path: &Path) -> StorageResult<Loaded> {
    let txn = db.begin_read().at(path)?;
    let mut logs: BTreeMap<GroupId, LoadingLog> = BTreeMap::new();
    let mut group_buckets = GroupBuckets::default();
    let mut found = |group: GroupId, encoded: &[u8]| -> StorageResult<()> {
        let state = decode_group_state(encoded).map_err(|detail| {
            StorageError::corrupted(path, format!("group {group} metadata: {detail}"))
        })?;
        group_buckets.insert(group, encoded);
        // The copies found are kept in a map, not a vector sized by the metadata: damaged
        // metadata must not decide how much is allocated.
        let loading = LoadingLog {
            state,
            copies: BTreeMap::new(),
        };
        if logs.insert(group, loading).is_some() {
            return Err(StorageError::corrupted(
                path,
                format!("group {group} has metadata twice"),
            ));
        }
        Ok(())
    };
    for item in txn.open_table(GROUP_BUCKETS).at(path)?.iter().at(path)? {
        let (key, value) = item.at(path)?;
        let bucket = key.value();
        let states = decode_bucket(bucket, value.value()).map_err(|detail| {
            StorageError::corrupted(path, format!("metadata bucket {bucket}: {detail}"))
        })?;
        for (group, encoded) in states {
            found(group, encoded)?;
        }
    }
    let mut legacy_groups = Vec::new();
    match txn.open_table(LEGACY_GROUPS) {
        Ok(table) => {
            for item in table.iter().at(path)? {
                let (key, value) = item.at(path)?;
                found(key.value(), value.value())?;
                legacy_groups.push(key.value());
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(error) => return Err(super::backend_error(path, error)),
    }
    let mut records = Vec::new();
    for item in txn.open_table(RECORDS).at(path)?.iter().at(path)? {
        let (key, value) = item.at(path)?;
        let record = key.value();
        let parts = log_record::decode(value.value()).map_err(|detail| {
            StorageError::corrupted(path, format!("record {record}: {detail}"))
        })?;
        let written = parts.iter().map(|(_, entries)| entries.len() as u64).sum();
        records.push((record, written));
        for (group, entries) in parts {
            let log = logs.get_mut(&group).ok_or_else(|| {
                StorageError::corrupted(
                    path,
                    format!("record {record}: entries of group {group}, which has no metadata"),
                )
            })?;
            // Records are read oldest first: a newer copy of an index replaces an older one.
            let first = log.state.first_index();
            for entry in entries {
                let index = entry.index;
                if index >= first && index <= log.state.last_index {
                    log.copies.insert(index, (entry, record));
                }
            }
        }
    }
    let memory = MemLogStore::new();
    let mut locations = RecordLocations::default();
    for (group, log) in logs {
        let first = log.state.first_index();
        let mut copies = log.copies.into_iter();
        let mut entries = Vec::with_capacity(copies.len());
        // Stops at the first missing index, however far the metadata claims the log goes.
        for index in first..=log.state.last_index {
            let copy = copies.next().filter(|(found, _)| *found == index);
            let (_, (entry, record)) = copy.ok_or_else(|| {
                StorageError::corrupted(
                    path,
                    format!(
                        "group {group}: entry {index} is missing (log {first}..={})",
                        log.state.last_index
                    ),
                )
            })?;
            locations.add(group, index, index, record);
            entries.push(entry);
        }
        memory
            .write(LogBatch::group_image(group, log.state, entries))
            .map_err(|error| {
                StorageError::corrupted(path, format!("group {group} does not load: {error}"))
            })?;
    }
    for &(record, written) in &records {
        locations.note_unreferenced(record);
        locations.note_written(record, written);
    }
    let next_record = records.last().map_or(0, |(last, _)| last + 1);
    Ok(Loaded {
        memory,
        next_record,
        locations,
        group_buckets,
        legacy_groups,
    })
}

/// A group being loaded: its metadata and, per live index, the newest copy found so far.
struct LoadingLog {
    state: GroupLogState,
    copies: BTreeMap<u64, (Entry, RecordSeq)>,
}

impl LogPersistence for RedbLogFile {
    type Prepared = ();

    fn prepare(&mut self, _batch: &LogBatch) {}

    /// One record for the batch's entries, all groups, plus the metadata of every group it
    /// touched, in one redb transaction.
    fn persist(&mut self, (): (), plan: &LogPlan, live: &MemLogStore) -> StorageResult<()> {
        let record = self.next_record;
        // Relocated entries go first: the batch's own entries, later in the record, are the
        // newer copies if the batch replaces some of them.
        let relocated = self.locations.relocation_candidates(RELOCATIONS_PER_WRITE);
        let mut relocated_parts = Vec::new();
        for &old in &relocated {
            for (group, run) in self.locations.runs_in(old) {
                let entries = live.entries(group, run.first, run.last + 1, None)?;
                relocated_parts.push((group, entries));
            }
        }
        let estimate = relocated_parts
            .iter()
            .map(|(_, entries)| entries)
            .chain(plan.mutations.iter().filter_map(|mutation| match mutation {
                EntryMutation::Put { entries, .. } => Some(entries),
                EntryMutation::Delete { .. } => None,
            }))
            .map(|entries| log_record::encoded_bytes_estimate(entries))
            .sum();
        let buffer = std::mem::take(&mut self.record_buffer);
        let mut record_bytes = RecordWriter::over_buffer(buffer, estimate);
        for (group, entries) in &relocated_parts {
            record_bytes.add_part(*group, entries);
        }
        for mutation in &plan.mutations {
            if let EntryMutation::Put { group, entries } = mutation {
                record_bytes.add_part(*group, entries);
            }
        }
        let has_parts = !record_bytes.is_empty();
        let record_bytes = record_bytes.finish();
        let dead = self.locations.take_dead();
        let durable = plan.syncs_under(self.sync_mode);
        let committed = self.commit(
            record,
            has_parts.then_some(record_bytes.as_slice()),
            &dead,
            &plan.states,
            durable,
        );
        if record_bytes.capacity() <= KEPT_RECORD_BUFFER_BYTES {
            self.record_buffer = record_bytes;
        }
        if let Err(error) = committed {
            self.locations.restore_dead(dead);
            return Err(error);
        }
        // The file now holds the batch: move the bookkeeping with it.
        for &old in &relocated {
            self.locations.relocate(old, record);
        }
        let mut wrote_record = !relocated.is_empty();
        for mutation in &plan.mutations {
            match mutation {
                EntryMutation::Delete { group, from, to } => {
                    self.locations.remove(*group, *from, *to);
                }
                EntryMutation::Put { group, entries } => {
                    let (first, last) = (entries[0].index, entries[entries.len() - 1].index);
                    self.locations.add(*group, first, last, record);
                    wrote_record = true;
                }
            }
        }
        if wrote_record {
            self.next_record += 1;
        }
        Ok(())
    }

    fn applied(&mut self, _live: &MemLogStore) -> StorageResult<()> {
        Ok(())
    }

    fn flush(&mut self) -> StorageResult<()> {
        if !self.unsynced_commits {
            return Ok(());
        }
        durable_empty_commit(&self.db, &self.path)?;
        self.unsynced_commits = false;
        Ok(())
    }

    fn sync_count(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }
}

impl RedbLogFile {
    /// One redb transaction: the new record (if it has entries), the deletion of dead records
    /// and the buckets of every group the batch touched; synced if `durable` (redb makes the
    /// commits before a durable one durable with it).
    fn commit(
        &mut self,
        record: RecordSeq,
        record_bytes: Option<&[u8]>,
        dead: &[RecordSeq],
        states: &[(GroupId, GroupLogState)],
        durable: bool,
    ) -> StorageResult<()> {
        let updates = &mut self.metadata_updates;
        updates.clear();
        for (group, state) in states {
            updates.push(*group, |out| encode_group_state_into(state, out));
        }
        updates.sort();
        let path = self.path.as_path();
        let mut txn = self.db.begin_write().at(path)?;
        let durability = if durable {
            Durability::Immediate
        } else {
            Durability::None
        };
        txn.set_durability(durability).at(path)?;
        {
            let mut records = txn.open_table(RECORDS).at(path)?;
            if let Some(record_bytes) = record_bytes {
                records.insert(record, record_bytes).at(path)?;
            }
            for &old in dead {
                records.remove(old).at(path)?;
            }
            let mut buckets = txn.open_table(GROUP_BUCKETS).at(path)?;
            let updates = &self.metadata_updates;
            for (bucket, run) in updates.by_bucket() {
                let out = &mut self.bucket_buffer;
                self.group_buckets
                    .encode_updated(bucket, run, &updates.bytes, out);
                buckets.insert(bucket, out.as_slice()).at(path)?;
            }
        }
        // Under Durability::Immediate this commit is the batch's one sync.
        txn.commit().at(path)?;
        self.unsynced_commits = !durable;
        self.group_buckets.apply(&self.metadata_updates);
        Ok(())
    }

    /// Moves the metadata of `groups` from the table of files written before the buckets
    /// into the buckets, in one durable transaction (a crash leaves one or the other).
    fn move_legacy_metadata(&mut self, groups: &[GroupId]) -> StorageResult<()> {
        let path = self.path.as_path();
        let mut txn = self.db.begin_write().at(path)?;
        txn.set_durability(Durability::Immediate).at(path)?;
        {
            let mut buckets = txn.open_table(GROUP_BUCKETS).at(path)?;
            let mut touched: Vec<u64> = groups.iter().map(|&g| bucket_of(g)).collect();
            touched.dedup();
            for bucket in touched {
                let out = &mut self.bucket_buffer;
                self.group_buckets.encode_updated(bucket, &[], &[], out);
                buckets.insert(bucket, out.as_slice()).at(path)?;
            }
        }
        txn.delete_table(LEGACY_GROUPS).at(path)?;
        txn.commit().at(path)
    }
}

impl Drop for RedbLogFile {
    fn drop(&mut self) {
        // A clean close keeps what a NoSync store wrote; there is no one left to report to.
        let _ = self.flush();
    }
}

/// A durable commit of nothing: redb persists every earlier non-durable commit with it.
pub(super) fn durable_empty_commit(db: &redb::Database, path: &Path) -> StorageResult<()> {
    let mut txn = db.begin_write().at(path)?;
    txn.set_durability(Durability::Immediate).at(path)?;
    txn.commit().at(path)
}
