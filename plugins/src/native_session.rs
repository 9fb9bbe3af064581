//! The session state machine compiled natively: the twin of the wasm session plugin.

use bytes::Bytes;
use concord_consensus::{ApplyError, CommandError, CommandResult, StateMachine};
use concord_plugin_abi::SCAN_LIMIT_MAX;
use concord_session::{KeyValue, SessionStore, StoreRejected, apply_command};
use concord_storage::{KeyRange, StateTransaction, StorageError};

use crate::command_scope::CommandScope;

/// The session logic of `concord-session` run natively, with the same per-command write
/// scoping as [`crate::WasmStateMachine`]: the same commands give byte-identical state and
/// results. Useful as a baseline for the plugin's cost and where a rebuild is acceptable.
#[derive(Debug, Default)]
pub struct NativeSessionMachine;

/// A command's view of the group: its own writes over the batch's transaction. A store failure
/// is kept aside, because the logic only knows deterministic rejections.
struct ScopedStore<'t, 's> {
    scope: CommandScope,
    txn: &'t mut StateTransaction<'s>,
    failure: Option<StorageError>,
}

impl ScopedStore<'_, '_> {
    fn failed(&mut self, error: StorageError) -> StoreRejected {
        self.failure = Some(error);
        StoreRejected("the state store failed".into())
    }
}

impl SessionStore for ScopedStore<'_, '_> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreRejected> {
        self.scope.get(self.txn, key).map_err(|e| self.failed(e))
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StoreRejected> {
        self.scope
            .put(key, value)
            .map_err(|status| StoreRejected(status.describe().into()))
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), StoreRejected> {
        self.scope
            .delete(key)
            .map_err(|status| StoreRejected(status.describe().into()))
    }

    fn scan(
        &mut self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: u32,
    ) -> Result<Vec<KeyValue>, StoreRejected> {
        let range = KeyRange::from_until(start, end);
        if range.is_empty() {
            return Ok(Vec::new());
        }
        let limit = limit.min(SCAN_LIMIT_MAX) as usize;
        self.scope
            .scan(self.txn, &range, limit)
            .map_err(|e| self.failed(e))
    }
}

impl StateMachine for NativeSessionMachine {
    fn apply(
        &mut self,
        txn: &mut StateTransaction<'_>,
        commands: &[Bytes],
    ) -> Result<Vec<CommandResult>, ApplyError> {
        let mut results = Vec::with_capacity(commands.len());
        for command in commands {
            let mut store = ScopedStore {
                scope: CommandScope::default(),
                txn: &mut *txn,
                failure: None,
            };
            let outcome = apply_command(&mut store, command);
            if let Some(error) = store.failure.take() {
                return Err(ApplyError::Storage(error));
            }
            let result = match outcome {
                Ok(bytes) => {
                    store.scope.commit_into(store.txn);
                    Ok(Bytes::from(bytes))
                }
                Err(error) => Err(CommandError::new(error.code, error.message)),
            };
            results.push(result);
        }
        Ok(results)
    }

    fn applies_quickly(&self) -> bool {
        true
    }
}
