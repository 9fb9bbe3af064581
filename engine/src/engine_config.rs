//! What [`crate::Engine::open`] builds.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use concord_consensus::NodeConfig;
use concord_plugins::PluginLimits;
use concord_storage::{
    BackendKind, DEFAULT_STATE_CACHE_BYTES, StorageResult, SyncMode, recorded_backend,
};

/// Which replication runs the groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConsensusKind {
    /// raft-rs: every member of the [`ClusterConfig`] a voter of every group (this node alone
    /// without one).
    Raft,
    /// No raft: append, sync, apply with the same batching. For measuring raft's own cost.
    Solo,
}

impl ConsensusKind {
    /// `raft` or `solo`.
    pub fn name(self) -> &'static str {
        match self {
            ConsensusKind::Raft => "raft",
            ConsensusKind::Solo => "solo",
        }
    }
}

impl std::fmt::Display for ConsensusKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ConsensusKind {
    type Err = String;

    fn from_str(word: &str) -> Result<Self, Self::Err> {
        match word {
            "raft" => Ok(ConsensusKind::Raft),
            "solo" => Ok(ConsensusKind::Solo),
            other => Err(format!("consensus is raft or solo, not {other:?}")),
        }
    }
}

/// The state machine every group runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateMachineSource {
    /// The bundled session plugin (`fixtures/plugins/session.wasm`), in the wasm host.
    SessionPlugin,
    /// The same session logic compiled into the engine (no wasm).
    NativeSession,
    /// A wasm plugin file.
    PluginFile(PathBuf),
    /// A wasm plugin's bytes, with a name for logs and errors.
    PluginBytes {
        /// The plugin's name.
        name: String,
        /// The module.
        wasm: Vec<u8>,
    },
}

impl StateMachineSource {
    /// Whether the groups run the session logic, so that [`crate::Sessions`] applies.
    pub fn is_session(&self) -> bool {
        matches!(
            self,
            StateMachineSource::SessionPlugin | StateMachineSource::NativeSession
        )
    }
}

/// A plugin served beside the main state machine (see [`EngineConfig::plugins`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedPlugin {
    /// Names it in the API (`/v1/plugins/{name}`) and in metrics: 1 to 64 of `a-z`, `0-9`, `-`,
    /// `_`, and not `session` (the sessions' plugin's name).
    pub name: String,
    /// Its module: [`StateMachineSource::PluginFile`] or [`StateMachineSource::PluginBytes`]
    /// (or the bundled session logic, served as a plain plugin).
    pub source: StateMachineSource,
    /// Groups its keys are spread over.
    pub groups: u32,
}

/// Settings of an [`crate::Engine`]. [`EngineConfig::new`] gives a working single node: the
/// WAL log and redb state under the directory given (or the backend an existing directory was
/// made with), raft, the session plugin, 8 groups, syncs on.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Where the stores live (created if missing). On a backend that keeps its data, the
    /// engine keeps small files of its own beside them: the group layout
    /// ([`crate::GROUP_LAYOUT_FILE`]), whether the log synced its writes
    /// ([`crate::LOG_SYNC_FILE`]) and, on a cluster member, the peers' addresses (`peers`)
    /// and the vote quiet it said ([`crate::VOTE_QUIET_FILE`]). Copy or move the directory
    /// whole.
    pub data_dir: PathBuf,
    /// The storage backend. `None` (the default): the one the data directory was made with,
    /// or, for a new directory, [`BackendKind::Wal`] (the log in Concord's WAL, the state in
    /// redb). Naming a backend other than the directory's is refused at open.
    /// [`Engine::backend`](crate::Engine::backend) says which one an open engine uses.
    pub backend: Option<BackendKind>,
    /// Whether each log write syncs before it is acknowledged. `NoSync` loses acknowledged
    /// writes on a crash: for benchmarks only.
    pub log_sync: SyncMode,
    /// Page cache of the state file on the redb and WAL backends, in bytes (at least
    /// [`MIN_STATE_CACHE_BYTES`]; ignored by the others). A larger one reads fewer pages back
    /// from the file (none once the state fits) and lets a flush keep more of the pages it
    /// changes in memory until it commits; memory grows by as much.
    pub state_cache_bytes: usize,
    /// Raft or solo.
    pub consensus: ConsensusKind,
    /// The groups' state machine.
    pub state_machine: StateMachineSource,
    /// How many groups the key space is split into. Fixed for a data directory: the engine
    /// refuses to open one created with another count (keys would route elsewhere).
    pub groups: u32,
    /// Raft worker threads (each owns `groups / workers` groups and syncs once per round).
    /// Two help a node of hundreds of busy groups on the memory backend use both of two cores;
    /// on the WAL they were no faster, and on redb, whose one file takes the workers' writes in
    /// turn, one does better.
    pub raft_workers: usize,
    /// Largest command accepted, in bytes.
    pub max_command_bytes: usize,
    /// Commands a group may have queued before proposals are refused as overloaded.
    pub proposal_queue_capacity: usize,
    /// How long a proposal may wait for its result before it answers `Timeout`.
    pub proposal_timeout: Duration,
    /// Applied entries each group's log keeps behind its compaction point (at least 1).
    pub log_keep_entries: u64,
    /// A voter this many entries behind its leader no longer holds the log back from
    /// compaction: it is sent a snapshot of the group's state instead (at least 1).
    pub snapshot_lag_entries: u64,
    /// Payload bytes of applied entries the logs of all groups keep together (each group an
    /// equal share, compacted down to it when it holds twice as much). The log is held in
    /// memory by every backend but sled, and under load one entry carries thousands of
    /// commands: this bounds the memory.
    pub log_keep_bytes: u64,
    /// How long one raft tick lasts (100 ms by default, 20 ms to 1 s): a leader sends
    /// heartbeats every tick, a follower that hears nothing for 10 to 20 ticks (drawn at
    /// random) starts an election, and a leader's lease lasts nine tenths of 9 ticks. Longer
    /// ticks suit members far apart (a round trip between them well under one tick) and
    /// tolerate longer stalls before an election, shorter ones replace a dead leader sooner.
    /// Give every member of a cluster the same. Each tells the others its own when it
    /// connects, and a leader's lease lasts nine tenths of the shortest member's 9 ticks, so
    /// members whose ticks differ (during a rolling change of the setting) get shorter leases,
    /// never stale reads.
    pub raft_tick: Duration,
    /// Raft ticks (`raft_tick` each) a group of a cluster must stay idle — everything
    /// committed, applied and on every member — before it sleeps: no ticks, no heartbeats,
    /// until a request or a message wakes it (or its leader's node falls silent). 0: never.
    pub sleep_after_ticks: usize,
    /// A raft log write (with its sync) slower than this makes the node hand every group it
    /// leads to another voter, so that a member whose disk stalls stops holding the
    /// cluster's writes to its pace (its heartbeats, sent between writes, keep the others from
    /// electing). `None`: never.
    pub slow_log_write: Option<Duration>,
    /// The longest an idle raft or apply thread keeps yielding the CPU, watching for work,
    /// before it parks: latency when requests come one after another, bought with CPU that
    /// other threads of the process (an HTTP server's, the application's) may need. Each
    /// thread watches only as long as work has lately come back within this bound (the window
    /// doubles when work came soon after the thread parked, halves when none came within the
    /// bound), and stops as soon as another thread wants its CPU, so a node at a low rate or
    /// on busy cores parks at once. Zero parks at once.
    pub idle_spin: Duration,
    /// Limits of wasm plugins (fuel, memory, stack, watchdog). They decide outcomes (a command
    /// out of fuel fails), so every replica of a cluster must run with the same.
    pub plugin_limits: PluginLimits,
    /// More plugins served beside `state_machine`, each over groups of its own (numbered after
    /// the main groups, in this order) and called through [`crate::Engine::plugin_client`].
    /// Recorded with the data like the group count: a plugin may be added at the end, not
    /// removed, renamed, reordered or given another group count.
    pub plugins: Vec<ServedPlugin>,
    /// This node's place in a cluster of processes; `None` runs one node alone.
    pub cluster: Option<ClusterConfig>,
}

/// A node of a cluster of processes: every group is replicated on every member, the members
/// talking raft over TCP. Every member is given the same `members` and `cluster_id`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// Names the cluster: a peer of another cluster is refused.
    pub cluster_id: u64,
    /// This node (non-zero, one of `members`).
    pub node_id: u64,
    /// Every member's raft address, this node's included.
    pub members: BTreeMap<u64, SocketAddr>,
    /// Where this node listens for its peers; its own entry of `members` if `None`.
    pub listen_addr: Option<SocketAddr>,
    /// Where this node's clients reach it (the `concord` server's HTTP URL), told to every
    /// peer so that any member can name any other's ([`crate::Engine::client_urls`]). At
    /// most 1024 bytes.
    pub client_url: Option<String>,
    /// This member joins a cluster that already has data: it lost its own (and starts again
    /// with its old id), or it is new. A group with no data here then takes part in no
    /// election until it has caught up with a leader (a member that forgot what it
    /// acknowledged must not help elect a leader that lacks it). `false` when every member
    /// starts a new cluster together; a member started so without data of a group that has
    /// run catches up too, once a candidate whose log has entries asks for its vote. On the
    /// memory backend, a member whose data directory records that it ran before (its
    /// `MEMORY_MEMBER` file, written as its groups first start) joins whatever this says: it
    /// kept nothing.
    pub joins_existing: bool,
    /// Mutual TLS between the members (`None`: plain TCP). Every member uses it, or none.
    pub tls: Option<PeerTlsFiles>,
}

/// The PEM files of a member's TLS to its peers: every member's certificate is signed by the
/// cluster's CA and names the IP address the member is reached at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerTlsFiles {
    /// The CA certificate(s) the members' certificates are signed by.
    pub ca: std::path::PathBuf,
    /// This member's certificate chain.
    pub cert: std::path::PathBuf,
    /// This member's private key.
    pub key: std::path::PathBuf,
}

impl ClusterConfig {
    /// Reads `1=127.0.0.1:7170,2=127.0.0.1:7171,...` (the form of `--initial-cluster`).
    pub fn parse_members(text: &str) -> Result<BTreeMap<u64, SocketAddr>, String> {
        let mut members = BTreeMap::new();
        for item in text
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
        {
            let (id, address) = item
                .split_once('=')
                .ok_or_else(|| format!("{item:?} is not id=host:port"))?;
            let id: u64 = id
                .trim()
                .parse()
                .map_err(|_| format!("{id:?} is not a node id"))?;
            let address: SocketAddr = address
                .trim()
                .parse()
                .map_err(|error| format!("{address:?}: {error}"))?;
            if members.insert(id, address).is_some() {
                return Err(format!("node {id} is named twice"));
            }
        }
        Ok(members)
    }
}

impl EngineConfig {
    /// Defaults with the data under `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        let defaults = NodeConfig::new(1, vec![1], vec![0]);
        EngineConfig {
            data_dir: data_dir.into(),
            backend: None,
            log_sync: SyncMode::Sync,
            state_cache_bytes: DEFAULT_STATE_CACHE_BYTES,
            consensus: ConsensusKind::Raft,
            state_machine: StateMachineSource::SessionPlugin,
            groups: 8,
            raft_workers: 1,
            max_command_bytes: defaults.max_command_bytes,
            proposal_queue_capacity: defaults.proposal_queue_capacity,
            proposal_timeout: defaults.proposal_timeout,
            log_keep_entries: defaults.log_keep_entries,
            snapshot_lag_entries: defaults.snapshot_lag_entries,
            log_keep_bytes: defaults.log_keep_bytes,
            raft_tick: defaults.tick_interval,
            sleep_after_ticks: defaults.sleep_after_ticks,
            slow_log_write: defaults.slow_log_write,
            idle_spin: defaults.idle_spin,
            plugin_limits: PluginLimits::default(),
            plugins: Vec::new(),
            cluster: None,
        }
    }

    /// The backend to open the data directory with: `backend` if set, else the one the
    /// directory's format marker names, else (a new directory) the WAL.
    pub(crate) fn chosen_backend(&self) -> StorageResult<BackendKind> {
        match self.backend {
            Some(backend) => Ok(backend),
            None => Ok(recorded_backend(&self.data_dir)?.unwrap_or(BackendKind::Wal)),
        }
    }

    /// Checks the settings, naming the first wrong one.
    pub fn validate(&self) -> Result<(), String> {
        if self.groups == 0 || self.groups > MAX_GROUPS {
            return Err(format!(
                "groups must be 1..={MAX_GROUPS}, not {}",
                self.groups
            ));
        }
        if self.raft_workers == 0 || self.raft_workers > MAX_RAFT_WORKERS {
            return Err(format!(
                "raft_workers must be 1..={MAX_RAFT_WORKERS}, not {}",
                self.raft_workers
            ));
        }
        if self.snapshot_lag_entries == 0 {
            return Err("snapshot_lag_entries must be at least 1".into());
        }
        if self.log_keep_entries == 0 {
            return Err("log_keep_entries must be at least 1".into());
        }
        if self.log_keep_bytes == 0 {
            return Err("log_keep_bytes must be at least 1".into());
        }
        if !(MIN_RAFT_TICK..=MAX_RAFT_TICK).contains(&self.raft_tick) {
            return Err(format!(
                "raft_tick must be {} to {} ms, not {} ms",
                MIN_RAFT_TICK.as_millis(),
                MAX_RAFT_TICK.as_millis(),
                self.raft_tick.as_millis()
            ));
        }
        if self.state_cache_bytes < MIN_STATE_CACHE_BYTES {
            return Err(format!(
                "state_cache_bytes must be at least {MIN_STATE_CACHE_BYTES} (1 MiB), not {}",
                self.state_cache_bytes
            ));
        }
        if self.data_dir.as_os_str().is_empty() {
            return Err("data_dir must not be empty".into());
        }
        let mut total_groups = u64::from(self.groups);
        for (position, plugin) in self.plugins.iter().enumerate() {
            check_plugin_name(&plugin.name)?;
            if plugin.name == "session" {
                return Err(
                    "a served plugin cannot be named \"session\": the sessions' plugin is".into(),
                );
            }
            if self.plugins[..position]
                .iter()
                .any(|p| p.name == plugin.name)
            {
                return Err(format!("plugin {:?} is served twice", plugin.name));
            }
            if plugin.groups == 0 {
                return Err(format!("plugin {:?} needs at least one group", plugin.name));
            }
            total_groups += u64::from(plugin.groups);
        }
        if total_groups > u64::from(MAX_GROUPS) {
            return Err(format!(
                "{total_groups} groups in all (main and plugins), more than {MAX_GROUPS}"
            ));
        }
        if let Some(cluster) = &self.cluster {
            if self.consensus != ConsensusKind::Raft {
                return Err("a cluster runs raft, not solo".into());
            }
            if cluster.node_id == 0 || !cluster.members.contains_key(&cluster.node_id) {
                return Err(format!(
                    "node_id {} must be one of the cluster's members {:?}",
                    cluster.node_id,
                    cluster.members.keys().collect::<Vec<_>>()
                ));
            }
            if cluster.members.contains_key(&0) {
                return Err("node ids start at 1".into());
            }
        }
        Ok(())
    }
}

/// The most groups one engine hosts.
pub const MAX_GROUPS: u32 = 65_536;

/// Longest name of a served plugin.
pub const PLUGIN_NAME_BYTES_MAX: usize = 64;

fn check_plugin_name(name: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_';
    if name.is_empty() || name.len() > PLUGIN_NAME_BYTES_MAX || !name.chars().all(allowed) {
        return Err(format!(
            "plugin name {name:?}: 1 to {PLUGIN_NAME_BYTES_MAX} of a-z, 0-9, - and _"
        ));
    }
    Ok(())
}
/// The most raft worker threads.
pub const MAX_RAFT_WORKERS: usize = 256;

/// The shortest [`EngineConfig::raft_tick`].
pub const MIN_RAFT_TICK: Duration = Duration::from_millis(20);

/// The longest [`EngineConfig::raft_tick`].
pub const MAX_RAFT_TICK: Duration = Duration::from_secs(1);

/// The least [`EngineConfig::state_cache_bytes`]: redb needs a few pages for one flush.
pub const MIN_STATE_CACHE_BYTES: usize = 1024 * 1024;
