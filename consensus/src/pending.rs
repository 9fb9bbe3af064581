//! The future a caller awaits for its proposal's result, and the sending half the node keeps.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use concord_storage::GroupId;
use parking_lot::Mutex;
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
            to: Some(AnswerTo::Caller(sender)),
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

impl<T: Send + 'static> Pending<Vec<Result<T, ProposeError>>> {
    /// The pending answer of a batch of `count` commands and one responder per command, in
    /// the batch's order: the answers are gathered as the responders give them and reach the
    /// caller together, with one wake, when the last one comes.
    pub(crate) fn batch(group: GroupId, count: usize) -> (Self, Vec<Responder<T>>) {
        if count == 0 {
            return (Pending::ready(group, Ok(Vec::new())), Vec::new());
        }
        let (sender, receiver) = oneshot::channel();
        let pending = Pending {
            state: PendingState::Waiting(receiver),
            group,
        };
        let answers = Arc::new(BatchAnswers {
            group,
            gathered: Mutex::new(Gathered {
                answers: std::iter::repeat_with(|| None).take(count).collect(),
                missing: count,
                caller: Some(sender),
            }),
        });
        let enqueued_at = Instant::now();
        let responders = (0..count)
            .map(|index| Responder {
                to: Some(AnswerTo::Batch {
                    answers: answers.clone(),
                    index,
                }),
                enqueued_at,
            })
            .collect();
        (pending, responders)
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
            PendingState::Waiting(receiver) => Pin::new(receiver)
                .poll(cx)
                .map(|answer| answer.unwrap_or_else(|_| Err(stopped_before_answering(group)))),
        }
    }
}

/// The node's half of a [`Pending`]: answers exactly once. One dropped unanswered answers
/// `Stopped` (its caller's future sees the sender go; a batch's gathered answers get the
/// error in its place).
pub(crate) struct Responder<T> {
    to: Option<AnswerTo<T>>,
    /// When the caller proposed: the start of `raft_write_duration_seconds`.
    pub(crate) enqueued_at: Instant,
}

/// Where a responder's answer goes.
enum AnswerTo<T> {
    /// Straight to the caller's future.
    Caller(oneshot::Sender<Result<T, ProposeError>>),
    /// Into place `index` of a batch's answers.
    Batch {
        answers: Arc<BatchAnswers<T>>,
        index: usize,
    },
}

/// The future a batch's caller awaits.
type BatchCaller<T> = oneshot::Sender<Result<Vec<Result<T, ProposeError>>, ProposeError>>;

/// A batch's answers, gathered in the batch's order until none is missing.
struct BatchAnswers<T> {
    group: GroupId,
    gathered: Mutex<Gathered<T>>,
}

struct Gathered<T> {
    answers: Vec<Option<Result<T, ProposeError>>>,
    missing: usize,
    /// Taken when the last answer comes.
    caller: Option<BatchCaller<T>>,
}

impl<T> BatchAnswers<T> {
    fn answer(&self, index: usize, result: Result<T, ProposeError>) {
        let mut gathered = self.gathered.lock();
        let Some(place) = gathered.answers.get_mut(index) else {
            return;
        };
        if place.is_some() {
            return;
        }
        *place = Some(result);
        gathered.missing -= 1;
        if gathered.missing > 0 {
            return;
        }
        let group = self.group;
        let answers = std::mem::take(&mut gathered.answers)
            .into_iter()
            .map(|answer| answer.unwrap_or_else(|| Err(stopped_before_answering(group))))
            .collect();
        let caller = gathered.caller.take();
        drop(gathered);
        if let Some(caller) = caller {
            let _ = caller.send(Ok(answers));
        }
    }
}

fn stopped_before_answering(group: GroupId) -> ProposeError {
    ProposeError::Stopped {
        group,
        reason: "the node stopped before answering".to_string(),
    }
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
        match self.to.take() {
            Some(AnswerTo::Caller(sender)) => {
                let _ = sender.send(result);
            }
            Some(AnswerTo::Batch { answers, index }) => answers.answer(index, result),
            None => {}
        }
    }

    /// `true` once answered.
    pub(crate) fn is_answered(&self) -> bool {
        self.to.is_none()
    }

    /// Answers `error` (a timeout) if the caller is still waiting and has waited longer than
    /// `timeout`.
    pub(crate) fn answer_if_expired(&mut self, timeout: Duration, error: &ProposeError) {
        if !self.is_answered() && self.enqueued_at.elapsed() > timeout {
            self.answer(Err(error.clone()));
        }
    }
}

impl<T> Drop for Responder<T> {
    fn drop(&mut self) {
        if let Some(AnswerTo::Batch { answers, index }) = self.to.take() {
            let group = answers.group;
            answers.answer(index, Err(stopped_before_answering(group)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now_or_never<T: Unpin>(pending: &mut Pending<T>) -> Option<Result<T, ProposeError>> {
        let waker = std::task::Waker::noop();
        match Pin::new(pending).poll(&mut Context::from_waker(waker)) {
            Poll::Ready(answer) => Some(answer),
            Poll::Pending => None,
        }
    }

    #[test]
    fn a_batch_resolves_once_every_command_is_answered_in_its_order() {
        let (mut pending, mut responders) = Pending::<Vec<Result<u64, ProposeError>>>::batch(3, 3);
        responders[2].answer(Ok(30));
        responders[0].answer(Ok(10));
        assert!(
            now_or_never(&mut pending).is_none(),
            "one answer is missing"
        );
        assert!(responders[0].is_answered());
        responders[0].answer(Ok(11)); // Answered already: ignored.
        responders[1].answer(Err(ProposeError::Dropped { group: 3 }));
        let answers = now_or_never(&mut pending).unwrap().unwrap();
        assert_eq!(
            answers,
            vec![Ok(10), Err(ProposeError::Dropped { group: 3 }), Ok(30)]
        );
    }

    #[test]
    fn a_batch_command_dropped_unanswered_is_stopped_in_its_place() {
        let (mut pending, mut responders) = Pending::<Vec<Result<u64, ProposeError>>>::batch(4, 2);
        responders[1].answer(Ok(1));
        drop(responders);
        let answers = now_or_never(&mut pending).unwrap().unwrap();
        assert!(matches!(
            answers[0],
            Err(ProposeError::Stopped { group: 4, .. })
        ));
        assert_eq!(answers[1], Ok(1));
    }

    #[test]
    fn an_empty_batch_is_answered_at_once() {
        let (mut pending, responders) = Pending::<Vec<Result<u64, ProposeError>>>::batch(1, 0);
        assert!(responders.is_empty());
        assert_eq!(now_or_never(&mut pending).unwrap().unwrap(), Vec::new());
    }
}
