//! A plugin that breaks the rule "keep no state in the instance", on purpose: the host's
//! determinism tests run it to show that the rule is enforced, not asked for.
//!
//! Each command returns, as 8 little-endian bytes, how many commands its instance applied
//! before it (a counter in a static), and leaks 4 KiB of memory. In a long-lived instance the
//! answers would depend on what the replica applied before, and the leak would reach the
//! memory cap on one replica and not on another. The command's bytes are stored under the key
//! `last`, so that the state store has something to compare.

use core::sync::atomic::{AtomicU64, Ordering};

use concord_plugin_sdk::{CommandError, export_plugin, kv};

/// Commands this instance has applied.
static APPLIED: AtomicU64 = AtomicU64::new(0);

/// Bytes each command leaks.
const LEAK_BYTES: usize = 4096;

fn apply(command: &[u8]) -> Result<Vec<u8>, CommandError> {
    let seen = APPLIED.fetch_add(1, Ordering::Relaxed);
    let leaked: &mut [u8] = Vec::leak(vec![1u8; LEAK_BYTES]);
    leaked[0] = leaked[0].wrapping_add(1);
    kv::put(b"last", command)?;
    Ok(seen.to_le_bytes().to_vec())
}

export_plugin!(apply);
