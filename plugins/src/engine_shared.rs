//! What the engine's plugins share with it: the wasmtime engine, the host functions, the limits
//! and where compiled modules are kept.

use std::path::{Path, PathBuf};

use wasmtime::{Engine, Linker};

use crate::PluginLimits;
use crate::epoch_clock::EpochClock;
use crate::host_state::HostState;

/// Held by the [`crate::PluginEngine`] and by every plugin it loaded, so a plugin outlives the
/// handle it came from.
pub(crate) struct EngineShared {
    pub(crate) engine: Engine,
    pub(crate) linker: Linker<HostState>,
    pub(crate) limits: PluginLimits,
    pub(crate) watchdog_ticks: u64,
    pub(crate) module_cache_dir: Option<PathBuf>,
    pub(crate) _clock: EpochClock,
}

impl EngineShared {
    /// Where compiled modules are kept between runs, if anywhere.
    pub(crate) fn module_cache_dir(&self) -> Option<&Path> {
        self.module_cache_dir.as_deref()
    }
}
