//! Groups with nothing to do sleep (no ticks, no heartbeats) and wake on what needs them:
//! a proposal, a read, a message, or their leader's node falling silent.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Cluster, counter_on, decode_counter, first_log_index};
use concord_consensus::transport::FaultConfig;
use concord_consensus::{Consensus, NodeConfig, NodeId};
use concord_storage::raft::prelude::MessageType;
use concord_storage::{BackendKind, GroupId};

/// Groups sleep after 5 still ticks (50 ms); a silent node is noticed after 200 ms.
fn sleepy(config: &mut NodeConfig) {
    config.sleep_after_ticks = 5;
    config.liveness_timeout = Duration::from_millis(200);
    config.leader_balance_interval = None;
}

/// Waits until every running node says every one of `groups` sleeps.
async fn wait_all_asleep(cluster: &Cluster, groups: &[GroupId]) {
    let patience = Duration::from_secs(10);
    if let Err(awake) = all_asleep_within(cluster, groups, patience).await {
        panic!("groups never fell asleep: {awake:?}");
    }
}

/// Makes node 1 the leader of every one of `groups`, writes once to each, and waits until they
/// all sleep.
async fn led_by_node_1_and_asleep(cluster: &Cluster, groups: &[GroupId]) {
    for &group in groups {
        cluster.node(1).campaign(group).unwrap();
    }
    for &group in groups {
        assert_eq!(cluster.leader(group).await, 1);
        cluster.propose(group, Bytes::new()).await;
    }
    wait_all_asleep(cluster, groups).await;
}

/// Waits up to 10 s until node `node` says every one of `groups` sleeps.
async fn wait_asleep_on(cluster: &Cluster, node: NodeId, groups: &[GroupId]) {
    let raft = &cluster.nodes[&node];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let awake: Vec<GroupId> = (groups.iter().copied())
            .filter(|&group| !raft.status(group).unwrap().asleep)
            .collect();
        if awake.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "groups never fell asleep on node {node}: {awake:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits up to `patience` until every running node says every one of `groups` sleeps; the
/// `(node, group)` pairs still awake if they do not.
async fn all_asleep_within(
    cluster: &Cluster,
    groups: &[GroupId],
    patience: Duration,
) -> Result<(), Vec<(NodeId, GroupId)>> {
    let deadline = Instant::now() + patience;
    loop {
        let awake: Vec<(NodeId, GroupId)> = cluster
            .nodes
            .iter()
            .flat_map(|(&node, raft)| {
                groups
                    .iter()
                    .filter(move |&&group| !raft.status(group).unwrap().asleep)
                    .map(move |&group| (node, group))
            })
            .collect();
        if awake.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(awake);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `(term, commit index)` of every group on every node.
fn progress(cluster: &Cluster, groups: &[GroupId]) -> BTreeMap<(NodeId, GroupId), (u64, u64)> {
    let mut out = BTreeMap::new();
    for (&node, raft) in &cluster.nodes {
        for &group in groups {
            let status = raft.status(group).unwrap();
            out.insert((node, group), (status.term, status.commit_index));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_groups_sleep_and_wake_on_a_proposal_a_read_and_a_message() {
    let groups = vec![1, 2, 3];
    let cluster = Cluster::reliable_tweaked(3, groups.clone(), BackendKind::Memory, sleepy);
    for &group in &groups {
        assert_eq!(
            decode_counter(&cluster.propose(group, Bytes::new()).await),
            1
        );
    }
    wait_all_asleep(&cluster, &groups).await;
    // Asleep, nothing moves: no election, no new entry, for many election timeouts.
    let before = progress(&cluster, &groups);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(progress(&cluster, &groups), before);

    // A proposal on the leader wakes group 1.
    let leader = cluster.leader(1).await;
    let answer = tokio::time::timeout(
        Duration::from_secs(2),
        cluster.node(leader).propose(1, Bytes::new()),
    )
    .await
    .expect("a sleeping leader answers a proposal");
    assert_eq!(decode_counter(&answer.unwrap()), 2);

    // A proposal through a follower wakes it, and it wakes the leader.
    let leader = cluster.leader(2).await;
    let follower = (1..=3).find(|&n| n != leader).unwrap();
    let answer = tokio::time::timeout(
        Duration::from_secs(2),
        cluster.node(follower).propose(2, Bytes::new()),
    )
    .await
    .expect("a sleeping follower forwards a proposal");
    assert_eq!(decode_counter(&answer.unwrap()), 2);

    // A linearizable read on a follower wakes group 3.
    let leader = cluster.leader(3).await;
    let follower = (1..=3).find(|&n| n != leader).unwrap();
    let read = tokio::time::timeout(
        Duration::from_secs(2),
        cluster.node(follower).read_barrier(3),
    )
    .await
    .expect("a sleeping group answers a read");
    assert!(read.unwrap() >= 2, "the read saw the first write");

    // Everything sleeps again; then a message wakes a follower: the leadership handed to
    // it (a message from the leader that makes it campaign, and its vote requests to the
    // other sleeping follower).
    wait_all_asleep(&cluster, &groups).await;
    // Asked again: on a slow machine an election may have moved it since the read.
    let leader = cluster.leader(3).await;
    let target = (1..=3).find(|&n| n != leader).unwrap();
    cluster.node(leader).transfer_leader(3, target).unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    while !cluster.node(target).status(3).unwrap().is_leader {
        assert!(
            Instant::now() < deadline,
            "node {target} never took over group 3"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(decode_counter(&cluster.propose(3, Bytes::new()).await), 2);
    wait_all_asleep(&cluster, &groups).await;
}

/// A group falls asleep (50 ms after its last write) before the state's flush (every 2 s)
/// has made what it applied durable: its log may only be compacted past the writes once the
/// flush comes, and the group is asleep then. It is compacted all the same, and stays asleep.
/// On disk: a memory state is durable at every commit, so its group is compacted awake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_asleep_before_its_state_is_durable_is_compacted_as_it_sleeps() {
    let cluster = Cluster::reliable_tweaked(3, vec![1], BackendKind::Redb, |config| {
        sleepy(config);
        config.log_keep_entries = 4;
    });
    for _ in 0..20 {
        cluster.propose(1, Bytes::new()).await;
    }
    wait_all_asleep(&cluster, &[1]).await;
    let asleep = progress(&cluster, &[1]);
    let last_index = asleep.values().map(|&(_, commit)| commit).max().unwrap();
    // Compaction keeps four entries and goes in steps of at least four.
    let compacted_past = last_index - 8;
    let deadline = Instant::now() + Duration::from_secs(10);
    for node in 1..=3 {
        while first_log_index(&cluster.stores[&node], 1) <= compacted_past {
            assert!(
                Instant::now() < deadline,
                "node {node}'s log starts at {}, not past {compacted_past}",
                first_log_index(&cluster.stores[&node], 1)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert_eq!(progress(&cluster, &[1]), asleep, "the group woke");
    wait_all_asleep(&cluster, &[1]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_lost_while_its_groups_sleep_is_replaced() {
    let groups = vec![1, 2];
    let mut cluster = Cluster::reliable_tweaked(3, groups.clone(), BackendKind::Memory, sleepy);
    for &group in &groups {
        cluster.propose(group, Bytes::new()).await;
    }
    wait_all_asleep(&cluster, &groups).await;
    let old_leader = cluster.leader(1).await;
    let stopped_at = Instant::now();
    // A crash, not a graceful stop: cut off first, so that it cannot hand its leaderships
    // over on the way out.
    cluster.network.isolate(old_leader, &[1, 2, 3]);
    cluster.stop_node(old_leader);
    let new_leader = cluster.leader(1).await;
    let replaced_after = stopped_at.elapsed();
    assert_ne!(new_leader, old_leader);
    // Liveness timeout (200 ms) plus an election timeout (100–200 ms with 10 ms ticks),
    // with room for a slow machine.
    eprintln!("replaced after {replaced_after:?}");
    assert!(
        replaced_after < Duration::from_secs(3),
        "took {replaced_after:?}"
    );
    assert_eq!(decode_counter(&cluster.propose(1, Bytes::new()).await), 2);
    assert_eq!(decode_counter(&cluster.propose(2, Bytes::new()).await), 2);
}

/// A leader whose node restarts at once while its groups sleep, having lost its data (so that
/// it will not campaign): its followers see it come back (a new connection), never fall
/// silent, and wake; one of them is elected within an election timeout or two of its return.
/// Before, they slept on with the lost leader until something else woke them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_back_at_once_without_its_data_while_its_groups_sleep_is_replaced() {
    // Silence would wake the followers only after 10 s: here only the return can. Ticks of
    // 200 ms make the restart, a few milliseconds, fall between two of them, so that no
    // follower looks while node 1 is away; elections after 1–2 s.
    fn slow_to_notice_silence(config: &mut NodeConfig) {
        sleepy(config);
        config.tick_interval = Duration::from_millis(200);
        config.heartbeat_ticks = 1;
        config.election_ticks = 5;
        config.liveness_timeout = Duration::from_secs(10);
    }
    let groups = vec![1, 2, 3, 4];
    let mut cluster = Cluster::reliable_tweaked(
        3,
        groups.clone(),
        BackendKind::Memory,
        slow_to_notice_silence,
    );
    led_by_node_1_and_asleep(&cluster, &groups).await;
    // A crash (cut off first, so that it hands nothing over on the way out) and its data gone.
    cluster.network.isolate(1, &[1, 2, 3]);
    cluster.stop_node(1);
    cluster.memory_stores.remove(&1);
    cluster.network.heal();
    // Back, it asks the others where each group stands only when its own election timeout
    // ends: 5 s away here, so that its questions wake nothing before the test is over.
    cluster.tweak = |config| {
        slow_to_notice_silence(config);
        config.election_ticks = 25;
        config.catch_up_before_voting = true;
    };
    cluster.start_node(1);
    let started_at = Instant::now();
    // The restart noticed at the next tick, an election 1–2 s later; room for a loaded
    // machine, below the 10 s of silence.
    let patience = Duration::from_secs(5);
    let replaced = |cluster: &Cluster| {
        (groups.iter()).all(|&group| {
            [2, 3].iter().all(|&node| {
                let leader = cluster.node(node).status(group).unwrap().leader;
                leader == 2 || leader == 3
            })
        })
    };
    while !replaced(&cluster) {
        assert!(
            started_at.elapsed() < patience,
            "the lost leader was not replaced within {patience:?}: {:?}",
            (groups.iter())
                .map(|&group| cluster.node(2).status(group).unwrap().leader)
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("replaced {:?} after the restart", started_at.elapsed());
    for &group in &groups {
        assert_eq!(
            decode_counter(&cluster.propose(group, Bytes::new()).await),
            2
        );
    }
}

/// A leader restarted at once with its data, its groups awake and then asleep: the followers
/// hear of the restart, forget the leader and elect one of them within a few ticks, where
/// before they waited out their election timeout (3–6 s here) from the leader's last word or,
/// asleep, from its return.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_restarted_at_once_is_replaced_within_a_few_ticks() {
    fn slow_to_elect(config: &mut NodeConfig) {
        config.tick_interval = Duration::from_millis(100);
        config.heartbeat_ticks = 1;
        config.election_ticks = 30;
        config.liveness_timeout = Duration::from_secs(30);
        config.leader_balance_interval = None;
    }
    fn slow_to_elect_and_sleepy(config: &mut NodeConfig) {
        slow_to_elect(config);
        config.sleep_after_ticks = 5;
    }
    for (asleep, tweak) in [
        (false, slow_to_elect as fn(&mut NodeConfig)),
        (true, slow_to_elect_and_sleepy),
    ] {
        let groups = vec![1, 2, 3, 4];
        let mut cluster = Cluster::reliable_tweaked(3, groups.clone(), BackendKind::Memory, tweak);
        if asleep {
            led_by_node_1_and_asleep(&cluster, &groups).await;
        } else {
            for &group in &groups {
                cluster.node(1).campaign(group).unwrap();
            }
            for &group in &groups {
                assert_eq!(cluster.leader(group).await, 1);
                cluster.propose(group, Bytes::new()).await;
            }
        }
        // A crash (cut off first, so that it hands nothing over on the way out), and at once
        // a new run on the same data.
        cluster.network.isolate(1, &[1, 2, 3]);
        let crashed_at = Instant::now();
        cluster.stop_node(1);
        cluster.network.heal();
        cluster.start_node(1);
        // Two ticks and an election; the election timeout alone is 3 s or more.
        let patience = Duration::from_secs(2);
        let replaced = |cluster: &Cluster| {
            (groups.iter()).all(|&group| {
                let leaders: Vec<NodeId> = [2, 3]
                    .iter()
                    .map(|&node| cluster.node(node).status(group).unwrap().leader)
                    .collect();
                leaders[0] == leaders[1] && (leaders[0] == 2 || leaders[0] == 3)
            })
        };
        while !replaced(&cluster) {
            assert!(
                crashed_at.elapsed() < patience,
                "the restarted leader was not replaced within {patience:?} (asleep: {asleep}): \
                 {:?}",
                (groups.iter())
                    .map(|&group| cluster.node(2).status(group).unwrap().leader)
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        eprintln!(
            "replaced {:?} after the crash (asleep: {asleep})",
            crashed_at.elapsed()
        );
        // Both followers were chosen for some of the groups.
        let new_leaders: BTreeMap<GroupId, NodeId> = (groups.iter())
            .map(|&group| (group, cluster.node(2).status(group).unwrap().leader))
            .collect();
        assert!(
            new_leaders.values().any(|&l| l == 2) && new_leaders.values().any(|&l| l == 3),
            "{new_leaders:?}"
        );
        for &group in &groups {
            assert_eq!(
                decode_counter(&cluster.propose(group, Bytes::new()).await),
                2
            );
        }
    }
}

/// A member back from a restart learns at once who leads the groups asleep on their leader:
/// the leader wakes them when it sees the member come back. Left asleep, they would send it
/// nothing, and it would learn only when its own election timeout (3–6 s here) ended and its
/// pre-vote woke them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_back_from_a_restart_learns_the_sleeping_groups_leader_at_once() {
    // Down for several of the leader's ticks, as a process restarting is.
    let restart = RestartWhileAsleep {
        tweak: |config| {
            sleepy(config);
            config.election_ticks = 300;
        },
        down_for: Duration::from_millis(100),
        patience: Duration::from_secs(1),
    };
    restart.learns_every_leader().await;
}

/// The same when the member is back before the leader's next tick, so that the leader never
/// sees it down (a quick restart; a member whose data was wiped and which is started again at
/// once): its new connection is what the leader notices. Ticks of 200 ms here make a restart
/// of a few milliseconds fall between two of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_back_before_the_leaders_next_tick_learns_the_sleeping_groups_leader_at_once() {
    let restart = RestartWhileAsleep {
        tweak: |config| {
            sleepy(config);
            config.tick_interval = Duration::from_millis(200);
            config.heartbeat_ticks = 1;
            config.election_ticks = 300;
        },
        down_for: Duration::ZERO,
        patience: Duration::from_secs(3),
    };
    restart.learns_every_leader().await;
}

/// Node 3 of three restarted while four groups led by node 1 sleep.
struct RestartWhileAsleep {
    /// The nodes' settings: sleepy, with elections slow enough that no member learns a leader
    /// from its own timeout.
    tweak: fn(&mut NodeConfig),
    /// How long node 3 stays down.
    down_for: Duration,
    /// How long node 3 may take to learn every group's leader.
    patience: Duration,
}

impl RestartWhileAsleep {
    /// Restarts node 3 and checks that it learns who leads every group within `patience`, and
    /// that the groups sleep again everywhere once it has their whole log.
    async fn learns_every_leader(&self) {
        let groups = vec![1, 2, 3, 4];
        let mut cluster =
            Cluster::reliable_tweaked(3, groups.clone(), BackendKind::Memory, self.tweak);
        led_by_node_1_and_asleep(&cluster, &groups).await;
        cluster.stop_node(3);
        tokio::time::sleep(self.down_for).await;
        cluster.start_node(3);
        let started_at = Instant::now();
        let knows_the_leader = |cluster: &Cluster| {
            (groups.iter()).all(|&group| cluster.node(3).status(group).unwrap().leader == 1)
        };
        while !knows_the_leader(&cluster) {
            assert!(
                started_at.elapsed() < self.patience,
                "node 3 did not learn who leads every group within {:?}",
                self.patience
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        eprintln!(
            "node 3 knew every leader {:?} after its start",
            started_at.elapsed()
        );
        wait_all_asleep(&cluster, &groups).await;
    }
}

/// Ticks of 100 µs, shorter than many of a node loop's iterations, so that a tick is due in
/// most iterations that step a leader's offers of sleep. Groups sleep after 500 still ticks
/// (50 ms); elections after 1–2 s and a silent node noticed after 2 s, so that a loaded
/// machine's pauses wake nothing.
fn sleepy_with_fine_ticks(config: &mut NodeConfig) {
    config.tick_interval = Duration::from_micros(100);
    config.election_ticks = 10_000;
    config.heartbeat_ticks = 200;
    config.sleep_after_ticks = 500;
    config.liveness_timeout = Duration::from_secs(2);
    config.leader_balance_interval = None;
}

/// A follower that takes its leader's offer of sleep in an iteration of its node's loop that
/// also ticks stays asleep. Were it recorded asleep only at the round's end, the tick would
/// take it for awake and wake it under a sleeping leader, where it would stay awake until its
/// election timeout (1 s or more here) ended and it campaigned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_takes_the_offer_of_sleep_as_a_tick_falls_due_stays_asleep() {
    let groups: Vec<GroupId> = (1..=64).collect();
    let cluster = Cluster::reliable_tweaked(
        3,
        groups.clone(),
        BackendKind::Memory,
        sleepy_with_fine_ticks,
    );
    for &group in &groups {
        cluster.node(1).campaign(group).unwrap();
    }
    // One write after another, so that the offers reach the followers at many moments of
    // their ticks' intervals.
    for round in 0..4 {
        for &group in &groups {
            assert_eq!(cluster.leader(group).await, 1);
            let value = decode_counter(&cluster.propose(group, Bytes::new()).await);
            assert_eq!(value, round + 1, "group {group}");
        }
        // The leader sleeps after 500 ticks, which a loaded machine stretches well past
        // 50 ms; its followers take its offer as it arrives, well under an election timeout
        // (10,000 ticks, 1 s or more) later.
        wait_asleep_on(&cluster, 1, &groups).await;
        let patience = Duration::from_millis(500);
        if let Err(awake) = all_asleep_within(&cluster, &groups, patience).await {
            panic!("round {round}: awake {patience:?} after the leader slept: {awake:?}");
        }
    }
}

/// The quiet the restarted member of the test below said before its restart: 4 s, against
/// 90 ms of its own (10 ticks of 10 ms).
const PREVIOUS_QUIET: Duration = Duration::from_secs(4);

/// `sleepy`, and a vote quiet said before the restart that is longer than the ticks give.
fn sleepy_with_a_long_previous_quiet(config: &mut NodeConfig) {
    sleepy(config);
    config.previous_vote_quiet = PREVIOUS_QUIET;
}

/// A member restarted with a longer quiet to keep than its ticks give (`previous_vote_quiet`)
/// holds its vote for that long after it opens. Asleep, its group is not ticked, so the time
/// asleep counts toward the hold when it wakes. Were it not to, the member, woken when its
/// leader's node falls silent long after the quiet was over, would refuse every vote for the
/// hold's remaining ticks (about 4 s), and the group would have no leader meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_restarted_into_sleep_counts_the_time_asleep_toward_its_vote_hold() {
    let groups = vec![1];
    let mut cluster = Cluster::reliable_tweaked(3, groups.clone(), BackendKind::Memory, sleepy);
    cluster.propose(1, Bytes::new()).await;
    wait_all_asleep(&cluster, &groups).await;
    let leader = cluster.leader(1).await;
    let restarted = (1..=3).find(|&n| n != leader).unwrap();
    cluster.stop_node(restarted);
    cluster.tweak = sleepy_with_a_long_previous_quiet;
    cluster.start_node(restarted);
    let restarted_at = Instant::now();
    // A write wakes the group; the restarted member hears from the leader, and the group
    // falls asleep everywhere again while the member's hold still runs. The member declines
    // the leader's offer of sleep if it has not applied the write yet; another write brings
    // another offer.
    let mut writes = 1;
    loop {
        cluster.propose(1, Bytes::new()).await;
        writes += 1;
        let patience = Duration::from_millis(500);
        if all_asleep_within(&cluster, &groups, patience).await.is_ok() {
            break;
        }
        assert!(
            restarted_at.elapsed() < PREVIOUS_QUIET / 2,
            "the group did not fall asleep on every node while the hold ran"
        );
    }
    let asleep_after = restarted_at.elapsed();

    // Long after the hold is over, the leader's node is lost.
    tokio::time::sleep_until((restarted_at + PREVIOUS_QUIET + Duration::from_millis(200)).into())
        .await;
    cluster.network.isolate(leader, &[1, 2, 3]);
    cluster.stop_node(leader);
    let stopped_at = Instant::now();
    let new_leader = cluster.leader(1).await;
    let replaced_after = stopped_at.elapsed();
    eprintln!("asleep again {asleep_after:?} after the restart; replaced after {replaced_after:?}");
    assert_ne!(new_leader, leader);
    // Liveness timeout (200 ms) plus an election timeout (100–200 ms), with room for a slow
    // machine; the hold's leftover ticks would have added about 4 s.
    assert!(
        replaced_after < Duration::from_secs(2),
        "the leader was replaced only after {replaced_after:?}"
    );
    assert_eq!(
        decode_counter(&cluster.propose(1, Bytes::new()).await),
        writes + 1
    );
}

/// Writes in bursts with pauses long enough for groups to fall asleep between them, over a
/// network that loses and reorders messages, with a leader stopped and restarted while its
/// groups sleep: every acknowledged write is on every node at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_acknowledged_write_is_lost_with_sleeping_groups_on_a_faulty_network() {
    let seed = common::network_seed(11);
    let groups: Vec<GroupId> = vec![1, 2, 3, 4];
    let mut cluster = Cluster::start_tweaked(
        3,
        groups.clone(),
        BackendKind::Memory,
        FaultConfig {
            seed,
            drop_probability: 0.05,
            max_delay: Duration::from_millis(5),
        },
        sleepy,
    );
    let mut acknowledged: BTreeMap<GroupId, i64> = BTreeMap::new();
    for burst in 0..6u64 {
        for write in 0..8u64 {
            let group = groups[((burst * 3 + write) % groups.len() as u64) as usize];
            let value = decode_counter(&cluster.propose(group, Bytes::new()).await);
            let expected = acknowledged.entry(group).or_default();
            *expected += 1;
            assert_eq!(value, *expected, "group {group}");
        }
        // Long enough for still groups to sleep (lost messages may keep some awake).
        tokio::time::sleep(Duration::from_millis(300)).await;
        if burst == 2 {
            // The leader of group 1 crashes while its groups sleep, and comes back.
            let leader = cluster.leader(1).await;
            cluster.network.isolate(leader, &[1, 2, 3]);
            cluster.stop_node(leader);
            tokio::time::sleep(Duration::from_millis(300)).await;
            cluster.network.heal();
            cluster.start_node(leader);
        }
    }
    for &group in &groups {
        cluster.wait_caught_up_with_leader(group).await;
        for node in 1..=3 {
            assert_eq!(
                counter_on(&cluster, node, group),
                acknowledged[&group],
                "node {node}, group {group}"
            );
        }
    }
}

/// A member started without its data waits for its leader's snapshot. Were the leader's word
/// to it lost at the wrong moment (the snapshot's ticket and the heartbeats after it, as a
/// send queue that overflowed would lose them) while the group falls asleep on the leader,
/// nothing more would come from the leader: the member asks again every election timeout
/// until it has caught up. (Before, it asked only until it first heard of a commit index,
/// and waited forever.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_without_its_data_whose_snapshot_was_lost_asks_a_sleeping_leader_again() {
    let groups = vec![1];
    let mut cluster = Cluster::reliable_tweaked(3, groups.clone(), BackendKind::Memory, sleepy);
    for _ in 0..10 {
        cluster.propose(1, Bytes::new()).await;
    }
    wait_all_asleep(&cluster, &groups).await;
    let leader = cluster.leader(1).await;
    let wiped = (1..=3).find(|&node| node != leader).unwrap();
    cluster.stop_node(wiped);
    cluster.memory_stores.remove(&wiped);
    cluster
        .network
        .hold_one_way(leader, wiped, MessageType::MsgSnapshot);
    let tickets_before = cluster.network.sent(MessageType::MsgSnapshot);
    cluster.tweak = |config| {
        sleepy(config);
        config.catch_up_before_voting = true;
    };
    cluster.start_node(wiped);
    // A ticket sent (and held) means the member heard the commit index and asked.
    let started_at = Instant::now();
    while cluster.network.sent(MessageType::MsgSnapshot) == tickets_before {
        assert!(
            started_at.elapsed() < Duration::from_secs(10),
            "no snapshot was offered to node {wiped}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cluster
        .network
        .hold_one_way(leader, wiped, MessageType::MsgHeartbeat);
    wait_asleep_on(&cluster, leader, &groups).await;
    assert!(cluster.network.lose_held(leader, wiped) > 0);
    let applied = cluster.node(leader).status(1).unwrap().applied_index;
    let lost_at = Instant::now();
    while cluster.node(wiped).status(1).unwrap().applied_index < applied {
        assert!(
            lost_at.elapsed() < Duration::from_secs(5),
            "node {wiped} never caught up with the sleeping leader: {:?}",
            cluster.node(wiped).status(1).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!(
        "node {wiped} caught up {:?} after the loss",
        lost_at.elapsed()
    );
    assert_eq!(counter_on(&cluster, wiped, 1), 10);
}
