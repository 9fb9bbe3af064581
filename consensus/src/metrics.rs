//! The write path's measurements, with the `metrics` crate: prefix `concord_`, histograms in
//! seconds, one per segment (queue wait, log append and sync, commit wait, apply, the whole
//! write), so that a slow write can be placed in one segment.
//!
//! Handles are created once (labels are allocated then, not per command); without an
//! installed recorder every call is a no-op. The histograms and the refusal counter are the
//! node's (one series whatever the group count), held by the threads that record them; the
//! per-group gauges exist only on a node of at most [`PER_GROUP_GAUGES_MAX_GROUPS`] groups —
//! beyond, a scrape would carry thousands of series per gauge, and `/v1/status` has every
//! group's figures anyway.

use std::time::Duration;

use concord_storage::GroupId;
use metrics::{Counter, Gauge, Histogram};

use crate::NodeId;

/// `concord_proposal_queue_wait_seconds`: enqueue → drained into a raft entry. Taken once per
/// round and recorded per command: looking a metric up in the recorder costs more than
/// recording it, and a round drains thousands of groups' queues.
pub(crate) fn proposal_queue_wait() -> Histogram {
    metrics::histogram!("concord_proposal_queue_wait_seconds")
}

/// `concord_raft_log_append_batch_duration_seconds` and `..._entries`: one LogStore write
/// (including its sync) per poll round, over all the worker's groups.
pub(crate) fn log_append_batch(duration: Duration, entries: usize) {
    metrics::histogram!("concord_raft_log_append_batch_duration_seconds")
        .record(duration.as_secs_f64());
    metrics::histogram!("concord_raft_log_append_batch_entries").record(entries as f64);
}

/// `concord_raft_slow_log_writes_total`: log writes slower than `slow_log_write` (each
/// hands the worker's leaderships over).
pub(crate) fn slow_log_write() {
    metrics::counter!("concord_raft_slow_log_writes_total").increment(1);
}

/// The round-trip time to `peer` as a leader sees it: from a heartbeat leaving this node's
/// raft loop to its answer being stepped (both nodes' loops included).
pub(crate) fn peer_round_trip(peer: NodeId) -> Histogram {
    metrics::histogram!("concord_peer_round_trip_seconds", "peer" => peer.to_string())
}

/// `concord_raft_dropped_messages_total{reason}`: peer messages dropped (malformed, full inbox,
/// unknown group).
pub(crate) fn dropped_message(reason: &'static str) {
    metrics::counter!("concord_raft_dropped_messages_total", "reason" => reason).increment(1);
}

/// `concord_snapshot_installs_total{outcome}` and `concord_snapshot_install_duration_seconds`:
/// each fetched state the install thread took (`installed`: the group's state is at its index
/// or further on now; `failed`), and how long it took, the following flush included.
pub(crate) fn snapshot_install(duration: Duration, installed: bool) {
    let outcome = if installed { "installed" } else { "failed" };
    metrics::counter!("concord_snapshot_installs_total", "outcome" => outcome).increment(1);
    metrics::histogram!("concord_snapshot_install_duration_seconds").record(duration.as_secs_f64());
}

/// `concord_snapshot_fetch_duration_seconds{outcome}`: how long each state fetched from a
/// member took: its share of its fetch (which carries up to
/// `snapshot_install::MAX_STATES_PER_FETCH` states on one connection), from the connection's
/// opening to the last file's last byte, its outcome `fetched`, `refused` by the member or
/// `failed` in the transfer.
pub(crate) fn snapshot_fetch(duration: Duration, outcome: &'static str) {
    metrics::histogram!("concord_snapshot_fetch_duration_seconds", "outcome" => outcome)
        .record(duration.as_secs_f64());
}

/// `concord_snapshots_not_installed_total{reason}`: states this node asked a member for and
/// did not install (`refused`: the member could not serve it now, as happens while members
/// catch up; `failed`: the transfer or the install went wrong). Each is asked for again.
pub(crate) fn snapshot_not_installed(refused: bool) {
    let reason = if refused { "refused" } else { "failed" };
    metrics::counter!("concord_snapshots_not_installed_total", "reason" => reason).increment(1);
}

/// Runtime gauges of the raft threads: busy ratio per worker, queued work, live threads.
pub(crate) struct RuntimeMetrics {
    pub(crate) busy_ratio: Gauge,
    pub(crate) global_queue_depth: Gauge,
    pub(crate) alive_tasks: Gauge,
}

impl RuntimeMetrics {
    pub(crate) fn new(node: u64, worker: usize) -> Self {
        let node = node.to_string();
        let worker = worker.to_string();
        RuntimeMetrics {
            busy_ratio: metrics::gauge!("concord_runtime_busy_ratio", "runtime" => "raft", "node" => node.clone(), "worker" => worker),
            global_queue_depth: metrics::gauge!("concord_runtime_global_queue_depth", "runtime" => "raft", "node" => node.clone()),
            alive_tasks: metrics::gauge!("concord_runtime_alive_tasks", "runtime" => "raft", "node" => node),
        }
    }
}

/// The most groups a node may have for its per-group gauges to be published.
pub(crate) const PER_GROUP_GAUGES_MAX_GROUPS: usize = 64;

/// One group's gauges, published only on a node of at most [`PER_GROUP_GAUGES_MAX_GROUPS`]
/// groups. Beyond, a group has none, and publishing an index costs the round nothing more
/// than the store of the index itself.
pub(crate) struct GroupGauges {
    /// `concord_raft_apply_lag{group}`: last log index − applied.
    pub(crate) apply_lag: Gauge,
    /// `concord_raft_last_log_index{group}`.
    pub(crate) last_log_index: Gauge,
    /// `concord_raft_last_applied{group}`.
    pub(crate) last_applied: Gauge,
    /// `concord_raft_leader{group}`: the leader's node id (0 = none).
    pub(crate) leader: Gauge,
    /// `concord_raft_term{group}`.
    pub(crate) term: Gauge,
}

impl GroupGauges {
    pub(crate) fn new(group: GroupId) -> Self {
        let gauge = |name: &'static str| metrics::gauge!(name, "group" => group.to_string());
        GroupGauges {
            apply_lag: gauge("concord_raft_apply_lag"),
            last_log_index: gauge("concord_raft_last_log_index"),
            last_applied: gauge("concord_raft_last_applied"),
            leader: gauge("concord_raft_leader"),
            term: gauge("concord_raft_term"),
        }
    }

    /// `apply_lag` from the last log index and the applied index.
    pub(crate) fn set_apply_lag(&self, last_log_index: u64, applied_index: u64) {
        self.apply_lag
            .set(last_log_index.saturating_sub(applied_index) as f64);
    }
}

/// The apply thread's histograms, one series each for the node, looked up once by the thread
/// (not kept per group: a group's handles would be one more cache line per group and round).
pub(crate) struct ApplyMetrics {
    /// `concord_raft_write_duration_seconds`: propose → answer.
    pub(crate) write_duration: Histogram,
    /// `concord_raft_apply_batch_duration_seconds`: one sample per apply round (every group
    /// it applied, one state-store commit), from its start to its commit.
    pub(crate) apply_batch_duration: Histogram,
    /// `concord_raft_apply_batch_entries`: entries an apply round applied, over its groups.
    pub(crate) apply_batch_entries: Histogram,
}

impl ApplyMetrics {
    pub(crate) fn new() -> Self {
        ApplyMetrics {
            write_duration: metrics::histogram!("concord_raft_write_duration_seconds"),
            apply_batch_duration: metrics::histogram!("concord_raft_apply_batch_duration_seconds"),
            apply_batch_entries: metrics::histogram!("concord_raft_apply_batch_entries"),
        }
    }
}

/// `concord_raft_commit_wait_seconds`: persisted → committed. Taken once per round, like the
/// queue wait.
pub(crate) fn commit_wait() -> Histogram {
    metrics::histogram!("concord_raft_commit_wait_seconds")
}

/// `concord_raft_lease_reads_total{served}`: reads asked at the lease level, `served="lease"`
/// from a leader's lease, `served="quorum"` through a read index (a follower, or a leader
/// without a lease: cut off, new, asleep, or handing over). Counted once per round.
pub(crate) fn lease_reads(from_lease: u64, through_quorum: u64) {
    if from_lease > 0 {
        metrics::counter!("concord_raft_lease_reads_total", "served" => "lease")
            .increment(from_lease);
    }
    if through_quorum > 0 {
        metrics::counter!("concord_raft_lease_reads_total", "served" => "quorum")
            .increment(through_quorum);
    }
}

/// `concord_raft_proposals_refused_total{reason="overloaded"}`.
pub(crate) fn overloaded() -> Counter {
    metrics::counter!("concord_raft_proposals_refused_total", "reason" => "overloaded")
}
