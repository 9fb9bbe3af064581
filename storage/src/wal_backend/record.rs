//! The byte layout of one WAL record: a [`LogBatch`], as written by one `LogStore::write`.
//!
//! ```text
//! record  := len u32 | crc32 u32 (of the body) | body            (len = body length, > 0)
//! body    := version u8 (2) | durable_through u64 | op_count u32 | op*
//!            (version 1, still read: no durable_through)
//! op      := group u64 | kind u8 | ...
//!   append         kind 1: count u32 | (len u32 | protobuf Entry)*
//!   hard state     kind 2: term u64 | vote u64 | commit u64
//!   conf state     kind 3: len u32 | protobuf ConfState          (read only: index 0)
//!   conf state     kind 6: index u64 | len u32 | protobuf ConfState
//!   compact        kind 4: compact_index u64
//!   apply snapshot kind 5: len u32 | protobuf SnapshotMetadata
//! ```
//!
//! A zero length marks the end of the written part of a segment (segments are preallocated
//! with zeros). `durable_through` is how far the segment had been synced when the record was
//! written: damage before that point in a segment is damage to acknowledged records; damage
//! past it, followed by records that reached the disk anyway, is a power cut within one
//! unsynced window (a disk may keep any subset of the writes since its last sync).

use raft::prelude::{ConfState, Entry, HardState, SnapshotMetadata};

use crate::{LogBatch, LogOp};

const VERSION: u8 = 2;
/// Records written before `durable_through` existed.
const VERSION_WITHOUT_DURABLE_THROUGH: u8 = 1;
/// Bytes before a record's body.
pub(super) const HEADER_BYTES: usize = 8;
/// Where `durable_through` sits in a record (after the header and the version).
const DURABLE_THROUGH_AT: usize = HEADER_BYTES + 1;

/// Encodes `batch` as a whole record (header included), for a segment synced through byte
/// `durable_through`.
pub(super) fn encode(batch: &LogBatch, durable_through: u64) -> Vec<u8> {
    // Sized from the payloads: entries of thousands of commands make records of hundreds of
    // KiB, and growing by doubling cost a reallocation and fresh pages each time.
    let payload_bytes: usize = batch
        .ops()
        .iter()
        .map(|(_, op)| match op {
            LogOp::Append(entries) => entries
                .iter()
                .map(crate::codec::entry_encoded_bytes_estimate)
                .sum(),
            _ => 64,
        })
        .sum();
    // The body is written in place after a header filled in at the end: no second copy.
    let mut body = Vec::with_capacity(HEADER_BYTES + 16 + payload_bytes);
    body.extend_from_slice(&[0; HEADER_BYTES]);
    body.push(VERSION);
    body.extend_from_slice(&durable_through.to_le_bytes());
    body.extend_from_slice(&(batch.op_count() as u32).to_le_bytes());
    for (group, op) in batch.ops() {
        body.extend_from_slice(&group.to_le_bytes());
        match op {
            LogOp::Append(entries) => {
                body.push(1);
                body.extend_from_slice(&(entries.len() as u32).to_le_bytes());
                for entry in entries {
                    put_message(&mut body, entry);
                }
            }
            LogOp::SetHardState(hard_state) => {
                body.push(2);
                for value in [hard_state.term, hard_state.vote, hard_state.commit] {
                    body.extend_from_slice(&value.to_le_bytes());
                }
            }
            LogOp::SetConfState { conf_state, index } => {
                body.push(6);
                body.extend_from_slice(&index.to_le_bytes());
                put_message(&mut body, conf_state);
            }
            LogOp::Compact { compact_index } => {
                body.push(4);
                body.extend_from_slice(&compact_index.to_le_bytes());
            }
            LogOp::ApplySnapshot(metadata) => {
                body.push(5);
                put_message(&mut body, metadata);
            }
        }
    }
    let len = (body.len() - HEADER_BYTES) as u32;
    body[0..4].copy_from_slice(&len.to_le_bytes());
    seal(&mut body);
    body
}

/// Sets the checksum of an encoded record.
fn seal(record: &mut [u8]) {
    let crc = crc32fast::hash(&record[HEADER_BYTES..]);
    record[4..8].copy_from_slice(&crc.to_le_bytes());
}

/// Changes the `durable_through` of an encoded record (it moved to a new segment).
pub(super) fn set_durable_through(record: &mut [u8], durable_through: u64) {
    record[DURABLE_THROUGH_AT..DURABLE_THROUGH_AT + 8]
        .copy_from_slice(&durable_through.to_le_bytes());
    seal(record);
}

fn put_message(out: &mut Vec<u8>, message: &impl protobuf::Message) {
    // Encoded in place after a length filled in once the message is written.
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    message
        .write_to_vec(out)
        .expect("encoding a protobuf message into a Vec cannot fail");
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// What the start of `bytes` holds.
pub(super) enum Parsed {
    /// A valid record of `len` bytes in total, its batch, and how far its segment had been
    /// synced when it was written (`None`: a record of version 1, which does not say).
    Record {
        batch: LogBatch,
        len: usize,
        durable_through: Option<u64>,
    },
    /// Zeros: the end of the written part.
    End,
    /// A record that is cut short or fails its checksum: a torn write if it is the last thing
    /// in the log, corruption otherwise.
    Damaged(String),
}

/// Parses the record at the start of `bytes`.
pub(super) fn parse(bytes: &[u8]) -> Parsed {
    if bytes.len() < HEADER_BYTES {
        return if bytes.iter().all(|&b| b == 0) {
            Parsed::End
        } else {
            Parsed::Damaged("a record header is cut short".into())
        };
    }
    let len = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
    if len == 0 && crc == 0 {
        return Parsed::End;
    }
    let Some(body) = bytes.get(HEADER_BYTES..HEADER_BYTES + len) else {
        return Parsed::Damaged(format!("a record of {len} bytes runs past the segment"));
    };
    if crc32fast::hash(body) != crc {
        return Parsed::Damaged("a record fails its checksum".into());
    }
    match decode_body(body) {
        Ok((batch, durable_through)) => Parsed::Record {
            batch,
            len: HEADER_BYTES + len,
            durable_through,
        },
        Err(detail) => Parsed::Damaged(format!("a record passes its checksum but {detail}")),
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let slice = self
            .bytes
            .get(self.at..self.at + n)
            .ok_or_else(|| format!("is cut short at byte {}", self.at))?;
        self.at += n;
        Ok(slice)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn message<M: protobuf::Message>(&mut self) -> Result<M, String> {
        let len = self.u32()? as usize;
        M::parse_from_bytes(self.take(len)?)
            .map_err(|e| format!("holds an undecodable message: {e}"))
    }
}

fn decode_body(body: &[u8]) -> Result<(LogBatch, Option<u64>), String> {
    let mut reader = Reader { bytes: body, at: 0 };
    let durable_through = match reader.u8()? {
        VERSION => Some(reader.u64()?),
        VERSION_WITHOUT_DURABLE_THROUGH => None,
        version => return Err(format!("has unknown version {version}")),
    };
    let op_count = reader.u32()?;
    let mut batch = LogBatch::new();
    for _ in 0..op_count {
        let group = reader.u64()?;
        match reader.u8()? {
            1 => {
                let count = reader.u32()? as usize;
                if count > body.len() / 4 {
                    return Err(format!("claims {count} entries"));
                }
                let mut entries = Vec::with_capacity(count);
                for _ in 0..count {
                    entries.push(reader.message::<Entry>()?);
                }
                batch.append(group, entries);
            }
            2 => {
                let mut hard_state = HardState::default();
                hard_state.term = reader.u64()?;
                hard_state.vote = reader.u64()?;
                hard_state.commit = reader.u64()?;
                batch.set_hard_state(group, hard_state);
            }
            3 => {
                batch.set_conf_state(group, reader.message::<ConfState>()?, 0);
            }
            6 => {
                let index = reader.u64()?;
                batch.set_conf_state(group, reader.message::<ConfState>()?, index);
            }
            4 => {
                batch.compact(group, reader.u64()?);
            }
            5 => {
                batch.apply_snapshot(group, reader.message::<SnapshotMetadata>()?);
            }
            kind => return Err(format!("holds an unknown operation {kind}")),
        }
    }
    if reader.at != body.len() {
        return Err("has trailing bytes".into());
    }
    Ok((batch, durable_through))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::make_entries;

    #[test]
    fn round_trip_and_damage() {
        let mut batch = LogBatch::new();
        batch.append(3, make_entries(3, 1..=4, 2));
        let mut hard_state = HardState::default();
        hard_state.term = 2;
        hard_state.commit = 3;
        batch.set_hard_state(3, hard_state);
        batch.set_conf_state(3, ConfState::from((vec![1, 2], vec![])), 7);
        batch.compact(3, 2);
        batch.apply_snapshot(9, SnapshotMetadata::default());
        let mut record = encode(&batch, 4096);
        match parse(&record) {
            Parsed::Record {
                batch: decoded,
                len,
                durable_through,
            } => {
                assert_eq!(decoded, batch);
                assert_eq!(len, record.len());
                assert_eq!(durable_through, Some(4096));
            }
            _ => panic!("a valid record did not parse"),
        }
        set_durable_through(&mut record, 0);
        assert!(matches!(
            parse(&record),
            Parsed::Record {
                durable_through: Some(0),
                ..
            }
        ));
        // A record of version 1 (no durable_through) still reads.
        let mut version_1 = record[..HEADER_BYTES].to_vec();
        version_1.push(VERSION_WITHOUT_DURABLE_THROUGH);
        version_1.extend_from_slice(&record[DURABLE_THROUGH_AT + 8..]);
        let body_len = (version_1.len() - HEADER_BYTES) as u32;
        version_1[0..4].copy_from_slice(&body_len.to_le_bytes());
        seal(&mut version_1);
        match parse(&version_1) {
            Parsed::Record {
                batch: decoded,
                durable_through: None,
                ..
            } => assert_eq!(decoded, batch),
            _ => panic!("a record of version 1 did not parse"),
        }
        for cut in 1..record.len() {
            assert!(
                matches!(parse(&record[..cut]), Parsed::Damaged(_)),
                "cut {cut}"
            );
        }
        let mut flipped = record.clone();
        flipped[20] ^= 1;
        assert!(matches!(parse(&flipped), Parsed::Damaged(_)));
        assert!(matches!(parse(&[0; 16]), Parsed::End));
    }

    #[test]
    fn hostile_bytes_are_refused_never_a_panic() {
        let mut batch = LogBatch::new();
        batch.append(3, make_entries(3, 1..=3, 2));
        batch.set_hard_state(3, HardState::default());
        batch.set_conf_state(3, ConfState::from((vec![1, 2], vec![])), 7);
        batch.compact(3, 2);
        batch.apply_snapshot(9, SnapshotMetadata::default());
        let record = encode(&batch, 77);
        let body = record[HEADER_BYTES..].to_vec();
        for input in crate::testing::hostile_inputs(&[record, body], 3, 3_000) {
            let _ = parse(&input);
            // Past the checksum: the body decoder on its own.
            let _ = decode_body(&input);
        }
    }
}
