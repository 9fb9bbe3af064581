//! Why a node could not start.

use concord_storage::raft;
use concord_storage::{GroupId, StorageError};

/// A node failed to start; nothing is running.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// A setting is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The stores could not be read.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// raft-rs refused a group's recovered state.
    #[error("raft refused the state of group {group}: {source}")]
    Raft {
        /// The group.
        group: GroupId,
        /// What raft-rs said.
        source: raft::Error,
    },
    /// A group's state has applied less than its log has compacted away: the entries between
    /// are in neither, so the group cannot be rebuilt from this node's data. It happens when
    /// the state's file was lost, or replaced by an older copy, while the log was kept.
    #[error(
        "group {group}: the state has applied through index {applied_index}, but the log was compacted through {log_compacted_index}: the entries between are lost (was the state's file removed or replaced by an older copy?). Restore the data directory from a backup, or, on a member of a cluster, empty it and start the node again with its old id as one joining a running cluster: it rejoins through a snapshot"
    )]
    StateBehindLog {
        /// The group.
        group: GroupId,
        /// The state's applied index.
        applied_index: u64,
        /// The last index the log compacted away.
        log_compacted_index: u64,
    },
    /// A group's log has lost its term and vote (its files were lost) while its state has
    /// applied entries, on a node that is not alone (the group names other voters, or the
    /// network knows other nodes): this member may have voted and acknowledged entries it no
    /// longer knows of, and voting again could help elect a leader that lacks committed
    /// writes; its configuration, lost with the log, could let it elect itself alone.
    #[error(
        "group {group}: the state has applied through index {applied_index}, but the log holds no term or vote (were its files lost?): this member could vote again in a term it already voted in, or, its configuration lost too, elect itself alone. Empty the data directory and start the node again with its old id as one joining a running cluster: it rejoins through a snapshot and votes only once caught up"
    )]
    LogLost {
        /// The group.
        group: GroupId,
        /// The state's applied index.
        applied_index: u64,
    },
    /// On a node alone, a group's state has applied past the end of its log although the log
    /// synced every write since it last matched the state (the data directory's
    /// [`LOG_SYNC_FILE`](crate::LOG_SYNC_FILE) record says so): the log lost writes it had
    /// acknowledged, its files damaged, removed or replaced by an older copy. Starting from
    /// the state would serve it without them.
    #[error(
        "group {group}: the state has applied through index {applied_index}, but the log ends at index {log_last_index}, and {record} records that the log synced every write since it last matched the state: the log lost writes it had acknowledged ({groups} groups in all; were its files damaged, removed or replaced by an older copy?). Restore the data directory from a backup; or, to start from the state as it is and lose the writes acknowledged after the state's last flush, remove {record} and start again"
    )]
    SyncedLogLost {
        /// The first such group.
        group: GroupId,
        /// Its state's applied index.
        applied_index: u64,
        /// Its log's last index.
        log_last_index: u64,
        /// How many groups lost synced writes.
        groups: usize,
        /// The record that says the log was synced.
        record: std::path::PathBuf,
    },
    /// A thread could not be started.
    #[error("cannot start a thread: {0}")]
    Thread(#[source] std::io::Error),
}
