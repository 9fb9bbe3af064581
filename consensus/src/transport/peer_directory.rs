//! The peers a node knows, asked of another node over a connection of its own (purpose
//! [`super::frame::Purpose::Peers`]).
//!
//! A node learns a member's raft address from the membership change that added it and keeps
//! it in its peers file. A node that lost its data directory and was started again with a
//! member list older than the cluster's knows neither: a member added since dials it and is
//! refused as unknown, so the groups that member leads never reach the node. Such a refusal
//! makes the node ask the peers it does know where the caller is (`TcpNetwork`); if every peer
//! that answers names it at one address, the node dials it there and takes its next dial.
//! Only peers are asked, and only peers answer (the hello is checked first).
//!
//! The answer, little-endian: a peer count `u16`, then per peer its node id `u64`, the length
//! of its address `u8` and the address as text (`127.0.0.1:7170`).

use std::io::{Error, ErrorKind, Read};
use std::net::SocketAddr;
use std::time::Instant;

use crate::NodeId;

/// Most peers an answer carries, and an asker reads.
pub(super) const MAX_PEERS: usize = 4096;

/// The answer listing `peers` (the first [`MAX_PEERS`] of them).
pub(super) fn encode(peers: &[(NodeId, SocketAddr)]) -> Vec<u8> {
    let peers = &peers[..peers.len().min(MAX_PEERS)];
    let mut out = Vec::with_capacity(2 + peers.len() * 32);
    out.extend_from_slice(&(peers.len() as u16).to_le_bytes());
    for (node, address) in peers {
        // A socket address as text is at most 47 bytes (IPv6 with a scope and a port).
        let text = address.to_string();
        out.extend_from_slice(&node.to_le_bytes());
        out.push(text.len() as u8);
        out.extend_from_slice(text.as_bytes());
    }
    out
}

/// Reads an answer from a peer: every count is checked before anything is allocated, and an
/// answer that is not one is an `InvalidData` error.
pub(super) fn decode(reader: &mut impl Read) -> std::io::Result<Vec<(NodeId, SocketAddr)>> {
    let invalid = |what: String| Error::new(ErrorKind::InvalidData, what);
    let mut count = [0u8; 2];
    reader.read_exact(&mut count)?;
    let count = u16::from_le_bytes(count) as usize;
    if count > MAX_PEERS {
        return Err(invalid(format!("{count} peers, more than {MAX_PEERS}")));
    }
    let mut peers = Vec::with_capacity(count);
    for _ in 0..count {
        let mut head = [0u8; 9];
        reader.read_exact(&mut head)?;
        let node = u64::from_le_bytes(head[..8].try_into().expect("eight bytes"));
        let mut text = vec![0u8; head[8] as usize];
        reader.read_exact(&mut text)?;
        let address = std::str::from_utf8(&text)
            .ok()
            .and_then(|text| text.parse::<SocketAddr>().ok())
            .ok_or_else(|| invalid(format!("node {node}'s address is not ip:port")))?;
        peers.push((node, address));
    }
    Ok(peers)
}

/// Reads from `inner` until `deadline`, then fails every read: a peer that answers a byte at a
/// time holds a lookup no longer than the deadline and one read's timeout.
pub(super) struct UntilDeadline<R> {
    pub(super) inner: R,
    pub(super) deadline: Instant,
}

impl<R: Read> Read for UntilDeadline<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if Instant::now() >= self.deadline {
            return Err(Error::new(
                ErrorKind::TimedOut,
                "the peers' list took too long",
            ));
        }
        self.inner.read(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_reads_back_as_written() {
        let peers = vec![
            (1, "127.0.0.1:7170".parse().unwrap()),
            (12, "[::1]:7171".parse().unwrap()),
        ];
        assert_eq!(decode(&mut encode(&peers).as_slice()).unwrap(), peers);
        assert_eq!(decode(&mut encode(&[]).as_slice()).unwrap(), vec![]);
    }

    #[test]
    fn a_bad_answer_is_an_error() {
        let mut answer = encode(&[(1, "127.0.0.1:7170".parse().unwrap())]);
        // Cut short.
        let short = &answer[..answer.len() - 1];
        assert_eq!(
            decode(&mut &short[..]).unwrap_err().kind(),
            ErrorKind::UnexpectedEof
        );
        // An address that is not one.
        let last = answer.len() - 1;
        answer[last] = b'x';
        assert_eq!(
            decode(&mut answer.as_slice()).unwrap_err().kind(),
            ErrorKind::InvalidData
        );
        // A count past the limit, refused before anything is read or allocated.
        let huge = (MAX_PEERS as u16 + 1).to_le_bytes();
        assert_eq!(
            decode(&mut &huge[..]).unwrap_err().kind(),
            ErrorKind::InvalidData
        );
    }

    #[test]
    fn a_read_past_the_deadline_fails() {
        let answer = encode(&[(1, "127.0.0.1:7170".parse().unwrap())]);
        let mut late = UntilDeadline {
            inner: answer.as_slice(),
            deadline: Instant::now(),
        };
        assert_eq!(decode(&mut late).unwrap_err().kind(), ErrorKind::TimedOut);
    }

    #[test]
    fn hostile_answers_are_refused_never_a_panic() {
        let valid = vec![encode(&[
            (1, "127.0.0.1:7170".parse().unwrap()),
            (2, "[::1]:7171".parse().unwrap()),
        ])];
        for input in concord_storage::testing::hostile_inputs(&valid, 7, 3_000) {
            let _ = decode(&mut input.as_slice());
        }
    }
}
