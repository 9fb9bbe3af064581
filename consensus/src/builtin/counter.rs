//! A counter: each command adds a signed amount and returns the new total.

use bytes::Bytes;
use concord_storage::StateTransaction;

use crate::{ApplyError, CommandError, CommandResult, StateMachine};

const KEY: &[u8] = b"counter";

/// Commands are 8-byte little-endian `i64` deltas (an empty command adds 1); the result is the
/// new total as 8 bytes. Overflow is a command error.
#[derive(Debug, Default)]
pub struct CounterStateMachine;

impl StateMachine for CounterStateMachine {
    fn apply(
        &mut self,
        txn: &mut StateTransaction<'_>,
        commands: &[Bytes],
    ) -> Result<Vec<CommandResult>, ApplyError> {
        let mut total = match txn.get(KEY)? {
            Some(bytes) => i64::from_le_bytes(bytes.as_slice().try_into().map_err(|_| {
                ApplyError::Fatal(format!("counter value of {} bytes", bytes.len()))
            })?),
            None => 0,
        };
        let start = total;
        let mut results = Vec::with_capacity(commands.len());
        for command in commands {
            let delta = match command.len() {
                0 => Ok(1),
                8 => Ok(i64::from_le_bytes(
                    command.as_ref().try_into().expect("8 bytes"),
                )),
                n => Err(CommandError::new(
                    1,
                    format!("a counter command is 0 or 8 bytes, not {n}"),
                )),
            };
            results.push(delta.and_then(|delta| {
                total = total
                    .checked_add(delta)
                    .ok_or_else(|| CommandError::new(2, "counter overflow"))?;
                Ok(Bytes::copy_from_slice(&total.to_le_bytes()))
            }));
        }
        if total != start {
            txn.put(KEY, &total.to_le_bytes())?;
        }
        Ok(results)
    }

    fn applies_quickly(&self) -> bool {
        true
    }
}
