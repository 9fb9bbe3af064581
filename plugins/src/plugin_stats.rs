//! What a plugin did, counted for `/metrics` (the `metrics` crate, label `plugin`) and for
//! callers that show it (the server's status page) through [`Plugin::stats`].
//!
//! Counted once per batch, after it ran: the handles are made when the plugin loads, so a
//! batch costs a few atomic additions, not a recorder lookup.
//!
//! [`Plugin::stats`]: crate::Plugin::stats

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use concord_consensus::CommandResult;
use concord_plugin_abi::fault;
use metrics::{Counter, Gauge, Histogram};

/// The host's fault kinds, in code order from [`fault::FAULT_CODE_BASE`], with their label.
const FAULT_KINDS: [(u32, &str); 5] = [
    (fault::OUT_OF_FUEL, "out_of_fuel"),
    (fault::TRAP, "trap"),
    (fault::MEMORY_LIMIT, "memory_limit"),
    (fault::STACK_OVERFLOW, "stack_overflow"),
    (fault::ABI_VIOLATION, "abi_violation"),
];

/// A plugin's counts since it was loaded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PluginStats {
    /// Batches applied.
    pub batches: u64,
    /// Commands applied, whatever their outcome.
    pub commands: u64,
    /// Commands that failed with an error the plugin chose (codes below 1000).
    pub command_errors: u64,
    /// Commands that faulted, by kind.
    pub faults: FaultCounts,
    /// Fuel the commands burned (about one unit per wasm instruction, plus host calls).
    pub fuel_used: u64,
    /// Time spent applying batches (the host's handover and the plugin's run).
    pub apply_time: Duration,
}

/// Faulted commands by kind (see `concord_plugins::fault`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Ran out of fuel (1000).
    pub out_of_fuel: u64,
    /// Trapped, e.g. panicked (1001).
    pub trap: u64,
    /// Passed the memory cap (1002).
    pub memory_limit: u64,
    /// Overflowed the wasm stack (1003).
    pub stack_overflow: u64,
    /// Broke the host ABI (1004).
    pub abi_violation: u64,
}

impl FaultCounts {
    /// All faults together.
    pub fn total(&self) -> u64 {
        self.out_of_fuel + self.trap + self.memory_limit + self.stack_overflow + self.abi_violation
    }
}

/// The live counters of one loaded plugin, shared by every group's state machine.
pub(crate) struct PluginCounters {
    batches: AtomicU64,
    commands: AtomicU64,
    command_errors: AtomicU64,
    faults: [AtomicU64; FAULT_KINDS.len()],
    fuel_used: AtomicU64,
    apply_nanos: AtomicU64,
    exported: Exported,
}

/// The same counts as `metrics` handles.
struct Exported {
    /// Groups of this node running the module now (`concord_plugin_groups`).
    groups: Gauge,
    commands: Counter,
    command_errors: Counter,
    faults: [Counter; FAULT_KINDS.len()],
    fuel_used: Counter,
    batch_duration: Histogram,
}

impl PluginCounters {
    /// Counters for the plugin `name` with module hash `sha256`; also sets
    /// `concord_plugin_info{plugin, sha256}` to 1.
    pub(crate) fn new(name: &str, sha256: &str) -> Self {
        let plugin = name.to_string();
        metrics::gauge!("concord_plugin_info", "plugin" => plugin.clone(), "sha256" => sha256.to_string())
            .set(1.0);
        let fault_counter = |kind: &'static str| metrics::counter!("concord_plugin_faults_total", "plugin" => plugin.clone(), "kind" => kind);
        PluginCounters {
            batches: AtomicU64::new(0),
            commands: AtomicU64::new(0),
            command_errors: AtomicU64::new(0),
            faults: Default::default(),
            fuel_used: AtomicU64::new(0),
            apply_nanos: AtomicU64::new(0),
            exported: Exported {
                groups: metrics::gauge!("concord_plugin_groups", "plugin" => plugin.clone(), "sha256" => sha256.to_string()),
                commands: metrics::counter!("concord_plugin_commands_total", "plugin" => plugin.clone()),
                command_errors: metrics::counter!("concord_plugin_command_errors_total", "plugin" => plugin.clone()),
                faults: FAULT_KINDS.map(|(_, kind)| fault_counter(kind)),
                fuel_used: metrics::counter!("concord_plugin_fuel_used_total", "plugin" => plugin.clone()),
                batch_duration: metrics::histogram!("concord_plugin_batch_duration_seconds", "plugin" => plugin),
            },
        }
    }

    /// A group of this node started running the module (`stopped` once it no longer does).
    pub(crate) fn group_running(&self, running: bool) {
        if running {
            self.exported.groups.increment(1.0);
        } else {
            self.exported.groups.decrement(1.0);
        }
    }

    /// Counts one applied batch: its `results`, the fuel its commands burned, its time.
    pub(crate) fn record_batch(&self, results: &[CommandResult], fuel_used: u64, took: Duration) {
        let mut errors = 0;
        let mut faults = [0u64; FAULT_KINDS.len()];
        for error in results.iter().filter_map(|r| r.as_ref().err()) {
            match FAULT_KINDS.iter().position(|(code, _)| *code == error.code) {
                Some(kind) => faults[kind] += 1,
                None => errors += 1,
            }
        }
        let commands = results.len() as u64;
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.commands.fetch_add(commands, Ordering::Relaxed);
        self.command_errors.fetch_add(errors, Ordering::Relaxed);
        self.fuel_used.fetch_add(fuel_used, Ordering::Relaxed);
        self.apply_nanos
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
        let exported = &self.exported;
        exported.commands.increment(commands);
        exported.command_errors.increment(errors);
        exported.fuel_used.increment(fuel_used);
        exported.batch_duration.record(took.as_secs_f64());
        for (kind, count) in faults.into_iter().enumerate() {
            if count > 0 {
                self.faults[kind].fetch_add(count, Ordering::Relaxed);
                exported.faults[kind].increment(count);
            }
        }
    }

    pub(crate) fn read(&self) -> PluginStats {
        let fault = |code: u32| {
            let kind = FAULT_KINDS
                .iter()
                .position(|(c, _)| *c == code)
                .expect("a known fault code");
            self.faults[kind].load(Ordering::Relaxed)
        };
        PluginStats {
            batches: self.batches.load(Ordering::Relaxed),
            commands: self.commands.load(Ordering::Relaxed),
            command_errors: self.command_errors.load(Ordering::Relaxed),
            faults: FaultCounts {
                out_of_fuel: fault(fault::OUT_OF_FUEL),
                trap: fault(fault::TRAP),
                memory_limit: fault(fault::MEMORY_LIMIT),
                stack_overflow: fault(fault::STACK_OVERFLOW),
                abi_violation: fault(fault::ABI_VIOLATION),
            },
            fuel_used: self.fuel_used.load(Ordering::Relaxed),
            apply_time: Duration::from_nanos(self.apply_nanos.load(Ordering::Relaxed)),
        }
    }
}
