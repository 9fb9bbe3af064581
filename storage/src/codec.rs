//! Byte layouts of what the disk backends store: log entries, group metadata, keys.
//!
//! Every stored value carries a CRC32 of its body so that a flipped bit is reported as
//! corruption instead of being decoded into a plausible but wrong entry.

use protobuf::Message as _;
use raft::prelude::{ConfState, Entry, HardState};

use crate::GroupLogState;

/// Version byte of the group metadata layout below.
/// `crc32 | 1 | hard state | truncated | last | conf state`: read only (conf state index 0).
const GROUP_STATE_LAYOUT_V1: u8 = 1;
/// `crc32 | 2 | hard state | truncated | last | conf state index | conf state`.
const GROUP_STATE_LAYOUT_V2: u8 = 2;
const CRC_BYTES: usize = 4;

fn with_crc(body: Vec<u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(CRC_BYTES + body.len());
    out.extend_from_slice(&[0; CRC_BYTES]);
    out.extend_from_slice(&body);
    fill_crc(&mut out);
    out
}

/// Writes into a value's first `CRC_BYTES`, left for it, the checksum of the body after them.
fn fill_crc(value: &mut [u8]) {
    let crc = crc32fast::hash(&value[CRC_BYTES..]);
    value[..CRC_BYTES].copy_from_slice(&crc.to_le_bytes());
}

fn check_crc(bytes: &[u8]) -> Result<&[u8], String> {
    if bytes.len() < CRC_BYTES {
        return Err(format!(
            "value of {} bytes is shorter than its checksum",
            bytes.len()
        ));
    }
    let (crc, body) = bytes.split_at(CRC_BYTES);
    let stored = u32::from_le_bytes(crc.try_into().expect("split at 4"));
    let actual = crc32fast::hash(body);
    if stored != actual {
        return Err(format!(
            "checksum mismatch (stored {stored:#010x}, computed {actual:#010x})"
        ));
    }
    Ok(body)
}

/// Encodes a log entry as `crc32 | protobuf`.
pub(crate) fn encode_entry(entry: &Entry) -> Vec<u8> {
    let mut out = Vec::with_capacity(CRC_BYTES + entry.compute_size() as usize);
    encode_entry_into(entry, &mut out);
    out
}

/// Appends `crc32 | protobuf` of `entry` to `out`, encoding in place (no copy of the body).
pub(crate) fn encode_entry_into(entry: &Entry, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; CRC_BYTES]);
    entry
        .write_to_vec(out)
        .expect("encoding a protobuf message into a Vec cannot fail");
    let crc = crc32fast::hash(&out[start + CRC_BYTES..]);
    out[start..start + CRC_BYTES].copy_from_slice(&crc.to_le_bytes());
}

/// About the bytes an entry takes encoded (a little more, never much less): its payload plus
/// room for its fixed fields, tags, lengths and a checksum. For sizing buffers.
pub(crate) fn entry_encoded_bytes_estimate(entry: &Entry) -> usize {
    entry.data.len() + entry.context.len() + 40
}

/// Decodes what [`encode_entry`] wrote.
pub(crate) fn decode_entry(bytes: &[u8]) -> Result<Entry, String> {
    let body = check_crc(bytes)?;
    Entry::parse_from_bytes(body).map_err(|e| format!("undecodable entry: {e}"))
}

/// Encodes group metadata as `crc32 | version | hard state | truncated | last | conf state
/// index | conf state`.
pub(crate) fn encode_group_state(state: &GroupLogState) -> Vec<u8> {
    let mut out = Vec::new();
    encode_group_state_into(state, &mut out);
    out
}

/// [`encode_group_state`] into `out`, replacing what it held: a log that writes the metadata
/// of every group it touched, every round, reuses one buffer.
pub(crate) fn encode_group_state_into(state: &GroupLogState, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&[0; CRC_BYTES]);
    out.push(GROUP_STATE_LAYOUT_V2);
    for value in [
        state.hard_state.term,
        state.hard_state.vote,
        state.hard_state.commit,
        state.truncated_index,
        state.truncated_term,
        state.last_index,
        state.conf_state_index,
    ] {
        out.extend_from_slice(&value.to_le_bytes());
    }
    state
        .conf_state
        .write_to_vec(out)
        .expect("encoding a protobuf message into a Vec cannot fail");
    fill_crc(out);
}

/// Decodes what [`encode_group_state`] wrote.
pub(crate) fn decode_group_state(bytes: &[u8]) -> Result<GroupLogState, String> {
    let body = check_crc(bytes)?;
    let (&version, rest) = body
        .split_first()
        .ok_or_else(|| "empty group metadata".to_string())?;
    let words = match version {
        GROUP_STATE_LAYOUT_V1 => 6,
        GROUP_STATE_LAYOUT_V2 => 7,
        _ => return Err(format!("unknown group metadata layout {version}")),
    };
    let fixed = words * 8;
    if rest.len() < fixed {
        return Err(format!(
            "group metadata of {} bytes is truncated",
            body.len()
        ));
    }
    let mut words = rest[..fixed]
        .chunks_exact(8)
        .map(|chunk| u64::from_le_bytes(chunk.try_into().expect("chunks of 8")));
    let mut next = || words.next().expect("counted words");
    let mut hard_state = HardState::default();
    hard_state.term = next();
    hard_state.vote = next();
    hard_state.commit = next();
    let truncated_index = next();
    let truncated_term = next();
    let last_index = next();
    let conf_state_index = if version == GROUP_STATE_LAYOUT_V1 {
        0
    } else {
        next()
    };
    let conf_state = ConfState::parse_from_bytes(&rest[fixed..])
        .map_err(|e| format!("undecodable conf state: {e}"))?;
    if last_index < truncated_index {
        return Err(format!(
            "last index {last_index} is below truncated index {truncated_index}"
        ));
    }
    Ok(GroupLogState {
        hard_state,
        conf_state,
        conf_state_index,
        truncated_index,
        truncated_term,
        last_index,
    })
}

/// Encodes a `u64` applied index with its checksum.
pub(crate) fn encode_applied_index(index: u64) -> Vec<u8> {
    with_crc(index.to_le_bytes().to_vec())
}

/// Decodes what [`encode_applied_index`] wrote.
pub(crate) fn decode_applied_index(bytes: &[u8]) -> Result<u64, String> {
    let body = check_crc(bytes)?;
    let array: [u8; 8] = body
        .try_into()
        .map_err(|_| format!("applied index of {} bytes, expected 8", body.len()))?;
    Ok(u64::from_le_bytes(array))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_round_trips_and_detects_a_flipped_bit() {
        let mut entry = Entry::default();
        entry.index = 7;
        entry.term = 3;
        entry.data = b"payload".to_vec().into();
        let mut bytes = encode_entry(&entry);
        assert_eq!(decode_entry(&bytes).unwrap(), entry);
        let last = bytes.len() - 1;
        bytes[last] ^= 0x01;
        assert!(decode_entry(&bytes).unwrap_err().contains("checksum"));
        assert!(decode_entry(&[1, 2]).is_err());
    }

    #[test]
    fn group_state_round_trips() {
        let mut state = GroupLogState {
            truncated_index: 10,
            truncated_term: 2,
            last_index: 20,
            ..Default::default()
        };
        state.hard_state.term = 4;
        state.hard_state.vote = 2;
        state.hard_state.commit = 18;
        state.conf_state.voters = vec![1, 2, 3];
        state.conf_state_index = 15;
        let bytes = encode_group_state(&state);
        assert_eq!(decode_group_state(&bytes).unwrap(), state);
        assert!(decode_group_state(&bytes[..10]).is_err());
        // A reused buffer holding a longer value ends up with the same bytes.
        let mut reused = vec![9; 300];
        encode_group_state_into(&state, &mut reused);
        assert_eq!(reused, bytes);
    }

    #[test]
    fn group_state_of_the_first_layout_reads_with_conf_state_index_zero() {
        let mut body = vec![GROUP_STATE_LAYOUT_V1];
        for value in [4u64, 2, 18, 10, 2, 20] {
            body.extend_from_slice(&value.to_le_bytes());
        }
        body.extend_from_slice(
            &ConfState::from((vec![1, 2, 3], vec![]))
                .write_to_bytes()
                .unwrap(),
        );
        let state = decode_group_state(&with_crc(body)).unwrap();
        assert_eq!((state.last_index, state.conf_state_index), (20, 0));
        assert_eq!(state.conf_state.voters, vec![1, 2, 3]);
    }

    #[test]
    fn applied_index_round_trips() {
        assert_eq!(decode_applied_index(&encode_applied_index(42)).unwrap(), 42);
        assert!(decode_applied_index(&encode_applied_index(42)[..6]).is_err());
    }

    #[test]
    fn hostile_bytes_are_refused_never_a_panic() {
        let mut entry = Entry::default();
        entry.index = 7;
        entry.term = 3;
        entry.data = vec![5; 40].into();
        let mut state = GroupLogState::default();
        state.last_index = 9;
        state.conf_state = ConfState::from((vec![1, 2, 3], vec![4]));
        let valid = vec![
            encode_entry(&entry),
            encode_group_state(&state),
            encode_applied_index(11),
        ];
        for input in crate::testing::hostile_inputs(&valid, 1, 3_000) {
            let _ = decode_entry(&input);
            let _ = decode_group_state(&input);
            let _ = decode_applied_index(&input);
            // Past the checksum, what the checksum guards must be refused by itself too.
            let _ = Entry::parse_from_bytes(&input);
            let _ = decode_group_state(&with_crc(input));
        }
    }
}
