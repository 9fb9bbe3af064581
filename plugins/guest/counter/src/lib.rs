//! The counter plugin: each command adds a signed amount and returns the new total, like
//! `concord_consensus::CounterStateMachine`.
//!
//! A command is an 8-byte little-endian `i64` delta (an empty command adds 1); the result is the
//! new total as 8 bytes. Errors: 1 malformed, 2 overflow.

use concord_plugin_sdk::{CommandError, export_plugin, kv};

const KEY: &[u8] = b"counter";

fn apply(command: &[u8]) -> Result<Vec<u8>, CommandError> {
    let delta = match command {
        [] => 1,
        bytes => i64::from_le_bytes(bytes.try_into().map_err(|_| {
            CommandError::new(
                1,
                format!("a counter command is 0 or 8 bytes, not {}", bytes.len()),
            )
        })?),
    };
    let total = match kv::get(KEY)? {
        None => 0,
        Some(bytes) => i64::from_le_bytes(
            bytes
                .as_slice()
                .try_into()
                .map_err(|_| CommandError::new(1, "the stored counter is not 8 bytes"))?,
        ),
    };
    let total = total
        .checked_add(delta)
        .ok_or_else(|| CommandError::new(2, "counter overflow"))?;
    kv::put(KEY, &total.to_le_bytes())?;
    Ok(total.to_le_bytes().to_vec())
}

export_plugin!(apply);
