//! The `consensus` benchmark: closed-loop proposers against a raft or solo node (or a cluster of
//! in-process raft nodes), over a chosen backend.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use concord_consensus::transport::{PeerTls, TcpNetwork, TcpNetworkConfig};

use crate::grpc_network::GrpcNetwork;
use concord_consensus::{
    Consensus, InProcessNetwork, KvCommand, KvStateMachine, NodeConfig, NoopStateMachine, RaftNode,
    SoloNode, StateMachine,
};
use concord_storage::{
    BackendKind, DEFAULT_STATE_CACHE_BYTES, GroupId, StoreConfig, Stores, SyncMode,
};
use serde::Serialize;

use crate::core_round_trip::{core_round_trip_ns, core_round_trip_text};
use crate::latency::Latencies;
use crate::process_cpu::{
    ContextSwitches, by_thread_kind, by_thread_text, idle_percent, machine_cpu_ticks,
    ms_per_second, process_cpu_time, switches_per_1k_operations, switches_text,
    thread_context_switches, thread_cpu_times, thread_run_queue_waits, us_per_operation,
};
use crate::report::{human_rate, print_json};
use crate::segment_recorder::{Segment, SegmentRecorder};
use crate::workload::scatter;

pub use concord_engine::ConsensusKind;

/// One case to run.
#[derive(Clone, Debug)]
pub struct ConsensusCase {
    /// raft or solo.
    pub consensus: ConsensusKind,
    /// Storage backend of every node.
    pub backend: BackendKind,
    /// Nodes (solo: 1).
    pub nodes: u64,
    /// Groups, each led by node 1 unless `spread_leaders`.
    pub groups: u64,
    /// Concurrent closed-loop proposers.
    pub proposers: u64,
    /// Commands each proposer proposes at once: 1, one `propose` at a time; more, one
    /// `propose_batch` of that many, answered with one future.
    pub batch: usize,
    /// Value bytes of each put.
    pub payload_bytes: usize,
    /// Measured seconds (after a warm-up of a quarter of it, at least 0.5 s).
    pub duration: Duration,
    /// Raft worker threads per node.
    pub workers: usize,
    /// Threads of the proposers' runtime.
    pub client_threads: usize,
    /// Whether each log write is synced (disk backends).
    pub sync: bool,
    /// `kv` (each command is a put) or `noop` (commands are only replicated).
    pub state_machine: String,
    /// `NodeConfig::idle_spin` of every node.
    pub idle_spin: Duration,
    /// How raft nodes talk: `inproc` (function calls) or `tcp` (loopback sockets, every
    /// message encoded and decoded).
    pub transport: String,
    /// Raft with several nodes: group `g` led by node `1 + g % nodes`, and proposed to there.
    pub spread_leaders: bool,
    /// Each put writes a key never written before, scattered over the key space (as new
    /// sessions' ids are), instead of each proposer rewriting its own key.
    pub fresh_keys: bool,
}

/// The result of a case.
#[derive(Debug, Serialize)]
pub struct ConsensusResult {
    /// Always `"consensus"`.
    pub case: &'static str,
    /// raft or solo.
    pub consensus: &'static str,
    /// Backend.
    pub backend: &'static str,
    /// Nodes.
    pub nodes: u64,
    /// Groups.
    pub groups: u64,
    /// Proposers.
    pub proposers: u64,
    /// Commands per proposal (1: `propose`; more: `propose_batch`).
    pub batch: usize,
    /// Value bytes per put.
    pub payload_bytes: usize,
    /// Whether log writes were synced.
    pub sync: bool,
    /// State machine: kv or noop.
    pub state_machine: String,
    /// Idle spin of the nodes' threads, µs.
    pub idle_spin_us: u64,
    /// `inproc` or `tcp`.
    pub transport: String,
    /// Whether the groups' leaders were spread over the nodes (else all on node 1).
    pub spread_leaders: bool,
    /// Whether each put wrote a new key (else each proposer rewrote its own).
    pub fresh_keys: bool,
    /// Successful proposals in the measured window.
    pub ops: u64,
    /// Failed proposals in the measured window.
    pub errors: u64,
    /// Measured seconds.
    pub seconds: f64,
    /// Successful proposals per second.
    pub ops_per_sec: f64,
    /// Median propose→result latency.
    pub p50_us: u64,
    /// 99th percentile latency.
    pub p99_us: u64,
    /// Log syncs in the window, over all nodes.
    pub syncs: u64,
    /// Syncs per second.
    pub syncs_per_sec: f64,
    /// CPU time (user + system, every thread of the process: nodes and proposers) per
    /// successful proposal in the measured window, in µs; steadier than `ops_per_sec` on a
    /// shared machine. Idle threads' spinning counts too. `None` where unavailable.
    pub cpu_us_per_op: Option<f64>,
    /// The same split by kind of thread (a thread's name without its numbers:
    /// `concord-raft`, `concord-apply`, `tokio-rt-worker` for the proposers, ...).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub cpu_us_per_op_by_thread: BTreeMap<String, f64>,
    /// How long each kind of thread waited for a core, in ms per second of the measured
    /// window (the kernel's run-queue wait; empty where it keeps none). A thread near 1000
    /// was ready to run but had no core most of the time: its latency is the machine's CPU,
    /// not its own work.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub run_queue_wait_ms_per_sec_by_thread: BTreeMap<String, f64>,
    /// How often each kind of thread was switched out, per thousand successful proposals:
    /// `[voluntary, involuntary]` (it blocked; the kernel took its core while it could run,
    /// a yield included). Handing work from thread to thread costs a switch each way; four
    /// busy threads on two cores take turns by involuntary ones.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub context_switches_per_1k_ops_by_thread: BTreeMap<String, [f64; 2]>,
    /// The share of the machine's cores left idle in the measured window, in percent (every
    /// process counts: this one and its neighbours). Beside the threads' waits for a core, it
    /// tells a case short of cores (little idle) from one whose stages take turns (idle cores
    /// while threads wait).
    pub machine_idle_percent: Option<f64>,
    /// A cache line's round trip between two of the machine's cores, in nanoseconds, measured
    /// just before the case (`core_round_trip.rs`): on a virtual machine it moves with the
    /// host's placement of the virtual CPUs, and every hand-off between threads pays it.
    pub core_round_trip_ns: Option<f64>,
    /// The same measured just after the case: where the two differ, the placement changed
    /// during the case.
    pub core_round_trip_after_ns: Option<f64>,
    /// With `--breakdown`: each write-path segment's median and 99th percentile in the
    /// measured window.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub segments: Vec<Segment>,
}

/// A listener on a free loopback port for each of `nodes` nodes, and every node's address.
type Listeners = (
    Vec<std::net::TcpListener>,
    std::collections::BTreeMap<u64, std::net::SocketAddr>,
);

fn loopback_listeners(nodes: u64) -> std::io::Result<Listeners> {
    let listeners = (1..=nodes)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    let mut peers = std::collections::BTreeMap::new();
    for (node, listener) in (1..=nodes).zip(&listeners) {
        peers.insert(node, listener.local_addr()?);
    }
    Ok((listeners, peers))
}

/// A loopback TCP network for each of `nodes` nodes, every one knowing the others' ports;
/// with `tls`, mutual TLS under a throwaway CA.
pub(crate) fn tcp_networks(
    nodes: u64,
    tls: bool,
) -> Result<Vec<Arc<TcpNetwork>>, Box<dyn std::error::Error>> {
    let (listeners, peers) = loopback_listeners(nodes)?;
    let pki = if tls { Some(throwaway_pki()?) } else { None };
    let mut networks = Vec::new();
    for (node, listener) in (1..=nodes).zip(listeners) {
        let mut config = TcpNetworkConfig::new(1, node, peers.clone());
        if let Some((ca_key, ca)) = &pki {
            let key = rcgen::KeyPair::generate()?;
            let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])?
                .signed_by(&key, ca, ca_key)?;
            let (ca, cert, key) = (ca.pem(), cert.pem(), key.serialize_pem());
            config.tls = Some(PeerTls::from_pem(
                ca.as_bytes(),
                cert.as_bytes(),
                key.as_bytes(),
            )?);
        }
        networks.push(TcpNetwork::start(config, listener)?);
    }
    Ok(networks)
}

/// A gRPC carrier for each of `nodes` nodes (see `grpc_network.rs`).
fn grpc_networks(nodes: u64) -> Result<Vec<Arc<GrpcNetwork>>, Box<dyn std::error::Error>> {
    let (listeners, peers) = loopback_listeners(nodes)?;
    let mut networks = Vec::new();
    for (node, listener) in (1..=nodes).zip(listeners) {
        networks.push(GrpcNetwork::start(node, &peers, listener)?);
    }
    Ok(networks)
}

/// A CA made for one run.
fn throwaway_pki() -> Result<(rcgen::KeyPair, rcgen::Certificate), rcgen::Error> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = params.self_signed(&key)?;
    Ok((key, ca))
}

/// Runs `case` with scratch data under `scratch_dir`.
/// With a `recorder` (`--breakdown`), the result also carries the write path's segments.
pub fn run_case(
    case: &ConsensusCase,
    scratch_dir: &std::path::Path,
    recorder: Option<&SegmentRecorder>,
) -> Result<ConsensusResult, Box<dyn std::error::Error>> {
    if case.consensus == ConsensusKind::Solo && case.nodes != 1 {
        return Err("solo runs on exactly one node".into());
    }
    // Before the case's threads exist: measured on cores nothing else of this process uses.
    let round_trip_before_ns = core_round_trip_ns();
    let groups: Vec<GroupId> = (0..case.groups).collect();
    let voters: Vec<u64> = (1..=case.nodes).collect();
    let network = InProcessNetwork::new();
    let tcp = match case.transport.as_str() {
        "inproc" => None,
        "tcp" => Some(tcp_networks(case.nodes, false)?),
        "tls" => Some(tcp_networks(case.nodes, true)?),
        "grpc" => None,
        other => {
            return Err(
                format!("unknown transport {other:?}: expected inproc, tcp, tls or grpc").into(),
            );
        }
    };
    let grpc = match case.transport.as_str() {
        "grpc" => Some(grpc_networks(case.nodes)?),
        _ => None,
    };
    let mut dirs = Vec::new();
    let mut all_stores = Vec::new();
    let mut nodes: Vec<Arc<dyn Consensus>> = Vec::new();
    let mut raft_nodes = Vec::new();
    let factory: Arc<dyn concord_consensus::StateMachineFactory> = match case.state_machine.as_str()
    {
        "kv" => Arc::new(|_g: GroupId| Box::new(KvStateMachine) as Box<dyn StateMachine>),
        "noop" => Arc::new(|_g: GroupId| Box::new(NoopStateMachine) as Box<dyn StateMachine>),
        other => {
            return Err(format!("unknown state machine {other:?}: expected kv or noop").into());
        }
    };
    for node in 1..=case.nodes {
        let dir = tempfile::Builder::new()
            .prefix("concord-bench-")
            .tempdir_in(scratch_dir)?;
        let stores = Stores::open(&StoreConfig {
            backend: case.backend,
            data_dir: dir.path().to_path_buf(),
            log_sync: if case.sync {
                SyncMode::Sync
            } else {
                SyncMode::NoSync
            },
            state_cache_bytes: DEFAULT_STATE_CACHE_BYTES,
        })?;
        dirs.push(dir);
        all_stores.push(stores.clone());
        let mut config = NodeConfig::new(node, voters.clone(), groups.clone());
        config.workers = case.workers;
        config.proposal_timeout = Duration::from_secs(30);
        config.idle_spin = case.idle_spin;
        // The benchmark places the leaders itself and proposes where they are.
        config.leader_balance_interval = None;
        config.slow_log_write = None;
        match case.consensus {
            ConsensusKind::Solo => nodes.push(SoloNode::start(config, stores, factory.clone())?),
            ConsensusKind::Raft => {
                let at = node as usize - 1;
                let transport = match (&tcp, &grpc) {
                    (Some(networks), _) => networks[at].transport(),
                    (_, Some(networks)) => networks[at].transport(),
                    (None, None) => network.transport(node),
                };
                let raft = RaftNode::start(config, stores, factory.clone(), transport)?;
                match (&tcp, &grpc) {
                    (Some(networks), _) => networks[at].deliver_to(raft.sink()),
                    (_, Some(networks)) => networks[at].deliver_to(raft.sink()),
                    (None, None) => network.register(node, raft.sink()),
                }
                raft_nodes.push(raft.clone());
                nodes.push(raft);
            }
        }
    }
    // Node 1 leads every group, or each group its own node.
    let spread = case.spread_leaders && raft_nodes.len() > 1;
    let leader_of = |group: GroupId| {
        if spread {
            (group % raft_nodes.len() as u64) as usize
        } else {
            0
        }
    };
    if !raft_nodes.is_empty() {
        for &group in &groups {
            raft_nodes[leader_of(group)].campaign(group)?;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while !groups.iter().all(|&g| {
        nodes[leader_of(g)]
            .status(g)
            .map(|s| s.is_leader)
            .unwrap_or(false)
    }) {
        if Instant::now() > deadline {
            return Err("the groups did not elect the leaders the benchmark placed".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(case.client_threads)
        .enable_all()
        .build()?;
    let warm_up = (case.duration / 4).max(Duration::from_millis(500));
    let syncs = |stores: &[Stores]| stores.iter().map(|s| s.log.sync_count()).sum::<u64>();
    let outcome = runtime.block_on(async {
        let stop = Arc::new(AtomicBool::new(false));
        let measure_from = Instant::now() + warm_up;
        let measure_until = measure_from + case.duration;
        let mut tasks = Vec::new();
        for proposer in 0..case.proposers {
            let group = proposer % case.groups;
            let leader = nodes[leader_of(group)].clone();
            let stop = stop.clone();
            let commands = if case.fresh_keys {
                Commands::Fresh {
                    proposer,
                    next: 0,
                    payload_bytes: case.payload_bytes,
                }
            } else {
                Commands::Same(
                    KvCommand::Put {
                        key: proposer.to_be_bytes().to_vec(),
                        value: vec![0x42; case.payload_bytes],
                    }
                    .encode(),
                )
            };
            tasks.push(tokio::spawn(propose_loop(
                leader,
                group,
                commands,
                case.batch,
                stop,
                measure_from,
                measure_until,
            )));
        }
        tokio::time::sleep_until((measure_from).into()).await;
        let syncs_before = syncs(&all_stores);
        let cpu_before = process_cpu_time();
        let threads_before = thread_cpu_times();
        let waits_before = thread_run_queue_waits();
        let switches_before = thread_context_switches();
        let machine_before = machine_cpu_ticks();
        if let Some(recorder) = recorder {
            recorder.take_segments(); // The warm-up's.
        }
        tokio::time::sleep_until(measure_until.into()).await;
        let syncs_after = syncs(&all_stores);
        let cpu_used = cpu_before
            .zip(process_cpu_time())
            .map(|(before, after)| after.saturating_sub(before));
        let cpu_by_thread = by_thread_kind(&threads_before, &thread_cpu_times());
        let waits_by_thread = by_thread_kind(&waits_before, &thread_run_queue_waits());
        let switches_by_thread = by_thread_kind(&switches_before, &thread_context_switches());
        let machine_idle = machine_before
            .zip(machine_cpu_ticks())
            .and_then(|(before, after)| idle_percent(before, after));
        let segments = recorder
            .map(SegmentRecorder::take_segments)
            .unwrap_or_default();
        stop.store(true, Ordering::Release);
        let mut latencies = Latencies::new();
        let (mut ops, mut errors) = (0u64, 0u64);
        for task in tasks {
            let (samples, task_errors) = task.await.expect("proposer task");
            ops += samples.len() as u64;
            errors += task_errors;
            for us in samples {
                latencies.record(Duration::from_micros(u64::from(us)));
            }
        }
        Measured {
            ops,
            errors,
            latencies,
            syncs: syncs_after - syncs_before,
            cpu_used,
            cpu_by_thread,
            waits_by_thread,
            switches_by_thread,
            machine_idle,
            segments,
        }
    });
    let Measured {
        ops,
        errors,
        mut latencies,
        syncs,
        cpu_used,
        cpu_by_thread,
        waits_by_thread,
        switches_by_thread,
        machine_idle,
        segments,
    } = outcome;
    for node in &nodes {
        node.shutdown();
    }
    drop(runtime);
    let round_trip_after_ns = core_round_trip_ns();
    let seconds = case.duration.as_secs_f64();
    Ok(ConsensusResult {
        case: "consensus",
        consensus: case.consensus.name(),
        backend: case.backend.name(),
        nodes: case.nodes,
        groups: case.groups,
        proposers: case.proposers,
        batch: case.batch,
        payload_bytes: case.payload_bytes,
        sync: case.sync && case.backend.is_persistent(),
        state_machine: case.state_machine.clone(),
        idle_spin_us: case.idle_spin.as_micros() as u64,
        transport: case.transport.clone(),
        spread_leaders: spread,
        fresh_keys: case.fresh_keys,
        ops,
        errors,
        seconds,
        ops_per_sec: ops as f64 / seconds,
        p50_us: latencies.quantile_us(0.50),
        p99_us: latencies.quantile_us(0.99),
        syncs,
        syncs_per_sec: syncs as f64 / seconds,
        cpu_us_per_op: cpu_used
            .filter(|_| ops > 0)
            .map(|cpu| cpu.as_secs_f64() * 1e6 / ops as f64),
        cpu_us_per_op_by_thread: us_per_operation(cpu_by_thread, ops),
        run_queue_wait_ms_per_sec_by_thread: ms_per_second(waits_by_thread, seconds),
        context_switches_per_1k_ops_by_thread: switches_per_1k_operations(switches_by_thread, ops),
        machine_idle_percent: machine_idle,
        core_round_trip_ns: round_trip_before_ns,
        core_round_trip_after_ns: round_trip_after_ns,
        segments,
    })
}

/// What the measured window of a case saw.
struct Measured {
    ops: u64,
    errors: u64,
    latencies: Latencies,
    syncs: u64,
    cpu_used: Option<Duration>,
    cpu_by_thread: BTreeMap<String, Duration>,
    waits_by_thread: BTreeMap<String, Duration>,
    switches_by_thread: BTreeMap<String, ContextSwitches>,
    machine_idle: Option<f64>,
    segments: Vec<Segment>,
}

/// The commands one proposer sends.
enum Commands {
    /// The same put every time.
    Same(Bytes),
    /// A put of a new key every time: the proposer's id and a counter, mixed so that the keys
    /// of all proposers scatter over the key space.
    Fresh {
        proposer: u64,
        next: u64,
        payload_bytes: usize,
    },
}

impl Commands {
    fn next(&mut self) -> Bytes {
        match self {
            Commands::Same(command) => command.clone(),
            Commands::Fresh {
                proposer,
                next,
                payload_bytes,
            } => {
                let key = scatter(*proposer << 40 | *next);
                *next += 1;
                KvCommand::Put {
                    key: key.to_be_bytes().to_vec(),
                    value: vec![0x42; *payload_bytes],
                }
                .encode()
            }
        }
    }
}

/// One closed-loop proposer: propose (`batch` commands at once), await, repeat. Returns the
/// latencies (µs) of the commands that succeeded inside the measured window (each command of
/// a batch counts once, with the batch's latency), and the number that failed in it.
async fn propose_loop(
    node: Arc<dyn Consensus>,
    group: GroupId,
    mut commands: Commands,
    batch: usize,
    stop: Arc<AtomicBool>,
    measure_from: Instant,
    measure_until: Instant,
) -> (Vec<u32>, u64) {
    let mut samples = Vec::new();
    let mut errors = 0u64;
    // Closed loop: an operation starts when the previous one finished, so one clock read per
    // operation measures it.
    let mut started = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let (succeeded, failed) = if batch == 1 {
            match node.propose(group, commands.next()).await {
                Ok(_) => (1, 0),
                Err(_) => (0, 1),
            }
        } else {
            let proposed = (0..batch).map(|_| commands.next()).collect();
            match node.propose_batch(group, proposed).await {
                Ok(answers) => {
                    let succeeded = answers.iter().filter(|answer| answer.is_ok()).count();
                    (succeeded, answers.len() - succeeded)
                }
                Err(_) => (0, batch),
            }
        };
        let finished = Instant::now();
        if finished >= measure_from && finished <= measure_until {
            let latency_us = finished
                .duration_since(started)
                .as_micros()
                .min(u32::MAX as u128) as u32;
            samples.extend(std::iter::repeat_n(latency_us, succeeded));
            errors += failed as u64;
        }
        if failed > 0 {
            // Back off on refusals (Overloaded) instead of spinning.
            tokio::time::sleep(Duration::from_millis(1)).await;
            started = Instant::now();
        } else {
            started = finished;
        }
    }
    (samples, errors)
}

/// Prints the header of the readable table.
pub fn print_header() {
    println!(
        "{:<5} {:<5} {:<4} {:>5} {:<6} {:>6} {:>9} {:>5} {:>7} {:>5} {:>5} {:>10} {:>9} {:>9} {:>9} {:>7} {:>9}",
        "cons",
        "store",
        "sm",
        "nodes",
        "net",
        "groups",
        "proposers",
        "batch",
        "payload",
        "sync",
        "spin",
        "ops/s",
        "p50_us",
        "p99_us",
        "syncs/s",
        "errors",
        "cpu_us/op"
    );
}

/// Prints `result` as a table line and a JSON line.
pub fn print_result(result: &ConsensusResult) {
    println!(
        "{:<5} {:<5} {:<4} {:>5} {:<6} {:>6} {:>9} {:>5} {:>7} {:>5} {:>5} {:>10} {:>9} {:>9} {:>9} {:>7} {:>9}",
        result.consensus,
        result.backend,
        result.state_machine,
        result.nodes,
        result.transport,
        result.groups,
        result.proposers,
        result.batch,
        result.payload_bytes,
        if result.sync { "on" } else { "off" },
        result.idle_spin_us,
        human_rate(result.ops_per_sec),
        result.p50_us,
        result.p99_us,
        human_rate(result.syncs_per_sec),
        result.errors,
        result
            .cpu_us_per_op
            .map_or_else(|| "-".to_string(), |us| format!("{us:.2}"))
    );
    if !result.cpu_us_per_op_by_thread.is_empty() {
        let by_thread = by_thread_text(&result.cpu_us_per_op_by_thread, 2);
        println!("    cpu_us/op by thread: {by_thread}");
    }
    if !result.run_queue_wait_ms_per_sec_by_thread.is_empty() {
        let by_thread = by_thread_text(&result.run_queue_wait_ms_per_sec_by_thread, 0);
        println!("    waited for a core, ms/s by thread: {by_thread}");
    }
    if !result.context_switches_per_1k_ops_by_thread.is_empty() {
        let by_thread = switches_text(&result.context_switches_per_1k_ops_by_thread);
        println!("    switched out per 1k ops by thread, voluntary + involuntary: {by_thread}");
    }
    if let Some(idle) = result.machine_idle_percent {
        println!("    the machine's cores idle: {idle:.0}%");
    }
    if let Some(line) =
        core_round_trip_text(result.core_round_trip_ns, result.core_round_trip_after_ns)
    {
        println!("    {line}");
    }
    if !result.segments.is_empty() {
        println!(
            "    {:<46} {:>10} {:>11} {:>11}",
            "segment (labels merged)", "count", "p50", "p99"
        );
    }
    for segment in &result.segments {
        println!(
            "    {:<46} {:>10} {:>11.1} {:>11.1} {}",
            segment.name,
            segment.count,
            segment.p50,
            segment.p99,
            segment.unit()
        );
    }
    print_json(result);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_keys_never_repeat_and_scatter() {
        let mut seen = std::collections::HashSet::new();
        for proposer in 0..64u64 {
            for next in 0..2000u64 {
                assert!(
                    seen.insert(scatter(proposer << 40 | next)),
                    "{proposer} {next}"
                );
            }
        }
        // Consecutive keys of one proposer land far apart: their top bytes differ.
        let tops: std::collections::HashSet<u64> = (0..256).map(|n| scatter(n) >> 56).collect();
        assert!(tops.len() > 128, "{}", tops.len());
    }

    #[test]
    fn fresh_commands_are_puts_of_new_keys() {
        let mut commands = Commands::Fresh {
            proposer: 3,
            next: 0,
            payload_bytes: 10,
        };
        let (first, second) = (commands.next(), commands.next());
        assert_ne!(first, second);
        let mut same = Commands::Same(first.clone());
        assert_eq!(same.next(), first);
        assert_eq!(same.next(), first);
    }
}
