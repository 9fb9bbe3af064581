//! A group replicated by raft-rs: the [`Replica`] over a `RawNode`, following raft-rs's
//! documented `Ready` order — messages first (a leader replicates while it persists), then
//! entries and hard state persisted, then the messages that waited for the persist.

mod catching_up;
mod leader_news;
mod restarted_leader;
mod snapshot_asks;

use std::sync::Arc;
use std::time::{Duration, Instant};

use concord_storage::raft::prelude::{
    ConfChangeV2, ConfState, Entry, EntryType, Message, MessageType,
};
use concord_storage::raft::{self, RawNode, Ready, StateRole};
use concord_storage::{GroupId, LogStore};
use protobuf::Message as _;

use super::catch_up::{self, CatchUp, Probing};
use super::commit_news::CommitNews;
use super::forwarded_requests::{member_change_of, refused_request};
use super::held_proposals::HeldProposals;
use super::held_transfer::{HeldTransfer, conf_change_unapplied};
use super::lease::{Lease, holds_vote_back_from};
use super::sleep::{Sleep, is_sleep_heartbeat, sleep_heartbeat};
use super::snapshot_receipt::{SnapshotReceipt, drop_rejections_the_snapshot_answers};
use super::storage::GroupStorage;
use super::term_runs::TermRuns;
use super::vote_hold::VoteHold;
use crate::mailbox::SnapshotFailure;
use crate::membership::{GroupMembers, MemberChange, MemberContext, refuse_change};
use crate::node_loop::LogReadFailure;
use crate::node_loop::event_lines::LeadershipChanges;
use crate::node_loop::forward_tag::ForwardTag;
use crate::node_loop::group::GroupState;
use crate::node_loop::replica::{
    ConfApplied, Outbox, Proposed, Replica, Round, StepOutcome, queue_messages,
};
use crate::transport::GroupMessage;
use crate::{NodeConfig, NodeId, ProposeError, StartError};

/// One raft group on this node.
pub(crate) struct RaftReplica {
    raw: RawNode<GroupStorage>,
    /// The commit index moved in `advance_append`: the hard state must be written again.
    commit_dirty: bool,
    /// The highest index every voter has persisted, as a leader of this group last said:
    /// a follower compacts no further (0 until a leader says).
    replicated_floor: u64,
    /// A snapshot this follower received and is installing (boxed: it holds a whole `Ready`,
    /// and almost every group, almost always, has none).
    installing: Option<Box<SnapshotReceipt>>,
    /// The highest index the state has applied: raft's applied index follows it as far as
    /// raft's commit and persist points allow (after a snapshot the state may be ahead).
    state_applied: u64,
    /// A voter this many entries behind the leader's last index no longer holds the log back
    /// from compaction: it is sent a snapshot.
    snapshot_lag_entries: u64,
    /// The index of the last snapshot ticket this node sent each follower while leading: the
    /// follower will hold the log up to there once it has installed the state, and needs the
    /// entries after it (see `leader_floor`).
    tickets_sent: Vec<(NodeId, u64)>,
    /// Set while this node, started without data for the group in a cluster that has some,
    /// catches up: it asks the other members where the group stands, then follows, and takes
    /// part in no election (grants no vote, starts none) until caught up (`catch_up.rs`).
    /// A node that lost its data has forgotten the entries it acknowledged, the votes it gave
    /// and its term; voting or acknowledging before it knows them again could let a leader
    /// missing committed entries overwrite them.
    catching_up: Option<CatchUp>,
    /// While catching up: the other members of the cluster as the node started, asked where
    /// the group stands and, once it follows, told every `election_ticks` ticks that this
    /// node waits (a message a sleeping leader wakes for; see `nudge_sleeping_leader`), and
    /// the ticks waited.
    catch_up_peers: Vec<NodeId>,
    catch_up_ticks: usize,
    /// Ticks of asking without enough answers after which the silent members are named
    /// (`catch_up::patience_ticks`).
    catch_up_patience_ticks: usize,
    election_ticks: usize,
    /// While this member, opened with a log it had before, refuses to vote for another
    /// candidate (`vote_hold.rs`).
    vote_hold: VoteHold,
    /// While this node leads: how long it may serve reads without a quorum round.
    lease: Lease,
    /// The term the lease's records belong to.
    lease_term: u64,
    /// The last term in which this node, leading, sent a `MsgTimeoutNow`: its lease is barred
    /// for the rest of that term. The receiver campaigns on it whenever it arrives (it may
    /// sit in a stalled connection or a paused process, or be held, `held_transfer.rs`),
    /// forced past its peers' quiet, even after this leader gave the hand-over up; only a new
    /// term makes it stale (raft-rs ignores it then).
    hand_over_sent_term: u64,
    /// Round-trip histograms per peer (`concord_peer_round_trip_seconds`).
    round_trips: std::collections::HashMap<NodeId, metrics::Histogram>,
    /// The log index of the last configuration change raft applied (a snapshot's index after
    /// one): a change at or below it, replayed from the log after a restart, is not applied
    /// again.
    conf_index: u64,
    /// Whether the group sleeps, was offered sleep, and how long its log stayed still.
    sleep: Sleep,
    /// A leadership handed to this node while a committed configuration change waited to be
    /// applied (see `held_transfer`), and how long it may wait: the election timeout.
    held_transfer: Option<HeldTransfer>,
    /// Proposals forwarded to this leader while it hands its leadership over, stepped once
    /// the hand-over ends (`held_proposals.rs`).
    held_proposals: HeldProposals,
    election_timeout: Duration,
    /// While this node leads: what each follower has been told of the commit index.
    commit_news: CommitNews,
    /// The term `commit_news` belongs to.
    commit_news_term: u64,
    /// How long a commit index may wait for an append to carry it (`NodeConfig`).
    commit_news_delay: Duration,
}

/// A `Ready` whose entries, hard state or snapshot are in the round's log write, collected
/// before the write and finished after it.
pub(crate) struct InFlight {
    ready: Ready,
    /// The terms of the entries it persists.
    persisting: TermRuns,
    /// `(index, term, configuration)` of the snapshot it records, if any.
    snapshot: Option<(u64, u64, ConfState)>,
}

impl RaftReplica {
    /// Opens `group` from `log`; the state store has applied through `applied`. A read of
    /// `log` that fails is recorded in `read_failure`.
    pub(crate) fn open(
        config: &NodeConfig,
        group: GroupId,
        log: Arc<dyn LogStore>,
        applied: u64,
        read_failure: LogReadFailure,
        logger: &slog::Logger,
    ) -> Result<Self, StartError> {
        let raft_config = raft::Config {
            id: config.node_id,
            election_tick: config.election_ticks,
            heartbeat_tick: config.heartbeat_ticks,
            applied,
            max_size_per_msg: config.max_size_per_msg_bytes,
            max_inflight_msgs: config.max_inflight_msgs,
            check_quorum: config.check_quorum,
            pre_vote: config.pre_vote,
            // A new commit index rides on the next append, or the node loop tells the
            // followers a moment later (`commit_news.rs`).
            skip_bcast_commit: true,
            ..Default::default()
        };
        let state = log.group_state(group)?;
        // A log with no term has recorded no vote: it is new, or it was lost (the state may
        // have been kept, and the log restarted after it). Joining a running cluster, such a
        // member may have voted and acknowledged before, and must not vote until caught up.
        let forgot_votes = state.hard_state.term == 0;
        let vote_hold = if forgot_votes {
            VoteHold::none(config.tick_interval)
        } else {
            VoteHold::after_restart(
                config.election_ticks,
                config.check_quorum,
                config.previous_vote_quiet,
                config.tick_interval,
            )
        };
        let catching_up = (config.catch_up_before_voting && forgot_votes)
            .then(|| CatchUp::Probing(Probing::default()));
        let conf_index = state.conf_state_index;
        let storage = GroupStorage::new(group, config.node_id, log, applied, read_failure)?;
        // raft-rs names only the node in its lines; on a node of many groups, the group tells
        // them apart.
        let logger = logger.new(slog::o!("group" => group));
        let raw = RawNode::new(&raft_config, storage, &logger)
            .map_err(|source| StartError::Raft { group, source })?;
        let election_timeout = config.tick_interval * config.election_ticks as u32;
        Ok(RaftReplica {
            raw,
            commit_dirty: false,
            replicated_floor: 0,
            installing: None,
            state_applied: applied,
            snapshot_lag_entries: config.snapshot_lag_entries,
            tickets_sent: Vec::new(),
            catching_up,
            catch_up_peers: config
                .voters
                .iter()
                .copied()
                .filter(|&peer| peer != config.node_id)
                .collect(),
            catch_up_ticks: 0,
            catch_up_patience_ticks: catch_up::patience_ticks(
                config.election_ticks,
                config.tick_interval,
            ),
            election_ticks: config.election_ticks,
            vote_hold,
            lease: Lease::new(config.vote_quiet()),
            lease_term: 0,
            hand_over_sent_term: 0,
            round_trips: std::collections::HashMap::new(),
            conf_index,
            sleep: Sleep::default(),
            held_transfer: None,
            held_proposals: HeldProposals::default(),
            election_timeout,
            commit_news: CommitNews::default(),
            commit_news_term: 0,
            commit_news_delay: config.commit_news_delay,
        })
    }

    /// `true` if this tick would start a campaign while the vote is held after a restart: a
    /// vote for itself is a vote too. raft-rs campaigns on the tick that reaches its
    /// randomized election timeout; held, the election clock stops one short of it and the
    /// campaign comes with the first tick after the hold. With the same ticks as before the
    /// restart the timeout is never shorter than the hold; with shorter ones it may be.
    fn campaign_held(&self) -> bool {
        let raft = &self.raw.raft;
        self.vote_hold.holds()
            && raft.state != StateRole::Leader
            && raft.promotable()
            && raft.election_elapsed + 1 >= raft.randomized_election_timeout()
    }

    /// Whether this node leads and hands its leadership over (raft-rs drops proposals then).
    fn hands_over(&self) -> bool {
        let raft = &self.raw.raft;
        raft.state == StateRole::Leader && raft.lead_transferee.is_some()
    }

    /// Steps the proposals held during a hand-over once it has ended (given up, or this node
    /// no longer leads: they are refused then, and their forwarders learn from the new term).
    fn step_held_proposals(&mut self) {
        if self.held_proposals.is_empty() || self.hands_over() {
            return;
        }
        for message in self.held_proposals.take() {
            match self.step(message) {
                StepOutcome::Stepped => {}
                StepOutcome::Rejected(reason) => {
                    tracing::debug!(%reason, "dropped a proposal held during a hand-over");
                    crate::metrics::dropped_message("rejected");
                }
                StepOutcome::Malformed(reason) => {
                    tracing::warn!(%reason, "dropped a proposal held during a hand-over");
                    crate::metrics::dropped_message("malformed");
                }
            }
        }
    }

    fn not_leader(&self, group: GroupId) -> ProposeError {
        let leader = self.raw.raft.leader_id;
        ProposeError::NotLeader {
            group,
            leader: (leader != 0).then_some(leader),
        }
    }

    /// Queues `messages` for their peers with the leader's replicated floor; the floor (a
    /// pass over the voters' progress) is worked out only when there is a message to carry it.
    fn queue_messages(&self, outbox: &mut Outbox, group: GroupId, messages: Vec<Message>) {
        if messages.is_empty() {
            return;
        }
        queue_messages(outbox, group, self.leader_floor(), messages);
    }

    /// Moves raft's applied index after the state's, as far as raft's commit and persist
    /// points allow.
    fn catch_up_applied(&mut self) {
        let log = &self.raw.raft.raft_log;
        let target = self.state_applied.min(log.committed).min(log.persisted);
        if target > log.applied {
            self.raw.advance_apply_to(target);
            self.release_held_transfer();
        }
    }

    /// Steps the leadership hand-over held for a configuration change, once the change is
    /// applied (or drops it, held too long).
    fn release_held_transfer(&mut self) {
        if self.held_transfer.is_none() || conf_change_unapplied(&self.raw.raft.raft_log) {
            return;
        }
        let held = self.held_transfer.take();
        let Some(message) = held.and_then(|h| h.release(self.raw.raft.id, Instant::now())) else {
            return;
        };
        // A message of an older term by now is ignored by raft-rs, as it would have been.
        self.wake();
        if let Err(error) = self.raw.step(message) {
            tracing::debug!(%error, "a held leadership hand-over was not taken");
        }
    }

    /// Sleeps, keeping no buffer a round would use.
    fn fall_asleep(&mut self) {
        self.sleep.fall_asleep();
        self.vote_hold.fell_asleep();
        self.raw.mut_store().release_written();
        // A member that led the group keeps, per follower it sent appends to, a ring of
        // `max_inflight_msgs` indexes; a sleeping group sends none, and raft-rs allocates
        // the ring again at the next append.
        self.raw.raft.maybe_free_inflight_buffers();
    }

    fn publish_leadership(&mut self, group: &mut GroupState, changes: &mut LeadershipChanges) {
        let raft = &self.raw.raft;
        let is_leader = raft.state == StateRole::Leader;
        let was_leader = (group.status.is_leader).load(std::sync::atomic::Ordering::Acquire);
        changes.note(was_leader, is_leader);
        match (was_leader, is_leader) {
            (false, true) => group.leading_since = Some(Instant::now()),
            (_, false) => group.leading_since = None,
            (true, true) => {}
        }
        group
            .status
            .set_leader(raft.leader_id, is_leader, raft.term);
        // A lease belongs to one leadership: a new one starts without.
        self.lease.reset();
    }

    /// `true` while the group has no configuration and no log: this node joined the cluster
    /// and awaits its first snapshot.
    fn uninitialized(&self) -> bool {
        let raft = &self.raw.raft;
        raft.raft_log.last_index() == 0
            && raft.prs().conf().voters().ids().iter().next().is_none()
            && raft.prs().conf().learners().is_empty()
    }

    /// On a leader: why `change` must not be made now, if it must not — a change already
    /// under way, a learner promoted before it caught up, or a change that would lose quorum
    /// (a member counts as up if it answered within the last election timeout).
    fn change_refused(&self, change: &MemberChange) -> Option<String> {
        let raft = &self.raw.raft;
        let members = GroupMembers::from_conf_state(&raft.prs().conf().to_conf_state());
        if members.is_joint() {
            return Some("another membership change is under way".into());
        }
        let now = Instant::now();
        if let MemberChange::Promote { node } = change {
            let last_index = raft.raft_log.last_index();
            // Caught up: it acknowledged a snapshot or log (not still waiting for its first)
            // and is within the lag that would earn it a snapshot.
            let caught_up = raft.prs().get(*node).is_some_and(|p| {
                self.heard_lately(*node, p, now)
                    && p.matched > 0
                    && p.matched + self.snapshot_lag_entries >= last_index
            });
            if members.learners.contains(node) && !caught_up {
                return Some(format!(
                    "learner {node} has not caught up with the leader's log yet"
                ));
            }
        }
        refuse_change(&members, change, |node| {
            node == raft.id
                || (raft.prs().get(node)).is_some_and(|p| self.heard_lately(node, p, now))
        })
    }

    /// This node's tag for `id`.
    fn tag(&self, id: u64) -> ForwardTag {
        ForwardTag {
            node: self.raw.raft.id,
            id,
            term: self.raw.raft.term,
        }
    }
}

impl Replica for RaftReplica {
    type Collected = InFlight;

    fn commit_news_due(&self) -> Option<Instant> {
        if !self.news_is_current() {
            return None;
        }
        let since = self.commit_news.owed_since()?;
        Some(since + self.commit_news_delay)
    }

    fn tell_commit(&mut self) {
        if self.raw.raft.state == StateRole::Leader {
            self.raw.raft.bcast_append();
            self.commit_news.told_all();
        }
    }

    fn step(&mut self, message: GroupMessage) -> StepOutcome {
        if self.hands_over()
            && message.message.get_msg_type() == MessageType::MsgPropose
            && message.message.from != self.raw.raft.id
        {
            return if self.held_proposals.hold(message) {
                StepOutcome::Stepped
            } else {
                StepOutcome::Rejected("too many proposals held during a hand-over".into())
            };
        }
        let GroupMessage {
            mut message,
            replicated_floor,
            ..
        } = message;
        let from = message.from;
        if let Some(outcome) = self.step_catch_up_question(&message) {
            return outcome;
        }
        let message_term = message.term;
        let sleep_message = is_sleep_heartbeat(&message);
        let sleep_commit = message.commit;
        // A sleeping group's clock matters only for noticing a lost leader: what the leader
        // itself sends does not wake a follower (were the leader to die, its node falls
        // silent), nor do heartbeat answers wake a leader. Anything else does.
        let raft = &self.raw.raft;
        let wakes = match raft.state {
            StateRole::Leader => message.get_msg_type() != MessageType::MsgHeartbeatResponse,
            _ => from != raft.leader_id || message_term != raft.term,
        };
        let before = (raft.state, raft.leader_id, raft.term);
        if wakes {
            self.wake();
        }
        if let Some(reason) = refused_request(&message, self.raw.raft.state, self.raw.raft.term) {
            return StepOutcome::Rejected(reason);
        }
        if message.get_msg_type() == MessageType::MsgPropose {
            for entry in message.entries.iter() {
                if let Some(change) = member_change_of(entry)
                    && let Some(reason) = self.change_refused(&change)
                {
                    return StepOutcome::Rejected(format!(
                        "refused node {from}'s membership change {change:?}: {reason}"
                    ));
                }
            }
        }
        if self.vote_hold.holds() && holds_vote_back_from(&message, self.raw.raft.term) {
            return StepOutcome::Rejected(
                "this node holds its vote for an election timeout after it started".into(),
            );
        }
        if let Some(refusal) = self.refused_while_catching_up(&message) {
            return refusal;
        }
        if message.get_msg_type() == MessageType::MsgTimeoutNow
            && message.term == self.raw.raft.term
            && self.raw.raft.promotable()
            && conf_change_unapplied(&self.raw.raft.raft_log)
        {
            let now = Instant::now();
            self.held_transfer = Some(HeldTransfer::hold(&message, self.election_timeout, now));
            return StepOutcome::Stepped;
        }
        // A member that joined has no configuration yet: it must start from a snapshot (which
        // carries one), never from the log's first entries. It takes the leader's term and
        // nothing else of an append, and asks for a snapshot.
        let mut wants_first_snapshot = None;
        if message.get_msg_type() == MessageType::MsgAppend && self.uninitialized() {
            wants_first_snapshot = Some(message.index);
            message.entries.clear();
            message.commit = 0;
        }
        // A leader's heartbeat carries the commit index up to what it believes this node
        // holds. After this node lost its log (its data wiped, or a log that was not synced),
        // that belief is stale and raft-rs would assert: the heartbeat commits nothing then,
        // and this node asks the leader for a snapshot (below).
        let log = &self.raw.raft.raft_log;
        let (last_index, committed) = (log.last_index(), log.committed);
        let lost_log =
            message.get_msg_type() == MessageType::MsgHeartbeat && message.commit > last_index;
        let believed = message.commit;
        let heartbeat_answer = (message.get_msg_type() == MessageType::MsgHeartbeatResponse)
            .then(|| message.context.clone());
        let append = message.get_msg_type() == MessageType::MsgAppend;
        let forwarded_proposal =
            message.get_msg_type() == MessageType::MsgPropose && from != self.raw.raft.id;
        if lost_log {
            message.commit = committed;
        }
        // raft-rs asserts on some impossible inputs (a commit index past the log, say). A peer
        // must not be able to crash the node with one: the group stops instead, since its raft
        // state may be half-updated.
        let raw = &mut self.raw;
        let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| raw.step(message)));
        match stepped {
            Ok(Ok(())) => {
                if forwarded_proposal && self.leads_with_current_news() {
                    let last_index = self.raw.raft.raft_log.last_index();
                    self.commit_news.forwarded(from, last_index);
                }
                self.tell_forwarders();
                self.note_commit_news();
                let raft = &self.raw.raft;
                if let Some(context) = heartbeat_answer
                    && raft.state == StateRole::Leader
                    && message_term == raft.term
                    && self.lease_term == raft.term
                    && let Some(sent_at) = self.lease.heartbeat_answered(from, &context)
                {
                    self.round_trips
                        .entry(from)
                        .or_insert_with(|| crate::metrics::peer_round_trip(from))
                        .record(sent_at.elapsed().as_secs_f64());
                }
                // Only the current leader's word counts; a floor never goes back (what every
                // voter persisted stays persisted).
                let raft = &self.raw.raft;
                if from == raft.leader_id && message_term == raft.term {
                    self.replicated_floor = self.replicated_floor.max(replicated_floor);
                    if lost_log {
                        self.ask_for_snapshot(from, believed, last_index);
                    }
                    if let Some(believed) = wants_first_snapshot {
                        self.ask_for_snapshot(from, believed, 0);
                    }
                    if append {
                        self.ask_for_snapshot_past_restart(from);
                    }
                }
                let raft = &self.raw.raft;
                if (raft.state, raft.leader_id, raft.term) != before {
                    // A new term, leader or role: the group's clock runs again.
                    self.wake();
                }
                let raft = &self.raw.raft;
                self.sleep.set_offered(
                    sleep_message
                        && raft.state == StateRole::Follower
                        && from == raft.leader_id
                        && message_term == raft.term
                        && sleep_commit == raft.raft_log.last_index()
                        && raft.raft_log.committed == raft.raft_log.last_index(),
                );
                StepOutcome::Stepped
            }
            // A message raft-rs refuses (stale term, unknown peer) is dropped.
            Ok(Err(error)) => StepOutcome::Rejected(error.to_string()),
            Err(_) => StepOutcome::Malformed(format!(
                "raft rejected a malformed message from node {from} by panicking"
            )),
        }
    }

    fn campaign(&mut self) {
        self.wake();
        if self.catching_up.is_none() {
            let _ = self.raw.campaign();
        }
    }

    fn leads(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
    }

    fn voter_progress(&self) -> Vec<crate::VoterProgress> {
        let raft = &self.raw.raft;
        if raft.state != StateRole::Leader {
            return Vec::new();
        }
        let mut voters: Vec<crate::VoterProgress> = raft
            .prs()
            .conf()
            .to_conf_state()
            .voters
            .into_iter()
            .filter_map(|node| {
                let progress = raft.prs().get(node)?;
                let matched_index = if node == raft.id {
                    raft.raft_log.last_index()
                } else {
                    progress.matched
                };
                Some(crate::VoterProgress {
                    node,
                    matched_index,
                })
            })
            .collect();
        voters.sort_unstable_by_key(|v| v.node);
        voters
    }

    fn successor(&self, reachable: &dyn Fn(NodeId) -> bool) -> Option<(NodeId, bool)> {
        let raft = &self.raw.raft;
        if raft.state != StateRole::Leader {
            return None;
        }
        let last_index = raft.raft_log.last_index();
        let voters = raft.prs().conf().to_conf_state().voters;
        let now = Instant::now();
        voters
            .into_iter()
            .filter(|&id| id != raft.id)
            .filter_map(|id| raft.prs().get(id).map(|p| (id, p)))
            .filter(|&(id, progress)| self.heard_lately(id, progress, now) && reachable(id))
            .max_by_key(|&(id, progress)| (progress.matched, std::cmp::Reverse(id)))
            .map(|(id, progress)| (id, progress.matched >= last_index))
    }

    fn caught_up(&self, node: NodeId) -> bool {
        let raft = &self.raw.raft;
        raft.state == StateRole::Leader
            && raft.prs().conf().voters().contains(node)
            && raft.prs().get(node).is_some_and(|progress| {
                self.heard_lately(node, progress, Instant::now())
                    && progress.matched >= raft.raft_log.last_index()
            })
    }

    fn is_transferring(&self) -> bool {
        self.raw.raft.state == StateRole::Leader && self.raw.raft.lead_transferee.is_some()
    }

    fn transfer_leadership(&mut self, node: NodeId) {
        self.wake();
        if self.raw.raft.state == StateRole::Leader && node != self.raw.raft.id {
            self.raw.transfer_leader(node);
        }
    }

    fn is_catching_up(&self) -> bool {
        self.catching_up.is_some()
    }

    fn catch_up_unanswered(&self) -> Option<Vec<NodeId>> {
        let Some(CatchUp::Probing(probing)) = &self.catching_up else {
            return None;
        };
        (self.catch_up_ticks > self.catch_up_patience_ticks)
            .then(|| probing.to_ask(self.raw.raft.id, &self.catch_up_peers))
    }

    fn is_asleep(&self) -> bool {
        self.sleep.is_asleep()
    }

    fn wake(&mut self) {
        self.sleep.wake();
        self.vote_hold.woke();
    }

    fn forget_restarted_leader(&mut self, group: GroupId, leader: NodeId) -> bool {
        self.forget_leader_that_restarted(group, leader)
    }

    fn sleeping_leader(&self) -> Option<NodeId> {
        let raft = &self.raw.raft;
        (self.sleep.is_asleep()
            && raft.state != StateRole::Leader
            && raft.leader_id != raft::INVALID_ID)
            .then_some(raft.leader_id)
    }

    fn tick_toward_sleep(&mut self, quiet: bool, after_ticks: usize) -> bool {
        let raft = &self.raw.raft;
        let log = &raft.raft_log;
        let last_index = log.last_index();
        let still = quiet
            && raft.state == StateRole::Leader
            && raft.lead_transferee.is_none()
            && raft.pending_read_count() == 0
            && !raft.has_pending_conf()
            && raft.commit_to_current_term()
            && self.catching_up.is_none()
            && self.installing.is_none()
            && log.committed == last_index
            && log.applied == last_index
            && raft
                .prs()
                .iter()
                .all(|(&id, progress)| id == raft.id || progress.matched == last_index);
        let at = (last_index, log.committed);
        if !self.sleep.still_for(still, at, after_ticks) {
            return false;
        }
        // Every member has the whole log: tell each that the group sleeps, and sleep.
        let raft = &mut self.raw.raft;
        let me = raft.id;
        let members: Vec<NodeId> = raft.prs().iter().map(|(&id, _)| id).collect();
        for to in members.into_iter().filter(|&id| id != me) {
            raft.msgs
                .push(sleep_heartbeat(me, to, raft.term, last_index));
        }
        self.fall_asleep();
        true
    }

    fn accept_sleep(&mut self, quiet: bool) {
        if self.sleep.take_offer() && quiet {
            self.fall_asleep();
        }
    }

    fn tick(&mut self) {
        self.vote_hold.tick();
        // While catching up, the election clock stands still: no campaign.
        match self.catching_up {
            None => {
                if !self.campaign_held() {
                    self.raw.tick();
                }
                self.step_held_proposals();
            }
            // Asked on the first tick, and again every election timeout.
            Some(CatchUp::Probing(_)) => {
                self.catch_up_ticks += 1;
                if (self.catch_up_ticks - 1).is_multiple_of(self.election_ticks.max(1)) {
                    self.send_probes();
                }
            }
            // Not while a snapshot is fetched or installed: the worker does not tick the
            // group then.
            Some(CatchUp::Following { .. }) => {
                self.catch_up_ticks += 1;
                if self
                    .catch_up_ticks
                    .is_multiple_of(self.election_ticks.max(1))
                {
                    self.nudge_sleeping_leader();
                }
            }
        }
    }

    fn check_serving(&self, group: GroupId) -> Result<(), ProposeError> {
        let raft = &self.raw.raft;
        if raft.state == StateRole::Leader || raft.leader_id != raft::INVALID_ID {
            Ok(())
        } else {
            Err(self.not_leader(group))
        }
    }

    fn propose(
        &mut self,
        group: GroupId,
        data: Vec<u8>,
        forward_id: u64,
    ) -> Result<Proposed, ProposeError> {
        self.wake();
        let leads = self.raw.raft.state == StateRole::Leader;
        // raft-rs forwards a follower's proposal to the leader as it is; the tag in its context
        // comes back with the committed entry.
        let context = if leads {
            Vec::new()
        } else {
            self.tag(forward_id).encode()
        };
        match self.raw.propose(context, data) {
            Ok(()) if leads => Ok(Proposed::Appended {
                index: self.raw.raft.raft_log.last_index(),
                term: self.raw.raft.term,
            }),
            Ok(()) => Ok(Proposed::Forwarded {
                term: self.raw.raft.term,
            }),
            Err(raft::Error::ProposalDropped) => Err(self.not_leader(group)),
            Err(other) => Err(ProposeError::Stopped {
                group,
                reason: other.to_string(),
            }),
        }
    }

    fn lease_read_index(&self, now: Instant, peers_quiet: Option<Duration>) -> Option<u64> {
        let raft = &self.raw.raft;
        let holds = raft.state == StateRole::Leader
            // Handing over, a `MsgTimeoutNow` may be queued and not yet seen leaving.
            && raft.lead_transferee.is_none()
            && self.hand_over_sent_term != raft.term
            // A new leader's commit index may lag what its predecessor committed until an
            // entry of its own term commits.
            && raft.commit_to_current_term()
            && self.lease_term == raft.term
            && self.lease_holds(now, peers_quiet);
        holds.then_some(raft.raft_log.committed)
    }

    fn read_index(&mut self, read_id: u64) -> Option<u64> {
        self.wake();
        // Tagged with this node's id: the leader keeps the reads of every node by this context.
        self.raw.read_index(self.tag(read_id).encode());
        None
    }

    fn has_ready(&self) -> bool {
        match &self.installing {
            Some(receipt) => receipt.is_installed(),
            None => self.raw.has_ready(),
        }
    }

    fn collect(&mut self, group: &mut GroupState, round: &mut Round) -> Option<InFlight> {
        let mut ready = match self.installing.take() {
            // The snapshot's state is in: its Ready is persisted now, like any other.
            Some(receipt) if receipt.is_installed() => {
                group
                    .status
                    .installing_snapshot
                    .store(false, std::sync::atomic::Ordering::Release);
                receipt.into_ready()
            }
            Some(receipt) => {
                self.installing = Some(receipt);
                return None;
            }
            None => {
                let mut ready = self.raw.ready();
                // raft-rs's soft state is the leader and the role: a leader elected again in a
                // later term changes neither, on a follower that never saw it step down.
                let published_term = group.status.term.load(std::sync::atomic::Ordering::Acquire);
                if ready.ss().is_some() || published_term != self.raw.raft.term {
                    self.publish_leadership(group, &mut round.leadership_changes);
                }
                let mut messages = ready.take_messages();
                self.lease_messages_leaving(&mut messages, round.now);
                self.commit_news_leaving(&messages);
                self.note_commit_news();
                let snapshots_to: Vec<NodeId> = messages
                    .iter()
                    .filter(|m| m.get_msg_type() == MessageType::MsgSnapshot)
                    .map(|m| {
                        self.ticket_sent(m.to, m.get_snapshot().get_metadata().index);
                        m.to
                    })
                    .collect();
                self.queue_messages(&mut round.send_now, group.id, messages);
                // A snapshot message is only a ticket: the follower fetches the state over a
                // stream of its own and acknowledges the index once installed. raft-rs would
                // wait in its snapshot state for a report that never comes; reported sent,
                // it probes the follower again and sends another ticket if it must.
                for to in snapshots_to {
                    self.raw.report_snapshot(to, raft::SnapshotStatus::Finish);
                }
                for read in ready.take_read_states() {
                    match ForwardTag::decode(&read.request_ctx) {
                        Some(tag) if tag.node == self.raw.raft.id => {
                            group.read_index_known(tag.id, read.index)
                        }
                        _ => crate::metrics::dropped_message("misaddressed"),
                    }
                }
                if !ready.snapshot().is_empty() {
                    self.hold_snapshot(group, ready);
                    return None;
                }
                ready
            }
        };
        let snapshot = (!ready.snapshot().is_empty()).then(|| {
            let metadata = ready.snapshot().get_metadata().clone();
            let at = (
                metadata.index,
                metadata.term,
                metadata.get_conf_state().clone(),
            );
            round.batch.apply_snapshot(group.id, metadata);
            round.snapshots_recorded.push(group.id);
            at
        });
        round.push_committed(group.id, ready.take_committed_entries());
        let entries = ready.take_entries();
        // raft reads back right after the write only entries that commit with it: a single
        // voter's, or a follower's whose append carried the commit. A leader with other voters
        // commits later, when its storage reads them from the log store anyway.
        let raft = &self.raw.raft;
        if raft.state != StateRole::Leader || raft.prs().is_singleton() {
            self.raw.mut_store().writing(&entries);
        } else {
            self.raw.mut_store().forget_written();
        }
        group.appending(&entries, round.now);
        let mut persisting = TermRuns::default();
        for entry in &entries {
            persisting.push(entry.index, entry.term);
        }
        round.batch.append(group.id, entries);
        if let Some(hard_state) = ready.hs() {
            group
                .status
                .commit_index
                .store(hard_state.commit, std::sync::atomic::Ordering::Release);
        }
        if ready.hs().is_some() || self.commit_dirty || snapshot.is_some() {
            round
                .batch
                .set_hard_state(group.id, self.raw.raft.hard_state());
            self.commit_dirty = false;
        }
        Some(InFlight {
            ready,
            persisting,
            snapshot,
        })
    }

    fn persisted(&mut self, group: &mut GroupState, round: &mut Round, collected: InFlight) {
        let InFlight {
            mut ready,
            persisting,
            snapshot,
        } = collected;
        let mut persisted_messages = ready.take_persisted_messages();
        // raft reads what it just persisted from the storage after advance_append.
        match snapshot {
            Some((index, term, conf_state)) => {
                drop_rejections_the_snapshot_answers(&mut persisted_messages, index);
                let members = GroupMembers::from_conf_state(&conf_state);
                let node = self.raw.raft.id;
                let before = group.status.members.lock();
                round
                    .members_dropped
                    .extend(before.dropped_in(&members, node));
                // `set_members` takes the same lock.
                drop(before);
                group.status.set_members(group.id, members, node);
                self.conf_index = index;
                self.raw
                    .mut_store()
                    .restored(index, term, conf_state, &persisting);
                group
                    .status
                    .set_last_log_index(persisting.last_index().unwrap_or(index));
                group.entry_sizes.compacted(index + 1);
            }
            None => self.raw.mut_store().persisted(&persisting),
        }
        let after_write = &mut round.send_after_write;
        self.queue_messages(after_write, group.id, persisted_messages);
        let mut light = self.raw.advance_append(ready);
        if let Some(commit) = light.commit_index() {
            group
                .status
                .commit_index
                .store(commit, std::sync::atomic::Ordering::Release);
            self.commit_dirty = true;
        }
        let mut messages = light.take_messages();
        self.lease_messages_leaving(&mut messages, round.now);
        self.commit_news_leaving(&messages);
        self.queue_messages(after_write, group.id, messages);
        self.raw.mut_store().forget_written();
        round.push_committed(group.id, light.take_committed_entries());
        self.catch_up_applied();
        self.finish_catching_up();
        self.tell_forwarders();
        self.note_commit_news();
    }

    fn compacted(&mut self, compact_index: u64) {
        self.raw.mut_store().compacted(compact_index);
    }

    fn applied(&mut self, applied_index: u64) {
        self.state_applied = self.state_applied.max(applied_index);
        self.finish_catching_up();
        self.raw.mut_store().set_applied(self.state_applied);
        self.catch_up_applied();
    }

    fn members(&self) -> GroupMembers {
        GroupMembers::from_conf_state(&self.raw.raft.prs().conf().to_conf_state())
    }

    fn propose_member_change(
        &mut self,
        group: GroupId,
        change: &MemberChange,
    ) -> Result<(), ProposeError> {
        self.wake();
        if self.raw.raft.state == StateRole::Leader
            && let Some(reason) = self.change_refused(change)
        {
            return Err(ProposeError::Refused { group, reason });
        }
        // A follower's goes to the leader as it is (raft-rs forwards proposals), where the
        // same check runs before it is appended.
        match self
            .raw
            .propose_conf_change(change.context().encode(), change.conf_change())
        {
            Ok(()) => Ok(()),
            Err(raft::Error::ProposalDropped) => Err(self.not_leader(group)),
            Err(other) => Err(ProposeError::Refused {
                group,
                reason: other.to_string(),
            }),
        }
    }

    fn apply_conf_changes(
        &mut self,
        entries: &[Entry],
        reachable: &dyn Fn(NodeId) -> bool,
    ) -> Option<ConfApplied> {
        let mut outcome: Option<ConfApplied> = None;
        for entry in entries {
            if entry.index <= self.conf_index || entry.get_entry_type() == EntryType::EntryNormal {
                continue;
            }
            // Concord proposes only the second form; raft-rs appends it too, empty, to leave a
            // joint configuration.
            let change = match entry.get_entry_type() {
                EntryType::EntryConfChangeV2 => {
                    ConfChangeV2::parse_from_bytes(&entry.data).map_err(|error| error.to_string())
                }
                _ => Err("a configuration change of the first form".to_string()),
            };
            // Every replica applies the same entries to the same configuration, so one that
            // cannot be applied is skipped alike everywhere.
            let conf_state = match change
                .and_then(|cc| self.raw.apply_conf_change(&cc).map_err(|e| e.to_string()))
            {
                Ok(conf_state) => conf_state,
                Err(reason) => {
                    tracing::warn!(index = entry.index, %reason, "skipped a configuration change");
                    continue;
                }
            };
            self.conf_index = entry.index;
            self.raw
                .mut_store()
                .conf_changed(entry.index, conf_state.clone());
            let applied = outcome.get_or_insert_with(|| ConfApplied {
                conf_state: conf_state.clone(),
                index: entry.index,
                added: Vec::new(),
            });
            applied.conf_state = conf_state;
            applied.index = entry.index;
            if let Some(context) = MemberContext::decode(&entry.context)
                && !context.address.is_empty()
            {
                applied.added.push((context.node, context.address));
            }
        }
        let applied = outcome?;
        tracing::debug!(
            index = applied.index,
            members = ?GroupMembers::from_conf_state(&applied.conf_state),
            "configuration changed"
        );
        // A leader that is no longer a voter would keep leading in raft-rs, with no progress
        // of its own to count (raft-rs panics on the next acknowledgement): it hands the
        // leadership to a caught-up voter that is up, so that the group need not wait for an
        // election, and steps down at once.
        let raft = &self.raw.raft;
        if raft.state == StateRole::Leader
            && !applied.conf_state.voters.contains(&raft.id)
            && applied.conf_state.voters_outgoing.is_empty()
        {
            let successor = self.successor(reachable).map(|(node, _)| node);
            tracing::debug!(
                to = ?successor,
                "removed from the voters; handing the leadership over and stepping down"
            );
            if let Some(successor) = successor {
                self.raw.transfer_leader(successor);
            }
            let term = self.raw.raft.term;
            self.raw.raft.become_follower(term, raft::INVALID_ID);
        }
        Some(applied)
    }

    fn is_installing(&self) -> bool {
        self.installing.is_some()
    }

    fn snapshot_wanted(&mut self, now: Instant) -> Option<(NodeId, u64)> {
        self.installing.as_mut()?.fetch_due(now)
    }

    fn snapshot_source_due(&self, now: Instant) -> Option<NodeId> {
        self.installing.as_ref()?.source_if_due(now)
    }

    fn snapshot_done(&mut self, group: GroupId, outcome: Result<u64, SnapshotFailure>) {
        let (this_node, leader) = (self.raw.raft.id, self.raw.raft.leader_id);
        let Some(receipt) = self.installing.as_mut() else {
            return;
        };
        match outcome {
            Ok(applied_index) => {
                tracing::debug!(
                    group,
                    index = receipt.index(),
                    applied_index,
                    "installed a snapshot"
                );
                receipt.installed();
                self.state_applied = self.state_applied.max(applied_index);
            }
            Err(failure) => {
                let failed = receipt.source();
                let refused = matches!(failure, SnapshotFailure::Refused(_));
                receipt.fetch_failed(this_node, leader, Instant::now(), refused);
                let next_source = receipt.source();
                crate::metrics::snapshot_not_installed(refused);
                // A member busy sending others, or not yet as far, is the normal course of a
                // catch-up, not something to alarm whoever reads the log.
                match failure {
                    SnapshotFailure::Refused(reason) => {
                        tracing::debug!(group, source = failed, next_source, %reason, "snapshot not served now; asking again")
                    }
                    // Counted, with the first cause, in the worker's "snapshots installed"
                    // line.
                    SnapshotFailure::Broken(reason) => {
                        tracing::debug!(group, source = failed, next_source, %reason, "snapshot fetch or install failed; retrying")
                    }
                }
            }
        }
    }

    fn first_index(&self) -> u64 {
        self.raw.raft.raft_log.store.first_index
    }

    fn replicated_bound(&self) -> u64 {
        // A voter that keeps up catches up from the log (one further behind gets a snapshot),
        // and a follower that becomes leader must still hold what the others lack: on a
        // leader from its own view, on a follower from the leader's word.
        if self.raw.raft.state == StateRole::Leader {
            self.leader_floor()
        } else {
            self.replicated_floor
        }
    }
}

#[cfg(test)]
mod tests {
    use concord_storage::{MemLogStore, MemStateStore, Stores};

    use super::*;

    /// Node 1's replica of group 7 on memory stores, of a cluster of three as at its first
    /// start (`bootstrap`), or as a member joining it without data.
    fn replica_of_three(config: &NodeConfig, bootstrap: bool) -> RaftReplica {
        let stores = Stores {
            log: Arc::new(MemLogStore::new()),
            state: Arc::new(MemStateStore::new()),
        };
        if bootstrap {
            crate::raft_node::bootstrap_conf_state(config, &stores).unwrap();
        }
        let logger = crate::raft_node::logger::raft_logger(1);
        RaftReplica::open(config, 7, stores.log, 0, Default::default(), &logger).unwrap()
    }

    #[test]
    fn a_leader_that_falls_asleep_frees_its_followers_inflight_rings() {
        let config = NodeConfig::new(1, vec![1, 2, 3], vec![7]);
        let mut replica = replica_of_three(&config, true);
        let raft = &mut replica.raw.raft;
        raft.become_candidate();
        raft.become_leader();
        for follower in [2, 3] {
            // An append sent and acknowledged while replicating leaves the ring allocated.
            let progress = raft.mut_prs().get_mut(follower).unwrap();
            progress.become_replicate();
            progress.ins.add(1);
            progress.ins.free_to(1);
            assert!(progress.ins.buffer_is_allocated());
        }
        replica.fall_asleep();
        for follower in [2, 3] {
            let progress = replica.raw.raft.prs().get(follower).unwrap();
            assert!(!progress.ins.buffer_is_allocated(), "follower {follower}");
        }
    }

    /// A follower whose leader is elected again in a later term, without the follower ever
    /// seeing it step down, publishes the new term: raft-rs's soft state (leader and role)
    /// did not change, and the published term would have stayed the old one.
    #[test]
    fn a_leader_elected_again_is_published_with_its_new_term() {
        use crate::node_loop::replica::Replica as _;
        let config = NodeConfig::new(1, vec![1, 2, 3], vec![7]);
        let mut replica = replica_of_three(&config, true);
        let status = Arc::new(crate::status::SharedGroupStatus::new(
            7,
            false,
            Default::default(),
        ));
        let queue = Arc::new(crate::proposal_queue::ProposalQueue::new(16, 1 << 20));
        let mut state = GroupState::new(
            7,
            queue,
            status.clone(),
            0,
            crate::log_compaction::EntrySizes::new(0),
        );
        let mut published = Vec::new();
        for term in [2, 3] {
            let mut heartbeat = Message::default();
            heartbeat.set_msg_type(MessageType::MsgHeartbeat);
            (heartbeat.from, heartbeat.to, heartbeat.term) = (2, 1, term);
            replica.step(GroupMessage {
                group: 7,
                message: heartbeat,
                replicated_floor: 0,
            });
            let batch = concord_storage::LogBatch::new();
            let mut round = Round::new(Instant::now(), batch, 1);
            if let Some(collected) = replica.collect(&mut state, &mut round) {
                replica.persisted(&mut state, &mut round, collected);
            }
            published.push((
                status.leader.load(std::sync::atomic::Ordering::Acquire),
                status.term.load(std::sync::atomic::Ordering::Acquire),
            ));
        }
        assert_eq!(published, [(2, 2), (2, 3)]);
    }

    /// A member that lost its data and asks the others where the group stands names those
    /// that never answered once it has asked for its patience (`catch_up::patience_ticks`), and
    /// not before.
    #[test]
    fn a_member_asking_too_long_names_the_members_that_never_answered() {
        let mut config = NodeConfig::new(1, vec![1, 2, 3], vec![7]);
        config.catch_up_before_voting = true;
        let mut replica = replica_of_three(&config, false);
        assert!(replica.is_catching_up());
        let election = config.election_ticks;
        let mut ticks = 0;
        let mut named = Vec::new();
        let mut tick_for = |replica: &mut RaftReplica, count: usize| {
            for _ in 0..count {
                replica.tick();
                ticks += 1;
                if let Some(unanswered) = replica.catch_up_unanswered() {
                    named.push((ticks, unanswered));
                }
            }
        };
        let patience = catch_up::patience_ticks(election, config.tick_interval);
        tick_for(&mut replica, patience + 2);
        let Some(CatchUp::Probing(probing)) = &mut replica.catching_up else {
            panic!("not asking: {:?}", replica.catching_up);
        };
        probing.record(
            2,
            catch_up::ProbeAnswer {
                term: 5,
                last_term: 5,
                last_index: 9,
                voters: vec![1, 2, 3],
                voters_outgoing: Vec::new(),
            },
        );
        tick_for(&mut replica, 1);
        assert_eq!(
            named,
            vec![
                (patience + 1, vec![2, 3]),
                (patience + 2, vec![2, 3]),
                (patience + 3, vec![3]),
            ]
        );
    }
}
