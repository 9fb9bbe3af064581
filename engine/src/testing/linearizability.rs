//! A linearizability checker for histories of session operations, in the manner of Wing and
//! Gong (and porcupine): a depth-first search for an order of the operations that respects
//! real time (an operation that returned before another was called comes first) and in which
//! every operation's outcome is the one a single register of sessions would give, with the
//! states already tried from the same set of placed operations remembered. Keys are checked
//! one by one: linearizability is local, so a history is linearizable if each key's is.

use std::collections::{BTreeMap, HashSet};

/// A session as the checker models it: its version and the `connection_id` last written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Value {
    /// The session's version.
    pub version: u64,
    /// Its `connection_id`.
    pub connection: u64,
}

/// One key's register: absent, or a session.
pub type State = Option<Value>;

/// What a client asked.
#[derive(Clone, Debug)]
pub enum Op {
    /// Create if absent.
    Create {
        /// The `connection_id` written.
        connection: u64,
    },
    /// Change `connection_id`, if present (and at `if_match`, when given).
    Update {
        /// The version expected.
        if_match: Option<u64>,
        /// The `connection_id` written.
        connection: u64,
    },
    /// Delete, if present (and at `if_match`, when given).
    Delete {
        /// The version expected.
        if_match: Option<u64>,
    },
    /// Read (a linearizable or lease read).
    Get,
}

/// What the client was told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done: the session after the operation (none after a delete).
    Done(State),
    /// No such session.
    NotFound,
    /// The session exists already.
    Exists,
    /// `If-Match` named another version.
    Mismatch,
    /// No answer (a timeout, the node stopped): it may have taken effect, or not.
    Unknown,
}

/// One operation of one client: when it was called and when it returned (`None`: never, as
/// far as the client knows), in nanoseconds from the start of the run.
#[derive(Clone, Debug)]
pub struct Event {
    /// Which client (for reading a failing history).
    pub client: usize,
    /// The session's client id.
    pub key: String,
    /// What was asked.
    pub op: Op,
    /// When it was called.
    pub call_ns: u64,
    /// When it returned; `None` if it never did, as far as the client knows.
    pub return_ns: Option<u64>,
    /// What the client was told.
    pub outcome: Outcome,
}

/// The register's answer to `op` in `state`, and the state after it.
pub fn step(state: State, op: &Op) -> (State, Outcome) {
    match (op, state) {
        (Op::Create { connection }, None) => {
            let created = Some(Value {
                version: 1,
                connection: *connection,
            });
            (created, Outcome::Done(created))
        }
        (Op::Create { .. }, Some(_)) => (state, Outcome::Exists),
        (Op::Update { .. } | Op::Delete { .. } | Op::Get, None) => (state, Outcome::NotFound),
        (Op::Update { if_match, .. } | Op::Delete { if_match }, Some(value))
            if if_match.is_some_and(|expected| expected != value.version) =>
        {
            (state, Outcome::Mismatch)
        }
        (Op::Update { connection, .. }, Some(value)) => {
            let updated = Some(Value {
                version: value.version + 1,
                connection: *connection,
            });
            (updated, Outcome::Done(updated))
        }
        (Op::Delete { .. }, Some(_)) => (None, Outcome::Done(None)),
        (Op::Get, Some(_)) => (state, Outcome::Done(state)),
    }
}

/// Checks every key's history; the error names the first key that has no linearization, with
/// its history.
pub fn check(events: &[Event]) -> Result<(), String> {
    let mut by_key: BTreeMap<&str, Vec<&Event>> = BTreeMap::new();
    for event in events {
        by_key.entry(&event.key).or_default().push(event);
    }
    for (key, history) in by_key {
        if !linearizable(&history) {
            let mut history = history;
            history.sort_by_key(|e| e.call_ns);
            let lines: Vec<String> = history
                .iter()
                .map(|e| {
                    format!(
                        "  client {} [{} .. {}] {:?} -> {:?}",
                        e.client,
                        e.call_ns,
                        e.return_ns.map_or("?".to_string(), |r| r.to_string()),
                        e.op,
                        e.outcome
                    )
                })
                .collect();
            return Err(format!(
                "key {key:?}: no linearization of its {} operations:\n{}",
                history.len(),
                lines.join("\n")
            ));
        }
    }
    Ok(())
}

/// Whether one key's history (starting from an absent session) has a linearization.
pub fn linearizable(history: &[&Event]) -> bool {
    let mut events: Vec<&Event> = history.to_vec();
    events.sort_by_key(|e| e.call_ns);
    let returns: Vec<u64> = events
        .iter()
        .map(|e| e.return_ns.unwrap_or(u64::MAX))
        .collect();
    let known = events
        .iter()
        .filter(|e| e.outcome != Outcome::Unknown)
        .count();
    let mut search = Search {
        events: &events,
        returns: &returns,
        placed: vec![0u64; events.len().div_ceil(64)],
        known_left: known,
        tried: HashSet::new(),
    };
    search.run()
}

struct Search<'h> {
    events: &'h [&'h Event],
    returns: &'h [u64],
    /// The operations placed so far, one bit each.
    placed: Vec<u64>,
    /// Operations with a known outcome not placed yet: the search succeeds at zero (those
    /// without an answer can always go last, where they change nothing anyone saw).
    known_left: usize,
    /// (placed, state) pairs from which no linearization exists.
    tried: HashSet<(Vec<u64>, State)>,
}

/// One level of the search: the state after the operations placed so far, and the next
/// operation to try placing there.
struct Level {
    state: State,
    /// The next operation to try, by position in call order.
    next: usize,
    /// The earliest return among the unplaced operations: one called after it cannot go
    /// next.
    first_return: u64,
    /// The operation placed to reach this level (none at the first).
    placed_to_reach: Option<usize>,
}

impl Search<'_> {
    fn is_placed(&self, i: usize) -> bool {
        self.placed[i / 64] & (1 << (i % 64)) != 0
    }

    fn flip(&mut self, i: usize) {
        self.placed[i / 64] ^= 1 << (i % 64);
    }

    fn is_known(&self, i: usize) -> bool {
        self.events[i].outcome != Outcome::Unknown
    }

    fn first_unplaced_return(&self) -> u64 {
        (0..self.events.len())
            .filter(|&i| !self.is_placed(i))
            .map(|i| self.returns[i])
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Places `i` (or takes it back).
    fn place(&mut self, i: usize, placed: bool) {
        self.flip(i);
        if self.is_known(i) {
            if placed {
                self.known_left -= 1;
            } else {
                self.known_left += 1;
            }
        }
    }

    /// Wing and Gong's search, depth first, with the levels on a stack of its own rather than
    /// the thread's (a history places one level per operation, and may be long).
    fn run(&mut self) -> bool {
        if self.known_left == 0 {
            return true;
        }
        let mut levels = vec![Level {
            state: None,
            next: 0,
            first_return: self.first_unplaced_return(),
            placed_to_reach: None,
        }];
        while let Some(level) = levels.last_mut() {
            let (state, first_return) = (level.state, level.first_return);
            let mut chosen = None;
            while level.next < self.events.len() {
                let i = level.next;
                level.next += 1;
                let event = self.events[i];
                if event.call_ns > first_return {
                    level.next = self.events.len();
                    break;
                }
                if self.is_placed(i) {
                    continue;
                }
                let (next_state, outcome) = step(state, &event.op);
                if event.outcome != Outcome::Unknown && event.outcome != outcome {
                    continue;
                }
                self.place(i, true);
                if self.tried.contains(&(self.placed.clone(), next_state)) {
                    self.place(i, false);
                    continue;
                }
                chosen = Some((i, next_state));
                break;
            }
            match chosen {
                Some((i, next_state)) => {
                    if self.known_left == 0 {
                        return true;
                    }
                    let first_return = self.first_unplaced_return();
                    levels.push(Level {
                        state: next_state,
                        next: 0,
                        first_return,
                        placed_to_reach: Some(i),
                    });
                }
                // Nothing placed here leads anywhere: this level is a dead end.
                None => {
                    let level = levels.pop().expect("the level just looked at");
                    if let Some(i) = level.placed_to_reach {
                        self.tried.insert((self.placed.clone(), level.state));
                        self.place(i, false);
                    }
                }
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(client: usize, op: Op, call_ns: u64, return_ns: u64, outcome: Outcome) -> Event {
        Event {
            client,
            key: "k".into(),
            op,
            call_ns,
            return_ns: Some(return_ns),
            outcome,
        }
    }

    fn value(version: u64, connection: u64) -> State {
        Some(Value {
            version,
            connection,
        })
    }

    /// Client 0 created the session with connection 1 between 0 and 10 ns.
    fn created() -> Event {
        event(
            0,
            Op::Create { connection: 1 },
            0,
            10,
            Outcome::Done(value(1, 1)),
        )
    }

    #[test]
    fn concurrent_operations_may_take_effect_in_either_order() {
        // A read overlapping an update may see the value before it or after it.
        let history = [
            created(),
            event(
                1,
                Op::Update {
                    if_match: None,
                    connection: 2,
                },
                20,
                40,
                Outcome::Done(value(2, 2)),
            ),
            event(2, Op::Get, 25, 30, Outcome::Done(value(1, 1))),
            event(3, Op::Get, 26, 35, Outcome::Done(value(2, 2))),
        ];
        assert!(check(&history).is_ok());
    }

    #[test]
    fn a_stale_read_after_a_write_returned_is_a_violation() {
        let history = [
            created(),
            event(
                1,
                Op::Update {
                    if_match: Some(1),
                    connection: 2,
                },
                20,
                30,
                Outcome::Done(value(2, 2)),
            ),
            event(2, Op::Get, 40, 50, Outcome::Done(value(1, 1))),
        ];
        let error = check(&history).unwrap_err();
        assert!(error.contains("no linearization"), "{error}");
    }

    #[test]
    fn an_unanswered_write_may_or_may_not_have_happened() {
        let unanswered = Event {
            return_ns: None,
            outcome: Outcome::Unknown,
            ..event(1, Op::Delete { if_match: None }, 20, 0, Outcome::Unknown)
        };
        let seen_gone = [
            created(),
            unanswered.clone(),
            event(2, Op::Get, 40, 50, Outcome::NotFound),
        ];
        assert!(check(&seen_gone).is_ok());
        let seen_there = [
            created(),
            unanswered,
            event(2, Op::Get, 40, 50, Outcome::Done(value(1, 1))),
        ];
        assert!(check(&seen_there).is_ok());
    }

    #[test]
    fn two_creates_of_one_key_cannot_both_succeed() {
        let history = [
            created(),
            event(
                1,
                Op::Create { connection: 2 },
                5,
                15,
                Outcome::Done(value(1, 2)),
            ),
        ];
        assert!(check(&history).is_err());
    }

    #[test]
    fn a_history_longer_than_a_test_threads_stack_allows_is_checked() {
        // The search goes one level deeper per operation placed: a long history of one key,
        // each read after the last returned, goes 20,001 levels deep, which would overflow a
        // test thread's stack (2 MiB) if the levels were calls.
        let mut history = vec![created()];
        for i in 0..20_000 {
            let call_ns = 20 + i * 10;
            history.push(event(
                1,
                Op::Get,
                call_ns,
                call_ns + 5,
                Outcome::Done(value(1, 1)),
            ));
        }
        assert!(check(&history).is_ok());
    }
}
