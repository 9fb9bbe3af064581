//! The peer wire format: a hello that opens each connection, then frames of raft messages.
//!
//! ```text
//! hello:  "CNCD" | wire version u16 | cluster id u64 | node id u64 | purpose u8
//!         | client URL length u16 | client URL (UTF-8, at most 1024 bytes)
//!         | from version 4: vote quiet ms u32
//!         | from version 5: incarnation u64                                   (LE)
//! purpose 0: frames of raft messages follow, from the dialling node
//! purpose 1: a snapshot request follows: group u64 | min index u64; the answer is a snapshot
//!            stream ("CNCDSNAP...", `concord_storage::snapshot_stream`) or a refusal,
//!            "CNCDFAIL" | reason length u16 | reason
//! purpose 2: a request for the peers the answering node knows; the answer is a peer count
//!            u16 | per peer: node id u64 | address length u8 | address ("ip:port", UTF-8)
//!            (`peer_directory.rs`); a node of an earlier build closes the connection
//! purpose 3 (from version 5): several snapshot requests: count u16 (1 to 64) | per request:
//!            group u64 | min index u64; the answer, per request in order: 0 | chunks of the
//!            snapshot stream, each length u32 (1 to 1 MiB) | bytes, then a length 0; or
//!            1 | reason length u16 | reason (refused). A send that fails midway closes the
//!            connection.
//! frame:  body length u32 | body                                            (LE)
//! body:   message count u32 | per message:
//!           group u64 | replicated floor u64 | length u32 | raft Message (protobuf)
//! ```
//!
//! Everything read comes from the network: every length is checked against what is left (and
//! the frame length against a limit) before anything is allocated, and a malformed frame is
//! an error, never a panic.

use std::time::Duration;

use concord_storage::raft::prelude::Message;
use protobuf::Message as _;

use super::GroupMessage;
use crate::NodeId;

/// The newest version of this wire format, the one this node speaks to peers that speak it.
/// Version 3: entries may carry an admin command (`command_batch.rs`), which a node of
/// version 2 would take for a malformed entry and skip while the others apply it. Its frames
/// and hellos are version 2's. Version 4: the hello ends with the sender's vote quiet (how
/// long it refuses to vote after hearing from a leader, `raft_node/lease.rs`), so that a
/// leader's lease never outlasts the promise of a member whose ticks are shorter. Its frames
/// are version 3's. Version 5: the hello ends, after the vote quiet, with the sender's
/// incarnation (a number its network draws when it starts), so that a peer tells a member that
/// restarted from one whose link was cut and came back
/// (`raft_node/replica/restarted_leader.rs`). Its
/// frames are version 4's.
pub const WIRE_VERSION: u16 = 5;

/// The oldest version this node speaks, to a peer that speaks no newer one: during a rolling
/// upgrade, members of every version from this one to [`WIRE_VERSION`] work together.
pub(crate) const OLDEST_WIRE_VERSION: u16 = 2;

/// The oldest version whose nodes apply admin entries: one is proposed only while every
/// member of its group speaks at least this, and once a node committed one it no longer
/// takes peers that speak less.
pub(crate) const ADMIN_ENTRIES_WIRE_VERSION: u16 = 3;

const MAGIC: [u8; 4] = *b"CNCD";

/// Bytes of a hello before its client URL.
pub(crate) const HELLO_HEAD_BYTES: usize = 25;

/// The oldest version whose hellos carry the vote quiet.
const VOTE_QUIET_WIRE_VERSION: u16 = 4;

/// Bytes of the vote quiet after the client URL, in the hellos that carry it.
const VOTE_QUIET_BYTES: usize = 4;

/// The oldest version whose hellos carry the incarnation, after the vote quiet.
const INCARNATION_WIRE_VERSION: u16 = 5;

/// Bytes of the incarnation, in the hellos that carry it.
const INCARNATION_BYTES: usize = 8;

/// What a connection is for, as its hello says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// Frames of raft messages.
    Messages = 0,
    /// One snapshot request and its answer.
    Snapshot = 1,
    /// One request for the peers the answering node knows, and its answer.
    Peers = 2,
    /// Several snapshot requests and their answers, one after another (from version 5).
    Snapshots = 3,
}

/// The oldest version whose nodes answer several snapshot requests on one connection.
pub(crate) const SNAPSHOTS_WIRE_VERSION: u16 = 5;

/// Snapshot requests one connection carries at most.
pub(crate) const MAX_SNAPSHOT_REQUESTS: usize = 64;

/// Bytes of one of several snapshot requests: group and minimum index.
const SNAPSHOT_REQUEST_ENTRY_BYTES: usize = 16;

/// How a state in the answer to several requests begins; chunks of it follow.
pub(crate) const SNAPSHOTS_STATE: u8 = 0;

/// How a refusal in the answer to several requests begins; its reason follows.
pub(crate) const SNAPSHOTS_REFUSED: u8 = 1;

/// The largest chunk of a state in the answer to several requests.
pub(crate) const MAX_SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;

/// The request for `requests`' states, `(group, min index)` each (at most
/// [`MAX_SNAPSHOT_REQUESTS`]), after a hello of purpose [`Purpose::Snapshots`].
pub(crate) fn encode_snapshot_requests(requests: &[(u64, u64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + requests.len() * SNAPSHOT_REQUEST_ENTRY_BYTES);
    out.extend_from_slice(&(requests.len() as u16).to_le_bytes());
    for &(group, min_index) in requests {
        out.extend_from_slice(&group.to_le_bytes());
        out.extend_from_slice(&min_index.to_le_bytes());
    }
    out
}

/// The bytes of the requests that `count` announces, checked before they are read: none, or
/// more than [`MAX_SNAPSHOT_REQUESTS`], is refused.
pub(crate) fn snapshot_requests_bytes(count: [u8; 2]) -> Result<usize, FrameError> {
    let count = u16::from_le_bytes(count) as usize;
    if count == 0 || count > MAX_SNAPSHOT_REQUESTS {
        return Err(FrameError::Malformed(format!(
            "{count} snapshot requests (1 to {MAX_SNAPSHOT_REQUESTS} are taken)"
        )));
    }
    Ok(count * SNAPSHOT_REQUEST_ENTRY_BYTES)
}

/// The `(group, min index)` pairs of the requests read as [`snapshot_requests_bytes`] said.
pub(crate) fn decode_snapshot_requests(bytes: &[u8]) -> Vec<(u64, u64)> {
    bytes
        .chunks_exact(SNAPSHOT_REQUEST_ENTRY_BYTES)
        .map(|entry| {
            let (group, min_index) = entry.split_at(8);
            (
                u64::from_le_bytes(group.try_into().expect("8 bytes")),
                u64::from_le_bytes(min_index.try_into().expect("8 bytes")),
            )
        })
        .collect()
}

/// Bytes of a snapshot request after the hello: group and minimum index.
pub(crate) const SNAPSHOT_REQUEST_BYTES: usize = 16;

/// How the answer to a snapshot request begins when it is a refusal.
pub(crate) const SNAPSHOT_REFUSED: &[u8; 8] = b"CNCDFAIL";

/// The longest client URL a hello may carry.
pub(crate) const MAX_CLIENT_URL_BYTES: usize = 1024;

/// Bytes of a frame's length prefix.
pub(crate) const LENGTH_BYTES: usize = 4;

/// Fixed bytes of one message in a body, besides the raft message itself.
const MESSAGE_HEADER_BYTES: usize = 8 + 8 + 4;

/// What opens a connection: who dials, in which cluster, speaking which version, where its
/// clients reach it (its HTTP URL, say; empty if it has none), so that every node can name
/// any node's client address, how long it keeps its vote after hearing from a leader, and
/// which run of the node dials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    pub(crate) wire_version: u16,
    pub(crate) cluster_id: u64,
    pub(crate) node_id: NodeId,
    pub(crate) purpose: Purpose,
    pub(crate) client_url: String,
    /// How long the sender, having heard from a leader, refuses to vote for another (whole
    /// milliseconds, rounded down). Sent from version 4 on; a hello of an older version reads
    /// as `None`.
    pub(crate) vote_quiet: Option<Duration>,
    /// Which run of the sender this is: drawn by its network when it starts, the same on all
    /// of that run's connections. Sent from version 5 on; a hello of an older version reads
    /// as `None`.
    pub(crate) incarnation: Option<u64>,
}

/// Why bytes from a peer were refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FrameError {
    #[error("not a Concord peer (the connection did not start with the hello)")]
    BadMagic,
    #[error("frame of {bytes} bytes exceeds the limit of {limit_bytes} bytes")]
    TooLarge { bytes: usize, limit_bytes: usize },
    #[error("malformed frame: {0}")]
    Malformed(String),
}

impl Hello {
    /// The hello's bytes, laid out as its `wire_version` says (a client URL past
    /// [`MAX_CLIENT_URL_BYTES`] is refused when the network is configured, so it never
    /// reaches here).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let url = &self.client_url.as_bytes()[..self.client_url.len().min(MAX_CLIENT_URL_BYTES)];
        let mut out = Vec::with_capacity(HELLO_HEAD_BYTES + url.len() + self.trailer_bytes());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.wire_version.to_le_bytes());
        out.extend_from_slice(&self.cluster_id.to_le_bytes());
        out.extend_from_slice(&self.node_id.to_le_bytes());
        out.push(self.purpose as u8);
        out.extend_from_slice(&(url.len() as u16).to_le_bytes());
        out.extend_from_slice(url);
        if self.wire_version >= VOTE_QUIET_WIRE_VERSION {
            let quiet = self.vote_quiet.unwrap_or(Duration::ZERO).as_millis();
            out.extend_from_slice(&u32::try_from(quiet).unwrap_or(u32::MAX).to_le_bytes());
        }
        if self.wire_version >= INCARNATION_WIRE_VERSION {
            out.extend_from_slice(&self.incarnation.unwrap_or(0).to_le_bytes());
        }
        out
    }

    /// The head of a hello, and the bytes of the rest that follows it: the client URL (its
    /// length checked against [`MAX_CLIENT_URL_BYTES`] before anything is read) and, from
    /// version 4, the vote quiet and from version 5 the incarnation.
    pub(crate) fn decode_head(
        bytes: &[u8; HELLO_HEAD_BYTES],
    ) -> Result<(Hello, usize), FrameError> {
        if bytes[..4] != MAGIC {
            return Err(FrameError::BadMagic);
        }
        let mut reader = Reader { bytes: &bytes[4..] };
        let wire_version = reader.u16()?;
        let cluster_id = reader.u64()?;
        let node_id = reader.u64()?;
        let purpose = match reader.take(1)?[0] {
            0 => Purpose::Messages,
            1 => Purpose::Snapshot,
            2 => Purpose::Peers,
            3 => Purpose::Snapshots,
            other => {
                return Err(FrameError::Malformed(format!(
                    "unknown connection purpose {other}"
                )));
            }
        };
        let hello = Hello {
            wire_version,
            cluster_id,
            node_id,
            purpose,
            client_url: String::new(),
            vote_quiet: None,
            incarnation: None,
        };
        let url_bytes = reader.u16()? as usize;
        if url_bytes > MAX_CLIENT_URL_BYTES {
            return Err(FrameError::TooLarge {
                bytes: url_bytes,
                limit_bytes: MAX_CLIENT_URL_BYTES,
            });
        }
        let rest_bytes = url_bytes + hello.trailer_bytes();
        Ok((hello, rest_bytes))
    }

    /// Bytes after the client URL in a hello of this one's version.
    fn trailer_bytes(&self) -> usize {
        let mut bytes = 0;
        if self.wire_version >= VOTE_QUIET_WIRE_VERSION {
            bytes += VOTE_QUIET_BYTES;
        }
        if self.wire_version >= INCARNATION_WIRE_VERSION {
            bytes += INCARNATION_BYTES;
        }
        bytes
    }

    /// Sets what was read after the head: the client URL, and the vote quiet and the
    /// incarnation if this version's hellos carry them.
    pub(crate) fn set_rest(&mut self, mut bytes: Vec<u8>) -> Result<(), FrameError> {
        let url_bytes = bytes
            .len()
            .checked_sub(self.trailer_bytes())
            .ok_or_else(|| {
                FrameError::Malformed("the hello is shorter than its version's".into())
            })?;
        let mut trailer = Reader {
            bytes: &bytes[url_bytes..],
        };
        if self.wire_version >= VOTE_QUIET_WIRE_VERSION {
            let quiet_ms = trailer.u32()?;
            self.vote_quiet = Some(Duration::from_millis(u64::from(quiet_ms)));
        }
        if self.wire_version >= INCARNATION_WIRE_VERSION {
            self.incarnation = Some(trailer.u64()?);
        }
        bytes.truncate(url_bytes);
        self.client_url = String::from_utf8(bytes)
            .map_err(|_| FrameError::Malformed("the client URL is not UTF-8".into()))?;
        Ok(())
    }
}

/// The body length a frame's prefix announces, refused past `limit_bytes` before anything is
/// read or allocated.
pub(crate) fn body_length(
    prefix: [u8; LENGTH_BYTES],
    limit_bytes: usize,
) -> Result<usize, FrameError> {
    let bytes = u32::from_le_bytes(prefix) as usize;
    if bytes > limit_bytes {
        return Err(FrameError::TooLarge { bytes, limit_bytes });
    }
    Ok(bytes)
}

/// Appends one frame carrying `messages` (length prefix included) to `out`.
pub(crate) fn encode_frame(messages: &[GroupMessage], out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; LENGTH_BYTES]);
    out.extend_from_slice(&(messages.len() as u32).to_le_bytes());
    for message in messages {
        out.extend_from_slice(&message.group.to_le_bytes());
        out.extend_from_slice(&message.replicated_floor.to_le_bytes());
        let length_at = out.len();
        out.extend_from_slice(&[0; 4]);
        message
            .message
            .write_to_vec(out)
            .expect("encoding a protobuf message into a Vec cannot fail");
        let length = (out.len() - length_at - 4) as u32;
        out[length_at..length_at + 4].copy_from_slice(&length.to_le_bytes());
    }
    let body = (out.len() - start - LENGTH_BYTES) as u32;
    out[start..start + LENGTH_BYTES].copy_from_slice(&body.to_le_bytes());
}

/// The messages of a frame's body.
pub(crate) fn decode_body(body: &[u8]) -> Result<Vec<GroupMessage>, FrameError> {
    let mut reader = Reader { bytes: body };
    let count = reader.u32()? as usize;
    // Every message takes at least its header: a count the body cannot hold is refused
    // before it sizes anything.
    if count > reader.bytes.len() / MESSAGE_HEADER_BYTES {
        return Err(FrameError::Malformed(format!(
            "{count} messages announced in {} bytes",
            body.len()
        )));
    }
    let mut messages = Vec::with_capacity(count);
    for _ in 0..count {
        let group = reader.u64()?;
        let replicated_floor = reader.u64()?;
        let length = reader.u32()? as usize;
        let bytes = reader.take(length)?;
        let message = Message::parse_from_bytes(bytes)
            .map_err(|error| FrameError::Malformed(format!("raft message: {error}")))?;
        messages.push(GroupMessage {
            group,
            message,
            replicated_floor,
        });
    }
    if !reader.bytes.is_empty() {
        return Err(FrameError::Malformed(format!(
            "{} bytes after the last message",
            reader.bytes.len()
        )));
    }
    Ok(messages)
}

/// Reads little-endian fields off the front of a slice, refusing to run past its end.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, length: usize) -> Result<&'a [u8], FrameError> {
        if length > self.bytes.len() {
            return Err(FrameError::Malformed(format!(
                "{length} bytes announced, {} left",
                self.bytes.len()
            )));
        }
        let (taken, rest) = self.bytes.split_at(length);
        self.bytes = rest;
        Ok(taken)
    }

    fn u16(&mut self) -> Result<u16, FrameError> {
        let bytes = self.take(2)?;
        Ok(u16::from_le_bytes([bytes[0], bytes[1]]))
    }

    fn u32(&mut self) -> Result<u32, FrameError> {
        let mut out = [0u8; 4];
        out.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(out))
    }

    fn u64(&mut self) -> Result<u64, FrameError> {
        let mut out = [0u8; 8];
        out.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(out))
    }
}

#[cfg(test)]
mod tests {
    use concord_storage::raft::prelude::{Entry, MessageType};

    use super::*;

    fn sample() -> Vec<GroupMessage> {
        (0..3u64)
            .map(|group| {
                let mut message = Message::default();
                message.set_msg_type(MessageType::MsgAppend);
                message.from = 1;
                message.to = 2;
                message.term = 7;
                message.index = group * 10;
                let mut entry = Entry::default();
                entry.index = group * 10 + 1;
                entry.term = 7;
                entry.data = vec![group as u8; 100].into();
                message.entries = vec![entry].into();
                GroupMessage {
                    group,
                    message,
                    replicated_floor: group + 5,
                }
            })
            .collect()
    }

    #[test]
    fn frames_and_hellos_round_trip() {
        let messages = sample();
        let mut frame = Vec::new();
        encode_frame(&messages, &mut frame);
        let prefix: [u8; 4] = frame[..4].try_into().unwrap();
        let length = body_length(prefix, 1 << 20).unwrap();
        assert_eq!(length, frame.len() - 4);
        let decoded = decode_body(&frame[4..]).unwrap();
        assert_eq!(decoded.len(), messages.len());
        for (a, b) in decoded.iter().zip(&messages) {
            assert_eq!(a.group, b.group);
            assert_eq!(a.replicated_floor, b.replicated_floor);
            assert_eq!(a.message, b.message);
        }
        let hello = Hello {
            wire_version: WIRE_VERSION,
            cluster_id: 0xC0FFEE,
            node_id: 3,
            purpose: Purpose::Snapshot,
            client_url: "http://127.0.0.1:8080".into(),
            vote_quiet: Some(Duration::from_millis(855)),
            incarnation: Some(0xFEED_F00D_0000_0001),
        };
        let bytes = hello.encode();
        let head: [u8; HELLO_HEAD_BYTES] = bytes[..HELLO_HEAD_BYTES].try_into().unwrap();
        let (mut decoded, rest_bytes) = Hello::decode_head(&head).unwrap();
        assert_eq!(rest_bytes, bytes.len() - HELLO_HEAD_BYTES);
        decoded
            .set_rest(bytes[HELLO_HEAD_BYTES..].to_vec())
            .unwrap();
        assert_eq!(decoded, hello);
        // Version 3's hello ends with the URL: read as such, it says no quiet. Version 4's
        // ends with the quiet: read as such, it says no incarnation.
        for (version, quiet, trailer_bytes) in [(3, None, 0), (4, hello.vote_quiet, 4)] {
            let older = Hello {
                wire_version: version,
                vote_quiet: quiet,
                incarnation: None,
                ..hello.clone()
            };
            let bytes = older.encode();
            let older_head: [u8; HELLO_HEAD_BYTES] = bytes[..HELLO_HEAD_BYTES].try_into().unwrap();
            let (mut decoded_older, rest_bytes) = Hello::decode_head(&older_head).unwrap();
            assert_eq!(rest_bytes, older.client_url.len() + trailer_bytes);
            decoded_older
                .set_rest(bytes[HELLO_HEAD_BYTES..].to_vec())
                .unwrap();
            assert_eq!(decoded_older, older);
        }
        // A quiet past a u32 of milliseconds is sent as the longest one (never wraps); the
        // incarnation follows it.
        let long = Hello {
            vote_quiet: Some(Duration::from_secs(u64::MAX / 4)),
            ..hello.clone()
        };
        let encoded = long.encode();
        let quiet_at = encoded.len() - INCARNATION_BYTES - 4;
        assert_eq!(encoded[quiet_at..quiet_at + 4], u32::MAX.to_le_bytes());
        assert_eq!(
            encoded[quiet_at + 4..],
            0xFEED_F00D_0000_0001_u64.to_le_bytes()
        );
        assert!(matches!(
            decoded.clone().set_rest(vec![1, 2]),
            Err(FrameError::Malformed(_))
        ));
        let mut foreign = head;
        foreign[0] = b'X';
        assert_eq!(Hello::decode_head(&foreign), Err(FrameError::BadMagic));
        let mut long_url = head;
        long_url[23..25].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(matches!(
            Hello::decode_head(&long_url),
            Err(FrameError::TooLarge { .. })
        ));
        let mut not_utf8 = vec![0xFF, 0xFE];
        not_utf8.extend_from_slice(&[0; 4 + INCARNATION_BYTES]);
        assert!(decoded.set_rest(not_utf8).is_err());
        let mut unknown_purpose = head;
        unknown_purpose[22] = 9;
        assert!(matches!(
            Hello::decode_head(&unknown_purpose),
            Err(FrameError::Malformed(_))
        ));
    }

    #[test]
    fn snapshot_requests_round_trip_and_their_count_is_checked_first() {
        let requests = [(7, 120), (u64::MAX, 0), (3, u64::MAX)];
        let bytes = encode_snapshot_requests(&requests);
        let length = snapshot_requests_bytes([bytes[0], bytes[1]]).unwrap();
        assert_eq!(length, bytes.len() - 2);
        assert_eq!(decode_snapshot_requests(&bytes[2..]), requests);
        for count in [0u16, MAX_SNAPSHOT_REQUESTS as u16 + 1, u16::MAX] {
            assert!(matches!(
                snapshot_requests_bytes(count.to_le_bytes()),
                Err(FrameError::Malformed(_))
            ));
        }
        assert_eq!(
            snapshot_requests_bytes((MAX_SNAPSHOT_REQUESTS as u16).to_le_bytes()),
            Ok(MAX_SNAPSHOT_REQUESTS * 16)
        );
    }

    #[test]
    fn every_cut_and_flip_is_an_error_or_a_frame_never_a_panic() {
        let mut frame = Vec::new();
        encode_frame(&sample(), &mut frame);
        let body = &frame[4..];
        for cut in 0..body.len() {
            assert!(decode_body(&body[..cut]).is_err(), "cut at {cut} decoded");
        }
        for at in 0..body.len() {
            let mut damaged = body.to_vec();
            damaged[at] ^= 0xFF;
            let _ = decode_body(&damaged); // Either way, no panic.
        }
    }

    #[test]
    fn announced_sizes_are_checked_before_allocating() {
        assert_eq!(
            body_length(u32::MAX.to_le_bytes(), 1 << 20),
            Err(FrameError::TooLarge {
                bytes: u32::MAX as usize,
                limit_bytes: 1 << 20
            })
        );
        // A count of four billion messages in a 4-byte body.
        assert!(matches!(
            decode_body(&u32::MAX.to_le_bytes()),
            Err(FrameError::Malformed(_))
        ));
    }

    #[test]
    fn hostile_bytes_are_refused_never_a_panic() {
        let mut frame = Vec::new();
        encode_frame(&sample(), &mut frame);
        let hello = Hello {
            wire_version: WIRE_VERSION,
            cluster_id: 1,
            node_id: 2,
            purpose: Purpose::Messages,
            client_url: "http://127.0.0.1:1".into(),
            vote_quiet: Some(Duration::from_millis(900)),
            incarnation: Some(7),
        }
        .encode();
        let valid = vec![frame[4..].to_vec(), hello];
        for input in concord_storage::testing::hostile_inputs(&valid, 5, 3_000) {
            let _ = decode_body(&input);
            if let Some(head) = input.get(..HELLO_HEAD_BYTES)
                && let Ok((mut hello, rest_bytes)) = Hello::decode_head(head.try_into().unwrap())
                && let Some(rest) = input.get(HELLO_HEAD_BYTES..HELLO_HEAD_BYTES + rest_bytes)
            {
                let _ = hello.set_rest(rest.to_vec());
            }
            if let Some(prefix) = input.get(..4) {
                let _ = body_length(prefix.try_into().unwrap(), 1 << 20);
            }
        }
    }
}
