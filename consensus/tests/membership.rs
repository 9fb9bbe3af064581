//! Membership changes through raft-rs's joint consensus, in one process: a node joins as a
//! learner from a snapshot, is promoted, the leader is removed, and a change that would lose
//! quorum is refused.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Cluster, counter_on, leader_before};
use concord_consensus::{Consensus, GroupMembers, MemberChange, NodeId, ProposeError};
use concord_storage::{BackendKind, GroupId};

const GROUPS: [GroupId; 2] = [1, 2];

/// Proposes `change` to every group through `via` until every running node shows it taken.
async fn change_everywhere(cluster: &Cluster, via: NodeId, change: MemberChange) {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut asked_at: Option<Instant> = None;
    loop {
        let taken = |members: &GroupMembers| members.has_taken(&change);
        let done = cluster.nodes.values().all(|node| {
            GROUPS
                .iter()
                .all(|&g| taken(&node.status(g).unwrap().members))
        });
        if done {
            return;
        }
        assert!(Instant::now() < deadline, "{change:?} was never taken");
        if asked_at.is_none_or(|at| at.elapsed() > Duration::from_millis(500)) {
            asked_at = Some(Instant::now());
            for group in GROUPS {
                if !taken(&cluster.node(via).status(group).unwrap().members) {
                    let _ = cluster
                        .node(via)
                        .propose_member_change(group, change.clone())
                        .await;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn counters_agree(cluster: &Cluster) {
    for group in GROUPS {
        let leader = cluster.leader(group).await;
        let applied = cluster.node(leader).status(group).unwrap().applied_index;
        cluster.wait_applied(group, applied).await;
        let expected = counter_on(cluster, leader, group);
        for &node in cluster.nodes.keys() {
            assert_eq!(
                counter_on(cluster, node, group),
                expected,
                "node {node}, group {group}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joins_is_promoted_and_the_leader_is_removed() {
    for backend in [BackendKind::Memory, BackendKind::Redb] {
        let mut cluster = Cluster::reliable_tweaked(3, GROUPS.to_vec(), backend, |config| {
            config.leader_balance_interval = None;
        });
        for _ in 0..10 {
            for group in GROUPS {
                cluster.propose(group, Bytes::new()).await;
            }
        }
        // Node 4 starts without a configuration and waits for a snapshot.
        cluster.tweak = |config| {
            config.leader_balance_interval = None;
            config.catch_up_before_voting = true;
        };
        cluster.dirs.insert(4, tempfile::tempdir().unwrap());
        cluster.start_node(4);
        assert!(cluster.node(4).status(1).unwrap().members.is_empty());
        let add = MemberChange::AddLearner {
            node: 4,
            address: "127.0.0.1:7004".into(),
        };
        change_everywhere(&cluster, 2, add).await;
        for group in GROUPS {
            cluster.propose(group, Bytes::new()).await;
        }
        counters_agree(&cluster).await;

        // Caught up, the learner becomes a voter (through a joint configuration).
        change_everywhere(&cluster, 1, MemberChange::Promote { node: 4 }).await;
        for group in GROUPS {
            let members = cluster.node(1).status(group).unwrap().members;
            assert_eq!(members.voters, vec![1, 2, 3, 4], "{backend:?}");
            assert!(members.learners.is_empty());
        }

        // Remove the leader of group 1, asked through another node: the leader hands over.
        let leader = cluster.leader(1).await;
        let via = (1..=4).find(|&n| n != leader).unwrap();
        change_everywhere(&cluster, via, MemberChange::Remove { node: leader }).await;
        // Still running, the removed leader stepped down: the acknowledgements of its last
        // appends, arriving after it left the configuration, must not stop it.
        for _ in 0..5 {
            for group in GROUPS {
                cluster.propose(group, Bytes::new()).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        for group in GROUPS {
            let status = cluster.node(leader).status(group).unwrap();
            assert!(!status.is_leader, "{backend:?}: group {group} {status:?}");
            assert_eq!(status.stopped, None, "{backend:?}: group {group}");
        }
        cluster.stop_node(leader);
        for group in GROUPS {
            cluster.propose(group, Bytes::new()).await;
        }
        counters_agree(&cluster).await;

        // Three voters left, one of them down: removing another would leave one of two up.
        let survivors: Vec<NodeId> = cluster.nodes.keys().copied().collect();
        let down = survivors[0];
        cluster.stop_node(down);
        tokio::time::sleep(Duration::from_millis(400)).await; // An election timeout passes.
        let group_leader = cluster.leader(1).await;
        let victim = *survivors
            .iter()
            .find(|&&n| n != down && n != group_leader)
            .unwrap();
        let refused = cluster
            .node(group_leader)
            .propose_member_change(1, MemberChange::Remove { node: victim })
            .await;
        assert!(
            matches!(&refused, Err(ProposeError::Refused { reason, .. }) if reason.contains("quorum")),
            "{backend:?}: {refused:?}"
        );
        cluster.shutdown();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_survives_a_restart_and_is_not_applied_twice() {
    let mut cluster = Cluster::reliable_tweaked(3, GROUPS.to_vec(), BackendKind::Redb, |c| {
        c.leader_balance_interval = None;
    });
    cluster.propose(1, Bytes::new()).await;
    change_everywhere(&cluster, 1, MemberChange::Remove { node: 3 }).await;
    cluster.stop_node(3);
    for group in GROUPS {
        cluster.propose(group, Bytes::new()).await;
    }
    // Every node restarts: the configuration comes back from the log store, and the changes
    // replayed from the log (the state may not have been flushed past them) are skipped.
    for node in [1, 2] {
        cluster.stop_node(node);
    }
    for node in [1, 2] {
        cluster.start_node(node);
    }
    for group in GROUPS {
        let members = cluster.node(1).status(group).unwrap().members;
        assert_eq!(members.voters, vec![1, 2]);
        cluster.propose(group, Bytes::new()).await;
    }
    counters_agree(&cluster).await;
    // The removed node's data says it is no member: it is refused at start.
    let stores = concord_storage::Stores::open(&concord_storage::StoreConfig::new(
        BackendKind::Redb,
        cluster.dirs[&3].path(),
    ))
    .unwrap();
    let config = common::fast_config(3, vec![1, 2, 3], GROUPS.to_vec());
    // Node 3 applied its own removal only if it heard of it; either way it must start or be
    // refused cleanly, never panic.
    let started = concord_consensus::RaftNode::start(
        config,
        stores,
        common::counter_factory(),
        cluster.network.transport(3),
    );
    if let Err(error) = &started {
        assert!(error.to_string().contains("removed"), "{error}");
    }
    if let Ok(node) = started {
        node.shutdown();
    }
}

/// A leader removed from the configuration hands its leadership to a voter that may not have
/// applied the change yet (the leader learns of the commit first): the hand-over is held until
/// it has, not dropped. With an election timeout of 3 s, only the hand-over can give the group
/// a new leader within half of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_leader_hands_over_to_a_voter_that_has_not_applied_the_change_yet() {
    let mut cluster = Cluster::reliable_tweaked(3, GROUPS.to_vec(), BackendKind::Memory, |c| {
        c.election_ticks = 300;
        c.leader_balance_interval = None;
    });
    for group in GROUPS {
        cluster.node(1).campaign(group).unwrap();
        assert_eq!(cluster.leader(group).await, 1);
        cluster.propose(group, Bytes::new()).await;
    }
    change_everywhere(&cluster, 2, MemberChange::Remove { node: 1 }).await;
    let deadline = Instant::now() + Duration::from_millis(1500);
    let others: BTreeMap<NodeId, _> = [2, 3].map(|n| (n, cluster.node(n).clone())).into();
    for group in GROUPS {
        let leader = leader_before(&others, group, deadline).await;
        let leader = leader.unwrap_or_else(|| panic!("group {group}: the hand-over was lost"));
        assert!(!cluster.node(1).status(group).unwrap().is_leader);
        let answer = cluster.node(leader).propose(group, Bytes::new()).await;
        assert!(answer.is_ok(), "group {group}: {answer:?}");
    }
    cluster.shutdown();
}

/// Waits until node `node` has told its network to forget exactly `forgotten`.
async fn wait_forgotten(cluster: &Cluster, node: NodeId, forgotten: &[NodeId]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while cluster.network.forgotten_by(node) != forgotten {
        assert!(
            Instant::now() < deadline,
            "node {node} forgot {:?}, not {forgotten:?}",
            cluster.network.forgotten_by(node)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The members that apply a removal forget the removed member once every group dropped it (a
/// removal passes through a joint configuration, which raft-rs leaves with an entry of its
/// own). A member away meanwhile catches up from snapshots that no longer name the removed
/// member: it never applies the removal, so it is the snapshots that tell its network to
/// forget that member — and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_members_are_forgotten_by_those_that_apply_the_removal_and_by_snapshot() {
    let mut cluster = Cluster::reliable_tweaked(4, GROUPS.to_vec(), BackendKind::Redb, |c| {
        c.leader_balance_interval = None;
        c.snapshot_lag_entries = 8;
    });
    for group in GROUPS {
        cluster.propose(group, Bytes::new()).await;
    }
    let last_before: Vec<u64> = GROUPS
        .iter()
        .map(|&group| cluster.stores[&3].log.last_index(group).unwrap())
        .collect();
    cluster.stop_node(3);
    change_everywhere(&cluster, 1, MemberChange::Remove { node: 4 }).await;
    cluster.stop_node(4);
    wait_forgotten(&cluster, 1, &[4]).await;
    wait_forgotten(&cluster, 2, &[4]).await;
    // Every group's log moves past node 3's end on both members left: node 3 gets snapshots.
    for (&group, &last) in GROUPS.iter().zip(&last_before) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while [1, 2]
            .iter()
            .any(|node| common::first_log_index(&cluster.stores[node], group) <= last + 1)
        {
            assert!(
                Instant::now() < deadline,
                "group {group} was never compacted"
            );
            cluster.propose(group, Bytes::new()).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let fetches_before = cluster.network.snapshot_fetches_served();
    cluster.start_node(3);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !GROUPS
        .iter()
        .all(|&group| cluster.node(3).status(group).unwrap().members.voters == [1, 2, 3])
    {
        assert!(Instant::now() < deadline, "node 3 never caught up");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(cluster.network.snapshot_fetches_served() > fetches_before);
    wait_forgotten(&cluster, 3, &[4]).await;
    counters_agree(&cluster).await;
    cluster.shutdown();
}

/// A voter that answers its leader is up, whatever the ticks: with a heartbeat every 3 ticks
/// and a check of the quorum every 10, raft-rs's "recently active" marks stay clear for up to
/// two ticks after each check, and a change asked then must not be refused for quorum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_asked_just_after_a_quorum_check_is_not_refused() {
    let mut cluster = Cluster::reliable_tweaked(3, vec![1], BackendKind::Memory, |config| {
        config.leader_balance_interval = None;
        config.heartbeat_ticks = 3;
    });
    cluster.node(1).campaign(1).unwrap();
    cluster.propose(1, Bytes::new()).await;
    let mut refused = Vec::new();
    for attempt in 0..40u64 {
        // Attempts fall at every phase of the checks (every 100 ms).
        tokio::time::sleep(Duration::from_millis(13 + attempt * 7 % 90)).await;
        let add = MemberChange::AddLearner {
            node: 9,
            address: "127.0.0.1:7009".into(),
        };
        'changes: for change in [add, MemberChange::Remove { node: 9 }] {
            // The previous change may still be leaving its joint configuration.
            let mut under_way = 0;
            loop {
                match cluster
                    .node(1)
                    .propose_member_change(1, change.clone())
                    .await
                {
                    Ok(_) => break,
                    Err(ProposeError::Refused { reason, .. }) if reason.contains("under way") => {
                        under_way += 1;
                        assert!(under_way < 100, "attempt {attempt}: {reason}");
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err(ProposeError::Refused { reason, .. }) if reason.contains("quorum") => {
                        refused.push(reason);
                        break 'changes;
                    }
                    Err(other) => panic!("attempt {attempt}: {other:?}"),
                }
            }
        }
    }
    assert!(
        refused.is_empty(),
        "{} of 40 refused: {:?}",
        refused.len(),
        refused.first()
    );
    cluster.shutdown();
}
