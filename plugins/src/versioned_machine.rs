//! A group's state machine that runs the module its data records, and switches to another
//! exactly at an upgrade entry.

use std::sync::Arc;

use bytes::Bytes;
use concord_consensus::{
    ApplyError, CommandError, CommandResult, StateMachine, StateMachineFactory,
};
use concord_storage::{GroupId, StateStore, StateTransaction};
use parking_lot::Mutex;

use crate::plugin_identity::{self, PluginRecord, wasm_identity};
use crate::upgrade_command::{ADMIN_COMMAND_UNKNOWN, UPGRADE_REFUSED, decode_upgrade};
use crate::{LoadError, Plugin, PluginEngine};

/// Modules kept loaded for upgrades (a group reloads an older one from the data, through the
/// compiled-module cache, if it was let go).
const LOADED_VERSIONS_MAX: usize = 4;

/// The versions of one plugin a node runs: the module it was configured with (the base) and
/// those its groups were upgraded to through the log. A [`StateMachineFactory`] of
/// [`VersionedMachine`]s. Cheap to clone.
#[derive(Clone)]
pub struct PluginVersions {
    shared: Arc<VersionsShared>,
}

struct VersionsShared {
    name: String,
    base_identity: String,
    base: Arc<dyn StateMachineFactory>,
    base_plugin: Option<Plugin>,
    /// Loads upgrades; `None` on a node that runs no wasm at all (the native session logic
    /// alone), which cannot take one.
    engine: Option<PluginEngine>,
    /// Modules loaded for upgrades, the most recently used last.
    loaded: Mutex<Vec<Plugin>>,
}

impl PluginVersions {
    /// The versions of the plugin `name`, whose configured module is `base` (its state
    /// machines), identified as `base_identity` (see `plugin_identity.rs`); `base_plugin`
    /// is the loaded module (`None` for the native session logic). Upgrades load through
    /// `engine` (`None`: this node takes none).
    pub fn new(
        name: &str,
        base_identity: String,
        base: Arc<dyn StateMachineFactory>,
        base_plugin: Option<Plugin>,
        engine: Option<PluginEngine>,
    ) -> Self {
        PluginVersions {
            shared: Arc::new(VersionsShared {
                name: name.into(),
                base_identity,
                base,
                base_plugin,
                engine,
                loaded: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The plugin's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The identity of the configured module.
    pub fn base_identity(&self) -> &str {
        &self.shared.base_identity
    }

    /// The configured module (`None` for the native session logic).
    pub fn base_plugin(&self) -> Option<Plugin> {
        self.shared.base_plugin.clone()
    }

    /// Loads and checks `module` as a version of this plugin: what every replica does at an
    /// upgrade entry, and what a proposer does first so that a bad module is refused before
    /// it reaches the log.
    pub fn load(&self, module: &[u8]) -> Result<Plugin, LoadError> {
        let hash = crate::module_cache::plugin_hash(module);
        let mut loaded = self.shared.loaded.lock();
        if let Some(position) = loaded.iter().position(|p| p.sha256() == hash) {
            let plugin = loaded.remove(position);
            loaded.push(plugin.clone());
            return Ok(plugin);
        }
        drop(loaded);
        // Compiled (or read from the module cache) outside the lock: it may take a while.
        let engine = self.shared.engine.as_ref().ok_or_else(|| {
            LoadError::Engine("this node runs no wasm engine (native session logic only)".into())
        })?;
        let plugin = engine.load(&self.shared.name, module)?;
        let mut loaded = self.shared.loaded.lock();
        if loaded.len() >= LOADED_VERSIONS_MAX {
            loaded.remove(0);
        }
        loaded.push(plugin.clone());
        Ok(plugin)
    }

    /// The module the data of `group` in `store` records as running (`None` for the native
    /// session logic): what the group runs, or will run at its next batch.
    pub fn recorded_plugin(
        &self,
        store: &dyn StateStore,
        group: GroupId,
    ) -> Result<Option<Plugin>, String> {
        let record = plugin_identity::read_plugin_record(store, group)?;
        let Some(record) = record.filter(|r| r.current != self.shared.base_identity) else {
            return Ok(self.shared.base_plugin.clone());
        };
        let loaded = self.shared.loaded.lock();
        if let Some(plugin) = loaded
            .iter()
            .find(|p| wasm_identity(p.sha256()) == record.current)
        {
            return Ok(Some(plugin.clone()));
        }
        drop(loaded);
        let module = store
            .get(group, &plugin_identity::module_key())
            .map_err(|e| format!("group {group}: reading its module: {e}"))?
            .ok_or_else(|| {
                format!(
                    "group {group}: its data records plugin {} but holds no module for it",
                    record.current
                )
            })?;
        self.load(&module)
            .map(Some)
            .map_err(|e| format!("group {group}: the module its data records: {e}"))
    }
}

impl StateMachineFactory for PluginVersions {
    fn create(&self, group: GroupId) -> Result<Box<dyn StateMachine>, ApplyError> {
        Ok(Box::new(VersionedMachine {
            versions: self.clone(),
            group,
            running: None,
        }))
    }
}

/// Runs, for one group, the module the group's data records (`plugin_identity.rs`):
/// the configured one, or the one an upgrade entry switched it to (its bytes are in the
/// data). The first batch of a group with no record writes one naming the configured module.
///
/// An upgrade ([`crate::encode_upgrade`], through `Consensus::propose_admin`) applies at its
/// entry on every replica: the module is loaded, its optional `concord_migrate` runs in the
/// same transaction, the record and the module's bytes are written, and the next entry runs
/// the new module. A module whose bytes do not load (not wasm, invalid, wrong exports,
/// imports or ABI version), or whose migration fails, is that command's error and nothing
/// changes; a failure of this host while loading it stops the group (another replica may have
/// switched).
pub struct VersionedMachine {
    versions: PluginVersions,
    group: GroupId,
    /// What the group runs and its record; `None` until the first batch reads the record.
    running: Option<Running>,
}

/// What a group runs: the machine, the record it follows, and the module (counted in
/// `concord_plugin_groups` while it runs; `None` for the native session logic).
struct Running {
    machine: Box<dyn StateMachine>,
    record: PluginRecord,
    module: Option<Plugin>,
}

impl Running {
    fn new(machine: Box<dyn StateMachine>, record: PluginRecord, module: Option<Plugin>) -> Self {
        if let Some(module) = &module {
            module.shared.counters.group_running(true);
        }
        Running {
            machine,
            record,
            module,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(module) = &self.module {
            module.shared.counters.group_running(false);
        }
    }
}

impl VersionedMachine {
    /// The machine for the module the group's data records (read on the first call).
    fn running(&mut self, txn: &mut StateTransaction<'_>) -> Result<&mut Running, ApplyError> {
        if self.running.is_none() {
            self.running = Some(self.start(txn)?);
        }
        Ok(self.running.as_mut().expect("set above"))
    }

    fn start(&self, txn: &mut StateTransaction<'_>) -> Result<Running, ApplyError> {
        let shared = &self.versions.shared;
        let base = &shared.base_identity;
        let Some(bytes) = plugin_identity::read_in(txn)? else {
            let record = PluginRecord {
                current: base.clone(),
                base: base.clone(),
            };
            txn.put(&plugin_identity::record_key(), &record.encode())?;
            let machine = shared.base.create(self.group)?;
            return Ok(Running::new(machine, record, shared.base_plugin.clone()));
        };
        let group = self.group;
        let record = PluginRecord::decode(&bytes)
            .map_err(|e| ApplyError::Fatal(format!("group {group}: {e}")))?;
        if &record.current == base {
            let machine = shared.base.create(group)?;
            return Ok(Running::new(machine, record, shared.base_plugin.clone()));
        }
        let module = txn.get(&plugin_identity::module_key())?;
        let recorded = module.filter(|module| {
            wasm_identity(&crate::module_cache::plugin_hash(module)) == record.current
        });
        let Some(module) = recorded else {
            return Err(ApplyError::Fatal(format!(
                "group {group}: its data was written by plugin {}, this node runs {base}, and \
                 the data holds no module for {}",
                record.current, record.current
            )));
        };
        let plugin = self.versions.load(&module).map_err(|e| {
            ApplyError::Fatal(format!(
                "group {group}: the module its data records ({}) does not load: {e}",
                record.current
            ))
        })?;
        let machine = Box::new(plugin.state_machine());
        Ok(Running::new(machine, record, Some(plugin)))
    }
}

impl StateMachine for VersionedMachine {
    fn apply(
        &mut self,
        txn: &mut StateTransaction<'_>,
        commands: &[Bytes],
    ) -> Result<Vec<CommandResult>, ApplyError> {
        self.running(txn)?.machine.apply(txn, commands)
    }

    fn apply_admin(
        &mut self,
        txn: &mut StateTransaction<'_>,
        command: &Bytes,
    ) -> Result<CommandResult, ApplyError> {
        let module = match decode_upgrade(command) {
            Ok(module) => module,
            Err(reason) => return Ok(Err(CommandError::new(ADMIN_COMMAND_UNKNOWN, reason))),
        };
        let from = self.running(txn)?.record.clone();
        let plugin = match self.versions.load(&module) {
            Ok(plugin) => plugin,
            // What the module's bytes decide is the same on every replica: the upgrade fails.
            Err(
                error @ (LoadError::NotWasm(_)
                | LoadError::Invalid(_)
                | LoadError::Export { .. }
                | LoadError::Import { .. }
                | LoadError::AbiVersion { .. }),
            ) => {
                return Ok(Err(CommandError::new(
                    UPGRADE_REFUSED,
                    format!("the module does not load: {error}"),
                )));
            }
            // What this host failed at (no instance slot in time, the engine) could go the
            // other way on another replica: the group stops rather than diverge.
            Err(error) => {
                return Err(ApplyError::Fatal(format!(
                    "group {}: loading the module of an upgrade: {error}",
                    self.group
                )));
            }
        };
        let identity = wasm_identity(plugin.sha256());
        if identity == from.current {
            return Ok(Ok(Bytes::from(identity)));
        }
        let mut machine = plugin.state_machine();
        if let Some(Err(error)) = machine.migrate(txn, from.current.as_bytes())? {
            return Ok(Err(CommandError::new(
                UPGRADE_REFUSED,
                format!("concord_migrate failed: {error}"),
            )));
        }
        let record = PluginRecord {
            current: identity.clone(),
            base: from.base,
        };
        txn.put(&plugin_identity::record_key(), &record.encode())?;
        txn.put(&plugin_identity::module_key(), &module)?;
        self.running = Some(Running::new(Box::new(machine), record, Some(plugin)));
        Ok(Ok(Bytes::from(identity)))
    }

    /// As quick as the machine it runs (the native session logic), once it runs one: an
    /// upgrade, which may load a module, comes in an admin entry, which the worker never
    /// applies itself.
    fn applies_quickly(&self) -> bool {
        (self.running.as_ref()).is_some_and(|running| running.machine.applies_quickly())
    }
}
