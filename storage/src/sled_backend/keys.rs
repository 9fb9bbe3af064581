//! Key layouts inside the sled trees. A one-byte tag keeps metadata and data apart; integers
//! are big-endian so byte order is numeric order.

use crate::GroupId;

/// Tag of per-group metadata keys (log metadata, applied index).
pub(super) const TAG_META: u8 = 0;
/// Tag of data keys (log entries, state pairs).
pub(super) const TAG_DATA: u8 = 1;

/// `TAG_META | group`.
pub(super) fn meta_key(group: GroupId) -> [u8; 9] {
    let mut key = [0u8; 9];
    key[0] = TAG_META;
    key[1..].copy_from_slice(&group.to_be_bytes());
    key
}

/// `TAG_DATA | group`: the prefix of all of a group's data keys.
pub(super) fn data_prefix(group: GroupId) -> [u8; 9] {
    let mut key = meta_key(group);
    key[0] = TAG_DATA;
    key
}

/// `TAG_DATA | group | index`: a log entry.
pub(super) fn entry_key(group: GroupId, index: u64) -> [u8; 17] {
    let mut key = [0u8; 17];
    key[..9].copy_from_slice(&data_prefix(group));
    key[9..].copy_from_slice(&index.to_be_bytes());
    key
}

/// Splits a key of `len` bytes after the tag into `(group, rest)`; `None` if it is too short.
pub(super) fn split_group(key: &[u8]) -> Option<(GroupId, &[u8])> {
    let group = u64::from_be_bytes(key.get(1..9)?.try_into().ok()?);
    Some((group, &key[9..]))
}

/// `TAG_DATA | group | user key`: a state pair.
pub(super) fn state_key(group: GroupId, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + key.len());
    out.extend_from_slice(&data_prefix(group));
    out.extend_from_slice(key);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_keys_sort_by_group_then_index_under_the_group_prefix() {
        assert_eq!(&entry_key(1, 2)[..9], &data_prefix(1));
        assert!(entry_key(1, 255) < entry_key(1, 256));
        assert!(entry_key(1, u64::MAX) < entry_key(2, 0));
        assert_eq!(split_group(&state_key(7, b"k")), Some((7, &b"k"[..])));
        assert_eq!(split_group(&[1, 2]), None);
    }
}
