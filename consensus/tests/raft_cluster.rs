//! Three raft nodes in one process: election, replication, failover, catch-up, faults.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Cluster, HookedLog, counter_on, decode_counter, first_log_index, wait_compacted};
use concord_consensus::transport::FaultConfig;
use concord_consensus::{Consensus, NodeConfig, NodeId, ProposeError};
use concord_storage::raft::prelude::MessageType;
use concord_storage::testing::{HookedState, StateCall};
use concord_storage::{BackendKind, GroupId, LogBatch, LogStore, Stores};

/// All nodes converge on the same counter, and each caller got its own running total.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_elect_a_leader_and_replicate() {
    let cluster = Cluster::reliable(3, vec![1, 2], BackendKind::Memory);
    for group in [1, 2] {
        for expected in 1..=20 {
            let total = decode_counter(&cluster.propose(group, Bytes::new()).await);
            assert_eq!(total, expected);
        }
        cluster.wait_caught_up_with_leader(group).await;
        for node in 1..=3 {
            assert_eq!(
                counter_on(&cluster, node, group),
                20,
                "node {node} group {group}"
            );
        }
    }
}

/// Many concurrent callers: each gets a distinct total and none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_proposals_each_get_their_own_result() {
    let cluster = std::sync::Arc::new(Cluster::reliable(3, vec![7], BackendKind::Memory));
    let leader = cluster.leader(7).await;
    let node = cluster.node(leader).clone();
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let node = node.clone();
        tasks.push(tokio::spawn(async move {
            decode_counter(&node.propose(7, Bytes::new()).await.unwrap())
        }));
    }
    let mut totals = Vec::new();
    for task in tasks {
        totals.push(task.await.unwrap());
    }
    totals.sort_unstable();
    assert_eq!(totals, (1..=200).collect::<Vec<i64>>());
}

/// A follower forwards proposals and reads to the leader: each caller gets its own result
/// from the follower's apply, and a read on the follower sees every write before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_forwards_proposals_and_reads_to_the_leader() {
    let cluster = std::sync::Arc::new(Cluster::reliable(3, vec![1], BackendKind::Memory));
    cluster.propose(1, Bytes::new()).await;
    let leader = cluster.leader(1).await;
    let follower = (1..=3).find(|&n| n != leader).unwrap();
    // The follower learns the leader from its first append or heartbeat.
    let deadline = Instant::now() + Duration::from_secs(5);
    let first = loop {
        match cluster.node(follower).propose(1, Bytes::new()).await {
            Ok(total) => break decode_counter(&total),
            Err(ProposeError::NotLeader { leader: None, .. }) => {}
            other => panic!("the follower did not forward: {other:?}"),
        }
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(first, 2, "the follower's caller got its own running total");
    // Concurrent callers on the follower each get a distinct total, as on the leader.
    let node = cluster.node(follower).clone();
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let node = node.clone();
            tokio::spawn(
                async move { decode_counter(&node.propose(1, Bytes::new()).await.unwrap()) },
            )
        })
        .collect();
    let mut totals = Vec::new();
    for task in tasks {
        totals.push(task.await.unwrap());
    }
    totals.sort_unstable();
    assert_eq!(totals, (3..=102).collect::<Vec<i64>>());
    // A batch on the follower is forwarded in its order, each command answered with its own
    // total.
    let batch = node.propose_batch(1, vec![Bytes::new(); 50]).await.unwrap();
    let batch_totals: Vec<i64> = batch
        .iter()
        .map(|t| decode_counter(t.as_ref().unwrap()))
        .collect();
    assert_eq!(batch_totals, (103..=152).collect::<Vec<i64>>());
    // A write through the leader, then a read barrier on the other follower: it sees it.
    let total = decode_counter(&cluster.node(leader).propose(1, Bytes::new()).await.unwrap());
    assert_eq!(total, 153);
    let other = (1..=3).find(|&n| n != leader && n != follower).unwrap();
    let applied = cluster.node(other).read_barrier(1).await.unwrap();
    assert!(applied >= cluster.node(leader).status(1).unwrap().applied_index);
    assert_eq!(counter_on(&cluster, other, 1), 153);
}

/// The leader stops; a new one is elected; nothing acknowledged is lost and writes go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_failover_keeps_every_acknowledged_write() {
    let mut cluster = Cluster::reliable(3, vec![1], BackendKind::Memory);
    for expected in 1..=10 {
        assert_eq!(
            decode_counter(&cluster.propose(1, Bytes::new()).await),
            expected
        );
    }
    let old_leader = cluster.leader(1).await;
    cluster.stop_node(old_leader);
    let new_leader = cluster.leader(1).await;
    assert_ne!(new_leader, old_leader);
    for expected in 11..=15 {
        assert_eq!(
            decode_counter(&cluster.propose(1, Bytes::new()).await),
            expected
        );
    }
    // The surviving follower forwards to the new leader at once.
    let survivor = (1..=3)
        .find(|&n| n != old_leader && n != new_leader)
        .unwrap();
    for expected in 16..=20 {
        let answer = tokio::time::timeout(
            Duration::from_secs(3),
            cluster.node(survivor).propose(1, Bytes::new()),
        )
        .await
        .expect("the follower answers within 3 s");
        assert_eq!(decode_counter(&answer.unwrap()), expected);
    }
    // The old leader comes back as a follower and catches up.
    cluster.start_node(old_leader);
    let applied = cluster.node(new_leader).status(1).unwrap().applied_index;
    cluster.wait_applied(1, applied).await;
    for node in 1..=3 {
        assert_eq!(counter_on(&cluster, node, 1), 20, "node {node}");
    }
}

/// A follower down during writes restarts from its redb directory and catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_follower_catches_up_from_disk() {
    let mut cluster = Cluster::reliable(3, vec![1, 2], BackendKind::Redb);
    cluster.propose(1, Bytes::new()).await;
    let leader = cluster.leader(1).await;
    let follower = (1..=3).find(|&n| n != leader).unwrap();
    cluster.stop_node(follower);
    for _ in 0..30 {
        cluster.propose(1, Bytes::new()).await;
        cluster.propose(2, Bytes::new()).await;
    }
    cluster.start_node(follower);
    for group in [1, 2] {
        let leader = cluster.leader(group).await;
        let applied = cluster.node(leader).status(group).unwrap().applied_index;
        cluster.wait_applied(group, applied).await;
    }
    assert_eq!(counter_on(&cluster, follower, 1), 31);
    assert_eq!(counter_on(&cluster, follower, 2), 30);
}

/// Every node compacts its log; while a follower is down but not far behind (within
/// `snapshot_lag_entries`), the leader keeps every entry the follower still needs, and the
/// follower catches up from the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_keeps_what_a_follower_that_is_down_needs() {
    let mut cluster = Cluster::reliable(3, vec![1], BackendKind::Memory);
    for _ in 0..20 {
        cluster.propose(1, Bytes::new()).await;
    }
    for node in 1..=3 {
        wait_compacted(&cluster.stores[&node], 1).await;
    }
    let leader = cluster.leader(1).await;
    let follower = (1..=3).find(|&n| n != leader).unwrap();
    let follower_stores = cluster.stores[&follower].clone();
    let follower_last = follower_stores.log.last_index(1).unwrap();
    cluster.stop_node(follower);
    for _ in 0..40 {
        cluster.propose(1, Bytes::new()).await;
    }
    // Several flush intervals and ticks: time enough to compact if it were allowed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let leader_first = first_log_index(&cluster.stores[&leader], 1);
    assert!(
        leader_first <= follower_last + 1,
        "the leader compacted to {leader_first}, past the down follower's last entry {follower_last}"
    );
    cluster.start_node(follower);
    let applied = cluster.node(leader).status(1).unwrap().applied_index;
    cluster.wait_applied(1, applied).await;
    assert_eq!(counter_on(&cluster, follower, 1), 60);
}

/// A follower down during writes, then the leader lost: the other follower becomes leader and
/// must still hold every entry the returning follower lacks (it is within
/// `snapshot_lag_entries`). Followers compact no further than what the leader said every
/// voter that keeps up has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_keeps_what_another_voter_lacks_for_when_it_leads() {
    let mut cluster = Cluster::reliable(3, vec![1], BackendKind::Memory);
    cluster.propose(1, Bytes::new()).await;
    let leader = cluster.leader(1).await;
    let down = (1..=3).find(|&n| n != leader).unwrap();
    let other = (1..=3).find(|&n| n != leader && n != down).unwrap();
    let down_stores = cluster.stores[&down].clone();
    cluster.stop_node(down);
    for _ in 0..40 {
        cluster.propose(1, Bytes::new()).await;
    }
    // Several flush intervals and ticks: time enough to compact if it were allowed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let down_last = down_stores.log.last_index(1).unwrap();
    let other_first = first_log_index(&cluster.stores[&other], 1);
    assert!(
        other_first <= down_last + 1,
        "the follower compacted to {other_first}, past the down voter's last entry {down_last}"
    );
    cluster.stop_node(leader);
    cluster.start_node(down);
    // Only `other` can win (its log is longer); it must bring `down` up to date.
    assert_eq!(decode_counter(&cluster.propose(1, Bytes::new()).await), 42);
    let applied = cluster.node(other).status(1).unwrap().applied_index;
    cluster.wait_applied(1, applied).await;
    assert_eq!(counter_on(&cluster, down, 1), 42);
}

/// Every node stops and restarts from its stores; the groups resume where they were.
async fn whole_cluster_restarts(backend: BackendKind) {
    let mut cluster = Cluster::reliable(3, vec![1], backend);
    for _ in 0..10 {
        cluster.propose(1, Bytes::new()).await;
    }
    for node in 1..=3 {
        cluster.stop_node(node);
    }
    for node in 1..=3 {
        cluster.start_node(node);
    }
    assert_eq!(decode_counter(&cluster.propose(1, Bytes::new()).await), 11);
    let leader = cluster.leader(1).await;
    let applied = cluster.node(leader).status(1).unwrap().applied_index;
    cluster.wait_applied(1, applied).await;
    for node in 1..=3 {
        let status = cluster.node(node).status(1).unwrap();
        let applied = cluster.stores[&node].state.applied_index(1).unwrap();
        assert_eq!(
            counter_on(&cluster, node, 1),
            11,
            "{backend} node {node} {status:?} store applied {applied}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_cluster_restarts_on_memory() {
    whole_cluster_restarts(BackendKind::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_cluster_restarts_on_redb() {
    whole_cluster_restarts(BackendKind::Redb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_cluster_restarts_on_sled() {
    whole_cluster_restarts(BackendKind::Sled).await;
}

/// Lost, delayed and reordered messages slow the cluster down but lose nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_survive_a_lossy_reordering_network() {
    let seed = common::network_seed(7);
    let cluster = Cluster::start(
        3,
        vec![1],
        BackendKind::Memory,
        FaultConfig {
            seed,
            drop_probability: 0.05,
            max_delay: Duration::from_millis(5),
        },
    );
    for expected in 1..=40 {
        assert_eq!(
            decode_counter(&cluster.propose(1, Bytes::new()).await),
            expected
        );
    }
    let leader = cluster.leader(1).await;
    let applied = cluster.node(leader).status(1).unwrap().applied_index;
    cluster.wait_applied(1, applied).await;
    for node in 1..=3 {
        assert_eq!(counter_on(&cluster, node, 1), 40, "node {node}");
    }
}

/// A partitioned leader is replaced; after the partition heals it follows and catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_leader_is_replaced_and_catches_up() {
    let cluster = Cluster::reliable(3, vec![1], BackendKind::Memory);
    for _ in 0..5 {
        cluster.propose(1, Bytes::new()).await;
    }
    let old_leader = cluster.leader(1).await;
    cluster.network.isolate(old_leader, &[1, 2, 3]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let new_leader = loop {
        let leaders: Vec<u64> = (1..=3)
            .filter(|&n| n != old_leader && cluster.node(n).status(1).unwrap().is_leader)
            .collect();
        if let Some(&leader) = leaders.first() {
            break leader;
        }
        assert!(
            Instant::now() < deadline,
            "no new leader behind the partition"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let total = cluster
        .node(new_leader)
        .propose(1, Bytes::new())
        .await
        .unwrap();
    assert_eq!(decode_counter(&total), 6);
    cluster.network.heal();
    let applied = cluster.node(new_leader).status(1).unwrap().applied_index;
    cluster.wait_applied(1, applied).await;
    assert_eq!(counter_on(&cluster, old_leader, 1), 6);
    assert!(!cluster.node(old_leader).status(1).unwrap().is_leader);
}

/// A leader that cannot reach a quorum answers `Timeout` after the proposal timeout, for the
/// entry in flight and for commands still queued: no caller waits forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proposal_without_a_quorum_times_out() {
    let mut cluster = Cluster::reliable(3, vec![1], BackendKind::Memory);
    cluster.tweak = |config| {
        config.check_quorum = false; // stay leader while alone
        config.proposal_timeout = Duration::from_millis(300);
    };
    for node in 1..=3 {
        cluster.stop_node(node);
        cluster.start_node(node);
    }
    cluster.propose(1, Bytes::new()).await;
    let leader = cluster.leader(1).await;
    cluster.network.isolate(leader, &[1, 2, 3]);
    let started = Instant::now();
    // The first proposal becomes the entry in flight; the second waits in the queue behind
    // it. Both must be answered.
    let first = cluster.node(leader).propose(1, Bytes::new());
    let second = cluster.node(leader).propose(1, Bytes::new());
    let wait = |pending| tokio::time::timeout(Duration::from_secs(5), pending);
    let (first, second) = (wait(first).await, wait(second).await);
    for result in [first, second] {
        let result = result.expect("a proposal was never answered");
        assert!(
            matches!(result, Err(ProposeError::Timeout { .. })),
            "{result:?}"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(3));
}

/// A read barrier whose request to the leader was lost is asked again once it has waited an
/// election timeout — though its group went idle meanwhile — and completes long before the
/// proposal timeout would answer it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_whose_request_was_lost_is_asked_again() {
    let cluster = Cluster::reliable(3, vec![1], BackendKind::Memory);
    cluster.propose(1, Bytes::new()).await;
    let leader = cluster.leader(1).await;
    let follower = (1..=3).find(|&n| n != leader).unwrap();
    cluster.wait_caught_up_with_leader(1).await;
    // The follower still hears the leader (it stays a follower of it), but its read request
    // never arrives.
    cluster.network.cut_one_way(follower, leader);
    let term = cluster.node(follower).status(1).unwrap().term;
    let read = tokio::spawn(cluster.node(follower).read_barrier(1));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // An election meanwhile (a machine too slow for the 20 ms heartbeats) may make the
    // follower a leader, which reads through its own quorum: then there is nothing to see.
    if cluster.node(follower).status(1).unwrap().term != term {
        println!("an election during the test: the read's request is not lost any more");
        return;
    }
    assert!(
        !read.is_finished(),
        "a read whose request was lost completed"
    );
    cluster.network.heal();
    // The proposal timeout is 5 s: only a read asked again completes within 3.
    let applied = tokio::time::timeout(Duration::from_secs(3), read)
        .await
        .expect("the read was never asked again")
        .unwrap()
        .unwrap();
    assert!(applied >= 1);
}

/// A message raft would assert on (a commit index past the log) stops that group only, and
/// misaddressed messages are dropped: the node keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_messages_never_crash_the_node() {
    use concord_consensus::GroupMessage;
    use concord_storage::raft::prelude::{Message, MessageType};

    let cluster = Cluster::reliable(3, vec![1, 2], BackendKind::Memory);
    cluster.propose(1, Bytes::new()).await;
    cluster.propose(2, Bytes::new()).await;
    let leader = cluster.leader(1).await;
    let follower = (1..=3).find(|&n| n != leader).unwrap();
    let term = cluster.node(follower).status(1).unwrap().term;
    let mut misaddressed = Message::default();
    misaddressed.set_msg_type(MessageType::MsgHeartbeat);
    misaddressed.from = 99;
    misaddressed.to = follower;
    let mut impossible_commit = Message::default();
    impossible_commit.set_msg_type(MessageType::MsgHeartbeat);
    impossible_commit.from = leader;
    impossible_commit.to = follower;
    impossible_commit.term = term;
    impossible_commit.commit = 1_000_000;
    let sink = cluster.node(follower).sink().upgrade().unwrap();
    sink.deliver(
        leader,
        vec![
            GroupMessage {
                group: 1,
                message: misaddressed,
                replicated_floor: 0,
            },
            GroupMessage {
                group: 1,
                message: impossible_commit,
                replicated_floor: 0,
            },
            GroupMessage {
                group: 999,
                message: Message::default(),
                replicated_floor: 0,
            },
        ],
    );
    // Group 2 on the follower keeps replicating.
    cluster.propose(2, Bytes::new()).await;
    let applied = cluster
        .node(cluster.leader(2).await)
        .status(2)
        .unwrap()
        .applied_index;
    cluster.wait_applied(2, applied).await;
    assert_eq!(counter_on(&cluster, follower, 2), 2);
}

/// How many of `groups` each node leads, by node id.
fn leaderships(cluster: &Cluster, groups: &[u64]) -> Vec<usize> {
    leaderships_of(cluster, &[1, 2, 3], groups)
}

/// Waits up to 5 s until nodes 1, 2 and 3 lead `expected` of `groups` each.
async fn wait_balanced(cluster: &Cluster, groups: &[u64], expected: [usize; 3], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while leaderships(cluster, groups) != expected {
        assert!(
            Instant::now() < deadline,
            "{what}: leaderships per node stayed {:?}",
            leaderships(cluster, groups)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits up to 5 s until `node` leads `group`.
async fn wait_taken_over(cluster: &Cluster, node: NodeId, group: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cluster.node(node).status(group).unwrap().is_leader {
        assert!(
            Instant::now() < deadline,
            "node {node} never took over group {group}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// How many of `groups` each of `nodes` leads.
fn leaderships_of(cluster: &Cluster, nodes: &[NodeId], groups: &[u64]) -> Vec<usize> {
    (nodes.iter())
        .map(|&node| {
            groups
                .iter()
                .filter(|&&group| cluster.node(node).status(group).unwrap().is_leader)
                .count()
        })
        .collect()
}

/// Forty-eight groups all led by node 1 spread out to sixteen per node, without a request, in
/// a few balance intervals: a node hands its whole excess over at once, not one group per
/// interval (which would take 32 intervals, 16 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaderships_spread_evenly_over_the_voters() {
    let groups: Vec<u64> = (0..48).collect();
    let cluster = Cluster::reliable_tweaked(3, groups.clone(), BackendKind::Memory, |config| {
        config.leader_balance_interval = Some(Duration::from_millis(500));
    });
    for &group in &groups {
        cluster.node(1).campaign(group).unwrap();
    }
    let elected_deadline = Instant::now() + Duration::from_secs(5);
    while leaderships(&cluster, &groups).iter().sum::<usize>() < 48 {
        assert!(
            Instant::now() < elected_deadline,
            "not every group elected a leader"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while leaderships(&cluster, &groups) != [16, 16, 16] {
        assert!(
            Instant::now() < deadline,
            "leaderships per node stayed {:?}",
            leaderships(&cluster, &groups)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Balanced, they stay: writes go on through every leader.
    for &group in &groups {
        assert_eq!(
            decode_counter(&cluster.propose(group, Bytes::new()).await),
            1
        );
    }
}

/// An operator's transfer stands: the voter it lands on then leads a group above its share,
/// and its balance hands over a group it has led longer, not group 0 (the lowest id, the first
/// group the balance would otherwise look at).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_balance_does_not_undo_an_operators_transfer() {
    let groups: Vec<u64> = (0..6).collect();
    let cluster = Cluster::reliable_tweaked(3, groups.clone(), BackendKind::Memory, |config| {
        config.leader_balance_interval = Some(Duration::from_millis(200));
    });
    for &group in &groups {
        cluster.node(1).campaign(group).unwrap();
    }
    wait_balanced(&cluster, &groups, [2, 2, 2], "at the start").await;
    let leader = cluster.leader(0).await;
    let target = (1..=3).find(|&n| n != leader).unwrap();
    cluster.node(leader).transfer_leader(0, target).unwrap();
    wait_taken_over(&cluster, target, 0).await;
    // The balance of a worker woken by the move runs at once, before group 0's new leader
    // has heard from the voter it left: it hands another group on. A second move to the same
    // node makes it give one away again, now with group 0 settled: a write, then reads, each
    // a heartbeat round, keep the voter group 0 left active and caught up in raft-rs's eyes.
    cluster.propose(0, Bytes::new()).await;
    wait_balanced(&cluster, &groups, [2, 2, 2], "after the first transfer").await;
    let reader = {
        let node = cluster.node(target).clone();
        tokio::spawn(async move {
            loop {
                node.read_barrier(0).await.unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = (1..6)
        .find(|&group| !cluster.node(target).status(group).unwrap().is_leader)
        .unwrap();
    let its_leader = cluster.leader(second).await;
    cluster
        .node(its_leader)
        .transfer_leader(second, target)
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    reader.abort();
    wait_balanced(&cluster, &groups, [2, 2, 2], "after the second transfer").await;
    assert!(
        cluster.node(target).status(0).unwrap().is_leader,
        "the balance moved group 0 away from node {target}, where the operator put it"
    );
}

/// With a balance interval that is a multiple of the election timeout (as the defaults
/// are), a group whose leadership began at one of a node's balances has its quorum checked
/// (which clears raft-rs's "recently active" marks) in the tick of every later balance of
/// that node. A balance that looked after that tick's check would never find such a group
/// movable, and would give away the group an operator just moved instead of the one led
/// longest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_balance_in_step_with_the_quorum_checks_keeps_an_operators_transfer() {
    // `fast_config`'s heartbeat (every 2 ticks) leaves in the tick of each check.
    balance_in_step_with_the_quorum_checks(|config| {
        config.leader_balance_interval = Some(Duration::from_millis(100));
    })
    .await;
}

/// The same when the heartbeat that refills the marks leaves ticks after each check (an
/// election timeout of 10 ticks, a heartbeat every 3): a balance before the tick still falls
/// between a check and that heartbeat, so activity is also read from the heartbeats the
/// voters answered within the election timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_balance_in_step_with_the_checks_keeps_a_transfer_whatever_the_heartbeat() {
    balance_in_step_with_the_quorum_checks(|config| {
        config.leader_balance_interval = Some(Duration::from_millis(100));
        config.heartbeat_ticks = 3;
    })
    .await;
}

/// Three groups balanced one per node, with balances every election timeout (`tweak`
/// sets them: 100 ms, `fast_config`'s 10 ticks of 10 ms): an operator's transfer stands
/// through five more balances.
async fn balance_in_step_with_the_quorum_checks(tweak: fn(&mut NodeConfig)) {
    let groups: Vec<u64> = (0..3).collect();
    let cluster = Cluster::reliable_tweaked(3, groups.clone(), BackendKind::Memory, tweak);
    for &group in &groups {
        cluster.node(1).campaign(group).unwrap();
    }
    // Node 1 hands a group each to nodes 2 and 3 at its first balance.
    wait_balanced(&cluster, &groups, [1, 1, 1], "at the start").await;
    let target = 2;
    let moved = (groups.iter().copied())
        .find(|&group| !cluster.node(target).status(group).unwrap().is_leader)
        .unwrap();
    let leader = cluster.leader(moved).await;
    cluster.node(leader).transfer_leader(moved, target).unwrap();
    wait_taken_over(&cluster, target, moved).await;
    wait_balanced(&cluster, &groups, [1, 1, 1], "after the transfer").await;
    // Five more balances of node 2.
    tokio::time::sleep(Duration::from_millis(500)).await;
    wait_balanced(
        &cluster,
        &groups,
        [1, 1, 1],
        "half a second after the transfer",
    )
    .await;
    assert!(
        cluster.node(target).status(moved).unwrap().is_leader,
        "the balance moved group {moved} away from node {target}, where the operator put it"
    );
}

/// A voter that crashed a moment ago still looks active and caught up to raft-rs, and it
/// leads the fewest groups: the balance must not hand it one (that group's writes would wait
/// for the transfer to give up, an election timeout later), only the voters still up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_balance_hands_no_group_to_a_voter_that_just_died() {
    let groups: Vec<u64> = (0..6).collect();
    let mut cluster = Cluster::reliable_tweaked(3, groups.clone(), BackendKind::Memory, |config| {
        config.election_ticks = 300;
        config.leader_balance_interval = Some(Duration::from_millis(200));
    });
    for &group in &groups {
        cluster.node(1).campaign(group).unwrap();
    }
    // Every voter acknowledged a write: raft-rs counts node 3 active and caught up.
    for &group in &groups {
        assert_eq!(
            decode_counter(&cluster.propose(group, Bytes::new()).await),
            1
        );
        cluster.wait_caught_up_with_leader(group).await;
    }
    cluster.stop_node(3);
    // Node 1 leads six, above its share of three among the two voters up: at its next
    // balance it gives its excess away. Node 3, down, leads the fewest, and the groups stay
    // idle meanwhile, so to raft-rs node 3 keeps looking caught up.
    let deadline = Instant::now() + Duration::from_secs(10);
    while leaderships_of(&cluster, &[1, 2], &groups) != [3, 3] {
        assert!(
            Instant::now() < deadline,
            "the two voters up never shared the groups: {:?}",
            leaderships_of(&cluster, &[1, 2], &groups)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // No group waits on a transfer to the dead node: each write is answered well within the
    // election timeout.
    for &group in &groups {
        let started = Instant::now();
        assert_eq!(
            decode_counter(&cluster.propose(group, Bytes::new()).await),
            2
        );
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "a write to group {group} took {took:?}: was it handed to the dead node?"
        );
    }
}

/// Three nodes with a 3 s election timeout and no leader balance, group 1 led by `leader`
/// with five writes applied.
async fn group_1_led_by(leader: NodeId) -> Cluster {
    let cluster = Cluster::reliable_tweaked(3, vec![1], BackendKind::Memory, |config| {
        config.election_ticks = 300;
        config.leader_balance_interval = None;
    });
    cluster.node(leader).campaign(1).unwrap();
    assert_eq!(cluster.leader(1).await, leader);
    for expected in 1..=5 {
        assert_eq!(
            decode_counter(&cluster.propose(1, Bytes::new()).await),
            expected
        );
    }
    cluster
}

/// A leader whose log fails the reads of the entries a returning follower lacks stops its
/// groups with the failed read named (raft-rs, which panics on a storage error while sending
/// an append, is told the entries are not there for now), and the others elect a leader and
/// keep every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_log_reads_fail_stops_and_the_others_go_on() {
    let log = Arc::new(HookedLog::new(Box::new(|batch, inner| inner.write(batch))));
    let stores = Stores {
        log: log.clone(),
        state: Arc::new(concord_storage::MemStateStore::new()),
    };
    let mut cluster = Cluster::reliable_on_stores(
        3,
        vec![1],
        |config| config.leader_balance_interval = None,
        [(1, stores)].into(),
    );
    cluster.node(1).campaign(1).unwrap();
    assert_eq!(cluster.leader(1).await, 1);
    cluster.propose(1, Bytes::new()).await;
    cluster.stop_node(3);
    // Entries node 3 lacks, read back from node 1's log when it returns.
    for _ in 0..20 {
        cluster.propose(1, Bytes::new()).await;
    }
    log.entry_reads_fail.store(true, Ordering::Relaxed);
    cluster.start_node(3);
    let reason = stopped_reason(&cluster, 1, "node 1 went on with its log failing reads").await;
    assert!(
        reason.starts_with("log read failed") && reason.contains("injected read failure"),
        "{reason}"
    );
    // Nodes 2 and 3 elect a leader; nothing acknowledged was lost.
    let total = decode_counter(&leader_of_two_proposes(&cluster).await);
    assert_eq!(total, 22);
}

/// Proposes one increment to group 1 through whichever of nodes 2 and 3 leads it.
async fn leader_of_two_proposes(cluster: &Cluster) -> Bytes {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        for node in [2, 3] {
            if let Ok(result) = cluster.node(node).propose(1, Bytes::new()).await {
                return result;
            }
        }
        assert!(
            Instant::now() < deadline,
            "nodes 2 and 3 never took a write"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A node that stops hands its leaderships over first: with a 3 s election timeout, the
/// group has a new leader well before an election could have made one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_leader_hands_over_without_an_election() {
    let mut cluster = group_1_led_by(1).await;
    // A graceful stop, the network still up (`stop_node` cuts the node off first, as a
    // crash would).
    let stopped_at = Instant::now();
    cluster.node(1).shutdown();
    cluster.stop_node(1);
    let successor = cluster.leader(1).await;
    assert!(
        stopped_at.elapsed() < Duration::from_secs(1),
        "a new leader took {:?}",
        stopped_at.elapsed()
    );
    assert_ne!(successor, 1);
    assert_eq!(decode_counter(&cluster.propose(1, Bytes::new()).await), 6);
}

/// A stopping node spreads its leaderships over the voters still up, instead of handing
/// them all to one: the rest of the cluster shares its load while it is away, and once back
/// it takes its share from every other node at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_leader_spreads_its_leaderships_over_the_others() {
    let groups: Vec<u64> = (0..6).collect();
    let mut cluster = Cluster::reliable_tweaked(3, groups.clone(), BackendKind::Memory, |config| {
        config.election_ticks = 300;
        config.leader_balance_interval = None;
    });
    for &group in &groups {
        cluster.node(1).campaign(group).unwrap();
    }
    for &group in &groups {
        assert_eq!(cluster.leader(group).await, 1);
        cluster.propose(group, Bytes::new()).await;
        cluster.wait_caught_up_with_leader(group).await;
    }
    cluster.node(1).shutdown();
    cluster.stop_node(1);
    let deadline = Instant::now() + Duration::from_secs(2);
    while leaderships_of(&cluster, &[2, 3], &groups)
        .iter()
        .sum::<usize>()
        < groups.len()
    {
        assert!(
            Instant::now() < deadline,
            "the groups were not all taken over"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(leaderships_of(&cluster, &[2, 3], &groups), [3, 3]);
}

/// Members stopped one after another: each hands its leaderships to a voter still up, not to
/// one that stopped a moment ago (raft-rs still counts it active, and it has the whole log),
/// and the last one, with nobody to hand to, does not wait for the transfers' timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_stopped_one_after_another_hand_over_to_the_living_and_the_last_waits_for_none() {
    let mut cluster = group_1_led_by(3).await;
    // Node 1 goes first. To node 3 it now looks as good a successor as node 2 (the lowest id
    // of the two, even): recently active, its log whole.
    cluster.stop_node(1);
    stops_within_a_second(&cluster, 3);
    cluster.stop_node(3);
    let deadline = Instant::now() + Duration::from_secs(1);
    let successor = common::leader_before(&cluster.nodes, 1, deadline).await;
    assert_eq!(successor, Some(2), "node 3 handed over to a stopped node");
    // The last member leads with nobody up to hand to.
    stops_within_a_second(&cluster, 2);
}

/// Stops `node` gracefully (the network still up) and checks that it took under a second:
/// a third of the election timeout `group_1_led_by` sets, which a hand-over that cannot
/// complete waits out.
fn stops_within_a_second(cluster: &Cluster, node: NodeId) {
    let stopping = Instant::now();
    cluster.node(node).shutdown();
    let took = stopping.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "node {node} took {took:?} to stop (the election timeout is 3 s)"
    );
}

/// The leader hands one group to a named voter on request; a follower refuses the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leadership_moves_to_the_voter_named() {
    let cluster = Cluster::reliable_tweaked(3, vec![4], BackendKind::Memory, |config| {
        config.leader_balance_interval = None;
    });
    cluster.propose(4, Bytes::new()).await;
    let leader = cluster.leader(4).await;
    let target = (1..=3).find(|&n| n != leader).unwrap();
    let other = (1..=3).find(|&n| n != leader && n != target).unwrap();
    assert!(matches!(
        cluster.node(other).transfer_leader(4, target),
        Err(ProposeError::NotLeader { .. })
    ));
    cluster.node(leader).transfer_leader(4, target).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cluster.node(target).status(4).unwrap().is_leader {
        assert!(Instant::now() < deadline, "node {target} never took over");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(decode_counter(&cluster.propose(4, Bytes::new()).await), 2);
}

/// A write forwarded to a leader that is then cut off is lost with it: once the new leader
/// commits, the follower answers `Dropped` (not applied, safe to retry) instead of waiting
/// for the proposal timeout, and the retry goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_lost_with_its_leader_is_answered_dropped() {
    let cluster = Cluster::reliable_tweaked(3, vec![1], BackendKind::Memory, |config| {
        config.proposal_timeout = Duration::from_secs(20);
    });
    cluster.propose(1, Bytes::new()).await;
    let old_leader = cluster.leader(1).await;
    let follower = (1..=3).find(|&n| n != old_leader).unwrap();
    cluster.network.isolate(old_leader, &[1, 2, 3]);
    let started = Instant::now();
    let answer = cluster.node(follower).propose(1, Bytes::new()).await;
    assert!(
        matches!(answer, Err(ProposeError::Dropped { .. })),
        "{answer:?} after {:?}",
        started.elapsed()
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let retried = cluster
        .node(follower)
        .propose(1, Bytes::new())
        .await
        .unwrap();
    assert_eq!(decode_counter(&retried), 2, "the lost write did not apply");
    cluster.network.heal();
}

/// Three nodes configured by `tweak`, node 1 leading group 1 after `writes` writes that every
/// node applied, handing its leadership to node 3, which cannot hear it. Node 3 holds the
/// whole log, so raft-rs sends it the hand-over's `MsgTimeoutNow` at once, and the message is
/// lost: the hand-over stays pending until node 1 gives it up, an election timeout later.
async fn handing_over_to_a_voter_that_cannot_hear(
    writes: i64,
    tweak: fn(&mut NodeConfig),
) -> Cluster {
    let cluster = Cluster::reliable_tweaked(3, vec![1], BackendKind::Memory, tweak);
    cluster.node(1).campaign(1).unwrap();
    assert_eq!(cluster.leader(1).await, 1);
    for expected in 1..=writes {
        assert_eq!(
            decode_counter(&cluster.propose(1, Bytes::new()).await),
            expected
        );
        cluster.wait_caught_up_with_leader(1).await;
    }
    cluster.network.cut_one_way(1, 3);
    cluster.node(1).transfer_leader(1, 3).unwrap();
    cluster
}

/// A write forwarded to a leader while it hands its leadership to a voter that never takes
/// it (here the voter cannot hear the leader; in a cluster, one still catching up refuses)
/// waits for the hand-over to give up and then applies: raft-rs drops a proposal that
/// reaches a leader mid-transfer, and the follower would otherwise hear nothing of it until
/// its proposal timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_forwarded_during_a_hand_over_that_fails_still_applies() {
    // The hand-over stays pending for an election timeout: 200 ms.
    let cluster = handing_over_to_a_voter_that_cannot_hear(3, |config| {
        config.election_ticks = 20;
        config.leader_balance_interval = None;
        config.proposal_timeout = Duration::from_secs(20);
    })
    .await;
    let started = Instant::now();
    let answer = cluster.node(2).propose(1, Bytes::new()).await;
    let took = started.elapsed();
    cluster.network.heal();
    assert_eq!(
        decode_counter(&answer.unwrap_or_else(|e| panic!("{e:?} after {took:?}"))),
        4
    );
    assert!(took < Duration::from_secs(10), "answered after {took:?}");
    assert_eq!(cluster.leader(1).await, 1, "the hand-over gave up");
}

/// A hand-over the leader gives up on bars its lease for the rest of its term: the successor
/// may still hold the `MsgTimeoutNow` and campaign with it, forced past its peers' quiet.
/// Here the message is lost; cut off just after giving up, the leader serves no lease read,
/// though a quorum answered its heartbeats a moment before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_given_up_bars_the_lease_for_the_rest_of_its_term() {
    let cluster = handing_over_to_a_voter_that_cannot_hear(1, |config| {
        config.election_ticks = 50;
        config.leader_balance_interval = None;
        config.proposal_timeout = Duration::from_secs(20);
    })
    .await;
    // A write reaching the leader mid-hand-over is stepped once it gives up (500 ms).
    let answer = cluster.node(2).propose(1, Bytes::new()).await;
    assert_eq!(decode_counter(&answer.unwrap()), 2);
    // Heartbeats go on meanwhile, and node 2 answers them.
    tokio::time::sleep(Duration::from_millis(100)).await;
    cluster.network.isolate(1, &[1, 2, 3]);
    let read = tokio::time::timeout(
        Duration::from_millis(300),
        cluster.node(1).lease_read_barrier(1),
    )
    .await;
    assert!(
        !matches!(read, Ok(Ok(_))),
        "served by a lease just after a hand-over was given up: {read:?}"
    );
    cluster.network.heal();
}

/// A leader that sent a `MsgTimeoutNow` serves no lease read for the rest of its term, even
/// once it gave the hand-over up: the message may arrive at any time later (a stalled
/// connection, a paused process), and its receiver then campaigns, forced past its peers'
/// quiet. Here it arrives after the leader gave up and waited 1.1 election timeouts more; the
/// successor wins with the third member's vote and takes a write while the old leader, cut
/// off, still has a quorum's recent answers to its heartbeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_that_arrives_late_finds_the_old_leader_without_a_lease() {
    let cluster = Cluster::reliable_tweaked(3, vec![1], BackendKind::Memory, |config| {
        // A 500 ms election timeout: a 441 ms lease, heartbeats every 20 ms.
        config.election_ticks = 50;
        config.leader_balance_interval = None;
        // Idle, the group would fall asleep: no heartbeats, so no lease to test.
        config.sleep_after_ticks = 0;
    });
    cluster.node(1).campaign(1).unwrap();
    assert_eq!(cluster.leader(1).await, 1);
    cluster.propose(1, Bytes::new()).await;
    cluster.wait_caught_up_with_leader(1).await;
    cluster
        .network
        .hold_one_way(1, 3, MessageType::MsgTimeoutNow);
    cluster.node(1).transfer_leader(1, 3).unwrap();
    // The hand-over gives up after an election timeout, and 1.1 more pass.
    tokio::time::sleep(Duration::from_millis(1_250)).await;
    assert!(
        cluster.node(1).status(1).unwrap().is_leader,
        "the hand-over gave up"
    );
    cluster.network.isolate(1, &[1, 2, 3]);
    assert_eq!(cluster.network.release(1, 3), 1, "one MsgTimeoutNow held");
    let elected_by = Instant::now() + Duration::from_millis(300);
    while !cluster.node(3).status(1).unwrap().is_leader {
        assert!(
            Instant::now() < elected_by,
            "node 3 never took the leadership"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let write = tokio::time::timeout(
        Duration::from_millis(200),
        cluster.node(3).propose(1, Bytes::new()),
    )
    .await;
    assert_eq!(decode_counter(&write.unwrap().unwrap()), 2);
    let read = tokio::time::timeout(
        Duration::from_millis(100),
        cluster.node(1).lease_read_barrier(1),
    )
    .await;
    cluster.network.heal();
    assert!(
        !matches!(read, Ok(Ok(_))),
        "a lease read on the old leader after its successor took a write: {read:?}"
    );
}

/// A follower whose log holds entries of an old term past the index of the snapshot it is
/// sent (a leader cut off appended them) crashes once the snapshot's state is in its state
/// store but before its log records the snapshot: the install was marked before the state
/// store took it, and restarted, the follower catches up and the mark is gone. Where the
/// leader's log starts right after the entries the two share (a leader whose own log restarted
/// after a snapshot there, as in chaos seed 266), raft took the old term's entries up to the
/// state for committed and the group stalled on that member; `recovery.rs`'s test builds that
/// state directly and checks the log restarts after the state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_a_snapshots_install_and_its_log_record_is_marked_and_repaired() {
    let refuse_snapshot_records = Arc::new(AtomicBool::new(false));
    let refusing = refuse_snapshot_records.clone();
    let log = HookedLog::new(Box::new(move |batch, inner| {
        let records_a_snapshot = (batch.ops().iter())
            .any(|(_, op)| matches!(op, concord_storage::LogOp::ApplySnapshot(_)));
        if records_a_snapshot && refusing.load(Ordering::Relaxed) {
            return Err(concord_storage::StorageError::Io {
                path: "failing-disk".into(),
                source: std::io::Error::other("injected: the process died here"),
            });
        }
        inner.write(batch)
    }));
    let stores = Stores {
        log: Arc::new(log),
        state: Arc::new(concord_storage::MemStateStore::new()),
    };
    let mut cluster = Cluster::reliable_on_stores(
        3,
        vec![1],
        |config| {
            config.snapshot_lag_entries = 8;
            config.leader_balance_interval = None;
            // Cut off, the leader stays one, appending entries nobody else takes.
            config.check_quorum = false;
            config.max_in_flight_entries = 1000;
        },
        [(1, stores)].into(),
    );
    cluster.node(1).campaign(1).unwrap();
    assert_eq!(cluster.leader(1).await, 1);
    cluster.propose(1, Bytes::new()).await;
    cluster.wait_caught_up_with_leader(1).await;
    let shared_end = cluster.stores[&1].log.last_index(1).unwrap();

    cluster.network.isolate(1, &[1, 2, 3]);
    let cut_off = cluster.node(1).clone();
    for _ in 0..200 {
        let node = cut_off.clone();
        tokio::spawn(async move { node.propose(1, Bytes::new()).await });
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let old_tail_end = cluster.stores[&1].log.last_index(1).unwrap();
    assert!(
        old_tail_end >= shared_end + 120,
        "node 1 appended only {} entries while cut off",
        old_tail_end - shared_end
    );

    // Nodes 2 and 3 go on without it and compact past what they share with it. Either may
    // have been elected meanwhile; node 2 is to lead.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut next_nudge = Instant::now();
    while !cluster.node(2).status(1).unwrap().is_leader {
        assert!(
            Instant::now() < deadline,
            "node 2 never took the leadership"
        );
        if Instant::now() >= next_nudge {
            // Refused while a lease runs or a transfer is under way: asked again later.
            let _ = if cluster.node(3).status(1).unwrap().is_leader {
                cluster.node(3).transfer_leader(1, 2)
            } else {
                cluster.node(2).campaign(1)
            };
            next_nudge = Instant::now() + Duration::from_millis(300);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    while first_log_index(&cluster.stores[&2], 1) <= shared_end + 1 {
        assert!(Instant::now() < deadline, "node 2 never compacted its log");
        write_through(&cluster, 2).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Back, node 1 is sent a snapshot. Its fetches fail at first; meanwhile the group writes
    // on, so the state it installs once they succeed is past the snapshot's index (and still
    // under its old entries). Its log then fails to record the snapshot, as a crash between
    // the two would leave it.
    refuse_snapshot_records.store(true, Ordering::Relaxed);
    cluster.network.heal();
    cluster.network.refuse_snapshots_from(2);
    cluster.network.refuse_snapshots_from(3);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cluster.node(1).status(1).unwrap().installing_snapshot {
        assert!(
            Instant::now() < deadline,
            "node 1 was never sent a snapshot"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Fewer writes than `snapshot_lag_entries`: the leader keeps its log from the snapshot's
    // index on for node 1.
    for _ in 0..3 {
        write_through(&cluster, 2).await;
    }
    cluster.network.heal();
    let reason = stopped_reason(&cluster, 1, "node 1 never failed to record a snapshot").await;
    assert!(reason.contains("injected"), "{reason}");
    let installed = cluster.stores[&1].state.applied_index(1).unwrap();
    let log = cluster.stores[&1].log.group_state(1).unwrap();
    assert!(
        installed > log.hard_state.commit && installed <= log.last_index,
        "the state installed at {installed} is not under the old term's entries (commit {}, \
         last {})",
        log.hard_state.commit,
        log.last_index
    );

    // The install was marked before the state store took it: a line `<group> <index>` of the
    // file of marks.
    let marks = cluster.dirs[&1]
        .path()
        .join("snapshots")
        .join("installing-log");
    let text = std::fs::read_to_string(&marks).unwrap_or_default();
    assert!(
        text.lines().any(|line| line.starts_with("1 ")),
        "no mark of the install in {}: {text:?}",
        marks.display()
    );

    // Restarted, it catches up and takes part.
    cluster.stop_node(1);
    refuse_snapshot_records.store(false, Ordering::Relaxed);
    cluster.start_node(1);
    let total = write_through(&cluster, 2).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while counter_on(&cluster, 1, 1) != total {
        assert!(
            Instant::now() < deadline,
            "node 1 stalled at {} (the others at {total}): {:?}",
            counter_on(&cluster, 1, 1),
            cluster.node(1).status(1).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let text = std::fs::read_to_string(&marks).unwrap_or_default();
    assert!(
        !text.lines().any(|line| line.starts_with("1 ")),
        "the mark outlived the start that repaired the log: {text:?}"
    );
    cluster.stop_node(3);
    assert_eq!(
        write_through(&cluster, 2).await,
        total + 1,
        "node 1 makes the quorum"
    );
}

/// Why group 1 stopped on `node`, once it has (within 10 s, else fails with `failure`).
async fn stopped_reason(cluster: &Cluster, node: NodeId, failure: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(reason) = cluster.node(node).status(1).unwrap().stopped {
            return reason;
        }
        assert!(Instant::now() < deadline, "{failure}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One write to group 1 through `node`, which leads it: the counter it made.
async fn write_through(cluster: &Cluster, node: NodeId) -> i64 {
    let answer = cluster.node(node).propose(1, Bytes::new()).await;
    decode_counter(&answer.unwrap_or_else(|error| panic!("node {node} refused a write: {error}")))
}

/// Writes to group 1 until `node`'s log starts past `index` (within 10 s, else fails with
/// `failure`).
async fn write_until_compacted_past(cluster: &Cluster, node: NodeId, index: u64, failure: &str) {
    write_until_group_compacted_past(cluster, node, 1, index, failure).await;
}

/// Writes to `group` until `node`'s log of it starts past `index` (within 10 s, else fails
/// with `failure`).
async fn write_until_group_compacted_past(
    cluster: &Cluster,
    node: NodeId,
    group: GroupId,
    index: u64,
    failure: &str,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while first_log_index(&cluster.stores[&node], group) <= index {
        assert!(Instant::now() < deadline, "{failure}");
        cluster.propose(group, Bytes::new()).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Stops `follower` and writes to group 1 through `leader` until the leader's log no longer
/// holds the entry after the follower's last: the follower will need a snapshot.
async fn stop_until_compacted_past(cluster: &mut Cluster, leader: NodeId, follower: NodeId) {
    let follower_last = cluster.stores[&follower].log.last_index(1).unwrap();
    cluster.stop_node(follower);
    write_until_compacted_past(
        cluster,
        leader,
        follower_last + 1,
        "the leader never compacted past the down follower",
    )
    .await;
}

/// A follower forwards a write to its leader, hears nothing back while the write commits and
/// the log is compacted past it, then takes the state from a snapshot that includes the write.
/// Its caller is told at once that the result is unknown here — not left waiting for the
/// timeout, and never told the write was dropped (it applied: a retry would apply it twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_write_a_snapshot_covers_is_answered_result_unknown() {
    let cluster = Cluster::reliable_tweaked(3, vec![1], BackendKind::Memory, |config| {
        config.snapshot_lag_entries = 8;
        config.leader_balance_interval = None;
        config.proposal_timeout = Duration::from_secs(20);
    });
    cluster.propose(1, Bytes::new()).await;
    let leader = cluster.leader(1).await;
    let follower = (1..=3).find(|&n| n != leader).unwrap();
    // The write goes through the leader the follower knows: it must have heard of it before
    // the leader's messages to it are cut (a quorum committed the first write without it).
    let deadline = Instant::now() + Duration::from_secs(5);
    while cluster.node(follower).status(1).unwrap().leader != leader {
        assert!(
            Instant::now() < deadline,
            "node {follower} never heard of its leader"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cluster.network.cut_one_way(leader, follower);
    // Read before the write starts: it may commit before a read that follows it.
    let before = counter_on(&cluster, leader, 1);
    let started = Instant::now();
    let forwarded = tokio::spawn({
        let node = cluster.node(follower).clone();
        async move { node.propose(1, Bytes::new()).await }
    });
    // The forwarded write commits on the leader and the other follower.
    let deadline = Instant::now() + Duration::from_secs(5);
    while counter_on(&cluster, leader, 1) == before {
        assert!(
            !forwarded.is_finished(),
            "the forwarded write was answered before it committed: {:?}",
            forwarded.await
        );
        assert!(
            Instant::now() < deadline,
            "the forwarded write never committed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let follower_last = cluster.stores[&follower].log.last_index(1).unwrap();
    write_until_compacted_past(
        &cluster,
        leader,
        follower_last + 1,
        "the leader never compacted past the follower",
    )
    .await;
    cluster.network.heal();
    let answer = tokio::time::timeout(Duration::from_secs(15), forwarded)
        .await
        .expect("the forwarded write is answered before its timeout")
        .unwrap();
    assert!(
        matches!(answer, Err(ProposeError::ResultUnknown { .. })),
        "{answer:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "answered after {:?}",
        started.elapsed()
    );
    let total = counter_on(&cluster, leader, 1);
    let applied = cluster.node(leader).status(1).unwrap().applied_index;
    cluster.wait_applied(1, applied).await;
    assert_eq!(counter_on(&cluster, follower, 1), total);
}

/// Three nodes of group 1 whose leaders send a snapshot to a voter 8 entries behind, after
/// one write: the cluster, the leader, a follower and the other follower.
async fn three_sending_snapshots_early(backend: BackendKind) -> (Cluster, NodeId, NodeId, NodeId) {
    let cluster = Cluster::reliable_tweaked(3, vec![1], backend, |config| {
        config.snapshot_lag_entries = 8;
        config.leader_balance_interval = None;
    });
    cluster.propose(1, Bytes::new()).await;
    let leader = cluster.leader(1).await;
    let follower = (1..=3).find(|&n| n != leader).unwrap();
    let other = (1..=3).find(|&n| n != leader && n != follower).unwrap();
    (cluster, leader, follower, other)
}

/// A follower down while its leader writes far past it: the log is compacted without waiting
/// for it, and when it returns it is sent a snapshot — the state streamed from the leader,
/// installed, then the log from there — and converges; the same for a follower whose data is
/// lost entirely.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_far_behind_or_without_data_catches_up_through_a_snapshot() {
    for backend in [BackendKind::Memory, BackendKind::Redb] {
        let (mut cluster, leader, follower, other) = three_sending_snapshots_early(backend).await;
        let follower_last = cluster.stores[&follower].log.last_index(1).unwrap();
        cluster.stop_node(follower);
        for _ in 0..60 {
            cluster.propose(1, Bytes::new()).await;
        }
        // The leader and the other follower compact without waiting for the one that is down.
        write_until_compacted_past(
            &cluster,
            leader,
            follower_last + 1,
            &format!("{backend:?}: the leader never compacted past the down follower"),
        )
        .await;
        cluster.start_node(follower);
        let total = counter_on(&cluster, leader, 1);
        let applied = cluster.node(leader).status(1).unwrap().applied_index;
        cluster.wait_applied(1, applied).await;
        assert_eq!(counter_on(&cluster, follower, 1), total, "{backend:?}");
        // The log records the snapshot in the worker round after the install.
        let deadline = Instant::now() + Duration::from_secs(5);
        while first_log_index(&cluster.stores[&follower], 1) <= follower_last + 1 {
            assert!(
                Instant::now() < deadline,
                "{backend:?}: the follower's log never restarted after a snapshot"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Writes go on, and the follower takes part: with the other follower down, the
        // leader needs it for a quorum.
        cluster.stop_node(other);
        let next = decode_counter(&cluster.propose(1, Bytes::new()).await);
        assert_eq!(next, total + 1, "{backend:?}");

        // Its data lost: it starts empty, catching up before it votes, and is sent a
        // snapshot again.
        cluster.start_node(other);
        cluster.stop_node(follower);
        cluster.tweak = |config| {
            config.snapshot_lag_entries = 8;
            config.leader_balance_interval = None;
            config.catch_up_before_voting = true;
        };
        match backend {
            BackendKind::Memory => {
                cluster.memory_stores.remove(&follower);
            }
            _ => {
                cluster.dirs.insert(follower, tempfile::tempdir().unwrap());
            }
        }
        // Nothing is written meanwhile: the leader believes the follower holds its whole log
        // and has nothing to send it; the follower must ask.
        cluster.start_node(follower);
        let total = counter_on(&cluster, leader, 1);
        let applied = cluster.node(leader).status(1).unwrap().applied_index;
        cluster.wait_applied(1, applied).await;
        assert_eq!(
            counter_on(&cluster, follower, 1),
            total,
            "{backend:?}, wiped"
        );
    }
}

/// A member started without its data votes for no one until it has applied what its leader
/// said was committed, and says so (`catching_up`) until then: started as a member joining a
/// running cluster, from its start; started as at its first start (an operator who lost a disk
/// and kept the flags), from the leader's first word of commits past its empty log. Before, it
/// looked caught up as soon as it knew the leader: its own log, empty, had nothing unapplied,
/// and no snapshot was being installed yet. An operator who waited for its readiness before
/// taking down another member could leave a group that elects no one (one member with the
/// data, the one without refusing its vote).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_without_its_data_is_catching_up_until_it_has_applied_the_leaders_commits() {
    for joining in [true, false] {
        let (mut cluster, leader, wiped, _) =
            three_sending_snapshots_early(BackendKind::Memory).await;
        write_until_compacted_past(&cluster, leader, 2, "the leader never compacted").await;
        cluster.stop_node(wiped);
        cluster.memory_stores.remove(&wiped);
        cluster
            .network
            .hold_one_way(leader, wiped, MessageType::MsgSnapshot);
        if joining {
            cluster.tweak = |config| {
                config.snapshot_lag_entries = 8;
                config.leader_balance_interval = None;
                config.catch_up_before_voting = true;
            };
        }
        cluster.start_node(wiped);
        let deadline = Instant::now() + Duration::from_secs(10);
        let health = loop {
            let health = cluster.node(wiped).health(1, wiped).unwrap();
            if health.leader == leader && health.catching_up {
                break health;
            }
            assert!(
                Instant::now() < deadline,
                "joining {joining}: node {wiped} never heard of the leader as catching up: \
                 {health:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        // What the readiness probe looked at before: all of it says "caught up".
        assert_eq!(health.apply_lag, 0, "joining {joining}: {health:?}");
        assert!(!health.installing_snapshot, "joining {joining}: {health:?}");

        // The leader sends the snapshot once the member has answered its first append, which
        // may come after the member first names it.
        let deadline = Instant::now() + Duration::from_secs(10);
        while cluster.network.held(leader, wiped) == 0 {
            assert!(
                Instant::now() < deadline,
                "joining {joining}: the leader never sent node {wiped} a snapshot"
            );
            assert!(
                cluster.node(wiped).health(1, wiped).unwrap().catching_up,
                "joining {joining}: caught up without the snapshot"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(cluster.network.release(leader, wiped) > 0);
        let applied = cluster.node(leader).status(1).unwrap().applied_index;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let status = cluster.node(wiped).status(1).unwrap();
            if status.applied_index >= applied && !status.catching_up {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "joining {joining}: never caught up: {status:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// The first snapshot restore on one node's state store, of whichever groups, held until
/// released (at most 20 s, so that a broken test ends); every group restored is counted. An
/// install thread restores together the states queued when it looks: the first restore may
/// hold more than one group.
struct HeldRestore {
    restores: Arc<AtomicU64>,
    first_restore_groups: Arc<AtomicU64>,
    released: Arc<AtomicBool>,
}

impl HeldRestore {
    /// Puts `node`'s state store (memory) behind the hold; `node` must be stopped.
    fn on(cluster: &mut Cluster, node: NodeId) -> HeldRestore {
        let held = HeldRestore {
            restores: Arc::new(AtomicU64::new(0)),
            first_restore_groups: Arc::new(AtomicU64::new(0)),
            released: Arc::new(AtomicBool::new(false)),
        };
        let (restores, first, released) = (
            held.restores.clone(),
            held.first_restore_groups.clone(),
            held.released.clone(),
        );
        let hook = Box::new(move |call| {
            if let StateCall::Restore { groups } = call
                && restores.fetch_add(groups as u64, Ordering::SeqCst) == 0
            {
                first.store(groups as u64, Ordering::SeqCst);
                let deadline = Instant::now() + Duration::from_secs(20);
                while !released.load(Ordering::SeqCst) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            Ok(())
        });
        let stores = cluster.memory_stores.get_mut(&node).unwrap();
        stores.state = Arc::new(HookedState::over(stores.state.clone(), hook));
        held
    }

    /// Waits until the first restore has begun.
    async fn begun(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.restores_begun() == 0 {
            assert!(Instant::now() < deadline, "no snapshot was ever installed");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Groups whose restore has begun so far, the held ones included.
    fn restores_begun(&self) -> u64 {
        self.restores.load(Ordering::SeqCst)
    }

    /// Groups the first (held) restore holds.
    fn first_restore_groups(&self) -> u64 {
        self.first_restore_groups.load(Ordering::SeqCst)
    }

    fn release(&self) {
        self.released.store(true, Ordering::SeqCst);
    }

    /// Releases the hold `delay` from now, from a thread of its own: the test's thread may be
    /// waiting on the held restore meanwhile.
    fn release_after(&self, delay: Duration) -> std::thread::JoinHandle<()> {
        let released = self.released.clone();
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            released.store(true, Ordering::SeqCst);
        })
    }
}

/// Three nodes running groups 1 and 2, a snapshot sent to a follower 8 entries behind; the
/// node that leads neither group is stopped. Returns the cluster, the leaders of groups 1 and
/// 2, and the stopped follower.
async fn two_groups_one_follower_stopped() -> (Cluster, NodeId, NodeId, NodeId) {
    let mut cluster = Cluster::reliable_tweaked(3, vec![1, 2], BackendKind::Memory, |config| {
        config.snapshot_lag_entries = 8;
        config.leader_balance_interval = None;
    });
    cluster.propose(1, Bytes::new()).await;
    cluster.propose(2, Bytes::new()).await;
    let (leader_1, leader_2) = (cluster.leader(1).await, cluster.leader(2).await);
    let follower = (1..=3).find(|&n| n != leader_1 && n != leader_2).unwrap();
    cluster.stop_node(follower);
    (cluster, leader_1, leader_2, follower)
}

/// A follower installing a group's snapshot goes on applying its other groups: the install
/// runs on the apply stage's install thread, not on the apply thread, whose other groups'
/// callers (and, through a full apply queue, whose worker's log writes) would otherwise wait
/// for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_install_holds_up_no_other_group() {
    let (mut cluster, leader_1, leader_2, follower) = two_groups_one_follower_stopped().await;
    write_until_compacted_past(&cluster, leader_1, 2, "group 1 was never compacted").await;

    // The follower comes back with its data, its restore of group 1 (its first) held. Group 2
    // it catches up from its leader's log.
    let held = HeldRestore::on(&mut cluster, follower);
    cluster.start_node(follower);
    held.begun().await;

    // Group 2 goes on: its writes reach the follower's state while group 1's install waits.
    for _ in 0..20 {
        cluster.propose(2, Bytes::new()).await;
    }
    let total = counter_on(&cluster, leader_2, 2);
    let deadline = Instant::now() + Duration::from_secs(5);
    while counter_on(&cluster, follower, 2) < total {
        assert!(
            Instant::now() < deadline,
            "the follower applied group 2 up to {} of {total} while group 1's install waited",
            counter_on(&cluster, follower, 2)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    held.release();
    cluster.wait_caught_up_with_leader(1).await;
    assert_eq!(
        counter_on(&cluster, follower, 1),
        counter_on(&cluster, leader_1, 1)
    );
}

/// A node stopping while an install waits behind a long one finishes the one under way (with
/// the states restored together with it) but begins no other: each could hold the stop up as
/// long again. The leader sends its snapshot
/// again once the node is back. (The install thread skips it; the waiting state's file is
/// also removed with the node's snapshot files. Either keeps the install from beginning.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_node_begins_no_install_that_waits_behind_another() {
    let (mut cluster, leader_1, leader_2, follower) = two_groups_one_follower_stopped().await;
    for (group, leader) in [(1, leader_1), (2, leader_2)] {
        let failure = format!("group {group} was never compacted");
        write_until_group_compacted_past(&cluster, leader, group, 2, &failure).await;
    }

    // The follower's first restore, of either group, is held.
    let held = HeldRestore::on(&mut cluster, follower);
    cluster.start_node(follower);
    held.begun().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let both_installing = |cluster: &Cluster| {
        [1, 2].iter().all(|&group| {
            cluster
                .node(follower)
                .status(group)
                .unwrap()
                .installing_snapshot
        })
    };
    while !both_installing(&cluster) {
        assert!(
            Instant::now() < deadline,
            "the follower never installed both groups"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The other group's state is fetched (from memory, at once) and waits for the install
    // thread.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let release = held.release_after(Duration::from_millis(200));
    cluster.stop_node(follower);
    release.join().unwrap();
    // Both states may have been fetched before the install thread looked, and so restored
    // together; otherwise the second waited behind the first and must not have begun.
    assert_eq!(
        held.restores_begun(),
        held.first_restore_groups(),
        "the stopping node began the install that waited"
    );

    cluster.start_node(follower);
    for group in [1, 2] {
        cluster.wait_caught_up_with_leader(group).await;
    }
    assert_eq!(
        counter_on(&cluster, follower, 2),
        counter_on(&cluster, leader_2, 2)
    );
}

/// A follower whose log lost its entries while its state kept what it applied (a crash between
/// a snapshot's install and its record in the log, or a log that was not synced) restarts its
/// log after the state, with term 0 there. No leader's entry matches that term, and the leader
/// counts the follower as holding that far, so a plain rejection would be dropped as stale
/// forever: the follower asks for a snapshot instead, and converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_whose_log_restarted_after_its_state_catches_up() {
    let mut cluster = Cluster::reliable_tweaked(3, vec![1], BackendKind::Memory, |config| {
        config.leader_balance_interval = None;
    });
    for _ in 0..20 {
        cluster.propose(1, Bytes::new()).await;
    }
    let leader = cluster.leader(1).await;
    let follower = (1..=3).find(|&n| n != leader).unwrap();
    cluster.wait_caught_up_with_leader(1).await;
    cluster.stop_node(follower);

    // The follower's log keeps its term, vote and configuration, and loses every entry.
    let kept = cluster.memory_stores[&follower].clone();
    let group_log = kept.log.group_state(1).unwrap();
    assert!(group_log.last_index >= 20, "{group_log:?}");
    let log = concord_storage::MemLogStore::new();
    let mut batch = LogBatch::new();
    batch.set_hard_state(1, group_log.hard_state.clone());
    batch.set_conf_state(1, group_log.conf_state.clone(), group_log.conf_state_index);
    log.write(batch).unwrap();
    cluster.memory_stores.insert(
        follower,
        Stores {
            log: Arc::new(log),
            state: kept.state.clone(),
        },
    );

    cluster.start_node(follower);
    for _ in 0..5 {
        cluster.propose(1, Bytes::new()).await;
    }
    let total = counter_on(&cluster, leader, 1);
    assert_eq!(total, 25);
    cluster.wait_caught_up_with_leader(1).await;
    assert_eq!(counter_on(&cluster, follower, 1), total);
}

/// The member a snapshot's ticket names may never serve it: it may have lost its data since
/// (or be cut off), and the follower holding the snapshot takes no message meanwhile, so it
/// learns of no new leader. It fetches from the group's other members in turn: here the
/// leader that sent the ticket refuses every fetch, and the state comes from the other
/// follower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_is_fetched_from_another_member_when_the_one_named_cannot_serve_it() {
    let (mut cluster, leader, follower, other) =
        three_sending_snapshots_early(BackendKind::Memory).await;
    stop_until_compacted_past(&mut cluster, leader, follower).await;
    let total = counter_on(&cluster, leader, 1);
    let applied = cluster.node(leader).status(1).unwrap().applied_index;
    let deadline = Instant::now() + Duration::from_secs(5);
    while cluster.node(other).status(1).unwrap().applied_index < applied {
        assert!(Instant::now() < deadline, "node {other} never caught up");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cluster.network.refuse_snapshots_from(leader);
    cluster.start_node(follower);
    let deadline = Instant::now() + Duration::from_secs(10);
    while counter_on(&cluster, follower, 1) != total {
        assert!(
            Instant::now() < deadline,
            "the follower never installed the state from node {other}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cluster.network.heal();
    let next = decode_counter(&cluster.propose(1, Bytes::new()).await);
    assert_eq!(next, total + 1);
    let applied = cluster.node(leader).status(1).unwrap().applied_index;
    cluster.wait_applied(1, applied).await;
    assert_eq!(counter_on(&cluster, follower, 1), next);
}

/// A state fetched for a snapshot may be further on than the snapshot (the member serving it
/// applied more meanwhile), and the leader may then send the follower another ticket, for an
/// index that state holds already: here the follower's fetches fail while the group writes
/// on and the leader compacts past the first ticket, so the one fetch that succeeds brings a
/// state at the leader's last index, and the leader, finding the entries after the first
/// ticket compacted, sends a second. The follower takes it without fetching the state again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_the_state_holds_already_is_not_fetched_again() {
    let (mut cluster, leader, follower, other) =
        three_sending_snapshots_early(BackendKind::Memory).await;
    stop_until_compacted_past(&mut cluster, leader, follower).await;
    cluster.network.refuse_snapshots_from(leader);
    cluster.network.refuse_snapshots_from(other);
    cluster.start_node(follower);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cluster
        .node(follower)
        .status(1)
        .unwrap()
        .installing_snapshot
    {
        assert!(Instant::now() < deadline, "no snapshot was ever sent");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The first ticket is at most at the leader's applied index now; the log goes past it.
    let first_ticket_at_most = cluster.node(leader).status(1).unwrap().applied_index;
    write_until_compacted_past(
        &cluster,
        leader,
        first_ticket_at_most + 1,
        "the leader never compacted past the first ticket",
    )
    .await;
    let last = cluster.node(leader).status(1).unwrap().applied_index;
    let deadline = Instant::now() + Duration::from_secs(5);
    while cluster.node(other).status(1).unwrap().applied_index < last {
        assert!(Instant::now() < deadline, "node {other} never caught up");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(cluster.network.snapshot_fetches_served(), 0);

    cluster.network.heal();
    // The follower's log restarts after the leader's last index once it holds the snapshot
    // there; either member it fetches from serves the state at that index.
    let deadline = Instant::now() + Duration::from_secs(10);
    while first_log_index(&cluster.stores[&follower], 1) <= last {
        assert!(
            Instant::now() < deadline,
            "the follower's log never restarted after index {last}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        cluster.network.snapshot_fetches_served(),
        1,
        "the state was fetched again for a snapshot it held"
    );
    assert_eq!(
        counter_on(&cluster, follower, 1),
        counter_on(&cluster, leader, 1)
    );
}

/// A follower sent a snapshot's ticket still holds the leader's log back, at the ticket's
/// index, while it installs the state (as long as it stays within the snapshot lag): the
/// group writes on meanwhile, and once the state is in, the follower takes the entries after
/// the ticket from the log. Were they compacted, it would be sent the whole state again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_installing_a_snapshot_catches_up_from_the_log_after_it() {
    let mut cluster = Cluster::reliable_tweaked(3, vec![1], BackendKind::Memory, |config| {
        config.snapshot_lag_entries = 40;
        config.leader_balance_interval = None;
    });
    cluster.propose(1, Bytes::new()).await;
    let leader = cluster.leader(1).await;
    let follower = (1..=3).find(|&n| n != leader).unwrap();
    stop_until_compacted_past(&mut cluster, leader, follower).await;

    // The follower's restore of group 1 is held (its first).
    let held = HeldRestore::on(&mut cluster, follower);
    cluster.start_node(follower);
    held.begun().await;
    assert_eq!(cluster.network.snapshot_fetches_served(), 1);

    // Writes go on while the install waits, fewer than the snapshot lag, and the leader gets
    // time to compact (it checks every tick).
    for _ in 0..16 {
        cluster.propose(1, Bytes::new()).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    held.release();
    cluster.wait_caught_up_with_leader(1).await;
    assert_eq!(
        counter_on(&cluster, follower, 1),
        counter_on(&cluster, leader, 1)
    );
    assert_eq!(
        cluster.network.snapshot_fetches_served(),
        1,
        "the follower was sent the state again"
    );
}

/// A node that lost its data forgot the entries it acknowledged: if it voted at once, it could
/// elect a stale node and lose committed writes. Started to catch up, it grants no vote until
/// it has applied through what a leader told it: the stale node cannot win, the up-to-date one
/// does when it returns, and nothing acknowledged is lost. The same for a node whose log alone
/// was lost (its term and vote with it) while its state was kept, and for a wiped node started
/// again with the settings of its first start, as a member of a new cluster: asked for its
/// vote by a candidate whose log has entries, it catches up first too. (Before it did, it voted
/// for the stale node at once, and the 30 writes the stale node missed were lost.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_its_data_does_not_vote_until_it_caught_up() {
    // Wiped entirely, or its log lost (its term and vote with it) while its state was kept;
    // started as a member joining the running cluster, or (wiped) as at its first start.
    for (state_kept, joining) in [(false, true), (true, true), (false, false)] {
        a_node_without_its_data_votes_once_caught_up(state_kept, joining).await;
    }
}

async fn a_node_without_its_data_votes_once_caught_up(state_kept: bool, joining: bool) {
    let mut cluster = Cluster::reliable_tweaked(3, vec![1], BackendKind::Memory, |config| {
        config.leader_balance_interval = None;
    });
    cluster.propose(1, Bytes::new()).await;
    let up_to_date = cluster.leader(1).await;
    let stale = (1..=3).find(|&n| n != up_to_date).unwrap();
    let wiped = (1..=3).find(|&n| n != up_to_date && n != stale).unwrap();
    cluster.stop_node(stale);
    for _ in 0..30 {
        cluster.propose(1, Bytes::new()).await;
    }
    let total = counter_on(&cluster, up_to_date, 1);
    assert_eq!(total, 31);
    cluster.wait_applied(1, 31).await;
    cluster.stop_node(up_to_date);
    cluster.stop_node(wiped);
    let kept = cluster.memory_stores.remove(&wiped).unwrap();
    if state_kept {
        let lost_log = Stores {
            log: Arc::new(concord_storage::MemLogStore::new()),
            state: kept.state.clone(),
        };
        cluster.memory_stores.insert(wiped, lost_log);
    }

    // The stale node and the one without its data: no leader may come of them.
    cluster.tweak = if joining {
        |config| {
            config.leader_balance_interval = None;
            config.catch_up_before_voting = true;
        }
    } else {
        |config| config.leader_balance_interval = None
    };
    cluster.start_node(wiped);
    cluster.tweak = |config| config.leader_balance_interval = None;
    cluster.start_node(stale);
    tokio::time::sleep(Duration::from_secs(1)).await;
    for node in [stale, wiped] {
        assert!(
            !cluster.node(node).status(1).unwrap().is_leader,
            "state kept: {state_kept}, joining: {joining}: node {node} was elected without \
             the up-to-date node"
        );
    }
    // The up-to-date node returns and leads; every write is still there, everywhere.
    cluster.start_node(up_to_date);
    let next = decode_counter(&cluster.propose(1, Bytes::new()).await);
    assert_eq!(next, total + 1);
    let applied = cluster
        .node(cluster.leader(1).await)
        .status(1)
        .unwrap()
        .applied_index;
    cluster.wait_applied(1, applied).await;
    for node in 1..=3 {
        assert_eq!(
            counter_on(&cluster, node, 1),
            total + 1,
            "state kept: {state_kept}, joining: {joining}: node {node}"
        );
    }
    cluster.shutdown();
}

/// A node that lost its data forgot its term too. A leader of an older term, cut off from the
/// others while they moved on (here without the quorum checks that would make it step down;
/// asleep, it would not check either), must not take the node for a follower of its own: it
/// would catch the node up to its stale commit index, have its new entries acknowledged, and
/// overwrite entries the newer leader committed with the node's help. So the node asks the
/// others where the group stands and steps nothing until a majority answered: while only
/// the stale leader can reach it, no write through that leader is acknowledged, and once
/// the newer leader answers, the stale one steps down and every acknowledged write stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_its_data_acknowledges_nothing_for_a_leader_of_a_term_gone_by() {
    for joining in [false, true] {
        a_node_without_its_data_ignores_a_stale_leader(joining).await;
    }
}

async fn a_node_without_its_data_ignores_a_stale_leader(joining: bool) {
    fn tweak(config: &mut NodeConfig) {
        config.leader_balance_interval = None;
        config.check_quorum = false;
    }
    let mut cluster = Cluster::reliable_tweaked(3, vec![1], BackendKind::Memory, tweak);
    cluster.propose(1, Bytes::new()).await;
    let stale = cluster.leader(1).await;
    let others: Vec<NodeId> = (1..=3).filter(|&n| n != stale).collect();
    cluster.network.isolate(stale, &[1, 2, 3]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let newer = loop {
        let leading = others
            .iter()
            .copied()
            .find(|&n| cluster.node(n).status(1).unwrap().is_leader);
        if let Some(node) = leading {
            break node;
        }
        assert!(Instant::now() < deadline, "the others elected no leader");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let wiped = others.into_iter().find(|&n| n != newer).unwrap();
    assert!(cluster.node(stale).status(1).unwrap().is_leader);
    // Acknowledged by the newer leader and the node about to lose its data only.
    let mut acknowledged = 1;
    for _ in 0..10 {
        let total = decode_counter(&cluster.node(newer).propose(1, Bytes::new()).await.unwrap());
        acknowledged += 1;
        assert_eq!(total, acknowledged);
    }

    cluster.stop_node(wiped);
    cluster.memory_stores.remove(&wiped);
    // Only the stale leader reaches the node, and the node only it.
    cluster.network.heal();
    for (a, b) in [(stale, newer), (newer, wiped)] {
        cluster.network.cut_one_way(a, b);
        cluster.network.cut_one_way(b, a);
    }
    cluster.tweak = if joining {
        |config| {
            tweak(config);
            config.catch_up_before_voting = true;
        }
    } else {
        tweak
    };
    cluster.start_node(wiped);
    let through_stale = tokio::time::timeout(
        Duration::from_secs(3),
        cluster.node(stale).propose(1, Bytes::new()),
    )
    .await;
    assert!(
        !matches!(through_stale, Ok(Ok(_))),
        "joining {joining}: node {stale}, leader of a term gone by, had a write acknowledged \
         with the help of node {wiped}, which lost its data: {through_stale:?}"
    );

    // Healed, the newer leader's log wins everywhere.
    cluster.network.heal();
    let deadline = Instant::now() + Duration::from_secs(10);
    let total = loop {
        let leader = cluster.leader(1).await;
        match tokio::time::timeout(
            Duration::from_secs(2),
            cluster.node(leader).propose(1, Bytes::new()),
        )
        .await
        {
            Ok(Ok(total)) => break decode_counter(&total),
            _ => assert!(
                Instant::now() < deadline,
                "joining {joining}: no write went through after healing"
            ),
        }
    };
    assert_eq!(total, acknowledged + 1, "joining {joining}");
    cluster.wait_caught_up_with_leader(1).await;
    for node in 1..=3 {
        assert_eq!(
            counter_on(&cluster, node, 1),
            total,
            "joining {joining}: node {node}"
        );
    }
    cluster.shutdown();
}

/// Of two voters, a member that lost its data has only the other to ask, and every majority
/// it ever took part in holds that other: its answer suffices. Before, the member waited for
/// an answer from a second other member that does not exist, refused every raft message
/// meanwhile, and the group, needing both, took no write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_voters_a_member_without_its_data_catches_up_from_the_other() {
    for joining in [false, true] {
        let mut cluster = Cluster::reliable_tweaked(2, vec![1], BackendKind::Memory, |config| {
            config.leader_balance_interval = None;
        });
        let mut total = 0;
        for _ in 0..5 {
            total = decode_counter(&cluster.propose(1, Bytes::new()).await);
        }
        let leader = cluster.leader(1).await;
        let wiped = 3 - leader;
        cluster.stop_node(wiped);
        cluster.memory_stores.remove(&wiped);
        if joining {
            cluster.tweak = |config| {
                config.leader_balance_interval = None;
                config.catch_up_before_voting = true;
            };
        }
        cluster.start_node(wiped);
        let written = tokio::time::timeout(
            Duration::from_secs(5),
            cluster.node(leader).propose(1, Bytes::new()),
        )
        .await;
        let Ok(Ok(written)) = written else {
            panic!(
                "joining {joining}: the group took no write with node {wiped} back: {written:?}"
            );
        };
        assert_eq!(decode_counter(&written), total + 1, "joining {joining}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while counter_on(&cluster, wiped, 1) != total + 1
            || cluster.node(wiped).status(1).unwrap().catching_up
        {
            assert!(
                Instant::now() < deadline,
                "joining {joining}: node {wiped} never caught up: {:?}",
                cluster.node(wiped).status(1).unwrap()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        cluster.shutdown();
    }
}

/// A leader serves lease reads without a quorum round only while a quorum answered one of
/// its recent heartbeats: cut off from the others, it still answers at once within its lease
/// (a linearizable read, which needs the quorum, does not), and no longer once the lease ran
/// out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_reads_need_a_quorum_heard_within_the_lease() {
    let cluster = Cluster::reliable_tweaked(3, vec![1], BackendKind::Memory, |config| {
        // A 1 s election timeout: an 891 ms lease, renewed by heartbeats every 20 ms.
        config.election_ticks = 100;
        config.leader_balance_interval = None;
    });
    cluster.node(1).campaign(1).unwrap();
    for _ in 0..3 {
        cluster.propose(1, Bytes::new()).await;
    }
    let leader = cluster.leader(1).await;
    let applied = cluster.node(leader).status(1).unwrap().applied_index;
    // Heartbeats answered since: the lease holds.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let index = cluster.node(leader).lease_read_barrier(1).await.unwrap();
    assert!(index >= applied);

    cluster.network.isolate(leader, &[1, 2, 3]);
    let within = tokio::time::timeout(
        Duration::from_millis(300),
        cluster.node(leader).lease_read_barrier(1),
    )
    .await;
    assert!(matches!(within, Ok(Ok(_))), "within the lease: {within:?}");
    let quorum_read = tokio::time::timeout(
        Duration::from_millis(300),
        cluster.node(leader).read_barrier(1),
    )
    .await;
    assert!(
        !matches!(quorum_read, Ok(Ok(_))),
        "a linearizable read needs the quorum: {quorum_read:?}"
    );
    // Past the lease, a lease read asks the quorum too, and cannot be served.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let after = tokio::time::timeout(
        Duration::from_millis(300),
        cluster.node(leader).lease_read_barrier(1),
    )
    .await;
    assert!(!matches!(after, Ok(Ok(_))), "after the lease: {after:?}");
    cluster.network.heal();
}

/// Heartbeats lost while a leader was cut off cost its lease nothing once the others hear it
/// again: each answer is matched to its own heartbeat. (Matched by order, every answer after
/// the loss was credited to a heartbeat as much older as the heartbeats lost.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_comes_back_after_heartbeats_were_lost() {
    let cluster = Cluster::reliable_tweaked(3, vec![1], BackendKind::Memory, |config| {
        // A 1 s election timeout: an 891 ms lease; heartbeats every 20 ms.
        config.election_ticks = 100;
        config.leader_balance_interval = None;
        // Idle, the group would fall asleep: no heartbeats, so no lease (a lease read then
        // asks the quorum), and the others elect a new leader once its node falls silent.
        config.sleep_after_ticks = 0;
    });
    cluster.node(1).campaign(1).unwrap();
    cluster.propose(1, Bytes::new()).await;
    let leader = cluster.leader(1).await;
    // Twice half a second cut off: a second of heartbeats lost to each follower.
    for _ in 0..2 {
        cluster.network.isolate(leader, &[1, 2, 3]);
        tokio::time::sleep(Duration::from_millis(500)).await;
        cluster.network.heal();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(cluster.node(leader).status(1).unwrap().is_leader);
    cluster.network.isolate(leader, &[1, 2, 3]);
    let read = tokio::time::timeout(
        Duration::from_millis(300),
        cluster.node(leader).lease_read_barrier(1),
    )
    .await;
    cluster.network.heal();
    assert!(
        matches!(read, Ok(Ok(_))),
        "no lease 200 ms after the others heard the leader again: {read:?}"
    );
}

/// A member that restarts forgets which leader it answered. Were it to vote at once, a
/// candidate could win with it and acknowledge a write while the old leader, cut off, still
/// serves lease reads from the heartbeats that member answered: a stale read. It keeps quiet
/// for an election timeout after it starts instead, and votes after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_member_votes_for_no_one_while_a_lease_it_answered_may_run() {
    restarted_member_keeps_quiet_while_the_lease_runs(long_election_timeout).await;
}

/// The same with the ticks shortened across the restart: the member's new election timeout
/// (0.2 s) is over long before the lease it answered with its old one (1.99 s of quiet). It
/// holds its vote for the quiet it said before, which `Engine::open` keeps in the data
/// directory and hands over as `previous_vote_quiet`, and does not campaign for itself
/// meanwhile either. (Without either, the restarted member is elected a few hundred
/// milliseconds after it starts, while the old leader's lease still runs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_restarted_with_shorter_ticks_votes_for_no_one_while_a_lease_it_answered_may_run()
{
    restarted_member_keeps_quiet_while_the_lease_runs(|config| {
        config.election_ticks = 20;
        config.leader_balance_interval = None;
        config.previous_vote_quiet = Duration::from_millis(10 * 199);
    })
    .await;
}

/// A 2 s election timeout: a lease of 1.79 s, renewed by heartbeats every 20 ms.
fn long_election_timeout(config: &mut NodeConfig) {
    config.election_ticks = 200;
    config.leader_balance_interval = None;
}

/// A follower of a cut-off leader restarts with `restart_tweak` applied to its settings; the
/// other follower campaigns at once: it is not elected while the leader's lease runs, and is
/// once the restarted member's quiet is over.
async fn restarted_member_keeps_quiet_while_the_lease_runs(restart_tweak: fn(&mut NodeConfig)) {
    let mut cluster =
        Cluster::reliable_tweaked(3, vec![1], BackendKind::Memory, long_election_timeout);
    cluster.node(1).campaign(1).unwrap();
    for _ in 0..3 {
        cluster.propose(1, Bytes::new()).await;
    }
    let leader = cluster.leader(1).await;
    let applied = cluster.node(leader).status(1).unwrap().applied_index;
    cluster.wait_applied(1, applied).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let restarted = (1..=3).find(|&n| n != leader).unwrap();
    let candidate = (1..=3).find(|&n| n != leader && n != restarted).unwrap();

    // The leader is cut off while its lease runs; a follower restarts; the other campaigns.
    cluster.network.isolate(leader, &[1, 2, 3]);
    cluster.stop_node(restarted);
    cluster.tweak = restart_tweak;
    cluster.start_node(restarted);
    cluster.node(candidate).campaign(1).unwrap();
    // Neither may be elected: the candidate with the restarted member's vote, nor the
    // restarted member, campaigning once its own (new) election timeout is over, with the
    // candidate's.
    let elected_by = Instant::now() + Duration::from_millis(500);
    let mut write = None;
    while Instant::now() < elected_by && write.is_none() {
        for node in [candidate, restarted] {
            if cluster.node(node).status(1).unwrap().is_leader {
                let answer = tokio::time::timeout(
                    Duration::from_millis(300),
                    cluster.node(node).propose(1, Bytes::new()),
                )
                .await;
                write = Some((node, answer));
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let read = tokio::time::timeout(
        Duration::from_millis(200),
        cluster.node(leader).lease_read_barrier(1),
    )
    .await;
    assert!(
        matches!(read, Ok(Ok(_))),
        "the cut-off leader's lease still runs: {read:?}"
    );
    assert!(
        write.is_none(),
        "a leader was elected with the restarted node's vote while the old leader's lease \
         ran (it and its write: {write:?}; the old leader's lease read then saw counter {})",
        counter_on(&cluster, leader, 1)
    );

    // Once the quiet is over, the two elect a leader and write.
    let deadline = Instant::now() + Duration::from_secs(10);
    let total = loop {
        if let Ok(Ok(result)) = tokio::time::timeout(
            Duration::from_secs(1),
            cluster.node(candidate).propose(1, Bytes::new()),
        )
        .await
        {
            break decode_counter(&result);
        }
        assert!(Instant::now() < deadline, "no leader after the quiet");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(total >= 4, "{total}");
    cluster.network.heal();
    cluster.wait_caught_up_with_leader(1).await;
    cluster.shutdown();
}

/// Linearizable reads that reach a follower together share one read index: the follower asks
/// the leader once for the lot (one index, asked after all of them arrived, serves them all),
/// not once per read, and every read is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_arriving_together_ask_the_leader_once() {
    let cluster = Cluster::reliable(3, vec![1], BackendKind::Memory);
    let leader = cluster.leader(1).await;
    let follower = (1..=3).find(|&n| n != leader).unwrap();
    // The follower knows the leader once a write through it is answered.
    let deadline = Instant::now() + Duration::from_secs(5);
    while cluster
        .node(follower)
        .propose(1, Bytes::new())
        .await
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "the follower never learned the leader"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let asked_before = cluster.network.sent(MessageType::MsgReadIndex);
    let node = cluster.node(follower).clone();
    let reads: Vec<_> = (0..200).map(|_| node.read_barrier(1)).collect();
    let written = cluster.node(leader).status(1).unwrap().applied_index;
    for read in reads {
        assert!(read.await.unwrap() >= written);
    }
    let asked = cluster.network.sent(MessageType::MsgReadIndex) - asked_before;
    assert!(asked >= 1, "the reads never asked the leader");
    // Taken by the worker in a few rounds at most: each round's reads ask once.
    assert!(asked <= 40, "{asked} requests to the leader for 200 reads");
}

/// A leader with nothing more to propose tells its followers of a new commit index at once,
/// not with its next heartbeat (it leaves the news to the next append only while commands
/// wait): a follower applies a last write within a round trip or two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_apply_a_last_write_without_waiting_for_a_heartbeat() {
    let cluster = Cluster::reliable_tweaked(3, vec![1], BackendKind::Memory, |config| {
        // Heartbeats every 600 ms; no sleep heartbeats either.
        config.heartbeat_ticks = 60;
        config.election_ticks = 120;
        config.sleep_after_ticks = 0;
    });
    let leader = cluster.leader(1).await;
    for _ in 0..5 {
        let written = Instant::now();
        cluster.node(leader).propose(1, Bytes::new()).await.unwrap();
        let index = cluster.node(leader).status(1).unwrap().applied_index;
        for follower in (1..=3).filter(|&n| n != leader) {
            while cluster.node(follower).status(1).unwrap().applied_index < index {
                assert!(
                    written.elapsed() < Duration::from_millis(300),
                    "node {follower} had not applied index {index} after 300 ms"
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    }
}

/// Under load a leader sends a follower about one append per entry: the new commit index of
/// an entry rides on the append of the next, where raft alone would send an append of its
/// own for it. The load is 4096 commands queued at once, 16 to an entry, so that the queue
/// holds commands at every commit however slowly the machine runs the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_load_a_new_commit_index_rides_on_the_next_append() {
    let cluster = std::sync::Arc::new(Cluster::reliable_tweaked(
        3,
        vec![1],
        BackendKind::Memory,
        |config| config.max_commands_per_entry = 16,
    ));
    let leader = cluster.leader(1).await;
    let node = cluster.node(leader).clone();
    let first_index = node.status(1).unwrap().last_log_index;
    let appends_before = cluster.network.sent(MessageType::MsgAppend);
    let proposals: Vec<_> = (0..4096)
        .map(|_| {
            let node = node.clone();
            tokio::spawn(async move { node.propose(1, Bytes::new()).await.unwrap() })
        })
        .collect();
    for proposal in proposals {
        proposal.await.unwrap();
    }
    let entries = node.status(1).unwrap().last_log_index - first_index;
    let appends = cluster.network.sent(MessageType::MsgAppend) - appends_before;
    let per_entry_and_follower = appends as f64 / (2 * entries) as f64;
    println!(
        "{entries} entries, {appends} appends: {per_entry_and_follower:.2} per entry and follower"
    );
    assert!(entries >= 256, "only {entries} entries for 4096 commands");
    assert!(
        per_entry_and_follower < 1.5,
        "{appends} appends for {entries} entries to two followers"
    );
}

/// A writer whose next command follows its last one's answer carries that one's commit index
/// in its own append: the leader sends each follower one append per entry, where raft alone
/// sends a second, of its own, for each commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_writers_commit_index_rides_on_its_next_append() {
    let cluster = Cluster::reliable_tweaked(3, vec![1], BackendKind::Memory, |config| {
        // Longer than any write takes, however slow the machine: only an append tells.
        config.commit_news_delay = Duration::from_secs(2);
    });
    let leader = cluster.leader(1).await;
    let node = cluster.node(leader).clone();
    // After a first write the status shows the leader's own first (empty) entry too.
    node.propose(1, Bytes::new()).await.unwrap();
    let first = node.status(1).unwrap();
    let appends_before = cluster.network.sent(MessageType::MsgAppend);
    for _ in 0..200 {
        node.propose(1, Bytes::new()).await.unwrap();
    }
    let last = node.status(1).unwrap();
    if last.term != first.term {
        // An election (10 ms ticks on a loaded machine) adds its entry and appends of its own.
        println!("an election during the writes: nothing to count");
        return;
    }
    let entries = last.last_log_index - first.last_log_index;
    let appends = cluster.network.sent(MessageType::MsgAppend) - appends_before;
    let per_entry_and_follower = appends as f64 / (2 * entries) as f64;
    println!(
        "{entries} entries, {appends} appends: {per_entry_and_follower:.2} per entry and follower"
    );
    assert_eq!(entries, 200, "one entry per write");
    assert!(
        per_entry_and_follower < 1.3,
        "{appends} appends for {entries} entries to two followers"
    );
}

/// A follower that forwarded a write is told of its commit at once — it answers its caller
/// after its own apply — though the leader leaves the news to a later append or heartbeat
/// for the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_forwarded_a_write_hears_of_its_commit_at_once() {
    let cluster = Cluster::reliable_tweaked(3, vec![1], BackendKind::Memory, |config| {
        config.commit_news_delay = Duration::from_secs(5);
        // Heartbeats, which carry the commit index too, every 250 ms.
        config.heartbeat_ticks = 25;
        config.election_ticks = 30;
    });
    cluster.propose(1, Bytes::new()).await;
    let leader = cluster.leader(1).await;
    let follower = (1..=3).find(|&n| n != leader).unwrap();
    let node = cluster.node(follower).clone();
    let deadline = Instant::now() + Duration::from_secs(5);
    // The follower learns the leader from its first append or heartbeat.
    loop {
        match node.propose(1, Bytes::new()).await {
            Ok(_) => break,
            Err(ProposeError::NotLeader { leader: None, .. }) => {}
            other => panic!("the follower did not forward: {other:?}"),
        }
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = Instant::now();
    for _ in 0..20 {
        node.propose(1, Bytes::new()).await.unwrap();
    }
    let took = started.elapsed();
    println!("20 forwarded writes in {took:?}");
    // Waiting for a heartbeat each, they would take about 2.5 s.
    assert!(
        took < Duration::from_secs(1),
        "20 forwarded writes took {took:?}"
    );
}

/// When no append follows a last write, the leader tells the followers of its commit
/// `commit_news_delay` later, well before the next heartbeat would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_writes_commit_reaches_the_followers_after_the_news_delay() {
    let cluster = Cluster::reliable_tweaked(3, vec![1], BackendKind::Memory, |config| {
        config.commit_news_delay = Duration::from_millis(50);
        // Heartbeats, which carry the commit index too, every 500 ms, and no sleep (a
        // leader's sleep heartbeat carries it as well).
        config.heartbeat_ticks = 50;
        config.election_ticks = 60;
        config.sleep_after_ticks = 0;
    });
    cluster.propose(1, Bytes::new()).await;
    let leader = cluster.leader(1).await;
    let followers: Vec<NodeId> = (1..=3).filter(|&n| n != leader).collect();
    let mut slowest = Duration::ZERO;
    for _ in 0..3 {
        cluster.node(leader).propose(1, Bytes::new()).await.unwrap();
        let written = cluster.node(leader).status(1).unwrap().last_log_index;
        let started = Instant::now();
        while followers
            .iter()
            .any(|&f| cluster.node(f).status(1).unwrap().commit_index < written)
        {
            assert!(started.elapsed() < Duration::from_secs(3));
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        slowest = slowest.max(started.elapsed());
    }
    println!("the followers heard of each commit within {slowest:?}");
    assert!(slowest < Duration::from_millis(250), "took {slowest:?}");
}
