//! Where the worker sends the leaderships it holds: the leader balance, each interval, hands
//! this worker's part of the node's excess to the voters leading fewer (the rule:
//! `leadership.rs`), the groups led longest first; a node that stops, or whose log write was
//! slow, hands every leadership over, spread over the other voters. A leadership goes only to
//! a voter the network says is up: the balance's only to one raft-rs counts caught up with
//! the group's log, a hand-over's to the one with the most of it where none is.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::Worker;
use crate::node_loop::leadership::{BALANCE_MOVES_MAX, HandOverTargets, balance_moves};
use crate::node_loop::replica::Replica;

impl<R: Replica> Worker<R> {
    /// Once per tick: while handing over, every leadership still held goes again; otherwise,
    /// when the balance is due, this worker's part of the node's excess leaderships goes to
    /// the voters leading fewer (the rule: `leadership.rs`), each to a voter that has the
    /// group's whole log.
    pub(super) fn move_leaderships(&mut self, now: Instant) {
        if self.handing_over {
            self.hand_over();
            return;
        }
        let Some(due) = self.next_balance else {
            return;
        };
        if now < due {
            return;
        }
        let config = &self.shared.config;
        self.next_balance = config.leader_balance_interval.map(|every| now + every);
        let leaders = self
            .shared
            .entrance
            .groups
            .values()
            .map(|handle| handle.status.leader.load(Ordering::Acquire));
        // Only voters that are up take part: one that died a moment ago still looks caught up
        // to raft-rs, and a group handed to it would hold its writes until the transfer gave up.
        let reachable = self.reachability();
        let voters: Vec<_> = (self.shared.entrance.voters().into_iter())
            .filter(|&voter| voter == config.node_id || reachable(voter))
            .collect();
        let moves = balance_moves(config.node_id, &voters, leaders);
        if moves.is_empty() {
            return;
        }
        // Each worker sees the whole node's moves and hands over its part of them.
        let workers = config.workers.max(1);
        let mut budget = BALANCE_MOVES_MAX;
        // The groups led longest are handed over first: one that just came here stays, so the
        // balance does not undo an operator's transfer (it moves another group instead).
        let mut led_oldest_first: Vec<(Option<Instant>, usize)> = (self.groups.iter().enumerate())
            .filter(|(_, group)| !group.state.is_stopped() && group.replica.leads())
            .map(|(position, group)| (group.state.leading_since, position))
            .collect();
        led_oldest_first.sort_unstable();
        for (target, count) in moves {
            let mut left = count.div_ceil(workers).min(budget);
            let mut moved = 0;
            for &(_, position) in &led_oldest_first {
                if left == 0 {
                    break;
                }
                let group = &mut self.groups[position];
                // One already handed to another voter in this pass is transferring.
                let movable = !group.replica.is_transferring() && group.replica.caught_up(target);
                if movable {
                    group.replica.transfer_leadership(target);
                    self.activate(position);
                    left -= 1;
                    moved += 1;
                }
            }
            if moved > 0 {
                tracing::info!(
                    to = target,
                    groups = moved,
                    "handing leaderships over to balance"
                );
            }
            budget -= moved;
        }
    }

    /// Hands every leadership this worker holds to another voter among those the network
    /// says are up (one that stopped or crashed a moment ago may still look active to
    /// raft-rs, and a leadership handed to it would wait for an election): of the voters
    /// with the group's whole log, the one leading the fewest groups, so that the leaderships
    /// spread; where none has it, the one with the most of it. A group already being handed
    /// over keeps its taker.
    pub(super) fn hand_over(&mut self) {
        let reachable = self.reachability();
        let me = self.shared.config.node_id;
        let entrance = &self.shared.entrance;
        let takers: Vec<crate::NodeId> = (entrance.voters().into_iter())
            .filter(|&voter| voter != me && reachable(voter))
            .collect();
        let leaders =
            (entrance.groups.values()).map(|handle| handle.status.leader.load(Ordering::Acquire));
        let mut targets = HandOverTargets::new(&takers, leaders);
        for position in 0..self.groups.len() {
            let group = &mut self.groups[position];
            if group.state.is_stopped() || !group.replica.leads() || group.replica.is_transferring()
            {
                continue;
            }
            let taker = targets
                .fewest_led(|taker| group.replica.caught_up(taker))
                .or_else(|| group.replica.successor(&reachable).map(|(id, _)| id));
            if let Some(taker) = taker {
                targets.handed(taker);
                group.replica.transfer_leadership(taker);
                self.activate(position);
            }
        }
    }

    /// Says whether a voter is up by the network's word (`Transport::reachable`, heard from
    /// within `liveness_timeout`); where the network cannot tell, every voter is.
    pub(super) fn reachability(&self) -> impl Fn(crate::NodeId) -> bool + use<R> {
        let within = self.shared.config.liveness_timeout;
        let transport = self.transport.clone();
        move |node| transport.as_ref().is_none_or(|t| t.reachable(node, within))
    }

    /// A log write took `took`, longer than `slow_log_write`: every group this worker leads is
    /// handed to another voter (see `NodeConfig::slow_log_write`). The leader balance hands a
    /// group back only to a voter caught up with its log, which a node whose disk stays slow
    /// under writes is not.
    pub(super) fn hand_over_after_slow_write(&mut self, took: Duration) {
        crate::metrics::slow_log_write();
        if self.handing_over || self.shared.entrance.voters().len() < 2 {
            return;
        }
        let leading = self.groups.iter().filter(|g| g.replica.leads()).count();
        if leading == 0 {
            return;
        }
        tracing::warn!(
            took_ms = took.as_millis() as u64,
            leading,
            "a log write was slow; handing the leaderships over"
        );
        self.hand_over();
    }
}
