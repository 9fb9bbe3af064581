//! A group's state machine running a wasm plugin.

use std::time::{Duration, Instant};

use bytes::Bytes;
use concord_consensus::{
    ApplyError, CommandError, CommandResult, StateMachine, StateMachineFactory,
};
use concord_plugin_abi::{self as abi, fault};
use concord_storage::{GroupId, StateTransaction};
use wasmtime::{Instance, Store, Trap, TypedFunc};

use crate::host_state::{Fault, HostState, TxnLease};
use crate::plugin::{Plugin, instantiate_waiting_for_a_slot};

/// A group's state machine running a plugin, implementing [`StateMachine`].
///
/// A batch (one log entry: the same commands on every replica) is one call into the plugin,
/// and every call gets a fresh instance from the module's initial image: nothing a plugin
/// leaves in its memory or globals reaches the next batch, so a replica's answers cannot
/// depend on what it applied before, when it restarted, or which batches faulted.
///
/// A command that traps, runs out of fuel, passes its memory cap or breaks the ABI gets an error
/// result and its writes are dropped; the batch goes on from the next command in another fresh
/// instance. A failure of the host (the store, the watchdog) is returned as an [`ApplyError`]:
/// the group stops instead of recording it.
pub struct WasmStateMachine {
    plugin: Plugin,
    /// The encoded batch, reused between calls.
    input: Vec<u8>,
    /// Fuel burned by the commands of the batch being applied, over its calls.
    fuel_used_in_batch: u64,
}

struct LiveInstance {
    store: Store<HostState>,
    instance: Instance,
    alloc: TypedFunc<i32, i32>,
    apply_batch: TypedFunc<(i32, i32), i32>,
}

/// An export that takes an encoded batch and reports one result per command
/// (`concord_apply_batch`, `concord_migrate`).
type BatchEntry = TypedFunc<(i32, i32), i32>;

/// How one call into the plugin ended badly.
enum CallFailure {
    /// The command being applied failed, deterministically.
    Command(CommandError),
    /// The host failed or the watchdog fired: stop the group.
    Fatal(ApplyError),
    /// The batch of several commands could not be handed to the plugin (its encoding does not
    /// fit the memory cap): no command ran. The caller goes on one command per call, so that
    /// only the command too large to hand over fails.
    Handover,
}

impl WasmStateMachine {
    pub(crate) fn new(plugin: Plugin) -> Self {
        WasmStateMachine {
            plugin,
            input: Vec::new(),
            fuel_used_in_batch: 0,
        }
    }

    /// An instance in the module's initial state, its memory image mapped afresh.
    fn fresh_instance(&self) -> Result<LiveInstance, ApplyError> {
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
        let instance = instantiate_waiting_for_a_slot(&shared.pre, &mut store).map_err(fatal)?;
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
            instance,
            alloc,
            apply_batch,
        })
    }

    /// One call of `entry` with `commands`. Returns the results it reported (a prefix of
    /// the commands, each committed into or dropped from `txn`) and how the call ended.
    fn call(
        &mut self,
        live: &mut LiveInstance,
        entry: &BatchEntry,
        txn: &mut StateTransaction<'_>,
        commands: &[Bytes],
    ) -> (Vec<CommandResult>, Result<(), CallFailure>) {
        self.input.clear();
        abi::encode_batch(commands.iter().map(|c| c.as_ref()), &mut self.input);
        let engine = &self.plugin.shared.engine;
        let (fuel, watchdog_ticks) = (engine.limits.fuel_per_command, engine.watchdog_ticks);
        let input = &self.input;
        let mut lease = TxnLease::new(&mut live.store, txn);
        let store = lease.store();
        {
            let state = store.data_mut();
            state.results.clear();
            state.commands_in_call = commands.len();
            state.fault = None;
            state.fuel_used = 0;
        }
        store.set_epoch_deadline(watchdog_ticks);
        let mut handed_over = false;
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
            handed_over = true;
            entry.call(&mut *store, (ptr, len))
        })();
        // What the command running when the call ended burned (nothing after a clean end:
        // each reported result refuels).
        let left = if handed_over {
            store.get_fuel().unwrap_or(0)
        } else {
            fuel
        };
        let state = store.data_mut();
        self.fuel_used_in_batch += state.fuel_used + fuel.saturating_sub(left);
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
            Err(error) => match classify(error, fault, engine.limits.watchdog) {
                CallFailure::Command(_) if !handed_over && commands.len() > 1 => {
                    Err(CallFailure::Handover)
                }
                failure => Err(failure),
            },
        };
        drop(lease);
        (results, ended)
    }
}

/// Sorts a failed call into the command's fault or the host's.
fn classify(error: wasmtime::Error, fault: Option<Fault>, watchdog: Duration) -> CallFailure {
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

impl WasmStateMachine {
    /// Runs the plugin's `concord_migrate` export, if it has one, once, in a fresh instance
    /// and under a command's limits: it gets one command, `from` (the identity of the module
    /// the group ran before), and its writes go into `txn` only if it succeeds. `None` if the
    /// plugin has no such export.
    pub(crate) fn migrate(
        &mut self,
        txn: &mut StateTransaction<'_>,
        from: &[u8],
    ) -> Result<Option<CommandResult>, ApplyError> {
        let mut live = self.fresh_instance()?;
        let Some(entry) = live
            .instance
            .get_typed_func::<(i32, i32), i32>(&mut live.store, abi::EXPORT_MIGRATE)
            .ok()
        else {
            return Ok(None);
        };
        let (mut reported, ended) =
            self.call(&mut live, &entry, txn, &[Bytes::copy_from_slice(from)]);
        match ended {
            Ok(()) => Ok(reported.pop()),
            Err(CallFailure::Fatal(error)) => Err(error),
            Err(CallFailure::Command(error)) => Ok(Some(Err(error))),
            Err(CallFailure::Handover) => Ok(Some(Err(CommandError::new(
                fault::MEMORY_LIMIT,
                "the migration's input does not fit the plugin's memory",
            )))),
        }
    }
}

impl StateMachine for WasmStateMachine {
    fn apply(
        &mut self,
        txn: &mut StateTransaction<'_>,
        commands: &[Bytes],
    ) -> Result<Vec<CommandResult>, ApplyError> {
        let started = Instant::now();
        self.fuel_used_in_batch = 0;
        let mut results = Vec::with_capacity(commands.len());
        let mut one_per_call = false;
        // Each pass finishes the batch, settles at least one more command, or (once) turns to
        // one command per call.
        while results.len() < commands.len() {
            let end = if one_per_call {
                results.len() + 1
            } else {
                commands.len()
            };
            let mut live = self.fresh_instance()?;
            let entry = live.apply_batch.clone();
            let (reported, ended) =
                self.call(&mut live, &entry, txn, &commands[results.len()..end]);
            // Returned to the pool now, its written pages discarded.
            drop(live);
            results.extend(reported);
            match ended {
                Ok(()) => {}
                Err(CallFailure::Fatal(error)) => return Err(error),
                Err(CallFailure::Handover) => one_per_call = true,
                Err(CallFailure::Command(error)) => {
                    if results.len() < commands.len() {
                        results.push(Err(error));
                    }
                }
            }
        }
        self.plugin.shared.counters.record_batch(
            &results,
            self.fuel_used_in_batch,
            started.elapsed(),
        );
        Ok(results)
    }
}

impl Plugin {
    /// A state machine running this plugin (each batch it applies runs in a fresh instance).
    pub fn state_machine(&self) -> WasmStateMachine {
        WasmStateMachine::new(self.clone())
    }
}

impl StateMachineFactory for Plugin {
    fn create(&self, _group: GroupId) -> Result<Box<dyn StateMachine>, ApplyError> {
        Ok(Box::new(self.state_machine()))
    }
}
