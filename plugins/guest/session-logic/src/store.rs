//! The key-value space a session state machine works on.

use std::collections::BTreeMap;

/// The store refused a key or value (empty or oversized): the command's fault, the same on every
/// replica. Failures of the store itself never reach the logic: the host stops the group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreRejected(pub String);

/// One key and its value, as owned bytes.
pub type KeyValue = (Vec<u8>, Vec<u8>);

/// The group's ordered key-value data, as the current command sees it.
pub trait SessionStore {
    /// The value of `key`.
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreRejected>;
    /// Sets `key` to `value`.
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StoreRejected>;
    /// Removes `key`.
    fn delete(&mut self, key: &[u8]) -> Result<(), StoreRejected>;
    /// Up to `limit` pairs of `[start, end)` (no end if `None`), in key order.
    fn scan(
        &mut self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: u32,
    ) -> Result<Vec<KeyValue>, StoreRejected>;
}

/// A plain in-memory store, for tests and tools.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MapStore {
    /// The data.
    pub map: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl SessionStore for MapStore {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreRejected> {
        Ok(self.map.get(key).cloned())
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StoreRejected> {
        self.map.insert(key.to_vec(), value.to_vec());
        Ok(())
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), StoreRejected> {
        self.map.remove(key);
        Ok(())
    }

    fn scan(
        &mut self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: u32,
    ) -> Result<Vec<KeyValue>, StoreRejected> {
        Ok(self
            .map
            .range(start.to_vec()..)
            .take_while(|(key, _)| end.is_none_or(|end| key.as_slice() < end))
            .take(limit as usize)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
}
