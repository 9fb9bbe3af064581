//! Settings of a consensus node.

use std::time::Duration;

use concord_storage::GroupId;

use crate::NodeId;

/// Settings of a [`crate::RaftNode`] or [`crate::SoloNode`]. Defaults ([`NodeConfig::new`]):
/// a 100 ms tick, a heartbeat every tick, elections after 10–20 ticks.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// This node's id (non-zero).
    pub node_id: NodeId,
    /// The voters a group starts with when it has no configuration yet, this node included
    /// (unless it joins a running cluster: `catch_up_before_voting`, whose groups take their
    /// configuration from a snapshot). Membership changes (`RaftNode::propose_member_change`)
    /// change each group's afterwards; the stored configuration then wins over this list.
    pub voters: Vec<NodeId>,
    /// The groups this node hosts.
    pub groups: Vec<GroupId>,
    /// Raft worker threads; each owns the groups with `group % workers == its index`, and has
    /// its own apply thread.
    pub workers: usize,
    /// The raft clock.
    pub tick_interval: Duration,
    /// Ticks between heartbeats.
    pub heartbeat_ticks: usize,
    /// Ticks without a leader before an election; randomized in `[this, 2 * this)`.
    pub election_ticks: usize,
    /// Largest append message in bytes (raft-rs's default of 0 means one entry per message).
    pub max_size_per_msg_bytes: u64,
    /// Append messages in flight per follower.
    pub max_inflight_msgs: usize,
    /// A leader steps down when it has not heard from a quorum for an election timeout.
    pub check_quorum: bool,
    /// Candidates ask before disrupting a term (avoids elections by partitioned nodes).
    pub pre_vote: bool,
    /// Commands waiting per group before proposals are refused with `Overloaded`.
    pub proposal_queue_capacity: usize,
    /// Bytes of commands waiting per group before proposals are refused with `Overloaded`
    /// (at least `max_command_bytes`: one command always fits an empty queue).
    pub proposal_queue_capacity_bytes: usize,
    /// Read barriers waiting per group (for their index or for apply) before reads are
    /// refused with `Overloaded`.
    pub max_waiting_reads: usize,
    /// Commands packed into one raft entry at most.
    pub max_commands_per_entry: usize,
    /// Bytes of commands packed into one raft entry at most.
    pub max_entry_bytes: usize,
    /// Entries a leader keeps proposed but not yet committed, per group; beyond that, commands
    /// wait in the queue and the next entry carries more of them. A worker's groups propose in
    /// waves: while one group that proposed has this many entries out, none proposes (for one
    /// `tick_interval` at most), so that their entries share log writes and syncs.
    pub max_in_flight_entries: usize,
    /// How long a leader's new commit index waits for an append to carry it to the followers
    /// before each is sent an append of its own for it: a writer's next command usually comes
    /// sooner and carries it for nothing. Heartbeats carry it too; a follower that forwarded
    /// the committed entry hears at once (`raft_node/commit_news.rs`).
    pub commit_news_delay: Duration,
    /// A command larger than this is refused with `TooLarge`.
    pub max_command_bytes: usize,
    /// A proposal without an answer after this long is answered `Timeout`.
    pub proposal_timeout: Duration,
    /// Rounds of committed entries (each covering every group that committed in it) queued to
    /// each apply thread before the raft worker waits.
    pub apply_queue_capacity: usize,
    /// The longest an idle raft or apply thread keeps yielding the CPU, watching for work,
    /// before it parks. A parked thread needs a futex wake and a context switch to resume, and
    /// a proposal crosses several threads, so watching buys latency when work comes back
    /// soon. Each thread learns how long to watch, up to this bound, from how soon work came
    /// after its earlier idle spells, and stops as soon as another thread wants its CPU (see
    /// `idle_spin.rs`). Zero parks at once.
    pub idle_spin: Duration,
    /// This node joins a cluster that already has data (it lost its own, or is added): a group
    /// with no data here takes part in no election until it has caught up with a leader.
    /// `false` (the default) when every member starts a new cluster together.
    pub catch_up_before_voting: bool,
    /// A voter this many entries behind its leader's last index no longer holds the log back
    /// from compaction: it is sent a snapshot of the state instead.
    pub snapshot_lag_entries: u64,
    /// Where a follower keeps a snapshot's state while it arrives, before it is installed: a
    /// directory of this node's own (files a crash left behind are removed at start), or
    /// `None` for the system's temporary directory.
    pub snapshot_dir: Option<std::path::PathBuf>,
    /// How often a node leading more than its share of the groups hands its excess to the
    /// voters leading fewer (at most 64 groups per worker each time); `None` leaves leaders
    /// where elections put them (benchmarks that place leaders themselves).
    pub leader_balance_interval: Option<Duration>,
    /// How often the state store is flushed (made durable), on a thread beside each apply
    /// thread: a flush starts once this long has passed since the last one started and that
    /// one has finished, or sooner once the store holds much in memory
    /// (`StateStore::wants_flush`). The log is never compacted past the last flushed applied
    /// index (on a store whose commits are as durable as they get, memory, every commit
    /// counts as flushed: `StateStore::commits_are_durable`). Longer flushes fewer times the
    /// pages that keys spread over the state share; memory holds what commits wrote
    /// meanwhile, and a restart replays it from the log.
    pub state_flush_interval: Duration,
    /// Applied entries each group's log keeps below the point it could be compacted to. The
    /// log is compacted (checked every tick) up to the state's durable applied index, and no
    /// further than what every voter within `snapshot_lag_entries` has persisted (a leader's
    /// own view; on a follower, the floor its leader sends): those catch up from the log, one
    /// further behind gets a snapshot. Compaction runs once at least this many entries can
    /// go, so its cost is spread over that many entries.
    pub log_keep_entries: u64,
    /// Payload bytes of applied entries the logs of all this node's groups keep together;
    /// each group gets an equal share, and when its applied tail holds more than twice that,
    /// it is compacted down to it (never past the compaction bound above). Every backend but
    /// sled holds the live log in memory, and under load one entry carries thousands of
    /// commands, so this, not the entry count, bounds the memory.
    pub log_keep_bytes: u64,
    /// Ticks a group must stay still — every entry committed, applied and on every member,
    /// nothing queued or waiting — before its leader puts it to sleep (0: groups never sleep).
    /// A sleeping group is not ticked and exchanges no heartbeats; a proposal, a read or any
    /// message wakes it. Groups sleep only over a network that reports node liveness.
    pub sleep_after_ticks: usize,
    /// A follower of a sleeping group wakes it once nothing at all has been heard from the
    /// leader's node for this long (the network's node-level liveness signal); the usual
    /// election timeout then runs from there. A voter silent for this long is also taken
    /// for down: no leadership is handed to it, on a stop or by the balance
    /// (`Transport::reachable`).
    pub liveness_timeout: Duration,
    /// A log write (with its sync) that takes longer than this makes the worker hand every
    /// leadership it holds to another voter. The write runs on the worker thread: a node
    /// whose disk stalls would otherwise go on leading, every write to its groups waiting for
    /// that disk, while the heartbeats it still sends between writes keep the others from
    /// electing. A node that leads nothing is not slowed by its own disk: a quorum of the
    /// others commits. `None`: leaderships stay (benchmarks and tests that place leaders).
    pub slow_log_write: Option<Duration>,
    /// The vote quiet (`vote_quiet`) this node said to its peers before it last stopped, if
    /// longer than today's: a leader may still serve lease reads counting on it. A node
    /// restarted with its log holds back its vote for its own election timeout, and for at
    /// least this long when it is longer (the ticks were shortened across the restart).
    /// `Engine::open` keeps it in the data directory; zero (the default) adds nothing.
    pub previous_vote_quiet: Duration,
    /// Where the node records whether its log synced every write since the log last matched
    /// the state ([`LOG_SYNC_FILE`](crate::LOG_SYNC_FILE) in the data directory), read and
    /// written at each start: a node alone whose log ends before its state's applied index
    /// is refused when the record says every write was synced ([`StartError::SyncedLogLost`]),
    /// and starts from its state otherwise. `None` (the default, and the memory backend):
    /// no record, the node starts from its state.
    ///
    /// [`StartError::SyncedLogLost`]: crate::StartError::SyncedLogLost
    pub log_sync_record: Option<std::path::PathBuf>,
}

impl NodeConfig {
    /// How long this node, having heard from a leader, surely votes for no other:
    /// `election_ticks - 1` ticks with `check_quorum` (the first tick may come at once after
    /// the leader's message), zero without. A leader's lease over this node lasts nine tenths
    /// of it at most; [`TcpNetworkConfig::vote_quiet`](crate::transport::TcpNetworkConfig)
    /// says it to the peers.
    pub fn vote_quiet(&self) -> Duration {
        crate::raft_node::vote_quiet(self.tick_interval, self.election_ticks, self.check_quorum)
    }

    /// How much applied log each group keeps.
    pub(crate) fn log_keep(&self) -> crate::log_compaction::LogKeep {
        let groups = self.groups.len().max(1) as u64;
        crate::log_compaction::LogKeep {
            entries: self.log_keep_entries,
            bytes: (self.log_keep_bytes / groups).max(1),
        }
    }

    /// Defaults for `node_id` among `voters`, hosting `groups`.
    pub fn new(node_id: NodeId, voters: Vec<NodeId>, groups: Vec<GroupId>) -> Self {
        NodeConfig {
            node_id,
            voters,
            groups,
            workers: 1,
            tick_interval: Duration::from_millis(100),
            heartbeat_ticks: 1,
            election_ticks: 10,
            max_size_per_msg_bytes: 1024 * 1024,
            max_inflight_msgs: 256,
            check_quorum: true,
            pre_vote: true,
            proposal_queue_capacity: 65_536,
            proposal_queue_capacity_bytes: 32 * 1024 * 1024,
            max_waiting_reads: 16_384,
            max_commands_per_entry: 8192,
            max_entry_bytes: 4 * 1024 * 1024,
            max_in_flight_entries: 1,
            commit_news_delay: Duration::from_millis(1),
            max_command_bytes: 1024 * 1024,
            proposal_timeout: Duration::from_secs(10),
            apply_queue_capacity: 64,
            idle_spin: Duration::from_micros(50),
            catch_up_before_voting: false,
            snapshot_lag_entries: 10_000,
            snapshot_dir: None,
            leader_balance_interval: Some(Duration::from_secs(2)),
            state_flush_interval: Duration::from_secs(2),
            log_keep_entries: 1024,
            log_keep_bytes: 64 * 1024 * 1024,
            sleep_after_ticks: 20,
            liveness_timeout: Duration::from_secs(1),
            slow_log_write: Some(Duration::from_millis(250)),
            previous_vote_quiet: Duration::ZERO,
            log_sync_record: None,
        }
    }

    /// Checks the settings, naming the first wrong one.
    pub fn validate(&self) -> Result<(), String> {
        if self.node_id == 0 {
            return Err("node_id must not be 0 (raft reserves it)".into());
        }
        if !self.voters.contains(&self.node_id) && !self.catch_up_before_voting {
            return Err(format!(
                "voters {:?} must include node {}",
                self.voters, self.node_id
            ));
        }
        if self.groups.is_empty() {
            return Err("a node must host at least one group".into());
        }
        let positive = [
            ("workers", self.workers),
            ("heartbeat_ticks", self.heartbeat_ticks),
            ("proposal_queue_capacity", self.proposal_queue_capacity),
            ("max_waiting_reads", self.max_waiting_reads),
            ("max_commands_per_entry", self.max_commands_per_entry),
            ("apply_queue_capacity", self.apply_queue_capacity),
            ("max_inflight_msgs", self.max_inflight_msgs),
            ("max_in_flight_entries", self.max_in_flight_entries),
            ("log_keep_entries", self.log_keep_entries as usize),
            ("log_keep_bytes", self.log_keep_bytes as usize),
        ];
        for (name, value) in positive {
            if value == 0 {
                return Err(format!("{name} must be at least 1"));
            }
        }
        if self.election_ticks <= self.heartbeat_ticks {
            return Err("election_ticks must be greater than heartbeat_ticks".into());
        }
        if self.tick_interval.is_zero() {
            return Err("tick_interval must be positive".into());
        }
        if self.liveness_timeout.is_zero() {
            return Err("liveness_timeout must be positive".into());
        }
        if self.max_command_bytes > self.proposal_queue_capacity_bytes {
            return Err("max_command_bytes must not exceed proposal_queue_capacity_bytes".into());
        }
        if self.max_command_bytes > self.max_entry_bytes {
            return Err("max_command_bytes must not exceed max_entry_bytes".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_budget_is_shared_by_the_groups() {
        let mut config = NodeConfig::new(1, vec![1], (0..16).collect());
        config.log_keep_bytes = 64 * 1024;
        assert_eq!(config.log_keep().bytes, 4 * 1024);
        assert_eq!(config.log_keep().entries, config.log_keep_entries);
        // Never a zero share, however many groups.
        config.log_keep_bytes = 1;
        assert_eq!(config.log_keep().bytes, 1);
    }

    #[test]
    fn a_zero_liveness_timeout_is_refused_even_without_sleeping_groups() {
        // Every voter would count as down: no hand-over on a stop, no balance.
        let mut config = NodeConfig::new(1, vec![1, 2, 3], vec![0]);
        config.sleep_after_ticks = 0;
        config.liveness_timeout = Duration::ZERO;
        assert_eq!(
            config.validate(),
            Err("liveness_timeout must be positive".to_string())
        );
        config.liveness_timeout = Duration::from_millis(1);
        assert_eq!(config.validate(), Ok(()));
    }
}
