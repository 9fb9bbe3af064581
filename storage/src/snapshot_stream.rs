//! The byte stream a group's state travels in: written by one backend, read by any.
//!
//! Layout (integers little-endian):
//!
//! ```text
//! magic "CNCDSNAP" | version u32 | applied_index u64
//! record*:  0x01 | key_len u32 | key | value_len u32 | value
//! trailer:  0x00 | record_count u64 | crc32 u32 (of every byte before the trailer's tag)
//! ```
//!
//! The stream comes from a peer, so the reader trusts nothing: lengths are bounded before
//! anything is allocated, keys must ascend strictly, and the checksum and count are checked
//! before the last record is handed out — a store restoring from the reader never commits a
//! stream that turns out to be bad.

use std::io::{Read, Write};

use crate::{
    GroupId, KeyValue, MAX_KEY_BYTES, MAX_VALUE_BYTES, StateSnapshot, StateStore, StorageError,
    StorageResult,
};

const MAGIC: &[u8; 8] = b"CNCDSNAP";
const STREAM_VERSION: u32 = 1;
const TAG_RECORD: u8 = 1;
const TAG_END: u8 = 0;

/// Sizes of a written snapshot stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotSummary {
    /// The applied index the snapshot reflects.
    pub applied_index: u64,
    /// Number of key-value records.
    pub records: u64,
    /// Bytes written, trailer included.
    pub bytes: u64,
}

/// Writes `snapshot` to `out` in the stream layout above.
pub fn write_snapshot(
    snapshot: StateSnapshot<'_>,
    out: &mut dyn Write,
) -> StorageResult<SnapshotSummary> {
    let mut writer = CrcWriter {
        out,
        crc: crc32fast::Hasher::new(),
        bytes: 0,
    };
    writer.put(MAGIC)?;
    writer.put(&STREAM_VERSION.to_le_bytes())?;
    writer.put(&snapshot.applied_index.to_le_bytes())?;
    let mut records = 0u64;
    for record in snapshot.records {
        let (key, value) = record?;
        writer.put(&[TAG_RECORD])?;
        writer.put(&(key.len() as u32).to_le_bytes())?;
        writer.put(&key)?;
        writer.put(&(value.len() as u32).to_le_bytes())?;
        writer.put(&value)?;
        records += 1;
    }
    let crc = writer.crc.clone().finalize();
    writer.put(&[TAG_END])?;
    writer.put(&records.to_le_bytes())?;
    writer.put(&crc.to_le_bytes())?;
    Ok(SnapshotSummary {
        applied_index: snapshot.applied_index,
        records,
        bytes: writer.bytes,
    })
}

/// Takes `group`'s snapshot from `store` and writes it to `out`.
pub fn export_snapshot(
    store: &dyn StateStore,
    group: GroupId,
    out: &mut dyn Write,
) -> StorageResult<SnapshotSummary> {
    write_snapshot(store.snapshot(group)?, out)
}

/// Restores `group` in `store` from a stream written by [`write_snapshot`]; returns the
/// applied index it restored. A malformed stream changes nothing.
pub fn import_snapshot(
    store: &dyn StateStore,
    group: GroupId,
    input: &mut dyn Read,
) -> StorageResult<u64> {
    let mut reader = SnapshotReader::new(input)?;
    let applied_index = reader.applied_index();
    store.restore(group, applied_index, &mut reader)?;
    Ok(applied_index)
}

/// Reads a snapshot stream record by record, verifying it as it goes.
pub struct SnapshotReader<'r> {
    input: CrcReader<'r>,
    applied_index: u64,
    records: u64,
    previous_key: Option<Vec<u8>>,
    /// The record read ahead: a record is handed out only once the next tag is known, so the
    /// trailer is checked before the last record leaves the reader.
    pending: Option<KeyValue>,
    finished: bool,
    /// Whether the input must end with the trailer (a stream of its own), or may go on (a
    /// stream inside a larger one, which its container checks).
    ends_its_input: bool,
}

impl<'r> SnapshotReader<'r> {
    /// Reads and checks the header of a stream that is the whole of `input`: bytes after its
    /// trailer are an error.
    pub fn new(input: &'r mut dyn Read) -> StorageResult<Self> {
        Self::open(input, true)
    }

    /// Reads and checks the header of a stream inside a larger one: reading stops at its
    /// trailer, and `input` goes on with what follows.
    pub fn within(input: &'r mut dyn Read) -> StorageResult<Self> {
        Self::open(input, false)
    }

    fn open(input: &'r mut dyn Read, ends_its_input: bool) -> StorageResult<Self> {
        let mut input = CrcReader {
            input,
            crc: crc32fast::Hasher::new(),
        };
        let mut magic = [0u8; 8];
        input.read_exact(&mut magic, "magic")?;
        if &magic != MAGIC {
            return Err(invalid("not a concord snapshot stream (bad magic)"));
        }
        let version = input.read_u32("version")?;
        if version != STREAM_VERSION {
            return Err(invalid(format!(
                "stream version {version} is not supported (this build reads {STREAM_VERSION})"
            )));
        }
        let applied_index = input.read_u64("applied index")?;
        let mut reader = SnapshotReader {
            input,
            applied_index,
            records: 0,
            previous_key: None,
            pending: None,
            finished: false,
            ends_its_input,
        };
        reader.pending = reader.read_record()?;
        Ok(reader)
    }

    /// The applied index in the header.
    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }

    /// Records read so far (one ahead of those handed out, while any are left).
    pub fn records_read(&self) -> u64 {
        self.records
    }

    /// Reads the next record, or checks the trailer and returns `None`.
    fn read_record(&mut self) -> StorageResult<Option<KeyValue>> {
        let crc_before_tag = self.input.crc.clone().finalize();
        let tag = self.input.read_u8("record tag")?;
        match tag {
            TAG_RECORD => {
                let key = self.input.read_bytes(MAX_KEY_BYTES, "key")?;
                let value = self.input.read_bytes(MAX_VALUE_BYTES, "value")?;
                if key.is_empty() {
                    return Err(invalid(format!("record {} has an empty key", self.records)));
                }
                if let Some(previous) = &self.previous_key
                    && key <= *previous
                {
                    return Err(invalid(format!(
                        "record {} is out of order: keys must ascend strictly",
                        self.records
                    )));
                }
                self.previous_key = Some(key.clone());
                self.records += 1;
                Ok(Some((key, value)))
            }
            TAG_END => {
                let count = self.input.read_u64("record count")?;
                let crc = self.input.read_u32("checksum")?;
                if count != self.records {
                    return Err(invalid(format!(
                        "trailer counts {count} records, the stream holds {}",
                        self.records
                    )));
                }
                if crc != crc_before_tag {
                    return Err(invalid(format!(
                        "checksum mismatch (trailer {crc:#010x}, computed {crc_before_tag:#010x})"
                    )));
                }
                let mut extra = [0u8; 1];
                if self.ends_its_input
                    && self.input.input.read(&mut extra).map_err(io_invalid)? != 0
                {
                    return Err(invalid("bytes follow the trailer"));
                }
                self.finished = true;
                Ok(None)
            }
            other => Err(invalid(format!(
                "unknown tag {other:#04x} after record {}",
                self.records
            ))),
        }
    }
}

impl Iterator for SnapshotReader<'_> {
    type Item = StorageResult<KeyValue>;

    fn next(&mut self) -> Option<Self::Item> {
        let current = self.pending.take()?;
        if !self.finished {
            match self.read_record() {
                Ok(next) => self.pending = next,
                Err(error) => return Some(Err(error)),
            }
        }
        Some(Ok(current))
    }
}

fn invalid(detail: impl Into<String>) -> StorageError {
    StorageError::InvalidSnapshot {
        detail: detail.into(),
    }
}

fn io_invalid(error: std::io::Error) -> StorageError {
    invalid(format!("read failed: {error}"))
}

struct CrcWriter<'w> {
    out: &'w mut dyn Write,
    crc: crc32fast::Hasher,
    bytes: u64,
}

impl CrcWriter<'_> {
    fn put(&mut self, bytes: &[u8]) -> StorageResult<()> {
        self.out
            .write_all(bytes)
            .map_err(|source| StorageError::Io {
                path: "snapshot stream".into(),
                source,
            })?;
        self.crc.update(bytes);
        self.bytes += bytes.len() as u64;
        Ok(())
    }
}

struct CrcReader<'r> {
    input: &'r mut dyn Read,
    crc: crc32fast::Hasher,
}

impl CrcReader<'_> {
    fn read_exact(&mut self, buf: &mut [u8], what: &str) -> StorageResult<()> {
        self.input.read_exact(buf).map_err(|error| {
            if error.kind() == std::io::ErrorKind::UnexpectedEof {
                invalid(format!("stream ends inside the {what}"))
            } else {
                io_invalid(error)
            }
        })?;
        self.crc.update(buf);
        Ok(())
    }

    fn read_u8(&mut self, what: &str) -> StorageResult<u8> {
        let mut buf = [0u8; 1];
        self.read_exact(&mut buf, what)?;
        Ok(buf[0])
    }

    fn read_u32(&mut self, what: &str) -> StorageResult<u32> {
        let mut buf = [0u8; 4];
        self.read_exact(&mut buf, what)?;
        Ok(u32::from_le_bytes(buf))
    }

    fn read_u64(&mut self, what: &str) -> StorageResult<u64> {
        let mut buf = [0u8; 8];
        self.read_exact(&mut buf, what)?;
        Ok(u64::from_le_bytes(buf))
    }

    /// Reads a length-prefixed byte string, refusing lengths over `max_bytes` before
    /// allocating.
    fn read_bytes(&mut self, max_bytes: usize, what: &str) -> StorageResult<Vec<u8>> {
        let len = self.read_u32(what)? as usize;
        if len > max_bytes {
            return Err(invalid(format!(
                "{what} of {len} bytes exceeds the limit of {max_bytes}"
            )));
        }
        let mut bytes = vec![0u8; len];
        self.read_exact(&mut bytes, what)?;
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(records: &[(&str, &str)]) -> Vec<u8> {
        let snapshot = StateSnapshot {
            applied_index: 42,
            records: Box::new(
                records
                    .iter()
                    .map(|(k, v)| Ok((k.as_bytes().to_vec(), v.as_bytes().to_vec())))
                    .collect::<Vec<_>>()
                    .into_iter(),
            ),
        };
        let mut out = Vec::new();
        write_snapshot(snapshot, &mut out).unwrap();
        out
    }

    fn read_all(bytes: &[u8]) -> StorageResult<(u64, Vec<KeyValue>)> {
        let mut input = bytes;
        let reader = SnapshotReader::new(&mut input)?;
        let applied = reader.applied_index();
        let records = reader.collect::<StorageResult<Vec<_>>>()?;
        Ok((applied, records))
    }

    #[test]
    fn round_trip() {
        let bytes = stream(&[("a", "1"), ("b", "")]);
        let (applied, records) = read_all(&bytes).unwrap();
        assert_eq!(applied, 42);
        assert_eq!(records.len(), 2);
        assert_eq!(read_all(&stream(&[])).unwrap().1, vec![]);
    }

    #[test]
    fn every_truncation_and_every_flipped_byte_is_rejected() {
        let bytes = stream(&[("alpha", "one"), ("beta", "two")]);
        for cut in 0..bytes.len() {
            assert!(read_all(&bytes[..cut]).is_err(), "truncated at {cut}");
        }
        for position in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[position] ^= 0x40;
            assert!(read_all(&bad).is_err(), "flipped byte {position}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(read_all(&longer).is_err());
    }

    #[test]
    fn out_of_order_keys_are_rejected() {
        let bytes = stream(&[("b", "1"), ("a", "2")]);
        let error = read_all(&bytes).unwrap_err();
        assert!(error.to_string().contains("out of order"), "{error}");
    }

    #[test]
    fn a_huge_length_is_refused_before_allocating() {
        let mut bytes = stream(&[]);
        bytes.truncate(8 + 4 + 8);
        bytes.push(TAG_RECORD);
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        let error = read_all(&bytes).unwrap_err();
        assert!(error.to_string().contains("exceeds the limit"), "{error}");
    }

    #[test]
    fn hostile_bytes_are_refused_never_a_panic() {
        let valid = vec![stream(&[("a", "1"), ("bb", "22"), ("ccc", "")])];
        for input in crate::testing::hostile_inputs(&valid, 4, 3_000) {
            let _ = read_all(&input);
        }
    }
}
