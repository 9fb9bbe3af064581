//! A cluster of raft nodes in one process, for tests: fast clocks, a network that can lose,
//! delay and partition messages, and nodes that stop and restart on their stores.

#![allow(dead_code)] // Each test file uses a different part.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use concord_consensus::transport::{FaultConfig, FaultyNetwork};
use concord_consensus::{
    Consensus, CounterStateMachine, NodeConfig, NodeId, ProposeError, RaftNode, StateMachine,
};
use concord_storage::{BackendKind, GroupId, StoreConfig, Stores};
use tempfile::TempDir;

/// Test clocks: 10 ms ticks, elections after 10–20 ticks.
pub fn fast_config(node: NodeId, voters: Vec<NodeId>, groups: Vec<GroupId>) -> NodeConfig {
    let mut config = NodeConfig::new(node, voters, groups);
    config.tick_interval = Duration::from_millis(10);
    config.election_ticks = 10;
    config.heartbeat_ticks = 2;
    config.proposal_timeout = Duration::from_secs(5);
    config.state_flush_interval = Duration::from_millis(50);
    // Tests write tens of entries: a short tail makes every test run log compaction too.
    config.log_keep_entries = 4;
    // A loaded test machine's sync must not move leaders the tests placed.
    config.slow_log_write = None;
    config
}

/// The first index still in `group`'s log on `stores`.
pub fn first_log_index(stores: &Stores, group: GroupId) -> u64 {
    stores.log.group_state(group).unwrap().first_index()
}

/// Waits until `group`'s log on `stores` was compacted past index 1.
pub async fn wait_compacted(stores: &Stores, group: GroupId) -> u64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let first = first_log_index(stores, group);
        if first > 1 {
            return first;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "group {group}'s log was never compacted"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The seed of a faulty network: `CONCORD_NETWORK_SEED` if set (to replay a failing run),
/// `default` otherwise; printed either way.
pub fn network_seed(default: u64) -> u64 {
    let seed = std::env::var("CONCORD_NETWORK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    eprintln!("CONCORD_NETWORK_SEED={seed}");
    seed
}

pub fn counter_factory() -> Arc<dyn concord_consensus::StateMachineFactory> {
    Arc::new(|_group: GroupId| Box::new(CounterStateMachine) as Box<dyn StateMachine>)
}

pub fn decode_counter(bytes: &Bytes) -> i64 {
    i64::from_le_bytes(bytes.as_ref().try_into().unwrap())
}

/// The node of `nodes` that leads `group`, waiting up to 10 s for an election.
pub async fn leader_among(nodes: &BTreeMap<NodeId, Arc<RaftNode>>, group: GroupId) -> NodeId {
    let deadline = Instant::now() + Duration::from_secs(10);
    let leader = leader_before(nodes, group, deadline).await;
    leader.unwrap_or_else(|| panic!("no leader for group {group}"))
}

/// The node of `nodes` that leads `group`, looked for every 5 ms until `deadline`.
pub async fn leader_before(
    nodes: &BTreeMap<NodeId, Arc<RaftNode>>,
    group: GroupId,
    deadline: Instant,
) -> Option<NodeId> {
    loop {
        for (&id, node) in nodes {
            let status = node.status(group).unwrap();
            // A leader just removed from the group refuses requests until it steps down.
            let member = status.members.is_empty() || status.members.stays(id);
            if status.is_leader && member {
                return Some(id);
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub struct Cluster {
    pub network: Arc<FaultyNetwork>,
    pub backend: BackendKind,
    pub voters: Vec<NodeId>,
    pub groups: Vec<GroupId>,
    pub dirs: BTreeMap<NodeId, TempDir>,
    /// Memory stores survive a node restart here (a disk backend reopens its directory).
    pub memory_stores: BTreeMap<NodeId, Stores>,
    pub nodes: BTreeMap<NodeId, Arc<RaftNode>>,
    /// The stores of each running node, for reading replicas' state.
    pub stores: BTreeMap<NodeId, Stores>,
    /// Applied to each node's config before it starts.
    pub tweak: fn(&mut NodeConfig),
}

impl Cluster {
    pub fn start(
        nodes: u64,
        groups: Vec<GroupId>,
        backend: BackendKind,
        faults: FaultConfig,
    ) -> Cluster {
        Cluster::start_tweaked(nodes, groups, backend, faults, |_| {})
    }

    /// [`Cluster::start`] with `tweak` applied to every node's config.
    pub fn start_tweaked(
        nodes: u64,
        groups: Vec<GroupId>,
        backend: BackendKind,
        faults: FaultConfig,
        tweak: fn(&mut NodeConfig),
    ) -> Cluster {
        Cluster::start_on(nodes, groups, backend, faults, tweak, BTreeMap::new())
    }

    /// A reliable cluster on memory stores, `given` ones for some nodes (a hooked log, say).
    pub fn reliable_on_stores(
        nodes: u64,
        groups: Vec<GroupId>,
        tweak: fn(&mut NodeConfig),
        given: BTreeMap<NodeId, Stores>,
    ) -> Cluster {
        let faults = FaultConfig {
            seed: 1,
            drop_probability: 0.0,
            max_delay: Duration::ZERO,
        };
        Cluster::start_on(nodes, groups, BackendKind::Memory, faults, tweak, given)
    }

    fn start_on(
        nodes: u64,
        groups: Vec<GroupId>,
        backend: BackendKind,
        faults: FaultConfig,
        tweak: fn(&mut NodeConfig),
        memory_stores: BTreeMap<NodeId, Stores>,
    ) -> Cluster {
        let voters: Vec<NodeId> = (1..=nodes).collect();
        let mut cluster = Cluster {
            network: FaultyNetwork::new(faults),
            backend,
            voters: voters.clone(),
            groups,
            dirs: BTreeMap::new(),
            memory_stores,
            nodes: BTreeMap::new(),
            stores: BTreeMap::new(),
            tweak,
        };
        for node in voters {
            cluster.dirs.insert(node, tempfile::tempdir().unwrap());
            cluster.start_node(node);
        }
        cluster
    }

    pub fn reliable(nodes: u64, groups: Vec<GroupId>, backend: BackendKind) -> Cluster {
        Cluster::reliable_tweaked(nodes, groups, backend, |_| {})
    }

    /// [`Cluster::reliable`] with `tweak` applied to every node's config.
    pub fn reliable_tweaked(
        nodes: u64,
        groups: Vec<GroupId>,
        backend: BackendKind,
        tweak: fn(&mut NodeConfig),
    ) -> Cluster {
        let faults = FaultConfig {
            seed: 1,
            drop_probability: 0.0,
            max_delay: Duration::ZERO,
        };
        Cluster::start_tweaked(nodes, groups, backend, faults, tweak)
    }

    fn stores(&mut self, node: NodeId) -> Stores {
        if self.backend == BackendKind::Memory {
            let config = StoreConfig::new(BackendKind::Memory, "unused");
            return self
                .memory_stores
                .entry(node)
                .or_insert_with(|| Stores::open(&config).unwrap())
                .clone();
        }
        Stores::open(&StoreConfig::new(self.backend, self.dirs[&node].path())).unwrap()
    }

    pub fn start_node(&mut self, node: NodeId) {
        let stores = self.stores(node);
        self.stores.insert(node, stores.clone());
        let mut config = fast_config(node, self.voters.clone(), self.groups.clone());
        // A directory of the node's own, as a server's: it keeps the marks of snapshot
        // installs across a restart.
        config.snapshot_dir = Some(self.dirs[&node].path().join("snapshots"));
        (self.tweak)(&mut config);
        let transport = self.network.transport(node);
        let raft = RaftNode::start(config, stores, counter_factory(), transport).unwrap();
        self.network.inner().register(node, raft.sink());
        self.nodes.insert(node, raft);
    }

    /// Stops `node` as a crash would look to its peers; its stores keep what was written.
    pub fn stop_node(&mut self, node: NodeId) {
        self.network.inner().unregister(node);
        if let Some(raft) = self.nodes.remove(&node) {
            raft.shutdown();
        }
        self.stores.remove(&node);
    }

    pub fn node(&self, node: NodeId) -> &Arc<RaftNode> {
        &self.nodes[&node]
    }

    /// The node that leads `group`, waiting up to 10 s for an election.
    pub async fn leader(&self, group: GroupId) -> NodeId {
        leader_among(&self.nodes, group).await
    }

    /// Proposes on the current leader, retrying refusals caused by leadership changes.
    pub async fn propose(&self, group: GroupId, command: Bytes) -> Bytes {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let leader = self.leader(group).await;
            match self.node(leader).propose(group, command.clone()).await {
                Ok(result) => return result,
                // Refusals that guarantee the command did not apply: safe to retry.
                Err(ProposeError::NotLeader { .. } | ProposeError::Dropped { .. }) => {}
                Err(error) => panic!("proposal failed: {error}"),
            }
            assert!(Instant::now() < deadline, "the proposal never succeeded");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until every running node applied at least `index` in `group`.
    pub async fn wait_applied(&self, group: GroupId, index: u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let lagging: Vec<(NodeId, u64)> = self
                .nodes
                .iter()
                .map(|(&id, node)| (id, node.status(group).unwrap().applied_index))
                .filter(|&(_, applied)| applied < index)
                .collect();
            if lagging.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "nodes never applied {index}: {lagging:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until every running node applied what `group`'s leader has applied.
    pub async fn wait_caught_up_with_leader(&self, group: GroupId) {
        let leader = self.leader(group).await;
        let applied = self.node(leader).status(group).unwrap().applied_index;
        self.wait_applied(group, applied).await;
    }

    /// Stops every node gracefully, one after another, as a rolling stop would: each hands its
    /// leaderships to the nodes still running before `stop_node` takes it off the network
    /// (cut off first, a leader could not hand over and would wait out an election timeout;
    /// shutting down twice is harmless).
    pub fn shutdown(&mut self) {
        let nodes: Vec<NodeId> = self.nodes.keys().copied().collect();
        for node in nodes {
            self.nodes[&node].shutdown();
            self.stop_node(node);
        }
        self.network.stop();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The counter value of `group` in `node`'s state store (0 if never written).
pub fn counter_on(cluster: &Cluster, node: NodeId, group: GroupId) -> i64 {
    match cluster.stores[&node].state.get(group, b"counter").unwrap() {
        Some(bytes) => i64::from_le_bytes(bytes.as_slice().try_into().unwrap()),
        None => 0,
    }
}

/// How a [`HookedLog`] writes: given the batch and the memory store beneath, it writes (or
/// fails, stalls, watches) as the test needs.
pub type WriteHook = Box<
    dyn Fn(
            concord_storage::LogBatch,
            &concord_storage::MemLogStore,
        ) -> concord_storage::StorageResult<()>
        + Send
        + Sync,
>;

/// A log store in memory whose writes go through a test's hook: a failing disk, a slow one,
/// one that reports what it wrote. It counts the entry reads it answers, and fails them all
/// with an I/O error while `entry_reads_fail` is set.
pub struct HookedLog {
    pub inner: concord_storage::MemLogStore,
    pub write: WriteHook,
    pub entry_reads: Arc<std::sync::atomic::AtomicU64>,
    pub entry_reads_fail: Arc<std::sync::atomic::AtomicBool>,
}

impl HookedLog {
    pub fn new(write: WriteHook) -> HookedLog {
        HookedLog {
            inner: concord_storage::MemLogStore::new(),
            write,
            entry_reads: Arc::default(),
            entry_reads_fail: Arc::default(),
        }
    }
}

impl concord_storage::LogStore for HookedLog {
    fn write_from(
        &self,
        batch: &mut concord_storage::LogBatch,
    ) -> concord_storage::StorageResult<()> {
        (self.write)(std::mem::take(batch), &self.inner)
    }
    fn entries(
        &self,
        group: GroupId,
        low: u64,
        high: u64,
        max_bytes: Option<u64>,
    ) -> concord_storage::StorageResult<Vec<concord_storage::raft::prelude::Entry>> {
        self.entry_reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if self
            .entry_reads_fail
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return Err(concord_storage::StorageError::Io {
                path: "failing-disk".into(),
                source: std::io::Error::other("injected read failure"),
            });
        }
        self.inner.entries(group, low, high, max_bytes)
    }
    fn term(&self, group: GroupId, index: u64) -> concord_storage::StorageResult<u64> {
        self.inner.term(group, index)
    }
    fn group_state(
        &self,
        group: GroupId,
    ) -> concord_storage::StorageResult<concord_storage::GroupLogState> {
        self.inner.group_state(group)
    }
    fn groups(&self) -> concord_storage::StorageResult<Vec<GroupId>> {
        self.inner.groups()
    }
    fn flush(&self) -> concord_storage::StorageResult<()> {
        self.inner.flush()
    }
    fn sync_mode(&self) -> concord_storage::SyncMode {
        concord_storage::SyncMode::Sync
    }
    fn sync_count(&self) -> u64 {
        0
    }
}
