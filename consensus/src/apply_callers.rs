//! The callers of this node's proposals, from the entry they went into to their answer.
//!
//! Until its entry commits a [`ProposedEntry`] owns its callers, on the raft worker. At commit
//! its list of callers moves (whole, not caller by caller) into the [`ApplyCallers`] of the
//! apply message that carries the entry: one lock per message, shared by the apply thread,
//! which answers their results, and the worker, which answers `Timeout` to any still waiting
//! past the proposal timeout (an apply that never finishes must not leave callers waiting).
//! One shared lock per message rather than one per entry: a round that commits in a thousand
//! groups allocates, counts references to and locks one, not a thousand.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use concord_storage::GroupId;
use parking_lot::{Mutex, MutexGuard};

use crate::ProposeError;
use crate::pending::Responder;

/// Proposals of this node that went into one entry, not yet committed.
pub(crate) struct ProposedEntry {
    /// The entry's index and the term it was proposed in: if the committed entry at that index
    /// has another term, a new leader replaced it and the proposals were dropped.
    pub(crate) index: u64,
    pub(crate) term: u64,
    /// When the entry's oldest command was proposed.
    pub(crate) oldest_enqueued_at: Instant,
    /// When this node persisted the entry (the start of its commit wait).
    pub(crate) persisted_at: Option<Instant>,
    /// One responder per command, in the entry's order.
    pub(crate) responders: Vec<Responder<Bytes>>,
}

impl ProposedEntry {
    pub(crate) fn new(
        index: u64,
        term: u64,
        oldest_enqueued_at: Instant,
        responders: Vec<Responder<Bytes>>,
    ) -> Self {
        ProposedEntry {
            index,
            term,
            oldest_enqueued_at,
            persisted_at: None,
            responders,
        }
    }

    /// Answers every caller of the entry not answered yet with `error`.
    pub(crate) fn answer_all(&mut self, error: &ProposeError) {
        for responder in &mut self.responders {
            responder.answer(Err(error.clone()));
        }
    }
}

/// A committed entry that carries proposals of this node: its index, the term it was proposed
/// in, and where its callers are.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CommittedProposal {
    pub(crate) index: u64,
    pub(crate) term: u64,
    callers: CallersAt,
}

/// Where one entry's callers are among a round's: the message, and the entry's place in it.
#[derive(Clone, Copy, Debug)]
struct CallersAt {
    message: u32,
    entry: u32,
}

/// The callers of one entry, in the entry's order (moved whole, never copied caller by caller).
type EntryCallers = Vec<Responder<Bytes>>;

/// Builds one apply message's callers on the worker, group by group.
#[derive(Default)]
pub(crate) struct CallersBuilder {
    entries: Vec<EntryCallers>,
    group_ends: Vec<(GroupId, u32)>,
    oldest_enqueued_at: Option<Instant>,
}

impl CallersBuilder {
    /// Moves the callers of `group`'s committed `proposal` in. A group's proposals come
    /// together, one group after another.
    pub(crate) fn commit(&mut self, group: GroupId, proposal: ProposedEntry) -> CommittedProposal {
        let entry = self.entries.len() as u32;
        self.entries.push(proposal.responders);
        let end = entry + 1;
        match self.group_ends.last_mut() {
            Some((last, last_end)) if *last == group => *last_end = end,
            _ => self.group_ends.push((group, end)),
        }
        let oldest = self
            .oldest_enqueued_at
            .map_or(proposal.oldest_enqueued_at, |o| {
                o.min(proposal.oldest_enqueued_at)
            });
        self.oldest_enqueued_at = Some(oldest);
        CommittedProposal {
            index: proposal.index,
            term: proposal.term,
            callers: CallersAt { message: 0, entry },
        }
    }

    /// The message's callers, or `None` if it carries none (a follower's, or another node's
    /// entries only).
    pub(crate) fn finish(self) -> Option<Arc<ApplyCallers>> {
        let oldest_enqueued_at = self.oldest_enqueued_at?;
        Some(Arc::new(ApplyCallers {
            entries: Mutex::new(self.entries),
            group_ends: self.group_ends,
            oldest_enqueued_at,
        }))
    }
}

/// The callers of one apply message: answered by the apply thread, or by the worker if they
/// wait too long.
pub(crate) struct ApplyCallers {
    entries: Mutex<Vec<EntryCallers>>,
    /// `(group, end)`: the entries up to `end` (from the previous group's end) are `group`'s.
    group_ends: Vec<(GroupId, u32)>,
    /// When the message's oldest command was proposed: younger messages need no look.
    oldest_enqueued_at: Instant,
}

impl ApplyCallers {
    /// Answers `Timeout` to every caller not answered yet that waited longer than `timeout`.
    pub(crate) fn answer_expired(&self, timeout: Duration) {
        if self.oldest_enqueued_at.elapsed() <= timeout {
            return;
        }
        let timeout_ms = timeout.as_millis() as u64;
        let mut entries = self.entries.lock();
        if entries.is_empty() {
            return; // The apply thread answered them all and let the list go.
        }
        let mut start = 0;
        for &(group, end) in &self.group_ends {
            let error = ProposeError::Timeout { group, timeout_ms };
            let end = end as usize;
            for responder in entries[start..end].iter_mut().flatten() {
                responder.answer_if_expired(timeout, &error);
            }
            start = end;
        }
    }
}

/// The callers of every message an apply round merged, on the apply thread.
#[derive(Default)]
pub(crate) struct RoundCallers {
    messages: Vec<Arc<ApplyCallers>>,
}

impl RoundCallers {
    /// Takes a message's callers into the round, pointing its `proposals` at them.
    pub(crate) fn add<'p>(
        &mut self,
        callers: Option<Arc<ApplyCallers>>,
        proposals: impl Iterator<Item = &'p mut CommittedProposal>,
    ) {
        let Some(callers) = callers else {
            return;
        };
        let message = self.messages.len() as u32;
        for proposal in proposals {
            proposal.callers.message = message;
        }
        self.messages.push(callers);
    }

    /// Locks every message's callers, to answer some. Never held while applying: the worker
    /// must be able to answer `Timeout` meanwhile.
    pub(crate) fn lock(&self) -> LockedCallers<'_> {
        LockedCallers {
            messages: self.messages.iter().map(|m| m.entries.lock()).collect(),
        }
    }

    /// Lets go of the callers, all answered, here rather than on the worker: the worker
    /// forgets a message once the apply thread has let it go.
    pub(crate) fn release(self) {
        for message in &self.messages {
            drop(std::mem::take(&mut *message.entries.lock()));
        }
    }
}

/// A round's callers, locked.
pub(crate) struct LockedCallers<'a> {
    messages: Vec<MutexGuard<'a, Vec<EntryCallers>>>,
}

impl LockedCallers<'_> {
    /// The callers of `proposal`'s entry, in the entry's order.
    pub(crate) fn of(&mut self, proposal: &CommittedProposal) -> &mut [Responder<Bytes>] {
        let at = proposal.callers;
        let found = self
            .messages
            .get_mut(at.message as usize)
            .and_then(|entries| entries.get_mut(at.entry as usize));
        debug_assert!(
            found.is_some(),
            "entry {}: callers not in the round",
            proposal.index
        );
        found.map_or(&mut [], |callers| callers.as_mut_slice())
    }
}

/// The messages handed to the apply thread whose callers it may not have answered yet, oldest
/// first, on the worker. At most one per message in the apply queue or waiting for it.
#[derive(Default)]
pub(crate) struct InApply {
    messages: std::collections::VecDeque<Arc<ApplyCallers>>,
}

impl InApply {
    /// Remembers a message's callers as it goes to the apply thread.
    pub(crate) fn push(&mut self, callers: &Arc<ApplyCallers>) {
        self.forget_applied();
        self.messages.push_back(Arc::clone(callers));
    }

    /// Answers `Timeout` to the callers of messages the apply thread has not finished that
    /// waited longer than `timeout`.
    pub(crate) fn answer_expired(&mut self, timeout: Duration) {
        self.forget_applied();
        for callers in &self.messages {
            callers.answer_expired(timeout);
        }
    }

    /// Forgets the messages the apply thread has let go (it applies them in order).
    fn forget_applied(&mut self) {
        while self
            .messages
            .front()
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            self.messages.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pending::Pending;

    fn proposal(
        group: GroupId,
        index: u64,
        callers: usize,
        enqueued: Instant,
    ) -> (ProposedEntry, Vec<Pending<Bytes>>) {
        let (pendings, responders): (Vec<_>, Vec<_>) = (0..callers)
            .map(|_| {
                let (pending, mut responder) = Pending::new(group);
                responder.enqueued_at = enqueued;
                (pending, responder)
            })
            .unzip();
        (ProposedEntry::new(index, 1, enqueued, responders), pendings)
    }

    fn now_or_never<T: Unpin>(pending: &mut Pending<T>) -> Option<Result<T, ProposeError>> {
        use std::future::Future;
        use std::task::{Context, Poll, Waker};
        let mut cx = Context::from_waker(Waker::noop());
        match std::pin::Pin::new(pending).poll(&mut cx) {
            Poll::Ready(answer) => Some(answer),
            Poll::Pending => None,
        }
    }

    #[test]
    fn each_entry_answers_its_own_callers_across_merged_messages() {
        let now = Instant::now();
        let mut round = RoundCallers::default();
        let mut all_pendings = Vec::new();
        let mut all_proposals = Vec::new();
        for message in 0..2u64 {
            let mut builder = CallersBuilder::default();
            let mut proposals = Vec::new();
            for (group, index, callers) in [(1, 10 + message, 2), (2, 20 + message, 3)] {
                let (entry, pendings) = proposal(group, index, callers, now);
                proposals.push(builder.commit(group, entry));
                all_pendings.push((index, pendings));
            }
            round.add(builder.finish(), proposals.iter_mut());
            all_proposals.extend(proposals);
        }
        {
            let mut locked = round.lock();
            for proposal in &all_proposals {
                for responder in locked.of(proposal) {
                    responder.answer(Ok(Bytes::from(proposal.index.to_string())));
                }
            }
        }
        round.release();
        for (index, pendings) in &mut all_pendings {
            for pending in pendings {
                let answer = now_or_never(pending).expect("answered");
                assert_eq!(answer.unwrap(), Bytes::from(index.to_string()));
            }
        }
    }

    #[test]
    fn the_worker_times_out_callers_of_an_unfinished_message_by_group() {
        let timeout = Duration::from_millis(100);
        let old = Instant::now() - Duration::from_secs(1);
        let young = Instant::now();
        let mut builder = CallersBuilder::default();
        let (first, mut old_pendings) = proposal(7, 1, 2, old);
        let (second, mut young_pendings) = proposal(8, 1, 1, young);
        let (third, mut old_later) = proposal(8, 2, 1, old);
        builder.commit(7, first);
        builder.commit(8, second);
        builder.commit(8, third);
        let callers = builder.finish().expect("callers");
        let mut in_apply = InApply::default();
        in_apply.push(&callers);
        in_apply.answer_expired(timeout);
        for pending in &mut old_pendings {
            match now_or_never(pending) {
                Some(Err(ProposeError::Timeout { group: 7, .. })) => {}
                other => panic!("expected group 7's timeout, got {other:?}"),
            }
        }
        match now_or_never(&mut old_later[0]) {
            Some(Err(ProposeError::Timeout { group: 8, .. })) => {}
            other => panic!("expected group 8's timeout, got {other:?}"),
        }
        assert!(now_or_never(&mut young_pendings[0]).is_none());
        assert_eq!(in_apply.messages.len(), 1);
        // Once the apply thread lets it go, the worker forgets it.
        let mut round = RoundCallers::default();
        round.add(Some(callers), std::iter::empty());
        round.release();
        in_apply.answer_expired(timeout);
        assert!(in_apply.messages.is_empty());
    }

    #[test]
    fn a_message_without_callers_needs_no_list() {
        assert!(CallersBuilder::default().finish().is_none());
    }
}
