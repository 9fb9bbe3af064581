//! A group's state machine running a wasm plugin.

use bytes::Bytes;
use concord_consensus::{ApplyError, CommandError, CommandResult, StateMachine};
use concord_plugin_abi::{self as abi, fault};
use concord_storage::StateTransaction;
use wasmtime::{Store, Trap, TypedFunc};

use crate::host_state::{Fault, HostState, TxnLease};
use crate::plugin::Plugin;

/// A long-lived plugin instance for one group, implementing [`StateMachine`].
///
/// A batch is one call into the plugin. A command that traps, runs out of fuel, passes its
/// memory cap or breaks the ABI gets an error result and its writes are dropped; the instance is
/// recreated and the batch goes on from the next command. A failure of the host (the store, the
/// watchdog) is returned as an [`ApplyError`]: the group stops instead of recording it.
pub struct WasmStateMachine {
    plugin: Plugin,
    instance: Option<LiveInstance>,
    /// The encoded batch, reused between calls.
    input: Vec<u8>,
}

struct LiveInstance {
    store: Store<HostState>,
    alloc: TypedFunc<i32, i32>,
    apply_batch: TypedFunc<(i32, i32), i32>,
}

/// How one call into the plugin ended badly.
enum CallFailure {
    /// The command being applied failed, deterministically.
    Command(CommandError),
    /// The host failed or the watchdog fired: stop the group.
    Fatal(ApplyError),
}

impl WasmStateMachine {
    pub(crate) fn new(plugin: Plugin) -> Result<Self, ApplyError> {
        let mut machine = WasmStateMachine {
            plugin,
            instance: None,
            input: Vec::new(),
        };
        machine.instance = Some(machine.start_instance()?);
        Ok(machine)
    }

    fn start_instance(&self) -> Result<LiveInstance, ApplyError> {
        let shared = &self.plugin.shared;
        let limits = &shared.engine.limits;
        let mut store = Store::new(
            &shared.engine.engine,
            HostState::new(limits.fuel_per_command, limits.memory_bytes_max),
        );
        store.limiter(|state| state);
        let fatal = |e: wasmtime::Error| ApplyError::Fatal(format!("starting the plugin: {e:#}"));
        store.set_fuel(limits.fuel_per_command).map_err(fatal)?;
        store.set_epoch_deadline(shared.engine.watchdog_ticks);
        let instance = shared.pre.instantiate(&mut store).map_err(fatal)?;
        let memory = instance
            .get_memory(&mut store, abi::EXPORT_MEMORY)
            .ok_or_else(|| ApplyError::Fatal("the plugin has no memory export".into()))?;
        store.data_mut().memory = Some(memory);
        let alloc = instance
            .get_typed_func(&mut store, abi::EXPORT_ALLOC)
            .map_err(fatal)?;
        let apply_batch = instance
            .get_typed_func(&mut store, abi::EXPORT_APPLY_BATCH)
            .map_err(fatal)?;
        Ok(LiveInstance {
            store,
            alloc,
            apply_batch,
        })
    }

    /// One call into the plugin with `commands`. Returns the results it reported (a prefix of
    /// the commands, each committed into or dropped from `txn`) and how the call ended.
    fn call(
        &mut self,
        txn: &mut StateTransaction<'_>,
        commands: &[Bytes],
    ) -> (Vec<CommandResult>, Result<(), CallFailure>) {
        self.input.clear();
        abi::encode_batch(commands.iter().map(|c| c.as_ref()), &mut self.input);
        let engine = &self.plugin.shared.engine;
        let (fuel, watchdog_ticks) = (engine.limits.fuel_per_command, engine.watchdog_ticks);
        let live = self.instance.as_mut().expect("started before the call");
        let input = &self.input;
        let mut lease = TxnLease::new(&mut live.store, txn);
        let store = lease.store();
        {
            let state = store.data_mut();
            state.results.clear();
            state.commands_in_call = commands.len();
            state.fault = None;
        }
        store.set_epoch_deadline(watchdog_ticks);
        let outcome = (|| -> wasmtime::Result<i32> {
            store.set_fuel(fuel)?;
            let len = i32::try_from(input.len())
                .map_err(|_| wasmtime::Error::msg("batch larger than 2 GiB"))?;
            let ptr = live.alloc.call(&mut *store, len)?;
            let memory = store.data().memory.expect("set at start");
            if memory
                .write(&mut *store, ptr as u32 as usize, input)
                .is_err()
            {
                store.data_mut().fault = Some(Fault::Abi(
                    "concord_alloc returned a buffer outside the plugin's memory".into(),
                ));
                return Err(wasmtime::Error::msg("bad buffer"));
            }
            store.set_fuel(fuel)?;
            live.apply_batch.call(&mut *store, (ptr, len))
        })();
        let state = store.data_mut();
        let results = std::mem::take(&mut state.results);
        let fault = state.fault.take();
        let ended = match outcome {
            Ok(0) if results.len() == commands.len() => Ok(()),
            Ok(0) => Err(CallFailure::Command(CommandError::new(
                fault::ABI_VIOLATION,
                "the plugin returned without a result for this command",
            ))),
            Ok(status) => Err(CallFailure::Command(CommandError::new(
                fault::ABI_VIOLATION,
                format!("the plugin could not decode its batch (status {status})"),
            ))),
            Err(error) => Err(classify(error, fault, engine.limits.watchdog)),
        };
        drop(lease);
        (results, ended)
    }
}

/// Sorts a failed call into the command's fault or the host's.
fn classify(
    error: wasmtime::Error,
    fault: Option<Fault>,
    watchdog: std::time::Duration,
) -> CallFailure {
    match fault {
        Some(Fault::Host(error)) => return CallFailure::Fatal(error),
        Some(Fault::Abi(problem)) => {
            return CallFailure::Command(CommandError::new(fault::ABI_VIOLATION, problem));
        }
        Some(Fault::ResourceLimit(problem)) => {
            return CallFailure::Command(CommandError::new(fault::MEMORY_LIMIT, problem));
        }
        None => {}
    }
    match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => CallFailure::Fatal(ApplyError::Fatal(format!(
            "the plugin ran past the {watchdog:?} watchdog"
        ))),
        Some(Trap::OutOfFuel) => CallFailure::Command(CommandError::new(
            fault::OUT_OF_FUEL,
            "the command ran out of fuel",
        )),
        Some(Trap::StackOverflow) => CallFailure::Command(CommandError::new(
            fault::STACK_OVERFLOW,
            "the command overflowed the plugin's stack",
        )),
        Some(trap) => CallFailure::Command(CommandError::new(
            fault::TRAP,
            format!("the plugin trapped: {trap}"),
        )),
        // Not a trap and no fault recorded: something in the runtime, not the command.
        None => CallFailure::Fatal(ApplyError::Fatal(format!("calling the plugin: {error:#}"))),
    }
}

impl StateMachine for WasmStateMachine {
    fn apply(
        &mut self,
        txn: &mut StateTransaction<'_>,
        commands: &[Bytes],
    ) -> Result<Vec<CommandResult>, ApplyError> {
        let mut results = Vec::with_capacity(commands.len());
        // Each pass either finishes the batch or settles at least one more command.
        while results.len() < commands.len() {
            if self.instance.is_none() {
                self.instance = Some(self.start_instance()?);
            }
            let (reported, ended) = self.call(txn, &commands[results.len()..]);
            results.extend(reported);
            match ended {
                Ok(()) => {}
                Err(CallFailure::Fatal(error)) => {
                    self.instance = None;
                    return Err(error);
                }
                Err(CallFailure::Command(error)) => {
                    // The instance may be in any state after a fault: start afresh.
                    self.instance = None;
                    if results.len() < commands.len() {
                        results.push(Err(error));
                    }
                }
            }
        }
        Ok(results)
    }
}
