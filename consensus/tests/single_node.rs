//! One node: the solo pipeline and single-voter raft, on every backend; refusals at the door.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{
    HookedLog, counter_factory, decode_counter, fast_config, first_log_index, wait_compacted,
};
use concord_consensus::{
    Consensus, InProcessNetwork, KvCommand, KvStateMachine, NodeConfig, ProposeError, RaftNode,
    SoloNode, StartError, StateMachine,
};
use concord_storage::testing::{HookedState, StateCall};
use concord_storage::{
    BackendKind, GroupId, LogStore, StateStore, StoreConfig, Stores, WriteBackStateStore,
};

fn start_solo(stores: Stores, groups: Vec<GroupId>) -> Arc<SoloNode> {
    start_solo_with(fast_config(1, vec![1], groups), stores)
}

fn start_solo_with(config: NodeConfig, stores: Stores) -> Arc<SoloNode> {
    SoloNode::start(config, stores, counter_factory()).unwrap()
}

fn start_raft(stores: Stores, groups: Vec<GroupId>) -> Arc<RaftNode> {
    start_raft_with(fast_config(1, vec![1], groups), stores)
}

fn start_raft_with(config: NodeConfig, stores: Stores) -> Arc<RaftNode> {
    try_start_raft(config, stores).unwrap()
}

fn try_start_raft(config: NodeConfig, stores: Stores) -> Result<Arc<RaftNode>, StartError> {
    let network = InProcessNetwork::new();
    let node = RaftNode::start(config, stores, counter_factory(), network.transport(1))?;
    network.register(1, node.sink());
    Ok(node)
}

async fn wait_leader(node: &dyn Consensus, group: GroupId) {
    for _ in 0..500 {
        if node.status(group).unwrap().is_leader {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no leader for group {group}");
}

/// A node's data that survives its restarts: a directory for disk backends; memory stores
/// cannot be reopened, so the same ones stand for "the disk".
struct Disk {
    _dir: tempfile::TempDir,
    config: StoreConfig,
    memory: Option<Stores>,
}

impl Disk {
    fn new(backend: BackendKind) -> Disk {
        let dir = tempfile::tempdir().unwrap();
        let config = StoreConfig::new(backend, dir.path());
        let memory = (backend == BackendKind::Memory).then(|| Stores::open(&config).unwrap());
        Disk {
            _dir: dir,
            config,
            memory,
        }
    }

    fn open(&self) -> Stores {
        match &self.memory {
            Some(stores) => stores.clone(),
            None => Stores::open(&self.config).unwrap(),
        }
    }
}

/// Counts to 25 in each of 4 groups, restarts from the stores, and counts on.
async fn counts_and_survives_restart(backend: BackendKind, raft: bool) {
    let disk = Disk::new(backend);
    let open = || disk.open();
    let groups = vec![0, 1, 2, 3];
    for round in 0..2i64 {
        let node: Arc<dyn Consensus> = if raft {
            start_raft(open(), groups.clone())
        } else {
            start_solo(open(), groups.clone())
        };
        for &group in &groups {
            wait_leader(node.as_ref(), group).await;
            for i in 1..=25 {
                let total = decode_counter(&node.propose(group, Bytes::new()).await.unwrap());
                assert_eq!(total, round * 25 + i, "{backend} raft={raft} group {group}");
            }
            let applied = node.read_barrier(group).await.unwrap();
            assert!(applied >= 25);
        }
        node.shutdown();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn solo_counts_and_survives_restart_on_every_backend() {
    for backend in BackendKind::ALL {
        counts_and_survives_restart(backend, false).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_voter_raft_counts_and_survives_restart_on_every_backend() {
    for backend in BackendKind::ALL {
        counts_and_survives_restart(backend, true).await;
    }
}

/// A log write that only moves commit indexes is not synced, so a crash can take the commit
/// index back below what the state applied: the node starts at its state's applied index,
/// applies nothing twice and goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_index_lost_in_a_crash_restarts_at_the_applied_index() {
    for backend in [BackendKind::Wal, BackendKind::Redb] {
        let disk = Disk::new(backend);
        let node = start_raft(disk.open(), vec![0]);
        wait_leader(node.as_ref(), 0).await;
        for i in 1..=25 {
            let total = decode_counter(&node.propose(0, Bytes::new()).await.unwrap());
            assert_eq!(total, i, "{backend}");
        }
        node.shutdown();
        drop(node);
        // What a crash leaves when the commit-only writes were lost: the entries and the
        // state, the commit index of the first write.
        let stores = disk.open();
        assert_eq!(stores.state.applied_index(0).unwrap(), 26, "{backend}");
        let mut hard_state = stores.log.group_state(0).unwrap().hard_state;
        hard_state.commit = 1;
        let mut batch = concord_storage::LogBatch::new();
        batch.set_hard_state(0, hard_state);
        stores.log.write(batch).unwrap();
        stores.log.flush().unwrap();
        drop(stores);

        let node = start_raft(disk.open(), vec![0]);
        wait_leader(node.as_ref(), 0).await;
        let total = decode_counter(&node.propose(0, Bytes::new()).await.unwrap());
        assert_eq!(total, 26, "{backend}: after the restart");
        node.shutdown();
    }
}

/// A full queue answers `Overloaded` at once; everything accepted still gets an answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_queue_answers_overloaded_at_once() {
    let stores = Stores::open(&StoreConfig::new(BackendKind::Memory, "unused")).unwrap();
    let mut config = fast_config(1, vec![1], vec![0]);
    config.proposal_queue_capacity = 4;
    let node = SoloNode::start(config, stores, counter_factory()).unwrap();
    let pending: Vec<_> = (0..10_000).map(|_| node.propose(0, Bytes::new())).collect();
    let mut overloaded = 0;
    let mut applied = 0;
    for result in futures_lite(pending).await {
        match result {
            Ok(_) => applied += 1,
            Err(ProposeError::Overloaded { group: 0 }) => overloaded += 1,
            Err(other) => panic!("unexpected answer {other}"),
        }
    }
    assert!(overloaded > 0, "a 4-slot queue absorbed 10000 proposals");
    assert_eq!(applied + overloaded, 10_000);
}

async fn futures_lite<T: Unpin>(
    pending: Vec<concord_consensus::Pending<T>>,
) -> Vec<Result<T, ProposeError>> {
    let mut out = Vec::with_capacity(pending.len());
    for p in pending {
        out.push(p.await);
    }
    out
}

/// Unknown groups and oversized commands are refused without queueing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_proposals_are_refused_at_the_door() {
    let stores = Stores::open(&StoreConfig::new(BackendKind::Memory, "unused")).unwrap();
    let node = start_raft(stores, vec![0]);
    wait_leader(node.as_ref(), 0).await;
    assert!(matches!(
        node.propose(42, Bytes::new()).await,
        Err(ProposeError::UnknownGroup { group: 42 })
    ));
    let huge = Bytes::from(vec![0u8; 2 * 1024 * 1024]);
    assert!(matches!(
        node.propose(0, huge).await,
        Err(ProposeError::TooLarge { .. })
    ));
    // A malformed counter command is that command's error only.
    let bad = node.propose(0, Bytes::from_static(b"abc"));
    let good = node.propose(0, Bytes::new());
    assert!(matches!(bad.await, Err(ProposeError::Command(_))));
    assert_eq!(decode_counter(&good.await.unwrap()), 1);
    node.shutdown();
    assert!(matches!(
        node.propose(0, Bytes::new()).await,
        Err(ProposeError::Stopped { .. })
    ));
}

/// A batch is queued whole and in order, each command answered with its own result; one
/// that cannot be queued whole is refused whole, and nothing of it applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_answered_per_command_or_refused_whole() {
    let stores = Stores::open(&StoreConfig::new(BackendKind::Memory, "unused")).unwrap();
    let mut config = fast_config(1, vec![1], vec![0]);
    config.proposal_queue_capacity = 8;
    let node = start_raft_with(config, stores);
    wait_leader(node.as_ref(), 0).await;

    let mut batch = vec![Bytes::new(); 5];
    batch.insert(2, Bytes::from_static(b"abc"));
    let answers = node.propose_batch(0, batch).await.unwrap();
    assert_eq!(answers.len(), 6);
    let counts: Vec<Option<i64>> = answers
        .iter()
        .map(|answer| answer.as_ref().ok().map(decode_counter))
        .collect();
    assert_eq!(counts, [Some(1), Some(2), None, Some(3), Some(4), Some(5)]);
    assert!(matches!(answers[2], Err(ProposeError::Command(_))));

    let huge = Bytes::from(vec![0u8; 2 * 1024 * 1024]);
    let refused = node.propose_batch(0, vec![Bytes::new(), huge]).await;
    assert!(matches!(refused, Err(ProposeError::TooLarge { .. })));
    let refused = node.propose_batch(0, vec![Bytes::new(); 9]).await;
    assert!(
        matches!(&refused, Err(ProposeError::Refused { reason, .. }) if reason.contains("split it")),
        "{refused:?}"
    );
    assert!(matches!(
        node.propose_batch(7, vec![Bytes::new()]).await,
        Err(ProposeError::UnknownGroup { group: 7 })
    ));
    assert_eq!(node.propose_batch(0, Vec::new()).await.unwrap().len(), 0);
    // Nothing of the refused batches applied.
    assert_eq!(
        decode_counter(&node.propose(0, Bytes::new()).await.unwrap()),
        6
    );

    node.shutdown();
    assert!(matches!(
        node.propose_batch(0, vec![Bytes::new()]).await,
        Err(ProposeError::Stopped { .. })
    ));
}

/// The kv machine over raft: puts and deletes apply, results come back per command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_machine_applies_puts_and_deletes() {
    let stores = Stores::open(&StoreConfig::new(BackendKind::Memory, "unused")).unwrap();
    let network = InProcessNetwork::new();
    let node = RaftNode::start(
        fast_config(1, vec![1], vec![5]),
        stores.clone(),
        Arc::new(|_g: GroupId| Box::new(KvStateMachine) as Box<dyn StateMachine>),
        network.transport(1),
    )
    .unwrap();
    wait_leader(node.as_ref(), 5).await;
    let put = KvCommand::Put {
        key: b"a".to_vec(),
        value: b"1".to_vec(),
    };
    node.propose(5, put.encode()).await.unwrap();
    assert_eq!(stores.state.get(5, b"a").unwrap(), Some(b"1".to_vec()));
    let delete = KvCommand::Delete { key: b"a".to_vec() };
    assert_eq!(
        node.propose(5, delete.encode()).await.unwrap(),
        Bytes::from_static(b"1")
    );
    assert_eq!(stores.state.get(5, b"a").unwrap(), None);
    let empty_key = KvCommand::Put {
        key: Vec::new(),
        value: b"x".to_vec(),
    };
    assert!(matches!(
        node.propose(5, empty_key.encode()).await,
        Err(ProposeError::Command(_))
    ));
}

/// A raft or solo node over groups `groups` whose log writes go through `then_fail` once
/// eight writes have succeeded (a disk that goes bad).
fn node_over_a_log_going_bad(
    raft: bool,
    groups: Vec<GroupId>,
    then_fail: fn() -> Result<(), concord_storage::StorageError>,
) -> Arc<dyn Consensus> {
    let ok_writes = std::sync::atomic::AtomicU64::new(8);
    let log = HookedLog::new(Box::new(move |batch, inner| {
        use std::sync::atomic::Ordering;
        if ok_writes.load(Ordering::SeqCst) == 0 {
            then_fail()?;
        }
        ok_writes.fetch_sub(1, Ordering::SeqCst);
        inner.write(batch)
    }));
    let stores = Stores {
        log: Arc::new(log),
        state: Arc::new(concord_storage::MemStateStore::new()),
    };
    if raft {
        start_raft(stores, groups)
    } else {
        start_solo(stores, groups)
    }
}

/// Proposes to group 0 until a proposal is answered `Stopped` (at most 20); its reason.
async fn propose_until_stopped(node: &dyn Consensus, raft: bool) -> Option<String> {
    for _ in 0..20 {
        match node.propose(0, Bytes::new()).await {
            Ok(_) => {}
            Err(ProposeError::Stopped { reason, .. }) => return Some(reason),
            Err(other) => panic!("raft={raft}: unexpected {other}"),
        }
    }
    None
}

/// A failing log write stops the groups it carried, answers their callers with the reason,
/// and shows in the status; nothing panics and later proposals are refused at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_failure_stops_the_group_and_is_reported() {
    for raft in [false, true] {
        // A disk that fails every write after the first eight.
        let node = node_over_a_log_going_bad(raft, vec![0], || {
            Err(concord_storage::StorageError::Io {
                path: "failing-disk".into(),
                source: std::io::Error::other("injected write failure"),
            })
        });
        wait_leader(node.as_ref(), 0).await;
        let stopped = propose_until_stopped(node.as_ref(), raft).await;
        let reason =
            stopped.unwrap_or_else(|| panic!("raft={raft}: the failure was never reported"));
        assert!(reason.contains("injected write failure"), "{reason}");
        let status = node.status(0).unwrap();
        assert!(status.stopped.unwrap().contains("injected"));
        assert!(matches!(
            node.propose(0, Bytes::new()).await,
            Err(ProposeError::Stopped { .. })
        ));
        node.shutdown();
    }
}

/// A worker thread that panics (a store that panics instead of failing, say) stops its
/// groups: the status says why, waiting and later callers are answered at once, readiness can
/// see it, and the node still shuts down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_worker_stops_its_groups_and_answers_everyone() {
    for raft in [false, true] {
        let node = node_over_a_log_going_bad(raft, vec![0, 1], || {
            panic!("injected panic in the log store")
        });
        wait_leader(node.as_ref(), 0).await;
        let started = std::time::Instant::now();
        let stopped = propose_until_stopped(node.as_ref(), raft).await;
        assert!(
            stopped.is_some(),
            "raft={raft}: the panic was never reported"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "raft={raft}: callers waited {:?}",
            started.elapsed()
        );
        for group in [0, 1] {
            let reason = node.status(group).unwrap().stopped;
            assert!(
                reason.as_deref().is_some_and(
                    |r| r.contains("the raft worker failed") && r.contains("injected panic")
                ),
                "raft={raft} group {group}: {reason:?}"
            );
        }
        assert!(matches!(
            node.propose(1, Bytes::new()).await,
            Err(ProposeError::Stopped { .. })
        ));
        node.shutdown();
    }
}

/// A read of the log that fails is never handed to raft-rs as an error (it panics on one):
/// the groups stop with the failed read named. A node restarts over a log whose committed
/// entries its fresh state has not applied, and every read of entries fails: raft-rs reads
/// them to apply (and to check for configuration changes before it campaigns).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_log_read_stops_the_groups_with_the_read_named() {
    let log = Arc::new(HookedLog::new(Box::new(|batch, inner| inner.write(batch))));
    let stores = |log: &Arc<HookedLog>| Stores {
        log: log.clone(),
        state: Arc::new(concord_storage::MemStateStore::new()),
    };
    // Nothing compacted: the restart must find the entries in the log.
    let config = || {
        let mut config = fast_config(1, vec![1], vec![0, 1]);
        config.log_keep_entries = 1_000_000;
        config.log_keep_bytes = u64::MAX;
        config
    };
    let node = start_raft_with(config(), stores(&log));
    wait_leader(node.as_ref(), 0).await;
    for _ in 0..10 {
        node.propose(0, Bytes::copy_from_slice(&1i64.to_le_bytes()))
            .await
            .unwrap();
    }
    node.shutdown();
    log.entry_reads_fail
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let reads_before = log.entry_reads.load(std::sync::atomic::Ordering::Relaxed);
    let node = start_raft_with(config(), stores(&log));
    // Each group stops: the log is shared, and a failed read of it stops every worker.
    for group in [0, 1] {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let reason = loop {
            if let Some(reason) = node.status(group).unwrap().stopped {
                break reason;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "group {group} went on after {} failed reads",
                log.entry_reads.load(std::sync::atomic::Ordering::Relaxed) - reads_before
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert!(
            reason.starts_with("log read failed") && reason.contains("injected read failure"),
            "group {group}: {reason}"
        );
    }
    assert!(matches!(
        node.propose(1, Bytes::new()).await,
        Err(ProposeError::Stopped { .. })
    ));
    node.shutdown();
}

/// Raft and solo compact each group's log below the state's durable applied index (keeping a
/// short tail), and a restart resumes from the state plus what the log kept, on every backend.
/// With a byte budget far below what the entry count would keep, the log is compacted by
/// bytes: large entries must not sit in memory a thousand at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kept_log_is_bounded_by_bytes_as_well_as_entries() {
    for raft in [true, false] {
        // One group: the node's byte budget is all its own.
        let mut config = fast_config(1, vec![1], vec![5]);
        config.log_keep_entries = 1_000_000;
        // One command per entry takes 17 bytes (batch header, length, 8-byte delta): 64 bytes
        // keep about 4 entries, and compaction starts above 128.
        config.log_keep_bytes = 64;
        let stores = Stores::open(&StoreConfig::new(BackendKind::Memory, "unused")).unwrap();
        let node: Arc<dyn Consensus> = if raft {
            start_raft_with(config, stores.clone())
        } else {
            start_solo_with(config, stores.clone())
        };
        wait_leader(node.as_ref(), 5).await;
        for i in 1..=60 {
            let delta = Bytes::copy_from_slice(&1i64.to_le_bytes());
            let total = decode_counter(&node.propose(5, delta).await.unwrap());
            assert_eq!(total, i, "raft={raft}");
        }
        let first = wait_compacted(&stores, 5).await;
        // Flushes and ticks lag a little: the log may hold a few more than the budget.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let held = stores.log.last_index(5).unwrap() + 1 - first_log_index(&stores, 5);
            if held <= 20 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "raft={raft}: the log still holds {held} entries (compacted to {first})"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        node.shutdown();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_is_compacted_and_a_restart_resumes_from_what_it_kept() {
    for (backend, raft) in BackendKind::ALL
        .into_iter()
        .flat_map(|backend| [(backend, true), (backend, false)])
    {
        let start = |stores: Stores| -> Arc<dyn Consensus> {
            if raft {
                start_raft(stores, vec![5])
            } else {
                start_solo(stores, vec![5])
            }
        };
        let disk = Disk::new(backend);
        let stores = disk.open();
        let node = start(stores.clone());
        wait_leader(node.as_ref(), 5).await;
        for i in 1..=40 {
            let total = decode_counter(&node.propose(5, Bytes::new()).await.unwrap());
            assert_eq!(total, i, "{backend} raft={raft}");
        }
        let first = wait_compacted(&stores, 5).await;
        let durable = stores.state.applied_index(5).unwrap();
        assert!(
            first <= durable + 1,
            "{backend} raft={raft}: compacted to {first} past the applied index {durable}"
        );
        let last = stores.log.last_index(5).unwrap();
        assert!(
            last >= 40 && first > 1,
            "{backend} raft={raft}: log [{first}, {last}]"
        );
        node.shutdown();
        drop(node);
        drop(stores);

        let stores = disk.open();
        assert!(
            first_log_index(&stores, 5) > 1,
            "{backend} raft={raft}: compaction persisted"
        );
        let node = start(stores);
        wait_leader(node.as_ref(), 5).await;
        let total = decode_counter(&node.propose(5, Bytes::new()).await.unwrap());
        assert_eq!(
            total, 41,
            "{backend} raft={raft}: the count resumes after a restart"
        );
        node.shutdown();
    }
}

/// A state flushed past the end of its log (a log that was not synced, or a crash while a
/// snapshot was installed) no longer stops the node at start: the log restarts after the
/// state's applied index, and writes go on from there, for raft and solo.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_ahead_of_its_log_starts_and_takes_writes() {
    for kind in ["raft", "solo"] {
        let dir = tempfile::tempdir().unwrap();
        let stores = Stores::open(&StoreConfig::new(BackendKind::Redb, dir.path())).unwrap();
        // The state says 44 entries applied; the log holds none of them.
        stores
            .state
            .commit(3, concord_storage::WriteSet::default(), 44)
            .unwrap();
        stores.state.flush().unwrap();
        assert_eq!(stores.log.last_index(3).unwrap(), 0);
        let node: Arc<dyn Consensus> = match kind {
            "raft" => start_raft(stores.clone(), vec![3]),
            _ => start_solo(stores.clone(), vec![3]),
        };
        wait_leader(node.as_ref(), 3).await;
        let total = node.propose(3, Bytes::new()).await.unwrap();
        assert_eq!(decode_counter(&total), 1, "{kind}");
        let status = node.status(3).unwrap();
        assert!(status.applied_index > 44, "{kind}: {status:?}");
        node.shutdown();
        // And it starts again from what it wrote.
        let node: Arc<dyn Consensus> = match kind {
            "raft" => start_raft(stores.clone(), vec![3]),
            _ => start_solo(stores.clone(), vec![3]),
        };
        wait_leader(node.as_ref(), 3).await;
        assert_eq!(
            decode_counter(&node.propose(3, Bytes::new()).await.unwrap()),
            2
        );
        node.shutdown();
    }
}

/// A member of a group with other voters whose log lost its term and vote while its state
/// kept its writes (the log's files lost) is refused at start: it could vote twice in a term.
/// The same log loss on a single voter restarts the log, and a member that joins a running
/// cluster (no configuration of its own, voting only once caught up) starts too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_log_forgot_its_vote_is_refused() {
    let lost_log = || {
        let state = Arc::new(concord_storage::MemStateStore::new());
        state
            .commit(3, concord_storage::WriteSet::default(), 44)
            .unwrap();
        Stores {
            log: Arc::new(concord_storage::MemLogStore::new()),
            state,
        }
    };
    let start = try_start_raft;
    let three_voters = fast_config(1, vec![1, 2, 3], vec![3]);
    let error = start(three_voters.clone(), lost_log())
        .map(|_| ())
        .expect_err("a member that forgot its vote started");
    assert!(
        matches!(
            error,
            StartError::LogLost {
                group: 3,
                applied_index: 44
            }
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("joining"), "{error}");

    let mut joining = three_voters;
    joining.catch_up_before_voting = true;
    start(joining, lost_log()).unwrap().shutdown();
    let alone = fast_config(1, vec![1], vec![3]);
    start(alone, lost_log()).unwrap().shutdown();
}

/// A state that has applied less than its log compacted away (its file lost, or an older copy
/// put back) is refused at start by raft and solo, naming the group and both indexes: raft-rs
/// would take the compaction point as applied and leave the entries before it out of the state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_behind_its_compacted_log_is_refused() {
    for raft in [true, false] {
        let stores = Stores {
            log: Arc::new(concord_storage::MemLogStore::new()),
            state: Arc::new(concord_storage::MemStateStore::new()),
        };
        let node: Arc<dyn Consensus> = if raft {
            start_raft(stores.clone(), vec![5])
        } else {
            start_solo(stores.clone(), vec![5])
        };
        wait_leader(node.as_ref(), 5).await;
        for _ in 0..40 {
            node.propose(5, Bytes::new()).await.unwrap();
        }
        wait_compacted(&stores, 5).await;
        node.shutdown();
        // Read once the node stopped: compaction may go on until then.
        let compacted = stores.log.group_state(5).unwrap().truncated_index;

        let lost_state = Stores {
            log: stores.log.clone(),
            state: Arc::new(concord_storage::MemStateStore::new()),
        };
        let config = fast_config(1, vec![1], vec![5]);
        let started = if raft {
            try_start_raft(config, lost_state).map(|_| ())
        } else {
            SoloNode::start(config, lost_state, counter_factory()).map(|_| ())
        };
        let error = started.expect_err("a state behind the log's compaction point opened");
        let message = error.to_string();
        match error {
            StartError::StateBehindLog {
                group: 5,
                applied_index: 0,
                log_compacted_index,
            } => assert_eq!(log_compacted_index, compacted, "raft={raft}"),
            other => panic!("raft={raft}: {other:?}"),
        }
        assert!(
            message.contains("group 5") && message.contains("snapshot"),
            "raft={raft}: {message}"
        );
    }
}

/// A state flush runs beside the apply thread: while one is held (a slow disk), writes are
/// still applied and answered, and the log is not compacted past what was flushed before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_are_answered_while_a_state_flush_is_held() {
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel();
    // A disk slow to sync: once the gate is set, the next flush waits at it.
    type Gate = (std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>);
    let gate: Arc<parking_lot::Mutex<Option<Gate>>> = Arc::default();
    let flush_gate = Arc::clone(&gate);
    let state = HookedState::new(Box::new(move |call| {
        let held = (call == StateCall::Flush).then(|| flush_gate.lock().take());
        if let Some(Some((entered, released))) = held {
            let _ = entered.send(());
            let _ = released.recv();
        }
        Ok(())
    }));
    let stores = Stores {
        log: Arc::new(concord_storage::MemLogStore::new()),
        state: Arc::new(state),
    };
    let node = start_raft(stores.clone(), vec![0]);
    wait_leader(node.as_ref(), 0).await;
    for _ in 0..10 {
        node.propose(0, Bytes::new()).await.unwrap();
    }
    *gate.lock() = Some((entered_tx, released));
    // The next flush (every 50 ms while there is something to flush) stops at the gate.
    node.propose(0, Bytes::new()).await.unwrap();
    tokio::task::spawn_blocking(move || entered.recv_timeout(Duration::from_secs(5)))
        .await
        .unwrap()
        .expect("a flush started");
    // The flush held was asked for with indexes no later than those applied now.
    let applied_at_gate = node.status(0).unwrap().applied_index;
    let answered = tokio::time::timeout(Duration::from_secs(5), async {
        let mut total = 0;
        for _ in 0..30 {
            total = decode_counter(&node.propose(0, Bytes::new()).await.unwrap());
        }
        total
    })
    .await
    .expect("writes were answered while the flush was held");
    assert_eq!(answered, 41);
    // Nothing flushed since the gate: the log keeps what a restart would replay.
    assert!(first_log_index(&stores, 0) <= applied_at_gate + 1);
    release.send(()).unwrap();
    wait_compacted_past(&stores, 0, applied_at_gate + 1).await;
    node.shutdown();
}

/// A state store holding half its pending limit in memory is flushed at once, on the flusher's
/// thread, not when the flush interval is up (here an hour) nor by a commit that reached the
/// limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_holding_much_in_memory_is_flushed_before_its_interval() {
    const PENDING_LIMIT_BYTES: usize = 64 * 1024;
    let flushes_beneath = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let flushes = Arc::clone(&flushes_beneath);
    let beneath = HookedState::new(Box::new(move |call| {
        if call == StateCall::Flush {
            flushes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(())
    }));
    let state = Arc::new(WriteBackStateStore::with_pending_limit(
        beneath,
        PENDING_LIMIT_BYTES,
    ));
    let stores = Stores {
        log: Arc::new(concord_storage::MemLogStore::new()),
        state: state.clone(),
    };
    let mut config = fast_config(1, vec![1], vec![5]);
    config.state_flush_interval = Duration::from_secs(3600);
    let network = InProcessNetwork::new();
    let node = RaftNode::start(
        config,
        stores,
        Arc::new(|_g: GroupId| Box::new(KvStateMachine) as Box<dyn StateMachine>),
        network.transport(1),
    )
    .unwrap();
    wait_leader(node.as_ref(), 5).await;
    // Puts of new keys, 1 KiB each, until the new layer holds half the limit; the whole limit
    // is never reached, so no commit flushes on the apply thread.
    let mut n = 0;
    while !state.wants_flush() && flushes_beneath.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        let put = KvCommand::Put {
            key: format!("key-{n:05}").into_bytes(),
            value: vec![b'v'; 1024],
        };
        node.propose(5, put.encode()).await.unwrap();
        n += 1;
        assert!(n < 64, "the store never wanted a flush after {n} puts");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while flushes_beneath.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no flush within 5 s of the store holding half its limit"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!state.wants_flush());
    node.shutdown();
}

/// A memory state holds each commit as durably as a flush would: the log is compacted behind
/// the applied index without waiting for one (here never: the interval is an hour), instead of
/// holding every entry since the last flush in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_state_lets_the_log_compact_without_a_flush() {
    let stores = Stores {
        log: Arc::new(concord_storage::MemLogStore::new()),
        state: Arc::new(concord_storage::MemStateStore::new()),
    };
    let mut config = fast_config(1, vec![1], vec![5]);
    config.state_flush_interval = Duration::from_secs(3600);
    let node = start_raft_with(config, stores.clone());
    wait_leader(node.as_ref(), 5).await;
    for i in 1..=40 {
        let total = decode_counter(&node.propose(5, Bytes::new()).await.unwrap());
        assert_eq!(total, i);
    }
    // Compaction keeps four entries and goes in steps of at least four.
    wait_compacted_past(&stores, 5, 30).await;
    node.shutdown();
}

/// Waits until `group`'s log on `stores` was compacted past `index`.
async fn wait_compacted_past(stores: &Stores, group: GroupId, index: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while first_log_index(stores, group) <= index {
        assert!(
            std::time::Instant::now() < deadline,
            "group {group}'s log was not compacted past {index} within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A single voter's committed entries come back to raft from the round that wrote them, not
/// from a read of the log store: forty commands, one round each, and hardly a read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_voter_reads_its_committed_entries_without_the_log_store() {
    let log = HookedLog::new(Box::new(|batch, inner| inner.write(batch)));
    let entry_reads = log.entry_reads.clone();
    let stores = Stores {
        log: Arc::new(log),
        state: Arc::new(concord_storage::MemStateStore::new()),
    };
    let node = start_raft(stores, vec![5]);
    wait_leader(node.as_ref(), 5).await;
    let reads_before = entry_reads.load(std::sync::atomic::Ordering::Relaxed);
    for i in 1..=40 {
        let total = decode_counter(&node.propose(5, Bytes::new()).await.unwrap());
        assert_eq!(total, i);
    }
    let reads = entry_reads.load(std::sync::atomic::Ordering::Relaxed) - reads_before;
    assert!(reads < 10, "{reads} reads of the log store for 40 rounds");
    node.shutdown();
}
