//! `GET /v1/backup`: a backup of this node's state (`Engine::backup`), streamed as it is
//! written, for `concord backup` to keep and `concord restore` to make a data directory from.

use std::io::Write;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use concord_engine::Consistency;
use tokio::sync::mpsc;

use crate::AppState;
use crate::openapi_shared::AdminProblems;
use crate::problem::Problem;
use crate::routes_sessions::{ReadQuery, parse_consistency, query};

/// Bytes handed to the connection at a time.
const CHUNK_BYTES: usize = 64 * 1024;

/// Chunks written ahead of a slow client: the writer waits beyond this, so a backup holds at
/// most this many chunks in memory whatever the state's size.
const CHUNKS_AHEAD: usize = 4;

/// Streams a backup of every group. With `linearizable` (the default) or `lease`, it first
/// waits until each group here holds every write acknowledged before the request; with
/// `stale` it takes what this node holds (a member cut off from its quorum can still give
/// that). A failure while streaming ends the body without its last chunk: the client sees a
/// body cut short, and a backup without its trailer does not restore.
#[utoipa::path(get, path = "/v1/backup", tag = "cluster",
    summary = "A backup of this node's state, for `concord restore`",
    params(
        ("consistency" = Option<String>, Query, pattern = "^(linearizable|lease|stale)$", description = "linearizable (default) or lease: every write acknowledged before the request is in the backup; stale: what this node has applied")
    ),
    responses(
        (status = 200, description = "the backup, streamed: every group's state and the group layout (a failure while streaming cuts the body short, and a cut backup does not restore)", content_type = "application/octet-stream"),
        (status = 400, description = "an unknown consistency, or another query parameter", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "a group is between leaders, or the node is overloaded; ask again", body = Problem, content_type = "application/problem+json"),
        (status = 504, description = "a group's read barrier found no quorum within the request timeout (a member cut off from its majority: ask for `stale`)", body = Problem, content_type = "application/problem+json"),
        AdminProblems
    ))]
pub async fn backup(
    State(state): State<AppState>,
    read: Result<Query<ReadQuery>, QueryRejection>,
) -> Result<Response, Problem> {
    let consistency = parse_consistency(query(read)?.consistency.as_deref())?;
    let engine = state.engine.clone();
    if consistency != Consistency::Stale {
        let barriers = engine
            .group_ids()
            .iter()
            .map(|&group| engine.ready_to_read(group, consistency));
        futures_util::future::try_join_all(barriers).await?;
    }
    let (chunks, received) = mpsc::channel(CHUNKS_AHEAD);
    tokio::task::spawn_blocking(move || {
        let mut out = ChunkWriter {
            chunks,
            buffer: Vec::with_capacity(CHUNK_BYTES),
        };
        let written = engine.backup(&mut out);
        match written {
            Ok(summary) => tracing::info!(
                groups = summary.groups,
                records = summary.records,
                bytes = summary.bytes,
                "backup sent"
            ),
            Err(error) => {
                tracing::warn!(%error, "backup not sent whole");
                let cut = std::io::Error::other(error.to_string());
                let _ = out.chunks.blocking_send(Err(cut));
            }
        }
    });
    let stream = futures_util::stream::unfold(received, |mut received| async move {
        let chunk = received.recv().await?;
        Some((chunk, received))
    });
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"concord.backup\"",
            ),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

/// Hands what the backup writes to the response in chunks; fails once the client is gone, so
/// the backup stops reading.
struct ChunkWriter {
    chunks: mpsc::Sender<std::io::Result<Bytes>>,
    buffer: Vec<u8>,
}

impl ChunkWriter {
    fn send_buffer(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buffer, Vec::with_capacity(CHUNK_BYTES));
        self.chunks
            .blocking_send(Ok(Bytes::from(chunk)))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client left"))
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.buffer.extend_from_slice(buf);
        if self.buffer.len() >= CHUNK_BYTES {
            self.send_buffer()?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send_buffer()
    }
}
