//! What a plugin may use.

use std::time::Duration;

/// Bounds on a plugin's execution. Fuel, memory and stack are deterministic (the same command
/// hits them on every replica) and fail only the command; the watchdog is wall-clock time and
/// stops the group instead, because a slow disk or a busy machine must never become a recorded
/// outcome.
#[derive(Clone, Debug)]
pub struct PluginLimits {
    /// Fuel (roughly wasm instructions) each command may burn, including its host calls.
    pub fuel_per_command: u64,
    /// Largest linear memory of an instance, in bytes.
    pub memory_bytes_max: usize,
    /// Largest wasm stack, in bytes.
    pub stack_bytes_max: usize,
    /// Longest one call into the plugin may run before the group is stopped.
    pub watchdog: Duration,
}

impl Default for PluginLimits {
    fn default() -> Self {
        PluginLimits {
            // A session command burns a few thousand units; this leaves room for scans of a
            // thousand records while stopping a runaway loop in well under a second.
            fuel_per_command: 50_000_000,
            memory_bytes_max: 64 * 1024 * 1024,
            stack_bytes_max: 512 * 1024,
            watchdog: Duration::from_secs(10),
        }
    }
}
