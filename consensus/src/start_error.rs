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
    /// A thread could not be started.
    #[error("cannot start a thread: {0}")]
    Thread(#[source] std::io::Error),
}
