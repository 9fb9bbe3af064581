//! The `idle` benchmark: what a cluster of raft nodes costs when nothing happens.
//!
//! Starts `nodes` raft nodes in this process (function calls or loopback TCP between them),
//! every group led by node 1 (with `written_first`, each then written to once, as groups that
//! went quiet after use), lets them settle, then measures a quiet window: the process's
//! CPU, the messages the nodes send each other, resident memory. Then a trickle of single
//! writes to random groups measures how long a write to a group that sat idle takes. With a
//! disk backend, node 1 is finally reopened on its data to time a start over that many groups.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use concord_consensus::transport::{GroupMessage, SnapshotFetchError, Transport};
use concord_consensus::{
    Consensus, InProcessNetwork, KvCommand, KvStateMachine, NodeConfig, NodeId, RaftNode,
    StateMachine, StateMachineFactory,
};
use concord_storage::{
    BackendKind, DEFAULT_STATE_CACHE_BYTES, GroupId, StoreConfig, Stores, SyncMode,
};
use serde::Serialize;

use crate::consensus_bench::tcp_networks;
use crate::latency::Latencies;
use crate::process_cpu::{process_cpu_time, rss_bytes_of};
use crate::report::print_json;

/// One case to run.
#[derive(Clone, Debug)]
pub struct IdleCase {
    /// Nodes, all in this process.
    pub nodes: u64,
    /// Groups, each on every node, each led by node 1.
    pub groups: u64,
    /// Storage backend of every node.
    pub backend: BackendKind,
    /// `inproc` (function calls) or `tcp` (loopback sockets).
    pub transport: String,
    /// Raft worker threads per node.
    pub workers: usize,
    /// Seconds to wait after every group has its leader, before measuring.
    pub settle: Duration,
    /// The quiet window measured.
    pub duration: Duration,
    /// Writes of the trickle, one at a time, each to a random group.
    pub wake_writes: u64,
    /// Pause between two writes of the trickle.
    pub wake_interval: Duration,
    /// One write to every group once led, before the settle: what a group keeps after use
    /// is measured with it, not only what an unused one holds.
    pub written_first: bool,
}

/// The result of a case.
#[derive(Debug, Serialize)]
pub struct IdleResult {
    /// Always `"idle"`.
    pub case: &'static str,
    /// Backend of every node.
    pub backend: &'static str,
    /// `inproc` or `tcp`.
    pub transport: String,
    /// Nodes.
    pub nodes: u64,
    /// Groups.
    pub groups: u64,
    /// Whether every group was written to once before the settle.
    pub written_first: bool,
    /// Seconds of the quiet window.
    pub seconds: f64,
    /// The process's CPU (every node, user + system) over the quiet window, as a percentage
    /// of one core. `None` where the process's CPU time cannot be read.
    pub cpu_percent: Option<f64>,
    /// Messages sent between nodes per second in the quiet window.
    pub messages_per_sec: f64,
    /// Resident memory of the process after the quiet window.
    pub rss_bytes: Option<u64>,
    /// What starting the nodes added to resident memory, per group replica (groups × nodes).
    pub rss_bytes_per_group_replica: Option<u64>,
    /// Milliseconds to start every node over empty data directories.
    pub open_ms: u64,
    /// Milliseconds from starting the nodes until node 1 led every group.
    pub elect_ms: u64,
    /// Milliseconds to start node 1 again over its data (disk backends only).
    pub reopen_ms: Option<u64>,
    /// Writes of the trickle that succeeded.
    pub wake_writes: u64,
    /// Writes of the trickle that failed.
    pub wake_errors: u64,
    /// Median latency of the trickle's writes.
    pub wake_p50_us: u64,
    /// 99th percentile latency of the trickle's writes.
    pub wake_p99_us: u64,
}

/// Counts the messages a node sends, then hands them to the real transport.
struct CountingTransport {
    inner: Arc<dyn Transport>,
    sent: Arc<AtomicU64>,
}

impl Transport for CountingTransport {
    fn send(&self, to: NodeId, messages: Vec<GroupMessage>) {
        self.sent
            .fetch_add(messages.len() as u64, Ordering::Relaxed);
        self.inner.send(to, messages);
    }

    fn fetch_snapshot(
        &self,
        from: NodeId,
        group: GroupId,
        min_index: u64,
        out: &mut dyn std::io::Write,
    ) -> Result<(), SnapshotFetchError> {
        self.inner.fetch_snapshot(from, group, min_index, out)
    }

    fn add_peer(&self, node: NodeId, address: &str) {
        self.inner.add_peer(node, address);
    }

    fn remove_peer(&self, node: NodeId) {
        self.inner.remove_peer(node);
    }

    fn silent_for(&self, node: NodeId) -> Option<std::time::Duration> {
        self.inner.silent_for(node)
    }
}

/// A small xorshift generator: the trickle's groups need no better randomness.
struct Xorshift(u64);

impl Xorshift {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound
    }
}

fn node_config(node: u64, voters: &[u64], groups: &[GroupId], workers: usize) -> NodeConfig {
    let mut config = NodeConfig::new(node, voters.to_vec(), groups.to_vec());
    config.workers = workers;
    // Every leader stays on node 1, where the trickle writes.
    config.leader_balance_interval = None;
    config.slow_log_write = None;
    config
}

fn open_stores(
    case: &IdleCase,
    dir: &std::path::Path,
) -> Result<Stores, Box<dyn std::error::Error>> {
    Ok(Stores::open(&StoreConfig {
        backend: case.backend,
        data_dir: dir.to_path_buf(),
        log_sync: SyncMode::Sync,
        state_cache_bytes: DEFAULT_STATE_CACHE_BYTES,
    })?)
}

/// Runs `case` with scratch data under `scratch_dir`.
pub fn run_case(
    case: &IdleCase,
    scratch_dir: &std::path::Path,
) -> Result<IdleResult, Box<dyn std::error::Error>> {
    let groups: Vec<GroupId> = (0..case.groups).collect();
    let voters: Vec<u64> = (1..=case.nodes).collect();
    let factory: Arc<dyn StateMachineFactory> =
        Arc::new(|_g: GroupId| Box::new(KvStateMachine) as Box<dyn StateMachine>);
    let network = InProcessNetwork::new();
    let tcp = match case.transport.as_str() {
        "inproc" => None,
        "tcp" => Some(tcp_networks(case.nodes, false)?),
        other => return Err(format!("unknown transport {other:?}: expected inproc or tcp").into()),
    };
    let sent = Arc::new(AtomicU64::new(0));
    let pid = std::process::id();
    let rss_before = rss_bytes_of(pid);
    let mut dirs = Vec::new();
    let mut nodes: Vec<Arc<RaftNode>> = Vec::new();
    let open_started = Instant::now();
    for node in 1..=case.nodes {
        let dir = tempfile::Builder::new()
            .prefix("concord-idle-")
            .tempdir_in(scratch_dir)?;
        let stores = open_stores(case, dir.path())?;
        dirs.push(dir);
        let at = node as usize - 1;
        let inner = match &tcp {
            Some(networks) => networks[at].transport(),
            None => network.transport(node),
        };
        let transport: Arc<dyn Transport> = Arc::new(CountingTransport {
            inner,
            sent: sent.clone(),
        });
        let config = node_config(node, &voters, &groups, case.workers);
        let raft = RaftNode::start(config, stores, factory.clone(), transport)?;
        match &tcp {
            Some(networks) => networks[at].deliver_to(raft.sink()),
            None => network.register(node, raft.sink()),
        }
        nodes.push(raft);
    }
    let open_ms = open_started.elapsed().as_millis() as u64;
    let elect_started = Instant::now();
    let leader = nodes[0].clone();
    for &group in &groups {
        leader.campaign(group)?;
    }
    let deadline = Instant::now() + Duration::from_secs(60) + Duration::from_millis(case.groups);
    while !groups
        .iter()
        .all(|&g| leader.status(g).map(|s| s.is_leader).unwrap_or(false))
    {
        if Instant::now() > deadline {
            return Err("node 1 did not become leader of every group".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let elect_ms = elect_started.elapsed().as_millis() as u64;
    if case.written_first {
        let failed = write_every_group(&groups, leader.as_ref())?;
        if failed > 0 {
            return Err(format!("{failed} of the writes to every group failed").into());
        }
    }
    std::thread::sleep(case.settle);

    let sent_before = sent.load(Ordering::Relaxed);
    let cpu_before = process_cpu_time();
    let window_started = Instant::now();
    std::thread::sleep(case.duration);
    let seconds = window_started.elapsed().as_secs_f64();
    let cpu_used = cpu_before
        .zip(process_cpu_time())
        .map(|(before, after)| after.saturating_sub(before));
    let messages = sent.load(Ordering::Relaxed) - sent_before;
    let rss_bytes = rss_bytes_of(pid);
    let replicas = case.groups * case.nodes;
    let rss_bytes_per_group_replica = rss_before
        .zip(rss_bytes)
        .map(|(before, after)| after.saturating_sub(before) / replicas.max(1));

    let (mut latencies, wake_writes, wake_errors) = trickle(case, leader.as_ref())?;
    for node in &nodes {
        node.shutdown();
    }
    drop((nodes, leader));
    let reopen_ms = if case.backend.is_persistent() {
        let started = Instant::now();
        let stores = open_stores(case, dirs[0].path())?;
        let config = node_config(1, &voters, &groups, case.workers);
        let transport = InProcessNetwork::new().transport(1);
        let node = RaftNode::start(config, stores, factory.clone(), transport)?;
        let elapsed = started.elapsed().as_millis() as u64;
        node.shutdown();
        Some(elapsed)
    } else {
        None
    };
    Ok(IdleResult {
        case: "idle",
        backend: case.backend.name(),
        transport: case.transport.clone(),
        nodes: case.nodes,
        groups: case.groups,
        written_first: case.written_first,
        seconds,
        cpu_percent: cpu_used.map(|cpu| cpu.as_secs_f64() * 100.0 / seconds),
        messages_per_sec: messages as f64 / seconds,
        rss_bytes,
        rss_bytes_per_group_replica,
        open_ms,
        elect_ms,
        reopen_ms,
        wake_writes,
        wake_errors,
        wake_p50_us: latencies.quantile_us(0.50),
        wake_p99_us: latencies.quantile_us(0.99),
    })
}

/// Writes in flight at once while every group is written to.
const WRITE_FIRST_IN_FLIGHT: usize = 1024;

/// Writes one put to each of `groups` through node 1, `WRITE_FIRST_IN_FLIGHT` at a time;
/// returns how many failed.
fn write_every_group(
    groups: &[GroupId],
    leader: &RaftNode,
) -> Result<u64, Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let command = KvCommand::Put {
        key: b"written-first".to_vec(),
        value: vec![0x42; 16],
    }
    .encode();
    let mut failed = 0;
    runtime.block_on(async {
        for chunk in groups.chunks(WRITE_FIRST_IN_FLIGHT) {
            let writes: Vec<_> = (chunk.iter())
                .map(|&group| leader.propose(group, command.clone()))
                .collect();
            for write in writes {
                failed += u64::from(write.await.is_err());
            }
        }
    });
    Ok(failed)
}

/// Writes one put at a time to random groups through node 1, pausing between them; returns
/// the latencies of the successful ones, their count, and the failures.
fn trickle(
    case: &IdleCase,
    leader: &RaftNode,
) -> Result<(Latencies, u64, u64), Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    let mut random = Xorshift(seed);
    let mut latencies = Latencies::new();
    let (mut ok, mut errors) = (0, 0);
    runtime.block_on(async {
        for write in 0..case.wake_writes {
            tokio::time::sleep(case.wake_interval).await;
            let group = random.below(case.groups);
            let command = KvCommand::Put {
                key: write.to_be_bytes().to_vec(),
                value: vec![0x42; 16],
            }
            .encode();
            let started = Instant::now();
            match leader.propose(group, command).await {
                Ok(_) => {
                    latencies.record(started.elapsed());
                    ok += 1;
                }
                Err(_) => errors += 1,
            }
        }
    });
    Ok((latencies, ok, errors))
}

/// Prints the header of the readable table.
pub fn print_header() {
    println!(
        "{:<5} {:<6} {:>5} {:>7} {:>7} {:>7} {:>10} {:>9} {:>10} {:>8} {:>8} {:>9} {:>9} {:>9}",
        "store",
        "net",
        "nodes",
        "groups",
        "written",
        "cpu_%",
        "msgs/s",
        "rss_MiB",
        "B/replica",
        "open_ms",
        "elect_ms",
        "reopen_ms",
        "wake_p50",
        "wake_p99"
    );
}

/// Prints `result` as a table line and a JSON line.
pub fn print_result(result: &IdleResult) {
    let or_dash = |value: Option<u64>| value.map_or_else(|| "-".to_string(), |v| v.to_string());
    println!(
        "{:<5} {:<6} {:>5} {:>7} {:>7} {:>7} {:>10.0} {:>9} {:>10} {:>8} {:>8} {:>9} {:>9} {:>9}",
        result.backend,
        result.transport,
        result.nodes,
        result.groups,
        if result.written_first { "once" } else { "no" },
        result
            .cpu_percent
            .map_or_else(|| "-".to_string(), |p| format!("{p:.1}")),
        result.messages_per_sec,
        result.rss_bytes.map_or_else(
            || "-".to_string(),
            |b| format!("{:.0}", b as f64 / 1048576.0)
        ),
        or_dash(result.rss_bytes_per_group_replica),
        result.open_ms,
        result.elect_ms,
        or_dash(result.reopen_ms),
        result.wake_p50_us,
        result.wake_p99_us,
    );
    print_json(result);
}
