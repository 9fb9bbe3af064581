//! Which group a key belongs to.

use concord_storage::GroupId;

/// The group of `key` among `groups` groups (numbered `0..groups`): FNV-1a of the key, modulo
/// the count. The function is part of the data format: a key must route to the same group in
/// every version and on every node, so it is spelled out here rather than borrowed from a
/// hasher whose output may change.
pub fn group_of(key: &[u8], groups: u32) -> GroupId {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET_BASIS;
    for &byte in key {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(PRIME);
    }
    hash % u64::from(groups.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_is_fixed_and_spreads_keys() {
        // Pinned values: changing them would move existing data to other groups.
        assert_eq!(group_of(b"", 1000), 0xcbf2_9ce4_8422_2325 % 1000);
        assert_eq!(
            group_of(b"a", u32::MAX),
            0xaf63_dc4c_8601_ec8c % u64::from(u32::MAX)
        );
        let mut counts = [0u32; 8];
        for n in 0..8000 {
            counts[group_of(format!("dev/{n}").as_bytes(), 8) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (800..1200).contains(&c)),
            "{counts:?}"
        );
    }
}
