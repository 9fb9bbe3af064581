//! [`SledLogStore`]: raft logs in a sled database.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::RwLock;
use raft::prelude::Entry;

use super::keys::{TAG_DATA, TAG_META, entry_key, meta_key, split_group};
use super::{SledDatabase, SledResultExt, open_database};
use crate::codec::{decode_entry, decode_group_state, encode_entry, encode_group_state};
use crate::group_log_state::SizeBudget;
use crate::log_plan::{EntryMutation, LogPlan, plan};
use crate::{GroupId, GroupLogState, LogBatch, LogStore, StorageError, StorageResult, SyncMode};

/// A [`LogStore`] in a sled database. Each write is one atomic `apply_batch`; under
/// [`SyncMode::Sync`] it is followed by one `flush` (counted by [`LogStore::sync_count`])
/// unless it only moves commit indexes.
/// See the module docs for sled's power-loss caveat.
#[derive(Debug)]
pub struct SledLogStore {
    db: SledDatabase,
    path: PathBuf,
    sync_mode: SyncMode,
    syncs: AtomicU64,
    /// sled has no read snapshots: reads hold this shared while they read metadata and then
    /// entries, writes hold it exclusively, so a read never mixes two versions of a log.
    consistency: RwLock<()>,
}

impl SledLogStore {
    /// Opens or creates the log database at `path` (a directory).
    pub fn open(path: &Path, sync_mode: SyncMode) -> StorageResult<Self> {
        let store = SledLogStore {
            db: open_database(path)?,
            path: path.to_path_buf(),
            sync_mode,
            syncs: AtomicU64::new(0),
            consistency: RwLock::new(()),
        };
        store.verify()?;
        Ok(store)
    }

    fn corrupted(&self, detail: String) -> StorageError {
        StorageError::corrupted(&self.path, detail)
    }

    /// One pass over all keys: every entry belongs to a group with metadata and every group's
    /// log has no hole and matches its metadata.
    fn verify(&self) -> StorageResult<()> {
        let mut states = BTreeMap::new();
        for item in self.db.scan_prefix([TAG_META]) {
            let (key, value) = item.at(&self.path)?;
            let (group, _) = split_group(&key)
                .ok_or_else(|| self.corrupted(format!("malformed metadata key {key:?}")))?;
            let state = decode_group_state(&value)
                .map_err(|d| self.corrupted(format!("group {group} metadata: {d}")))?;
            states.insert(group, (state, 0u64));
        }
        for item in self.db.scan_prefix([TAG_DATA]) {
            let (key, _) = item.at(&self.path)?;
            let (group, rest) = split_group(&key)
                .filter(|(_, rest)| rest.len() == 8)
                .ok_or_else(|| self.corrupted(format!("malformed entry key {key:?}")))?;
            let index = u64::from_be_bytes(rest.try_into().expect("8 bytes"));
            let Some((state, seen)) = states.get_mut(&group) else {
                return Err(self.corrupted(format!("entry {index} of unknown group {group}")));
            };
            let expected = state.first_index() + *seen;
            if index != expected || index > state.last_index {
                return Err(self.corrupted(format!(
                    "group {group}: expected entry {expected}, found {index} (log {}..={})",
                    state.first_index(),
                    state.last_index
                )));
            }
            *seen += 1;
        }
        for (group, (state, seen)) in &states {
            if *seen != state.entry_count() {
                return Err(self.corrupted(format!(
                    "group {group}: {seen} entries stored, metadata says {}",
                    state.entry_count()
                )));
            }
        }
        Ok(())
    }

    fn read_state(&self, group: GroupId) -> StorageResult<GroupLogState> {
        match self.db.get(meta_key(group)).at(&self.path)? {
            None => Ok(GroupLogState::default()),
            Some(value) => decode_group_state(&value)
                .map_err(|d| self.corrupted(format!("group {group} metadata: {d}"))),
        }
    }

    fn read_entry(&self, group: GroupId, index: u64) -> StorageResult<Entry> {
        let value = self
            .db
            .get(entry_key(group, index))
            .at(&self.path)?
            .ok_or_else(|| self.corrupted(format!("group {group}: entry {index} is missing")))?;
        decode_entry(&value)
            .map_err(|d| self.corrupted(format!("group {group}: entry {index}: {d}")))
    }
}

impl LogStore for SledLogStore {
    fn write_from(&self, batch: &mut LogBatch) -> StorageResult<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let _exclusive = self.consistency.write();
        let mut planned = LogPlan::default();
        plan(
            &mut planned,
            batch,
            |group| self.read_state(group),
            |group, index| Ok(self.read_entry(group, index)?.term),
        )?;
        let sync = planned.syncs_under(self.sync_mode);
        let mut sled_batch = sled::Batch::default();
        for mutation in planned.mutations {
            match mutation {
                EntryMutation::Delete { group, from, to } => {
                    for index in from..to {
                        sled_batch.remove(&entry_key(group, index));
                    }
                }
                EntryMutation::Put { group, entries } => {
                    for entry in &entries {
                        sled_batch.insert(&entry_key(group, entry.index), encode_entry(entry));
                    }
                }
            }
        }
        for (group, state) in &planned.states {
            sled_batch.insert(&meta_key(*group), encode_group_state(state));
        }
        self.db.apply_batch(sled_batch).at(&self.path)?;
        if sync {
            let started = Instant::now();
            self.db.flush().at(&self.path)?;
            metrics::histogram!("concord_raft_log_sync_duration_seconds", "backend" => "sled")
                .record(started.elapsed().as_secs_f64());
            self.syncs.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn entries(
        &self,
        group: GroupId,
        low: u64,
        high: u64,
        max_bytes: Option<u64>,
    ) -> StorageResult<Vec<Entry>> {
        let _shared = self.consistency.read();
        let state = self.read_state(group)?;
        state.check_range(group, low, high)?;
        let mut budget = SizeBudget::new(max_bytes);
        let mut out = Vec::with_capacity((high - low).min(4096) as usize);
        let mut expected = low;
        for item in self.db.range(entry_key(group, low)..entry_key(group, high)) {
            let (key, value) = item.at(&self.path)?;
            let index = u64::from_be_bytes(key[9..17].try_into().expect("entry keys are 17 bytes"));
            if index != expected {
                break; // Reported as a hole below.
            }
            if !budget.take(value.len().saturating_sub(4) as u64) {
                return Ok(out);
            }
            out.push(
                decode_entry(&value)
                    .map_err(|d| self.corrupted(format!("group {group}: entry {index}: {d}")))?,
            );
            expected += 1;
        }
        if expected != high {
            return Err(self.corrupted(format!("group {group}: entry {expected} is missing")));
        }
        Ok(out)
    }

    fn term(&self, group: GroupId, index: u64) -> StorageResult<u64> {
        let _shared = self.consistency.read();
        let state = self.read_state(group)?;
        if let Some(term) = state.term_from_metadata(group, index)? {
            return Ok(term);
        }
        Ok(self.read_entry(group, index)?.term)
    }

    fn group_state(&self, group: GroupId) -> StorageResult<GroupLogState> {
        self.read_state(group)
    }

    fn groups(&self) -> StorageResult<Vec<GroupId>> {
        let mut out = Vec::new();
        for item in self.db.scan_prefix([TAG_META]) {
            let (key, _) = item.at(&self.path)?;
            if let Some((group, _)) = split_group(&key) {
                out.push(group);
            }
        }
        Ok(out)
    }

    fn flush(&self) -> StorageResult<()> {
        self.db.flush().at(&self.path)?;
        Ok(())
    }

    fn sync_mode(&self) -> SyncMode {
        self.sync_mode
    }

    fn sync_count(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }
}
