//! The binary interface between Concord's wasm host and its state-machine plugins, version 1.
//!
//! A plugin is a core wasm module (target `wasm32-unknown-unknown`). Its *logic* runs in wasm;
//! its *data* lives in the group's state store, reached through the host functions below, which
//! act on the apply transaction of the command being applied.
//!
//! # Exports of the plugin
//!
//! | name | signature | meaning |
//! | --- | --- | --- |
//! | `memory` | memory | the linear memory all pointers refer to |
//! | [`EXPORT_ABI_VERSION`] | `() -> i32` | must return [`ABI_VERSION`] |
//! | [`EXPORT_ALLOC`] | `(len: i32) -> i32` | a buffer of `len` bytes the host may fill |
//! | [`EXPORT_APPLY_BATCH`] | `(ptr: i32, len: i32) -> i32` | applies the encoded batch at `ptr` |
//!
//! `apply_batch` reads a batch encoded by [`encode_batch`], applies its commands in order and
//! reports each command's outcome with [`IMPORT_COMMAND_RESULT`] *before* starting the next:
//! that call is the command boundary. The host commits a command's writes only when its result
//! is reported as a success, and gives each command a fresh fuel budget at the boundary. It
//! returns 0, or a negative number if the batch could not be decoded.
//!
//! # Imports from module [`IMPORT_MODULE`]
//!
//! | name | signature | returns |
//! | --- | --- | --- |
//! | [`IMPORT_KV_GET`] | `(key_ptr, key_len, dst_ptr, dst_cap) -> i64` | [`ABSENT`], or the value's length; the value is written to `dst` only if it fits |
//! | [`IMPORT_KV_PUT`] | `(key_ptr, key_len, value_ptr, value_len) -> i32` | 0, or a negative [`KvStatus`] |
//! | [`IMPORT_KV_DELETE`] | `(key_ptr, key_len) -> i32` | 0, or a negative [`KvStatus`] |
//! | [`IMPORT_KV_SCAN`] | `(start_ptr, start_len, end_ptr, end_len, limit, dst_ptr, dst_cap) -> i64` | the length of the encoded pairs ([`encode_pairs`]); written only if it fits; `end_len = -1` means no end; negative [`KvStatus`] on a bad argument |
//! | [`IMPORT_COMMAND_RESULT`] | `(status, ptr, len)` | nothing; `status` 0 is success with the result bytes, otherwise an error code with a UTF-8 message |
//!
//! Scans cover `[start, end)` in key order and return at most `min(limit, `[`SCAN_LIMIT_MAX`]`)`
//! pairs. All integers are little-endian.

/// The ABI version this crate describes.
pub const ABI_VERSION: u32 = 1;

/// The export returning the plugin's ABI version.
pub const EXPORT_ABI_VERSION: &str = "concord_abi_version";
/// The export allocating an input buffer.
pub const EXPORT_ALLOC: &str = "concord_alloc";
/// The export applying a batch of commands.
pub const EXPORT_APPLY_BATCH: &str = "concord_apply_batch";
/// The exported linear memory.
pub const EXPORT_MEMORY: &str = "memory";
/// Optional: `(ptr: i32, len: i32) -> i32`, like `concord_apply_batch`, run once when a group
/// switches to this module through an upgrade entry; its one command is the identity of the
/// module the group ran before, and its writes commit with the switch only if it succeeds.
pub const EXPORT_MIGRATE: &str = "concord_migrate";

/// The module name of the host's imports.
pub const IMPORT_MODULE: &str = "concord";
/// Reads a key.
pub const IMPORT_KV_GET: &str = "kv_get";
/// Writes a key.
pub const IMPORT_KV_PUT: &str = "kv_put";
/// Removes a key.
pub const IMPORT_KV_DELETE: &str = "kv_delete";
/// Scans a key range.
pub const IMPORT_KV_SCAN: &str = "kv_scan";
/// Reports the outcome of the current command.
pub const IMPORT_COMMAND_RESULT: &str = "command_result";

/// What `kv_get` returns for a missing key.
pub const ABSENT: i64 = -1;
/// The most pairs one scan returns.
pub const SCAN_LIMIT_MAX: u32 = 1024;
/// The `end_len` of a scan without an end bound.
pub const UNBOUNDED: i32 = -1;

/// A key-value call the host refused: the command's fault, the same on every replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum KvStatus {
    /// The key is empty, longer than the store allows, or one of the host's reserved keys.
    InvalidKey = -2,
    /// The value is longer than the store allows.
    ValueTooLarge = -3,
    /// A pointer or length lies outside the plugin's memory.
    OutOfBounds = -4,
}

impl KvStatus {
    /// The status a negative return value stands for.
    pub fn from_code(code: i64) -> Option<KvStatus> {
        match code {
            -2 => Some(KvStatus::InvalidKey),
            -3 => Some(KvStatus::ValueTooLarge),
            -4 => Some(KvStatus::OutOfBounds),
            _ => None,
        }
    }

    /// A short description.
    pub fn describe(self) -> &'static str {
        match self {
            KvStatus::InvalidKey => "the key is empty, too long, or reserved for the host",
            KvStatus::ValueTooLarge => "the value is too large",
            KvStatus::OutOfBounds => "a buffer lies outside the plugin's memory",
        }
    }
}

/// Error codes the host records for a command whose execution faulted (the plugin's own
/// codes should stay below [`FAULT_CODE_BASE`]).
pub mod fault {
    /// The first code reserved for the host.
    pub const FAULT_CODE_BASE: u32 = 1000;
    /// The command ran out of fuel.
    pub const OUT_OF_FUEL: u32 = 1000;
    /// The plugin trapped (unreachable, out-of-bounds access, division by zero, ...).
    pub const TRAP: u32 = 1001;
    /// The plugin tried to grow its memory past the cap.
    pub const MEMORY_LIMIT: u32 = 1002;
    /// The plugin recursed past its stack cap.
    pub const STACK_OVERFLOW: u32 = 1003;
    /// The plugin broke the ABI (a bad pointer in a result, a batch it could not decode, no
    /// result for a command).
    pub const ABI_VIOLATION: u32 = 1004;
}
pub use fault::FAULT_CODE_BASE;

/// Why bytes could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError(pub &'static str);

impl core::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for DecodeError {}

/// Appends a batch: `count u32 | (len u32 | bytes)*`.
pub fn encode_batch<'a>(commands: impl ExactSizeIterator<Item = &'a [u8]>, out: &mut Vec<u8>) {
    out.extend_from_slice(&(commands.len() as u32).to_le_bytes());
    for command in commands {
        out.extend_from_slice(&(command.len() as u32).to_le_bytes());
        out.extend_from_slice(command);
    }
}

/// The commands of an encoded batch, in order, borrowed from it.
pub fn decode_batch(bytes: &[u8]) -> Result<Vec<&[u8]>, DecodeError> {
    let mut reader = Reader { bytes };
    let count = reader.u32()? as usize;
    // Each command takes at least its 4-byte length: bound the allocation by the input.
    if count > reader.bytes.len() / 4 {
        return Err(DecodeError("batch count exceeds its bytes"));
    }
    let mut commands = Vec::with_capacity(count);
    for _ in 0..count {
        commands.push(reader.chunk()?);
    }
    if !reader.bytes.is_empty() {
        return Err(DecodeError("bytes after the last command"));
    }
    Ok(commands)
}

/// Appends key-value pairs: `count u32 | (key_len u32 | key | value_len u32 | value)*`.
pub fn encode_pairs<K: AsRef<[u8]>, V: AsRef<[u8]>>(pairs: &[(K, V)], out: &mut Vec<u8>) {
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (key, value) in pairs {
        let (key, value) = (key.as_ref(), value.as_ref());
        out.extend_from_slice(&(key.len() as u32).to_le_bytes());
        out.extend_from_slice(key);
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
        out.extend_from_slice(value);
    }
}

/// One key and its value, as owned bytes.
pub type KeyValue = (Vec<u8>, Vec<u8>);

/// The pairs encoded by [`encode_pairs`].
pub fn decode_pairs(bytes: &[u8]) -> Result<Vec<KeyValue>, DecodeError> {
    let mut reader = Reader { bytes };
    let count = reader.u32()? as usize;
    if count > reader.bytes.len() / 8 {
        return Err(DecodeError("pair count exceeds its bytes"));
    }
    let mut pairs = Vec::with_capacity(count);
    for _ in 0..count {
        let key = reader.chunk()?.to_vec();
        let value = reader.chunk()?.to_vec();
        pairs.push((key, value));
    }
    if !reader.bytes.is_empty() {
        return Err(DecodeError("bytes after the last pair"));
    }
    Ok(pairs)
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn u32(&mut self) -> Result<u32, DecodeError> {
        let (head, rest) = self
            .bytes
            .split_first_chunk::<4>()
            .ok_or(DecodeError("truncated length"))?;
        self.bytes = rest;
        Ok(u32::from_le_bytes(*head))
    }

    fn chunk(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = self.u32()? as usize;
        if len > self.bytes.len() {
            return Err(DecodeError("a length runs past the end"));
        }
        let (chunk, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(chunk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_round_trip_and_reject_damage() {
        let commands: Vec<&[u8]> = vec![b"one", b"", b"three"];
        let mut bytes = Vec::new();
        encode_batch(commands.iter().copied(), &mut bytes);
        assert_eq!(decode_batch(&bytes).unwrap(), commands);
        for cut in 0..bytes.len() {
            assert!(decode_batch(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        bytes.push(0);
        assert!(decode_batch(&bytes).is_err());
        // A huge count in a short input is refused before allocating.
        assert!(decode_batch(&u32::MAX.to_le_bytes()).is_err());
    }

    #[test]
    fn pairs_round_trip_and_reject_damage() {
        let pairs = vec![(b"a".to_vec(), b"1".to_vec()), (b"bb".to_vec(), Vec::new())];
        let mut bytes = Vec::new();
        encode_pairs(&pairs, &mut bytes);
        assert_eq!(decode_pairs(&bytes).unwrap(), pairs);
        for cut in 0..bytes.len() {
            assert!(decode_pairs(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }
}
