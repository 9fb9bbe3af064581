//! What the host functions of one plugin instance work on.

use std::ptr::NonNull;

use concord_consensus::{ApplyError, CommandResult};
use concord_storage::StateTransaction;
use wasmtime::{Memory, ResourceLimiter};

use crate::command_scope::CommandScope;

/// Most table elements an instance may have (tables hold function references; plugins need a
/// few hundred at most).
pub(crate) const TABLE_ELEMENTS_MAX: usize = 10_000;

/// Why a call into the plugin stopped, beyond what wasmtime's trap says.
#[derive(Debug)]
pub(crate) enum Fault {
    /// The host itself failed (storage, allocation): never recorded as an outcome.
    Host(ApplyError),
    /// The plugin broke the ABI: a deterministic failure of the current command.
    Abi(String),
    /// The plugin asked for more memory or table space than its cap: deterministic.
    ResourceLimit(String),
}

/// The store data of one plugin instance.
pub(crate) struct HostState {
    /// The transaction of the batch being applied; set only for the duration of a call (see
    /// [`TxnLease`]).
    txn: Option<NonNull<StateTransaction<'static>>>,
    /// The instance's exported memory, cached so host functions need no export lookup.
    pub(crate) memory: Option<Memory>,
    /// The current command's writes.
    pub(crate) scope: CommandScope,
    /// Results reported so far in this call, one per command.
    pub(crate) results: Vec<CommandResult>,
    /// How many commands this call carries: more results than that is an ABI violation.
    pub(crate) commands_in_call: usize,
    /// Set when a host function or the limiter ends the call.
    pub(crate) fault: Option<Fault>,
    /// Fuel burned by the commands that reported their result in this call.
    pub(crate) fuel_used: u64,
    pub(crate) fuel_per_command: u64,
    pub(crate) memory_bytes_max: usize,
}

// SAFETY: `txn` is only `Some` while `TxnLease` holds the `&mut Store` on the thread that lent
// the transaction; the store is never shared across threads during that time.
#[allow(unsafe_code)]
unsafe impl Send for HostState {}

impl HostState {
    pub(crate) fn new(fuel_per_command: u64, memory_bytes_max: usize) -> Self {
        HostState {
            txn: None,
            memory: None,
            scope: CommandScope::default(),
            results: Vec::new(),
            commands_in_call: 0,
            fault: None,
            fuel_used: 0,
            fuel_per_command,
            memory_bytes_max,
        }
    }

    /// The current command's scope and the batch's transaction.
    pub(crate) fn scope_and_txn(
        &mut self,
    ) -> Option<(&mut CommandScope, &mut StateTransaction<'_>)> {
        let txn = self.txn?;
        // SAFETY: `txn` points at the transaction `TxnLease` borrowed mutably for at least as
        // long as this call; the returned borrow is tied to `&mut self`, so it cannot outlive
        // the lease, and no other reference to the transaction exists meanwhile.
        #[allow(unsafe_code)]
        let txn = unsafe { &mut *txn.as_ptr().cast::<StateTransaction<'_>>() };
        Some((&mut self.scope, txn))
    }
}

/// Lends `txn` to the host functions of `store` until dropped.
pub(crate) struct TxnLease<'a> {
    store: &'a mut wasmtime::Store<HostState>,
}

impl<'a> TxnLease<'a> {
    pub(crate) fn new(
        store: &'a mut wasmtime::Store<HostState>,
        txn: &'a mut StateTransaction<'_>,
    ) -> Self {
        store.data_mut().txn = Some(NonNull::from(txn).cast());
        TxnLease { store }
    }

    pub(crate) fn store(&mut self) -> &mut wasmtime::Store<HostState> {
        self.store
    }
}

impl Drop for TxnLease<'_> {
    fn drop(&mut self) {
        let state = self.store.data_mut();
        state.txn = None;
        state.scope.discard();
    }
}

impl ResourceLimiter for HostState {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_bytes_max {
            self.fault = Some(Fault::ResourceLimit(format!(
                "memory of {desired} bytes is past the cap of {} bytes",
                self.memory_bytes_max
            )));
            return Err(wasmtime::Error::msg("memory cap reached"));
        }
        Ok(true)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        // Within the cap but the host could not provide it: not a property of the command.
        self.fault = Some(Fault::Host(ApplyError::Fatal(format!(
            "growing plugin memory failed: {error}"
        ))));
        Err(error)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > TABLE_ELEMENTS_MAX {
            self.fault = Some(Fault::ResourceLimit(format!(
                "table of {desired} elements is past the cap of {TABLE_ELEMENTS_MAX}"
            )));
            return Err(wasmtime::Error::msg("table cap reached"));
        }
        Ok(true)
    }
}
