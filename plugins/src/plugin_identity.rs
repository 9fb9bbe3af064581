//! Which plugin a group's data was written by, recorded in the data itself.
//!
//! Two reserved keys (see [`crate::reserved_keys`]) of each group:
//! - `plugin`: `version u8 = 1 | current_len u16 | current | base_len u16 | base` (lengths
//!   little-endian) — the identity of the module the group runs now and of the one it was
//!   first served with. An identity is `sha256:<hex>` of a wasm module, or `bundled:session`
//!   for the session logic Concord ships (as wasm or as its native twin: one source, held
//!   equal by tests, upgraded with the binary).
//! - `module`: the bytes of the module the group runs, once it came through an upgrade, so a
//!   restart, a log replay or a snapshot installed on another node finds it in the data.
//!
//! Both are written in the transaction that applies the entry, with the applied index.

use concord_storage::{GroupId, StateStore, StateTransaction, StorageResult};

use crate::reserved_keys::RESERVED_KEY_PREFIX;

const RECORD_VERSION: u8 = 1;

/// The identity of the session logic Concord ships.
pub const BUNDLED_SESSION_IDENTITY: &str = "bundled:session";

/// The identity of a wasm module with this hex SHA-256.
pub fn wasm_identity(sha256_hex: &str) -> String {
    format!("sha256:{sha256_hex}")
}

/// The key holding a group's [`PluginRecord`].
pub(crate) fn record_key() -> Vec<u8> {
    [RESERVED_KEY_PREFIX, b"plugin"].concat()
}

/// The key holding the bytes of the module a group was upgraded to.
pub(crate) fn module_key() -> Vec<u8> {
    [RESERVED_KEY_PREFIX, b"module"].concat()
}

/// What a group's data records about its plugin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginRecord {
    /// The module the group runs now.
    pub current: String,
    /// The module it was first served with.
    pub base: String,
}

impl PluginRecord {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(5 + self.current.len() + self.base.len());
        out.push(RECORD_VERSION);
        for identity in [&self.current, &self.base] {
            out.extend_from_slice(&(identity.len() as u16).to_le_bytes());
            out.extend_from_slice(identity.as_bytes());
        }
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<PluginRecord, String> {
        let (&version, mut rest) = bytes.split_first().ok_or("an empty plugin record")?;
        if version != RECORD_VERSION {
            return Err(format!("plugin record version {version} is not known"));
        }
        let mut identities = Vec::with_capacity(2);
        for _ in 0..2 {
            let [low, high, tail @ ..] = rest else {
                return Err("a truncated plugin record".into());
            };
            let len = usize::from(u16::from_le_bytes([*low, *high]));
            if tail.len() < len {
                return Err("a truncated plugin record".into());
            }
            let (identity, tail) = tail.split_at(len);
            let identity = std::str::from_utf8(identity)
                .map_err(|_| "a plugin record that is not text".to_string())?;
            identities.push(identity.to_string());
            rest = tail;
        }
        if !rest.is_empty() {
            return Err("trailing bytes after a plugin record".into());
        }
        let base = identities.pop().expect("two read");
        let current = identities.pop().expect("two read");
        Ok(PluginRecord { current, base })
    }

    /// Whether a node given the module `configured` may open this data: the data was written
    /// by it, or was first served with it and upgraded through the log since (the upgraded
    /// module is in the data).
    pub fn accepts(&self, configured: &str) -> bool {
        self.current == configured || self.base == configured
    }
}

/// The record of `group` in `store`, if its data has one.
pub fn read_plugin_record(
    store: &dyn StateStore,
    group: GroupId,
) -> Result<Option<PluginRecord>, String> {
    let bytes = store
        .get(group, &record_key())
        .map_err(|e| format!("group {group}: reading its plugin record: {e}"))?;
    bytes
        .map(|bytes| PluginRecord::decode(&bytes).map_err(|e| format!("group {group}: {e}")))
        .transpose()
}

/// The record as `txn` sees it.
pub(crate) fn read_in(txn: &StateTransaction<'_>) -> StorageResult<Option<Vec<u8>>> {
    txn.get(&record_key())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_damage_is_refused() {
        let record = PluginRecord {
            current: wasm_identity(&"ab".repeat(32)),
            base: BUNDLED_SESSION_IDENTITY.into(),
        };
        let bytes = record.encode();
        assert_eq!(PluginRecord::decode(&bytes), Ok(record.clone()));
        for cut in 0..bytes.len() {
            assert!(PluginRecord::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(PluginRecord::decode(&longer).is_err());
        let mut other_version = bytes;
        other_version[0] = 9;
        assert!(PluginRecord::decode(&other_version).is_err());
        assert!(record.accepts(BUNDLED_SESSION_IDENTITY));
        assert!(record.accepts(&record.current));
        assert!(!record.accepts("sha256:00"));
    }

    /// The record is read from the state on disk: whatever its bytes, a refusal or a record,
    /// never a panic.
    #[test]
    fn hostile_records_are_refused_never_a_panic() {
        let record = PluginRecord {
            current: wasm_identity(&"cd".repeat(32)),
            base: BUNDLED_SESSION_IDENTITY.into(),
        };
        for input in concord_storage::testing::hostile_inputs(&[record.encode()], 13, 3_000) {
            let _ = PluginRecord::decode(&input);
        }
    }
}
