//! What concurrent clients see of a three-member cluster in this process, under a network
//! that drops, delays and reorders messages, a partition and a member's restart: every
//! history of creates, If-Match updates, deletes and linearizable and lease reads must be
//! linearizable (`checker.rs`).
//!
//! Every other seed runs its members' clocks at different rates: each member ticks, and times
//! its lease, as if its clock ran up to `CONCORD_LINEARIZABILITY_CLOCK_DRIFT_PERCENT` (default
//! 5) fast or slow. A leader's lease allows clocks up to 1/0.9 apart in rate (`lease.rs`), so
//! two members 5% off either way stay inside it; a drift past about 5.3% does not.
//!
//! `CONCORD_LINEARIZABILITY_SEEDS=<n>` (default 50) runs n seeds; `CONCORD_LINEARIZABILITY_SEED=<s>`
//! starts from seed s (printed by every run) to replay one.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use concord_consensus::transport::{FaultConfig, FaultyNetwork};
use concord_engine::testing::linearizability::{self as checker, Event, Op, Outcome, Value};
use concord_engine::{
    BackendKind, Consistency, Engine, EngineConfig, EngineError, NodeId, ProposeError, Session,
    SessionFields, SessionPatch, StateMachineSource, SyncMode, session_code,
};
use concord_storage::testing::SeededRng;

const NODES: [NodeId; 3] = [1, 2, 3];
const KEYS: [&str; 3] = ["k0", "k1", "k2"];
const CLIENTS: usize = 6;
/// How long the clients run per seed.
const RUN: Duration = Duration::from_millis(300);
/// Seeds run at the same time.
const SEEDS_AT_ONCE: usize = 4;
/// Rounds of the lease test: node 1 leads, is cut off, and the others elect and write.
const LEASE_ROUNDS: u64 = 3;
/// A member's raft tick at the rate of a true clock.
const TICK: Duration = Duration::from_millis(10);
/// A client gives up on an operation after this: its outcome is unknown.
const OPERATION_TIMEOUT: Duration = Duration::from_millis(600);

/// The members of one run, each of which may be down (restarting) for a moment.
struct Members {
    network: Arc<FaultyNetwork>,
    dirs: BTreeMap<NodeId, tempfile::TempDir>,
    running: Mutex<BTreeMap<NodeId, Arc<Engine>>>,
    /// Each member's clock rate against a true clock: 1.05 runs 5% fast.
    clock_rates: BTreeMap<NodeId, f64>,
}

impl Members {
    fn config(&self, node: NodeId) -> EngineConfig {
        let mut config = EngineConfig::new(self.dirs[&node].path());
        config.backend = Some(BackendKind::Redb);
        // A restart here is a shutdown, which flushes: syncing each write would only slow the
        // run without testing anything more.
        config.log_sync = SyncMode::NoSync;
        config.groups = 2;
        // The session logic's native twin: the same rules, without compiling the wasm plugin
        // for every member of every seed.
        config.state_machine = StateMachineSource::NativeSession;
        config.proposal_timeout = Duration::from_millis(400);
        config
    }

    fn open(&self, node: NodeId) -> Arc<Engine> {
        let engine = Engine::open_in_process(
            self.config(node),
            node,
            NODES.to_vec(),
            &self.network,
            |node_config| {
                // A clock that runs fast ends each tick, and the lease measured in ticks,
                // early by a true clock.
                node_config.tick_interval = TICK.div_f64(self.clock_rates[&node]);
                node_config.election_ticks = 10;
                node_config.heartbeat_ticks = 2;
            },
        )
        .unwrap();
        Arc::new(engine)
    }

    /// Members over a faulty network drawn from `seed`, their clocks' rates at most
    /// `clock_drift` off a true clock's either way.
    fn start(seed: u64, clock_drift: f64) -> Arc<Members> {
        let mut rng = SeededRng::new(seed.rotate_left(29) | 1);
        let clock_rates = NODES
            .iter()
            .map(|&node| {
                let off = (rng.below(2001) as f64 / 1000.0 - 1.0) * clock_drift;
                (node, 1.0 + off)
            })
            .collect();
        let faults = FaultConfig {
            seed,
            drop_probability: 0.05,
            max_delay: Duration::from_millis(3),
        };
        Members::start_with(faults, clock_rates)
    }

    /// Members over a network of `faults`, each member's clock at its rate in `clock_rates`.
    fn start_with(faults: FaultConfig, clock_rates: BTreeMap<NodeId, f64>) -> Arc<Members> {
        let members = Arc::new(Members {
            network: FaultyNetwork::new(faults),
            dirs: NODES
                .iter()
                .map(|&n| (n, tempfile::tempdir().unwrap()))
                .collect(),
            running: Mutex::new(BTreeMap::new()),
            clock_rates,
        });
        for node in NODES {
            let engine = members.open(node);
            members.running.lock().unwrap().insert(node, engine);
        }
        members
    }

    fn pick(&self, rng: &mut SeededRng) -> Option<Arc<Engine>> {
        let running = self.running.lock().unwrap();
        let engines: Vec<&Arc<Engine>> = running.values().collect();
        if engines.is_empty() {
            return None;
        }
        Some(engines[rng.below(engines.len() as u64) as usize].clone())
    }

    /// Shuts `node` down (callers in flight are answered, or time out) and starts it again
    /// on its data after `down`.
    async fn restart(&self, node: NodeId, down: Duration) {
        let engine = self.running.lock().unwrap().remove(&node);
        if let Some(engine) = engine {
            tokio::task::spawn_blocking(move || engine.shutdown().expect("the engine stops"))
                .await
                .unwrap();
        }
        self.network.inner().unregister(node);
        tokio::time::sleep(down).await;
        let engine = self.open(node);
        self.running.lock().unwrap().insert(node, engine);
    }

    /// The running member that leads `group`, if one does.
    fn leader_of(&self, group: u64) -> Option<NodeId> {
        let running = self.running.lock().unwrap();
        running
            .iter()
            .find(|(_, engine)| engine.group_status(group).is_ok_and(|s| s.is_leader))
            .map(|(&node, _)| node)
    }

    /// Waits until every running member's log holds what `leader` has committed in `group`
    /// (at most 10 s). A member whose log is still empty votes for no candidate whose log has
    /// entries (it cannot tell itself from a member that lost its data): cut off the leader
    /// before it got any, and the others can elect nobody until the leader is back.
    async fn wait_for_replication(&self, group: u64, leader: NodeId) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let replicated = {
                let running = self.running.lock().unwrap();
                let committed = running[&leader].group_status(group).unwrap().commit_index;
                running.values().all(|engine| {
                    engine
                        .group_status(group)
                        .is_ok_and(|status| status.last_log_index >= committed)
                })
            };
            if replicated {
                return;
            }
            assert!(Instant::now() < deadline, "not replicated");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits until every group has a leader somewhere (at most 10 s).
    async fn wait_for_leaders(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let groups = {
                let running = self.running.lock().unwrap();
                running.values().next().unwrap().group_ids().to_vec()
            };
            if groups.iter().all(|&group| self.leader_of(group).is_some()) {
                return;
            }
            assert!(Instant::now() < deadline, "no leaders");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn shutdown(&self) {
        self.network.stop();
        let engines: Vec<Arc<Engine>> = std::mem::take(&mut *self.running.lock().unwrap())
            .into_values()
            .collect();
        std::thread::scope(|scope| {
            for engine in &engines {
                scope.spawn(|| engine.shutdown().expect("the engine stops"));
            }
        });
    }
}

fn value(session: &Session) -> Value {
    Value {
        version: session.version,
        connection: session.fields.connection_id,
    }
}

/// What the client learnt: an outcome, or `None` if the operation certainly did not happen
/// (refused before it reached the log: no leader, overloaded, dropped with its leader).
fn outcome_of(result: Result<Option<Value>, EngineError>, is_read: bool) -> Option<Outcome> {
    match result {
        Ok(state) => Some(Outcome::Done(state)),
        Err(EngineError::Session(error)) => match error.code {
            session_code::NOT_FOUND => Some(Outcome::NotFound),
            session_code::ALREADY_EXISTS => Some(Outcome::Exists),
            session_code::VERSION_MISMATCH => Some(Outcome::Mismatch),
            other => panic!("unexpected session error {other}: {error}"),
        },
        // A read that failed did nothing.
        Err(_) if is_read => None,
        Err(EngineError::Propose(
            ProposeError::NotLeader { .. }
            | ProposeError::Overloaded { .. }
            | ProposeError::Dropped { .. }
            | ProposeError::Refused { .. },
        )) => None,
        Err(_) => Some(Outcome::Unknown),
    }
}

/// Runs `op` on `key` through `engine`: the session it leaves (`None` after a delete).
async fn perform(
    engine: &Engine,
    key: &str,
    op: &Op,
    consistency: Consistency,
) -> Result<Option<Value>, EngineError> {
    let sessions = engine.sessions()?;
    match op {
        Op::Create { connection } => {
            let fields = SessionFields {
                connection_id: *connection,
                ..SessionFields::default()
            };
            sessions.create(key, fields).await.map(|s| Some(value(&s)))
        }
        Op::Update {
            if_match,
            connection,
        } => {
            let patch = SessionPatch {
                connection_id: Some(*connection),
                ..SessionPatch::default()
            };
            sessions
                .update(key, patch, *if_match)
                .await
                .map(|s| Some(value(&s)))
        }
        Op::Delete { if_match } => sessions.delete(key, *if_match).await.map(|_| None),
        Op::Get => sessions
            .get(key, consistency)
            .await
            .map(|s| Some(value(&s))),
    }
}

/// One client: random operations on random keys through random members until `until`.
async fn client(
    members: Arc<Members>,
    index: usize,
    seed: u64,
    start: Instant,
    until: Instant,
    history: Arc<Mutex<Vec<Event>>>,
) {
    let mut rng = SeededRng::new(seed ^ (index as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut next_connection = (index as u64 + 1) << 32;
    while Instant::now() < until {
        let Some(engine) = members.pick(&mut rng) else {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        let key = KEYS[rng.below(KEYS.len() as u64) as usize];
        next_connection += 1;
        let connection = next_connection;
        let if_match = (rng.below(2) == 0).then(|| 1 + rng.below(4));
        let op = match rng.below(20) {
            0..=4 => Op::Create { connection },
            5..=10 => Op::Update {
                if_match,
                connection,
            },
            11..=12 => Op::Delete { if_match },
            _ => Op::Get,
        };
        let consistency = if rng.below(2) == 0 {
            Consistency::Linearizable
        } else {
            Consistency::Lease
        };
        let call_ns = start.elapsed().as_nanos() as u64;
        let run = perform(&engine, key, &op, consistency);
        let result = tokio::time::timeout(OPERATION_TIMEOUT, run).await;
        let return_ns = start.elapsed().as_nanos() as u64;
        let is_read = matches!(op, Op::Get);
        let (outcome, return_ns) = match result {
            Ok(result) => match outcome_of(result, is_read) {
                Some(Outcome::Unknown) => (Some(Outcome::Unknown), None),
                other => (other, Some(return_ns)),
            },
            Err(_) if is_read => (None, None),
            Err(_) => (Some(Outcome::Unknown), None),
        };
        if let Some(outcome) = outcome {
            history.lock().unwrap().push(Event {
                client: index,
                key: key.to_string(),
                op,
                call_ns,
                return_ns,
                outcome,
            });
        }
    }
}

/// One seed: the clients run while one member is cut off for a moment and another restarts.
async fn run_seed(seed: u64, clock_drift: f64) -> Vec<Event> {
    let members = Members::start(seed, clock_drift);
    members.wait_for_leaders().await;
    let history = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let until = start + RUN;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|index| {
            tokio::spawn(client(
                members.clone(),
                index,
                seed,
                start,
                until,
                history.clone(),
            ))
        })
        .collect();
    let mut rng = SeededRng::new(seed.rotate_left(17) | 1);
    tokio::time::sleep(Duration::from_millis(30 + rng.below(60))).await;
    let cut = NODES[rng.below(3) as usize];
    members.network.isolate(cut, &NODES);
    tokio::time::sleep(Duration::from_millis(40 + rng.below(80))).await;
    members.network.heal();
    let restarted = NODES[rng.below(3) as usize];
    members
        .restart(restarted, Duration::from_millis(rng.below(50)))
        .await;
    for client in clients {
        client.await.unwrap();
    }
    let members_to_stop = members.clone();
    tokio::task::spawn_blocking(move || members_to_stop.shutdown())
        .await
        .unwrap();
    std::mem::take(&mut *history.lock().unwrap())
}

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn histories_under_faults_partitions_and_restarts_are_linearizable() {
    let seeds = env_number("CONCORD_LINEARIZABILITY_SEEDS").unwrap_or(50);
    let drift_percent = env_number("CONCORD_LINEARIZABILITY_CLOCK_DRIFT_PERCENT").unwrap_or(5);
    let first = env_number("CONCORD_LINEARIZABILITY_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    });
    println!(
        "linearizability: seeds {first}..{} (CONCORD_LINEARIZABILITY_SEED replays), the odd \
         ones with clocks up to {drift_percent}% fast or slow",
        first + seeds
    );
    let mut operations = 0;
    let mut unknown = 0;
    let mut idle_seeds = 0;
    // Seeds run a few at a time: a run mostly waits (elections, timeouts), and more engines
    // at once only add to the chaos each one sees.
    let mut runs = tokio::task::JoinSet::new();
    let mut histories = Vec::new();
    for seed in first..first + seeds {
        if runs.len() == SEEDS_AT_ONCE {
            histories.push(runs.join_next().await.unwrap().unwrap());
        }
        let clock_drift = if seed % 2 == 1 {
            drift_percent as f64 / 100.0
        } else {
            0.0
        };
        runs.spawn(async move { (seed, run_seed(seed, clock_drift).await) });
    }
    while let Some(done) = runs.join_next().await {
        histories.push(done.unwrap());
    }
    histories.sort_by_key(|(seed, _)| *seed);
    for (seed, history) in histories {
        operations += history.len();
        unknown += history
            .iter()
            .filter(|e| e.outcome == Outcome::Unknown)
            .count();
        if let Err(violation) = checker::check(&history) {
            panic!("seed {seed}: {violation}");
        }
        // A seed whose members never settled (a slow machine) checks nothing; many such seeds
        // would mean the run tests nothing.
        if !history
            .iter()
            .any(|e| matches!(e.outcome, Outcome::Done(_)))
        {
            idle_seeds += 1;
        }
    }
    println!(
        "linearizability: {seeds} seeds, {operations} operations checked ({unknown} without an \
         answer), 0 violations; {idle_seeds} seeds where no operation succeeded"
    );
    assert!(
        idle_seeds * 10 <= seeds,
        "{idle_seeds} of {seeds} seeds had no operation succeed"
    );
}

/// The checker catches a broken read path: a member cut off from the others still answers
/// from its own state (a stale read presented as a linearizable one) after a write through
/// the others returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checker_catches_reads_served_by_a_deposed_leader() {
    let members = Members::start(7, 0.0);
    let start = Instant::now();
    let record = |op: Op, call_ns: u64, outcome: Outcome| Event {
        client: 0,
        key: "k".into(),
        op,
        call_ns,
        return_ns: Some(start.elapsed().as_nanos() as u64),
        outcome,
    };
    let group = concord_engine::group_of(b"k", 2);
    let deadline = Instant::now() + Duration::from_secs(10);
    let leader = loop {
        if let Some(node) = members.leader_of(group) {
            break node;
        }
        assert!(Instant::now() < deadline, "no leader");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let engine = |node: NodeId| members.running.lock().unwrap()[&node].clone();
    let mut history = Vec::new();
    let call = start.elapsed().as_nanos() as u64;
    let created = retry(|| async {
        engine(leader)
            .sessions()
            .unwrap()
            .create("k", SessionFields::default())
            .await
    })
    .await;
    history.push(record(
        Op::Create { connection: 0 },
        call,
        Outcome::Done(Some(value(&created))),
    ));
    // Cut the leader off once every member has the create; write through another member
    // once it leads.
    members.wait_for_replication(group, leader).await;
    members.network.isolate(leader, &NODES);
    let other = *NODES.iter().find(|&&n| n != leader).unwrap();
    let call = start.elapsed().as_nanos() as u64;
    let patch = SessionPatch {
        connection_id: Some(9),
        ..SessionPatch::default()
    };
    let updated = retry(|| async {
        engine(other)
            .sessions()
            .unwrap()
            .update("k", patch.clone(), None)
            .await
    })
    .await;
    history.push(record(
        Op::Update {
            if_match: None,
            connection: 9,
        },
        call,
        Outcome::Done(Some(value(&updated))),
    ));
    // The deposed leader's own state, read as if it were linearizable.
    let call = start.elapsed().as_nanos() as u64;
    let stale = engine(leader)
        .sessions()
        .unwrap()
        .get("k", Consistency::Stale)
        .await
        .unwrap();
    assert_eq!(
        stale.version, 1,
        "the cut-off member cannot have the update"
    );
    let honest = history.clone();
    history.push(record(Op::Get, call, Outcome::Done(Some(value(&stale)))));
    assert!(checker::check(&honest).is_ok());
    let violation = checker::check(&history).unwrap_err();
    assert!(violation.contains("no linearization"), "{violation}");
    // Asked for a linearizable read, the cut-off member does not answer with its stale state.
    let linearizable = tokio::time::timeout(
        Duration::from_millis(500),
        engine(leader)
            .sessions()
            .unwrap()
            .get("k", Consistency::Linearizable),
    )
    .await;
    assert!(
        !matches!(&linearizable, Ok(Ok(session)) if session.version == 1),
        "{linearizable:?}"
    );
    members.network.heal();
    tokio::task::spawn_blocking(move || members.shutdown())
        .await
        .unwrap();
}

/// A leader cut off from the others stops serving lease reads before they can elect another
/// leader and write, with its clock slow and theirs fast by
/// `CONCORD_LINEARIZABILITY_CLOCK_DRIFT_PERCENT` each (default 5: inside the lease's bound).
/// Past the bound its lease reads return what the new leader's write replaced, and the checker
/// finds it (with 50, every run here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_leader_stops_lease_reads_before_a_new_leader_writes_with_clocks_apart() {
    let drift_percent = env_number("CONCORD_LINEARIZABILITY_CLOCK_DRIFT_PERCENT").unwrap_or(5);
    let drift = drift_percent as f64 / 100.0;
    // The worst pair the drift allows: the leader's lease lasts longest by a true clock, the
    // others' quiet after its last heartbeat is shortest.
    let rate_of = |node: NodeId| if node == 1 { 1.0 - drift } else { 1.0 + drift };
    let clock_rates = NODES.iter().map(|&node| (node, rate_of(node))).collect();
    let faults = FaultConfig {
        seed: 11,
        drop_probability: 0.0,
        max_delay: Duration::from_millis(1),
    };
    let members = Members::start_with(faults, clock_rates);
    let engine = |node: NodeId| members.running.lock().unwrap()[&node].clone();
    let group = concord_engine::group_of(b"k", 2);
    let start = Instant::now();
    let now_ns = move || start.elapsed().as_nanos() as u64;
    let history = Arc::new(Mutex::new(Vec::new()));
    members.wait_for_leaders().await;
    write_until_done(&history, 0, now_ns, engine(1), Op::Create { connection: 0 }).await;
    for round in 1..=LEASE_ROUNDS {
        make_leader(&members, group, 1).await;
        let own = Op::Update {
            if_match: None,
            connection: round * 10,
        };
        write_until_done(&history, 0, now_ns, engine(1), own).await;
        // Heartbeats answered in node 1's term: its lease is up.
        tokio::time::sleep(Duration::from_millis(50)).await;
        members.network.isolate(1, &NODES);
        let written = Arc::new(AtomicBool::new(false));
        let reader = {
            let (history, leader, written) = (history.clone(), engine(1), written.clone());
            tokio::spawn(async move {
                // Lease reads on the cut-off leader, back to back, until well after the
                // others' write returned; one that waits for a quorum never returns in time
                // and is left out (a read that failed did nothing).
                let mut after_write = None;
                while after_write
                    .is_none_or(|at: Instant| at.elapsed() < Duration::from_millis(300))
                {
                    if after_write.is_none() && written.load(Ordering::Acquire) {
                        after_write = Some(Instant::now());
                    }
                    let call_ns = now_ns();
                    let sessions = leader.sessions().unwrap();
                    let read = sessions.get("k", Consistency::Lease);
                    match tokio::time::timeout(Duration::from_millis(5), read).await {
                        Ok(Ok(session)) => history.lock().unwrap().push(Event {
                            client: 1,
                            key: "k".into(),
                            op: Op::Get,
                            call_ns,
                            return_ns: Some(now_ns()),
                            outcome: Outcome::Done(Some(value(&session))),
                        }),
                        _ => tokio::time::sleep(Duration::from_millis(1)).await,
                    }
                }
            })
        };
        let theirs = Op::Update {
            if_match: None,
            connection: round * 10 + 1,
        };
        write_until_done(&history, 0, now_ns, engine(2), theirs).await;
        written.store(true, Ordering::Release);
        reader.await.unwrap();
        members.network.heal();
    }
    let history = std::mem::take(&mut *history.lock().unwrap());
    let reads = history.iter().filter(|e| matches!(e.op, Op::Get)).count();
    println!(
        "clocks {drift_percent}% apart either way: {reads} lease reads on the cut-off leader \
         in {LEASE_ROUNDS} rounds"
    );
    let checked = checker::check(&history);
    tokio::task::spawn_blocking(move || members.shutdown())
        .await
        .unwrap();
    if let Err(violation) = checked {
        let head: Vec<&str> = violation.lines().take(8).collect();
        panic!(
            "clocks {drift_percent}% apart either way: {}\n{}\n...",
            stale_lease_reads(&history),
            head.join("\n")
        );
    }
    assert!(
        reads > 0,
        "no lease read was served: the test tested nothing"
    );
}

/// Names the lease read called longest after a write it did not see had returned.
fn stale_lease_reads(history: &[Event]) -> String {
    let written = history
        .iter()
        .filter_map(|event| match (&event.outcome, event.return_ns) {
            (Outcome::Done(Some(value)), Some(returned)) if !matches!(event.op, Op::Get) => {
                Some((returned, value.version))
            }
            _ => None,
        });
    let reads: Vec<(u64, u64)> = history
        .iter()
        .filter_map(|event| match (&event.op, &event.outcome) {
            (Op::Get, Outcome::Done(Some(value))) => Some((event.call_ns, value.version)),
            _ => None,
        })
        .collect();
    let stale = written.flat_map(|(returned, version)| {
        reads
            .iter()
            .filter(move |&&(called, seen)| called > returned && seen < version)
            .map(move |&(called, seen)| (called - returned, seen, version))
    });
    match stale.max_by_key(|&(after_ns, _, _)| after_ns) {
        Some((after_ns, seen, version)) => format!(
            "a lease read called {:.1} ms after version {version} was written returned \
             version {seen}",
            after_ns as f64 / 1e6
        ),
        None => "no single stale read stands out".into(),
    }
}

/// Makes `node` lead `group` (a hand-over from the leader), waiting up to 10 s.
async fn make_leader(members: &Members, group: u64, node: NodeId) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match members.leader_of(group) {
            Some(leader) if leader == node => return,
            Some(leader) => {
                let engine = members.running.lock().unwrap().get(&leader).cloned();
                if let Some(engine) = engine {
                    let _ = engine.transfer_leader(group, node);
                }
            }
            None => {}
        }
        assert!(
            Instant::now() < deadline,
            "node {node} did not come to lead"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends `op` on "k" through `engine` until it is done (or, for a create, found done),
/// recording every attempt that may have taken effect.
async fn write_until_done(
    history: &Mutex<Vec<Event>>,
    client: usize,
    now_ns: impl Fn() -> u64,
    engine: Arc<Engine>,
    op: Op,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let call_ns = now_ns();
        let result = perform(&engine, "k", &op, Consistency::Linearizable).await;
        let outcome = outcome_of(result, false);
        // A create that finds the session made is done too: an earlier attempt without an
        // answer made it.
        let done = matches!(outcome, Some(Outcome::Done(_) | Outcome::Exists));
        if let Some(outcome) = outcome {
            let return_ns = (outcome != Outcome::Unknown).then(&now_ns);
            history.lock().unwrap().push(Event {
                client,
                key: "k".into(),
                op: op.clone(),
                call_ns,
                return_ns,
                outcome,
            });
        }
        if done {
            return;
        }
        assert!(Instant::now() < deadline, "{op:?} not done in 10 s");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Retries `attempt` through elections (refusals before the log) for up to 10 s.
async fn retry<F, Fut>(attempt: F) -> Session
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Session, EngineError>>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match attempt().await {
            Ok(session) => return session,
            Err(error) => {
                assert!(Instant::now() < deadline, "{error}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}
