//! [`KeyFilter`]: which keys a set certainly does not hold, so that a read of a key never
//! written (a create checking that its key is new) need not search a disk-backed tree.
//!
//! A blocked Bloom filter: a key's bits all lie in one 64-byte block, so a lookup reads one
//! cache line. It answers "absent" only for keys never inserted; about one absent key in a
//! hundred, more once the filter holds more keys than it was sized for, gets "maybe" instead.

use std::hash::BuildHasher;

/// Filter bits per key it is sized for: about 1% of absent keys answered "maybe".
const BITS_PER_KEY: usize = 12;

/// Bits set per key, each in the key's block.
const PROBES: u32 = 6;

/// Keys a filter is sized for at least.
const MIN_CAPACITY_KEYS: usize = 1024;

/// The hash of a key: fixed, so that a filter means the same thing whenever it is read.
const HASH_SEED: u64 = 0x6b65_795f_6669_6c74;

/// A set of keys that answers [`KeyFilter::may_contain`] with `false` only for keys never
/// inserted.
pub(crate) struct KeyFilter {
    /// 512 bits each.
    blocks: Vec<[u64; 8]>,
    /// Keys inserted that the filter did not already answer "maybe" for.
    keys: usize,
    /// Keys it is sized for.
    capacity_keys: usize,
}

impl KeyFilter {
    /// An empty filter sized for `capacity_keys` keys.
    fn with_capacity(capacity_keys: usize) -> KeyFilter {
        let capacity_keys = capacity_keys.max(MIN_CAPACITY_KEYS);
        let blocks = (capacity_keys * BITS_PER_KEY).div_ceil(512);
        KeyFilter {
            blocks: vec![[0; 8]; blocks],
            keys: 0,
            capacity_keys,
        }
    }

    /// A filter holding the keys whose [`key_hash`]es are given, sized for twice as many.
    pub(crate) fn from_hashes(hashes: &[u64]) -> KeyFilter {
        let mut filter = KeyFilter::with_capacity(2 * hashes.len());
        for &hash in hashes {
            filter.insert_hash(hash);
        }
        filter
    }

    /// `false` only if `key` was never inserted.
    pub(crate) fn may_contain(&self, key: &[u8]) -> bool {
        let (block, bits) = self.locate(key_hash(key));
        let block = &self.blocks[block];
        bits.into_iter()
            .all(|(word, bit)| block[word] & (1 << bit) != 0)
    }

    /// Adds `key`.
    pub(crate) fn insert(&mut self, key: &[u8]) {
        self.insert_hash(key_hash(key));
    }

    /// Adds the key whose [`key_hash`] this is.
    fn insert_hash(&mut self, hash: u64) {
        let (block, bits) = self.locate(hash);
        let block = &mut self.blocks[block];
        let mut new = false;
        for (word, bit) in bits {
            new |= block[word] & (1 << bit) == 0;
            block[word] |= 1 << bit;
        }
        if new {
            self.keys += 1;
        }
    }

    /// It holds more keys than it was sized for: its answers are getting worse (never wrong).
    pub(crate) fn is_full(&self) -> bool {
        self.keys > self.capacity_keys
    }

    /// Keys inserted (those it answered "maybe" for before counted once or not at all).
    #[cfg(test)]
    fn keys(&self) -> usize {
        self.keys
    }

    /// The block of the key whose hash this is, and its bits there (word, bit).
    fn locate(&self, hash: u64) -> (usize, [(usize, u32); PROBES as usize]) {
        // The high half picks the block (multiply-shift: no modulo bias worth the name), the
        // low half, mixed, the bits inside it: 9 bits per probe.
        let block = (((hash >> 32) * self.blocks.len() as u64) >> 32) as usize;
        let mut bits_source = (hash as u32 as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut bits = [(0, 0); PROBES as usize];
        for slot in &mut bits {
            let bit = (bits_source & 511) as u32;
            *slot = ((bit / 64) as usize, bit % 64);
            bits_source >>= 9;
        }
        (block, bits)
    }
}

/// The hash a filter places a key by.
pub(crate) fn key_hash(key: &[u8]) -> u64 {
    foldhash::quality::FixedState::with_seed(HASH_SEED).hash_one(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: usize) -> Vec<u8> {
        format!("s/client-{n:08}").into_bytes()
    }

    #[test]
    fn every_key_inserted_may_be_there_and_few_others_seem_to_be() {
        let mut filter = KeyFilter::with_capacity(10_000);
        for n in 0..10_000 {
            filter.insert(&key(n));
        }
        assert!((0..10_000).all(|n| filter.may_contain(&key(n))));
        assert!(!filter.is_full());
        let false_maybes = (10_000..110_000)
            .filter(|&n| filter.may_contain(&key(n)))
            .count();
        // Sized for about 1%; 3% would mean the hash or the block choice is off.
        assert!(false_maybes < 3_000, "{false_maybes} of 100000 absent keys");
    }

    #[test]
    fn a_filter_past_its_size_says_so_and_still_finds_every_key() {
        let mut filter = KeyFilter::with_capacity(0);
        for n in 0..MIN_CAPACITY_KEYS {
            filter.insert(&key(n));
        }
        assert!(!filter.is_full());
        for n in MIN_CAPACITY_KEYS..4 * MIN_CAPACITY_KEYS {
            filter.insert(&key(n));
        }
        assert!(filter.is_full());
        assert!((0..4 * MIN_CAPACITY_KEYS).all(|n| filter.may_contain(&key(n))));
    }

    #[test]
    fn inserting_a_key_twice_counts_it_once() {
        let mut filter = KeyFilter::with_capacity(100);
        filter.insert(b"a");
        filter.insert(b"a");
        assert_eq!(filter.keys(), 1);
        assert!(!KeyFilter::with_capacity(100).may_contain(b"a"));
    }

    #[test]
    fn a_filter_built_from_hashes_holds_their_keys_and_room_for_as_many_more() {
        let hashes: Vec<u64> = (0..5_000).map(|n| key_hash(&key(n))).collect();
        let mut filter = KeyFilter::from_hashes(&hashes);
        assert!((0..5_000).all(|n| filter.may_contain(&key(n))));
        for n in 5_000..9_000 {
            filter.insert(&key(n));
        }
        assert!(!filter.is_full());
        for n in 9_000..12_000 {
            filter.insert(&key(n));
        }
        assert!(filter.is_full());
    }
}
