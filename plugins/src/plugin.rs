//! A loaded plugin: a checked, compiled module that any group's state machine runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use concord_plugin_abi as abi;
use wasmtime::{ExternType, Instance, InstancePre, PoolConcurrencyLimitError, Store, ValType};

use crate::engine_shared::EngineShared;
use crate::host_state::HostState;
use crate::plugin_stats::{PluginCounters, PluginStats};
use crate::{LoadError, module_cache};

/// A plugin ready to run: one compiled module, instantiated afresh for every batch a group
/// applies. Cheap to clone.
/// It is a [`concord_consensus::StateMachineFactory`] (`wasm_machine.rs`), so a consensus node
/// takes it directly.
#[derive(Clone)]
pub struct Plugin {
    pub(crate) shared: Arc<PluginShared>,
}

pub(crate) struct PluginShared {
    name: String,
    hash: String,
    pub(crate) pre: InstancePre<HostState>,
    pub(crate) engine: Arc<EngineShared>,
    pub(crate) counters: PluginCounters,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.shared.name)
            .field("sha256", &self.shared.hash)
            .finish()
    }
}

/// Exports a plugin must have, with their parameter and result counts (all `i32`).
const REQUIRED_FUNCTIONS: [(&str, usize, usize); 3] = [
    (abi::EXPORT_ABI_VERSION, 0, 1),
    (abi::EXPORT_ALLOC, 1, 1),
    (abi::EXPORT_APPLY_BATCH, 2, 1),
];

/// Imports the host provides.
const HOST_FUNCTIONS: [&str; 5] = [
    abi::IMPORT_KV_GET,
    abi::IMPORT_KV_PUT,
    abi::IMPORT_KV_DELETE,
    abi::IMPORT_KV_SCAN,
    abi::IMPORT_COMMAND_RESULT,
];

impl Plugin {
    pub(crate) fn load(
        engine: Arc<EngineShared>,
        name: &str,
        wasm: &[u8],
    ) -> Result<Plugin, LoadError> {
        if !wasm.starts_with(b"\0asm") {
            return Err(LoadError::NotWasm(
                "the file does not start with the wasm magic bytes \\0asm".into(),
            ));
        }
        let hash = module_cache::plugin_hash(wasm);
        let module =
            module_cache::load_or_compile(&engine.engine, engine.module_cache_dir(), wasm, &hash)?;
        for import in module.imports() {
            let known =
                import.module() == abi::IMPORT_MODULE && HOST_FUNCTIONS.contains(&import.name());
            if !known {
                return Err(LoadError::Import {
                    module: import.module().into(),
                    name: import.name().into(),
                });
            }
        }
        check_exports(&module)?;
        let pre = engine
            .linker
            .instantiate_pre(&module)
            .map_err(|e| LoadError::Invalid(format!("imports do not match the host: {e:#}")))?;
        let plugin = Plugin {
            shared: Arc::new(PluginShared {
                counters: PluginCounters::new(name, &hash),
                name: name.into(),
                hash,
                pre,
                engine,
            }),
        };
        plugin.check_version()?;
        Ok(plugin)
    }

    /// The plugin's name (a file stem, or what the loader was given).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The hex SHA-256 of the plugin's bytes.
    pub fn sha256(&self) -> &str {
        &self.shared.hash
    }

    /// What the plugin did since it was loaded, over every group's state machine.
    pub fn stats(&self) -> PluginStats {
        self.shared.counters.read()
    }

    /// Starts an instance and asks for its ABI version.
    fn check_version(&self) -> Result<(), LoadError> {
        let limits = &self.shared.engine.limits;
        let mut store = Store::new(
            &self.shared.engine.engine,
            HostState::new(limits.fuel_per_command, limits.memory_bytes_max),
        );
        store.limiter(|state| state);
        let start = |e: wasmtime::Error| LoadError::Start(format!("{e:#}"));
        store.set_fuel(limits.fuel_per_command).map_err(start)?;
        store.set_epoch_deadline(self.shared.engine.watchdog_ticks);
        let instance =
            instantiate_waiting_for_a_slot(&self.shared.pre, &mut store).map_err(start)?;
        let version = instance
            .get_typed_func::<(), i32>(&mut store, abi::EXPORT_ABI_VERSION)
            .and_then(|f| f.call(&mut store, ()))
            .map_err(start)?;
        if version as u32 != abi::ABI_VERSION {
            return Err(LoadError::AbiVersion {
                found: i64::from(version),
                expected: abi::ABI_VERSION,
            });
        }
        Ok(())
    }
}

fn check_exports(module: &wasmtime::Module) -> Result<(), LoadError> {
    match module.get_export(abi::EXPORT_MEMORY) {
        Some(ExternType::Memory(memory)) if !memory.is_64() => {}
        Some(_) => {
            return Err(LoadError::Export {
                name: abi::EXPORT_MEMORY,
                problem: "not a 32-bit memory".into(),
            });
        }
        None => {
            return Err(LoadError::Export {
                name: abi::EXPORT_MEMORY,
                problem: "missing".into(),
            });
        }
    }
    for (name, params, results) in REQUIRED_FUNCTIONS {
        let problem = match module.get_export(name) {
            None => "missing".to_string(),
            Some(ExternType::Func(func)) => {
                let all_i32 = func
                    .params()
                    .chain(func.results())
                    .all(|t| matches!(t, ValType::I32));
                if all_i32 && func.params().len() == params && func.results().len() == results {
                    continue;
                }
                format!("expected {params} i32 parameters and {results} i32 result, found {func}")
            }
            Some(_) => "not a function".to_string(),
        };
        return Err(LoadError::Export { name, problem });
    }
    if let Some(migrate) = module.get_export(abi::EXPORT_MIGRATE) {
        let well_typed = match migrate {
            ExternType::Func(func) => {
                func.params().len() == 2
                    && func.results().len() == 1
                    && func
                        .params()
                        .chain(func.results())
                        .all(|t| matches!(t, ValType::I32))
            }
            _ => false,
        };
        if !well_typed {
            return Err(LoadError::Export {
                name: abi::EXPORT_MIGRATE,
                problem: "expected a function of 2 i32 parameters and 1 i32 result".into(),
            });
        }
    }
    Ok(())
}

/// How long a call waits for a free instance slot before the group stops (every slot is held
/// by a call on another thread: more threads apply at once than the engine was configured for).
const INSTANCE_SLOT_WAIT: Duration = Duration::from_secs(10);

/// Instantiates from the engine's pool, waiting (bounded) while every slot is in use.
pub(crate) fn instantiate_waiting_for_a_slot(
    pre: &InstancePre<HostState>,
    store: &mut Store<HostState>,
) -> wasmtime::Result<Instance> {
    let deadline = Instant::now() + INSTANCE_SLOT_WAIT;
    loop {
        match pre.instantiate(&mut *store) {
            Err(error) if error.is::<PoolConcurrencyLimitError>() && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            outcome => return outcome,
        }
    }
}
