//! The metadata of the redb log's groups, stored in buckets of `GROUPS_PER_BUCKET` groups
//! (a group's bucket is `group / GROUPS_PER_BUCKET`), so that a write that touched a
//! thousand groups inserts a few keys into redb rather than a thousand: each insert is a walk
//! down the table's B-tree and a leaf rewritten, and a write of many groups paid for them one
//! by one.
//!
//! ```text
//! bucket := version u8 | state_count u32 | state*      (groups in ascending order)
//! state  := group u64 | len u32 | encoded GroupLogState (its own CRC: codec.rs)
//! ```
//!
//! The log keeps every group's encoded metadata in memory (a few dozen bytes a group): a
//! bucket is written whole from it, never read back from the file.

use std::collections::HashMap;
use std::ops::Range;

use crate::GroupId;

/// A group and where its new metadata is in [`MetadataUpdates::bytes`].
pub(super) type GroupUpdate = (GroupId, Range<usize>);

/// Groups whose metadata share a bucket.
pub(super) const GROUPS_PER_BUCKET: u64 = 64;

const VERSION: u8 = 1;

/// The bucket holding `group`'s metadata.
pub(super) fn bucket_of(group: GroupId) -> u64 {
    group / GROUPS_PER_BUCKET
}

/// Every group's encoded metadata as the file holds it, by bucket.
#[derive(Debug, Default)]
pub(super) struct GroupBuckets {
    /// Per bucket: `(group, encoded metadata)`, sorted by group.
    buckets: HashMap<u64, Vec<(GroupId, Vec<u8>)>, foldhash::fast::RandomState>,
}

/// New metadata for some groups, encoded into one buffer: `(group, range in bytes)`, sorted
/// by group once [`MetadataUpdates::sort`] ran. Kept from write to write with its room.
#[derive(Debug, Default)]
pub(super) struct MetadataUpdates {
    pub(super) bytes: Vec<u8>,
    groups: Vec<GroupUpdate>,
    /// One group's metadata as its encoder writes it (an encoder may clear its buffer).
    scratch: Vec<u8>,
}

impl MetadataUpdates {
    pub(super) fn clear(&mut self) {
        self.bytes.clear();
        self.groups.clear();
    }

    /// Adds `group`'s metadata, as `encode` writes it into an empty buffer.
    pub(super) fn push(&mut self, group: GroupId, encode: impl FnOnce(&mut Vec<u8>)) {
        self.scratch.clear();
        encode(&mut self.scratch);
        let start = self.bytes.len();
        self.bytes.extend_from_slice(&self.scratch);
        self.groups.push((group, start..self.bytes.len()));
    }

    /// Orders the groups (a batch lists them in the order it touched them).
    pub(super) fn sort(&mut self) {
        self.groups.sort_unstable_by_key(|(group, _)| *group);
    }

    /// The sorted updates, split into runs of one bucket each.
    pub(super) fn by_bucket(&self) -> impl Iterator<Item = (u64, &[GroupUpdate])> {
        self.groups
            .chunk_by(|(a, _), (b, _)| bucket_of(*a) == bucket_of(*b))
            .map(|run| (bucket_of(run[0].0), run))
    }
}

impl GroupBuckets {
    /// Records `group`'s metadata as loaded from the file.
    pub(super) fn insert(&mut self, group: GroupId, encoded: &[u8]) {
        set(
            self.buckets.entry(bucket_of(group)).or_default(),
            group,
            encoded,
        );
    }

    /// Writes into `out` the bucket `bucket` as it is with `updates` (sorted, all of that
    /// bucket, ranges into `bytes`) applied.
    pub(super) fn encode_updated(
        &self,
        bucket: u64,
        updates: &[GroupUpdate],
        bytes: &[u8],
        out: &mut Vec<u8>,
    ) {
        let empty = Vec::new();
        let current = self.buckets.get(&bucket).unwrap_or(&empty);
        out.clear();
        out.push(VERSION);
        out.extend_from_slice(&0u32.to_le_bytes());
        let mut count = 0u32;
        let mut put = |group: GroupId, state: &[u8]| {
            out.extend_from_slice(&group.to_le_bytes());
            out.extend_from_slice(&(state.len() as u32).to_le_bytes());
            out.extend_from_slice(state);
            count += 1;
        };
        // A merge of two sorted lists; an update replaces the current state of its group.
        let (mut old, mut new) = (current.iter().peekable(), updates.iter().peekable());
        loop {
            match (old.peek(), new.peek()) {
                (Some((old_group, state)), Some((new_group, _))) if old_group < new_group => {
                    put(*old_group, state);
                    old.next();
                }
                (Some((old_group, _)), Some((new_group, range))) => {
                    if old_group == new_group {
                        old.next();
                    }
                    put(*new_group, &bytes[range.clone()]);
                    new.next();
                }
                (Some((old_group, state)), None) => {
                    put(*old_group, state);
                    old.next();
                }
                (None, Some((new_group, range))) => {
                    put(*new_group, &bytes[range.clone()]);
                    new.next();
                }
                (None, None) => break,
            }
        }
        out[1..5].copy_from_slice(&count.to_le_bytes());
    }

    /// Takes `updates` in (once the file holds them).
    pub(super) fn apply(&mut self, updates: &MetadataUpdates) {
        for (group, range) in &updates.groups {
            self.insert(*group, &updates.bytes[range.clone()]);
        }
    }
}

/// Sets `group`'s state in a bucket's sorted list.
fn set(bucket: &mut Vec<(GroupId, Vec<u8>)>, group: GroupId, encoded: &[u8]) {
    match bucket.binary_search_by_key(&group, |(g, _)| *g) {
        Ok(found) => {
            let state = &mut bucket[found].1;
            state.clear();
            state.extend_from_slice(encoded);
        }
        Err(at) => bucket.insert(at, (group, encoded.to_vec())),
    }
}

/// The `(group, encoded metadata)` pairs of a bucket as stored; an error names what is wrong.
/// Nothing is allocated on the word of the bytes: counts and lengths are checked against what
/// is there.
pub(super) fn decode_bucket(bucket: u64, bytes: &[u8]) -> Result<Vec<(GroupId, &[u8])>, String> {
    let (&version, mut rest) = bytes.split_first().ok_or("an empty bucket")?;
    if version != VERSION {
        return Err(format!("unknown bucket layout {version}"));
    }
    let count = take_u32(&mut rest)?;
    let mut states = Vec::new();
    for _ in 0..count {
        let group = u64::from_le_bytes(take(&mut rest, 8)?.try_into().unwrap());
        if bucket_of(group) != bucket {
            return Err(format!("group {group} in bucket {bucket}"));
        }
        if states
            .last()
            .is_some_and(|&(previous, _)| previous >= group)
        {
            return Err(format!("group {group} out of order"));
        }
        let len = take_u32(&mut rest)? as usize;
        states.push((group, take(&mut rest, len)?));
    }
    if !rest.is_empty() {
        return Err(format!("{} bytes after the last state", rest.len()));
    }
    Ok(states)
}

fn take<'a>(rest: &mut &'a [u8], len: usize) -> Result<&'a [u8], String> {
    if rest.len() < len {
        return Err(format!(
            "cut short: {len} bytes wanted, {} left",
            rest.len()
        ));
    }
    let (taken, after) = rest.split_at(len);
    *rest = after;
    Ok(taken)
}

fn take_u32(rest: &mut &[u8]) -> Result<u32, String> {
    Ok(u32::from_le_bytes(take(rest, 4)?.try_into().unwrap()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn updates(pairs: &[(GroupId, &[u8])]) -> MetadataUpdates {
        let mut updates = MetadataUpdates::default();
        for &(group, state) in pairs {
            updates.push(group, |out| out.extend_from_slice(state));
        }
        updates.sort();
        updates
    }

    #[test]
    fn a_bucket_is_the_current_states_with_the_updates_merged_in() {
        let mut buckets = GroupBuckets::default();
        buckets.insert(3, b"three");
        buckets.insert(1, b"one");
        buckets.insert(64, b"sixty-four");
        let new = updates(&[(2, b"two"), (3, b"THREE"), (65, b"sixty-five")]);
        let runs: Vec<_> = new.by_bucket().map(|(b, run)| (b, run.len())).collect();
        assert_eq!(runs, vec![(0, 2), (1, 1)]);
        let mut out = Vec::new();
        let (bucket, run) = new.by_bucket().next().unwrap();
        buckets.encode_updated(bucket, run, &new.bytes, &mut out);
        let decoded = decode_bucket(0, &out).unwrap();
        let expected: Vec<(GroupId, &[u8])> = vec![(1, b"one"), (2, b"two"), (3, b"THREE")];
        assert_eq!(decoded, expected);
        // Nothing changes in memory until the updates are applied.
        buckets.encode_updated(0, &[], &[], &mut out);
        assert_eq!(decode_bucket(0, &out).unwrap()[1], (3, &b"three"[..]));
        buckets.apply(&new);
        buckets.encode_updated(1, &[], &[], &mut out);
        let expected: Vec<(GroupId, &[u8])> = vec![(64, b"sixty-four"), (65, b"sixty-five")];
        assert_eq!(decode_bucket(1, &out).unwrap(), expected);
    }

    #[test]
    fn damaged_buckets_are_refused_with_the_reason() {
        let mut buckets = GroupBuckets::default();
        buckets.insert(1, b"one");
        buckets.insert(2, b"two");
        let mut good = Vec::new();
        buckets.encode_updated(0, &[], &[], &mut good);
        assert!(decode_bucket(0, &good).is_ok());
        assert!(decode_bucket(1, &good).unwrap_err().contains("in bucket 1"));
        assert!(
            decode_bucket(0, &good[..good.len() - 1])
                .unwrap_err()
                .contains("cut short")
        );
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(
            decode_bucket(0, &trailing)
                .unwrap_err()
                .contains("after the last")
        );
        let mut huge_count = good.clone();
        huge_count[1..5].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(
            decode_bucket(0, &huge_count)
                .unwrap_err()
                .contains("cut short")
        );
        let mut version = good;
        version[0] = 9;
        assert!(decode_bucket(0, &version).unwrap_err().contains("layout 9"));
        assert!(decode_bucket(0, &[]).is_err());
    }
}
