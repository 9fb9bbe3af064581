//! [`Engine`]: the stores, consensus and the state machine of every group, wired together.

mod opening;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use concord_consensus::transport::{PeerTls, TcpNetwork, TcpNetworkConfig};
use concord_consensus::{Consensus, GroupStatus, InProcessNetwork, NodeId, ProposeError, RaftNode};
use concord_plugins::{Plugin, PluginVersions, encode_upgrade, wasm_identity};
use concord_storage::{BackendKind, GroupId, StateStore, StorageResult, Stores};

use self::opening::{finish, hold_the_quiet_said_before, prepare, rejoin_if_run_before_on_memory};
use crate::engine_health::{EngineHealth, group_serves};
use crate::expiry_index::ExpiryIndex;
use crate::expiry_index_builder::IndexBuilder;
use crate::group_layout::GroupLayout;
use crate::memory_member_record;
use crate::plugin_client::{PluginClient, ServedGroups};
use crate::routing::group_of;
use crate::vote_quiet_record::QuietKeeper;
use crate::{BackupSummary, ConsensusKind, Consistency, EngineConfig, EngineError, Sessions};

/// A shutdown that takes longer says which of its steps took the time.
const SLOW_SHUTDOWN: Duration = Duration::from_secs(1);

/// Where, under the data directory, the peers membership changes added or removed are kept.
const PEERS_FILE: &str = "peers";

/// This node's id when it runs alone (no [`crate::ClusterConfig`]).
const SINGLE_NODE_ID: u64 = 1;

/// An open Concord engine: `groups` raft (or solo) groups over one set of stores, each running
/// the configured state machine. Keys route to groups by [`crate::group_of`].
///
/// Dropping the engine shuts it down (see [`Engine::shutdown`]).
///
/// ```
/// use concord_engine::{Consistency, Engine, EngineConfig, SessionFields};
///
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let dir = tempfile::tempdir()?;
/// let engine = Engine::open(EngineConfig::new(dir.path()))?;
/// let sessions = engine.sessions()?;
/// let created = sessions.create("dev/42", SessionFields::default()).await?;
/// let read = sessions.get("dev/42", Consistency::Linearizable).await?;
/// assert_eq!(read, created);
/// engine.shutdown()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Engine {
    consensus: Arc<dyn Consensus>,
    /// The same node as `consensus` when it runs raft, for what only raft does.
    raft: Option<Arc<RaftNode>>,
    node_id: NodeId,
    stores: Stores,
    config: EngineConfig,
    /// `0..n`, in order: a lookup is a binary search, not a scan of thousands per read.
    group_ids: Vec<GroupId>,
    /// The raft node's network: in-process when it runs alone, TCP in a cluster.
    network: Network,
    /// The module the main groups run (`None` inside for the native session logic).
    plugin: PluginVersions,
    /// The plugins served beside it, each over its own groups.
    served: Vec<ServedGroups>,
    /// Which sessions of the main groups can expire, when they run the session logic.
    expiry_index: Option<Arc<ExpiryIndex>>,
    /// Reads the sessions stored before the start into `expiry_index`.
    index_builder: Option<IndexBuilder>,
    /// Records this run's vote quiet once the longer one said before the restart has passed.
    _vote_quiet_keeper: Option<QuietKeeper>,
    stopped: AtomicBool,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// What [`Engine::state_digest`] computes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateDigest {
    /// The applied index the state reflects.
    pub applied_index: u64,
    /// Key-value pairs in the state.
    pub pairs: u64,
    /// SHA-256 of the pairs, in hex.
    pub sha256: String,
}

/// How the engine's raft node reaches its peers.
enum Network {
    /// Solo: no peers.
    None,
    /// A single raft node: a network of one.
    InProcess(#[allow(dead_code)] Arc<InProcessNetwork>),
    /// A member of a cluster of processes.
    Tcp(Arc<TcpNetwork>),
}

impl Engine {
    /// Opens (or creates) the data directory, loads the state machine, recovers every group
    /// (re-applying logged entries the state has not seen) and starts consensus. A raft group
    /// with this node as its only voter elects itself at once; in a cluster
    /// ([`EngineConfig::cluster`]) the node listens for its peers and the members elect
    /// leaders once a quorum runs. `open` returns when every group has a leader and has applied
    /// its whole log, or after a few seconds; a node joining a running cluster
    /// ([`crate::ClusterConfig::joins_existing`]) returns at once: its groups wait for a
    /// snapshot from their leaders (see [`Engine::change_membership`]). A data directory that
    /// [`crate::restore_backup`] did not finish is refused ([`EngineError::Backup`]).
    pub fn open(mut config: EngineConfig) -> Result<Engine, EngineError> {
        let backend = config.chosen_backend()?;
        config.backend = Some(backend);
        rejoin_if_run_before_on_memory(&mut config, backend)?;
        let (node_id, voters) = match &config.cluster {
            Some(cluster) => (cluster.node_id, cluster.members.keys().copied().collect()),
            None => (SINGLE_NODE_ID, vec![SINGLE_NODE_ID]),
        };
        let mut prepared = prepare(&config, node_id, voters)?;
        let (raft, network): (Option<Arc<RaftNode>>, Network) =
            match (&config.consensus, &config.cluster) {
                (ConsensusKind::Raft, Some(cluster)) => {
                    let listen = cluster
                        .listen_addr
                        .unwrap_or(cluster.members[&cluster.node_id]);
                    let listener = std::net::TcpListener::bind(listen).map_err(|source| {
                        EngineError::Listen {
                            address: listen,
                            source,
                        }
                    })?;
                    let peers = cluster.members.clone();
                    let mut tcp_config = TcpNetworkConfig::new(cluster.cluster_id, node_id, peers);
                    tcp_config.client_url = cluster.client_url.clone().unwrap_or_default();
                    if backend.is_persistent() {
                        tcp_config.peers_file = Some(config.data_dir.join(PEERS_FILE));
                        prepared.vote_quiet_keeper =
                            hold_the_quiet_said_before(&config, &mut prepared.node_config)?;
                    }
                    tcp_config.vote_quiet = prepared.node_config.vote_quiet();
                    if let Some(files) = &cluster.tls {
                        let tls = PeerTls::from_files(&files.ca, &files.cert, &files.key)
                            .map_err(|error| EngineError::Config(format!("peer TLS: {error}")))?;
                        tcp_config.tls = Some(tls);
                    }
                    let network = TcpNetwork::start(tcp_config, listener).map_err(|source| {
                        EngineError::Listen {
                            address: listen,
                            source,
                        }
                    })?;
                    if !backend.is_persistent() {
                        // Before the groups start: from here on they may vote and acknowledge.
                        memory_member_record::record(
                            &config.data_dir,
                            cluster.cluster_id,
                            node_id,
                        )?;
                    }
                    let node = RaftNode::start(
                        prepared.node_config.clone(),
                        prepared.stores.clone(),
                        prepared.factory.clone(),
                        network.transport(),
                    )?;
                    network.deliver_to(node.sink());
                    (Some(node), Network::Tcp(network))
                }
                (ConsensusKind::Raft, None) => {
                    let network = InProcessNetwork::new();
                    let node = RaftNode::start(
                        prepared.node_config.clone(),
                        prepared.stores.clone(),
                        prepared.factory.clone(),
                        network.transport(SINGLE_NODE_ID),
                    )?;
                    network.register(SINGLE_NODE_ID, node.sink());
                    (Some(node), Network::InProcess(network))
                }
                (ConsensusKind::Solo, _) => (None, Network::None),
            };
        // A node joining a running cluster has no leader until a member adds it.
        let joins_existing = config.cluster.as_ref().is_some_and(|c| c.joins_existing);
        finish(config, prepared, raft, network, !joins_existing)
    }

    /// Opens a member of a cluster in this process whose raft messages travel over
    /// `network` (which may drop, delay and partition them), for tests of what clients see:
    /// `node_id` among `voters`, `tweak` applied to the node's settings (short ticks, say).
    /// Returns without waiting for leaders. Behind the `testing` feature.
    #[cfg(feature = "testing")]
    pub fn open_in_process(
        mut config: EngineConfig,
        node_id: NodeId,
        voters: Vec<NodeId>,
        network: &Arc<concord_consensus::transport::FaultyNetwork>,
        tweak: impl FnOnce(&mut concord_consensus::NodeConfig),
    ) -> Result<Engine, EngineError> {
        config.backend = Some(config.chosen_backend()?);
        let mut prepared = prepare(&config, node_id, voters)?;
        tweak(&mut prepared.node_config);
        let node = RaftNode::start(
            prepared.node_config.clone(),
            prepared.stores.clone(),
            prepared.factory.clone(),
            network.transport(node_id),
        )?;
        network.inner().register(node_id, node.sink());
        let inner = network.inner().clone();
        finish(
            config,
            prepared,
            Some(node),
            Network::InProcess(inner),
            false,
        )
    }

    /// The settings the engine was opened with, `backend` filled in.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The storage backend in use: the one [`EngineConfig::backend`] named, or the one the
    /// data directory was made with, or (a new directory) [`crate::BackendKind::Wal`].
    ///
    /// ```
    /// use concord_engine::{BackendKind, Engine, EngineConfig};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let engine = Engine::open(EngineConfig::new(dir.path()))?;
    /// assert_eq!(engine.backend(), BackendKind::Wal);
    /// engine.shutdown()?;
    ///
    /// // The directory keeps the backend it was made with: naming another is refused.
    /// let mut config = EngineConfig::new(dir.path());
    /// config.backend = Some(BackendKind::Redb);
    /// assert!(Engine::open(config).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn backend(&self) -> BackendKind {
        // `open` filled it in.
        self.config.backend.unwrap_or(BackendKind::Wal)
    }

    /// Every group this node runs: the main state machine's `0..groups`, then each served
    /// plugin's, in the order of [`EngineConfig::plugins`].
    pub fn group_ids(&self) -> &[GroupId] {
        &self.group_ids
    }

    fn runs_group(&self, group: GroupId) -> bool {
        self.group_ids.binary_search(&group).is_ok()
    }

    /// The main state machine's groups, `0..groups` (the sessions' with the session logic).
    pub fn main_group_ids(&self) -> &[GroupId] {
        &self.group_ids[..self.config.groups as usize]
    }

    /// The main group `key` routes to.
    pub fn group_of(&self, key: &[u8]) -> GroupId {
        group_of(key, self.config.groups)
    }

    /// The client of the plugin served as `name` ([`EngineError::UnknownPlugin`] if none is).
    pub fn plugin_client(&self, name: &str) -> Result<PluginClient<'_>, EngineError> {
        self.served
            .iter()
            .find(|served| served.name == name)
            .map(|served| PluginClient::new(self, served))
            .ok_or_else(|| EngineError::UnknownPlugin { name: name.into() })
    }

    /// The clients of every served plugin, in the order of [`EngineConfig::plugins`].
    pub fn plugin_clients(&self) -> impl Iterator<Item = PluginClient<'_>> {
        self.served
            .iter()
            .map(|served| PluginClient::new(self, served))
    }

    /// Proposes `command` to the group of `key`; resolves to the command's own result once it
    /// has applied.
    pub async fn propose(&self, key: &[u8], command: Bytes) -> Result<Bytes, EngineError> {
        self.propose_to(self.group_of(key), command).await
    }

    /// Proposes `command` to `group`.
    pub async fn propose_to(&self, group: GroupId, command: Bytes) -> Result<Bytes, EngineError> {
        Ok(self.consensus.propose(group, command).await?)
    }

    /// Proposes `commands` to `group` as one batch. They are queued together and in order,
    /// or refused together (the outer error: [`ProposeError::Overloaded`] when the group's
    /// queue has no room for all of them, [`ProposeError::NotLeader`], ...); once queued, each
    /// gets its own result, in the batch's order, as [`Engine::propose_to`] would have
    /// answered it alone (one may fail and the others apply). A batch costs one future and one
    /// wake instead of one per command: for an embedder that has many commands for one group
    /// at hand, cheaper per command than as many `propose_to` calls.
    ///
    /// The batch is queued when this is called, not when the future is first polled: batches
    /// for several groups, proposed one after the other and then awaited, proceed together.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use concord_engine::{Engine, EngineConfig, EngineError, StateMachineSource};
    ///
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let dir = tempfile::tempdir()?;
    /// let mut config = EngineConfig::new(dir.path());
    /// // A counter: each command adds its 8 bytes (an i64) to the group's total.
    /// config.state_machine = StateMachineSource::PluginBytes {
    ///     name: "counter".into(),
    ///     wasm: concord_plugins::bundled::COUNTER.to_vec(),
    /// };
    /// let engine = Engine::open(config)?;
    /// let group = engine.group_of(b"my-counter");
    /// let add = |n: i64| Bytes::from(n.to_le_bytes().to_vec());
    /// let commands = vec![add(5), Bytes::from_static(b"abc"), add(2)];
    /// let answers = engine.propose_batch_to(group, commands).await?;
    /// let total = |answer: &Result<Bytes, EngineError>| -> Option<i64> {
    ///     Some(i64::from_le_bytes(answer.as_ref().ok()?.as_ref().try_into().ok()?))
    /// };
    /// // In the batch's order, each with its own result: the malformed command fails alone.
    /// assert_eq!(total(&answers[0]), Some(5));
    /// assert!(matches!(answers[1], Err(EngineError::Command { code: 1, .. })));
    /// assert_eq!(total(&answers[2]), Some(7));
    /// engine.shutdown()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn propose_batch_to(
        &self,
        group: GroupId,
        commands: Vec<Bytes>,
    ) -> impl Future<Output = Result<Vec<Result<Bytes, EngineError>>, EngineError>> + use<> {
        let pending = self.consensus.propose_batch(group, commands);
        async move {
            let answers = pending.await?;
            Ok(answers
                .into_iter()
                .map(|answer| answer.map_err(EngineError::from))
                .collect())
        }
    }

    /// Proposes each command to its group: the commands of one group as one batch, in the
    /// order given, and the batches of all groups at once. One result per command, in the
    /// order given (a batch refused whole gives each of its commands the refusal).
    pub(crate) async fn propose_in_batches(
        &self,
        commands: Vec<(GroupId, Bytes)>,
    ) -> Vec<Result<Bytes, EngineError>> {
        // Each place holds "nothing known" until its answer replaces it: a batch has one answer
        // per command, so none is left so.
        let mut results: Vec<Result<Bytes, EngineError>> = Vec::with_capacity(commands.len());
        // Per group: the places of its commands in `results`, and the commands.
        let mut by_group: BTreeMap<GroupId, (Vec<usize>, Vec<Bytes>)> = BTreeMap::new();
        for (place, (group, command)) in commands.into_iter().enumerate() {
            results.push(Err(EngineError::Propose(ProposeError::ResultUnknown {
                group,
            })));
            let (places, batch) = by_group.entry(group).or_default();
            places.push(place);
            batch.push(command);
        }
        let batches: Vec<_> = by_group
            .into_iter()
            .map(|(group, (places, batch))| (places, self.consensus.propose_batch(group, batch)))
            .collect();
        for (places, batch) in batches {
            match batch.await {
                Ok(answers) => {
                    for (place, answer) in places.into_iter().zip(answers) {
                        results[place] = answer.map_err(EngineError::from);
                    }
                }
                Err(refused) => {
                    for place in places {
                        results[place] = Err(refused.clone().into());
                    }
                }
            }
        }
        results
    }

    /// Waits until `group`'s local state may be read with `consistency` (see [`Consistency`]).
    pub async fn ready_to_read(
        &self,
        group: GroupId,
        consistency: Consistency,
    ) -> Result<(), EngineError> {
        match consistency {
            Consistency::Linearizable => {
                self.consensus.read_barrier(group).await?;
            }
            Consistency::Lease => {
                self.consensus.lease_read_barrier(group).await?;
            }
            Consistency::Stale => {
                if !self.runs_group(group) {
                    return Err(EngineError::Propose(ProposeError::UnknownGroup { group }));
                }
            }
        }
        Ok(())
    }

    /// The state store, for reads after [`Engine::ready_to_read`].
    pub(crate) fn state_store(&self) -> &dyn StateStore {
        self.stores.state.as_ref()
    }

    /// The index of expiring sessions, when the main groups run the session logic.
    pub(crate) fn expiry_index(&self) -> Option<&ExpiryIndex> {
        self.expiry_index.as_deref()
    }

    /// The typed session API, if the groups run the session state machine.
    pub fn sessions(&self) -> Result<Sessions<'_>, EngineError> {
        if self.config.state_machine.is_session() {
            Ok(Sessions::new(self))
        } else {
            Err(EngineError::NotSessions)
        }
    }

    /// The status of `group` on this node: its leader, term, indexes.
    pub fn group_status(&self, group: GroupId) -> Result<GroupStatus, EngineError> {
        Ok(self.consensus.status(group)?)
    }

    /// The raft node, when the engine runs raft.
    pub(crate) fn raft(&self) -> Option<&Arc<RaftNode>> {
        self.raft.as_ref()
    }

    /// The peers of a cluster member, with when each was last heard from; empty otherwise.
    pub(crate) fn peers(&self) -> Vec<concord_consensus::transport::PeerInfo> {
        match &self.network {
            Network::Tcp(network) => network.peers(),
            Network::None | Network::InProcess(_) => Vec::new(),
        }
    }

    /// Snapshots this node is sending to peers now (0 outside a cluster).
    pub fn snapshots_sending(&self) -> usize {
        match &self.network {
            Network::Tcp(network) => network.snapshots_sending(),
            Network::None | Network::InProcess(_) => 0,
        }
    }

    /// The client URL of each member that told it ([`crate::ClusterConfig::client_url`]), this
    /// node's included; empty for a node alone.
    pub fn client_urls(&self) -> BTreeMap<NodeId, String> {
        match &self.network {
            Network::Tcp(network) => network.client_urls(),
            Network::None | Network::InProcess(_) => BTreeMap::new(),
        }
    }

    /// This node's id (1 when it runs alone).
    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// Asks this node, which must lead `group`, to hand the leadership to voter `to`. Returns
    /// at once; the move shows in [`Engine::group_status`] (raft-rs first sends `to` what it
    /// lacks of the log, and gives up after an election timeout if it cannot).
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// use concord_engine::{Engine, EngineConfig};
    /// let engine = Engine::open(EngineConfig::new(dir.path()))?;
    /// // Alone, this node is the only voter: it already leads.
    /// engine.transfer_leader(0, engine.node_id())?;
    /// assert!(engine.transfer_leader(0, 7).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn transfer_leader(&self, group: GroupId, to: NodeId) -> Result<(), EngineError> {
        let is_voter = match &self.raft {
            Some(raft) => raft.voters().contains(&to),
            None => to == self.node_id,
        };
        if !is_voter {
            return Err(EngineError::UnknownNode { node: to });
        }
        let status = self.consensus.status(group)?;
        if to == self.node_id && status.is_leader {
            return Ok(());
        }
        match &self.raft {
            Some(raft) => Ok(raft.transfer_leader(group, to)?),
            None => Ok(()),
        }
    }

    /// A digest of `group`'s state on this node and the applied index it reflects: two
    /// replicas at the same applied index must have the same digest. SHA-256 over every pair
    /// in key order (each key and value prefixed with its length), read from one consistent
    /// snapshot; it reads the whole group, so it is for checks, not for every request.
    pub fn state_digest(&self, group: GroupId) -> Result<StateDigest, EngineError> {
        use sha2::Digest as _;
        if !self.runs_group(group) {
            return Err(EngineError::Propose(ProposeError::UnknownGroup { group }));
        }
        let snapshot = self.stores.state.snapshot(group)?;
        let mut hasher = sha2::Sha256::new();
        let mut pairs = 0u64;
        for record in snapshot.records {
            let (key, value) = record?;
            hasher.update((key.len() as u64).to_le_bytes());
            hasher.update(&key);
            hasher.update((value.len() as u64).to_le_bytes());
            hasher.update(&value);
            pairs += 1;
        }
        let sha256: String = hasher
            .finalize()
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        Ok(StateDigest {
            applied_index: snapshot.applied_index,
            pairs,
            sha256,
        })
    }

    /// Writes a backup of this node's state to `out` (see [`crate::restore_backup`]): every
    /// group's data at the index the group has applied on this node when its turn comes, each
    /// group from one consistent view of it (not one view across groups: no write spans
    /// groups), and the group layout its keys route by. It reads the whole state and blocks
    /// the calling thread meanwhile, while the node goes on serving.
    ///
    /// A backup that must hold every write acknowledged before it began waits first for
    /// [`Engine::ready_to_read`] with [`Consistency::Linearizable`] on every group (the HTTP
    /// API's `GET /v1/backup` does); [`Consistency::Stale`] takes what this node holds, which
    /// is what a member that lost the rest of its cluster can still give.
    ///
    /// ```
    /// use concord_engine::{BackendKind, Consistency, Engine, EngineConfig, SessionFields};
    ///
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let dir = tempfile::tempdir()?;
    /// let engine = Engine::open(EngineConfig::new(dir.path().join("node")))?;
    /// engine.sessions()?.create("dev/42", SessionFields::default()).await?;
    /// for &group in engine.group_ids() {
    ///     engine.ready_to_read(group, Consistency::Linearizable).await?;
    /// }
    /// let mut backup = Vec::new();
    /// let written = engine.backup(&mut backup)?;
    /// engine.shutdown()?;
    ///
    /// let restored = dir.path().join("restored");
    /// let read = concord_engine::restore_backup(&mut &backup[..], &restored, BackendKind::Wal)?;
    /// assert_eq!(read, written);
    /// let engine = Engine::open(EngineConfig::new(&restored))?;
    /// assert!(engine.sessions()?.get("dev/42", Consistency::Linearizable).await.is_ok());
    /// engine.shutdown()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn backup(&self, out: &mut dyn std::io::Write) -> Result<BackupSummary, EngineError> {
        let layout = GroupLayout::of(&self.config);
        crate::backup::write_backup(self.stores.state.as_ref(), &layout, out)
    }

    /// The wasm plugin the main groups run, for its name, module hash and [`Plugin::stats`];
    /// `None` when they run the native session logic.
    ///
    /// ```
    /// use concord_engine::{Engine, EngineConfig};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let engine = Engine::open(EngineConfig::new(dir.path()))?;
    /// let plugin = engine.plugin().expect("the bundled session plugin");
    /// assert_eq!(plugin.name(), "session");
    /// assert_eq!(plugin.sha256().len(), 64);
    /// assert_eq!(plugin.stats().faults.total(), 0);
    /// engine.shutdown()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn plugin(&self) -> Option<Plugin> {
        self.recorded_plugin(&self.plugin, 0)
    }

    /// The module `group`'s data records for `versions` (the configured one if it cannot be
    /// read: a status must not fail for it).
    pub(crate) fn recorded_plugin(
        &self,
        versions: &PluginVersions,
        group: GroupId,
    ) -> Option<Plugin> {
        versions
            .recorded_plugin(self.stores.state.as_ref(), group)
            .unwrap_or_else(|problem| {
                tracing::warn!(group, %problem, "cannot tell which plugin the group runs");
                versions.base_plugin()
            })
    }

    /// Switches every group of the plugin served as `name` to `module` (or the main groups,
    /// when `name` is the name of the plugin file they run — not the bundled session logic,
    /// which is upgraded with the binary), through the log:
    /// the module is checked here first (a bad one is refused before anything is proposed),
    /// then an upgrade entry goes to each of the plugin's groups, and every replica of a group
    /// runs the old module for the entries before it and the new one from it on. The module's
    /// optional `concord_migrate` export runs once per group at the switch. The data records
    /// the module and keeps its bytes, so a restart — even with the old module configured —
    /// a log replay, or a snapshot on another node runs it. Upgrading to the module running is
    /// a no-op; rolling back is another upgrade. Returns the module's identity,
    /// `sha256:<hex>`. A group that did not answer (a timeout, a lost leader) may still take
    /// it: asking again is safe.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use concord_engine::{Consistency, Engine, EngineConfig, ServedPlugin, StateMachineSource};
    ///
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let dir = tempfile::tempdir()?;
    /// let mut config = EngineConfig::new(dir.path());
    /// config.plugins.push(ServedPlugin {
    ///     name: "kv".into(),
    ///     source: StateMachineSource::PluginBytes {
    ///         name: "kv".into(),
    ///         wasm: concord_plugins::bundled::KV.to_vec(),
    ///     },
    ///     groups: 2,
    /// });
    /// let engine = Engine::open(config)?;
    /// // kv's second version stores "v2:" before each value it puts.
    /// let v2 = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/plugins/kv-v2.wasm"))?;
    /// let identity = engine.upgrade_plugin("kv", &v2).await?;
    /// assert!(identity.starts_with("sha256:"));
    /// let kv = engine.plugin_client("kv")?;
    /// kv.propose(b"k", Bytes::from_static(b"\x01\x01\x00kvalue")).await?;
    /// let value = kv.read(b"k", Consistency::Linearizable).await?;
    /// assert_eq!(value.as_deref(), Some(&b"v2:value"[..]));
    /// engine.shutdown()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn upgrade_plugin(&self, name: &str, module: &[u8]) -> Result<String, EngineError> {
        if let Ok(client) = self.plugin_client(name) {
            return client.upgrade(module).await;
        }
        if self.plugin.name() != name {
            return Err(EngineError::UnknownPlugin { name: name.into() });
        }
        if self.config.state_machine.is_session() {
            return Err(EngineError::UpgradeRefused {
                reason: "the session logic Concord ships is upgraded with the binary".into(),
            });
        }
        let main_groups = 0..u64::from(self.config.groups);
        self.upgrade_groups(&self.plugin, main_groups, module).await
    }

    /// Proposes the upgrade to `module` to each of `groups` (see [`Engine::upgrade_plugin`]).
    pub(crate) async fn upgrade_groups(
        &self,
        versions: &PluginVersions,
        groups: std::ops::Range<GroupId>,
        module: &[u8],
    ) -> Result<String, EngineError> {
        let command = encode_upgrade(module);
        if command.len() > self.config.max_command_bytes {
            return Err(EngineError::UpgradeRefused {
                reason: format!(
                    "the module is {} bytes, more than a command may carry ({} bytes, \
                     max_command_bytes)",
                    module.len(),
                    self.config.max_command_bytes
                ),
            });
        }
        // Compiling a module takes a while: off the caller's runtime threads when there is one.
        let loaded = match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let (versions, module) = (versions.clone(), module.to_vec());
                runtime
                    .spawn_blocking(move || versions.load(&module))
                    .await
                    .map_err(|error| EngineError::UpgradeRefused {
                        reason: format!("checking the module failed: {error}"),
                    })?
            }
            Err(_) => versions.load(module),
        };
        let plugin = loaded.map_err(|error| EngineError::UpgradeRefused {
            reason: format!("the module does not load: {error}"),
        })?;
        let identity = wasm_identity(plugin.sha256());
        // Proposed to every group before any answer is awaited: they apply concurrently.
        let answers: Vec<_> = groups
            .map(|group| self.consensus.propose_admin(group, command.clone()))
            .collect();
        let mut first_error = None;
        for answer in answers {
            match answer.await {
                Ok(running) if running == identity.as_bytes() => {}
                Ok(running) => {
                    first_error.get_or_insert(EngineError::UpgradeRefused {
                        reason: format!(
                            "a group answered that it runs {}",
                            String::from_utf8_lossy(&running)
                        ),
                    });
                }
                Err(error) => {
                    first_error.get_or_insert(error.into());
                }
            }
        }
        match first_error {
            None => Ok(identity),
            Some(error) => Err(error),
        }
    }

    /// How long the oldest log write still in progress has been running, `None` while none
    /// is. Writes take microseconds to milliseconds; one that runs for seconds is a disk that
    /// stalled, and holds every request that needs the log (writes, and reads that wait for
    /// them) until it returns.
    pub fn log_write_in_progress_for(&self) -> Option<Duration> {
        self.consensus.log_write_in_progress_for()
    }

    /// Whether this node's log writes stall: one has been running longer than
    /// [`crate::LOG_WRITE_STALLED_AFTER`] (a second), or one that did returned less than
    /// [`crate::LOG_WRITE_STALL_HOLD`] (five seconds) ago. Such a node is not ready, so that a load
    /// balancer that follows `/readyz` sends its requests elsewhere.
    ///
    /// ```
    /// # fn main() -> Result<(), concord_engine::EngineError> {
    /// use concord_engine::{Engine, EngineConfig};
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let engine = Engine::open(EngineConfig::new(dir.path()))?;
    /// assert!(!engine.log_write_stalled());
    /// assert!(engine.log_write_in_progress_for().is_none_or(|running| running.as_secs() < 1));
    /// engine.shutdown()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn log_write_stalled(&self) -> bool {
        self.consensus.log_write_stalled()
    }

    /// The status of every group, by id.
    pub fn status(&self) -> Vec<GroupStatus> {
        // Sized up front: a node of ten thousand groups would otherwise copy the list as it
        // grows, several times per status read.
        let mut statuses = Vec::with_capacity(self.group_ids.len());
        statuses.extend(
            self.group_ids
                .iter()
                .filter_map(|&group| self.consensus.status(group).ok()),
        );
        statuses
    }

    /// Every group's health (its status without the member and progress lists) and whether
    /// the engine is ready by it, read in one pass: what a summary of thousands of groups
    /// needs. [`Engine::is_ready`] stops at the first group that does not serve.
    ///
    /// ```
    /// # fn main() -> Result<(), concord_engine::EngineError> {
    /// use concord_engine::{Engine, EngineConfig};
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let engine = Engine::open(EngineConfig::new(dir.path()))?;
    /// let health = engine.health();
    /// assert_eq!(health.groups.len(), engine.group_ids().len());
    /// assert!(health.groups.iter().all(|(_, group)| !group.stopped));
    /// engine.shutdown()?;
    /// assert!(!engine.health().ready);
    /// # Ok(())
    /// # }
    /// ```
    pub fn health(&self) -> EngineHealth {
        let mut groups = Vec::with_capacity(self.group_ids.len());
        groups.extend(self.group_ids.iter().filter_map(|&group| {
            let health = self.consensus.health(group, self.node_id).ok()?;
            Some((group, health))
        }));
        let ready = self.runs_unstalled()
            && groups.len() == self.group_ids.len()
            && groups.iter().all(|(_, health)| group_serves(health));
        EngineHealth { ready, groups }
    }

    /// Whether the engine runs and every group has a leader, runs and is caught up: its
    /// apply lag (logged but not yet applied entries) is at most [`crate::READY_APPLY_LAG_MAX`].
    /// Under steady load a few entries are always in flight, so "caught up" is a bound, not
    /// zero; a node replaying a long log after a restart is not ready until it is within it.
    /// Nor is one that fetches or installs a snapshot of a group, or that joined a cluster and
    /// awaits a group's first snapshot (the group has no configuration yet), or one started
    /// without a group's data that has not yet applied what its leader said was committed (it
    /// votes for no one until then), or one removed from a group's membership, or one whose
    /// log writes stall (see [`Engine::log_write_stalled`]).
    pub fn is_ready(&self) -> bool {
        // Each group's health, not its status: a probe of ten thousand groups copies no lists.
        self.runs_unstalled()
            && self.group_ids.iter().all(|&group| {
                self.consensus
                    .health(group, self.node_id)
                    .is_ok_and(|health| group_serves(&health))
            })
    }

    /// The engine is not shut down and its log writes do not stall.
    fn runs_unstalled(&self) -> bool {
        !self.stopped.load(Ordering::Acquire) && !self.log_write_stalled()
    }

    /// Why the engine cannot serve a group any more, if it cannot: the group stopped on a
    /// failed log write or sync, a failed state store, a failed raft worker or apply thread, or
    /// a peer message raft could not take. A stopped group stays stopped until the engine is
    /// opened again: after a failed write or sync, only recovery from the files makes them
    /// trustworthy again. `None` once the engine is shut down.
    pub fn failure(&self) -> Option<String> {
        if self.stopped.load(Ordering::Acquire) {
            return None;
        }
        self.group_ids.iter().find_map(|&group| {
            let status = self.consensus.status(group).ok()?;
            status
                .stopped
                .map(|reason| format!("group {group}: {reason}"))
        })
    }

    /// Stops accepting work, answers everything queued, flushes the stores and joins the
    /// threads. Idempotent (a later call returns `Ok`); also run on drop, which logs its error.
    ///
    /// # Errors
    ///
    /// [`EngineError::StopFlush`] when a store's last flush failed: the engine is stopped all
    /// the same. What was written without a sync since the store's previous flush may be lost;
    /// a write acknowledged under `sync` was synced before it was acknowledged.
    pub fn shutdown(&self) -> Result<(), EngineError> {
        if self.stopped.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let started = Instant::now();
        if let Some(builder) = &self.index_builder {
            builder.stop();
        }
        let index_builder_stopped = started.elapsed();
        self.consensus.shutdown();
        let consensus_stopped = started.elapsed();
        if let Network::Tcp(network) = &self.network {
            network.shutdown();
        }
        let named = |store, flushed: StorageResult<()>| {
            flushed.map_err(|source| EngineError::StopFlush { store, source })
        };
        let log_flushed = named("log", self.stores.log.flush());
        let state_flushed = named("state", self.stores.state.flush());
        let took = started.elapsed();
        if took >= SLOW_SHUTDOWN {
            // Which step held it: a stop that hangs is otherwise silent.
            tracing::warn!(
                took_ms = took.as_millis() as u64,
                index_builder_ms = index_builder_stopped.as_millis() as u64,
                consensus_ms = (consensus_stopped - index_builder_stopped).as_millis() as u64,
                "the engine was slow to stop"
            );
        }
        tracing::info!("engine stopped");
        match (log_flushed, state_flushed) {
            (Err(log), Err(state)) => {
                // One error is returned; the other would be lost unsaid.
                tracing::error!(error = %state, "both stores' last flushes failed");
                Err(log)
            }
            (flushed, Ok(())) | (Ok(()), flushed) => flushed,
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Err(error) = self.shutdown() {
            tracing::error!(%error, "dropping the engine");
        }
    }
}
