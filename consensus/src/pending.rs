//! The future a caller awaits for its proposal's result, and the sending half the node keeps.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use concord_storage::GroupId;
use tokio::sync::oneshot;

use crate::ProposeError;
use crate::status::SharedGroupStatus;

/// The answer to a proposal or a read barrier, to be awaited.
///
/// Errors known at once (not the leader, queue full) resolve on the first poll; otherwise the
/// node answers when the command has applied, when it times out, or when the group stops (a
/// dropped answer resolves as `Stopped`). It never waits forever: the node enforces the
/// proposal timeout.
#[must_use = "a proposal's outcome is only known by awaiting it"]
pub struct Pending<T> {
    state: PendingState<T>,
    group: GroupId,
}

enum PendingState<T> {
    Ready(Option<Result<T, ProposeError>>),
    Waiting(oneshot::Receiver<Result<T, ProposeError>>),
}

impl<T> Pending<T> {
    /// A pending answer and the responder that completes it.
    pub(crate) fn new(group: GroupId) -> (Pending<T>, Responder<T>) {
        let (sender, receiver) = oneshot::channel();
        let pending = Pending {
            state: PendingState::Waiting(receiver),
            group,
        };
        let responder = Responder {
            sender: Some(sender),
            enqueued_at: Instant::now(),
        };
        (pending, responder)
    }

    /// An answer that is already known.
    pub(crate) fn ready(group: GroupId, result: Result<T, ProposeError>) -> Pending<T> {
        Pending {
            state: PendingState::Ready(Some(result)),
            group,
        }
    }
}

impl<T> Future for Pending<T>
where
    T: Unpin,
{
    type Output = Result<T, ProposeError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let group = this.group;
        match &mut this.state {
            PendingState::Ready(result) => {
                Poll::Ready(result.take().expect("Pending polled after completion"))
            }
            PendingState::Waiting(receiver) => Pin::new(receiver).poll(cx).map(|answer| {
                answer.unwrap_or_else(|_| {
                    Err(ProposeError::Stopped {
                        group,
                        reason: "the node stopped before answering".to_string(),
                    })
                })
            }),
        }
    }
}

/// The node's half of a [`Pending`]: answers exactly once.
pub(crate) struct Responder<T> {
    sender: Option<oneshot::Sender<Result<T, ProposeError>>>,
    /// When the caller proposed: the start of `raft_write_duration_seconds`.
    pub(crate) enqueued_at: Instant,
}

/// The node's half of a read barrier, holding one of the group's places for waiting reads
/// until it goes (a read is answered or dropped).
pub(crate) struct ReadResponder {
    pub(crate) responder: Responder<u64>,
    _permit: ReadPermit,
}

impl ReadResponder {
    pub(crate) fn new(responder: Responder<u64>, permit: ReadPermit) -> Self {
        ReadResponder {
            responder,
            _permit: permit,
        }
    }

    /// Answers the reader (one that gave up is ignored).
    pub(crate) fn answer(&mut self, result: Result<u64, ProposeError>) {
        self.responder.answer(result);
    }

    /// When the read arrived.
    pub(crate) fn enqueued_at(&self) -> Instant {
        self.responder.enqueued_at
    }
}

/// One of the places a group has for waiting reads (`NodeConfig::max_waiting_reads`); taken
/// when a read is admitted, given back when its responder is dropped, however it ends.
pub(crate) struct ReadPermit {
    status: Arc<SharedGroupStatus>,
}

impl ReadPermit {
    /// Takes a place among `status`'s waiting reads, or `None` if all `limit` are taken.
    pub(crate) fn take(status: &Arc<SharedGroupStatus>, limit: usize) -> Option<ReadPermit> {
        let taken = status.waiting_reads.fetch_add(1, Ordering::AcqRel);
        if taken >= limit {
            status.waiting_reads.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(ReadPermit {
            status: status.clone(),
        })
    }
}

impl Drop for ReadPermit {
    fn drop(&mut self) {
        self.status.waiting_reads.fetch_sub(1, Ordering::AcqRel);
    }
}

impl<T> Responder<T> {
    /// Answers the caller (a caller that gave up is ignored).
    pub(crate) fn answer(&mut self, result: Result<T, ProposeError>) {
        if let Some(sender) = self.sender.take() {
            let _ = sender.send(result);
        }
    }

    /// `true` once answered.
    pub(crate) fn is_answered(&self) -> bool {
        self.sender.is_none()
    }

    /// Answers `error` (a timeout) if the caller is still waiting and has waited longer than
    /// `timeout`.
    pub(crate) fn answer_if_expired(&mut self, timeout: Duration, error: &ProposeError) {
        if !self.is_answered() && self.enqueued_at.elapsed() > timeout {
            self.answer(Err(error.clone()));
        }
    }
}
