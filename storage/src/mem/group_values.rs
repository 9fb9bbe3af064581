//! [`GroupValues`]: one group's values in memory, in a hash map that is split into shards once
//! it is large, so that growing it never rehashes every value at once.
//!
//! A hash map grows by moving all its entries into a table twice the size, in one call: with
//! a million sessions that is a pause of a hundred milliseconds or more, taken under the
//! store's lock, during which no group can be read or written. Split into [`SHARDS`] maps,
//! each grows on its own. Shards of equal shares would all reach their next size together and
//! grow in one burst, which moves the pause into many consecutive commits instead of removing
//! it; so the shards' shares differ, spread evenly (geometrically) over one doubling, and
//! their growths spread evenly over the group's.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::BuildHasher;
use std::sync::LazyLock;

/// How the keys are hashed: foldhash, seeded per map (SipHash showed in the point read's
/// profile on short keys).
type Hasher = foldhash::fast::RandomState;

/// Entries past which one map is split into shards. Below it a group keeps a single map (most
/// groups stay small; a shard costs a map header even when empty).
const SPLIT_AT_ENTRIES: usize = 1 << 15;

/// Shards of a split map: a growth then moves about 1/180 of the group's entries at most.
const SHARDS: usize = 256;

/// Bits of a key's hash that pick its shard (through [`SHARD_OF_CELL`]).
const ROUTE_BITS: u32 = 12;

/// The shard of each of the `2^ROUTE_BITS` cells of the hash space: shard `i` takes the cells
/// `u` (as a fraction of the space) with `i <= SHARDS * log2(1 + u) < i + 1`, so that its share
/// is proportional to `2^(i / SHARDS)` — the largest twice the smallest, the sizes between
/// spread evenly over one doubling.
static SHARD_OF_CELL: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let cells = 1usize << ROUTE_BITS;
    (0..cells)
        .map(|cell| {
            let u = (cell as f64 + 0.5) / cells as f64;
            ((SHARDS as f64 * (1.0 + u).log2()) as usize).min(SHARDS - 1) as u8
        })
        .collect()
});

/// The values of one group, keyed by the key's bytes.
#[derive(Clone, Debug, Default)]
pub(super) struct GroupValues {
    /// One map, or [`SHARDS`] of them once the group held [`SPLIT_AT_ENTRIES`] entries. Each
    /// map is seeded apart from `router`: the keys of one shard share the top bits of the
    /// router's hash, not of their map's.
    shards: Vec<HashMap<Vec<u8>, Vec<u8>, Hasher>>,
    /// Picks a key's shard once the map is split.
    router: Hasher,
    /// Entries in all shards.
    len: usize,
}

impl GroupValues {
    /// The value of `key`.
    pub(super) fn get(&self, key: &[u8]) -> Option<&Vec<u8>> {
        self.shards.get(self.shard_of(key))?.get(key)
    }

    /// Sets `key` to `value`; hands back a copy of the key if it is new (for the caller's
    /// ordered index of keys), `None` if it replaced a value.
    pub(super) fn insert(&mut self, key: Vec<u8>, value: Vec<u8>) -> Option<Vec<u8>> {
        if self.shards.is_empty() {
            self.shards.push(HashMap::default());
        }
        let shard = self.shard_of(&key);
        let new_key = match self.shards[shard].entry(key) {
            Entry::Occupied(mut entry) => {
                entry.insert(value);
                return None;
            }
            Entry::Vacant(entry) => {
                let new_key = entry.key().clone();
                entry.insert(value);
                new_key
            }
        };
        self.len += 1;
        if self.shards.len() == 1 && self.len >= SPLIT_AT_ENTRIES {
            self.split();
        }
        Some(new_key)
    }

    /// Removes `key`'s value; `true` if it had one.
    pub(super) fn remove(&mut self, key: &[u8]) -> bool {
        self.take(key).is_some()
    }

    /// Takes `key`'s value out.
    pub(super) fn take(&mut self, key: &[u8]) -> Option<Vec<u8>> {
        let shard = self.shard_of(key);
        let value = self.shards.get_mut(shard)?.remove(key)?;
        self.len -= 1;
        Some(value)
    }

    /// Entries held.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Whether the map was split into shards.
    #[cfg(test)]
    fn is_split(&self) -> bool {
        self.shards.len() == SHARDS
    }

    fn shard_of(&self, key: &[u8]) -> usize {
        if self.shards.len() <= 1 {
            return 0;
        }
        let cell = self.router.hash_one(key) >> (u64::BITS - ROUTE_BITS);
        usize::from(SHARD_OF_CELL[cell as usize])
    }

    /// Moves the single map's entries into [`SHARDS`] maps: one pass over the group, once in
    /// its life. Each shard grows from empty, at its own sizes.
    fn split(&mut self) {
        let whole = std::mem::take(&mut self.shards).pop().unwrap_or_default();
        self.shards = (0..SHARDS).map(|_| HashMap::default()).collect();
        for (key, value) in whole {
            let shard = self.shard_of(&key);
            self.shards[shard].insert(key, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: usize) -> Vec<u8> {
        format!("session/{i:08}").into_bytes()
    }

    /// Past the split every entry is still found, replaced and removed in its shard, and the
    /// shards' shares spread over a factor of two.
    #[test]
    fn a_split_map_keeps_every_entry() {
        let mut values = GroupValues::default();
        let total = SPLIT_AT_ENTRIES * 3;
        for i in 0..total {
            assert_eq!(values.insert(key(i), vec![1]), Some(key(i)));
            if i + 1 < SPLIT_AT_ENTRIES {
                assert!(!values.is_split());
            }
        }
        assert!(values.is_split());
        assert_eq!(values.len(), total);
        for i in 0..total {
            assert_eq!(values.get(&key(i)), Some(&vec![1]), "key {i}");
        }
        // A replacement is not a new key.
        assert_eq!(values.insert(key(7), vec![2]), None);
        assert_eq!(values.get(&key(7)), Some(&vec![2]));
        assert!(values.remove(&key(7)));
        assert!(!values.remove(&key(7)));
        assert_eq!(values.take(&key(8)), Some(vec![1]));
        assert_eq!(values.take(&key(8)), None);
        assert_eq!(values.len(), total - 2);
        assert_eq!(values.get(&key(total)), None);
        let fair = total / SHARDS;
        for shard in &values.shards {
            assert!(
                shard.len() > fair / 2 && shard.len() < fair * 2,
                "{}",
                shard.len()
            );
        }
    }

    /// Every shard gets cells, in order, the last about twice as many as the first.
    #[test]
    fn the_route_covers_every_shard_once_in_order() {
        let mut cells = vec![0usize; SHARDS];
        for pair in SHARD_OF_CELL.windows(2) {
            assert!(pair[0] <= pair[1]);
        }
        for &shard in SHARD_OF_CELL.iter() {
            cells[usize::from(shard)] += 1;
        }
        assert!(cells.iter().all(|&n| n > 0), "{cells:?}");
        let (first, last): (usize, usize) = (cells[..16].iter().sum(), cells[240..].iter().sum());
        assert!(
            last * 10 > first * 18 && last * 10 < first * 22,
            "{first} {last}"
        );
    }

    #[test]
    fn an_empty_map_answers_without_shards() {
        let mut values = GroupValues::default();
        assert_eq!(values.get(b"k"), None);
        assert!(!values.remove(b"k"));
        assert_eq!(values.take(b"k"), None);
        assert_eq!(values.len(), 0);
    }
}
