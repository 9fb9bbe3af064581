//! How an engine opens: its settings checked, its stores and plugins opened, its node's
//! settings made, and, once consensus runs, its groups waited for.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use concord_consensus::{
    Consensus, LOG_SYNC_FILE, NodeConfig, NodeId, RaftNode, SoloNode, StateMachine,
    StateMachineFactory,
};
use concord_plugins::{
    BUNDLED_SESSION_IDENTITY, LoadError, NativeSessionMachine, PluginEngine, PluginEngineConfig,
    PluginVersions, bundled, read_plugin_record, wasm_identity,
};
use concord_storage::{BackendKind, GroupId, StateStore, StoreConfig, Stores};

use super::{Engine, Network};
use crate::expiry_index::ExpiryIndex;
use crate::expiry_index_builder::IndexBuilder;
use crate::expiry_tracking_store::ExpiryTrackingStore;
use crate::group_layout::{self, GroupLayout};
use crate::memory_member_record;
use crate::plugin_client::{GroupRangeFactory, ServedGroups};
use crate::vote_quiet_record::{self, QuietKeeper};
use crate::{EngineConfig, EngineError, StateMachineSource};

/// Where, under the data directory, snapshots wait for their install.
const SNAPSHOT_DIR: &str = "snapshots";

/// How long [`Engine::open`] waits for its groups to elect themselves and catch up.
const LEADER_WAIT: Duration = Duration::from_secs(5);

/// What every way of opening an engine starts from.
pub(super) struct Prepared {
    pub(super) stores: Stores,
    pub(super) factory: Arc<dyn StateMachineFactory>,
    plugin: PluginVersions,
    served: Vec<ServedGroups>,
    group_ids: Vec<GroupId>,
    pub(super) node_config: NodeConfig,
    expiry_index: Option<Arc<ExpiryIndex>>,
    /// Records this run's vote quiet once the longer one said before has passed.
    pub(super) vote_quiet_keeper: Option<QuietKeeper>,
}

/// Checks `config`, opens the stores (checking the group count recorded with the data) and
/// makes the node's settings for `node_id` among `voters`.
pub(super) fn prepare(
    config: &EngineConfig,
    node_id: NodeId,
    voters: Vec<NodeId>,
) -> Result<Prepared, EngineError> {
    config.validate().map_err(EngineError::Config)?;
    let backend = config.chosen_backend()?;
    if backend.is_persistent() {
        crate::backup::refuse_unfinished_restore(&config.data_dir)?;
    }
    let mut store_config = StoreConfig::new(backend, &config.data_dir);
    store_config.log_sync = config.log_sync;
    store_config.state_cache_bytes = config.state_cache_bytes;
    let mut stores = Stores::open(&store_config)?;
    if backend.is_persistent() {
        let mut held_groups = stores.log.groups()?;
        held_groups.extend(stores.state.groups()?);
        let layout = GroupLayout::of(config);
        group_layout::check_or_record(&config.data_dir, &layout, &held_groups)?;
    }
    let mut loader = PluginLoader::new(config);
    let plugin = loader.load(&config.state_machine, None)?;
    let main_groups = 0..u64::from(config.groups);
    check_plugin_records(
        stores.state.as_ref(),
        "session",
        &plugin,
        main_groups.clone(),
    )?;
    let mut ranges: Vec<(Range<GroupId>, Arc<dyn StateMachineFactory>)> =
        vec![(main_groups, Arc::new(plugin.clone()))];
    let mut served = Vec::with_capacity(config.plugins.len());
    let mut next_group = u64::from(config.groups);
    for served_plugin in &config.plugins {
        let versions = loader.load(&served_plugin.source, Some(&served_plugin.name))?;
        let groups = next_group..next_group + u64::from(served_plugin.groups);
        check_plugin_records(
            stores.state.as_ref(),
            &served_plugin.name,
            &versions,
            groups.clone(),
        )?;
        ranges.push((groups.clone(), Arc::new(versions.clone())));
        served.push(ServedGroups {
            name: served_plugin.name.clone(),
            first_group: groups.start,
            groups: served_plugin.groups,
            versions,
        });
        next_group = groups.end;
    }
    let factory: Arc<dyn StateMachineFactory> = if ranges.len() == 1 {
        ranges.pop().expect("one range").1
    } else {
        Arc::new(GroupRangeFactory { ranges })
    };
    let group_ids: Vec<GroupId> = (0..next_group).collect();
    let mut node_config = NodeConfig::new(node_id, voters, group_ids.clone());
    node_config.workers = config.raft_workers.min(group_ids.len());
    node_config.max_command_bytes = config.max_command_bytes;
    node_config.proposal_queue_capacity = config.proposal_queue_capacity;
    node_config.log_keep_entries = config.log_keep_entries;
    node_config.snapshot_lag_entries = config.snapshot_lag_entries;
    node_config.catch_up_before_voting = config
        .cluster
        .as_ref()
        .is_some_and(|cluster| cluster.joins_existing);
    if backend.is_persistent() {
        node_config.snapshot_dir = Some(config.data_dir.join(SNAPSHOT_DIR));
        node_config.log_sync_record = Some(config.data_dir.join(LOG_SYNC_FILE));
    }
    node_config.log_keep_bytes = config.log_keep_bytes;
    node_config.tick_interval = config.raft_tick;
    node_config.sleep_after_ticks = config.sleep_after_ticks;
    node_config.slow_log_write = config.slow_log_write;
    node_config.idle_spin = config.idle_spin;
    node_config.proposal_timeout = config.proposal_timeout;
    // Every commit of the main groups passes the expiry index on its way to the store.
    let expiry_index = config.state_machine.is_session().then(|| {
        let index = Arc::new(ExpiryIndex::new(0..u64::from(config.groups)));
        stores.state = Arc::new(ExpiryTrackingStore::new(
            stores.state.clone(),
            index.clone(),
        ));
        index
    });
    Ok(Prepared {
        stores,
        factory,
        plugin,
        served,
        group_ids,
        node_config,
        expiry_index,
        vote_quiet_keeper: None,
    })
}

/// Refuses to open groups whose data records another plugin than `versions`' configured
/// module (or one it was upgraded from through the log).
fn check_plugin_records(
    state: &dyn StateStore,
    name: &str,
    versions: &PluginVersions,
    groups: Range<GroupId>,
) -> Result<(), EngineError> {
    let configured = versions.base_identity();
    for group in groups {
        let record = read_plugin_record(state, group).map_err(EngineError::PluginRecord)?;
        let Some(record) = record else {
            continue;
        };
        if !record.accepts(configured) {
            return Err(EngineError::PluginMismatch {
                group,
                plugin: name.into(),
                recorded: record.current,
                recorded_base: record.base,
                configured: configured.into(),
            });
        }
    }
    Ok(())
}

/// Starts solo consensus if there is no raft node, waits for leaders if asked, and makes the
/// engine.
pub(super) fn finish(
    config: EngineConfig,
    prepared: Prepared,
    raft: Option<Arc<RaftNode>>,
    network: Network,
    wait_leaders: bool,
) -> Result<Engine, EngineError> {
    let Prepared {
        stores,
        factory,
        plugin,
        served,
        group_ids,
        node_config,
        expiry_index,
        vote_quiet_keeper,
    } = prepared;
    let node_id = node_config.node_id;
    let consensus: Arc<dyn Consensus> = match &raft {
        Some(node) => node.clone(),
        None => SoloNode::start(node_config, stores.clone(), factory)?,
    };
    if wait_leaders {
        wait_for_leaders(consensus.as_ref(), &group_ids);
    }
    // Without the builder, the scans walk the groups (and complete the index that way).
    let index_builder = expiry_index.as_ref().and_then(|index| {
        IndexBuilder::start(index.clone(), stores.state.clone())
            .inspect_err(|error| tracing::warn!(%error, "starting the expiry index's builder"))
            .ok()
    });
    tracing::info!(
        data_dir = %config.data_dir.display(),
        backend = config.chosen_backend()?.name(),
        consensus = config.consensus.name(),
        groups = config.groups,
        "engine open"
    );
    Ok(Engine {
        consensus,
        raft,
        node_id,
        stores,
        config,
        group_ids,
        network,
        plugin,
        served,
        expiry_index,
        index_builder,
        _vote_quiet_keeper: vote_quiet_keeper,
        stopped: AtomicBool::new(false),
    })
}

/// A member of a cluster on the memory backend started with its first start's flags after
/// it ran before (`memory_member_record.rs`) joins as a member that lost its data, as
/// `--initial-cluster-state existing` would have it.
pub(super) fn rejoin_if_run_before_on_memory(
    config: &mut EngineConfig,
    backend: BackendKind,
) -> Result<(), EngineError> {
    if backend.is_persistent() {
        return Ok(());
    }
    let Some(cluster) = config.cluster.as_mut().filter(|c| !c.joins_existing) else {
        return Ok(());
    };
    if memory_member_record::started_before(&config.data_dir, cluster.cluster_id, cluster.node_id)?
    {
        tracing::warn!(
            record = %memory_member_record::path_in(&config.data_dir).display(),
            "this member ran on the memory backend before and kept nothing: it joins as a \
             member that lost its data, catching up from the others before it takes part \
             (remove the record to start a new cluster with this directory)"
        );
        cluster.joins_existing = true;
    }
    Ok(())
}

/// A member restarted with shorter ticks than it ran with before holds its vote for the
/// quiet it said then (`vote_quiet_record.rs`): sets `previous_vote_quiet` from the data
/// directory's record and returns what records this run's quiet once that has passed.
pub(super) fn hold_the_quiet_said_before(
    config: &EngineConfig,
    node_config: &mut NodeConfig,
) -> Result<Option<QuietKeeper>, EngineError> {
    let own = node_config.vote_quiet();
    let previous = vote_quiet_record::take_over(&config.data_dir, own)?;
    if previous.is_zero() {
        return Ok(None);
    }
    tracing::warn!(
        said_before_ms = previous.as_millis() as u64,
        vote_quiet_ms = own.as_millis() as u64,
        "the ticks are shorter than in the last run: this member holds its vote for the \
         longer quiet it said then, which a leader's lease may still count on"
    );
    node_config.previous_vote_quiet = previous;
    let keeper = QuietKeeper::start(&config.data_dir, previous, own).map_err(|error| {
        EngineError::VoteQuiet {
            path: config.data_dir.display().to_string(),
            problem: format!("cannot start the thread that records the vote quiet: {error}"),
        }
    })?;
    Ok(Some(keeper))
}

/// A group whose only voter is this node elects itself at once, but on the raft thread: wait
/// for it, so that the first call after `open` does not meet `NotLeader`, and for the apply
/// thread to reach the end of the log (the new leader's empty entry, or the entries replayed
/// after a restart), so that an engine is ready when `open` returns. Bounded; past the bound,
/// callers get `NotLeader` answers and `/readyz` says not ready.
fn wait_for_leaders(consensus: &dyn Consensus, groups: &[GroupId]) {
    let deadline = Instant::now() + LEADER_WAIT;
    let mut waiting: Vec<GroupId> = groups.to_vec();
    while !waiting.is_empty() && Instant::now() < deadline {
        waiting.retain(|&group| {
            consensus
                .status(group)
                .is_ok_and(|s| s.stopped.is_none() && (s.leader == 0 || s.apply_lag > 0))
        });
        if !waiting.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    if !waiting.is_empty() {
        tracing::warn!(
            groups = waiting.len(),
            "groups without a leader or still applying after {LEADER_WAIT:?}"
        );
    }
}

/// Loads the engine's plugins into one wasmtime engine (one pool of instances, one watchdog
/// clock, one module cache), made when the first plugin is loaded.
struct PluginLoader<'c> {
    config: &'c EngineConfig,
    engine: Option<PluginEngine>,
}

impl<'c> PluginLoader<'c> {
    fn new(config: &'c EngineConfig) -> Self {
        PluginLoader {
            config,
            engine: None,
        }
    }

    fn engine(&mut self) -> Result<&PluginEngine, EngineError> {
        if self.engine.is_none() {
            let config = self.config;
            self.engine = Some(PluginEngine::new(PluginEngineConfig {
                limits: config.plugin_limits.clone(),
                // Compiled modules are kept with the data so a restart does not recompile.
                module_cache_dir: config
                    .chosen_backend()?
                    .is_persistent()
                    .then(|| config.data_dir.join("modules")),
                ..PluginEngineConfig::default()
            })?);
        }
        Ok(self.engine.as_ref().expect("made above"))
    }

    /// The versions of `source` (its factory, identity and loaded module; `None` for the
    /// native session logic), named `name` (a plugin file's stem when `None`, "session" for
    /// the bundled session plugin).
    fn load(
        &mut self,
        source: &StateMachineSource,
        name: Option<&str>,
    ) -> Result<PluginVersions, EngineError> {
        let plugin = match source {
            StateMachineSource::NativeSession => {
                let native = Arc::new(|_group: GroupId| {
                    Box::new(NativeSessionMachine) as Box<dyn StateMachine>
                });
                return Ok(PluginVersions::new(
                    name.unwrap_or("session"),
                    BUNDLED_SESSION_IDENTITY.into(),
                    native,
                    None,
                    self.engine.clone(),
                ));
            }
            StateMachineSource::SessionPlugin => self
                .engine()?
                .load(name.unwrap_or("session"), bundled::SESSION)?,
            StateMachineSource::PluginBytes {
                name: own_name,
                wasm,
            } => self.engine()?.load(name.unwrap_or(own_name), wasm)?,
            StateMachineSource::PluginFile(path) => match name {
                None => self.engine()?.load_file(path)?,
                Some(name) => {
                    let wasm = std::fs::read(path).map_err(|source| LoadError::Read {
                        path: path.display().to_string(),
                        source,
                    })?;
                    self.engine()?.load(name, &wasm)?
                }
            },
        };
        // The session logic Concord ships is one logic as wasm or native, upgraded with the
        // binary: its identity is not the hash of this release's module.
        let identity = if matches!(source, StateMachineSource::SessionPlugin) {
            BUNDLED_SESSION_IDENTITY.into()
        } else {
            wasm_identity(plugin.sha256())
        };
        let name = plugin.name().to_string();
        Ok(PluginVersions::new(
            &name,
            identity,
            Arc::new(plugin.clone()),
            Some(plugin),
            self.engine.clone(),
        ))
    }
}
