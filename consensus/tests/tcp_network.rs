//! Raft nodes talking over loopback TCP: replication through real sockets, and peers that
//! speak wrongly refused while the cluster goes on.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{HookedLog, counter_factory, decode_counter, fast_config, leader_among};
use concord_consensus::GroupMessage;
use concord_consensus::transport::{
    MessageSink, PeerConnection, PeerTls, SnapshotFetchError, TcpNetwork, TcpNetworkConfig,
    TcpNetworkStats, encode_batch,
};
use concord_consensus::{Consensus, NodeConfig, NodeId, ProposeError, RaftNode, Transport};
use concord_storage::{GroupId, LogStore, MemLogStore, MemStateStore, Stores};

const CLUSTER_ID: u64 = 0xC0C0;

/// A loopback listener on a free port for each of nodes `1..=nodes`, and their addresses.
fn bound_listeners(nodes: u64) -> (BTreeMap<NodeId, TcpListener>, BTreeMap<NodeId, SocketAddr>) {
    let listeners: BTreeMap<NodeId, TcpListener> = (1..=nodes)
        .map(|node| (node, TcpListener::bind("127.0.0.1:0").unwrap()))
        .collect();
    let addresses = listeners
        .iter()
        .map(|(&node, listener)| (node, listener.local_addr().unwrap()))
        .collect();
    (listeners, addresses)
}

struct TcpCluster {
    networks: BTreeMap<NodeId, Arc<TcpNetwork>>,
    nodes: BTreeMap<NodeId, Arc<RaftNode>>,
}

impl TcpCluster {
    fn start(size: u64, frame_read_timeout: Duration) -> TcpCluster {
        TcpCluster::start_with(size, frame_read_timeout, |_| None)
    }

    /// [`TcpCluster::start`] with `tls(node)` as each node's TLS settings.
    fn start_with(
        size: u64,
        frame_read_timeout: Duration,
        tls: impl Fn(NodeId) -> Option<PeerTls>,
    ) -> TcpCluster {
        TcpCluster::start_nodes(size, |node, _, network| {
            network.frame_read_timeout = frame_read_timeout;
            network.tls = tls(node);
            Stores {
                log: Arc::new(MemLogStore::new()),
                state: Arc::new(MemStateStore::new()),
            }
        })
    }

    /// `size` nodes, where `setup(node, config, network)` may change each node's config
    /// (groups 0 and 1 by default) and its network's, and returns its stores.
    fn start_nodes(
        size: u64,
        setup: impl Fn(NodeId, &mut NodeConfig, &mut TcpNetworkConfig) -> Stores,
    ) -> TcpCluster {
        let (listeners, addresses) = bound_listeners(size);
        let voters: Vec<NodeId> = (1..=size).collect();
        let mut cluster = TcpCluster {
            networks: BTreeMap::new(),
            nodes: BTreeMap::new(),
        };
        for (node, listener) in listeners {
            let mut network_config = TcpNetworkConfig::new(CLUSTER_ID, node, addresses.clone());
            network_config.client_url = format!("http://node-{node}.test");
            let mut config = fast_config(node, voters.clone(), vec![0, 1]);
            let stores = setup(node, &mut config, &mut network_config);
            let network = TcpNetwork::start(network_config, listener).unwrap();
            let raft =
                RaftNode::start(config, stores, counter_factory(), network.transport()).unwrap();
            network.deliver_to(raft.sink());
            cluster.networks.insert(node, network);
            cluster.nodes.insert(node, raft);
        }
        cluster
    }

    async fn leader(&self, group: u64) -> NodeId {
        leader_among(&self.nodes, group).await
    }

    /// Adds 1 to `group`'s counter through its leader, retrying refusals that did not apply.
    async fn increment(&self, group: u64) -> i64 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let leader = self.leader(group).await;
            let command = Bytes::from(1i64.to_le_bytes().to_vec());
            match self.nodes[&leader].propose(group, command).await {
                Ok(total) => return decode_counter(&total),
                Err(error) if !error.may_have_applied() => {}
                Err(error) => panic!("increment failed: {error}"),
            }
            assert!(Instant::now() < deadline, "no increment went through");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Fetches group 0's state from `source` through another node's network: a valid stream
    /// that installs into another store, at least as far as `source` had applied.
    async fn fetch_group_0_from(&self, source: NodeId) {
        use concord_consensus::transport::Transport;
        use concord_storage::StateStore;
        let applied = self.nodes[&source].status(0).unwrap().applied_index;
        let fetcher = self.networks[&(source % 3 + 1)].clone();
        let fetched = tokio::task::spawn_blocking(move || {
            let mut stream = Vec::new();
            fetcher
                .fetch_snapshot(source, 0, applied, &mut stream)
                .map(|()| stream)
        })
        .await
        .unwrap()
        .expect("the node serves its state");
        let store = MemStateStore::new();
        let installed =
            concord_storage::import_snapshot(&store, 0, &mut fetched.as_slice()).unwrap();
        assert!(installed >= applied);
        assert_eq!(store.applied_index(0).unwrap(), installed);
    }

    async fn wait_applied_everywhere(&self, group: u64, index: u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self
            .nodes
            .values()
            .any(|node| node.status(group).unwrap().applied_index < index)
        {
            assert!(Instant::now() < deadline, "not every node applied {index}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for TcpCluster {
    fn drop(&mut self) {
        for node in self.nodes.values() {
            node.shutdown();
        }
        for network in self.networks.values() {
            network.shutdown();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_replicate_over_tcp() {
    let cluster = TcpCluster::start(3, Duration::from_secs(10));
    for group in [0, 1] {
        for expected in 1..=20 {
            assert_eq!(cluster.increment(group).await, expected);
        }
        let leader = cluster.leader(group).await;
        let index = cluster.nodes[&leader].status(group).unwrap().applied_index;
        cluster.wait_applied_everywhere(group, index).await;
    }
    for (node, network) in &cluster.networks {
        let TcpNetworkStats {
            frames_sent,
            frames_received,
            connections,
            connections_refused,
            bad_frames,
            ..
        } = network.stats();
        assert!(
            frames_sent > 0 && frames_received > 0,
            "node {node}: {:?}",
            network.stats()
        );
        assert!(connections >= 2, "node {node} dialled {connections} peers");
        assert_eq!((connections_refused, bad_frames), (0, 0), "node {node}");
        // The peers dialled before the node was set: their connections were read on the
        // network's runtime, then taken by the node between two frames.
        let read_by_node = |s: &TcpNetworkStats| s.connections_read_by_node;
        wait_for(network, "connections read by the node", read_by_node, 2).await;
        // Every node learned every node's client URL from the hellos.
        let urls: Vec<(NodeId, String)> = network.client_urls().into_iter().collect();
        let expected: Vec<(NodeId, String)> = (1..=3)
            .map(|n| (n, format!("http://node-{n}.test")))
            .collect();
        assert_eq!(urls, expected, "node {node}");
    }
    // A follower forwards a write to the leader over the wire and answers with its own result.
    let leader = cluster.leader(0).await;
    let follower = (1..=3).find(|&n| n != leader).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let total = loop {
        let command = Bytes::from(1i64.to_le_bytes().to_vec());
        match cluster.nodes[&follower].propose(0, command).await {
            Ok(total) => break decode_counter(&total),
            Err(error) if !error.may_have_applied() && Instant::now() < deadline => {}
            Err(error) => panic!("the follower's write failed: {error}"),
        }
    };
    assert_eq!(total, 21);
}

/// A peer that connected to a node's listener before the node started (the listener is bound
/// first, so that its port can be told to the peers) is taken, not refused as unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_dialled_before_the_node_started_is_taken() {
    let (listeners, addresses) = bound_listeners(2);
    let start = |node: NodeId, listener: TcpListener| {
        let mut config = TcpNetworkConfig::new(CLUSTER_ID, node, addresses.clone());
        config.client_url = format!("http://node-{node}.test");
        TcpNetwork::start(config, listener).unwrap()
    };
    let mut listeners = listeners.into_iter();
    let (_, first_listener) = listeners.next().unwrap();
    let (_, second_listener) = listeners.next().unwrap();
    let first = start(1, first_listener);
    // Node 1's connection and hello wait in node 2's backlog.
    wait_for(&first, "connections", |s| s.connections, 1).await;
    let second = start(2, second_listener);
    wait_until("node 2 reads node 1's hello", || {
        second.client_urls().contains_key(&1)
    })
    .await;
    assert_eq!(
        second.stats().connections_refused,
        0,
        "{:?}",
        second.stats()
    );
    first.shutdown();
    second.shutdown();
}

/// The peers a network knows are those it started with and those added since, kept in its
/// file across restarts: a member started alone and joined by others later still knows them
/// after a restart whose settings name it alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_knows_the_peers_added_since_it_started_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let start = || {
        let (mut listeners, addresses) = bound_listeners(1);
        let mut config = TcpNetworkConfig::new(CLUSTER_ID, 1, addresses);
        config.peers_file = Some(dir.path().join("peers"));
        TcpNetwork::start(config, listeners.remove(&1).unwrap()).unwrap()
    };
    let alone = start();
    assert_eq!(alone.known_peers(), Vec::<NodeId>::new());
    alone.add_peer(2, "127.0.0.1:9");
    assert_eq!(alone.known_peers(), vec![2]);
    alone.shutdown();
    let restarted = start();
    assert_eq!(restarted.known_peers(), vec![2]);
    restarted.shutdown();
}

/// A hello of `version` with no client URL (and, from version 4, a vote quiet of 900 ms).
fn hello(cluster_id: u64, node_id: u64, version: u16) -> Vec<u8> {
    let mut bytes = b"CNCD".to_vec();
    bytes.extend_from_slice(&version.to_le_bytes());
    bytes.extend_from_slice(&cluster_id.to_le_bytes());
    bytes.extend_from_slice(&node_id.to_le_bytes());
    bytes.push(0); // Raft messages follow.
    bytes.extend_from_slice(&0u16.to_le_bytes()); // No client URL.
    if version >= 4 {
        bytes.extend_from_slice(&900u32.to_le_bytes());
    }
    if version >= 5 {
        bytes.extend_from_slice(&1u64.to_le_bytes()); // The run's incarnation.
    }
    bytes
}

/// The wire version this build speaks.
const VERSION: u16 = 5;

/// Waits until `read` of node 1's stats reaches `at_least`.
async fn wait_for(
    network: &TcpNetwork,
    what: &str,
    read: fn(&TcpNetworkStats) -> u64,
    at_least: u64,
) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while read(&network.stats()) < at_least {
        assert!(
            Instant::now() < deadline,
            "{what} never reached {at_least}: {:?}",
            network.stats()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A node's side of the network that records which peers it was told restarted, and counts
/// the connections offered to it (each after its hello was read).
#[derive(Default)]
struct RestartRecorder {
    restarted: parking_lot::Mutex<Vec<NodeId>>,
    offered: std::sync::atomic::AtomicUsize,
}

impl MessageSink for RestartRecorder {
    fn deliver(&self, _from: NodeId, _messages: Vec<GroupMessage>) {}

    fn write_snapshot(
        &self,
        _group: GroupId,
        _min_index: u64,
        _out: &mut dyn Write,
    ) -> Result<u64, SnapshotFetchError> {
        Err(SnapshotFetchError::Refused("no state here".into()))
    }

    fn peer_restarted(&self, node: NodeId) {
        self.restarted.lock().push(node);
    }

    fn adopt(&self, connection: Box<PeerConnection>) -> Result<(), Box<PeerConnection>> {
        self.offered.fetch_add(1, Ordering::AcqRel);
        Err(connection)
    }
}

/// A peer's hellos name its run (from wire version 5): more connections of one run tell the
/// node nothing, the first of a new run tells it the peer restarted, and a hello that names
/// no run (an older version) tells nothing either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_run_of_a_peer_is_told_to_the_node() {
    let (mut listeners, addresses) = bound_listeners(2);
    let listener = listeners.remove(&1).unwrap();
    let network =
        TcpNetwork::start(TcpNetworkConfig::new(CLUSTER_ID, 1, addresses), listener).unwrap();
    let recorder = Arc::new(RestartRecorder::default());
    let sink: Arc<dyn MessageSink> = recorder.clone();
    network.deliver_to(Arc::downgrade(&sink));
    let mut open = Vec::new();
    let runs: [(u16, Option<u64>, &[NodeId]); 6] = [
        (VERSION, Some(7), &[]),
        (VERSION, Some(7), &[]),
        (VERSION, Some(8), &[2]),
        (VERSION - 1, None, &[2]),
        (VERSION, Some(8), &[2]),
        (VERSION, Some(9), &[2, 2]),
    ];
    for (hellos, (version, incarnation, told)) in runs.into_iter().enumerate() {
        let mut bytes = hello(CLUSTER_ID, 2, version);
        if let Some(incarnation) = incarnation {
            let at = bytes.len() - 8;
            bytes[at..].copy_from_slice(&incarnation.to_le_bytes());
        }
        let mut stream = TcpStream::connect(network.local_addr()).unwrap();
        stream.write_all(&bytes).unwrap();
        open.push(stream);
        wait_until("the connection is offered to the node", || {
            recorder.offered.load(Ordering::Acquire) > hellos
        })
        .await;
        assert_eq!(*recorder.restarted.lock(), told, "after hello {hellos}");
    }
}

/// Another cluster, another wire version, an unknown node, not a peer at all, an oversized
/// frame, a garbage frame, a stalled frame and a forged sender: each connection is closed and
/// counted, and the cluster keeps committing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_peers_are_refused_and_the_cluster_keeps_serving() {
    let cluster = TcpCluster::start(3, Duration::from_millis(300));
    assert_eq!(cluster.increment(0).await, 1);
    let target = &cluster.networks[&1];
    let address = target.local_addr();
    let send = |bytes: Vec<u8>| {
        let mut stream = TcpStream::connect(address).unwrap();
        stream.write_all(&bytes).unwrap();
        stream
    };
    let refused = |s: &TcpNetworkStats| s.connections_refused;
    let bad = |s: &TcpNetworkStats| s.bad_frames;
    let read_by_node = |s: &TcpNetworkStats| s.connections_read_by_node;

    let _other_cluster = send(hello(CLUSTER_ID + 1, 2, VERSION));
    wait_for(target, "refusals", refused, 1).await;
    let _other_version = send(hello(CLUSTER_ID, 2, 999));
    wait_for(target, "refusals", refused, 2).await;
    let _unknown_node = send(hello(CLUSTER_ID, 9, VERSION));
    wait_for(target, "refusals", refused, 3).await;
    let _not_a_peer = send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec());
    wait_for(target, "refusals", refused, 4).await;
    let mut long_url = hello(CLUSTER_ID, 2, VERSION);
    long_url[23..25].copy_from_slice(&u16::MAX.to_le_bytes());
    let _long_url = send(long_url);
    wait_for(target, "refusals", refused, 5).await;

    let mut oversized = hello(CLUSTER_ID, 2, VERSION);
    oversized.extend_from_slice(&u32::MAX.to_le_bytes());
    // From here on each connection's hello is good: the node's raft worker reads what follows.
    let taken_before = read_by_node(&target.stats());
    let _oversized = send(oversized);
    wait_for(target, "bad frames", bad, 1).await;

    let mut garbage = hello(CLUSTER_ID, 2, VERSION);
    garbage.extend_from_slice(&8u32.to_le_bytes());
    garbage.extend_from_slice(&[0xFF; 8]);
    let _garbage = send(garbage);
    wait_for(target, "bad frames", bad, 2).await;

    let mut stalled = hello(CLUSTER_ID, 2, VERSION);
    stalled.extend_from_slice(&100u32.to_le_bytes());
    stalled.extend_from_slice(&[0; 10]);
    let _stalled = send(stalled);
    wait_for(target, "bad frames", bad, 3).await;

    // A frame from "node 2" whose message says it comes from node 3.
    let mut forged = hello(CLUSTER_ID, 2, VERSION);
    let mut message = concord_storage::raft::prelude::Message::default();
    message.from = 3;
    message.to = 1;
    let body = {
        use protobuf::Message as _;
        let encoded = message.write_to_bytes().unwrap();
        let mut body = 1u32.to_le_bytes().to_vec();
        body.extend_from_slice(&0u64.to_le_bytes());
        body.extend_from_slice(&0u64.to_le_bytes());
        body.extend_from_slice(&(encoded.len() as u32).to_le_bytes());
        body.extend_from_slice(&encoded);
        body
    };
    forged.extend_from_slice(&(body.len() as u32).to_le_bytes());
    forged.extend_from_slice(&body);
    let _forged = send(forged);
    wait_for(target, "bad frames", bad, 4).await;

    assert!(
        read_by_node(&target.stats()) >= taken_before + 4,
        "the bad frames were read on the network's runtime: {:?}",
        target.stats()
    );

    // The cluster never noticed.
    for expected in 2..=10 {
        assert_eq!(cluster.increment(0).await, expected);
    }
    let stats = target.stats();
    assert_eq!(
        (stats.connections_refused, stats.bad_frames),
        (5, 4),
        "{stats:?}"
    );
    assert!(matches!(
        cluster.nodes[&1].propose(7, Bytes::new()).await,
        Err(ProposeError::UnknownGroup { group: 7 })
    ));
}

/// A node no peer names that dials on and on — a member removed but left running — is refused
/// each time, and the peers are asked where it is ever less often: once at the first dial and
/// again two seconds after, not once a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_node_that_dials_on_is_asked_about_ever_less_often() {
    let cluster = TcpCluster::start(3, Duration::from_millis(300));
    assert_eq!(cluster.increment(0).await, 1);
    let target = &cluster.networks[&1];
    let address = target.local_addr();
    let started = Instant::now();
    let mut dials = 0;
    while started.elapsed() < Duration::from_millis(3500) {
        let mut stream = TcpStream::connect(address).unwrap();
        stream.write_all(&hello(CLUSTER_ID, 9, VERSION)).unwrap();
        dials += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_for(target, "refusals", |s| s.connections_refused, dials).await;
    let stats = target.stats();
    assert_eq!(stats.peer_lookups, 2, "{dials} dials: {stats:?}");
    assert_eq!(cluster.increment(0).await, 2);
}

/// A snapshot travels over a connection of its own: fetched from a peer it is a valid stream
/// A connection the node's raft worker reads: a frame that arrives a few bytes at a time, one
/// larger than the worker's read buffer, and more frames in one write than one read takes are
/// each delivered whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_in_pieces_large_or_many_arrive_whole_at_the_raft_worker() {
    let cluster = TcpCluster::start(3, Duration::from_secs(5));
    assert_eq!(cluster.increment(0).await, 1);
    let target = &cluster.networks[&1];
    let frames = |s: &TcpNetworkStats| s.frames_received;
    let read_by_node = |s: &TcpNetworkStats| s.connections_read_by_node;
    let taken_before = read_by_node(&target.stats());
    let mut stream = TcpStream::connect(target.local_addr()).unwrap();
    stream.write_all(&hello(CLUSTER_ID, 2, VERSION)).unwrap();
    wait_for(
        target,
        "connections read by the node",
        read_by_node,
        taken_before + 1,
    )
    .await;
    let frame = |messages: &[GroupMessage]| {
        let body = encode_batch(messages);
        let mut frame = (body.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(&body);
        frame
    };
    // A group node 1 does not host: the frame is read and counted, its message dropped.
    let large = {
        let mut message = concord_storage::raft::prelude::Message::default();
        message.from = 2;
        message.to = 1;
        message.context = Bytes::from(vec![7u8; 300 * 1024]);
        GroupMessage {
            group: 999,
            message,
            replicated_floor: 0,
        }
    };

    let received = frames(&target.stats());
    for byte in frame(&[]) {
        stream.write_all(&[byte]).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_for(target, "frames", frames, received + 1).await;

    let large = frame(&[large]);
    for piece in large.chunks(100 * 1024) {
        stream.write_all(piece).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_for(target, "frames", frames, received + 2).await;

    let many: Vec<u8> = (0..300).flat_map(|_| frame(&[])).collect();
    stream.write_all(&many).unwrap();
    wait_for(target, "frames", frames, received + 302).await;

    let stats = target.stats();
    assert_eq!(stats.bad_frames, 0, "{stats:?}");
    assert_eq!(cluster.increment(0).await, 2);
}

/// that installs into another store; a request for a group the peer does not host, or beyond
/// what it applied, is refused with a reason; a request that stalls is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_fetched_over_their_own_connection() {
    use concord_consensus::transport::{SnapshotFetchError, Transport};
    let cluster = TcpCluster::start(3, Duration::from_millis(300));
    for expected in 1..=5 {
        assert_eq!(cluster.increment(0).await, expected);
    }
    let leader = cluster.leader(0).await;
    cluster.fetch_group_0_from(leader).await;

    let fetcher = cluster.networks[&(leader % 3 + 1)].clone();
    let refusals = tokio::task::spawn_blocking(move || {
        let unknown = fetcher.fetch_snapshot(leader, 99, 0, &mut Vec::new());
        let ahead = fetcher.fetch_snapshot(leader, 0, u64::MAX, &mut Vec::new());
        (unknown, ahead)
    })
    .await
    .unwrap();
    assert!(
        matches!(refusals.0, Err(SnapshotFetchError::Refused(ref r)) if r.contains("99")),
        "{:?}",
        refusals.0
    );
    assert!(
        matches!(refusals.1, Err(SnapshotFetchError::Refused(_))),
        "{:?}",
        refusals.1
    );

    // Several requests on one connection, each answered in its place: states, refusals.
    let fetcher = cluster.networks[&(leader % 3 + 1)].clone();
    wait_until("the fetcher hears the leader's version", || {
        heard_version(&fetcher, leader) == Some(VERSION)
    })
    .await;
    let applied = cluster.nodes[&leader].status(0).unwrap().applied_index;
    let (results, streams) = tokio::task::spawn_blocking(move || {
        let mut streams: Vec<Vec<u8>> = vec![Vec::new(); 4];
        let requests = [(0, applied), (99, 0), (0, u64::MAX), (0, 0)];
        let results = {
            let mut outs: Vec<&mut dyn Write> =
                streams.iter_mut().map(|s| s as &mut dyn Write).collect();
            fetcher.fetch_snapshots(leader, &requests, &mut outs)
        };
        (results, streams)
    })
    .await
    .unwrap();
    assert_eq!(results.len(), 4);
    assert!(results[0].is_ok() && results[3].is_ok(), "{results:?}");
    assert!(
        matches!(&results[1], Err(SnapshotFetchError::Refused(r)) if r.contains("99")),
        "{results:?}"
    );
    assert!(
        matches!(&results[2], Err(SnapshotFetchError::Refused(_))),
        "{results:?}"
    );
    assert!(streams[1].is_empty() && streams[2].is_empty());
    for stream in [&streams[0], &streams[3]] {
        let store = MemStateStore::new();
        let installed = concord_storage::import_snapshot(&store, 0, &mut stream.as_slice());
        assert!(installed.unwrap() >= applied);
    }

    // A snapshot request that never finishes its header is closed and counted.
    let target = &cluster.networks[&1];
    let mut stalled = hello(CLUSTER_ID, 2, VERSION);
    // After the magic, the version, the cluster id and the node id.
    let purpose_at = 4 + 2 + 8 + 8;
    stalled[purpose_at] = 1;
    stalled.extend_from_slice(&[0; 5]);
    let mut stream = TcpStream::connect(target.local_addr()).unwrap();
    stream.write_all(&stalled).unwrap();
    wait_for(target, "bad frames", |s| s.bad_frames, 1).await;
    // So are several requests that announce none, too many, or stall.
    let mut bad_frames = 1;
    for requests in [
        0u16.to_le_bytes().to_vec(),
        65u16.to_le_bytes().to_vec(),
        vec![2, 0, 7],
    ] {
        let mut several = hello(CLUSTER_ID, 2, VERSION);
        several[purpose_at] = 3;
        several.extend_from_slice(&requests);
        let mut stream = TcpStream::connect(target.local_addr()).unwrap();
        stream.write_all(&several).unwrap();
        bad_frames += 1;
        wait_for(target, "bad frames", |s| s.bad_frames, bad_frames).await;
    }
    // The cluster never noticed.
    assert_eq!(cluster.increment(0).await, 6);
}

/// A node started with a member list that lacks a member (its data directory, and so its peers
/// file, was lost; the list is older than the member) refuses that member's first dial, asks
/// the peers it knows where the member is, links it and keeps its address. A node that only
/// some peers know (the others may have removed it) is not learned, and its dials, refused
/// one after another, back off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_learns_a_members_address_it_was_not_given_from_its_peers() {
    let (mut listeners, addresses) = bound_listeners(4);
    let dir = tempfile::tempdir().unwrap();
    let peers_file = dir.path().join("peers");
    let start = |node: NodeId, listener: TcpListener, forgotten: &[NodeId]| {
        let mut known = addresses.clone();
        known.retain(|node, _| !forgotten.contains(node));
        let mut config = TcpNetworkConfig::new(CLUSTER_ID, node, known);
        if node == 3 {
            config.peers_file = Some(peers_file.clone());
        }
        TcpNetwork::start(config, listener).unwrap()
    };
    let fourth_listener = listeners.remove(&4).unwrap();
    let mut networks: BTreeMap<NodeId, Arc<TcpNetwork>> = listeners
        .into_iter()
        .map(|(node, listener)| {
            let forgotten: &[NodeId] = match node {
                1 => &[4],
                3 => &[1, 4],
                _ => &[],
            };
            (node, start(node, listener, forgotten))
        })
        .collect();
    let third = networks[&3].clone();
    assert!(third.peers().iter().all(|p| p.node != 1));
    wait_until("node 3 hears from node 1, whose address it learned", || {
        third
            .peers()
            .iter()
            .any(|p| p.node == 1 && p.address == addresses[&1] && p.last_heard.is_some())
    })
    .await;
    assert!(
        third.stats().connections_refused >= 1,
        "{:?}",
        third.stats()
    );
    let kept = std::fs::read_to_string(&peers_file).unwrap();
    assert_eq!(kept, format!("1={}\n", addresses[&1]));

    // Node 4, which node 2 knows and node 1 does not, dials node 3 (after the interval between
    // two lookups): refused, and still unknown once both were asked.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let refused_before = third.stats().connections_refused;
    let fourth = start(4, fourth_listener, &[]);
    networks.insert(4, fourth.clone());
    wait_for(
        &third,
        "refusals",
        |s| s.connections_refused,
        refused_before + 1,
    )
    .await;
    // Node 4 has messages for node 3 all along: each finds its connection gone at once.
    let sending_until = Instant::now() + Duration::from_millis(700);
    let transport = fourth.transport();
    while Instant::now() < sending_until {
        let mut message = concord_storage::raft::prelude::Message::default();
        (message.from, message.to) = (4, 3);
        let messages = vec![concord_consensus::transport::GroupMessage {
            group: 0,
            message,
            replicated_floor: 0,
        }];
        transport.send(3, messages);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(third.peers().iter().all(|p| p.node != 4));
    assert_eq!(std::fs::read_to_string(&peers_file).unwrap(), kept);
    // Node 4 dials again with a backoff, although each connection was taken before the
    // refusal (20 + 40 + 80 + 160 + 320 ms: five or six dials; without the backoff, one every
    // few milliseconds).
    let refusals = third.stats().connections_refused - refused_before;
    assert!(refusals <= 10, "{refusals} refusals of node 4");
    for network in networks.values() {
        network.shutdown();
    }
}

/// A CA and a certificate with its key for each of `nodes` nodes (all at 127.0.0.1), PEM.
fn test_pki(nodes: u64) -> (String, Vec<(String, String)>) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let certs = (0..nodes)
        .map(|_| {
            let key = rcgen::KeyPair::generate().unwrap();
            let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
            let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
            (cert.pem(), key.serialize_pem())
        })
        .collect();
    (ca.pem(), certs)
}

/// With TLS, the cluster replicates and serves snapshots as over plain TCP; a peer that
/// speaks plain TCP, or holds a certificate of another CA, is refused at the handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_over_mutual_tls() {
    use concord_consensus::transport::Transport;
    let (ca, certs) = test_pki(3);
    let tls_of = |node: NodeId| {
        let (cert, key) = &certs[node as usize - 1];
        Some(PeerTls::from_pem(ca.as_bytes(), cert.as_bytes(), key.as_bytes()).unwrap())
    };
    let cluster = TcpCluster::start_with(3, Duration::from_millis(500), tls_of);
    for group in [0, 1] {
        for expected in 1..=10 {
            assert_eq!(cluster.increment(group).await, expected);
        }
    }
    cluster.fetch_group_0_from(cluster.leader(0).await).await;

    // A plain hello is no TLS handshake; a certificate of another CA is not the cluster's.
    let target = &cluster.networks[&1];
    let _plain = {
        let mut stream = TcpStream::connect(target.local_addr()).unwrap();
        stream.write_all(&hello(CLUSTER_ID, 2, VERSION)).unwrap();
        stream
    };
    wait_for(target, "refused connections", |s| s.connections_refused, 1).await;
    let (other_ca, other_certs) = test_pki(1);
    let (cert, key) = &other_certs[0];
    let stranger = PeerTls::from_pem(other_ca.as_bytes(), cert.as_bytes(), key.as_bytes()).unwrap();
    let mut config =
        TcpNetworkConfig::new(CLUSTER_ID, 2, BTreeMap::from([(1, target.local_addr())]));
    config.tls = Some(stranger);
    let impostor = TcpNetwork::start(config, TcpListener::bind("127.0.0.1:0").unwrap()).unwrap();
    impostor.send(1, Vec::new());
    wait_for(target, "refused connections", |s| s.connections_refused, 2).await;
    impostor.shutdown();
    assert_eq!(cluster.increment(0).await, 11);

    // Unreadable settings are errors naming what is wrong, never a panic.
    assert!(PeerTls::from_pem(b"not pem", b"", b"").is_err());
    let missing = PeerTls::from_files(
        "/nonexistent/ca.pem".as_ref(),
        "/nonexistent/cert.pem".as_ref(),
        "/nonexistent/key.pem".as_ref(),
    );
    assert!(
        missing
            .unwrap_err()
            .to_string()
            .contains("/nonexistent/ca.pem")
    );
}

/// What a member of the previous protocol version saw: the version named by every hello a
/// node sent it. It reads each hello and closes the connection, as a node refusing a hello
/// does, so the sender dials again.
struct HelloRecorder {
    address: SocketAddr,
    versions: Arc<parking_lot::Mutex<Vec<u16>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl HelloRecorder {
    fn start() -> HelloRecorder {
        use std::io::Read;
        use std::sync::atomic::Ordering;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let recorder = HelloRecorder {
            address: listener.local_addr().unwrap(),
            versions: Default::default(),
            stop: Default::default(),
        };
        let (versions, stop) = (recorder.versions.clone(), recorder.stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                let Ok((mut stream, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                stream.set_nonblocking(false).unwrap();
                stream
                    .set_read_timeout(Some(Duration::from_secs(1)))
                    .unwrap();
                let mut head = [0u8; 6];
                if stream.read_exact(&mut head).is_ok() {
                    versions.lock().push(u16::from_le_bytes([head[4], head[5]]));
                }
            }
        });
        recorder
    }

    fn versions(&self) -> Vec<u16> {
        self.versions.lock().clone()
    }
}

impl Drop for HelloRecorder {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// The version node 1 last heard `node` speak.
fn heard_version(network: &TcpNetwork, node: NodeId) -> Option<u16> {
    let peers = network.peers();
    peers.iter().find(|p| p.node == node)?.wire_version
}

async fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A rolling upgrade mixes protocol versions: a member of a version before admin entries is
/// taken and spoken to in its version, admin entries are refused while it speaks it, and once
/// one committed the node takes no peer of that version — after a restart too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_one_version_behind_is_spoken_to_until_admin_entries_commit() {
    use concord_consensus::ADMIN_COMMAND_UNSUPPORTED;
    /// The first version that applies admin entries, and the one before it.
    const ADMIN_ENTRIES: u16 = 3;
    const PREVIOUS: u16 = ADMIN_ENTRIES - 1;
    let old_member = HelloRecorder::start();
    let dir = tempfile::tempdir().unwrap();
    let peers_file = dir.path().join("peers");
    let (listeners, mut addresses) = bound_listeners(2);
    addresses.insert(3, old_member.address);
    let mut networks = BTreeMap::new();
    let mut nodes = BTreeMap::new();
    for (node, listener) in listeners {
        let mut config = TcpNetworkConfig::new(CLUSTER_ID, node, addresses.clone());
        config.keepalive_interval = Duration::from_millis(50);
        if node == 1 {
            config.peers_file = Some(peers_file.clone());
        }
        let network = TcpNetwork::start(config, listener).unwrap();
        let stores = Stores {
            log: Arc::new(MemLogStore::new()),
            state: Arc::new(MemStateStore::new()),
        };
        let raft = RaftNode::start(
            fast_config(node, vec![1, 2, 3], vec![0]),
            stores,
            counter_factory(),
            network.transport(),
        )
        .unwrap();
        network.deliver_to(raft.sink());
        networks.insert(node, network);
        nodes.insert(node, raft);
    }
    let node_1 = nodes[&1].clone();
    leader_among(&nodes, 0).await;
    let upgrade = || node_1.propose_admin(0, Bytes::from_static(b"upgrade"));

    // Before node 3 says which version it speaks, node 1 speaks its newest and cannot tell.
    wait_until("node 1 dials node 3", || !old_member.versions().is_empty()).await;
    assert_eq!(old_member.versions()[0], VERSION);
    match upgrade().await {
        Err(ProposeError::Refused { reason, .. }) => {
            assert!(reason.contains("member 3 has not connected"), "{reason}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }

    // Node 3 speaks the previous version: taken, and spoken to in it from the next dial on.
    let mut previous = TcpStream::connect(networks[&1].local_addr()).unwrap();
    previous.write_all(&hello(CLUSTER_ID, 3, PREVIOUS)).unwrap();
    wait_until("node 1 hears node 3's version", || {
        heard_version(&networks[&1], 3) == Some(PREVIOUS)
    })
    .await;
    assert_eq!(networks[&1].stats().connections_refused, 0);
    wait_until("node 1 speaks the previous version to node 3", || {
        old_member.versions().last() == Some(&PREVIOUS)
    })
    .await;
    match upgrade().await {
        Err(ProposeError::Refused { reason, .. }) => {
            assert!(
                reason.contains(&format!("member 3 speaks peer protocol version {PREVIOUS}")),
                "{reason}"
            )
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // Client commands are not held back.
    let total = node_1.propose(0, Bytes::from(1i64.to_le_bytes().to_vec()));
    assert_eq!(decode_counter(&total.await.unwrap()), 1);

    // Node 3 runs the new version: the admin entry goes through (and commits on 1 and 2).
    drop(previous);
    let mut upgraded = TcpStream::connect(networks[&1].local_addr()).unwrap();
    upgraded.write_all(&hello(CLUSTER_ID, 3, VERSION)).unwrap();
    wait_until("node 1 hears node 3's new version", || {
        heard_version(&networks[&1], 3) == Some(VERSION)
    })
    .await;
    match upgrade().await {
        Err(ProposeError::Command(error)) => assert_eq!(error.code, ADMIN_COMMAND_UNSUPPORTED),
        other => panic!("expected the counter's answer to an admin command, got {other:?}"),
    }

    // From now on a member of the previous version is refused, and the file keeps that.
    let _late = TcpStream::connect(networks[&1].local_addr())
        .unwrap()
        .write_all(&hello(CLUSTER_ID, 3, PREVIOUS));
    wait_for(&networks[&1], "refusals", |s| s.connections_refused, 1).await;
    wait_until("the file keeps the version", || {
        std::fs::read_to_string(&peers_file)
            .is_ok_and(|text| text.contains(&format!("wire-version={ADMIN_ENTRIES}")))
    })
    .await;
    for node in nodes.values() {
        node.shutdown();
    }
    for network in networks.values() {
        network.shutdown();
    }
    let mut config = TcpNetworkConfig::new(CLUSTER_ID, 1, addresses);
    config.peers_file = Some(peers_file);
    let restarted = TcpNetwork::start(config, TcpListener::bind("127.0.0.1:0").unwrap()).unwrap();
    let _after_restart = TcpStream::connect(restarted.local_addr())
        .unwrap()
        .write_all(&hello(CLUSTER_ID, 3, PREVIOUS));
    wait_for(&restarted, "refusals", |s| s.connections_refused, 1).await;
    restarted.shutdown();
}

/// Every member says its vote quiet in its hello: each network knows its peers' and the
/// shortest of them, which bounds its leaders' leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_network_learns_how_long_its_peers_keep_their_votes() {
    let (listeners, addresses) = bound_listeners(3);
    let mut networks = BTreeMap::new();
    for (node, listener) in listeners {
        let mut config = TcpNetworkConfig::new(CLUSTER_ID, node, addresses.clone());
        config.keepalive_interval = Duration::from_millis(50);
        config.vote_quiet = Duration::from_millis(300 * node);
        networks.insert(node, TcpNetwork::start(config, listener).unwrap());
    }
    let quiet_of = |network: &Arc<TcpNetwork>, node: NodeId| {
        let peers = network.peers();
        peers.iter().find(|p| p.node == node)?.vote_quiet
    };
    let ms = Duration::from_millis;
    wait_until("every network hears both peers' quiet", || {
        networks.iter().all(|(&node, network)| {
            (1..=3)
                .filter(|&peer| peer != node)
                .all(|peer| quiet_of(network, peer) == Some(ms(300 * peer)))
        })
    })
    .await;
    let shortest = |node: NodeId| networks[&node].transport().shortest_peer_vote_quiet();
    assert_eq!(shortest(1), Some(ms(600)));
    assert_eq!(shortest(2), Some(ms(300)));
    assert_eq!(shortest(3), Some(ms(300)));
    // A peer removed no longer counts.
    networks[&2].transport().remove_peer(1);
    assert_eq!(shortest(2), Some(ms(900)));
    for network in networks.values() {
        network.shutdown();
    }
}

/// A node started with a member list that names a peer none of its groups has — a member
/// removed while the node was away — forgets that peer once it has been silent for ten
/// liveness timeouts, and not while it talks; the members its groups name stay known.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_no_group_names_is_forgotten_once_silent() {
    let liveness_timeout = Duration::from_millis(200);
    let keepalive_interval = Duration::from_millis(40);
    let (mut listeners, addresses) = bound_listeners(4);
    // Node 4 runs a network and no raft node: it sends keepalives, and no group names it.
    let mut removed_config = TcpNetworkConfig::new(CLUSTER_ID, 4, addresses.clone());
    removed_config.keepalive_interval = keepalive_interval;
    let removed = TcpNetwork::start(removed_config, listeners.remove(&4).unwrap()).unwrap();
    let mut networks = BTreeMap::new();
    let mut nodes = BTreeMap::new();
    for (node, listener) in listeners {
        let mut network_config = TcpNetworkConfig::new(CLUSTER_ID, node, addresses.clone());
        network_config.keepalive_interval = keepalive_interval;
        let mut config = fast_config(node, vec![1, 2, 3], vec![0, 1]);
        config.liveness_timeout = liveness_timeout;
        let network = TcpNetwork::start(network_config, listener).unwrap();
        let stores = Stores {
            log: Arc::new(MemLogStore::new()),
            state: Arc::new(MemStateStore::new()),
        };
        let raft = RaftNode::start(config, stores, counter_factory(), network.transport()).unwrap();
        network.deliver_to(raft.sink());
        networks.insert(node, network);
        nodes.insert(node, raft);
    }
    let known = |network: &Arc<TcpNetwork>| -> Vec<NodeId> {
        network.peers().iter().map(|peer| peer.node).collect()
    };
    // Talking, node 4 stays known for well over the silence that would end it.
    tokio::time::sleep(liveness_timeout * 10 + Duration::from_secs(1)).await;
    for (node, network) in &networks {
        assert!(
            known(network).contains(&4),
            "node {node}: {:?}",
            known(network)
        );
    }
    removed.shutdown();
    wait_until("every member forgets node 4", || {
        networks
            .values()
            .all(|network| !known(network).contains(&4))
    })
    .await;
    for (&node, network) in &networks {
        let others: Vec<NodeId> = (1..=3).filter(|&peer| peer != node).collect();
        assert_eq!(known(network), others, "node {node}");
    }
    let leader = leader_among(&nodes, 0).await;
    nodes[&leader].propose(0, Bytes::new()).await.unwrap();
    for (node, raft) in &nodes {
        raft.shutdown();
        networks[node].shutdown();
    }
}

/// A peer that stops closes its connections, and the others see at once that it is gone (so
/// that a member stopping after it hands its leaderships elsewhere), where silence alone would
/// take the whole bound asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_is_unreachable_at_once() {
    use concord_consensus::transport::Transport;
    let cluster = TcpCluster::start(3, Duration::from_secs(10));
    let within = Duration::from_secs(60);
    let network_2 = cluster.networks[&2].clone();
    // Both peers first: the check at the end is that node 3 stays reachable, which it cannot
    // be before node 2 has heard from it.
    wait_until("node 2 hears nodes 1 and 3", || {
        network_2.reachable(1, within) && network_2.reachable(3, within)
    })
    .await;
    let stopped = Instant::now();
    cluster.nodes[&1].shutdown();
    cluster.networks[&1].shutdown();
    wait_until("node 2 sees node 1 gone", || {
        !network_2.reachable(1, within)
    })
    .await;
    assert!(stopped.elapsed() < within);
    assert!(network_2.reachable(3, within));
}

/// A peer that restarts dials again, and the node counts the new connection: the sign that a
/// member is back even when it restarted between two looks at whether it is reachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_restarts_is_counted_as_a_new_connection() {
    let (mut listeners, addresses) = bound_listeners(2);
    let start = |node: NodeId, listener: TcpListener| {
        let config = TcpNetworkConfig::new(CLUSTER_ID, node, addresses.clone());
        TcpNetwork::start(config, listener).unwrap()
    };
    let first = start(1, listeners.remove(&1).unwrap());
    let second = start(2, listeners.remove(&2).unwrap());
    wait_until("node 1 counts node 2's first connection", || {
        first.connections_opened_by(2) == 1
    })
    .await;
    second.shutdown();
    // The stopped network's listener closes on its runtime's way out.
    let deadline = Instant::now() + Duration::from_secs(10);
    let listener = loop {
        match TcpListener::bind(addresses[&2]) {
            Ok(listener) => break listener,
            Err(error) => assert!(Instant::now() < deadline, "cannot listen again: {error}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let again = start(2, listener);
    wait_until("node 1 counts node 2's second connection", || {
        first.connections_opened_by(2) == 2
    })
    .await;
    assert_eq!(first.connections_opened_by(3), 0, "no such peer");
    first.shutdown();
    again.shutdown();
}

/// What a test does to node 1's disk.
#[derive(Clone, Copy, Debug, PartialEq)]
enum DiskFault {
    /// Its log write does not return until the test lets it.
    Stalls,
    /// Its log write fails: the node stops the groups it carried.
    Fails,
}

const DISK_WORKS: u8 = 0;
const DISK_STALLS: u8 = 1;
const DISK_FAILS: u8 = 2;

/// A node whose disk stalls (a log write that does not return) or fails looks crashed to its
/// peers: it stops sending keepalives, so that the groups it leads, sleeping ones nobody
/// writes to included, elect leaders elsewhere. A stalled node follows the new leaders once
/// its write returns.
async fn sleeping_groups_leave_a_node_whose_disk(fault: DiskFault) {
    let disks: BTreeMap<NodeId, Arc<AtomicU8>> = (1..=3)
        .map(|node| (node, Arc::new(AtomicU8::new(DISK_WORKS))))
        .collect();
    let cluster = TcpCluster::start_nodes(3, |node, config, network| {
        network.keepalive_interval = Duration::from_millis(50);
        config.groups = vec![0, 1, 2];
        config.sleep_after_ticks = 5;
        config.liveness_timeout = Duration::from_millis(200);
        config.leader_balance_interval = None;
        let disk = disks[&node].clone();
        let log = HookedLog::new(Box::new(move |batch, inner| {
            while disk.load(Ordering::Acquire) == DISK_STALLS {
                std::thread::sleep(Duration::from_millis(1));
            }
            if disk.load(Ordering::Acquire) == DISK_FAILS {
                return Err(concord_storage::StorageError::Io {
                    path: "failing-disk".into(),
                    source: std::io::Error::other("injected write failure"),
                });
            }
            inner.write(batch)
        }));
        Stores {
            log: Arc::new(log),
            state: Arc::new(MemStateStore::new()),
        }
    });
    // Whatever happens below, a stalled write returns before the cluster stops.
    struct Mend(Arc<AtomicU8>);
    impl Drop for Mend {
        fn drop(&mut self) {
            let _ = self.0.compare_exchange(
                DISK_STALLS,
                DISK_WORKS,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }
    let disk = Mend(disks[&1].clone());

    // Node 1 leads every group, and every group falls asleep.
    for group in [0, 1, 2] {
        cluster.increment(group).await;
        let leader = cluster.leader(group).await;
        if leader != 1 {
            cluster.nodes[&leader].transfer_leader(group, 1).unwrap();
        }
        wait_until("node 1 leads", || {
            cluster.nodes[&1].status(group).unwrap().is_leader
        })
        .await;
    }
    wait_until("every group sleeps", || {
        cluster.nodes.values().all(|node| {
            [0, 1, 2]
                .iter()
                .all(|&group| node.status(group).unwrap().asleep)
        })
    })
    .await;

    // Node 1's disk goes bad under a write to group 0.
    let broken = match fault {
        DiskFault::Stalls => DISK_STALLS,
        DiskFault::Fails => DISK_FAILS,
    };
    disk.0.store(broken, Ordering::Release);
    let broken_at = Instant::now();
    let write = tokio::spawn({
        let node = cluster.nodes[&1].clone();
        async move {
            node.propose(0, Bytes::from(1i64.to_le_bytes().to_vec()))
                .await
        }
    });
    // Groups 1 and 2, asleep and written to by nobody, get leaders on nodes 2 and 3: once
    // the write stalled (1 s) or failed, node 1's silence (200 ms) and an election.
    let moved = |group: GroupId| {
        [2, 3].iter().all(|node| {
            let leader = cluster.nodes[node].status(group).unwrap().leader;
            leader == 2 || leader == 3
        })
    };
    let deadline = Instant::now() + Duration::from_secs(8);
    while !(moved(1) && moved(2)) {
        assert!(
            Instant::now() < deadline,
            "{fault:?}: the sleeping groups kept node 1 as their leader"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!(
        "{fault:?}: sleeping groups moved after {:?}",
        broken_at.elapsed()
    );

    // A stalled disk comes back: node 1 follows. Writes go through the new leaders either way.
    drop(disk);
    let _ = write.await.unwrap();
    match fault {
        DiskFault::Stalls => {
            for group in [0, 1, 2] {
                cluster.increment(group).await;
            }
        }
        DiskFault::Fails => {
            assert!(cluster.nodes[&1].status(1).unwrap().stopped.is_some());
            for group in [0, 1, 2] {
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    let command = Bytes::from(1i64.to_le_bytes().to_vec());
                    if cluster.nodes[&2].propose(group, command).await.is_ok() {
                        break;
                    }
                    assert!(Instant::now() < deadline, "group {group} took no write");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleeping_groups_leave_a_node_whose_disk_stalls() {
    sleeping_groups_leave_a_node_whose_disk(DiskFault::Stalls).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleeping_groups_leave_a_node_whose_disk_fails() {
    sleeping_groups_leave_a_node_whose_disk(DiskFault::Fails).await;
}

/// A peer that refuses this node's hello closes the connection; the dialler notices at once,
/// though it has nothing to send (no node, and no keepalive for ten minutes), and dials
/// again: over plain TCP and over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_dialler_dials_again_with_nothing_to_send() {
    let (ca, certs) = test_pki(2);
    for tls in [false, true] {
        let tls_of = |node: NodeId| {
            let (cert, key) = &certs[node as usize - 1];
            tls.then(|| PeerTls::from_pem(ca.as_bytes(), cert.as_bytes(), key.as_bytes()).unwrap())
        };
        // Node 2 knows no peer: it refuses node 1.
        let mut refusing = TcpNetworkConfig::new(CLUSTER_ID, 2, BTreeMap::new());
        refusing.tls = tls_of(2);
        let refusing =
            TcpNetwork::start(refusing, TcpListener::bind("127.0.0.1:0").unwrap()).unwrap();
        let mut dialling =
            TcpNetworkConfig::new(CLUSTER_ID, 1, BTreeMap::from([(2, refusing.local_addr())]));
        dialling.tls = tls_of(1);
        dialling.keepalive_interval = Duration::from_secs(600);
        let dialling =
            TcpNetwork::start(dialling, TcpListener::bind("127.0.0.1:0").unwrap()).unwrap();
        wait_for(
            &refusing,
            "refused connections",
            |s| s.connections_refused,
            3,
        )
        .await;
        dialling.shutdown();
        refusing.shutdown();
    }
}

/// A peer that takes the TCP connection and never answers the TLS handshake holds the dialler
/// no longer than the frame read timeout: it gives the dial up and dials again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dial_whose_handshake_hangs_is_given_up() {
    let (ca, certs) = test_pki(1);
    let (cert, key) = &certs[0];
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut config = TcpNetworkConfig::new(
        CLUSTER_ID,
        1,
        BTreeMap::from([(2, silent.local_addr().unwrap())]),
    );
    config.tls = Some(PeerTls::from_pem(ca.as_bytes(), cert.as_bytes(), key.as_bytes()).unwrap());
    config.frame_read_timeout = Duration::from_millis(200);
    let network = TcpNetwork::start(config, TcpListener::bind("127.0.0.1:0").unwrap()).unwrap();
    let accepted = tokio::task::spawn_blocking(move || {
        silent.set_nonblocking(true).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        // Held open, never answered.
        let mut held = Vec::new();
        while held.len() < 2 && Instant::now() < deadline {
            match silent.accept() {
                Ok((stream, _)) => held.push(stream),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        held.len()
    })
    .await
    .unwrap();
    network.shutdown();
    assert_eq!(accepted, 2, "the dialler waited on the first handshake");
}
