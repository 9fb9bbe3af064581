//! A TCP proxy in front of each member's raft port that can cut the links between members:
//! the test's own network partition, between real processes.
//!
//! Members dial each other at the proxies' ports (given in `--initial-cluster`); each member
//! listens on the port its proxy forwards to (`--raft-addr`). The proxy reads the connection's
//! hello to learn which member dials (the node id follows the magic, the wire version and the
//! cluster id), and forwards only while that link is not cut; cutting a link closes its open
//! connections too.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Bytes of the hello before the dialling node's id, and the id's own.
const NODE_ID_AT: usize = 4 + 2 + 8;

#[derive(Default)]
struct Links {
    /// `(from, to)` pairs that are cut.
    cut: HashSet<(u64, u64)>,
    /// Open connections: `(from, to, the two streams)`.
    open: Vec<(u64, u64, TcpStream, TcpStream)>,
}

/// The proxies of a cluster.
pub struct PartitionProxy {
    links: Arc<Mutex<Links>>,
    stopped: Arc<AtomicBool>,
    addresses: Vec<SocketAddr>,
}

impl PartitionProxy {
    /// One proxy per member: `targets[i]` is where member `i + 1` listens for raft.
    pub fn start(targets: &[SocketAddr]) -> PartitionProxy {
        let links = Arc::new(Mutex::new(Links::default()));
        let stopped = Arc::new(AtomicBool::new(false));
        let mut addresses = Vec::new();
        for (i, &target) in targets.iter().enumerate() {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            addresses.push(listener.local_addr().unwrap());
            let to = i as u64 + 1;
            let (links, stopped) = (links.clone(), stopped.clone());
            std::thread::spawn(move || {
                for incoming in listener.incoming() {
                    if stopped.load(Ordering::Acquire) {
                        return;
                    }
                    let Ok(stream) = incoming else { continue };
                    let links = links.clone();
                    std::thread::spawn(move || forward(stream, target, to, &links));
                }
            });
        }
        PartitionProxy {
            links,
            stopped,
            addresses,
        }
    }

    /// Where member `node` is reached (its proxy).
    pub fn address(&self, node: u64) -> SocketAddr {
        self.addresses[node as usize - 1]
    }

    /// Cuts every link to and from `node`, closing what is open.
    pub fn isolate(&self, node: u64) {
        let mut links = self.links.lock().unwrap();
        for other in 1..=self.addresses.len() as u64 {
            if other != node {
                links.cut.insert((node, other));
                links.cut.insert((other, node));
            }
        }
        let cut = links.cut.clone();
        links.open.retain(|(from, to, a, b)| {
            if cut.contains(&(*from, *to)) {
                let _ = a.shutdown(Shutdown::Both);
                let _ = b.shutdown(Shutdown::Both);
                false
            } else {
                true
            }
        });
    }

    /// Restores every link.
    pub fn heal(&self) {
        self.links.lock().unwrap().cut.clear();
    }
}

impl Drop for PartitionProxy {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::Release);
        let mut links = self.links.lock().unwrap();
        for (_, _, a, b) in links.open.drain(..) {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
        // Wake each accept loop so that it sees the stop.
        for address in &self.addresses {
            let _ = TcpStream::connect_timeout(address, Duration::from_millis(100));
        }
    }
}

/// Reads the hello, then pipes both ways while the link is not cut.
fn forward(mut client: TcpStream, target: SocketAddr, to: u64, links: &Mutex<Links>) {
    let mut head = [0u8; NODE_ID_AT + 8];
    if client.read_exact(&mut head).is_err() {
        return;
    }
    let from = u64::from_le_bytes(head[NODE_ID_AT..].try_into().unwrap());
    if links.lock().unwrap().cut.contains(&(from, to)) {
        return;
    }
    let Ok(mut server) = TcpStream::connect(target) else {
        return;
    };
    if server.write_all(&head).is_err() {
        return;
    }
    let (Ok(client_copy), Ok(server_copy)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    {
        let mut links = links.lock().unwrap();
        if links.cut.contains(&(from, to)) {
            return;
        }
        links.open.push((from, to, client_copy, server_copy));
    }
    let (mut client_back, mut server_back) =
        (client.try_clone().unwrap(), server.try_clone().unwrap());
    let upstream = std::thread::spawn(move || {
        let _ = std::io::copy(&mut client, &mut server);
        let _ = server.shutdown(Shutdown::Both);
    });
    let _ = std::io::copy(&mut server_back, &mut client_back);
    let _ = client_back.shutdown(Shutdown::Both);
    let _ = upstream.join();
}
