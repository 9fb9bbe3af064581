//! How a member that lost a group's data (wiped, or its log lost) finds its way back safely.
//!
//! Such a member forgot three things: the entries it acknowledged (a committed entry may now
//! be on fewer members than a quorum), the votes it gave, and its term. Until it knows them
//! again it must neither vote nor acknowledge: a leader of an old term that never heard of the
//! newer ones (cut off, or asleep) would otherwise take its acknowledgements for a quorum, or
//! win its vote, and overwrite committed entries.
//!
//! So it first asks the other members for their term, the end of their log and their
//! configuration ([`Probing`]), and steps no raft message until, for every configuration that
//! the answers with the highest term report, so many other voters have answered that every
//! majority of it holds one of them (of two or three voters every other one, of four two, of
//! five three). They meet every majority the lost member took part in: the highest term among
//! the answers is at least every term in which this member's vote or acknowledgement counted,
//! and the most up-to-date of their logs (raft's order: last term, then length) holds every
//! entry committed with its help. It then takes that
//! term (a leader of an older one is answered with it, and steps down) and follows
//! ([`CatchUp::Following`]), voting again only once it has applied through the end of that
//! most up-to-date log, or through an entry its current leader, elected in a later term,
//! committed in its own term.
//!
//! The questions and answers are raft messages the replica recognises by their context
//! before raft-rs sees them.

use std::collections::BTreeMap;
use std::time::Duration;

use concord_storage::raft::prelude::{ConfState, Message, MessageType};

use crate::NodeId;

/// The context of a question about a member's term, log end and configuration.
const PROBE_CONTEXT: &[u8] = b"concord:log-probe";
/// The context prefix of an answer to it; the answer's fields follow.
const ANSWER_CONTEXT: &[u8] = b"concord:log-probe-answer";
/// The most voters an answer may list per configuration half: more is a malformed answer.
const MAX_ANSWER_VOTERS: usize = 1024;
/// Election timeouts a member asks without enough answers before the members that never
/// answered are named to the operator (answers normally come within a round trip)...
const PATIENCE_ELECTION_TIMEOUTS: usize = 3;
/// ...and no less than this: after a member's restart its peers connect to it again within
/// a second or so, and short ticks would name them while they do.
const PATIENCE_MIN: Duration = Duration::from_secs(5);

/// Ticks of `tick_interval` a member asks without enough answers before the members that never
/// answered are named: `PATIENCE_ELECTION_TIMEOUTS` election timeouts of `election_ticks`, and
/// at least `PATIENCE_MIN`.
pub(super) fn patience_ticks(election_ticks: usize, tick_interval: Duration) -> usize {
    let timeouts = PATIENCE_ELECTION_TIMEOUTS * election_ticks.max(1);
    let minimum = PATIENCE_MIN
        .as_nanos()
        .checked_div(tick_interval.as_nanos())
        .map_or(0, |ticks| usize::try_from(ticks).unwrap_or(usize::MAX));
    timeouts.max(minimum)
}

/// Where a member that lost a group's data stands on its way back.
#[derive(Debug)]
pub(super) enum CatchUp {
    /// Asking the other members; no raft message is stepped.
    Probing(Probing),
    /// Following leaders of `min_term` or later; votes again once caught up (see
    /// [`CatchUp::caught_up`]).
    Following { min_term: u64, target_index: u64 },
}

impl CatchUp {
    /// Whether a member at `at` has caught up.
    pub(super) fn caught_up(&self, at: &Standing) -> bool {
        match *self {
            CatchUp::Probing(_) => false,
            CatchUp::Following {
                min_term,
                target_index,
            } => {
                // Its own raft log, not only its state, must reach the target with a real
                // last entry: raft-rs grants votes by the log, and a log restarted after a
                // kept state holds term 0 at the restart point, which any candidate's beats.
                let holds_the_target =
                    at.applied >= target_index && at.committed >= target_index && at.last_term > 0;
                // A leader elected after every term the answers knew holds every committed
                // entry (no vote of this member helped elect it); an entry of its own term it
                // committed comes after them all.
                let past_a_newer_leaders_commit =
                    at.has_leader && at.term > min_term && at.applied_term == Some(at.term);
                holds_the_target || past_a_newer_leaders_commit
            }
        }
    }
}

/// Where a member catching up stands.
#[derive(Clone, Copy, Debug)]
pub(super) struct Standing {
    /// What its state has applied, and the term of that entry if its log holds it.
    pub(super) applied: u64,
    pub(super) applied_term: Option<u64>,
    /// Its raft log's commit index and last entry's term.
    pub(super) committed: u64,
    pub(super) last_term: u64,
    /// Its term, and whether it knows the term's leader.
    pub(super) term: u64,
    pub(super) has_leader: bool,
}

/// What one member answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ProbeAnswer {
    pub(super) term: u64,
    pub(super) last_term: u64,
    pub(super) last_index: u64,
    pub(super) voters: Vec<NodeId>,
    pub(super) voters_outgoing: Vec<NodeId>,
}

/// The answers gathered so far.
#[derive(Debug, Default)]
pub(super) struct Probing {
    answers: BTreeMap<NodeId, ProbeAnswer>,
}

impl Probing {
    /// Records `from`'s answer (the latest one counts).
    pub(super) fn record(&mut self, from: NodeId, answer: ProbeAnswer) {
        self.answers.insert(from, answer);
    }

    /// The members to ask (again): `known`, and every voter an answer named, but `me` and
    /// those that answered.
    pub(super) fn to_ask(&self, me: NodeId, known: &[NodeId]) -> Vec<NodeId> {
        let mut peers: Vec<NodeId> = known
            .iter()
            .chain(
                self.answers
                    .values()
                    .flat_map(|a| a.voters.iter().chain(&a.voters_outgoing)),
            )
            .copied()
            .filter(|&peer| peer != me && !self.answers.contains_key(&peer))
            .collect();
        peers.sort_unstable();
        peers.dedup();
        peers
    }

    /// `Some((min_term, target_index))` once enough members answered: for every configuration
    /// half reported by an answer of the highest term, so many of its voters answered that
    /// every majority of it holds one of them (`me` never counts: of a half of `n` voters,
    /// `n - (n / 2 + 1) + 1`). The target is the end of the most up-to-date log.
    pub(super) fn verdict(&self, me: NodeId) -> Option<(u64, u64)> {
        let max_term = self.answers.values().map(|a| a.term).max()?;
        let mut halves = self
            .answers
            .values()
            .filter(|a| a.term == max_term)
            .flat_map(|a| [&a.voters, &a.voters_outgoing])
            .filter(|half| !half.is_empty())
            .peekable();
        // Only members that know no configuration answered: nothing says who must.
        halves.peek()?;
        let mut enough = true;
        for half in halves {
            let answered = half
                .iter()
                .filter(|&&voter| voter != me && self.answers.contains_key(&voter))
                .count();
            let others = half.iter().filter(|&&voter| voter != me).count();
            // A majority holds `n / 2 + 1` of the half's `n` voters, so it leaves out at most
            // `n - (n / 2 + 1)` of them: one more answers meets it.
            let meets_every_majority = half.len() - (half.len() / 2 + 1) + 1;
            if others > 0 && answered < meets_every_majority {
                enough = false;
            }
        }
        let most_up_to_date = self
            .answers
            .values()
            .map(|a| (a.last_term, a.last_index))
            .max()?;
        enough.then_some((max_term, most_up_to_date.1))
    }
}

/// The question `from` asks `to` about a group.
pub(super) fn probe(from: NodeId, to: NodeId) -> Message {
    let mut message = Message::default();
    // A request for a pre-vote of term 0 with an empty log: a node that does not know the
    // question (an older version) answers it with a refusal, which the asker ignores.
    message.set_msg_type(MessageType::MsgRequestPreVote);
    message.from = from;
    message.to = to;
    message.term = 0;
    message.context = PROBE_CONTEXT.to_vec().into();
    message
}

/// `true` for the question.
pub(super) fn is_probe(message: &Message) -> bool {
    message.get_msg_type() == MessageType::MsgRequestPreVote
        && message.context.as_ref() == PROBE_CONTEXT
}

/// The answer of `from` to `to`: its `term`, its log's last entry (`last_term`, `last_index`)
/// and its members `conf`.
pub(super) fn answer(
    from: NodeId,
    to: NodeId,
    term: u64,
    (last_term, last_index): (u64, u64),
    conf: &ConfState,
) -> Message {
    let mut context = ANSWER_CONTEXT.to_vec();
    for field in [term, last_term, last_index] {
        context.extend_from_slice(&field.to_le_bytes());
    }
    for half in [&conf.voters, &conf.voters_outgoing] {
        let count = half.len().min(MAX_ANSWER_VOTERS);
        context.extend_from_slice(&(count as u32).to_le_bytes());
        for voter in &half[..count] {
            context.extend_from_slice(&voter.to_le_bytes());
        }
    }
    let mut message = Message::default();
    message.set_msg_type(MessageType::MsgRequestPreVoteResponse);
    message.from = from;
    message.to = to;
    // Term 0: raft-rs, were it ever to see it, takes it for a local message of no term.
    message.term = 0;
    message.reject = true;
    message.context = context.into();
    message
}

/// `None` if `message` is no answer; the answer, or why it is malformed, if it is one.
pub(super) fn parse_answer(message: &Message) -> Option<Result<ProbeAnswer, String>> {
    if message.get_msg_type() != MessageType::MsgRequestPreVoteResponse {
        return None;
    }
    let body = message.context.as_ref().strip_prefix(ANSWER_CONTEXT)?;
    Some(decode_answer(body))
}

fn decode_answer(mut body: &[u8]) -> Result<ProbeAnswer, String> {
    let term = take_u64(&mut body)?;
    let last_term = take_u64(&mut body)?;
    let last_index = take_u64(&mut body)?;
    let voters = take_voters(&mut body)?;
    let voters_outgoing = take_voters(&mut body)?;
    if !body.is_empty() {
        return Err(format!("{} bytes after the answer", body.len()));
    }
    Ok(ProbeAnswer {
        term,
        last_term,
        last_index,
        voters,
        voters_outgoing,
    })
}

fn take_u64(body: &mut &[u8]) -> Result<u64, String> {
    let Some((bytes, rest)) = body.split_first_chunk::<8>() else {
        return Err("the answer ends early".into());
    };
    *body = rest;
    Ok(u64::from_le_bytes(*bytes))
}

fn take_voters(body: &mut &[u8]) -> Result<Vec<NodeId>, String> {
    let Some((bytes, rest)) = body.split_first_chunk::<4>() else {
        return Err("the answer ends early".into());
    };
    *body = rest;
    let count = u32::from_le_bytes(*bytes) as usize;
    if count > MAX_ANSWER_VOTERS {
        return Err(format!(
            "the answer lists {count} voters, more than {MAX_ANSWER_VOTERS}"
        ));
    }
    (0..count).map(|_| take_u64(body)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer of a member in `term` whose last entry, at `last_index`, is of that term too.
    fn answered(term: u64, last_index: u64, voters: &[NodeId]) -> ProbeAnswer {
        ProbeAnswer {
            term,
            last_term: term,
            last_index,
            voters: voters.to_vec(),
            voters_outgoing: Vec::new(),
        }
    }

    #[test]
    fn an_answer_survives_its_trip_and_a_damaged_one_is_refused() {
        let mut conf = ConfState::from((vec![1, 2, 3], Vec::new()));
        conf.voters_outgoing = vec![1, 2, 4];
        let message = answer(2, 5, 27, (26, 168), &conf);
        assert!(!is_probe(&message));
        let parsed = parse_answer(&message).unwrap().unwrap();
        assert_eq!(
            parsed,
            ProbeAnswer {
                term: 27,
                last_term: 26,
                last_index: 168,
                voters: vec![1, 2, 3],
                voters_outgoing: vec![1, 2, 4],
            }
        );
        assert!(is_probe(&probe(5, 2)));
        assert!(parse_answer(&probe(5, 2)).is_none());

        let mut short = message.clone();
        short.context = short.context[..short.context.len() - 3].to_vec().into();
        assert!(parse_answer(&short).unwrap().is_err());
        let mut long = message.clone();
        let mut context = long.context.to_vec();
        context.push(0);
        long.context = context.into();
        assert!(parse_answer(&long).unwrap().is_err());
        let mut huge = ANSWER_CONTEXT.to_vec();
        huge.extend_from_slice(&[0; 24]);
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        let mut message = message;
        message.context = huge.into();
        assert!(parse_answer(&message).unwrap().is_err());
    }

    /// An answer comes from a peer: whatever bytes follow its prefix are refused or decoded,
    /// never a panic or an allocation their counts ask for.
    #[test]
    fn hostile_answers_are_refused_never_a_panic() {
        let mut conf = ConfState::from((vec![1, 2, 3], Vec::new()));
        conf.voters_outgoing = vec![1, 2, 4];
        let joint = answer(2, 5, 27, (26, 168), &conf);
        let plain = answer(3, 5, 9, (9, 4), &ConfState::from((vec![3, 5], Vec::new())));
        let valid: Vec<Vec<u8>> = [joint, plain]
            .iter()
            .map(|message| message.context[ANSWER_CONTEXT.len()..].to_vec())
            .collect();
        for input in concord_storage::testing::hostile_inputs(&valid, 11, 3_000) {
            let mut message = answer(2, 5, 0, (0, 0), &ConfState::default());
            let mut context = ANSWER_CONTEXT.to_vec();
            context.extend_from_slice(&input);
            message.context = context.into();
            if let Some(Ok(decoded)) = parse_answer(&message) {
                assert!(decoded.voters.len() <= MAX_ANSWER_VOTERS, "{input:?}");
                assert!(
                    decoded.voters_outgoing.len() <= MAX_ANSWER_VOTERS,
                    "{input:?}"
                );
            }
        }
    }

    /// Node 5 of {3, 5, 6} lost its data. Node 3, a stale leader of term 26, answers first:
    /// not enough, node 6 (term 27, with the longer log) must answer too.
    #[test]
    fn every_other_member_of_three_must_answer_and_the_highest_term_and_most_up_to_date_log_win() {
        let mut probing = Probing::default();
        assert_eq!(probing.verdict(5), None);
        assert_eq!(probing.to_ask(5, &[3, 6]), vec![3, 6]);
        probing.record(3, answered(26, 167, &[3, 5, 6]));
        assert_eq!(probing.verdict(5), None);
        assert_eq!(probing.to_ask(5, &[3, 6]), vec![6]);
        probing.record(6, answered(27, 168, &[3, 5, 6]));
        assert_eq!(probing.verdict(5), Some((27, 168)));
    }

    /// Of five voters, three of the four others suffice; a voter only an answer names is
    /// asked too, and an answer of an older term does not hold the verdict back with its
    /// older configuration.
    #[test]
    fn a_majority_of_the_newest_configuration_suffices() {
        let mut probing = Probing::default();
        probing.record(1, answered(9, 40, &[1, 2, 3, 4, 5]));
        probing.record(2, answered(9, 41, &[1, 2, 3, 4, 5]));
        assert_eq!(probing.verdict(5), None);
        probing.record(3, answered(9, 39, &[1, 2, 3, 4, 5]));
        assert_eq!(probing.verdict(5), Some((9, 41)));

        let mut probing = Probing::default();
        probing.record(2, answered(4, 10, &[1, 2, 7]));
        probing.record(3, answered(3, 12, &[1, 2, 3]));
        assert_eq!(probing.to_ask(1, &[2, 3]), vec![7]);
        assert_eq!(probing.verdict(1), None);
        probing.record(7, answered(4, 10, &[1, 2, 7]));
        // Node 3's longer log ends in an older term: node 2's, of term 4, holds every
        // committed entry, and node 3's tail past it may never be committed.
        assert_eq!(probing.verdict(1), Some((4, 10)));
    }

    /// Of two voters the other one suffices (every majority is both); of four, two of the three
    /// others (a majority of four is three: it holds one of any two).
    #[test]
    fn of_an_even_number_of_voters_half_of_them_suffice() {
        let mut probing = Probing::default();
        probing.record(1, answered(3, 30, &[1, 2]));
        assert_eq!(probing.verdict(2), Some((3, 30)));

        let mut probing = Probing::default();
        probing.record(1, answered(6, 50, &[1, 2, 3, 4]));
        assert_eq!(probing.verdict(4), None);
        probing.record(3, answered(6, 52, &[1, 2, 3, 4]));
        assert_eq!(probing.verdict(4), Some((6, 52)));
    }

    #[test]
    fn a_member_is_patient_three_election_timeouts_and_at_least_five_seconds() {
        assert_eq!(patience_ticks(10, Duration::from_millis(200)), 30);
        assert_eq!(patience_ticks(10, Duration::from_millis(100)), 50);
        assert_eq!(patience_ticks(10, Duration::from_millis(20)), 250);
        assert_eq!(patience_ticks(0, Duration::ZERO), 3);
    }

    /// In a joint configuration both halves need their majority of the others.
    #[test]
    fn both_halves_of_a_joint_configuration_need_a_majority() {
        let joint = ProbeAnswer {
            term: 5,
            last_term: 5,
            last_index: 20,
            voters: vec![1, 2, 3],
            voters_outgoing: vec![1, 4, 5],
        };
        let mut probing = Probing::default();
        probing.record(2, joint.clone());
        probing.record(3, joint.clone());
        assert_eq!(probing.verdict(1), None, "only the incoming half");
        probing.record(4, joint.clone());
        assert_eq!(
            probing.verdict(1),
            None,
            "one of the outgoing half's other two"
        );
        probing.record(5, joint);
        assert_eq!(probing.verdict(1), Some((5, 20)));
    }

    #[test]
    fn answers_that_know_no_configuration_decide_nothing() {
        let mut probing = Probing::default();
        probing.record(2, answered(0, 0, &[]));
        probing.record(3, answered(0, 0, &[]));
        assert_eq!(probing.verdict(1), None);
    }

    #[test]
    fn a_follower_votes_again_past_the_most_up_to_date_log_or_a_newer_leaders_commit() {
        let following = CatchUp::Following {
            min_term: 27,
            target_index: 168,
        };
        let at = |applied: u64, applied_term: u64, term: u64, has_leader: bool| Standing {
            applied,
            applied_term: Some(applied_term),
            committed: applied,
            last_term: applied_term,
            term,
            has_leader,
        };
        assert!(!following.caught_up(&at(167, 27, 27, true)));
        assert!(following.caught_up(&at(168, 27, 27, true)));
        // A leader of term 28 committed an entry of its term at 160: it holds 168's entry.
        assert!(following.caught_up(&at(160, 28, 28, true)));
        assert!(!following.caught_up(&at(160, 27, 28, true)));
        assert!(!following.caught_up(&at(160, 28, 28, false)));
        // A state kept past the target over a log restarted after it (term 0 there), and
        // nothing from a leader yet: not caught up.
        let restarted = Standing {
            applied: 200,
            applied_term: Some(0),
            committed: 200,
            last_term: 0,
            term: 27,
            has_leader: true,
        };
        assert!(!following.caught_up(&restarted));
        assert!(following.caught_up(&Standing {
            committed: 201,
            last_term: 27,
            ..restarted
        }));
        let probing = CatchUp::Probing(Probing::default());
        assert!(!probing.caught_up(&at(500, 30, 30, true)));
    }
}
