//! Staged puts and deletes of one state-store transaction.

use std::collections::HashMap;

use crate::{KeyRange, KeyValue, StorageError, StorageResult};

/// Staged writes by key: `Some(value)` is a put, `None` a delete.
type StagedWrites = HashMap<Vec<u8>, Option<Vec<u8>>, foldhash::fast::RandomState>;

/// Largest key the state store accepts, in bytes.
pub const MAX_KEY_BYTES: usize = 16 * 1024;
/// Largest value the state store accepts, in bytes.
pub const MAX_VALUE_BYTES: usize = 16 * 1024 * 1024;

/// Puts and deletes to commit together; a later write to a key replaces an earlier one.
/// Backends receive a `WriteSet` in [`crate::StateStore::commit`] and read it in key order.
///
/// The writes live in a hash map, sorted only when they are read in order (at commit, or for
/// a scan): a state machine looks a staged key up several times per command (its own reads,
/// then the write), and keys that share a long prefix (`session/dev/0000…`) made every step of
/// an ordered tree a long byte comparison.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteSet {
    writes: StagedWrites,
}

impl WriteSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty set with room for `writes` distinct keys before it grows: a caller that knows
    /// about how many writes are coming (one per command of a batch) saves the map's regrowth.
    pub fn with_capacity(writes: usize) -> Self {
        WriteSet {
            writes: StagedWrites::with_capacity_and_hasher(writes, Default::default()),
        }
    }

    /// Stages `key = value`. Keys must be 1 to [`MAX_KEY_BYTES`] bytes, values at most
    /// [`MAX_VALUE_BYTES`].
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> StorageResult<()> {
        check_write(key, Some(value))?;
        self.writes.insert(key.to_vec(), Some(value.to_vec()));
        Ok(())
    }

    /// Stages the removal of `key`.
    pub fn delete(&mut self, key: &[u8]) -> StorageResult<()> {
        check_key(key)?;
        self.writes.insert(key.to_vec(), None);
        Ok(())
    }

    /// The staged write for `key`: `Some(Some(v))` put, `Some(None)` deleted, `None` untouched.
    pub fn get(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        self.writes.get(key).map(|value| value.as_deref())
    }

    /// Moves every write of `other` into this set; `other`'s writes win. `other` is left
    /// empty with its capacity kept, ready to stage the next command's writes without growing
    /// a new map.
    pub fn merge(&mut self, other: &mut WriteSet) {
        self.writes.extend(other.writes.drain());
    }

    /// Drops every staged write, keeping the capacity.
    pub fn clear(&mut self) {
        self.writes.clear();
    }

    /// Number of staged writes.
    pub fn len(&self) -> usize {
        self.writes.len()
    }

    /// `true` when nothing is staged.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// The staged writes in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        let mut sorted: Vec<(&[u8], Option<&[u8]>)> = self
            .writes
            .iter()
            .map(|(k, v)| (k.as_slice(), v.as_deref()))
            .collect();
        sorted.sort_unstable_by(|a, b| a.0.cmp(b.0));
        sorted.into_iter()
    }

    /// The staged writes in no particular order, for a reader that looks at each alone and
    /// should not pay for the sort.
    pub fn iter_unordered(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        self.writes
            .iter()
            .map(|(key, value)| (key.as_slice(), value.as_deref()))
    }

    /// Takes the staged writes out in key order.
    pub fn into_writes(self) -> impl Iterator<Item = (Vec<u8>, Option<Vec<u8>>)> {
        let mut sorted: Vec<(Vec<u8>, Option<Vec<u8>>)> = self.writes.into_iter().collect();
        sorted.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        sorted.into_iter()
    }

    /// Takes the staged writes out in no particular order, for a backend that does not care
    /// (a hash map) and should not pay for the sort.
    pub fn into_writes_unordered(self) -> impl Iterator<Item = (Vec<u8>, Option<Vec<u8>>)> {
        self.writes.into_iter()
    }

    /// Scans `range` as it would read after this set commits on top of a base store.
    ///
    /// `base_scan(n)` must return up to `n` committed pairs of the range in key order. Each
    /// staged delete can hide at most one base pair, so asking the base for `limit` plus the
    /// number of staged writes in the range always yields enough pairs.
    pub fn scan_over(
        &self,
        range: &KeyRange,
        limit: usize,
        base_scan: impl FnOnce(usize) -> StorageResult<Vec<KeyValue>>,
    ) -> StorageResult<Vec<KeyValue>> {
        if limit == 0 || range.is_empty() {
            return Ok(Vec::new());
        }
        let mut staged: Vec<(&Vec<u8>, &Option<Vec<u8>>)> = self
            .writes
            .iter()
            .filter(|(key, _)| range.contains(key))
            .collect();
        staged.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let base = base_scan(limit.saturating_add(staged.len()))?;
        let staged = staged
            .into_iter()
            .map(|(k, v)| (k.as_slice(), v.as_deref()));
        Ok(merge_over(staged, base, limit))
    }
}

/// The first `limit` pairs of `staged` writes (in key order; `None` a delete) laid over the
/// committed `base` pairs (in key order): a staged write replaces or hides its key's pair.
pub(crate) fn merge_over<'a>(
    staged: impl IntoIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
    base: Vec<KeyValue>,
    limit: usize,
) -> Vec<KeyValue> {
    let mut out = Vec::with_capacity(limit.min(base.len()));
    let mut base = base.into_iter().peekable();
    let mut staged = staged.into_iter().peekable();
    while out.len() < limit {
        let take_staged = match (base.peek(), staged.peek()) {
            (None, None) => break,
            (Some(_), None) => false,
            (None, Some(_)) => true,
            (Some((base_key, _)), Some((staged_key, _))) => {
                if base_key.as_slice() == *staged_key {
                    base.next(); // The staged write replaces the committed value.
                    true
                } else {
                    *staged_key < base_key.as_slice()
                }
            }
        };
        if take_staged {
            let (key, value) = staged.next().expect("peeked");
            if let Some(value) = value {
                out.push((key.to_vec(), value.to_vec()));
            }
        } else {
            out.push(base.next().expect("peeked"));
        }
    }
    out
}

/// Checks a put (`Some(value)`) or a delete (`None`) of `key` against the limits
/// [`WriteSet::put`] and [`WriteSet::delete`] state.
pub(crate) fn check_write(key: &[u8], value: Option<&[u8]>) -> StorageResult<()> {
    check_key(key)?;
    if let Some(value) = value
        && value.len() > MAX_VALUE_BYTES
    {
        return Err(StorageError::TooLarge {
            what: "value",
            actual_bytes: value.len(),
            limit_bytes: MAX_VALUE_BYTES,
        });
    }
    Ok(())
}

fn check_key(key: &[u8]) -> StorageResult<()> {
    if key.is_empty() {
        return Err(StorageError::invalid("keys must not be empty"));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(StorageError::TooLarge {
            what: "key",
            actual_bytes: key.len(),
            limit_bytes: MAX_KEY_BYTES,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(k: &str, v: &str) -> KeyValue {
        (k.as_bytes().to_vec(), v.as_bytes().to_vec())
    }

    #[test]
    fn scan_over_merges_puts_and_hides_deletes() {
        let base = [kv("a", "1"), kv("b", "2"), kv("c", "3"), kv("d", "4")];
        let mut set = WriteSet::new();
        set.delete(b"a").unwrap();
        set.put(b"bb", b"new").unwrap();
        set.put(b"c", b"33").unwrap();
        let scan = |limit: usize| -> StorageResult<Vec<KeyValue>> {
            Ok(base.iter().take(limit).cloned().collect())
        };
        let got = set.scan_over(&KeyRange::all(), 3, scan).unwrap();
        assert_eq!(got, vec![kv("b", "2"), kv("bb", "new"), kv("c", "33")]);
    }

    #[test]
    fn keys_and_values_are_bounded() {
        let mut set = WriteSet::new();
        assert!(set.put(b"", b"v").is_err());
        assert!(set.put(&vec![0; MAX_KEY_BYTES + 1], b"v").is_err());
        assert!(set.put(b"k", &vec![0; MAX_VALUE_BYTES + 1]).is_err());
        assert!(set.is_empty());
    }
}
