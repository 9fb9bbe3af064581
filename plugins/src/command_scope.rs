//! The writes of one command, kept apart until the command succeeds.

use concord_plugin_abi::KvStatus;

use crate::reserved_keys::{is_reserved_key, outside_reserved};
use concord_storage::{
    KeyRange, KeyValue, MAX_KEY_BYTES, MAX_VALUE_BYTES, StateTransaction, StorageResult, WriteSet,
};

/// One command's staged writes over the batch's transaction. Reads see the command's own
/// writes, then the transaction's. A command that fails is [`CommandScope::discard`]ed, so a
/// failed command leaves nothing behind: the same on every replica, for wasm and native alike.
#[derive(Default)]
pub(crate) struct CommandScope {
    writes: WriteSet,
}

impl CommandScope {
    pub(crate) fn get(
        &self,
        txn: &StateTransaction<'_>,
        key: &[u8],
    ) -> StorageResult<Option<Vec<u8>>> {
        if is_reserved_key(key) {
            return Ok(None);
        }
        match self.writes.get(key) {
            Some(staged) => Ok(staged.map(<[u8]>::to_vec)),
            None => txn.get(key),
        }
    }

    /// Stages a put, or refuses it (the command's fault) before anything is staged.
    pub(crate) fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), KvStatus> {
        check_key(key)?;
        if value.len() > MAX_VALUE_BYTES {
            return Err(KvStatus::ValueTooLarge);
        }
        self.writes
            .put(key, value)
            .map_err(|_| KvStatus::ValueTooLarge)
    }

    /// Stages a delete, or refuses it.
    pub(crate) fn delete(&mut self, key: &[u8]) -> Result<(), KvStatus> {
        check_key(key)?;
        self.writes.delete(key).map_err(|_| KvStatus::InvalidKey)
    }

    /// Up to `limit` pairs of `range`, the host's reserved keys left out.
    pub(crate) fn scan(
        &self,
        txn: &StateTransaction<'_>,
        range: &KeyRange,
        limit: usize,
    ) -> StorageResult<Vec<KeyValue>> {
        let mut pairs = Vec::new();
        for part in outside_reserved(range).into_iter().flatten() {
            let left = limit - pairs.len();
            if left == 0 {
                break;
            }
            pairs.extend(
                self.writes
                    .scan_over(&part, left, |base_limit| txn.scan(&part, base_limit))?,
            );
        }
        Ok(pairs)
    }

    /// Hands the command's writes to the transaction: the command succeeded.
    pub(crate) fn commit_into(&mut self, txn: &mut StateTransaction<'_>) {
        if !self.writes.is_empty() {
            txn.merge(&mut self.writes);
        }
    }

    /// Drops the command's writes: the command failed.
    pub(crate) fn discard(&mut self) {
        self.writes.clear();
    }
}

fn check_key(key: &[u8]) -> Result<(), KvStatus> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES || is_reserved_key(key) {
        return Err(KvStatus::InvalidKey);
    }
    Ok(())
}
