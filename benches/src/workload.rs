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

/// Produces state commits of `writes_per_commit` puts of `value_bytes` each, cycling over a
/// bounded key space so the data set stays a fixed size.
pub struct StateWorkload {
    writes_per_commit: u64,
    value: Vec<u8>,
    key_space: u64,
    next_key: u64,
    applied_index: u64,
}

impl StateWorkload {
    /// A workload of `writes_per_commit` puts per commit.
    pub fn new(writes_per_commit: u64, value_bytes: usize) -> Self {
        StateWorkload {
            writes_per_commit,
            value: vec![0xCD; value_bytes],
            key_space: 100_000,
            next_key: 0,
            applied_index: 0,
        }
    }

    /// The next commit: its writes and its applied index.
    pub fn next_commit(&mut self) -> (WriteSet, u64) {
        let mut writes = WriteSet::new();
        for _ in 0..self.writes_per_commit {
            let key = format!("session/{:08}", self.next_key % self.key_space);
            writes
                .put(key.as_bytes(), &self.value)
                .expect("bounded key and value");
            self.next_key += 1;
        }
        self.applied_index += 1;
        (writes, self.applied_index)
    }
}
