//! [`RedbLogStore`]: raft logs in one redb file.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use raft::prelude::Entry;
use redb::{Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use super::{RedbResultExt, open_database};
use crate::codec::{decode_entry, decode_group_state, encode_entry, encode_group_state};
use crate::group_log_state::SizeBudget;
use crate::log_plan::{EntryMutation, plan};
use crate::{GroupId, GroupLogState, LogBatch, LogStore, StorageError, StorageResult, SyncMode};

/// `(group, index) -> crc32 | protobuf Entry`.
const ENTRIES: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("log_entries");
/// `group -> encoded GroupLogState`.
const GROUPS: TableDefinition<u64, &[u8]> = TableDefinition::new("log_groups");

/// A [`LogStore`] in a redb file. Each [`LogStore::write`] is one redb write transaction; under
/// [`SyncMode::Sync`] it commits with `Durability::Immediate`, which is one `fdatasync` of the
/// file (counted by [`LogStore::sync_count`]).
///
/// Opening the file verifies redb's page checksums and every group's log (no holes, metadata
/// matching the entries), and reports damage as [`StorageError::Corrupted`] naming the file.
#[derive(Debug)]
pub struct RedbLogStore {
    db: redb::Database,
    path: PathBuf,
    sync_mode: SyncMode,
    syncs: Arc<AtomicU64>,
}

impl RedbLogStore {
    /// Opens or creates the log file at `path`.
    pub fn open(path: &Path, sync_mode: SyncMode) -> StorageResult<Self> {
        let syncs = Arc::new(AtomicU64::new(0));
        let db = open_database(
            path,
            syncs.clone(),
            "concord_raft_log_sync_duration_seconds",
        )?;
        let store = RedbLogStore {
            db,
            path: path.to_path_buf(),
            sync_mode,
            syncs,
        };
        store.create_tables()?;
        store.verify()?;
        Ok(store)
    }

    fn create_tables(&self) -> StorageResult<()> {
        let txn = self.db.begin_write().at(&self.path)?;
        txn.open_table(ENTRIES).at(&self.path)?;
        txn.open_table(GROUPS).at(&self.path)?;
        txn.commit().at(&self.path)
    }

    /// Checks every group's log for holes and for entries outside its metadata.
    fn verify(&self) -> StorageResult<()> {
        let txn = self.db.begin_read().at(&self.path)?;
        let groups = txn.open_table(GROUPS).at(&self.path)?;
        let entries = txn.open_table(ENTRIES).at(&self.path)?;
        let mut expected_entries = 0u64;
        for item in groups.iter().at(&self.path)? {
            let (key, value) = item.at(&self.path)?;
            let group = key.value();
            let state = decode_group_state(value.value()).map_err(|detail| {
                StorageError::corrupted(&self.path, format!("group {group} metadata: {detail}"))
            })?;
            let mut next_index = state.first_index();
            for item in entries
                .range((group, 0)..=(group, u64::MAX))
                .at(&self.path)?
            {
                let (key, _) = item.at(&self.path)?;
                let index = key.value().1;
                if index != next_index {
                    return Err(StorageError::corrupted(
                        &self.path,
                        format!(
                            "group {group}: expected entry {next_index}, found {index} \
                             (log {}..={})",
                            state.first_index(),
                            state.last_index
                        ),
                    ));
                }
                next_index += 1;
            }
            if next_index != state.last_index + 1 {
                return Err(StorageError::corrupted(
                    &self.path,
                    format!(
                        "group {group}: log ends at {} but its metadata says {}",
                        next_index - 1,
                        state.last_index
                    ),
                ));
            }
            if state.entry_count() > 0 {
                read_entry(&entries, &self.path, group, state.last_index)?;
            }
            expected_entries += state.entry_count();
        }
        let stored = entries.len().at(&self.path)?;
        if stored != expected_entries {
            return Err(StorageError::corrupted(
                &self.path,
                format!("{stored} entries stored, group metadata accounts for {expected_entries}"),
            ));
        }
        Ok(())
    }
}

fn read_state(
    table: &impl ReadableTable<u64, &'static [u8]>,
    path: &Path,
    group: GroupId,
) -> StorageResult<GroupLogState> {
    match table.get(group).at(path)? {
        None => Ok(GroupLogState::default()),
        Some(value) => decode_group_state(value.value()).map_err(|detail| {
            StorageError::corrupted(path, format!("group {group} metadata: {detail}"))
        }),
    }
}

fn read_entry(
    table: &impl ReadableTable<(u64, u64), &'static [u8]>,
    path: &Path,
    group: GroupId,
    index: u64,
) -> StorageResult<Entry> {
    let value = table.get((group, index)).at(path)?.ok_or_else(|| {
        StorageError::corrupted(path, format!("group {group}: entry {index} is missing"))
    })?;
    decode_entry(value.value()).map_err(|detail| {
        StorageError::corrupted(path, format!("group {group}: entry {index}: {detail}"))
    })
}

impl LogStore for RedbLogStore {
    fn write(&self, batch: LogBatch) -> StorageResult<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let path = self.path.as_path();
        let mut txn = self.db.begin_write().at(path)?;
        let durability = match self.sync_mode {
            SyncMode::Sync => Durability::Immediate,
            SyncMode::NoSync => Durability::None,
        };
        txn.set_durability(durability).at(path)?;
        {
            let mut entries = txn.open_table(ENTRIES).at(path)?;
            let mut groups = txn.open_table(GROUPS).at(path)?;
            let plan = plan(
                batch,
                |group| read_state(&groups, path, group),
                |group, index| Ok(read_entry(&entries, path, group, index)?.term),
            )?;
            for mutation in plan.mutations {
                match mutation {
                    EntryMutation::Delete { group, from, to } => {
                        entries
                            .retain_in((group, from)..(group, to), |_, _| false)
                            .at(path)?;
                    }
                    EntryMutation::Put {
                        group,
                        entries: new,
                    } => {
                        for entry in &new {
                            entries
                                .insert((group, entry.index), encode_entry(entry).as_slice())
                                .at(path)?;
                        }
                    }
                }
            }
            for (group, state) in &plan.states {
                groups
                    .insert(group, encode_group_state(state).as_slice())
                    .at(path)?;
            }
        }
        // Under Durability::Immediate this commit is the batch's one sync.
        txn.commit().at(path)
    }

    fn entries(
        &self,
        group: GroupId,
        low: u64,
        high: u64,
        max_bytes: Option<u64>,
    ) -> StorageResult<Vec<Entry>> {
        let path = self.path.as_path();
        // One read transaction for metadata and entries: both from the same commit.
        let txn = self.db.begin_read().at(path)?;
        let state = read_state(&txn.open_table(GROUPS).at(path)?, path, group)?;
        state.check_range(group, low, high)?;
        if low == high {
            return Ok(Vec::new());
        }
        let table = txn.open_table(ENTRIES).at(path)?;
        let mut budget = SizeBudget::new(max_bytes);
        let mut out = Vec::with_capacity((high - low).min(4096) as usize);
        let mut expected = low;
        for item in table.range((group, low)..(group, high)).at(path)? {
            let (key, value) = item.at(path)?;
            let index = key.value().1;
            if index != expected {
                break; // Reported as a hole below.
            }
            let bytes = value.value();
            if !budget.take(bytes.len().saturating_sub(4) as u64) {
                return Ok(out);
            }
            out.push(decode_entry(bytes).map_err(|detail| {
                StorageError::corrupted(path, format!("group {group}: entry {index}: {detail}"))
            })?);
            expected += 1;
        }
        if expected != high {
            return Err(StorageError::corrupted(
                path,
                format!("group {group}: entry {expected} is missing"),
            ));
        }
        Ok(out)
    }

    fn term(&self, group: GroupId, index: u64) -> StorageResult<u64> {
        let path = self.path.as_path();
        let txn = self.db.begin_read().at(path)?;
        let state = read_state(&txn.open_table(GROUPS).at(path)?, path, group)?;
        if let Some(term) = state.term_from_metadata(group, index)? {
            return Ok(term);
        }
        Ok(read_entry(&txn.open_table(ENTRIES).at(path)?, path, group, index)?.term)
    }

    fn group_state(&self, group: GroupId) -> StorageResult<GroupLogState> {
        let path = self.path.as_path();
        let txn = self.db.begin_read().at(path)?;
        read_state(&txn.open_table(GROUPS).at(path)?, path, group)
    }

    fn groups(&self) -> StorageResult<Vec<GroupId>> {
        let path = self.path.as_path();
        let txn = self.db.begin_read().at(path)?;
        let table = txn.open_table(GROUPS).at(path)?;
        let mut out = Vec::new();
        for item in table.iter().at(path)? {
            out.push(item.at(path)?.0.value());
        }
        Ok(out)
    }

    fn flush(&self) -> StorageResult<()> {
        if self.sync_mode.is_sync() {
            return Ok(()); // Every write was already durable.
        }
        durable_empty_commit(&self.db, &self.path)
    }

    fn sync_mode(&self) -> SyncMode {
        self.sync_mode
    }

    fn sync_count(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }
}

impl Drop for RedbLogStore {
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
