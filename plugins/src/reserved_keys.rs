//! Keys of a group's state that belong to the host, not to its plugin: the record of which
//! plugin the data was written by ([`crate::plugin_identity`]) lives there. Plugins cannot
//! read, write or scan them, and reads through the engine refuse them, so the record travels
//! with the data (in snapshots, in the same commit as the applied index) without a plugin
//! being able to change it.

use std::ops::Bound;

use concord_storage::KeyRange;

/// Every key that begins with these bytes is the host's. `0xff` never starts UTF-8 text.
pub const RESERVED_KEY_PREFIX: &[u8] = b"\xff\xffconcord/";

/// The first key after the reserved ones.
const AFTER_RESERVED: &[u8] = b"\xff\xffconcord0";

/// Whether `key` is one of the host's.
pub fn is_reserved_key(key: &[u8]) -> bool {
    key.starts_with(RESERVED_KEY_PREFIX)
}

/// The parts of `range` below and above the reserved keys, in key order (either may be
/// empty, then `None`).
pub(crate) fn outside_reserved(range: &KeyRange) -> [Option<KeyRange>; 2] {
    let end_below = match &range.end {
        Bound::Included(end) | Bound::Excluded(end) if end.as_slice() < RESERVED_KEY_PREFIX => {
            range.end.clone()
        }
        _ => Bound::Excluded(RESERVED_KEY_PREFIX.to_vec()),
    };
    let start_above = match &range.start {
        Bound::Included(start) | Bound::Excluded(start) if start.as_slice() >= AFTER_RESERVED => {
            range.start.clone()
        }
        _ => Bound::Included(AFTER_RESERVED.to_vec()),
    };
    let below = KeyRange {
        start: range.start.clone(),
        end: end_below,
    };
    let above = KeyRange {
        start: start_above,
        end: range.end.clone(),
    };
    [below, above].map(|part| (!part.is_empty()).then_some(part))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys_in(parts: &[Option<KeyRange>; 2], keys: &[&[u8]]) -> Vec<Vec<u8>> {
        keys.iter()
            .filter(|key| parts.iter().flatten().any(|part| part.contains(key)))
            .map(|key| key.to_vec())
            .collect()
    }

    #[test]
    fn the_parts_hold_every_key_of_the_range_but_the_reserved_ones() {
        let keys: [&[u8]; 7] = [
            b"a",
            b"\xff",
            b"\xff\xffconcord",
            b"\xff\xffconcord/plugin",
            b"\xff\xffconcord/",
            b"\xff\xffconcord0",
            b"\xff\xff\xff",
        ];
        let ranges = [
            KeyRange::all(),
            KeyRange::from(b"\xff\xffconcord/m"),
            KeyRange::between(b"a", b"\xff\xffconcord/z"),
            KeyRange::prefix(b"\xff\xff"),
            KeyRange::prefix(b"a"),
            KeyRange::prefix(RESERVED_KEY_PREFIX),
        ];
        for range in ranges {
            let parts = outside_reserved(&range);
            let expected: Vec<Vec<u8>> = keys
                .iter()
                .filter(|key| range.contains(key) && !is_reserved_key(key))
                .map(|key| key.to_vec())
                .collect();
            assert_eq!(keys_in(&parts, &keys), expected, "{range:?}");
        }
        assert_eq!(
            outside_reserved(&KeyRange::prefix(RESERVED_KEY_PREFIX)),
            [None, None]
        );
    }
}
