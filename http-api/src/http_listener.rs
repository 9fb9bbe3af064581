//! The HTTP listener: accepts connections up to a limit, serves each over HTTP/1.1 with a
//! deadline for every request head, and on shutdown drains them within a deadline.
//!
//! Each bound is one an open server needs against its own clients: without the connection
//! limit, idle sockets from anyone exhaust the process's descriptors; without the head
//! deadline, a client that sends half a request line (or nothing) holds a connection, and a
//! graceful shutdown waiting for it, forever.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::{Semaphore, oneshot};
use tokio_rustls::TlsAcceptor;

use crate::http_threads::Dealer;

/// How long to wait before accepting again after `accept` failed (out of descriptors, say):
/// the error is not the client's, and retrying at once would spin.
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(50);

/// A step of stopping (the drain here; the HTTP threads and the stores in the server) that
/// takes longer is named in the log: a stop that hangs is otherwise silent.
pub(crate) const SLOW_STOP: Duration = Duration::from_secs(1);

/// The listener's bounds, and its TLS if it speaks TLS.
#[derive(Clone, Debug)]
pub(crate) struct ListenerLimits {
    /// TLS settings: every connection starts with a TLS handshake, within `header_timeout`.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Open connections at most.
    pub max_connections: usize,
    /// Time for a request head, from the connection's start or its last answer.
    pub header_timeout: Duration,
    /// On shutdown, time for the requests in flight to be answered.
    pub drain_timeout: Duration,
}

/// The most a connection buffers of what it read and the request has not taken yet, and
/// about the largest request head (hyper checks it while a head is incomplete; a larger one is
/// answered 431). hyper's own default lets each
/// connection buffer much more of a body it streams, so memory grew with the connections
/// sending large bodies, and the allocator kept what it grew to.
const CONNECTION_READ_BUFFER_BYTES: usize = 64 * 1024;

/// Connections the kernel holds for `accept` (it caps the number at its `somaxconn`). The
/// standard library listens with 128: when thousands of clients connected at once the queue
/// overflowed, the kernel dropped their handshakes, and some of them saw their connection
/// closed before their first answer.
const ACCEPT_BACKLOG: i32 = 4096;

/// A non-blocking listening socket on `address`, with room for [`ACCEPT_BACKLOG`] connections
/// waiting to be accepted. The address may be reused at once after a restart, as the standard
/// library's listeners allow on Unix.
pub(crate) fn bind(address: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(address),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    #[cfg(unix)]
    socket.set_reuse_address(true)?;
    socket.bind(&address.into())?;
    socket.listen(ACCEPT_BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// Serves `app` on `listener` until `shutdown` resolves, each connection on one of `threads`'
/// runtimes in turn (`http_threads.rs`), then stops accepting, asks every connection to close
/// after its request in flight (its answer says `Connection: close`), and returns once all
/// have closed or `drain_timeout` passed.
pub(crate) async fn serve(
    listener: TcpListener,
    threads: &[Handle],
    app: Router,
    limits: ListenerLimits,
    shutdown: impl Future<Output = ()>,
) {
    let mut dealer = Dealer::new(threads);
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let stops = Arc::new(Mutex::new(StopSignals::default()));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(CONNECTION_READ_BUFFER_BYTES)
        // An answer's head and body in one buffer, written as one piece: the bodies are a few
        // hundred bytes, and copying them costs less than the socket taking two.
        .writev(false)
        .keep_alive(true);
    let open_gauge = metrics::gauge!("concord_http_connections_open");
    let refused = metrics::counter!("concord_http_connections_refused_total");
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    tracing::warn!(%error, "cannot accept an HTTP connection");
                    tokio::time::sleep(ACCEPT_RETRY_DELAY).await;
                    continue;
                }
            },
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            refused.increment(1);
            refuse_over_limit(&stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        // Registered with the runtime of the thread it is dealt to, not this one's.
        let stream = match stream.into_std() {
            Ok(stream) => stream,
            Err(error) => {
                tracing::warn!(%error, "cannot hand an HTTP connection to its thread");
                continue;
            }
        };
        let http = http.clone();
        let app = app.clone();
        let stops = stops.clone();
        let open_gauge = open_gauge.clone();
        let tls = limits.tls.clone().map(TlsAcceptor::from);
        let handshake_timeout = limits.header_timeout;
        open_gauge.increment(1.0);
        dealer.next_handle().spawn(async move {
            let added = match TcpStream::from_std(stream) {
                Ok(stream) => StopSignals::add(&stops).map(|added| (added, stream)),
                Err(error) => {
                    tracing::warn!(%error, "cannot serve an HTTP connection on its thread");
                    None
                }
            };
            // `None`: accepted as the server began to stop (or not taken by the thread's
            // runtime), and closed unserved.
            if let Some(((_registered, stop), stream)) = added {
                match tls {
                    None => serve_connection(&http, stream, app, stop).await,
                    Some(acceptor) => {
                        let handshake =
                            tokio::time::timeout(handshake_timeout, acceptor.accept(stream));
                        match handshake.await {
                            Ok(Ok(stream)) => serve_connection(&http, stream, app, stop).await,
                            Ok(Err(error)) => tracing::debug!(%error, "a TLS handshake failed"),
                            Err(_) => tracing::debug!("a TLS handshake did not finish in time"),
                        }
                    }
                }
            }
            open_gauge.decrement(1.0);
            drop(permit);
        });
    }
    drop(listener);
    let draining = std::time::Instant::now();
    stops.lock().stop_all();
    // Every connection holds a permit until it ends: all permits back means all closed.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(limits.drain_timeout, open.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!(
            still_open = limits.max_connections - open.available_permits(),
            "HTTP connections still open after the drain timeout; closing them"
        );
    } else if draining.elapsed() >= SLOW_STOP {
        // Requests in flight held the stop: say so, a stop that waits is otherwise silent.
        tracing::warn!(
            took_ms = draining.elapsed().as_millis() as u64,
            "HTTP connections were slow to close"
        );
    }
}

/// Each open connection's signal to stop, and whether the server is stopping.
///
/// A signal of its own per connection, which its task alone polls: the task polls it on every
/// wake, and a signal all connections share (a `watch`, a `Notify`) takes a lock that every
/// HTTP thread writes on each of those polls.
#[derive(Default)]
struct StopSignals {
    next_id: u64,
    senders: HashMap<u64, oneshot::Sender<()>>,
    stopping: bool,
}

/// A connection's place among the [`StopSignals`], given up when dropped (the connection
/// ended, or its task was dropped).
struct Registered {
    stops: Arc<Mutex<StopSignals>>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.stops.lock().senders.remove(&self.id);
    }
}

impl StopSignals {
    /// A new connection's place and signal; `None` once the server is stopping.
    fn add(stops: &Arc<Mutex<StopSignals>>) -> Option<(Registered, oneshot::Receiver<()>)> {
        let mut signals = stops.lock();
        if signals.stopping {
            return None;
        }
        let (sender, receiver) = oneshot::channel();
        let id = signals.next_id;
        signals.next_id += 1;
        signals.senders.insert(id, sender);
        let registered = Registered {
            stops: stops.clone(),
            id,
        };
        Some((registered, receiver))
    }

    /// Signals every open connection, and refuses new ones from now on.
    fn stop_all(&mut self) {
        self.stopping = true;
        for (_, sender) in self.senders.drain() {
            let _ = sender.send(());
        }
    }
}

/// Serves one connection until it ends; asked to stop, it finishes the request in flight
/// (answered with `Connection: close`) and closes.
async fn serve_connection<Io>(
    http: &http1::Builder,
    io: Io,
    app: Router,
    stop: oneshot::Receiver<()>,
) where
    Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let connection = http.serve_connection(TokioIo::new(io), TowerToHyperService::new(app));
    tokio::pin!(connection);
    let stop_asked = tokio::select! {
        _ = connection.as_mut() => false,
        // Sent, or its sender dropped with the server: either way, stop.
        _ = stop => true,
    };
    if stop_asked {
        connection.as_mut().graceful_shutdown();
        let _ = connection.await;
    }
}

/// One connection over the limit: a 503 written if the socket takes it at once, then closed.
fn refuse_over_limit(stream: &TcpStream) {
    const BODY: &str = concat!(
        r#"{"type":"urn:concord:problem:overloaded","title":"Service Unavailable","#,
        r#""status":503,"detail":"the server has as many connections open as it takes "#,
        r#"(http_max_connections)","retry_after_secs":1}"#
    );
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    let _ = stream.try_write(answer.as_bytes());
}

/// Raises the process's soft descriptor limit to its hard limit, and returns the connections
/// that fit under it, at most `wanted`, keeping a reserve for the stores, peers and snapshots.
pub(crate) fn connections_that_fit(wanted: usize) -> usize {
    const RESERVED_DESCRIPTORS: u64 = 256;
    let Some(limit) = raise_descriptor_limit() else {
        return wanted;
    };
    let fit = limit.saturating_sub(RESERVED_DESCRIPTORS).max(16);
    let fit = usize::try_from(fit).unwrap_or(usize::MAX);
    if fit < wanted {
        tracing::warn!(
            http_max_connections = wanted,
            descriptor_limit = limit,
            lowered_to = fit,
            "the descriptor limit does not fit http_max_connections; lowered"
        );
    }
    wanted.min(fit)
}

#[cfg(unix)]
fn raise_descriptor_limit() -> Option<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    let soft = limit.current?;
    if let Some(hard) = limit.maximum
        && hard > soft
    {
        limit.current = Some(hard);
        if setrlimit(Resource::Nofile, limit).is_ok() {
            return Some(hard);
        }
    }
    Some(soft)
}

#[cfg(not(unix))]
fn raise_descriptor_limit() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use parking_lot::Mutex;

    use super::StopSignals;

    /// Hundreds of clients connecting at once all get in, though nothing accepts them yet (the
    /// standard library's backlog of 128 left the rest of them waiting for the kernel to retry
    /// their handshakes, or gave up on them).
    #[test]
    #[cfg(target_os = "linux")]
    fn a_burst_of_connections_waits_in_the_backlog() {
        const CLIENTS: usize = 512;
        let somaxconn: usize = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(0);
        if somaxconn < CLIENTS {
            return; // This kernel caps every backlog below the burst.
        }
        let listener = super::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let address = listener.local_addr().unwrap();
        let mut clients = Vec::with_capacity(CLIENTS);
        for client in 0..CLIENTS {
            let connected =
                std::net::TcpStream::connect_timeout(&address, std::time::Duration::from_secs(2));
            assert!(
                connected.is_ok(),
                "client {client} of {CLIENTS} did not get in: {connected:?}"
            );
            clients.push(connected.unwrap());
        }
    }

    /// Stopping signals every open connection, not one that already ended, and refuses the
    /// connections accepted after it.
    #[test]
    fn stop_reaches_every_open_connection_and_refuses_later_ones() {
        let stops = Arc::new(Mutex::new(StopSignals::default()));
        let (first, mut first_stop) = StopSignals::add(&stops).unwrap();
        let (ended, _) = StopSignals::add(&stops).unwrap();
        let (_third, mut third_stop) = StopSignals::add(&stops).unwrap();
        assert_ne!(first.id, ended.id);
        drop(ended);
        assert_eq!(
            stops.lock().senders.len(),
            2,
            "an ended connection gives up its place"
        );
        assert!(
            first_stop.try_recv().is_err(),
            "not signalled before the stop"
        );
        stops.lock().stop_all();
        assert!(first_stop.try_recv().is_ok());
        assert!(third_stop.try_recv().is_ok());
        assert!(StopSignals::add(&stops).is_none());
    }
}
