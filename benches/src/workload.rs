//! Deterministic workloads for the storage benchmarks.

use bytes::Bytes;
use concord_storage::raft::prelude::Entry;
use concord_storage::{GroupId, LogBatch, WriteSet};

/// Produces log batches that append `entries_per_group` entries to each of `groups` groups,
/// compacting a group's log once it holds more than `retain_entries`, as a raft node that
/// snapshots regularly would: the log, and so the file under it, reaches a steady size.
/// Payloads share one buffer, as raft-rs entries share `Bytes`.
pub struct LogWorkload {
    groups: u64,
    entries_per_group: u64,
    retain_entries: u64,
    payload: Bytes,
    next_index: Vec<u64>,
    first_index: Vec<u64>,
    compactions: u64,
}

impl LogWorkload {
    /// A workload over groups `0..groups`.
    pub fn new(groups: u64, entries_per_group: u64, payload_bytes: usize) -> Self {
        LogWorkload {
            groups,
            entries_per_group,
            // Enough for several batches, and about 10k entries per group otherwise.
            retain_entries: (4 * entries_per_group).max(10_000),
            payload: Bytes::from(vec![0xAB; payload_bytes]),
            next_index: vec![1; groups as usize],
            first_index: vec![1; groups as usize],
            compactions: 0,
        }
    }

    /// Entries in each batch, over all groups.
    pub fn entries_per_batch(&self) -> u64 {
        self.groups * self.entries_per_group
    }

    /// Payload bytes in each batch, over all groups.
    pub fn payload_bytes_per_batch(&self) -> u64 {
        self.entries_per_batch() * self.payload.len() as u64
    }

    /// Compactions issued so far, over all groups.
    pub fn compactions(&self) -> u64 {
        self.compactions
    }

    /// The next batch.
    pub fn next_batch(&mut self) -> LogBatch {
        let mut batch = LogBatch::new();
        for group in 0..self.groups {
            let g = group as usize;
            let first = self.next_index[g];
            let entries = (first..first + self.entries_per_group)
                .map(|index| {
                    let mut entry = Entry::default();
                    entry.index = index;
                    entry.term = 1;
                    entry.data = self.payload.clone();
                    entry
                })
                .collect();
            batch.append(group as GroupId, entries);
            self.next_index[g] += self.entries_per_group;
            let last = self.next_index[g] - 1;
            if last - self.first_index[g] + 1 > self.retain_entries {
                let compact_to = last + 1 - self.retain_entries / 2;
                batch.compact(group as GroupId, compact_to);
                self.first_index[g] = compact_to;
                self.compactions += 1;
            }
        }
        batch
    }
}

/// Produces state commits of `writes_per_commit` puts of `value_bytes` each: cycling over a
/// bounded key space so the data set stays a fixed size, or (`fresh`) each put a key never
/// written before, scattered over the key space as new sessions' ids are.
pub struct StateWorkload {
    writes_per_commit: u64,
    value: Vec<u8>,
    keys: StateKeys,
    next_key: u64,
    applied_index: u64,
}

/// Which keys a [`StateWorkload`] writes.
enum StateKeys {
    /// `session/00000000` up to this many, then from the first again.
    Cycled { key_space: u64 },
    /// A new key every put.
    Fresh,
}

impl StateWorkload {
    /// A workload of `writes_per_commit` puts per commit over 100,000 keys.
    pub fn new(writes_per_commit: u64, value_bytes: usize) -> Self {
        Self::with_keys(
            writes_per_commit,
            value_bytes,
            StateKeys::Cycled { key_space: 100_000 },
        )
    }

    /// A workload of `writes_per_commit` puts per commit, each of a key never written before.
    pub fn fresh(writes_per_commit: u64, value_bytes: usize) -> Self {
        Self::with_keys(writes_per_commit, value_bytes, StateKeys::Fresh)
    }

    fn with_keys(writes_per_commit: u64, value_bytes: usize, keys: StateKeys) -> Self {
        StateWorkload {
            writes_per_commit,
            value: vec![0xCD; value_bytes],
            keys,
            next_key: 0,
            applied_index: 0,
        }
    }

    /// The next commit: its writes and its applied index.
    pub fn next_commit(&mut self) -> (WriteSet, u64) {
        let mut writes = WriteSet::new();
        for _ in 0..self.writes_per_commit {
            let key = match self.keys {
                StateKeys::Cycled { key_space } => {
                    format!("session/{:08}", self.next_key % key_space)
                }
                StateKeys::Fresh => format!("session/{:016x}", scatter(self.next_key)),
            };
            writes
                .put(key.as_bytes(), &self.value)
                .expect("bounded key and value");
            self.next_key += 1;
        }
        self.applied_index += 1;
        (writes, self.applied_index)
    }
}

/// A bijection of `u64` that spreads consecutive inputs over the whole range (splitmix64's
/// finalizer): distinct inputs give distinct keys.
pub(crate) fn scatter(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys_of(workload: &mut StateWorkload, commits: usize) -> Vec<Vec<u8>> {
        (0..commits)
            .flat_map(|_| {
                let (writes, _) = workload.next_commit();
                writes
                    .iter()
                    .map(|(key, _)| key.to_vec())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn fresh_state_keys_never_repeat() {
        let keys = keys_of(&mut StateWorkload::fresh(100, 8), 30);
        let distinct: std::collections::HashSet<_> = keys.iter().collect();
        assert_eq!((keys.len(), distinct.len()), (3000, 3000));
    }

    #[test]
    fn cycled_state_keys_stay_within_their_space() {
        let keys = keys_of(&mut StateWorkload::new(1000, 8), 250);
        let distinct: std::collections::HashSet<_> = keys.iter().collect();
        assert_eq!((keys.len(), distinct.len()), (250_000, 100_000));
    }
}
