//! The peer network over gRPC (tonic), for one comparison only: the consensus benchmark runs
//! it (`--transport grpc`) against the TCP network the product uses. Each node keeps one
//! client-streaming call open to each peer; every message of that stream is one batch in the
//! TCP network's frame format (`transport::encode_batch`), so that the two differ only in what
//! carries the batches: HTTP/2 and gRPC framing here, a length prefix there. No snapshots, no
//! handshake checks, no reconnection beyond retrying the first connect: a benchmark carrier.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, OnceLock, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut};
use concord_consensus::NodeId;
use concord_consensus::transport::{
    GroupMessage, MessageSink, SnapshotFetchError, Transport, decode_batch, encode_batch,
};
use concord_storage::GroupId;
use tokio::sync::mpsc;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// The one method: a stream of batches from the node named in the `concord-node` header.
const SEND_PATH: &str = "/concord.Peer/Send";

/// Batches queued per peer; beyond, dropped (raft resends).
const QUEUE_BATCHES: usize = 1024;

type Sink = Arc<OnceLock<Weak<dyn MessageSink>>>;

/// A node's peers over gRPC.
pub struct GrpcNetwork {
    queues: BTreeMap<NodeId, mpsc::Sender<Vec<GroupMessage>>>,
    sink: Sink,
    runtime: parking_lot::Mutex<Option<tokio::runtime::Runtime>>,
}

impl GrpcNetwork {
    /// Serves `listener` and streams to every peer of `peers` (this node's entry skipped).
    pub fn start(
        node: NodeId,
        peers: &BTreeMap<NodeId, SocketAddr>,
        listener: std::net::TcpListener,
    ) -> std::io::Result<Arc<GrpcNetwork>> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(format!("concord-grpc-{node}"))
            .enable_all()
            .build()?;
        let sink: Sink = Arc::new(OnceLock::new());
        listener.set_nonblocking(true)?;
        let mut queues = BTreeMap::new();
        {
            let _entered = runtime.enter();
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(
                tokio::net::TcpListener::from_std(listener)?,
            );
            let service = PeerService { sink: sink.clone() };
            runtime.spawn(async move {
                let served = tonic::transport::Server::builder()
                    .add_service(service)
                    .serve_with_incoming(incoming)
                    .await;
                if let Err(error) = served {
                    eprintln!("grpc server stopped: {error}");
                }
            });
            for (&peer, &address) in peers {
                if peer == node {
                    continue;
                }
                let (sender, receiver) = mpsc::channel(QUEUE_BATCHES);
                queues.insert(peer, sender);
                runtime.spawn(stream_to(node, address, receiver));
            }
        }
        Ok(Arc::new(GrpcNetwork {
            queues,
            sink,
            runtime: parking_lot::Mutex::new(Some(runtime)),
        }))
    }

    /// Where received batches go.
    pub fn deliver_to(&self, sink: Weak<dyn MessageSink>) {
        let _ = self.sink.set(sink);
    }

    /// The transport the node's raft sends with.
    pub fn transport(self: &Arc<Self>) -> Arc<dyn Transport> {
        self.clone()
    }

    /// Stops serving and streaming. Idempotent.
    pub fn shutdown(&self) {
        if let Some(runtime) = self.runtime.lock().take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for GrpcNetwork {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Transport for GrpcNetwork {
    fn send(&self, to: NodeId, messages: Vec<GroupMessage>) {
        if let Some(queue) = self.queues.get(&to) {
            let _ = queue.try_send(messages);
        }
    }

    fn fetch_snapshot(
        &self,
        _from: NodeId,
        _group: GroupId,
        _min_index: u64,
        _out: &mut dyn std::io::Write,
    ) -> Result<(), SnapshotFetchError> {
        Err(SnapshotFetchError::Refused(
            "the gRPC benchmark carrier has no snapshots".into(),
        ))
    }
}

/// Keeps one client-streaming call to the peer at `address` and sends every batch queued, with
/// whatever else is queued by then, as one stream message.
async fn stream_to(
    node: NodeId,
    address: SocketAddr,
    mut queue: mpsc::Receiver<Vec<GroupMessage>>,
) {
    let channel = loop {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
            .expect("a socket address makes a URI")
            .tcp_nodelay(true);
        match endpoint.connect().await {
            Ok(channel) => break channel,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let (frames, frame_receiver) = mpsc::channel::<Vec<u8>>(16);
    tokio::spawn(async move {
        while let Some(mut batch) = queue.recv().await {
            while let Ok(more) = queue.try_recv() {
                batch.extend(more);
            }
            if frames.send(encode_batch(&batch)).await.is_err() {
                return;
            }
        }
    });
    let mut request =
        tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(frame_receiver));
    request
        .metadata_mut()
        .insert("concord-node", node.to_string().parse().expect("digits"));
    let mut client = tonic::client::Grpc::new(channel);
    if client.ready().await.is_err() {
        return;
    }
    let path = http::uri::PathAndQuery::from_static(SEND_PATH);
    let _ = client
        .client_streaming::<_, Vec<u8>, Vec<u8>, _>(request, path, BytesCodec)
        .await;
}

/// The server side: every stream's batches go to the node's sink.
#[derive(Clone)]
struct PeerService {
    sink: Sink,
}

impl tonic::server::NamedService for PeerService {
    const NAME: &'static str = "concord.Peer";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl tower_service::Service<http::Request<tonic::body::Body>> for PeerService {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let receive = ReceiveBatches {
            sink: self.sink.clone(),
        };
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(BytesCodec);
            Ok(grpc.client_streaming(receive, request).await)
        })
    }
}

#[derive(Clone)]
struct ReceiveBatches {
    sink: Sink,
}

impl tower_service::Service<tonic::Request<tonic::Streaming<Vec<u8>>>> for ReceiveBatches {
    type Response = tonic::Response<Vec<u8>>;
    type Error = tonic::Status;
    type Future = BoxFuture<Result<Self::Response, tonic::Status>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), tonic::Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: tonic::Request<tonic::Streaming<Vec<u8>>>) -> Self::Future {
        let sink = self.sink.clone();
        Box::pin(async move {
            let from: NodeId = request
                .metadata()
                .get("concord-node")
                .and_then(|value| value.to_str().ok()?.parse().ok())
                .ok_or_else(|| tonic::Status::invalid_argument("no concord-node header"))?;
            let mut stream = request.into_inner();
            while let Some(body) = stream.message().await? {
                let messages = decode_batch(&body).map_err(tonic::Status::invalid_argument)?;
                if let Some(sink) = sink.get().and_then(Weak::upgrade) {
                    sink.deliver(from, messages);
                }
            }
            Ok(tonic::Response::new(Vec::new()))
        })
    }
}

/// Stream messages as raw bytes: the batch is already encoded.
#[derive(Clone, Copy, Default)]
struct BytesCodec;

impl Codec for BytesCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = BytesCodec;
    type Decoder = BytesCodec;

    fn encoder(&mut self) -> BytesCodec {
        BytesCodec
    }

    fn decoder(&mut self) -> BytesCodec {
        BytesCodec
    }
}

impl Encoder for BytesCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for BytesCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let mut body = vec![0; src.remaining()];
        src.copy_to_slice(&mut body);
        Ok(Some(body))
    }
}
