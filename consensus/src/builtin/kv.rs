//! A key-value map: put, delete and compare-and-set.

use bytes::{BufMut, Bytes, BytesMut};
use concord_storage::StateTransaction;

use crate::{ApplyError, CommandError, CommandResult, StateMachine};

/// A command of [`KvStateMachine`]. Encoded as `op u8 | key_len u16 | key | rest`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvCommand {
    /// Sets `key` to `value`; the result is empty.
    Put {
        /// The key (1 to 65535 bytes).
        key: Vec<u8>,
        /// The value.
        value: Vec<u8>,
    },
    /// Removes `key`; the result is the removed value, empty if there was none.
    Delete {
        /// The key.
        key: Vec<u8>,
    },
}

const OP_PUT: u8 = 1;
const OP_DELETE: u8 = 2;

impl KvCommand {
    /// The command's bytes.
    pub fn encode(&self) -> Bytes {
        let (op, key, value): (u8, &[u8], &[u8]) = match self {
            KvCommand::Put { key, value } => (OP_PUT, key, value),
            KvCommand::Delete { key } => (OP_DELETE, key, &[]),
        };
        let mut out = BytesMut::with_capacity(3 + key.len() + value.len());
        out.put_u8(op);
        out.put_u16_le(key.len().min(u16::MAX as usize) as u16);
        out.put_slice(key);
        out.put_slice(value);
        out.freeze()
    }

    /// Decodes a command, or says why it is malformed.
    pub fn decode(bytes: &[u8]) -> Result<KvCommand, String> {
        if bytes.len() < 3 {
            return Err("a kv command is at least 3 bytes".into());
        }
        let key_len = u16::from_le_bytes([bytes[1], bytes[2]]) as usize;
        let key = bytes
            .get(3..3 + key_len)
            .ok_or("the key runs past the command")?
            .to_vec();
        let rest = &bytes[3 + key_len..];
        match bytes[0] {
            OP_PUT => Ok(KvCommand::Put {
                key,
                value: rest.to_vec(),
            }),
            OP_DELETE if rest.is_empty() => Ok(KvCommand::Delete { key }),
            OP_DELETE => Err("a delete carries no value".into()),
            op => Err(format!("unknown kv operation {op}")),
        }
    }
}

/// A replicated key-value map over the group's state.
#[derive(Debug, Default)]
pub struct KvStateMachine;

impl StateMachine for KvStateMachine {
    fn apply(
        &mut self,
        txn: &mut StateTransaction<'_>,
        commands: &[Bytes],
    ) -> Result<Vec<CommandResult>, ApplyError> {
        let mut results = Vec::with_capacity(commands.len());
        for command in commands {
            let result = match KvCommand::decode(command) {
                Err(reason) => Err(CommandError::new(1, reason)),
                Ok(KvCommand::Put { key, value }) => match txn.put(&key, &value) {
                    Ok(()) => Ok(Bytes::new()),
                    // Oversized or empty keys are the command's fault, the same everywhere.
                    Err(error) => Err(CommandError::new(3, error.to_string())),
                },
                Ok(KvCommand::Delete { key }) => {
                    let old = txn.get(&key)?;
                    match txn.delete(&key) {
                        Ok(()) => Ok(old.map(Bytes::from).unwrap_or_default()),
                        Err(error) => Err(CommandError::new(3, error.to_string())),
                    }
                }
            };
            results.push(result);
        }
        Ok(results)
    }

    fn applies_quickly(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_commands_are_refused_never_a_panic() {
        let valid = vec![
            KvCommand::Put {
                key: b"key".to_vec(),
                value: b"value".to_vec(),
            }
            .encode()
            .to_vec(),
            KvCommand::Delete { key: b"k".to_vec() }.encode().to_vec(),
        ];
        for input in concord_storage::testing::hostile_inputs(&valid, 10, 2_000) {
            let _ = KvCommand::decode(&input);
        }
    }
}
