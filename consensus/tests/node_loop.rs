//! The node loop's promises, for raft and solo alike: every caller gets an answer within the
//! proposal timeout even when apply never finishes; a leader replicates while it persists;
//! waiting reads and queued bytes are bounded.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{HookedLog, counter_factory, fast_config, leader_before};
use concord_consensus::{
    ApplyError, CommandResult, Consensus, InProcessNetwork, NodeConfig, ProposeError, RaftNode,
    SoloNode, StateMachine, StateMachineFactory,
};
use concord_storage::{
    GroupId, LogBatch, LogOp, LogStore, MemLogStore, MemStateStore, StateTransaction, Stores,
};

fn memory_stores() -> Stores {
    Stores {
        log: Arc::new(MemLogStore::new()),
        state: Arc::new(MemStateStore::new()),
    }
}

fn start(
    raft: bool,
    config: NodeConfig,
    stores: Stores,
    factory: Arc<dyn StateMachineFactory>,
) -> Arc<dyn Consensus> {
    if raft {
        let network = InProcessNetwork::new();
        let node = RaftNode::start(config, stores, factory, network.transport(1)).unwrap();
        network.register(1, node.sink());
        node
    } else {
        SoloNode::start(config, stores, factory).unwrap()
    }
}

async fn wait_leader(node: &dyn Consensus, group: GroupId) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !node.status(group).unwrap().is_leader {
        assert!(Instant::now() < deadline, "no leader for group {group}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A gate the test opens; a state machine that waits at it before every apply.
#[derive(Clone, Default)]
struct Gate(Arc<AtomicBool>);

struct GatedMachine(Gate);

/// A factory of machines that wait at `gate`.
fn gated_factory(gate: &Gate) -> Arc<dyn StateMachineFactory> {
    let gate = gate.clone();
    Arc::new(move |_group: GroupId| Box::new(GatedMachine(gate.clone())) as Box<dyn StateMachine>)
}

impl StateMachine for GatedMachine {
    fn apply(
        &mut self,
        _txn: &mut StateTransaction<'_>,
        commands: &[Bytes],
    ) -> Result<Vec<CommandResult>, ApplyError> {
        while !(self.0).0.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(commands.iter().map(|_| Ok(Bytes::new())).collect())
    }
}

/// An apply that never finishes (until the test lets it) must not leave callers waiting: the
/// command being applied, the commands queued behind it and a read all answer `Timeout`
/// within the proposal timeout, on raft and on solo. With a tiny apply queue, the worker is
/// held by backpressure as well, and still answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_are_answered_within_the_timeout_when_apply_never_finishes() {
    for raft in [false, true] {
        let gate = Gate::default();
        let mut config = fast_config(1, vec![1], vec![0]);
        config.proposal_timeout = Duration::from_millis(300);
        config.apply_queue_capacity = 1;
        let node = start(raft, config, memory_stores(), gated_factory(&gate));
        wait_leader(node.as_ref(), 0).await;
        // A single voter's leader appends an empty entry first; it waits at the gate too.
        let started = Instant::now();
        let mut pending = Vec::new();
        for _ in 0..20 {
            pending.push(node.propose(0, Bytes::from_static(b"x")));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let read = node.read_barrier(0);
        for answer in pending {
            match answer.await {
                Err(ProposeError::Timeout { group: 0, .. }) => {}
                other => panic!("raft={raft}: expected a timeout, got {other:?}"),
            }
        }
        match read.await {
            Err(ProposeError::Timeout { group: 0, .. }) => {}
            other => panic!("raft={raft}: expected the read to time out, got {other:?}"),
        }
        // Every answer came within the timeout (plus scan interval and scheduling slack).
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "raft={raft}: answers took {:?}",
            started.elapsed()
        );
        gate.0.store(true, Ordering::Release);
        // Once apply moves again, the node serves as before.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match node.propose(0, Bytes::from_static(b"y")).await {
                Ok(_) => break,
                Err(ProposeError::Timeout { .. } | ProposeError::Overloaded { .. }) => {}
                Err(other) => panic!("raft={raft}: {other}"),
            }
            assert!(Instant::now() < deadline, "raft={raft}: never recovered");
        }
        node.shutdown();
    }
}

/// A state machine that takes `apply_ms` for every batch.
struct SlowMachine {
    apply_ms: u64,
}

impl StateMachine for SlowMachine {
    fn apply(
        &mut self,
        _txn: &mut StateTransaction<'_>,
        commands: &[Bytes],
    ) -> Result<Vec<CommandResult>, ApplyError> {
        std::thread::sleep(Duration::from_millis(self.apply_ms));
        Ok(commands.iter().map(|_| Ok(Bytes::new())).collect())
    }
}

/// When the apply queue is full the worker holds entries back, and commands that join
/// non-empty proposal queues do not wake it: the apply thread must, as soon as it makes room.
/// Were it left to the next tick or timeout scan (tens of milliseconds), these closed-loop
/// proposers behind a slow apply would each wait that long again and again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_apply_queue_wakes_the_worker_when_it_drains() {
    const PROPOSERS: usize = 64;
    const PROPOSALS_EACH: usize = 10;
    const APPLY_MS: u64 = 1;
    for raft in [false, true] {
        let mut config = fast_config(1, vec![1], vec![0]);
        // Nothing but the apply thread (or a new command into an empty queue) should wake the
        // worker in time: ticks are rare here.
        config.tick_interval = Duration::from_secs(1);
        config.apply_queue_capacity = 1;
        // Small entries keep commands queued behind every entry, as many clients do.
        config.max_commands_per_entry = 4;
        let factory: Arc<dyn StateMachineFactory> = Arc::new(|_group: GroupId| {
            Box::new(SlowMachine { apply_ms: APPLY_MS }) as Box<dyn StateMachine>
        });
        let node = start(raft, config, memory_stores(), factory);
        wait_leader(node.as_ref(), 0).await;
        let started = Instant::now();
        let proposers: Vec<_> = (0..PROPOSERS)
            .map(|_| {
                let node = node.clone();
                tokio::spawn(async move {
                    for _ in 0..PROPOSALS_EACH {
                        node.propose(0, Bytes::from_static(b"x")).await.unwrap();
                    }
                })
            })
            .collect();
        for proposer in proposers {
            proposer.await.unwrap();
        }
        // 160 entries of 4 commands, each batch APPLY_MS: a few hundred milliseconds. A stall
        // until the timeout scan costs ~25 ms, and would come every few batches.
        let took = started.elapsed();
        assert!(took < Duration::from_secs(2), "raft={raft}: {took:?}");
        node.shutdown();
    }
}

/// The highest index of group 0 a batch appends.
fn last_entry_of_group_0(batch: &LogBatch) -> Option<u64> {
    batch
        .ops()
        .iter()
        .filter_map(|(group, op)| match op {
            LogOp::Append(entries) if *group == 0 => entries.last().map(|e| e.index),
            _ => None,
        })
        .max()
}

/// A leader's log: while `enabled`, each write waits (up to 2 s) until a follower has written
/// the batch's last entry of group 0, and counts in `peers_had_it` whether one did: did the
/// followers receive the entries while this node was still persisting them?
struct SlowLeaderLog {
    enabled: Arc<AtomicBool>,
    peers_written: Vec<Arc<AtomicU64>>,
    peers_had_it: Arc<AtomicU64>,
    writes_checked: Arc<AtomicU64>,
}

impl SlowLeaderLog {
    fn wait_for_peers(&self, last: u64) {
        if !self.enabled.load(Ordering::Acquire) {
            return;
        }
        let a_peer_has_it = || {
            self.peers_written
                .iter()
                .any(|peer| peer.load(Ordering::Acquire) >= last)
        };
        let deadline = Instant::now() + Duration::from_secs(2);
        while !a_peer_has_it() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.writes_checked.fetch_add(1, Ordering::AcqRel);
        if a_peer_has_it() {
            self.peers_had_it.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// A log that records the highest index of group 0 it wrote in `written`, after `slow` (on
/// the leader) had its say.
fn observed_log(written: Arc<AtomicU64>, slow: Option<SlowLeaderLog>) -> HookedLog {
    HookedLog::new(Box::new(move |batch, inner| {
        let last = last_entry_of_group_0(&batch);
        if let (Some(slow), Some(last)) = (&slow, last) {
            slow.wait_for_peers(last);
        }
        inner.write(batch)?;
        if let Some(last) = last {
            written.fetch_max(last, Ordering::AcqRel);
        }
        Ok(())
    }))
}

/// raft-rs's documented order: a leader sends its appends before persisting its own entries,
/// so its sync and the followers' syncs overlap. The leader's log here holds each write until
/// a follower has written the same entry (or 2 s pass): the followers must receive the
/// entries while the leader is still persisting them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_replicates_while_it_persists() {
    let network = InProcessNetwork::new();
    let voters = vec![1, 2, 3];
    let written: Vec<Arc<AtomicU64>> = (0..3).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let enabled = Arc::new(AtomicBool::new(false));
    let peers_had_it = Arc::new(AtomicU64::new(0));
    let writes_checked = Arc::new(AtomicU64::new(0));
    let mut nodes = Vec::new();
    for node in 1..=3u64 {
        let slow = (node == 1).then(|| SlowLeaderLog {
            enabled: enabled.clone(),
            peers_written: vec![written[1].clone(), written[2].clone()],
            peers_had_it: peers_had_it.clone(),
            writes_checked: writes_checked.clone(),
        });
        let stores = Stores {
            log: Arc::new(observed_log(written[node as usize - 1].clone(), slow)),
            state: Arc::new(MemStateStore::new()),
        };
        let mut config = fast_config(node, voters.clone(), vec![0]);
        // An election timeout of 500 ms: a busy test machine that holds a round back for
        // more than 100 ms must not move the leadership (the write is dropped then), while a
        // leader that held its sends until after its write (2 s) still loses it.
        config.election_ticks = 50;
        let raft =
            RaftNode::start(config, stores, counter_factory(), network.transport(node)).unwrap();
        network.register(node, raft.sink());
        nodes.push(raft);
    }
    nodes[0].campaign(0).unwrap();
    wait_leader(nodes[0].as_ref(), 0).await;
    enabled.store(true, Ordering::Release);
    for _ in 0..5 {
        let started = Instant::now();
        let answer = nodes[0]
            .propose(0, 1i64.to_le_bytes().to_vec().into())
            .await;
        // A leader that sends only after its own write holds the write 2 s here: long enough
        // for the followers to elect another leader (the write is then dropped).
        assert!(
            answer.is_ok() && started.elapsed() < Duration::from_millis(1500),
            "a write answered {answer:?} after {:?}: the leader's sync did not overlap the \
             followers'",
            started.elapsed()
        );
    }
    enabled.store(false, Ordering::Release);
    let checked = writes_checked.load(Ordering::Acquire);
    assert!(checked >= 5, "only {checked} leader writes carried entries");
    assert_eq!(
        peers_had_it.load(Ordering::Acquire),
        checked,
        "some appends reached no follower before the leader's own write finished"
    );
    for node in &nodes {
        node.shutdown();
    }
}

/// Three raft nodes in one process over an in-process network, node `n` writing its log
/// through `log(n)` and started with `config(n)` (its test config for `groups`, then
/// changed); node 1 campaigns for every group, and leads them all, each with an entry of its
/// term committed, when this returns.
async fn three_nodes_led_by_node_1(
    groups: &[GroupId],
    log: impl Fn(u64) -> HookedLog,
    config: impl Fn(u64, &mut NodeConfig),
) -> Vec<Arc<RaftNode>> {
    let network = InProcessNetwork::new();
    let mut nodes = Vec::new();
    for node in 1..=3u64 {
        let stores = Stores {
            log: Arc::new(log(node)),
            state: Arc::new(MemStateStore::new()),
        };
        let mut node_config = fast_config(node, vec![1, 2, 3], groups.to_vec());
        config(node, &mut node_config);
        let transport = network.transport(node);
        let raft = RaftNode::start(node_config, stores, counter_factory(), transport).unwrap();
        network.register(node, raft.sink());
        nodes.push(raft);
    }
    for &group in groups {
        nodes[0].campaign(group).unwrap();
        wait_leader(nodes[0].as_ref(), group).await;
        let command = 0i64.to_le_bytes().to_vec().into();
        nodes[0].propose(group, command).await.unwrap();
    }
    nodes
}

/// A leader whose log writes turn slow hands its leaderships over after the first slow write,
/// and the group goes on committing at the pace of the others' disks. Its heartbeats keep
/// coming between writes, and the election timeout here is 1.5 s: only the hand-over moves
/// the leaderships within the test's second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_log_writes_turn_slow_hands_its_leaderships_over() {
    const GROUPS: [GroupId; 2] = [0, 1];
    let slow = Arc::new(AtomicBool::new(false));
    let log = |node| {
        let slow = slow.clone();
        HookedLog::new(Box::new(move |batch, inner| {
            if node == 1 && slow.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(100));
            }
            inner.write(batch)
        }))
    };
    let nodes = three_nodes_led_by_node_1(&GROUPS, log, |_, config| {
        config.election_ticks = 150;
        config.leader_balance_interval = None;
        config.slow_log_write = Some(Duration::from_millis(50));
    })
    .await;
    slow.store(true, Ordering::Release);
    let _ = nodes[0].propose(0, Bytes::new()).await;
    let deadline = Instant::now() + Duration::from_secs(1);
    let others: BTreeMap<u64, _> = [2, 3].map(|n| (n, nodes[n as usize - 1].clone())).into();
    for group in GROUPS {
        let leader = leader_before(&others, group, deadline).await;
        let leader = leader
            .unwrap_or_else(|| panic!("group {group} is still led by the node with the slow log"));
        // Node 1's disk is still slow; the two others are a quorum.
        let started = Instant::now();
        let answer = others[&leader].propose(group, Bytes::new()).await;
        assert!(answer.is_ok(), "group {group}: {answer:?}");
        assert!(
            started.elapsed() < Duration::from_millis(90),
            "group {group}: a write took {:?}, as long as the slow disk",
            started.elapsed()
        );
    }
    for node in nodes {
        node.shutdown();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_reads_are_bounded() {
    for raft in [false, true] {
        let gate = Gate::default();
        let mut config = fast_config(1, vec![1], vec![0]);
        config.max_waiting_reads = 8;
        let node = start(raft, config, memory_stores(), gated_factory(&gate));
        wait_leader(node.as_ref(), 0).await;
        // A write that cannot apply yet keeps every later read waiting.
        let write = node.propose(0, Bytes::from_static(b"x"));
        tokio::time::sleep(Duration::from_millis(20)).await;
        let reads: Vec<_> = (0..8).map(|_| node.read_barrier(0)).collect();
        match node.read_barrier(0).await {
            Err(ProposeError::Overloaded { group: 0 }) => {}
            other => panic!("raft={raft}: the ninth read was not refused: {other:?}"),
        }
        gate.0.store(true, Ordering::Release);
        write.await.unwrap();
        for read in reads {
            read.await.unwrap();
        }
        // Answered reads free their places.
        node.read_barrier(0).await.unwrap();
        node.shutdown();
    }
}

/// The proposal queue is bounded in bytes as well as in commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proposal_queue_is_bounded_in_bytes() {
    let gate = Gate::default();
    let mut config = fast_config(1, vec![1], vec![0]);
    config.proposal_queue_capacity_bytes = 64 * 1024;
    config.max_command_bytes = 8192;
    config.max_commands_per_entry = 1;
    config.apply_queue_capacity = 1;
    let node = start(false, config, memory_stores(), gated_factory(&gate));
    let command = Bytes::from(vec![7u8; 4096]);
    let mut pending = Vec::new();
    let mut overloaded = false;
    for _ in 0..64 {
        let answer = node.propose(0, command.clone());
        pending.push(answer);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    gate.0.store(true, Ordering::Release);
    let mut accepted = 0;
    for answer in pending {
        match answer.await {
            Ok(_) => accepted += 1,
            Err(ProposeError::Overloaded { .. }) => overloaded = true,
            Err(other) => panic!("unexpected {other}"),
        }
    }
    assert!(overloaded, "64 commands of 4 KiB fit a 64 KiB queue");
    assert!(accepted >= 16, "only {accepted} accepted");
    node.shutdown();
}

/// Records how each command reached it: `apply` answers `client:<bytes>` with the size of the
/// call it came in, `apply_admin` answers `admin:<bytes>`.
struct RecordingMachine;

impl StateMachine for RecordingMachine {
    fn apply(
        &mut self,
        _txn: &mut StateTransaction<'_>,
        commands: &[Bytes],
    ) -> Result<Vec<CommandResult>, ApplyError> {
        Ok(commands
            .iter()
            .map(|c| {
                let text = format!("client:{}", String::from_utf8_lossy(c));
                Ok(Bytes::from(text))
            })
            .collect())
    }

    fn apply_admin(
        &mut self,
        _txn: &mut StateTransaction<'_>,
        command: &Bytes,
    ) -> Result<CommandResult, ApplyError> {
        Ok(Ok(Bytes::from(format!(
            "admin:{}",
            String::from_utf8_lossy(command)
        ))))
    }
}

/// An admin command reaches `apply_admin`, in its own entry, between the client commands
/// queued around it, on raft and on solo; a client command with the same bytes stays a client
/// command; a machine without admin commands answers them with a command error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_commands_travel_alone_and_reach_apply_admin() {
    for raft in [false, true] {
        let factory: Arc<dyn StateMachineFactory> =
            Arc::new(|_group: GroupId| Box::new(RecordingMachine) as Box<dyn StateMachine>);
        let node = start(
            raft,
            fast_config(1, vec![1], vec![0]),
            memory_stores(),
            factory,
        );
        wait_leader(node.as_ref(), 0).await;
        let before: Vec<_> = (0..50)
            .map(|i| node.propose(0, Bytes::from(format!("b{i}"))))
            .collect();
        let admin = node.propose_admin(0, Bytes::from_static(b"upgrade"));
        let lookalike = node.propose(0, Bytes::from_static(b"\x02upgrade"));
        let after: Vec<_> = (0..50)
            .map(|i| node.propose(0, Bytes::from(format!("a{i}"))))
            .collect();
        for (i, pending) in before.into_iter().enumerate() {
            assert_eq!(
                pending.await.unwrap(),
                format!("client:b{i}"),
                "raft={raft}"
            );
        }
        assert_eq!(admin.await.unwrap(), "admin:upgrade", "raft={raft}");
        assert_eq!(
            lookalike.await.unwrap(),
            "client:\u{2}upgrade",
            "raft={raft}"
        );
        for (i, pending) in after.into_iter().enumerate() {
            assert_eq!(
                pending.await.unwrap(),
                format!("client:a{i}"),
                "raft={raft}"
            );
        }
        node.shutdown();

        let node = start(
            raft,
            fast_config(1, vec![1], vec![0]),
            memory_stores(),
            counter_factory(),
        );
        wait_leader(node.as_ref(), 0).await;
        match node.propose_admin(0, Bytes::from_static(b"upgrade")).await {
            Err(ProposeError::Command(error)) => {
                assert_eq!(error.code, concord_consensus::ADMIN_COMMAND_UNSUPPORTED);
            }
            other => panic!("raft={raft}: expected a command error, got {other:?}"),
        }
        node.shutdown();
    }
}

/// A log write that does not return (a stalled disk) shows from outside the raft thread it
/// blocks: how long the oldest write in progress has been running, until it returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_write_that_does_not_return_shows_how_long_it_has_run() {
    for raft in [false, true] {
        let stalled = Arc::new(AtomicBool::new(false));
        let log = {
            let stalled = stalled.clone();
            HookedLog::new(Box::new(move |batch, inner| {
                while stalled.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                inner.write(batch)
            }))
        };
        let stores = Stores {
            log: Arc::new(log),
            state: Arc::new(MemStateStore::new()),
        };
        let node = start(
            raft,
            fast_config(1, vec![1], vec![0]),
            stores,
            counter_factory(),
        );
        wait_leader(node.as_ref(), 0).await;
        stalled.store(true, Ordering::Release);
        let write = tokio::spawn({
            let node = node.clone();
            async move { node.propose(0, Bytes::new()).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let running = node.log_write_in_progress_for();
        assert!(
            running.is_some_and(|took| took >= Duration::from_millis(150)),
            "raft {raft}: {running:?}"
        );
        assert!(!node.log_write_stalled(), "stalled only past a second");
        stalled.store(false, Ordering::Release);
        let answer = write.await.unwrap();
        assert!(answer.is_ok(), "raft {raft}: {answer:?}");
        let deadline = Instant::now() + Duration::from_secs(2);
        while let Some(running) = node.log_write_in_progress_for() {
            assert!(
                running < Duration::from_millis(150) && Instant::now() < deadline,
                "raft {raft}: a write still in progress for {running:?}"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        node.shutdown();
    }
}

/// What a leader's log writes showed: writes that carried new entries, and how many of them
/// carried some while an entry this leader had written earlier was not yet committed.
#[derive(Default)]
struct WaveRecord {
    appended: BTreeMap<GroupId, u64>,
    committed: BTreeMap<GroupId, u64>,
    writes_with_entries: u64,
    proposed_over_uncommitted: u64,
}

impl WaveRecord {
    fn record(&mut self, batch: &LogBatch) {
        let waiting = (self.appended.iter())
            .any(|(group, &last)| self.committed.get(group).copied().unwrap_or(0) < last);
        let mut has_entries = false;
        for (group, op) in batch.ops() {
            match op {
                LogOp::Append(entries) if !entries.is_empty() => {
                    has_entries = true;
                    self.appended
                        .insert(*group, entries[entries.len() - 1].index);
                }
                LogOp::SetHardState(state) => {
                    let committed = self.committed.entry(*group).or_default();
                    *committed = (*committed).max(state.commit);
                }
                _ => {}
            }
        }
        if has_entries {
            self.writes_with_entries += 1;
            self.proposed_over_uncommitted += u64::from(waiting);
        }
    }
}

/// Under load a leader's groups propose together and wait together: a write of the leader
/// carries new entries only once every entry it wrote before has committed, so eight groups
/// cost the leader and each follower about one sync per round trip, as one group does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaders_groups_propose_in_waves() {
    const GROUPS: [GroupId; 8] = [0, 1, 2, 3, 4, 5, 6, 7];
    let recording = Arc::new(AtomicBool::new(false));
    let record = Arc::new(parking_lot::Mutex::new(WaveRecord::default()));
    let log = |node| {
        let (recording, record) = (recording.clone(), record.clone());
        HookedLog::new(Box::new(move |batch, inner| {
            if node == 1 && recording.load(Ordering::Acquire) {
                record.lock().record(&batch);
            }
            inner.write(batch)
        }))
    };
    // A loaded test machine may stall a round past the 10 ms tick: the wave is then given up,
    // which this test would count against it.
    let nodes = three_nodes_led_by_node_1(&GROUPS, log, |_, config| {
        config.tick_interval = Duration::from_millis(100);
    })
    .await;
    recording.store(true, Ordering::Release);
    let until = Instant::now() + Duration::from_millis(400);
    let tasks: Vec<_> = (0..64)
        .map(|task| {
            let node = nodes[0].clone();
            tokio::spawn(async move {
                while Instant::now() < until {
                    let group = GROUPS[task % GROUPS.len()];
                    node.propose(group, 1i64.to_le_bytes().to_vec().into())
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    recording.store(false, Ordering::Release);
    let record = record.lock();
    let (writes, over) = (record.writes_with_entries, record.proposed_over_uncommitted);
    println!("{writes} leader writes with entries, {over} of them over uncommitted entries");
    assert!(
        writes >= 20,
        "only {writes} leader writes carried entries in 400 ms"
    );
    assert!(
        over * 10 <= writes,
        "{over} of {writes} leader writes carried new entries while earlier ones waited"
    );
    for node in &nodes {
        node.shutdown();
    }
}

/// A wave holds the worker's other groups back for one tick at most: a group whose entry
/// cannot commit (here its followers' writes take 600 ms) does not stall the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_cannot_commit_holds_the_others_back_one_tick_at_most() {
    const GROUPS: [GroupId; 2] = [0, 1];
    let slow = Arc::new(AtomicBool::new(false));
    let log = |node| {
        let slow = slow.clone();
        HookedLog::new(Box::new(move |batch, inner| {
            let has_group_0_entries = batch
                .ops()
                .iter()
                .any(|(group, op)| *group == 0 && matches!(op, LogOp::Append(e) if !e.is_empty()));
            if node != 1 && has_group_0_entries && slow.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(600));
            }
            inner.write(batch)
        }))
    };
    // On the leader both groups share one worker, and so one wave. On the followers each has
    // its own, so that group 1 commits while group 0's writes are slow; the slow writes must
    // not cost group 0 its leader either.
    let nodes = three_nodes_led_by_node_1(&GROUPS, log, |node, config| {
        if node != 1 {
            config.workers = 2;
        }
        config.election_ticks = 200;
    })
    .await;
    slow.store(true, Ordering::Release);
    let leader = nodes[0].clone();
    let stuck =
        tokio::spawn(async move { leader.propose(0, 1i64.to_le_bytes().to_vec().into()).await });
    // Group 0's entry is out (its followers are writing it) before group 1 gets a command.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = Instant::now();
    nodes[0]
        .propose(1, 1i64.to_le_bytes().to_vec().into())
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(300),
        "group 1's write took {took:?} while group 0's entry could not commit"
    );
    slow.store(false, Ordering::Release);
    stuck.await.unwrap().unwrap();
    for node in &nodes {
        node.shutdown();
    }
}

/// Records each command it applies with the name of the thread that applied it; on the apply
/// thread, a command starting with `hold` waits at `gate` first.
struct ThreadRecordingMachine {
    applied: Arc<parking_lot::Mutex<Vec<(String, String)>>>,
    gate: Gate,
}

impl StateMachine for ThreadRecordingMachine {
    fn apply(
        &mut self,
        _txn: &mut StateTransaction<'_>,
        commands: &[Bytes],
    ) -> Result<Vec<CommandResult>, ApplyError> {
        let thread = std::thread::current().name().unwrap_or("").to_string();
        for command in commands {
            if command.starts_with(b"hold") && thread.starts_with("concord-apply") {
                while !(self.gate).0.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            let command = String::from_utf8_lossy(command).into_owned();
            self.applied.lock().push((thread.clone(), command));
        }
        Ok(commands.iter().map(|_| Ok(Bytes::new())).collect())
    }

    fn apply_admin(
        &mut self,
        _txn: &mut StateTransaction<'_>,
        command: &Bytes,
    ) -> Result<CommandResult, ApplyError> {
        let thread = std::thread::current().name().unwrap_or("").to_string();
        let command = String::from_utf8_lossy(command).into_owned();
        self.applied.lock().push((thread, command));
        Ok(Ok(Bytes::new()))
    }

    fn applies_quickly(&self) -> bool {
        true
    }
}

/// A round of a few commands for a machine that applies quickly is applied by the raft worker
/// itself while the apply thread has nothing to do and no commands wait; a large round goes to
/// the apply thread, and while that thread is in it, small rounds wait for it there: entries
/// apply in log order whichever thread applies them. An admin command goes to the apply thread
/// always. On raft and on solo.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_rounds_apply_on_the_worker_only_while_the_apply_thread_is_idle() {
    const HELD: usize = 40;
    for raft in [false, true] {
        let applied = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let gate = Gate::default();
        let factory: Arc<dyn StateMachineFactory> = {
            let (applied, gate) = (applied.clone(), gate.clone());
            Arc::new(move |_group: GroupId| {
                Box::new(ThreadRecordingMachine {
                    applied: applied.clone(),
                    gate: gate.clone(),
                }) as Box<dyn StateMachine>
            })
        };
        // While `slow` is set, every log write takes 200 ms: commands proposed meanwhile wait
        // for the next round, together.
        let slow = Arc::new(AtomicBool::new(false));
        let log = {
            let slow = slow.clone();
            HookedLog::new(Box::new(move |batch, inner| {
                if slow.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(200));
                }
                inner.write(batch)
            }))
        };
        let stores = Stores {
            log: Arc::new(log),
            state: Arc::new(MemStateStore::new()),
        };
        let node = start(raft, fast_config(1, vec![1], vec![0]), stores, factory);
        wait_leader(node.as_ref(), 0).await;
        // The group's machine is made by the first round to apply (on the apply thread).
        node.propose(0, Bytes::from_static(b"first")).await.unwrap();
        slow.store(true, Ordering::Release);
        let lead = node.propose(0, Bytes::from_static(b"lead"));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let held: Vec<_> = (0..HELD)
            .map(|i| node.propose(0, Bytes::from(format!("hold-{i}"))))
            .collect();
        slow.store(false, Ordering::Release);
        // The held round (with `lead`, if the apply thread took both at once) is at the apply
        // thread's gate by now; this one waits behind it.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let behind = node.propose(0, Bytes::from_static(b"behind"));
        tokio::time::sleep(Duration::from_millis(100)).await;
        gate.0.store(true, Ordering::Release);
        lead.await.unwrap();
        for answer in held {
            answer.await.unwrap();
        }
        behind.await.unwrap();
        // With the apply thread idle again and nothing queued: a lone command, then an admin
        // command alone.
        tokio::time::sleep(Duration::from_millis(100)).await;
        node.propose(0, Bytes::from_static(b"alone")).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        node.propose_admin(0, Bytes::from_static(b"admin"))
            .await
            .unwrap();
        let records = applied.lock().clone();
        let order: Vec<&str> = records.iter().map(|(_, c)| c.as_str()).collect();
        let mut expected = vec!["first".to_string(), "lead".to_string()];
        expected.extend((0..HELD).map(|i| format!("hold-{i}")));
        expected.extend(["behind", "alone", "admin"].map(String::from));
        assert_eq!(order, expected, "raft={raft}: applied out of log order");
        let thread_of = |command: &str| {
            let (thread, _) = records.iter().find(|(_, c)| c == command).unwrap();
            thread.clone()
        };
        let worker = if raft {
            "concord-raft-"
        } else {
            "concord-solo-"
        };
        assert!(
            thread_of("lead").starts_with("concord-apply"),
            "raft={raft}: a lone command with commands queued behind it was applied on {}",
            thread_of("lead")
        );
        assert!(
            thread_of("alone").starts_with(worker),
            "raft={raft}: a lone command with the apply thread idle was applied on {}",
            thread_of("alone")
        );
        assert!(
            thread_of("hold-0").starts_with("concord-apply"),
            "raft={raft}"
        );
        assert!(
            thread_of("behind").starts_with("concord-apply"),
            "raft={raft}: a lone command while the apply thread was busy was applied on {}",
            thread_of("behind")
        );
        assert!(
            thread_of("admin").starts_with("concord-apply"),
            "raft={raft}: an admin command was applied on {}",
            thread_of("admin")
        );
        node.shutdown();
    }
}
