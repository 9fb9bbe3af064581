//! A snapshot a follower received: raft-rs's `Ready` that carries it is held while the state
//! is fetched and installed, then handed back to be persisted like any other `Ready`.
//!
//! The snapshot message names only the index, the term, the configuration and a ticket with
//! the member to fetch the state from. A failed fetch is tried again a retry interval later
//! (a short one if the member only refused it for now), from the leader if it changed, else
//! from the next member of the snapshot's configuration.

use std::time::{Duration, Instant};

use concord_storage::raft::Ready;
use concord_storage::raft::prelude::{ConfState, Message, MessageType};

use super::storage::SnapshotTicket;
use crate::NodeId;

/// How long a follower waits before fetching a snapshot's state again after a failure.
const SNAPSHOT_RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// How long it waits after the member asked refused to send the state now (it sends as many
/// as it may already, or has not applied that far yet): both pass within moments, and a
/// member catching up thousands of groups meets such refusals in the normal course, each of
/// which held its group back a whole retry interval. A refusal costs the two members a
/// connection and a few bytes.
const SNAPSHOT_REFUSED_RETRY_INTERVAL: Duration = Duration::from_millis(200);

/// A received snapshot on its way from the message to the state store.
pub(super) struct SnapshotReceipt {
    ready: Ready,
    /// Whom to fetch the state from next.
    source: NodeId,
    stage: Stage,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// A fetch is to start at this time (the first one at once; again after a failure).
    FetchAt(Instant),
    /// Being fetched or installed.
    Busy,
    /// The state is in the state store: the `Ready` can be persisted.
    Installed,
}

impl SnapshotReceipt {
    /// Holds `ready`, whose snapshot is fetched first from the member its ticket names (from
    /// `leader` if the ticket cannot be read).
    pub(super) fn new(ready: Ready, leader: NodeId) -> Self {
        let source = SnapshotTicket::decode(ready.snapshot().get_data())
            .map_or(leader, |ticket| ticket.source);
        SnapshotReceipt {
            ready,
            source,
            stage: Stage::FetchAt(Instant::now()),
        }
    }

    /// The snapshot's index: the state fetched must be at least there.
    pub(super) fn index(&self) -> u64 {
        self.ready.snapshot().get_metadata().index
    }

    /// The member the next fetch asks.
    pub(super) fn source(&self) -> NodeId {
        self.source
    }

    /// Whether the state is installed and the `Ready` may be persisted.
    pub(super) fn is_installed(&self) -> bool {
        self.stage == Stage::Installed
    }

    /// `(source, index)` of a fetch to start now, if one is due; the receipt is then busy
    /// until [`SnapshotReceipt::installed`] or [`SnapshotReceipt::fetch_failed`].
    pub(super) fn fetch_due(&mut self, now: Instant) -> Option<(NodeId, u64)> {
        match self.stage {
            Stage::FetchAt(at) if now >= at => {
                self.stage = Stage::Busy;
                Some((self.source, self.index()))
            }
            _ => None,
        }
    }

    /// The member a fetch due now would ask, leaving the fetch due.
    pub(super) fn source_if_due(&self, now: Instant) -> Option<NodeId> {
        match self.stage {
            Stage::FetchAt(at) if now >= at => Some(self.source),
            _ => None,
        }
    }

    /// The state is in the state store.
    pub(super) fn installed(&mut self) {
        self.stage = Stage::Installed;
    }

    /// The fetch from [`SnapshotReceipt::source`] failed, or was `refused` for now: the next
    /// one, a retry interval from `now`, asks whom [`next_snapshot_source`] names.
    pub(super) fn fetch_failed(
        &mut self,
        this_node: NodeId,
        leader: NodeId,
        now: Instant,
        refused: bool,
    ) {
        let members = members_of(self.ready.snapshot().get_metadata().get_conf_state());
        self.source = next_snapshot_source(&members, this_node, self.source, leader);
        let interval = if refused {
            SNAPSHOT_REFUSED_RETRY_INTERVAL
        } else {
            SNAPSHOT_RETRY_INTERVAL
        };
        self.stage = Stage::FetchAt(now + interval);
    }

    /// The held `Ready`, to persist once the state is installed.
    pub(super) fn into_ready(self) -> Ready {
        self.ready
    }
}

/// Drops from `messages` — those of the `Ready` that carried a snapshot at `snapshot_index`,
/// sent once the state is installed — every append rejection that places this node's log end
/// before the snapshot. Such a rejection answered an append that arrived in the same round as
/// the snapshot, before it; once the state is in, it is untrue. A leader that got it after the
/// install would take this node's log for ending there (at 0 for a node without data) and
/// send the whole state once more. A rejection made after the snapshot names its index and is
/// kept.
pub(super) fn drop_rejections_the_snapshot_answers(
    messages: &mut Vec<Message>,
    snapshot_index: u64,
) {
    messages.retain(|message| {
        !(message.get_msg_type() == MessageType::MsgAppendResponse
            && message.reject
            && message.reject_hint < snapshot_index)
    });
}

/// Every member a configuration names (voters and learners, on both sides of a joint one),
/// sorted, once each.
fn members_of(conf_state: &ConfState) -> Vec<NodeId> {
    let mut members: Vec<NodeId> = [
        conf_state.get_voters(),
        conf_state.get_learners(),
        conf_state.get_voters_outgoing(),
        conf_state.get_learners_next(),
    ]
    .concat();
    members.sort_unstable();
    members.dedup();
    members
}

/// Whom a follower fetches a snapshot's state from after a fetch from `failed` failed: the
/// leader if it is another node by now, else the next member of the snapshot's configuration
/// after `failed`, round and round. Any member that has applied through the snapshot's index
/// can serve it, and the one named in the ticket may never again: it may have lost its data
/// since, and while this group holds the snapshot it takes no message, so it learns of no new
/// leader — the members it can ask are all it has.
fn next_snapshot_source(
    members: &[NodeId],
    this_node: NodeId,
    failed: NodeId,
    leader: NodeId,
) -> NodeId {
    if leader != 0 && leader != this_node && leader != failed {
        return leader;
    }
    let others = || members.iter().copied().filter(|&m| m != this_node);
    others()
        .find(|&m| m > failed)
        .or_else(|| others().next())
        .unwrap_or(failed)
}

#[cfg(test)]
mod tests {
    use concord_storage::raft::storage::MemStorage;
    use concord_storage::raft::{Config, RawNode};

    use super::*;

    /// Node 2, a follower of a fresh group of voters 1, 2 and 3 with an empty log.
    fn fresh_follower() -> RawNode<MemStorage> {
        let storage = MemStorage::new_with_conf_state((vec![1, 2, 3], vec![]));
        let config = Config {
            id: 2,
            ..Config::default()
        };
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        RawNode::new(&config, storage, &logger).expect("a valid configuration")
    }

    /// Leader 1's message of `kind` to node 2 in term 2.
    fn from_leader(kind: MessageType) -> Message {
        let mut message = Message::default();
        message.set_msg_type(kind);
        message.from = 1;
        message.to = 2;
        message.term = 2;
        message
    }

    /// Leader 1's snapshot at index 10 of a group of voters 1, 2 and 3, whose data is `data`.
    fn snapshot_message(data: Vec<u8>) -> Message {
        let mut message = from_leader(MessageType::MsgSnapshot);
        let snapshot = message.mut_snapshot();
        snapshot.data = data.into();
        let metadata = snapshot.mut_metadata();
        metadata.index = 10;
        metadata.term = 2;
        metadata.mut_conf_state().set_voters(vec![1, 2, 3]);
        message
    }

    /// Leader 1's append of nothing after `index`, whose entry is of term 2.
    fn append_after(index: u64) -> Message {
        let mut message = from_leader(MessageType::MsgAppend);
        message.index = index;
        message.log_term = 2;
        message
    }

    /// The `Ready` of a fresh follower that has just stepped a snapshot at index 10 whose data
    /// is `data`.
    fn ready_with_snapshot(data: Vec<u8>) -> Ready {
        let mut raw = fresh_follower();
        raw.step(snapshot_message(data))
            .expect("the snapshot is stepped");
        let ready = raw.ready();
        assert!(
            !ready.snapshot().is_empty(),
            "raft-rs hands the snapshot on"
        );
        ready
    }

    #[test]
    fn rejections_made_before_a_snapshot_are_dropped_and_those_after_it_kept() {
        let mut raw = fresh_follower();
        // An append this empty log cannot take, then the snapshot, then an append past it: all
        // three in one round, as when a leader's appends and its ticket arrive together.
        raw.step(append_after(9)).expect("the append is stepped");
        raw.step(snapshot_message(Vec::new()))
            .expect("the snapshot is stepped");
        raw.step(append_after(12)).expect("the append is stepped");
        let mut ready = raw.ready();
        assert!(!ready.snapshot().is_empty());
        let mut messages = ready.take_persisted_messages();
        let rejection_hints = |messages: &[Message]| -> Vec<u64> {
            messages
                .iter()
                .filter(|m| m.reject)
                .map(|m| m.reject_hint)
                .collect()
        };
        assert_eq!(
            rejection_hints(&messages),
            vec![0, 10],
            "raft-rs answers both appends in the snapshot's Ready"
        );

        drop_rejections_the_snapshot_answers(&mut messages, 10);
        assert_eq!(rejection_hints(&messages), vec![10]);
        assert!(
            messages
                .iter()
                .any(|m| m.get_msg_type() == MessageType::MsgAppendResponse
                    && !m.reject
                    && m.index == 10),
            "the snapshot's acknowledgement is kept"
        );
    }

    #[test]
    fn a_fetch_is_due_at_once_then_a_retry_interval_after_a_failure_or_a_refusal_until_installed() {
        let ticket = SnapshotTicket { source: 3 }.encode();
        let mut receipt = SnapshotReceipt::new(ready_with_snapshot(ticket), 1);
        assert_eq!((receipt.index(), receipt.source()), (10, 3));
        let now = Instant::now();
        assert_eq!(
            receipt.fetch_due(now),
            Some((3, 10)),
            "the ticket's member first"
        );
        assert_eq!(receipt.fetch_due(now), None, "one fetch at a time");
        assert!(!receipt.is_installed());

        // Node 3 failed and no leader is known: node 2 asks node 1, after the retry interval.
        receipt.fetch_failed(2, 0, now, false);
        assert_eq!(receipt.source(), 1);
        assert_eq!(receipt.fetch_due(now), None);
        assert_eq!(
            receipt.fetch_due(now + SNAPSHOT_REFUSED_RETRY_INTERVAL),
            None,
            "a failure waits longer than a refusal"
        );
        let later = now + SNAPSHOT_RETRY_INTERVAL;
        assert_eq!(receipt.fetch_due(later), Some((1, 10)));

        // Node 1 refused it for now: node 3 is asked again, after the short interval.
        receipt.fetch_failed(2, 0, later, true);
        assert_eq!(receipt.source(), 3);
        assert_eq!(receipt.fetch_due(later), None);
        let soon = later + SNAPSHOT_REFUSED_RETRY_INTERVAL;
        assert_eq!(receipt.fetch_due(soon), Some((3, 10)));

        receipt.installed();
        assert!(receipt.is_installed());
        assert_eq!(receipt.fetch_due(soon), None);
        let ready = receipt.into_ready();
        assert_eq!(ready.snapshot().get_metadata().index, 10);
    }

    #[test]
    fn a_snapshot_without_a_readable_ticket_is_fetched_from_the_leader() {
        let receipt = SnapshotReceipt::new(ready_with_snapshot(b"not a ticket".to_vec()), 1);
        assert_eq!(receipt.source(), 1);
    }

    #[test]
    fn a_failed_snapshot_fetch_turns_to_the_leader_then_to_each_other_member_in_turn() {
        let mut conf_state = ConfState::default();
        conf_state.set_voters(vec![3, 1, 2]);
        conf_state.set_learners(vec![4]);
        let members = members_of(&conf_state);
        assert_eq!(members, vec![1, 2, 3, 4]);
        // This is node 3; the ticket named node 1.
        assert_eq!(next_snapshot_source(&members, 3, 1, 2), 2); // a new leader
        assert_eq!(next_snapshot_source(&members, 3, 1, 1), 2); // the leader failed
        assert_eq!(next_snapshot_source(&members, 3, 1, 0), 2); // no leader known
        assert_eq!(next_snapshot_source(&members, 3, 2, 0), 4); // itself skipped
        assert_eq!(next_snapshot_source(&members, 3, 4, 0), 1); // round again
        assert_eq!(next_snapshot_source(&members, 3, 4, 3), 1); // itself as leader: no
        // Nobody else to ask: the same member again.
        assert_eq!(next_snapshot_source(&[1, 3], 3, 1, 0), 1);
    }
}
