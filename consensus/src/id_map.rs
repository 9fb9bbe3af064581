//! Hash maps keyed by group or node ids, with a hasher made for them.
//!
//! The standard SipHash protects against keys chosen to collide, which ids chosen by the
//! operator are not; on the proposal path it was a few percent of the CPU.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map from a `u64` id.
pub(crate) type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// Mixes one `u64` (a multiply and a shift spread consecutive ids over the buckets).
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u64(&mut self, id: u64) {
        let mixed = (self.0 ^ id).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = mixed ^ (mixed >> 32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_ids_land_in_distinct_buckets() {
        let mut map: IdMap<u64> = IdMap::default();
        for id in 0..10_000u64 {
            map.insert(id, id * 2);
        }
        assert_eq!(map.len(), 10_000);
        assert!((0..10_000u64).all(|id| map[&id] == id * 2));
    }
}
