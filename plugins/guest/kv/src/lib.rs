//! The kv plugin: put, get, delete and compare-and-set on the group's keys.
//!
//! A command is `op u8 | key_len u16 | key | rest` (little-endian), the encoding of
//! `concord_consensus::KvCommand` for put and delete:
//!
//! | op | rest | result |
//! | --- | --- | --- |
//! | 1 put | the value | empty |
//! | 2 delete | nothing | the removed value, empty if none |
//! | 3 get | nothing | the value; error 2 if absent |
//! | 4 compare-and-set | `expected_present u8 \| expected_len u32 \| expected \| new value` | empty; error 4 if the current value differs |
//!
//! Errors: 1 malformed, 2 not found, 4 compare failed.
//!
//! Built with the `v2` feature (`fixtures/plugins/kv-v2.wasm`), it is the second version the
//! upgrade tests switch to: a put stores `v2:` before the value, and its `concord_migrate`
//! records the identity of the module it replaced under the key `migrated-from`.

use concord_plugin_sdk::{CommandError, export_plugin, kv};

const MALFORMED: u32 = 1;
const NOT_FOUND: u32 = 2;
const COMPARE_FAILED: u32 = 4;

fn malformed(message: &str) -> CommandError {
    CommandError::new(MALFORMED, message)
}

fn apply(command: &[u8]) -> Result<Vec<u8>, CommandError> {
    let [op, len_low, len_high, rest @ ..] = command else {
        return Err(malformed("a kv command is at least 3 bytes"));
    };
    let key_len = u16::from_le_bytes([*len_low, *len_high]) as usize;
    if rest.len() < key_len {
        return Err(malformed("the key runs past the command"));
    }
    let (key, rest) = rest.split_at(key_len);
    match op {
        1 => {
            put_value(key, rest)?;
            Ok(Vec::new())
        }
        2 if rest.is_empty() => {
            let old = kv::get(key)?;
            kv::delete(key)?;
            Ok(old.unwrap_or_default())
        }
        3 if rest.is_empty() => {
            kv::get(key)?.ok_or_else(|| CommandError::new(NOT_FOUND, "no such key"))
        }
        4 => {
            let [present, a, b, c, d, rest @ ..] = rest else {
                return Err(malformed("compare-and-set needs its expected value"));
            };
            let expected_len = u32::from_le_bytes([*a, *b, *c, *d]) as usize;
            if rest.len() < expected_len {
                return Err(malformed("the expected value runs past the command"));
            }
            let (expected, new_value) = rest.split_at(expected_len);
            let expected = match present {
                0 => None,
                1 => Some(expected),
                _ => return Err(malformed("expected_present is 0 or 1")),
            };
            let current = kv::get(key)?;
            if current.as_deref() != expected {
                return Err(CommandError::new(
                    COMPARE_FAILED,
                    "the current value differs",
                ));
            }
            kv::put(key, new_value)?;
            Ok(Vec::new())
        }
        2 | 3 => Err(malformed("get and delete carry no value")),
        op => Err(malformed(&format!("unknown kv operation {op}"))),
    }
}

#[cfg(not(feature = "v2"))]
fn put_value(key: &[u8], value: &[u8]) -> Result<(), CommandError> {
    kv::put(key, value)?;
    Ok(())
}

#[cfg(feature = "v2")]
fn put_value(key: &[u8], value: &[u8]) -> Result<(), CommandError> {
    kv::put(key, &[b"v2:", value].concat())?;
    Ok(())
}

#[cfg(feature = "v2")]
fn migrate(from: &[u8]) -> Result<Vec<u8>, CommandError> {
    kv::put(b"migrated-from", from)?;
    Ok(Vec::new())
}

#[cfg(not(feature = "v2"))]
export_plugin!(apply);
#[cfg(feature = "v2")]
export_plugin!(apply, migrate = migrate);
