//! The peers a [`super::TcpNetwork`] reaches: their addresses, the sender and dialling task of
//! each, when each was last heard from, the protocol version each speaks, how long each keeps
//! its vote after hearing from a leader, and the file that keeps what membership changes
//! taught the node across restarts.
//!
//! The file holds one line per change, replayed in order over the configured peers at start:
//! `4=127.0.0.1:7173` (node 4 is reached there), `3=-` (node 3 was removed), or
//! `wire-version=3` (this node applied entries that older peers misread: it takes no peer
//! speaking less). A binary that predates that line refuses to start on the file, which is
//! what such a node must do.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::frame::{OLDEST_WIRE_VERSION, WIRE_VERSION};
use super::peer_sender::PeerSender;
use crate::NodeId;

/// The file's key for the oldest protocol version this node takes from peers.
const WIRE_VERSION_KEY: &str = "wire-version";

/// One peer this node sends to.
pub(super) struct PeerLink {
    pub(super) address: SocketAddr,
    pub(super) sender: Arc<PeerSender>,
    /// The task that keeps the connection; aborted when the peer goes or moves.
    pub(super) dialer: tokio::task::AbortHandle,
}

/// What a node knows of one peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// The peer.
    pub node: NodeId,
    /// Where this node reaches it.
    pub address: SocketAddr,
    /// How long ago a frame from it last arrived (`None`: never since this node started).
    pub last_heard: Option<Duration>,
    /// The peer protocol version it spoke when it last connected (`None`: it has not, since
    /// this node started).
    pub wire_version: Option<u16>,
    /// How long it said it refuses to vote after hearing from a leader, when it last
    /// connected (`None`: it has not, or its version does not say).
    pub vote_quiet: Option<Duration>,
}

/// A peer's connections carrying frames to this node.
#[derive(Default)]
struct InboundConnections {
    /// Open now.
    open: usize,
    /// Opened since this node started.
    opened: u64,
}

pub(super) struct PeerTable {
    links: RwLock<BTreeMap<NodeId, PeerLink>>,
    last_heard: Mutex<BTreeMap<NodeId, Instant>>,
    /// The connections from each peer that carry frames to this node.
    inbound: Mutex<BTreeMap<NodeId, InboundConnections>>,
    /// The version each peer spoke in its last hello.
    spoken: Mutex<BTreeMap<NodeId, u16>>,
    /// The vote quiet each peer said in its last hello (peers of version 3 and older say
    /// none).
    vote_quiets: Mutex<BTreeMap<NodeId, Duration>>,
    /// The shortest of `vote_quiets` in milliseconds (`u64::MAX`: none), read without a lock
    /// on every lease read.
    shortest_vote_quiet_ms: AtomicU64,
    /// The oldest version this node takes from peers.
    oldest_taken: AtomicU16,
    file: Option<PathBuf>,
}

impl PeerTable {
    /// A table taking peers of `oldest_taken` and newer (what the file said, or
    /// [`OLDEST_WIRE_VERSION`]).
    pub(super) fn new(file: Option<PathBuf>, oldest_taken: u16) -> Self {
        PeerTable {
            links: RwLock::new(BTreeMap::new()),
            last_heard: Mutex::new(BTreeMap::new()),
            inbound: Mutex::new(BTreeMap::new()),
            spoken: Mutex::new(BTreeMap::new()),
            vote_quiets: Mutex::new(BTreeMap::new()),
            shortest_vote_quiet_ms: AtomicU64::new(u64::MAX),
            oldest_taken: AtomicU16::new(oldest_taken),
            file,
        }
    }

    /// Checks the version a peer's hello names: `Ok` and remembered if this node speaks it,
    /// or why not.
    pub(super) fn hear_version(&self, node: NodeId, version: u16) -> Result<(), String> {
        let oldest = self.oldest_taken.load(Ordering::Acquire);
        if !(oldest..=WIRE_VERSION).contains(&version) {
            let why = if oldest > OLDEST_WIRE_VERSION {
                " (this node committed entries that older versions misread)"
            } else {
                ""
            };
            return Err(format!(
                "node {node} speaks wire version {version}; this node speaks {oldest} to \
                 {WIRE_VERSION}{why}"
            ));
        }
        self.spoken.lock().insert(node, version);
        Ok(())
    }

    /// `true` while this node takes peers speaking `version`.
    pub(super) fn takes_version(&self, version: u16) -> bool {
        version >= self.oldest_taken.load(Ordering::Acquire)
    }

    /// Remembers the vote quiet `node` said in a hello (`None`: its version says none);
    /// `true` if that differs from what it said before.
    pub(super) fn hear_vote_quiet(&self, node: NodeId, quiet: Option<Duration>) -> bool {
        let mut quiets = self.vote_quiets.lock();
        let before = match quiet {
            Some(quiet) => quiets.insert(node, quiet),
            None => quiets.remove(&node),
        };
        self.publish_shortest_vote_quiet(&quiets);
        before != quiet
    }

    fn publish_shortest_vote_quiet(&self, quiets: &BTreeMap<NodeId, Duration>) {
        let shortest_ms = quiets.values().min().map_or(u64::MAX, |quiet| {
            u64::try_from(quiet.as_millis()).unwrap_or(u64::MAX - 1)
        });
        self.shortest_vote_quiet_ms
            .store(shortest_ms, Ordering::Release);
    }

    /// The shortest vote quiet any peer said (`None`: none said one).
    pub(super) fn shortest_vote_quiet(&self) -> Option<Duration> {
        match self.shortest_vote_quiet_ms.load(Ordering::Acquire) {
            u64::MAX => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// The version `node` last spoke to this node.
    pub(super) fn wire_version(&self, node: NodeId) -> Option<u16> {
        self.spoken.lock().get(&node).copied()
    }

    /// The version to speak to `node`: the one it speaks, if this node still takes it (a
    /// peer of an older version refuses a newer hello), else this node's newest.
    pub(super) fn version_to_speak(&self, node: NodeId) -> u16 {
        let oldest = self.oldest_taken.load(Ordering::Acquire);
        match self.wire_version(node) {
            Some(version) if (oldest..=WIRE_VERSION).contains(&version) => version,
            _ => WIRE_VERSION,
        }
    }

    /// Takes no peer speaking less than `version` from now on (and forgets what such peers
    /// said). `true` if that is new.
    pub(super) fn raise_oldest_taken(&self, version: u16) -> bool {
        let raised = self.oldest_taken.fetch_max(version, Ordering::AcqRel) < version;
        if raised {
            self.spoken.lock().retain(|_, spoken| *spoken >= version);
        }
        raised
    }

    /// How this node sends to `node`; `None` if the node is not a peer.
    pub(super) fn sender(&self, node: NodeId) -> Option<Arc<PeerSender>> {
        self.links.read().get(&node).map(|link| link.sender.clone())
    }

    pub(super) fn address(&self, node: NodeId) -> Option<SocketAddr> {
        self.links.read().get(&node).map(|link| link.address)
    }

    pub(super) fn contains(&self, node: NodeId) -> bool {
        self.links.read().contains_key(&node)
    }

    /// Adds or replaces `node`'s link; the link it replaces stops dialling.
    pub(super) fn insert(&self, node: NodeId, link: PeerLink) {
        if let Some(old) = self.links.write().insert(node, link) {
            old.dialer.abort();
        }
    }

    /// Forgets `node`; its link stops dialling. `false` if it was not a peer.
    pub(super) fn remove(&self, node: NodeId) -> bool {
        let removed = self.links.write().remove(&node);
        self.last_heard.lock().remove(&node);
        self.inbound.lock().remove(&node);
        self.spoken.lock().remove(&node);
        let mut quiets = self.vote_quiets.lock();
        quiets.remove(&node);
        self.publish_shortest_vote_quiet(&quiets);
        removed.map(|link| link.dialer.abort()).is_some()
    }

    /// How long since a frame from `node` last arrived (forever if none did).
    pub(super) fn silent_for(&self, node: NodeId) -> Duration {
        self.last_heard
            .lock()
            .get(&node)
            .map_or(Duration::MAX, |at| at.elapsed())
    }

    /// Whether `node` is up and talking to this node: a connection of its is open here and a
    /// frame came on it within `within`. A member that stops, or whose process dies, closes
    /// its connections at once; silence alone would take `within` to tell.
    pub(super) fn reachable(&self, node: NodeId, within: Duration) -> bool {
        let open = (self.inbound.lock().get(&node)).is_some_and(|inbound| inbound.open > 0);
        open && self.silent_for(node) < within
    }

    /// How many connections carrying frames `node` opened to this node since it started.
    pub(super) fn connections_opened_by(&self, node: NodeId) -> u64 {
        (self.inbound.lock().get(&node)).map_or(0, |inbound| inbound.opened)
    }

    /// A connection from `node` starts carrying frames.
    pub(super) fn inbound_opened(&self, node: NodeId) {
        let mut inbound = self.inbound.lock();
        let connections = inbound.entry(node).or_default();
        connections.open += 1;
        connections.opened += 1;
    }

    /// A connection from `node` that carried frames closed.
    pub(super) fn inbound_closed(&self, node: NodeId) {
        if let Some(connections) = self.inbound.lock().get_mut(&node) {
            connections.open = connections.open.saturating_sub(1);
        }
    }

    /// A frame from `node` arrived now.
    pub(super) fn heard(&self, node: NodeId) {
        self.last_heard.lock().insert(node, Instant::now());
    }

    /// Stops dialling every peer and lets go of every connection the workers write to, so
    /// that the peers see this node leave (not only when the process ends).
    pub(super) fn stop_links(&self) {
        for link in self.links.read().values() {
            link.dialer.abort();
            link.sender.disconnected();
        }
    }

    /// Calls `visit` with every peer's node id, under the table's read lock.
    pub(super) fn visit_nodes(&self, visit: &mut dyn FnMut(NodeId)) {
        for &node in self.links.read().keys() {
            visit(node);
        }
    }

    pub(super) fn peers(&self) -> Vec<PeerInfo> {
        let heard = self.last_heard.lock();
        let spoken = self.spoken.lock();
        let quiets = self.vote_quiets.lock();
        self.links
            .read()
            .iter()
            .map(|(&node, link)| PeerInfo {
                node,
                address: link.address,
                last_heard: heard.get(&node).map(|at| at.elapsed()),
                wire_version: spoken.get(&node).copied(),
                vote_quiet: quiets.get(&node).copied(),
            })
            .collect()
    }

    /// Appends one change to the file (and syncs it), if the table keeps one.
    pub(super) fn record(&self, node: NodeId, address: Option<SocketAddr>) -> std::io::Result<()> {
        match address {
            Some(address) => self.append(&format!("{node}={address}\n")),
            None => self.append(&format!("{node}=-\n")),
        }
    }

    /// Appends the oldest version this node now takes to the file (and syncs it).
    pub(super) fn record_oldest_taken(&self, version: u16) -> std::io::Result<()> {
        self.append(&format!("{WIRE_VERSION_KEY}={version}\n"))
    }

    fn append(&self, line: &str) -> std::io::Result<()> {
        let Some(path) = &self.file else {
            return Ok(());
        };
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        file.write_all(line.as_bytes())?;
        file.sync_all()
    }
}

/// Replays the changes kept in `path` (if it exists) over `peers`; returns the oldest peer
/// protocol version the node takes.
pub(super) fn replay_file(
    path: &Path,
    peers: &mut BTreeMap<NodeId, SocketAddr>,
) -> std::io::Result<u16> {
    let mut oldest_taken = OLDEST_WIRE_VERSION;
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(oldest_taken),
        Err(error) => return Err(error),
    };
    let invalid = |number: usize, line: &str| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{} line {number}: `{line}` is not `node=address`, `node=-` or \
                 `{WIRE_VERSION_KEY}=version`",
                path.display()
            ),
        )
    };
    let lines = text.lines().enumerate();
    // A crash while appending leaves at most a torn last line: it is ignored (the change it
    // held is in the log, and applied again after the restart).
    let complete = if text.ends_with('\n') {
        lines.count()
    } else {
        lines.count().saturating_sub(1)
    };
    for (number, line) in text.lines().enumerate().take(complete) {
        let (node, address) = line
            .split_once('=')
            .ok_or_else(|| invalid(number + 1, line))?;
        if node == WIRE_VERSION_KEY {
            let version: u16 = address.parse().map_err(|_| invalid(number + 1, line))?;
            if version > WIRE_VERSION {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "{}: a newer build committed entries of wire version {version} here; \
                         this one speaks at most {WIRE_VERSION}",
                        path.display()
                    ),
                ));
            }
            oldest_taken = oldest_taken.max(version);
            continue;
        }
        let node: NodeId = node.parse().map_err(|_| invalid(number + 1, line))?;
        match address {
            "-" => {
                peers.remove(&node);
            }
            address => {
                let address = address.parse().map_err(|_| invalid(number + 1, line))?;
                peers.insert(node, address);
            }
        }
    }
    Ok(oldest_taken)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_replays_additions_and_removals_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("peers");
        let table = PeerTable::new(Some(path.clone()), OLDEST_WIRE_VERSION);
        table
            .record(4, Some("127.0.0.1:7004".parse().unwrap()))
            .unwrap();
        table.record(3, None).unwrap();
        table
            .record(5, Some("127.0.0.1:7005".parse().unwrap()))
            .unwrap();
        let mut peers = BTreeMap::from([
            (2, "127.0.0.1:7002".parse().unwrap()),
            (3, "127.0.0.1:7003".parse().unwrap()),
        ]);
        assert_eq!(replay_file(&path, &mut peers).unwrap(), OLDEST_WIRE_VERSION);
        assert_eq!(peers.keys().copied().collect::<Vec<_>>(), vec![2, 4, 5]);
        table.record_oldest_taken(WIRE_VERSION).unwrap();
        assert_eq!(replay_file(&path, &mut peers).unwrap(), WIRE_VERSION);
        assert_eq!(peers.keys().copied().collect::<Vec<_>>(), vec![2, 4, 5]);
        // A torn last line is ignored; a damaged line before it is an error naming the file.
        std::fs::write(&path, "4=127.0.0.1:7004\n5=127.0.").unwrap();
        replay_file(&path, &mut peers).unwrap();
        std::fs::write(&path, "4=nonsense\n5=-\n").unwrap();
        let error = replay_file(&path, &mut peers).unwrap_err().to_string();
        assert!(error.contains("line 1"), "{error}");
        assert!(replay_file(&dir.path().join("absent"), &mut peers).is_ok());
    }

    #[test]
    fn a_raised_floor_refuses_older_peers_and_is_spoken_down_to_before() {
        let table = PeerTable::new(None, OLDEST_WIRE_VERSION);
        assert_eq!(table.version_to_speak(2), WIRE_VERSION);
        table.hear_version(2, OLDEST_WIRE_VERSION).unwrap();
        assert_eq!(table.version_to_speak(2), OLDEST_WIRE_VERSION);
        let error = table.hear_version(3, WIRE_VERSION + 1).unwrap_err();
        assert!(error.contains("node 3 speaks wire version"), "{error}");
        assert!(table.hear_version(3, OLDEST_WIRE_VERSION - 1).is_err());
        assert_eq!(table.wire_version(3), None);

        assert!(table.raise_oldest_taken(WIRE_VERSION));
        assert!(!table.raise_oldest_taken(WIRE_VERSION));
        assert_eq!(table.wire_version(2), None);
        assert_eq!(table.version_to_speak(2), WIRE_VERSION);
        let error = table.hear_version(2, OLDEST_WIRE_VERSION).unwrap_err();
        assert!(error.contains("older versions misread"), "{error}");
    }

    #[test]
    fn a_file_from_a_newer_build_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("peers");
        std::fs::write(&path, format!("wire-version={}\n", WIRE_VERSION + 1)).unwrap();
        let error = replay_file(&path, &mut BTreeMap::new()).unwrap_err();
        assert!(error.to_string().contains("newer build"), "{error}");
    }
}
