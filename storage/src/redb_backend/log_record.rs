//! The byte layout of one record of the redb log: the entries one `LogStore::write` appended,
//! for all its groups (plus entries relocated from older records).
//!
//! ```text
//! record := version u8 | part_count u32 | part*
//! part   := group u64 | entry_count u32 | entry*        (consecutive indexes)
//! entry  := len u32 | crc32 u32 | protobuf Entry        (len counts crc32 and protobuf)
//! ```
//!
//! redb checksums its pages; the per-entry CRC is the same one the other backends store, so a
//! damaged entry is reported as such even if a page checksum let it through.

use raft::prelude::Entry;

use crate::GroupId;
use crate::codec::{decode_entry, encode_entry_into, entry_encoded_bytes_estimate};

const VERSION: u8 = 1;

/// Builds one record, part by part.
#[derive(Debug)]
pub(super) struct RecordWriter {
    bytes: Vec<u8>,
    parts: u32,
}

impl RecordWriter {
    /// A record written into `bytes` (emptied first; a previous record's buffer, so that its
    /// pages are used again), with room for about `capacity_bytes` (see
    /// [`encoded_bytes_estimate`]): records reach hundreds of KiB under load, and growing the
    /// buffer by doubling cost a reallocation and fresh pages each time.
    pub fn over_buffer(mut bytes: Vec<u8>, capacity_bytes: usize) -> Self {
        bytes.clear();
        bytes.reserve(capacity_bytes.max(64));
        bytes.push(VERSION);
        bytes.extend_from_slice(&0u32.to_le_bytes());
        RecordWriter { bytes, parts: 0 }
    }

    /// Adds `entries` (consecutive, non-empty) of `group`.
    pub fn add_part(&mut self, group: GroupId, entries: &[Entry]) {
        self.bytes.extend_from_slice(&group.to_le_bytes());
        self.bytes
            .extend_from_slice(&(entries.len() as u32).to_le_bytes());
        for entry in entries {
            let start = self.bytes.len();
            // The length is filled in once the entry is encoded in place after it.
            self.bytes.extend_from_slice(&[0; 4]);
            encode_entry_into(entry, &mut self.bytes);
            let len = (self.bytes.len() - start - 4) as u32;
            self.bytes[start..start + 4].copy_from_slice(&len.to_le_bytes());
        }
        self.parts += 1;
    }

    pub fn is_empty(&self) -> bool {
        self.parts == 0
    }

    /// The finished record.
    pub fn finish(mut self) -> Vec<u8> {
        self.bytes[1..5].copy_from_slice(&self.parts.to_le_bytes());
        self.bytes
    }
}

/// About the bytes `entries` take in a record (a little more, never much less).
pub(super) fn encoded_bytes_estimate(entries: &[Entry]) -> usize {
    // A part header, then per entry its length and the encoded entry.
    12 + entries
        .iter()
        .map(|entry| 4 + entry_encoded_bytes_estimate(entry))
        .sum::<usize>()
}

/// Decodes a record into its parts. Every count and length is checked against the bytes left
/// before anything is allocated for it: the file may be damaged.
pub(super) fn decode(bytes: &[u8]) -> Result<Vec<(GroupId, Vec<Entry>)>, String> {
    let mut reader = Reader { bytes };
    let version = reader.take(1)?[0];
    if version != VERSION {
        return Err(format!("unknown record layout version {version}"));
    }
    let part_count = reader.u32()? as usize;
    // A part takes at least 12 bytes.
    if part_count > reader.bytes.len() / 12 {
        return Err(format!(
            "{part_count} parts cannot fit in {} bytes",
            reader.bytes.len()
        ));
    }
    let mut parts = Vec::with_capacity(part_count);
    for _ in 0..part_count {
        let group = reader.u64()?;
        let entry_count = reader.u32()? as usize;
        // An entry takes at least 8 bytes.
        if entry_count > reader.bytes.len() / 8 {
            return Err(format!(
                "group {group}: {entry_count} entries cannot fit in {} bytes",
                reader.bytes.len()
            ));
        }
        let mut entries: Vec<Entry> = Vec::with_capacity(entry_count);
        for _ in 0..entry_count {
            let len = reader.u32()? as usize;
            let entry = decode_entry(reader.take(len)?)
                .map_err(|detail| format!("group {group}: {detail}"))?;
            if let Some(previous) = entries.last()
                && previous.index + 1 != entry.index
            {
                return Err(format!(
                    "group {group}: entries jump from index {} to {}",
                    previous.index, entry.index
                ));
            }
            entries.push(entry);
        }
        if entries.is_empty() {
            return Err(format!("group {group}: a part without entries"));
        }
        parts.push((group, entries));
    }
    if !reader.bytes.is_empty() {
        return Err(format!("{} bytes after the last part", reader.bytes.len()));
    }
    Ok(parts)
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.bytes.len() < n {
            return Err(format!(
                "cut short: {n} bytes needed, {} left",
                self.bytes.len()
            ));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(range: std::ops::RangeInclusive<u64>) -> Vec<Entry> {
        range
            .map(|index| {
                let mut entry = Entry::default();
                entry.index = index;
                entry.term = 2;
                entry.data = vec![index as u8; 30].into();
                entry
            })
            .collect()
    }

    #[test]
    fn parts_round_trip() {
        let mut writer = RecordWriter::over_buffer(Vec::new(), 0);
        assert!(writer.is_empty());
        writer.add_part(3, &entries(5..=9));
        writer.add_part(1, &entries(1..=1));
        let bytes = writer.finish();
        let estimate =
            encoded_bytes_estimate(&entries(5..=9)) + encoded_bytes_estimate(&entries(1..=1));
        assert!(estimate >= bytes.len(), "{estimate} < {}", bytes.len());
        assert_eq!(
            decode(&bytes).unwrap(),
            vec![(3, entries(5..=9)), (1, entries(1..=1))]
        );
    }

    #[test]
    fn a_record_over_an_earlier_records_buffer_holds_only_its_own_parts() {
        let mut first = RecordWriter::over_buffer(Vec::new(), 0);
        first.add_part(3, &entries(5..=40));
        let used = first.finish();
        let mut second = RecordWriter::over_buffer(used, 0);
        second.add_part(1, &entries(1..=2));
        let bytes = second.finish();
        let mut fresh = RecordWriter::over_buffer(Vec::new(), 0);
        fresh.add_part(1, &entries(1..=2));
        assert_eq!(bytes, fresh.finish());
        assert_eq!(decode(&bytes).unwrap(), vec![(1, entries(1..=2))]);
    }

    #[test]
    fn every_damage_is_an_error_never_a_panic() {
        let mut writer = RecordWriter::over_buffer(Vec::new(), 0);
        writer.add_part(7, &entries(1..=4));
        let bytes = writer.finish();
        // Cut anywhere.
        for len in 0..bytes.len() {
            assert!(decode(&bytes[..len]).is_err(), "cut at {len}");
        }
        // A flipped bit in an entry fails its checksum.
        let mut flipped = bytes.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 0x10;
        let error = decode(&flipped).unwrap_err();
        assert!(
            error.contains("checksum") && error.contains("group 7"),
            "{error}"
        );
        // Counts far beyond the bytes are refused before allocating.
        let mut huge = bytes.clone();
        huge[1..5].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&huge).unwrap_err().contains("cannot fit"));
        // Trailing garbage.
        let mut longer = bytes;
        longer.push(0);
        assert!(decode(&longer).is_err());
    }

    #[test]
    fn hostile_bytes_are_refused_never_a_panic() {
        let mut writer = RecordWriter::over_buffer(Vec::new(), 0);
        writer.add_part(3, &entries(5..=7));
        writer.add_part(1, &entries(1..=1));
        let valid = vec![writer.finish().to_vec()];
        for input in crate::testing::hostile_inputs(&valid, 2, 3_000) {
            let _ = decode(&input);
        }
    }
}
