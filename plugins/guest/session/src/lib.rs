//! The session plugin: the MQTT-style session state machine of `concord-session`, compiled to
//! wasm. Its native twin is `concord_plugins::NativeSessionMachine`: the same logic.

use concord_plugin_sdk::{CommandError, export_plugin, kv};
use concord_session::{KeyValue, SessionStore, StoreRejected, apply_command};

/// The group's data, through the host.
struct HostStore;

fn refused(error: kv::KvError) -> StoreRejected {
    StoreRejected(error.to_string())
}

impl SessionStore for HostStore {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreRejected> {
        kv::get(key).map_err(refused)
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StoreRejected> {
        kv::put(key, value).map_err(refused)
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), StoreRejected> {
        kv::delete(key).map_err(refused)
    }

    fn scan(
        &mut self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: u32,
    ) -> Result<Vec<KeyValue>, StoreRejected> {
        kv::scan(start, end, limit).map_err(refused)
    }
}

fn apply(command: &[u8]) -> Result<Vec<u8>, CommandError> {
    apply_command(&mut HostStore, command)
        .map_err(|error| CommandError::new(error.code, error.message))
}

export_plugin!(apply);
