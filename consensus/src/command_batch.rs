//! Many commands packed into one raft entry: the application-level batching that lets one
//! entry, one append and one apply serve thousands of callers.
//!
//! Layout: `version u8 = 1 | count u32 | (len u32 | bytes) * count`, little-endian. An admin
//! command (`Consensus::propose_admin`) has an entry of its own: `version u8 = 2 | bytes`.
//! Entries come from peers, so decoding bounds every length against the entry itself.

use bytes::Bytes;

const VERSION: u8 = 1;
const ADMIN_VERSION: u8 = 2;

/// What an entry carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EntryKind {
    /// Clients' commands, for `StateMachine::apply`.
    Client,
    /// One admin command, for `StateMachine::apply_admin`.
    Admin,
}

/// Encodes `commands` into one entry payload (a `Vec`, which is what raft-rs's `propose`
/// takes: no copy on the way into the log).
pub(crate) fn encode<'a, I>(commands: I) -> Vec<u8>
where
    I: ExactSizeIterator<Item = &'a [u8]> + Clone,
{
    let total: usize = commands.clone().map(|c| 4 + c.len()).sum();
    let mut out = Vec::with_capacity(1 + 4 + total);
    out.push(VERSION);
    out.extend_from_slice(&(commands.len() as u32).to_le_bytes());
    for command in commands {
        out.extend_from_slice(&(command.len() as u32).to_le_bytes());
        out.extend_from_slice(command);
    }
    out
}

/// Encodes an admin command into an entry payload of its own.
pub(crate) fn encode_admin(command: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + command.len());
    out.push(ADMIN_VERSION);
    out.extend_from_slice(command);
    out
}

/// `true` if `data` is an admin command's entry payload (see [`encode_admin`]).
pub(crate) fn is_admin(data: &[u8]) -> bool {
    data.first() == Some(&ADMIN_VERSION)
}

/// Bytes [`encode`] adds around a command.
pub(crate) const PER_COMMAND_OVERHEAD_BYTES: usize = 4;

/// How many commands an entry payload says it carries, without decoding it: a size hint,
/// bounded by what the payload can hold (each command takes at least 4 bytes), 0 for a payload
/// that is not a batch.
pub(crate) fn command_count(data: &[u8]) -> usize {
    if is_admin(data) {
        return 1;
    }
    match data.split_first() {
        Some((&VERSION, rest)) => {
            let claimed = read_u32(rest, 0).unwrap_or(0) as usize;
            claimed.min(rest.len().saturating_sub(4) / 4)
        }
        _ => 0,
    }
}

/// Decodes an entry payload into its commands (zero-copy slices of `data`), replacing what
/// `commands` held: the apply thread reuses one vector for every entry, since entries of
/// thousands of commands would otherwise each take a fresh large allocation.
/// An admin entry decodes to its one command. On error `commands` is left empty.
pub(crate) fn decode_into(data: &Bytes, commands: &mut Vec<Bytes>) -> Result<EntryKind, String> {
    commands.clear();
    if is_admin(data) {
        commands.push(data.slice(1..));
        return Ok(EntryKind::Admin);
    }
    let decoded = push_commands(data, commands);
    if decoded.is_err() {
        commands.clear();
    }
    decoded.map(|()| EntryKind::Client)
}

fn push_commands(data: &Bytes, commands: &mut Vec<Bytes>) -> Result<(), String> {
    let bytes = data.as_ref();
    let (&version, rest) = bytes.split_first().ok_or("empty entry payload")?;
    if version != VERSION {
        return Err(format!("unknown command batch version {version}"));
    }
    let count = read_u32(rest, 0).ok_or("truncated command count")? as usize;
    // Each command takes at least its 4-byte length: a larger count is a lie.
    if count > rest.len().saturating_sub(4) / 4 {
        return Err(format!(
            "command count {count} exceeds what the entry can hold"
        ));
    }
    commands.reserve(count);
    let mut offset = 1 + 4;
    for index in 0..count {
        let len = read_u32(bytes, offset)
            .ok_or_else(|| format!("command {index}: truncated length"))?
            as usize;
        offset += 4;
        let end = offset
            .checked_add(len)
            .filter(|&end| end <= bytes.len())
            .ok_or_else(|| format!("command {index}: length {len} runs past the entry"))?;
        commands.push(data.slice(offset..end));
        offset = end;
    }
    if offset != bytes.len() {
        return Err(format!(
            "{} trailing bytes after the last command",
            bytes.len() - offset
        ));
    }
    Ok(())
}

fn read_u32(bytes: &[u8], offset: usize) -> Option<u32> {
    let slice = bytes.get(offset..offset.checked_add(4)?)?;
    Some(u32::from_le_bytes(slice.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_count_is_read_from_the_header_and_bounded_by_the_payload() {
        let commands: [&[u8]; 3] = [b"a", b"bc", b""];
        assert_eq!(command_count(&encode(commands.iter().copied())), 3);
        assert_eq!(command_count(&encode_admin(b"admin")), 1);
        assert_eq!(command_count(b""), 0);
        assert_eq!(command_count(b"\x07garbage"), 0);
        // A count no payload of this size can hold is cut to what it could.
        let mut lying = vec![VERSION];
        lying.extend_from_slice(&u32::MAX.to_le_bytes());
        lying.extend_from_slice(&[0; 12]);
        assert_eq!(command_count(&lying), 3);
    }

    fn decode(data: &Bytes) -> Result<Vec<Bytes>, String> {
        let mut commands = vec![Bytes::from_static(b"left over")];
        decode_into(data, &mut commands).map(|kind| {
            assert_eq!(kind, EntryKind::Client);
            commands
        })
    }

    fn encode_all(commands: &[Bytes]) -> Bytes {
        Bytes::from(encode(commands.iter().map(|c| c.as_ref())))
    }

    #[test]
    fn round_trip_and_every_truncation_fails() {
        let commands = vec![
            Bytes::from_static(b"a"),
            Bytes::new(),
            Bytes::from(vec![7; 300]),
        ];
        let data = encode_all(&commands);
        assert_eq!(decode(&data).unwrap(), commands);
        let mut reused = Vec::new();
        for cut in 0..data.len() {
            assert!(
                decode_into(&data.slice(..cut), &mut reused).is_err(),
                "cut at {cut}"
            );
            assert!(reused.is_empty(), "a failed decode leaves no commands");
        }
        let mut longer = data.to_vec();
        longer.push(0);
        assert!(decode(&Bytes::from(longer)).is_err());
    }

    #[test]
    fn an_admin_command_is_its_own_kind_of_entry() {
        let mut commands = Vec::new();
        let data = Bytes::from(encode_admin(b"upgrade"));
        assert_eq!(decode_into(&data, &mut commands), Ok(EntryKind::Admin));
        assert_eq!(commands, vec![Bytes::from_static(b"upgrade")]);
        let empty = Bytes::from(encode_admin(b""));
        assert_eq!(decode_into(&empty, &mut commands), Ok(EntryKind::Admin));
        assert_eq!(commands, vec![Bytes::new()]);
        // A client batch holding the same bytes stays a client batch.
        let client = encode_all(&[Bytes::from_static(b"\x02upgrade")]);
        assert_eq!(
            decode(&client).unwrap(),
            vec![Bytes::from_static(b"\x02upgrade")]
        );
    }

    #[test]
    fn a_huge_count_is_refused_without_allocating() {
        let mut data = vec![VERSION];
        data.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&Bytes::from(data)).unwrap_err().contains("exceeds"));
    }

    #[test]
    fn hostile_batches_are_refused_never_a_panic() {
        let commands = [Bytes::from_static(b"one"), Bytes::from(vec![7u8; 200])];
        let valid = vec![encode_all(&commands).to_vec()];
        let mut decoded = Vec::new();
        for input in concord_storage::testing::hostile_inputs(&valid, 7, 3_000) {
            decoded.clear();
            let _ = decode_into(&Bytes::from(input), &mut decoded);
        }
    }
}
