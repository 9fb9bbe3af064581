//! The admin command that switches a group to another module: proposed through
//! `Consensus::propose_admin` (so no client command can pass for one) in every group of a
//! plugin, applied by [`crate::VersionedMachine`] exactly at its entry on every replica.
//!
//! Layout: `version u8 = 1 | op u8 = 1 (upgrade) | the module's bytes`.

use bytes::Bytes;

const VERSION: u8 = 1;
const OP_UPGRADE: u8 = 1;

/// The code of an upgrade the group refused: the module does not load here, or its
/// `concord_migrate` failed (the group keeps running the module it ran).
pub const UPGRADE_REFUSED: u32 = 0xad01;

/// The code of an admin command this host does not know.
pub const ADMIN_COMMAND_UNKNOWN: u32 = 0xad02;

/// The admin command that switches a group to `module`.
pub fn encode_upgrade(module: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(2 + module.len());
    out.extend_from_slice(&[VERSION, OP_UPGRADE]);
    out.extend_from_slice(module);
    Bytes::from(out)
}

/// The module an upgrade command carries, or why the bytes are not one.
pub(crate) fn decode_upgrade(command: &Bytes) -> Result<Bytes, String> {
    match command.as_ref() {
        [VERSION, OP_UPGRADE, ..] => Ok(command.slice(2..)),
        [VERSION, op, ..] => Err(format!("unknown admin operation {op}")),
        [version, ..] => Err(format!("unknown admin command version {version}")),
        [] => Err("an empty admin command".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upgrade_round_trips_and_other_bytes_are_refused() {
        let command = encode_upgrade(b"\0asm module");
        assert_eq!(decode_upgrade(&command).unwrap(), &b"\0asm module"[..]);
        for bad in [&b""[..], b"\x02\x01x", b"\x01\x07x"] {
            assert!(decode_upgrade(&Bytes::copy_from_slice(bad)).is_err());
        }
    }
}
