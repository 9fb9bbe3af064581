//! Whether a group sleeps, and the heartbeat with which its leader puts it to sleep.
//!
//! A leader whose log has stayed still on every member for enough ticks sends each member a
//! heartbeat whose context says "sleep", and stops ticking the group; a follower that steps
//! such a heartbeat from its leader while holding the whole log sleeps then, if nothing waits
//! on the group on this node. What counts as still, and what wakes a group, is the replica's
//! to decide (`raft_node/replica/mod.rs`); this file keeps the counters and the message.

use concord_storage::raft::prelude::{Message, MessageType};

use crate::NodeId;

/// The context of the heartbeat with which a leader tells a follower that the group sleeps.
const SLEEP_CONTEXT: &[u8] = b"concord:sleep";

/// `true` for a leader's "sleep" heartbeat.
pub(super) fn is_sleep_heartbeat(message: &Message) -> bool {
    message.get_msg_type() == MessageType::MsgHeartbeat && message.context.as_ref() == SLEEP_CONTEXT
}

/// The "sleep" heartbeat from leader `from` of `term` to `to`, carrying the commit index
/// `commit` (the leader's last index: the follower sleeps only if it holds that much).
pub(super) fn sleep_heartbeat(from: NodeId, to: NodeId, term: u64, commit: u64) -> Message {
    let mut heartbeat = Message::default();
    heartbeat.set_msg_type(MessageType::MsgHeartbeat);
    heartbeat.to = to;
    heartbeat.from = from;
    heartbeat.term = term;
    heartbeat.commit = commit;
    heartbeat.context = SLEEP_CONTEXT.to_vec().into();
    heartbeat
}

/// One group's sleep: whether it sleeps, whether its leader offered sleep, and while this
/// node leads, how long the log has stayed still.
#[derive(Debug, Default)]
pub(super) struct Sleep {
    /// The group sleeps: not ticked, no heartbeats.
    asleep: bool,
    /// The leader's "sleep" heartbeat was just stepped, with the whole log.
    offered: bool,
    /// Ticks the log has stayed still on every member, and the `(last index, commit index)`
    /// it stayed at.
    still_ticks: usize,
    still_at: (u64, u64),
}

impl Sleep {
    /// Whether the group sleeps.
    pub(super) fn is_asleep(&self) -> bool {
        self.asleep
    }

    /// The group sleeps from now.
    pub(super) fn fall_asleep(&mut self) {
        self.asleep = true;
    }

    /// The group is awake, and its log counts as still again only from the next tick.
    pub(super) fn wake(&mut self) {
        self.asleep = false;
        self.still_ticks = 0;
    }

    /// A tick of a leader: `still` says whether the log is still on every member, `at` where
    /// it stands. `true` once it has stayed still at the same place for `after_ticks` ticks
    /// (then the leader tells the members and sleeps); any move starts the count again.
    pub(super) fn still_for(&mut self, still: bool, at: (u64, u64), after_ticks: usize) -> bool {
        if !still || at != self.still_at {
            self.still_at = at;
            self.still_ticks = 0;
            return false;
        }
        self.still_ticks += 1;
        self.still_ticks >= after_ticks
    }

    /// Notes whether the message just stepped was the leader's sleep offer to a follower that
    /// holds the whole log.
    pub(super) fn set_offered(&mut self, offered: bool) {
        self.offered = offered;
    }

    /// Whether the message stepped last offered sleep; the offer is used up.
    pub(super) fn take_offer(&mut self) -> bool {
        std::mem::take(&mut self.offered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_sleeps_after_its_log_stayed_still_at_one_place_for_the_ticks_asked() {
        let mut sleep = Sleep::default();
        // The first still tick at a new place only marks the place.
        assert!(!sleep.still_for(true, (5, 5), 3));
        assert!(!sleep.still_for(true, (5, 5), 3));
        assert!(!sleep.still_for(true, (5, 5), 3));
        assert!(sleep.still_for(true, (5, 5), 3));
        // A move (a new entry, a new commit index) starts the count again, as does a tick
        // that is not still, and a wake.
        assert!(!sleep.still_for(true, (6, 5), 3));
        for _ in 0..2 {
            assert!(!sleep.still_for(true, (6, 5), 3));
        }
        assert!(!sleep.still_for(false, (6, 5), 3));
        assert!(!sleep.still_for(true, (6, 5), 3));
        assert!(!sleep.still_for(true, (6, 5), 3));
        sleep.wake();
        assert!(!sleep.still_for(true, (6, 5), 3));
        assert!(!sleep.still_for(true, (6, 5), 3));
        assert!(sleep.still_for(true, (6, 5), 3));
    }

    #[test]
    fn an_offer_is_taken_once_and_only_the_sleep_heartbeat_is_one() {
        let mut sleep = Sleep::default();
        assert!(!sleep.take_offer());
        sleep.set_offered(true);
        assert!(sleep.take_offer());
        assert!(!sleep.take_offer());

        let heartbeat = sleep_heartbeat(1, 2, 7, 42);
        assert!(is_sleep_heartbeat(&heartbeat));
        assert_eq!((heartbeat.from, heartbeat.to), (1, 2));
        assert_eq!((heartbeat.term, heartbeat.commit), (7, 42));
        let mut plain = heartbeat.clone();
        plain.context = Default::default();
        assert!(!is_sleep_heartbeat(&plain));
        let mut append = heartbeat;
        append.set_msg_type(MessageType::MsgAppend);
        assert!(!is_sleep_heartbeat(&append));
    }
}
