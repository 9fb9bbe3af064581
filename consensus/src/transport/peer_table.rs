//! The peers a [`super::TcpNetwork`] reaches: their addresses, the queue and dialling task of
//! each, when each was last heard from, and the file that keeps what membership changes taught
//! the node across restarts.
//!
//! The file holds one line per change, replayed in order over the configured peers at start:
//! `4=127.0.0.1:7173` (node 4 is reached there) or `3=-` (node 3 was removed).

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use tokio::sync::mpsc;

use super::GroupMessage;
use crate::NodeId;

/// One peer this node sends to.
pub(super) struct PeerLink {
    pub(super) address: SocketAddr,
    pub(super) queue: mpsc::Sender<Vec<GroupMessage>>,
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
}

pub(super) struct PeerTable {
    links: RwLock<BTreeMap<NodeId, PeerLink>>,
    last_heard: Mutex<BTreeMap<NodeId, Instant>>,
    file: Option<PathBuf>,
}

impl PeerTable {
    pub(super) fn new(file: Option<PathBuf>) -> Self {
        PeerTable {
            links: RwLock::new(BTreeMap::new()),
            last_heard: Mutex::new(BTreeMap::new()),
            file,
        }
    }

    /// Runs `send` with `node`'s queue; `None` if the node is not a peer.
    pub(super) fn with_queue<T>(
        &self,
        node: NodeId,
        send: impl FnOnce(&mpsc::Sender<Vec<GroupMessage>>) -> T,
    ) -> Option<T> {
        self.links.read().get(&node).map(|link| send(&link.queue))
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
        removed.map(|link| link.dialer.abort()).is_some()
    }

    /// A frame from `node` arrived now.
    /// How long since a frame from `node` last arrived (forever if none did).
    pub(super) fn silent_for(&self, node: NodeId) -> Duration {
        self.last_heard
            .lock()
            .get(&node)
            .map_or(Duration::MAX, |at| at.elapsed())
    }

    pub(super) fn heard(&self, node: NodeId) {
        self.last_heard.lock().insert(node, Instant::now());
    }

    pub(super) fn stop_dialling(&self) {
        for link in self.links.read().values() {
            link.dialer.abort();
        }
    }

    pub(super) fn peers(&self) -> Vec<PeerInfo> {
        let heard = self.last_heard.lock();
        self.links
            .read()
            .iter()
            .map(|(&node, link)| PeerInfo {
                node,
                address: link.address,
                last_heard: heard.get(&node).map(|at| at.elapsed()),
            })
            .collect()
    }

    /// Appends one change to the file (and syncs it), if the table keeps one.
    pub(super) fn record(&self, node: NodeId, address: Option<SocketAddr>) -> std::io::Result<()> {
        let Some(path) = &self.file else {
            return Ok(());
        };
        let line = match address {
            Some(address) => format!("{node}={address}\n"),
            None => format!("{node}=-\n"),
        };
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        file.write_all(line.as_bytes())?;
        file.sync_all()
    }
}

/// Replays the changes kept in `path` (if it exists) over `peers`.
pub(super) fn replay_file(
    path: &Path,
    peers: &mut BTreeMap<NodeId, SocketAddr>,
) -> std::io::Result<()> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    let invalid = |number: usize, line: &str| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{} line {number}: `{line}` is not `node=address` or `node=-`",
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_replays_additions_and_removals_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("peers");
        let table = PeerTable::new(Some(path.clone()));
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
        replay_file(&path, &mut peers).unwrap();
        assert_eq!(peers.keys().copied().collect::<Vec<_>>(), vec![2, 4, 5]);
        // A torn last line is ignored; a damaged line before it is an error naming the file.
        std::fs::write(&path, "4=127.0.0.1:7004\n5=127.0.").unwrap();
        replay_file(&path, &mut peers).unwrap();
        std::fs::write(&path, "4=nonsense\n5=-\n").unwrap();
        let error = replay_file(&path, &mut peers).unwrap_err().to_string();
        assert!(error.contains("line 1"), "{error}");
        assert!(replay_file(&dir.path().join("absent"), &mut peers).is_ok());
    }
}
