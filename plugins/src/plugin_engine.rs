//! The shared wasmtime engine: configuration, host functions, the watchdog clock.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, Linker, OptLevel, PoolingAllocationConfig,
};

use crate::engine_shared::EngineShared;
use crate::epoch_clock::{EPOCH_TICK, EpochClock};
use crate::plugin::Plugin;
use crate::{LoadError, PluginLimits};

/// Settings of a [`PluginEngine`].
#[derive(Clone, Debug, Default)]
pub struct PluginEngineConfig {
    /// Bounds on every plugin's execution.
    pub limits: PluginLimits,
    /// Where compiled modules are kept between runs; `None` compiles on every load.
    pub module_cache_dir: Option<PathBuf>,
    /// Write `/tmp/perf-<pid>.map` so that `perf report` names the plugins' compiled
    /// functions (for profiling plugins; off in production).
    pub perf_map: bool,
    /// How many instances of this engine's plugins may exist at the same moment. An instance
    /// lives for one call (one log entry), so this bounds the threads applying at once; a call
    /// that finds every slot taken waits for one (see [`PluginEngine`]). 0 means the default.
    pub instances_at_once_max: u32,
}

/// The default of [`PluginEngineConfig::instances_at_once_max`]: more than the apply threads
/// of a node. Each slot reserves address space for a whole 32-bit wasm memory (about 4 GiB,
/// none of it resident until used), so the count is kept modest.
pub const INSTANCES_AT_ONCE_DEFAULT: u32 = 16;

/// One wasmtime engine for all plugins of a process: compiles and caches modules, defines the
/// host functions, runs the watchdog clock.
///
/// ```
/// use concord_plugins::{PluginEngine, PluginEngineConfig, bundled};
///
/// let engine = PluginEngine::new(PluginEngineConfig::default())?;
/// let plugin = engine.load("counter", bundled::COUNTER)?;
/// assert_eq!(plugin.name(), "counter");
/// # Ok::<(), concord_plugins::LoadError>(())
/// ```
#[derive(Clone)]
pub struct PluginEngine {
    pub(crate) shared: Arc<EngineShared>,
}

impl PluginEngine {
    /// An engine with `config`.
    pub fn new(config: PluginEngineConfig) -> Result<PluginEngine, LoadError> {
        let mut wasm_config = Config::new();
        wasm_config
            .cranelift_opt_level(OptLevel::Speed)
            // Replicas on different CPUs must compute the same bits. (Threads are off because
            // wasmtime is built without its `threads` feature.)
            .cranelift_nan_canonicalization(true)
            .wasm_relaxed_simd(false)
            .consume_fuel(true)
            .epoch_interruption(true)
            .max_wasm_stack(config.limits.stack_bytes_max);
        wasm_config.allocation_strategy(InstanceAllocationStrategy::Pooling(instance_pool(
            config.instances_at_once_max,
            &config.limits,
        )));
        if config.perf_map {
            wasm_config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        let engine = Engine::new(&wasm_config).map_err(|e| LoadError::Engine(format!("{e:#}")))?;
        let mut linker = Linker::new(&engine);
        crate::host_functions::define(&mut linker)
            .map_err(|e| LoadError::Engine(format!("{e:#}")))?;
        let watchdog_ticks =
            (config.limits.watchdog.as_millis() / EPOCH_TICK.as_millis()).max(1) as u64;
        let clock = EpochClock::start(engine.clone())
            .map_err(|e| LoadError::Engine(format!("cannot start the watchdog clock: {e}")))?;
        Ok(PluginEngine {
            shared: Arc::new(EngineShared {
                engine,
                linker,
                limits: config.limits,
                watchdog_ticks,
                module_cache_dir: config.module_cache_dir,
                _clock: clock,
            }),
        })
    }

    /// Loads a plugin from its bytes: validates, compiles (or takes the cached module), checks
    /// the ABI and starts one instance to ask its version.
    pub fn load(&self, name: &str, wasm: &[u8]) -> Result<Plugin, LoadError> {
        Plugin::load(self.shared.clone(), name, wasm)
    }

    /// Loads a plugin from a `.wasm` file, named after the file's stem.
    pub fn load_file(&self, path: &Path) -> Result<Plugin, LoadError> {
        let wasm = std::fs::read(path).map_err(|source| LoadError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let name = path
            .file_stem()
            .map(|stem| stem.to_string_lossy().into_owned())
            .unwrap_or_else(|| "plugin".into());
        self.load(&name, &wasm)
    }
}

/// The first bytes of each instance's memory that stay resident between instances: they are
/// reset by copying (zeroes, or the module's image) instead of being discarded and faulted in
/// again. A plugin linked with a 64 KiB stack (as `fixtures/build-plugins.sh` does) keeps its
/// stack, static data and first heap pages in this prefix.
const RESIDENT_PREFIX_BYTES: usize = 128 * 1024;

/// The first bytes of each instance's table that stay resident between instances, reset by
/// writing zeroes. Past them a table's pages are discarded with a system call per instance,
/// which on a multi-threaded process also flushes the other CPUs' address translations. A
/// table is reset only as far as it reaches: the bundled plugins' tables (3 to 19 functions)
/// cost one page of zeroes, and one of up to 2,048 functions stays within these bytes.
const TABLE_RESIDENT_BYTES: usize = 16 * 1024;

/// The pool every instance comes from. Each call into a plugin gets a fresh instance (see
/// `wasm_machine.rs`); the pool keeps that cheap: a slot keeps the module's memory image
/// mapped copy-on-write, resets [`RESIDENT_PREFIX_BYTES`] of memory and
/// [`TABLE_RESIDENT_BYTES`] of table in place and discards the pages past them that the call
/// wrote, so the next instance starts from the image again.
fn instance_pool(instances_at_once_max: u32, limits: &PluginLimits) -> PoolingAllocationConfig {
    let slots = match instances_at_once_max {
        0 => INSTANCES_AT_ONCE_DEFAULT,
        n => n,
    };
    let mut pool = PoolingAllocationConfig::new();
    pool.total_core_instances(slots)
        .total_memories(slots)
        .total_tables(slots)
        // The limiter (`host_state.rs`) refuses growth past the cap first, as a fault of the
        // command; the pool's bound only sizes the slots.
        .max_memory_size(limits.memory_bytes_max)
        .table_elements(crate::host_state::TABLE_ELEMENTS_MAX)
        .linear_memory_keep_resident(RESIDENT_PREFIX_BYTES)
        .table_keep_resident(TABLE_RESIDENT_BYTES);
    pool
}
