//! Everything about one group's log except the entries themselves.

use raft::prelude::{ConfState, HardState};

use crate::{GroupId, StorageError, StorageResult};

/// The metadata of one group's log: what raft-rs's `initial_state`, `first_index`,
/// `last_index` and the term of the truncated index are answered from.
///
/// A group nobody wrote to has the default value: an empty log truncated at index 0 (term 0),
/// so its first index is 1 and its last index 0, as raft-rs expects of a new storage.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GroupLogState {
    /// Term, vote and commit index, as last written.
    pub hard_state: HardState,
    /// Voters and learners, as last written or taken from a snapshot.
    pub conf_state: ConfState,
    /// The log index of the configuration change that made `conf_state` (a snapshot's index
    /// after one; 0 for the configuration a group was created with): a change at or below it
    /// is already in `conf_state` and is not applied again when the log is replayed.
    pub conf_state_index: u64,
    /// Index of the last entry removed from the front of the log by compaction or a snapshot.
    pub truncated_index: u64,
    /// Term of the entry at `truncated_index`; kept so raft can match the log's predecessor.
    pub truncated_term: u64,
    /// Index of the last entry; equals `truncated_index` when the log holds no entry.
    pub last_index: u64,
}

impl GroupLogState {
    /// The first index that may be read: `truncated_index + 1`.
    pub fn first_index(&self) -> u64 {
        self.truncated_index + 1
    }

    /// Number of entries stored.
    pub fn entry_count(&self) -> u64 {
        self.last_index - self.truncated_index
    }
}

impl GroupLogState {
    /// Checks a read of `[low, high)` against the stored range, with the errors raft expects.
    pub(crate) fn check_range(&self, group: GroupId, low: u64, high: u64) -> StorageResult<()> {
        if low > high {
            return Err(StorageError::invalid(format!(
                "group {group}: range [{low}, {high}) is reversed"
            )));
        }
        if low < self.first_index() {
            return Err(StorageError::Compacted {
                group,
                index: low,
                first_index: self.first_index(),
            });
        }
        if high > self.last_index + 1 {
            return Err(StorageError::Unavailable {
                group,
                index: high - 1,
                last_index: self.last_index,
            });
        }
        Ok(())
    }

    /// The term of `index` if the metadata alone answers it (the truncated index), `None` if
    /// it must be read from a stored entry, or the typed miss for an index outside the log.
    pub(crate) fn term_from_metadata(
        &self,
        group: GroupId,
        index: u64,
    ) -> StorageResult<Option<u64>> {
        if index == self.truncated_index {
            return Ok(Some(self.truncated_term));
        }
        if index < self.truncated_index {
            return Err(StorageError::Compacted {
                group,
                index,
                first_index: self.first_index(),
            });
        }
        if index > self.last_index {
            return Err(StorageError::Unavailable {
                group,
                index,
                last_index: self.last_index,
            });
        }
        Ok(None)
    }
}

/// Keeps entries while their total encoded size stays within `max_bytes`, but always at least
/// one: raft-rs's rule for `Storage::entries`.
pub(crate) struct SizeBudget {
    max_bytes: Option<u64>,
    used_bytes: u64,
    taken: usize,
}

impl SizeBudget {
    pub(crate) fn new(max_bytes: Option<u64>) -> Self {
        SizeBudget {
            max_bytes,
            used_bytes: 0,
            taken: 0,
        }
    }

    /// Whether an entry of `entry_bytes` still fits; counts it if so.
    pub(crate) fn take(&mut self, entry_bytes: u64) -> bool {
        self.used_bytes += entry_bytes;
        let fits = match self.max_bytes {
            None => true,
            Some(max) => self.taken == 0 || self.used_bytes <= max,
        };
        if fits {
            self.taken += 1;
        }
        fits
    }
}
