//! [`WriteBackStateStore`]: commits kept in memory and written to the store beneath by each
//! flush, in one transaction, so a flush never stops the committing thread.
//!
//! Why: redb has one writer. A commit without a sync leaves its pages in redb's buffer, and the
//! durable commit that makes them safe writes all of them and syncs while it holds that writer:
//! the apply thread, the only committer, stood still for the whole flush, and every caller of
//! the node with it. Here the commits go to an in-memory layer instead; a flush freezes that
//! layer, starts a new one for the commits that follow, and writes the frozen one beneath while
//! commits go on. A key rewritten many times between two flushes is written beneath once.
//!
//! Reads look at the new layer, then the frozen one, then the store beneath. The frozen layer
//! is dropped only after the store beneath holds it, so no committed value ever disappears from
//! reads. A read of a key the group never had (a create checking that its key is new) need
//! not search the store beneath: each flush leaves, for every group it wrote, a [`KeyFilter`]
//! of the keys the group holds, and every later put joins it; a key it has never seen is
//! absent. After a crash the store beneath is at its last flush, as the [`StateStore`] contract
//! allows; the raft log keeps what came after.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::{Mutex, RwLock};

use crate::key_filter::{self, KeyFilter};
use crate::state_store::{check_applied_advances, check_distinct_groups};
use crate::write_set::merge_over;
use crate::{
    BorrowedGroupCommit, GroupCommit, GroupId, GroupRestore, KeyRange, KeyValue, StateSnapshot,
    StateStore, StorageError, StorageResult, WriteSet,
};

/// Bytes of commits kept in memory that make the next commit flush before it returns: what
/// bounds memory when flushes fall behind the commits.
pub const DEFAULT_PENDING_LIMIT_BYTES: usize = 128 * 1024 * 1024;

/// Bytes counted per pending write besides its key and value (the tree node's share).
const PENDING_WRITE_OVERHEAD_BYTES: usize = 64;

/// A [`StateStore`] that keeps commits in memory until a [`StateStore::flush`] writes them to
/// the store beneath (`base`) in one commit and makes them durable.
///
/// [`StateStore::flush`] may run on another thread while commits go on: they land in a new
/// layer and never wait for the disk, unless the commits held in memory reach the pending
/// limit (then the commit that reaches it flushes before it returns). If writing beneath fails,
/// every later commit and flush is refused with [`StorageError::FlushFailed`] (reads go on):
/// reopening the store recovers from its last flush, and the raft log replays the rest.
///
/// ```
/// use concord_storage::{MemStateStore, StateStore, StateTransaction, WriteBackStateStore};
///
/// let store = WriteBackStateStore::new(MemStateStore::new());
/// let mut txn = StateTransaction::new(&store, 7);
/// txn.put(b"key", b"value")?;
/// txn.commit(1)?;
/// assert_eq!(store.get(7, b"key")?.as_deref(), Some(&b"value"[..]));
/// assert_eq!(store.base().get(7, b"key")?, None); // not written beneath yet
/// store.flush()?;
/// assert_eq!(store.base().get(7, b"key")?.as_deref(), Some(&b"value"[..]));
/// # Ok::<(), concord_storage::StorageError>(())
/// ```
pub struct WriteBackStateStore<S: StateStore> {
    layers: RwLock<Layers>,
    /// Held for the whole of a flush: one flush at a time, and a restore waits for it.
    flushing: Mutex<()>,
    pending_limit_bytes: usize,
    /// Bytes of the new layer as of the last commit or flush, for [`StateStore::wants_flush`]
    /// to read without the layers' lock.
    active_bytes: AtomicUsize,
    /// `concord_state_pending_bytes`: commits held in memory, both layers.
    pending_bytes_gauge: metrics::Gauge,
    /// Declared last: dropped after the layers were flushed into it (see `Drop`).
    base: S,
}

/// The in-memory layers over the store beneath.
#[derive(Default)]
struct Layers {
    /// Commits since the last flush began.
    active: Pending,
    /// The commits the running flush writes beneath; `None` when no flush runs.
    frozen: Option<Arc<Pending>>,
    /// The latest applied index of every group committed or read since the store opened, so
    /// that checking a commit reads the store beneath once per group, not once per commit.
    applied: HashMap<GroupId, u64, foldhash::fast::RandomState>,
    /// Why writing beneath failed, once it has.
    failed: Option<String>,
    /// Per group, every key it holds anywhere (beneath or in a layer) and maybe a few it no
    /// longer holds: a key not in the filter is absent. Built by a flush, for the groups it
    /// wrote, from the store beneath and the new layer; every put joins it from then on.
    filters: HashMap<GroupId, KeyFilter, foldhash::fast::RandomState>,
}

/// A key held in memory: inline up to 40 bytes, so that comparing it in the tree reads the
/// node, not another allocation.
type PendingKey = smallvec::SmallVec<[u8; 40]>;

/// Commits of some period, per group.
#[derive(Default)]
struct Pending {
    groups: HashMap<GroupId, PendingGroup, foldhash::fast::RandomState>,
    bytes: usize,
}

/// One group's commits of a period: its latest applied index and writes (`None` a delete).
struct PendingGroup {
    applied_index: u64,
    writes: BTreeMap<PendingKey, Option<Vec<u8>>>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The write to `key` in this period: `Some(None)` a delete, `None` untouched.
    fn lookup(&self, group: GroupId, key: &[u8]) -> Option<Option<&Vec<u8>>> {
        let writes = &self.groups.get(&group)?.writes;
        writes.get(key).map(Option::as_ref)
    }

    fn applied_index(&self, group: GroupId) -> Option<u64> {
        self.groups.get(&group).map(|g| g.applied_index)
    }

    /// Takes `commit`'s writes; the keys it puts join `filter`, the group's key filter if it
    /// has one (here, where the writes are walked anyway, in no order and without a copy).
    fn add(&mut self, commit: GroupCommit, mut filter: Option<&mut KeyFilter>) {
        let group = self.groups.entry(commit.group).or_insert(PendingGroup {
            applied_index: commit.applied_index,
            writes: BTreeMap::new(),
        });
        group.applied_index = commit.applied_index;
        for (key, value) in commit.writes.into_writes_unordered() {
            if let (Some(filter), Some(_)) = (filter.as_deref_mut(), &value) {
                filter.insert(&key);
            }
            let key_bytes = key.len();
            let value_bytes = value.as_ref().map_or(0, Vec::len);
            match group.writes.insert(PendingKey::from_vec(key), value) {
                Some(old) => {
                    let old_bytes = old.as_ref().map_or(0, Vec::len);
                    self.bytes = (self.bytes + value_bytes).saturating_sub(old_bytes);
                }
                None => self.bytes += key_bytes + value_bytes + PENDING_WRITE_OVERHEAD_BYTES,
            }
        }
    }

    /// Every group's writes, borrowed, in key order: the commits the store beneath takes.
    fn borrowed_commits(&self) -> Vec<BorrowedGroupCommit<'_>> {
        let mut commits = Vec::with_capacity(self.groups.len());
        for (&group, pending) in &self.groups {
            let writes = pending.writes.iter();
            commits.push(BorrowedGroupCommit {
                group,
                writes: writes
                    .map(|(key, value)| (&key[..], value.as_deref()))
                    .collect(),
                applied_index: pending.applied_index,
            });
        }
        commits
    }
}

impl Layers {
    /// The write to `key` in memory, the newer layer first.
    fn lookup(&self, group: GroupId, key: &[u8]) -> Option<Option<&Vec<u8>>> {
        self.active
            .lookup(group, key)
            .or_else(|| self.frozen.as_ref()?.lookup(group, key))
    }

    /// `true` if `group` certainly has no value for `key`, in a layer or beneath.
    fn certainly_absent(&self, group: GroupId, key: &[u8]) -> bool {
        self.filters
            .get(&group)
            .is_some_and(|filter| !filter.may_contain(key))
    }

    /// `group`'s writes in memory within `range`, in key order, the newer layer winning, up to
    /// and including the `puts`-th put (a scan for `puts` pairs needs nothing after it).
    fn writes_in(
        &self,
        group: GroupId,
        range: &KeyRange,
        puts: usize,
    ) -> Vec<(&[u8], Option<&[u8]>)> {
        let mut newer = group_writes_in(Some(&self.active), group, range).peekable();
        let mut older = group_writes_in(self.frozen.as_deref(), group, range).peekable();
        let mut out = Vec::new();
        let mut put_count = 0;
        while put_count < puts {
            let next = match (newer.peek(), older.peek()) {
                (None, None) => break,
                (Some(_), None) => newer.next(),
                (None, Some(_)) => older.next(),
                (Some((newer_key, _)), Some((older_key, _))) => {
                    if newer_key <= older_key {
                        if newer_key == older_key {
                            older.next(); // The newer layer's write replaces it.
                        }
                        newer.next()
                    } else {
                        older.next()
                    }
                }
            };
            let (key, value) = next.expect("peeked");
            put_count += usize::from(value.is_some());
            out.push((key.as_slice(), value.as_deref()));
        }
        out
    }

    /// Bytes of commits held in memory, both layers.
    fn pending_bytes(&self) -> usize {
        self.active.bytes + self.frozen.as_ref().map_or(0, |f| f.bytes)
    }

    /// Fails if writing beneath failed before.
    fn check_not_failed(&self) -> StorageResult<()> {
        match &self.failed {
            Some(detail) => Err(StorageError::FlushFailed {
                detail: detail.clone(),
            }),
            None => Ok(()),
        }
    }
}

/// `group`'s writes within `range` in one layer, in key order.
fn group_writes_in<'a>(
    pending: Option<&'a Pending>,
    group: GroupId,
    range: &KeyRange,
) -> impl Iterator<Item = (&'a PendingKey, &'a Option<Vec<u8>>)> + 'a {
    let bounds = range.as_slices();
    pending
        .and_then(|p| p.groups.get(&group))
        .map(|g| g.writes.range::<[u8], _>(bounds))
        .into_iter()
        .flatten()
}

impl<S: StateStore> WriteBackStateStore<S> {
    /// A store over `base` with [`DEFAULT_PENDING_LIMIT_BYTES`].
    pub fn new(base: S) -> Self {
        Self::with_pending_limit(base, DEFAULT_PENDING_LIMIT_BYTES)
    }

    /// A store over `base` that flushes within a commit once `pending_limit_bytes` of commits
    /// are held in memory.
    pub fn with_pending_limit(base: S, pending_limit_bytes: usize) -> Self {
        WriteBackStateStore {
            layers: RwLock::new(Layers::default()),
            flushing: Mutex::new(()),
            pending_limit_bytes,
            active_bytes: AtomicUsize::new(0),
            pending_bytes_gauge: metrics::gauge!("concord_state_pending_bytes"),
            base,
        }
    }

    /// The store beneath: what it holds is what survives a crash.
    pub fn base(&self) -> &S {
        &self.base
    }

    /// `group`'s applied index as the layers know it, reading the store beneath (and
    /// remembering it) the first time.
    fn known_applied_index(&self, layers: &mut Layers, group: GroupId) -> StorageResult<u64> {
        if let Some(&index) = layers.applied.get(&group) {
            return Ok(index);
        }
        let index = self.base.applied_index(group)?;
        layers.applied.insert(group, index);
        Ok(index)
    }

    /// The flush itself, with `flushing` held by the caller.
    fn flush_holding_the_lock(&self) -> StorageResult<()> {
        let frozen = {
            let mut layers = self.layers.write();
            layers.check_not_failed()?;
            if layers.active.is_empty() {
                return Ok(());
            }
            let frozen = Arc::new(std::mem::take(&mut layers.active));
            layers.frozen = Some(Arc::clone(&frozen));
            self.active_bytes.store(0, Ordering::Relaxed);
            frozen
        };
        let written = self
            .base
            .commit_borrowed_groups(&frozen.borrowed_commits())
            .and_then(|()| self.base.flush());
        let mut layers = self.layers.write();
        match written {
            Ok(()) => {
                layers.frozen = None;
                self.pending_bytes_gauge.set(layers.pending_bytes() as f64);
                // A filter whose every layer filled (a group that grew many times over, or
                // one whose keys come and go) is built again from the keys there are.
                let unfiltered: Vec<GroupId> = frozen
                    .groups
                    .keys()
                    .copied()
                    .filter(|group| layers.filters.get(group).is_none_or(KeyFilter::is_full))
                    .collect();
                drop(layers);
                self.build_filters(&unfiltered);
                Ok(())
            }
            Err(error) => {
                // The frozen layer stays: reads still see it. What the store beneath took of it
                // is unknown, so nothing more is written over it.
                layers.failed = Some(error.to_string());
                Err(error)
            }
        }
    }
}

impl<S: StateStore> WriteBackStateStore<S> {
    /// Builds the key filter of each of `groups` from the store beneath and the new layer,
    /// sized for twice the keys found. Runs with `flushing` held and no frozen layer: the store
    /// beneath does not change meanwhile, and a commit made during the scan is in the new layer
    /// when the filter is put in place. A group whose scan fails keeps what it had (no filter,
    /// or a full one that is still right) and is tried again at its next flush.
    fn build_filters(&self, groups: &[GroupId]) {
        for &group in groups {
            // Hashes, not keys: the scan holds 8 bytes per key, whatever the keys' size.
            let mut hashes = Vec::new();
            let scanned = self
                .base
                .for_each_key(group, &mut |key| hashes.push(key_filter::key_hash(key)));
            if scanned.is_err() {
                continue;
            }
            let mut layers = self.layers.write();
            let in_memory = layers.active.groups.get(&group);
            hashes.extend(
                in_memory
                    .into_iter()
                    .flat_map(|g| &g.writes)
                    .filter(|(_, value)| value.is_some())
                    .map(|(key, _)| key_filter::key_hash(key)),
            );
            layers
                .filters
                .insert(group, KeyFilter::from_hashes(&hashes));
        }
    }
}

impl<S: StateStore> StateStore for WriteBackStateStore<S> {
    fn get(&self, group: GroupId, key: &[u8]) -> StorageResult<Option<Vec<u8>>> {
        {
            let layers = self.layers.read();
            // Asked first: a key the filter has never seen has no value in a layer either (at
            // most a delete), and the layers' trees cost more than its one cache line.
            if layers.certainly_absent(group, key) {
                return Ok(None);
            }
            if let Some(value) = layers.lookup(group, key) {
                return Ok(value.cloned());
            }
        }
        // Neither layer holds the key: a flush that starts now writes nothing over it that was
        // committed before this read began.
        self.base.get(group, key)
    }

    fn scan(&self, group: GroupId, range: &KeyRange, limit: usize) -> StorageResult<Vec<KeyValue>> {
        if limit == 0 || range.is_empty() {
            return Ok(Vec::new());
        }
        // Held while the store beneath is read: the running flush can change it only by
        // writing the frozen layer, which is read here too; no other flush can start.
        let layers = self.layers.read();
        let staged = layers.writes_in(group, range, limit);
        // Each write in memory replaces or hides at most one pair beneath.
        let base = self
            .base
            .scan(group, range, limit.saturating_add(staged.len()))?;
        Ok(merge_over(staged, base, limit))
    }

    fn applied_index(&self, group: GroupId) -> StorageResult<u64> {
        if let Some(&index) = self.layers.read().applied.get(&group) {
            return Ok(index);
        }
        self.base.applied_index(group)
    }

    fn commit(&self, group: GroupId, writes: WriteSet, applied_index: u64) -> StorageResult<()> {
        self.commit_groups(vec![GroupCommit {
            group,
            writes,
            applied_index,
        }])
    }

    fn commit_groups(&self, commits: Vec<GroupCommit>) -> StorageResult<()> {
        check_distinct_groups(commits.iter().map(|c| c.group))?;
        let over_limit = {
            let mut layers = self.layers.write();
            layers.check_not_failed()?;
            for commit in &commits {
                let current = self.known_applied_index(&mut layers, commit.group)?;
                check_applied_advances(commit.group, current, commit.applied_index)?;
            }
            let layers = &mut *layers;
            for commit in commits {
                layers.applied.insert(commit.group, commit.applied_index);
                let filter = layers.filters.get_mut(&commit.group);
                layers.active.add(commit, filter);
            }
            self.pending_bytes_gauge.set(layers.pending_bytes() as f64);
            self.active_bytes
                .store(layers.active.bytes, Ordering::Relaxed);
            layers.active.bytes >= self.pending_limit_bytes
        };
        if over_limit {
            // The commit itself has landed. A failure here is kept in `failed`: the next
            // commit or flush reports it.
            let _ = self.flush();
        }
        Ok(())
    }

    fn flush(&self) -> StorageResult<()> {
        let _flushing = self.flushing.lock();
        self.flush_holding_the_lock()
    }

    /// Half the pending limit held in the new layer: a flush started now, on the flusher's
    /// thread, has the other half's time to finish before a commit reaches the limit and has
    /// to flush on the committing thread.
    fn wants_flush(&self) -> bool {
        self.active_bytes.load(Ordering::Relaxed) >= self.pending_limit_bytes / 2
    }

    fn snapshot(&self, group: GroupId) -> StorageResult<StateSnapshot<'_>> {
        // As in `scan`: the layers and the store beneath are read as of one moment.
        let layers = self.layers.read();
        let staged: Vec<StagedWrite> = layers
            .writes_in(group, &KeyRange::all(), usize::MAX)
            .into_iter()
            .map(|(key, value)| (key.to_vec(), value.map(<[u8]>::to_vec)))
            .collect();
        let staged_applied = layers
            .active
            .applied_index(group)
            .or_else(|| layers.frozen.as_ref()?.applied_index(group));
        let base = self.base.snapshot(group)?;
        drop(layers);
        Ok(StateSnapshot {
            applied_index: staged_applied.unwrap_or(base.applied_index),
            records: Box::new(MergedRecords {
                staged: staged.into_iter().peekable(),
                base: base.records.peekable(),
            }),
        })
    }

    fn restore_groups(&self, restores: &mut [GroupRestore<'_>]) -> StorageResult<()> {
        check_distinct_groups(restores.iter().map(|restore| restore.group))?;
        // Everything in memory goes beneath first, so no layer holds a group's old data over
        // the restored one and no flush runs meanwhile.
        let _flushing = self.flushing.lock();
        self.flush_holding_the_lock()?;
        // Each group's key filter is built from the keys as they go by, so that no flush has
        // to read them back from the store beneath; hashes, not keys, as `build_filters` holds.
        let targets: Vec<(GroupId, u64)> = restores
            .iter()
            .map(|restore| (restore.group, restore.applied_index))
            .collect();
        let mut hashes: Vec<Vec<u64>> = vec![Vec::new(); restores.len()];
        let mut hashing: Vec<_> = restores
            .iter_mut()
            .zip(&mut hashes)
            .map(|(restore, hashes)| {
                (&mut *restore.records).inspect(move |record| {
                    if let Ok((key, _)) = record {
                        hashes.push(key_filter::key_hash(key));
                    }
                })
            })
            .collect();
        let mut beneath: Vec<GroupRestore<'_>> = targets
            .iter()
            .zip(&mut hashing)
            .map(|(&(group, applied_index), records)| GroupRestore {
                group,
                applied_index,
                records,
            })
            .collect();
        self.base.restore_groups(&mut beneath)?;
        drop(beneath);
        drop(hashing);
        let mut layers = self.layers.write();
        for (&(group, applied_index), hashes) in targets.iter().zip(&hashes) {
            layers.active.groups.remove(&group);
            layers.applied.insert(group, applied_index);
            // The group holds the restored keys and nothing else: no commit to it is made
            // while it is restored.
            layers.filters.insert(group, KeyFilter::from_hashes(hashes));
        }
        Ok(())
    }

    fn groups(&self) -> StorageResult<Vec<GroupId>> {
        let mut groups: BTreeSet<GroupId> = self.base.groups()?.into_iter().collect();
        let layers = self.layers.read();
        groups.extend(layers.active.groups.keys());
        if let Some(frozen) = &layers.frozen {
            groups.extend(frozen.groups.keys());
        }
        Ok(groups.into_iter().collect())
    }
}

impl<S: StateStore> std::fmt::Debug for WriteBackStateStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let layers = self.layers.read();
        f.debug_struct("WriteBackStateStore")
            .field("pending_bytes", &layers.active.bytes)
            .field("flushing", &layers.frozen.is_some())
            .field("failed", &layers.failed)
            .finish_non_exhaustive()
    }
}

impl<S: StateStore> Drop for WriteBackStateStore<S> {
    fn drop(&mut self) {
        // A clean close keeps every commit; there is no one left to report a failure to.
        let _ = self.flush();
    }
}

/// A write held in memory: the key, and its value or `None` for a delete.
type StagedWrite = (Vec<u8>, Option<Vec<u8>>);

/// A snapshot's pairs: the writes held in memory over the pairs beneath, in key order.
struct MergedRecords<'a> {
    staged: std::iter::Peekable<std::vec::IntoIter<StagedWrite>>,
    base: std::iter::Peekable<Box<dyn Iterator<Item = StorageResult<KeyValue>> + 'a>>,
}

impl Iterator for MergedRecords<'_> {
    type Item = StorageResult<KeyValue>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let take_staged = match (self.base.peek(), self.staged.peek()) {
                (None, None) => return None,
                (Some(Err(_)), _) => return self.base.next(),
                (Some(Ok(_)), None) => false,
                (None, Some(_)) => true,
                (Some(Ok((base_key, _))), Some((staged_key, _))) => {
                    if base_key == staged_key {
                        self.base.next();
                        true
                    } else {
                        staged_key < base_key
                    }
                }
            };
            if !take_staged {
                return self.base.next();
            }
            let (key, value) = self.staged.next().expect("peeked");
            if let Some(value) = value {
                return Some(Ok((key, value)));
            }
            // A delete held in memory: the pair beneath (if any) was skipped above.
        }
    }
}
