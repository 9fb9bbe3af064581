//! [`KeyFilter`]: which keys a set certainly does not hold, so that a read of a key never
//! written (a create checking that its key is new) need not search a disk-backed tree.
//!
//! Blocked Bloom filters: a key's bits all lie in one 64-byte block of a layer, so asking a
//! layer reads one cache line. It answers "absent" only for keys never inserted; about one
//! absent key in a hundred per layer gets "maybe" instead.
//!
//! A filter grows without reading its keys again: when its newest layer holds as many keys as
//! it was sized for, a new layer, twice the size of all before it, takes the keys from then on,
//! and a lookup asks every layer. After [`MAX_LAYERS`] layers the filter says it is full and its
//! owner builds a new one from the keys there are (which also forgets keys deleted since).
//! Growing by layers keeps that full read to one per [`MAX_LAYERS`] doublings or so of a
//! group's keys, instead of one per doubling, for one more cache line per lookup per layer.

use std::hash::BuildHasher;

/// Filter bits per key a layer is sized for: about 1% of absent keys answered "maybe".
const BITS_PER_KEY: usize = 12;

/// Bits set per key, each in the key's block.
const PROBES: u32 = 6;

/// Keys a layer is sized for at least.
const MIN_CAPACITY_KEYS: usize = 1024;

/// Layers a filter grows to before it says it is full: each is asked by every lookup of an
/// absent key, and each adds its share of "maybe"s.
const MAX_LAYERS: usize = 3;

/// The hash of a key: fixed, so that a filter means the same thing whenever it is read.
const HASH_SEED: u64 = 0x6b65_795f_6669_6c74;

/// A set of keys that answers [`KeyFilter::may_contain`] with `false` only for keys never
/// inserted.
pub(crate) struct KeyFilter {
    /// The full layers, oldest first.
    older: Vec<Layer>,
    /// The layer keys go into.
    newest: Layer,
}

/// One blocked Bloom filter of a [`KeyFilter`].
struct Layer {
    /// 512 bits each.
    blocks: Vec<[u64; 8]>,
    /// Keys inserted here.
    keys: usize,
    /// Keys it is sized for.
    capacity_keys: usize,
}

impl KeyFilter {
    /// An empty filter sized for `capacity_keys` keys before it adds a layer.
    fn with_capacity(capacity_keys: usize) -> KeyFilter {
        KeyFilter {
            older: Vec::new(),
            newest: Layer::with_capacity(capacity_keys),
        }
    }

    /// A filter holding the keys whose [`key_hash`]es are given, sized for twice as many
    /// before it adds a layer.
    pub(crate) fn from_hashes(hashes: &[u64]) -> KeyFilter {
        let mut filter = KeyFilter::with_capacity(2 * hashes.len());
        for &hash in hashes {
            filter.insert_hash(hash);
        }
        filter
    }

    /// `false` only if `key` was never inserted.
    pub(crate) fn may_contain(&self, key: &[u8]) -> bool {
        self.may_contain_hash(key_hash(key))
    }

    fn may_contain_hash(&self, hash: u64) -> bool {
        self.newest.may_contain(hash) || self.older.iter().any(|layer| layer.may_contain(hash))
    }

    /// Adds `key`.
    pub(crate) fn insert(&mut self, key: &[u8]) {
        self.insert_hash(key_hash(key));
    }

    /// Adds the key whose [`key_hash`] this is, unless the filter answers "maybe" for it
    /// already (then it stays so: bits are never cleared).
    fn insert_hash(&mut self, hash: u64) {
        if self.may_contain_hash(hash) {
            return;
        }
        if self.newest.is_full() && self.layer_count() < MAX_LAYERS {
            let capacity_keys: usize = self.newest.capacity_keys
                + self
                    .older
                    .iter()
                    .map(|layer| layer.capacity_keys)
                    .sum::<usize>();
            let full = std::mem::replace(&mut self.newest, Layer::with_capacity(2 * capacity_keys));
            self.older.push(full);
        }
        self.newest.insert(hash);
    }

    /// It has all its layers and the last holds more keys than it was sized for: its answers
    /// are getting worse (never wrong), and a filter built from the keys there are would do
    /// better.
    pub(crate) fn is_full(&self) -> bool {
        self.layer_count() == MAX_LAYERS && self.newest.is_full()
    }

    /// Keys inserted (those it answered "maybe" for before, not at all).
    #[cfg(test)]
    fn keys(&self) -> usize {
        self.newest.keys + self.older.iter().map(|layer| layer.keys).sum::<usize>()
    }

    fn layer_count(&self) -> usize {
        self.older.len() + 1
    }
}

impl Layer {
    fn with_capacity(capacity_keys: usize) -> Layer {
        let capacity_keys = capacity_keys.max(MIN_CAPACITY_KEYS);
        let blocks = (capacity_keys * BITS_PER_KEY).div_ceil(512);
        Layer {
            blocks: vec![[0; 8]; blocks],
            keys: 0,
            capacity_keys,
        }
    }

    fn may_contain(&self, hash: u64) -> bool {
        let (block, bits) = self.locate(hash);
        let block = &self.blocks[block];
        bits.into_iter()
            .all(|(word, bit)| block[word] & (1 << bit) != 0)
    }

    fn insert(&mut self, hash: u64) {
        let (block, bits) = self.locate(hash);
        let block = &mut self.blocks[block];
        for (word, bit) in bits {
            block[word] |= 1 << bit;
        }
        self.keys += 1;
    }

    fn is_full(&self) -> bool {
        self.keys > self.capacity_keys
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
    fn a_filter_grows_by_layers_then_says_it_is_full_and_still_finds_every_key() {
        let mut filter = KeyFilter::with_capacity(0);
        for n in 0..MIN_CAPACITY_KEYS {
            filter.insert(&key(n));
        }
        assert_eq!(filter.layer_count(), 1);
        // Layers of 1024, 2048 and 6144 keys.
        for n in MIN_CAPACITY_KEYS..9_000 {
            filter.insert(&key(n));
        }
        assert_eq!(filter.layer_count(), MAX_LAYERS);
        assert!(!filter.is_full());
        for n in 9_000..10_000 {
            filter.insert(&key(n));
        }
        assert_eq!(filter.layer_count(), MAX_LAYERS);
        assert!(filter.is_full());
        assert!((0..10_000).all(|n| filter.may_contain(&key(n))));
    }

    #[test]
    fn a_filter_of_several_layers_answers_maybe_for_few_absent_keys() {
        let mut filter = KeyFilter::with_capacity(0);
        for n in 0..9_000 {
            filter.insert(&key(n));
        }
        assert_eq!(filter.layer_count(), MAX_LAYERS);
        let false_maybes = (10_000..110_000)
            .filter(|&n| filter.may_contain(&key(n)))
            .count();
        // At most about 1% a layer; 3.5% would mean a layer is off or the layers' answers
        // depend on each other.
        assert!(false_maybes < 3_500, "{false_maybes} of 100000 absent keys");
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
    fn a_filter_built_from_hashes_holds_their_keys_and_room_for_as_many_more_in_its_first_layer() {
        let hashes: Vec<u64> = (0..5_000).map(|n| key_hash(&key(n))).collect();
        let mut filter = KeyFilter::from_hashes(&hashes);
        assert!((0..5_000).all(|n| filter.may_contain(&key(n))));
        for n in 5_000..9_000 {
            filter.insert(&key(n));
        }
        assert!(!filter.is_full());
        assert_eq!(filter.layer_count(), 1);
        for n in 9_000..12_000 {
            filter.insert(&key(n));
        }
        assert_eq!(filter.layer_count(), 2);
        assert!(!filter.is_full());
        assert!((0..12_000).all(|n| filter.may_contain(&key(n))));
    }
}
