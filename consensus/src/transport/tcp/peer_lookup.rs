//! When a node may ask its peers where a node it does not know is (`receiving.rs` asks).
//!
//! An unknown node that dials is refused, and each refusal would start a lookup that connects
//! to every known peer. Two limits keep that cheap. One lookup runs at a time, at most one per
//! [`LOOKUP_INTERVAL`], whichever node dialled. And a node that a peer asked did not name —
//! a member removed but left running, which dials about once a second for as long as it runs,
//! or a newcomer dialling before it is added — is asked about again only after a wait that
//! doubles each time, up to [`NOT_NAMED_WAIT_MAX`]. A newcomer is still learned: once added,
//! the membership change names it to this node, and a later lookup finds it too. The waits
//! are kept for at most [`NOT_NAMED_KEPT`] nodes, so hellos with made-up ids cannot grow them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::NodeId;

/// How often at most a node asks its peers where an unknown node is.
const LOOKUP_INTERVAL: Duration = Duration::from_secs(1);

/// The wait before a node a peer did not name is asked about again, the first time.
const NOT_NAMED_WAIT_FIRST: Duration = Duration::from_secs(2);

/// The longest wait before a node a peer did not name is asked about again.
const NOT_NAMED_WAIT_MAX: Duration = Duration::from_secs(32);

/// How many nodes' waits are kept; past that, the wait that ends first is dropped.
const NOT_NAMED_KEPT: usize = 256;

/// What a lookup found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LookupOutcome {
    /// The node's address was learned, or a membership change added it meanwhile.
    Learned,
    /// A peer asked does not name the node: removed, or not yet added.
    NotNamed,
    /// Nothing settled: no peer answered, or the peers disagreed.
    Unsettled,
}

/// A node a peer did not name: when it may be asked about again, and the wait that led there.
struct NotNamed {
    ask_again_at: Instant,
    wait: Duration,
}

/// The lookups' limits (see the module documentation).
#[derive(Default)]
pub(super) struct PeerLookup {
    last_started: Option<Instant>,
    running: bool,
    not_named: BTreeMap<NodeId, NotNamed>,
}

impl PeerLookup {
    /// `true` if a lookup of `node` may start at `now`, and then it counts as running.
    pub(super) fn start(&mut self, node: NodeId, now: Instant) -> bool {
        let recent = (self.last_started).is_some_and(|at| now < at + LOOKUP_INTERVAL);
        let waiting = (self.not_named.get(&node)).is_some_and(|n| now < n.ask_again_at);
        if self.running || recent || waiting {
            return false;
        }
        self.last_started = Some(now);
        self.running = true;
        true
    }

    /// The running lookup of `node` ended at `now` with `outcome`.
    pub(super) fn finished(&mut self, node: NodeId, outcome: LookupOutcome, now: Instant) {
        self.running = false;
        match outcome {
            LookupOutcome::Learned => {
                self.not_named.remove(&node);
            }
            LookupOutcome::NotNamed => {
                let wait = match self.not_named.get(&node) {
                    Some(before) => (before.wait * 2).min(NOT_NAMED_WAIT_MAX),
                    None => NOT_NAMED_WAIT_FIRST,
                };
                if !self.not_named.contains_key(&node) && self.not_named.len() >= NOT_NAMED_KEPT {
                    self.drop_the_wait_that_ends_first();
                }
                let ask_again_at = now + wait;
                self.not_named.insert(node, NotNamed { ask_again_at, wait });
            }
            LookupOutcome::Unsettled => {}
        }
    }

    fn drop_the_wait_that_ends_first(&mut self) {
        let first = (self.not_named.iter())
            .min_by_key(|(_, n)| n.ask_again_at)
            .map(|(&node, _)| node);
        if let Some(node) = first {
            self.not_named.remove(&node);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The instants, from `start`, at which a node that is never named may be asked about,
    /// when it dials every 100 ms for `seconds`.
    fn lookups_of_a_node_never_named(seconds: u64) -> Vec<Duration> {
        let start = Instant::now();
        let mut lookup = PeerLookup::default();
        let mut started = Vec::new();
        let mut at = start;
        while at < start + Duration::from_secs(seconds) {
            if lookup.start(9, at) {
                started.push(at - start);
                lookup.finished(9, LookupOutcome::NotNamed, at);
            }
            at += Duration::from_millis(100);
        }
        started
    }

    #[test]
    fn a_node_no_peer_names_is_asked_about_ever_less_often() {
        let secs = |s: u64| Duration::from_secs(s);
        assert_eq!(
            lookups_of_a_node_never_named(130),
            [0, 2, 6, 14, 30, 62, 94, 126].map(secs),
            "the wait doubles from 2 s up to 32 s"
        );
    }

    #[test]
    fn one_lookup_at_a_time_and_one_a_second() {
        let start = Instant::now();
        let mut lookup = PeerLookup::default();
        assert!(lookup.start(9, start));
        assert!(!lookup.start(8, start + secs_f(1.5)), "one runs");
        lookup.finished(9, LookupOutcome::Unsettled, start + secs_f(1.6));
        assert!(lookup.start(8, start + secs_f(1.6)));
        lookup.finished(8, LookupOutcome::Unsettled, start + secs_f(1.7));
        assert!(
            !lookup.start(9, start + secs_f(2.5)),
            "within a second of the last"
        );
        assert!(
            lookup.start(9, start + secs_f(2.6)),
            "unsettled: no wait of its own"
        );
    }

    fn secs_f(seconds: f64) -> Duration {
        Duration::from_secs_f64(seconds)
    }

    #[test]
    fn a_node_learned_is_asked_about_at_once_when_unknown_again() {
        let start = Instant::now();
        let mut lookup = PeerLookup::default();
        assert!(lookup.start(9, start));
        lookup.finished(9, LookupOutcome::NotNamed, start);
        assert!(!lookup.start(9, start + secs_f(1.5)), "its wait runs");
        assert!(lookup.start(9, start + secs_f(2.0)));
        lookup.finished(9, LookupOutcome::Learned, start + secs_f(2.0));
        assert!(
            lookup.start(9, start + secs_f(3.0)),
            "learned: only the one-a-second limit"
        );
    }

    #[test]
    fn made_up_ids_keep_at_most_a_bounded_number_of_waits() {
        let start = Instant::now();
        let mut lookup = PeerLookup::default();
        for node in 0..(NOT_NAMED_KEPT as u64 * 4) {
            let at = start + LOOKUP_INTERVAL * node as u32;
            assert!(lookup.start(node, at));
            lookup.finished(node, LookupOutcome::NotNamed, at);
            assert!(lookup.not_named.len() <= NOT_NAMED_KEPT);
        }
        assert_eq!(lookup.not_named.len(), NOT_NAMED_KEPT);
        let newest = NOT_NAMED_KEPT as u64 * 4 - 1;
        assert!(lookup.not_named.contains_key(&newest), "the newest is kept");
        assert!(
            !lookup.not_named.contains_key(&0),
            "the one ending first went"
        );
    }
}
