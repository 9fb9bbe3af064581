//! A network that loses, delays, reorders and partitions messages, from a seeded generator,
//! for tests of failure handling.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use concord_storage::GroupId;
use concord_storage::raft::prelude::MessageType;

use super::{GroupMessage, InProcessNetwork, SnapshotFetchError, Transport};
use crate::NodeId;

/// The faults a [`FaultyNetwork`] injects.
#[derive(Clone, Debug)]
pub struct FaultConfig {
    /// Seed of every random decision (print it to replay a failing run).
    pub seed: u64,
    /// Probability that a message batch is lost.
    pub drop_probability: f64,
    /// Each delivered batch waits a random time up to this; batches overtake each other.
    pub max_delay: Duration,
}

/// Messages held back by the delay, at most this many batches (beyond, they are dropped).
const MAX_DELAYED_BATCHES: usize = 100_000;

struct DelayedBatch {
    due: Instant,
    sequence: u64,
    from: NodeId,
    to: NodeId,
    messages: Vec<GroupMessage>,
}

impl PartialEq for DelayedBatch {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.sequence) == (other.due, other.sequence)
    }
}
impl Eq for DelayedBatch {}
impl PartialOrd for DelayedBatch {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for DelayedBatch {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.due, self.sequence).cmp(&(other.due, other.sequence))
    }
}

/// The messages of some types held on a link.
struct HeldMessages {
    kinds: Vec<MessageType>,
    messages: Vec<GroupMessage>,
}

/// Messages held on links, at most this many (beyond, they are dropped).
const MAX_HELD_MESSAGES: usize = 10_000;

struct FaultState {
    rng: StdRng,
    /// Directed links that lose everything.
    cut: HashSet<(NodeId, NodeId)>,
    /// Directed links on which messages of some types wait, in order, until released.
    held: HashMap<(NodeId, NodeId), HeldMessages>,
    /// Nodes whose snapshots no fetch gets (they refuse, as a node that lost its data would).
    refusing_snapshots: HashSet<NodeId>,
    delayed: BinaryHeap<Reverse<DelayedBatch>>,
    sequence: u64,
    stopped: bool,
    /// Messages handed to the network, by raft message type (before any is lost).
    sent: HashMap<MessageType, u64>,
    /// Snapshot fetches that reached the node asked (not refused, not cut off).
    fetches_served: u64,
    /// The peers each node told its transport to forget, in order.
    forgotten: HashMap<NodeId, Vec<NodeId>>,
}

/// An [`InProcessNetwork`] with injected faults. Create transports from it instead of the
/// inner network; register nodes with [`FaultyNetwork::inner`].
pub struct FaultyNetwork {
    inner: Arc<InProcessNetwork>,
    config: FaultConfig,
    state: Mutex<FaultState>,
    wake: Condvar,
}

impl FaultyNetwork {
    /// A faulty network over a fresh in-process network; starts the delivery thread.
    pub fn new(config: FaultConfig) -> Arc<Self> {
        let network = Arc::new(FaultyNetwork {
            inner: InProcessNetwork::new(),
            state: Mutex::new(FaultState {
                rng: StdRng::seed_from_u64(config.seed),
                cut: HashSet::new(),
                held: HashMap::new(),
                refusing_snapshots: HashSet::new(),
                delayed: BinaryHeap::new(),
                sequence: 0,
                stopped: false,
                sent: HashMap::new(),
                fetches_served: 0,
                forgotten: HashMap::new(),
            }),
            config,
            wake: Condvar::new(),
        });
        let worker = network.clone();
        std::thread::Builder::new()
            .name("faulty-network".into())
            .spawn(move || worker.deliver_delayed())
            .expect("spawn the network thread");
        network
    }

    /// The network nodes register with.
    pub fn inner(&self) -> &Arc<InProcessNetwork> {
        &self.inner
    }

    /// The transport node `from` sends with.
    pub fn transport(self: &Arc<Self>, from: NodeId) -> Arc<dyn Transport> {
        Arc::new(FaultyTransport {
            network: self.clone(),
            from,
        })
    }

    /// Cuts every link to and from `node`.
    pub fn isolate(&self, node: NodeId, all_nodes: &[NodeId]) {
        let mut state = self.state.lock();
        for &other in all_nodes {
            if other != node {
                state.cut.insert((node, other));
                state.cut.insert((other, node));
            }
        }
    }

    /// Cuts the link from `from` to `to` only: `to` hears nothing from `from`, while what `to`
    /// sends still arrives.
    pub fn cut_one_way(&self, from: NodeId, to: NodeId) {
        self.state.lock().cut.insert((from, to));
    }

    /// Holds the messages of type `kind` that `from` sends `to` from now on (besides those of
    /// the types held there already), as a stalled connection or a paused receiver would,
    /// while the others go through: they arrive, in order, at [`FaultyNetwork::release`], or
    /// are lost at [`FaultyNetwork::lose_held`].
    pub fn hold_one_way(&self, from: NodeId, to: NodeId, kind: MessageType) {
        let mut state = self.state.lock();
        let held = state
            .held
            .entry((from, to))
            .or_insert_with(|| HeldMessages {
                kinds: Vec::new(),
                messages: Vec::new(),
            });
        if !held.kinds.contains(&kind) {
            held.kinds.push(kind);
        }
    }

    /// How many messages the link from `from` to `to` holds now.
    pub fn held(&self, from: NodeId, to: NodeId) -> usize {
        self.state
            .lock()
            .held
            .get(&(from, to))
            .map_or(0, |held| held.messages.len())
    }

    /// Delivers the messages the link from `from` to `to` held, in the order they were sent
    /// (past any cut), and stops holding; returns how many there were.
    pub fn release(&self, from: NodeId, to: NodeId) -> usize {
        let held = self.state.lock().held.remove(&(from, to));
        let messages = held.map(|held| held.messages).unwrap_or_default();
        let count = messages.len();
        if count > 0 {
            self.inner.deliver(from, to, messages);
        }
        count
    }

    /// Loses the messages the link from `from` to `to` held, as a send queue that overflowed
    /// or a connection that broke would, and stops holding; returns how many there were.
    pub fn lose_held(&self, from: NodeId, to: NodeId) -> usize {
        let held = self.state.lock().held.remove(&(from, to));
        held.map_or(0, |held| held.messages.len())
    }

    /// Makes every fetch of a snapshot from `node` fail, as if it had lost its data; its
    /// messages still go through.
    pub fn refuse_snapshots_from(&self, node: NodeId) {
        self.state.lock().refusing_snapshots.insert(node);
    }

    /// Restores every link, and every node's snapshots (held messages stay held).
    pub fn heal(&self) {
        let mut state = self.state.lock();
        state.cut.clear();
        state.refusing_snapshots.clear();
    }

    /// Stops the delivery thread; held messages are dropped.
    pub fn stop(&self) {
        let mut state = self.state.lock();
        state.stopped = true;
        state.delayed.clear();
        state.held.clear();
        self.wake.notify_all();
    }

    /// Messages of `kind` handed to the network so far, lost or not.
    pub fn sent(&self, kind: MessageType) -> u64 {
        self.state.lock().sent.get(&kind).copied().unwrap_or(0)
    }

    /// Snapshot fetches that reached the node asked: neither refused nor cut off.
    pub fn snapshot_fetches_served(&self) -> u64 {
        self.state.lock().fetches_served
    }

    /// The peers node `node` told its transport to forget so far, in order.
    pub fn forgotten_by(&self, node: NodeId) -> Vec<NodeId> {
        (self.state.lock().forgotten.get(&node).cloned()).unwrap_or_default()
    }

    fn send(&self, from: NodeId, to: NodeId, mut messages: Vec<GroupMessage>) {
        let mut state = self.state.lock();
        for message in &messages {
            *state
                .sent
                .entry(message.message.get_msg_type())
                .or_default() += 1;
        }
        if state.stopped || state.cut.contains(&(from, to)) {
            return;
        }
        if let Some(held) = state.held.get_mut(&(from, to)) {
            let (to_hold, to_send): (Vec<_>, Vec<_>) = (messages.into_iter())
                .partition(|message| held.kinds.contains(&message.message.get_msg_type()));
            let room = MAX_HELD_MESSAGES.saturating_sub(held.messages.len());
            held.messages.extend(to_hold.into_iter().take(room));
            messages = to_send;
            if messages.is_empty() {
                return;
            }
        }
        if state
            .rng
            .random_bool(self.config.drop_probability.clamp(0.0, 1.0))
        {
            return;
        }
        if self.config.max_delay.is_zero() {
            drop(state);
            self.inner.deliver(from, to, messages);
            return;
        }
        if state.delayed.len() >= MAX_DELAYED_BATCHES {
            return;
        }
        let delay_us = state
            .rng
            .random_range(0..=self.config.max_delay.as_micros() as u64);
        state.sequence += 1;
        let batch = DelayedBatch {
            due: Instant::now() + Duration::from_micros(delay_us),
            sequence: state.sequence,
            from,
            to,
            messages,
        };
        state.delayed.push(Reverse(batch));
        self.wake.notify_one();
    }

    fn deliver_delayed(&self) {
        let mut state = self.state.lock();
        loop {
            if state.stopped {
                return;
            }
            let now = Instant::now();
            match state.delayed.peek() {
                Some(Reverse(next)) if next.due <= now => {
                    let Reverse(batch) = state.delayed.pop().expect("peeked");
                    drop(state);
                    self.inner.deliver(batch.from, batch.to, batch.messages);
                    state = self.state.lock();
                }
                Some(Reverse(next)) => {
                    let due = next.due;
                    self.wake.wait_until(&mut state, due);
                }
                None => {
                    self.wake.wait_for(&mut state, Duration::from_millis(100));
                }
            }
        }
    }
}

struct FaultyTransport {
    network: Arc<FaultyNetwork>,
    from: NodeId,
}

impl FaultyTransport {
    /// `true` if the network stopped or the link with `node` is cut either way.
    fn cut_off(&self, node: NodeId) -> bool {
        let state = self.network.state.lock();
        state.stopped
            || state.cut.contains(&(node, self.from))
            || state.cut.contains(&(self.from, node))
    }
}

impl Transport for FaultyTransport {
    fn send(&self, to: NodeId, messages: Vec<GroupMessage>) {
        self.network.send(self.from, to, messages);
    }

    /// A node cut off from this one (either way) is silent, as over a real network.
    fn silent_for(&self, node: NodeId) -> Option<Duration> {
        if self.cut_off(node) {
            return Some(Duration::MAX);
        }
        Some(self.network.inner.silent_for(node))
    }

    fn connections_opened_by(&self, node: NodeId) -> u64 {
        self.network.inner.connections_opened_by(node)
    }

    fn remove_peer(&self, node: NodeId) {
        let mut state = self.network.state.lock();
        state.forgotten.entry(self.from).or_default().push(node);
    }

    fn fetch_snapshot(
        &self,
        from: NodeId,
        group: GroupId,
        min_index: u64,
        out: &mut dyn Write,
    ) -> Result<(), SnapshotFetchError> {
        if self.cut_off(from) {
            return Err(SnapshotFetchError::Transfer(format!(
                "node {from} is cut off"
            )));
        }
        {
            let mut state = self.network.state.lock();
            if state.refusing_snapshots.contains(&from) {
                return Err(SnapshotFetchError::Refused(format!(
                    "node {from} refuses snapshots (the test said so)"
                )));
            }
            state.fetches_served += 1;
        }
        self.network
            .inner
            .fetch_snapshot(from, group, min_index, out)
    }
}
