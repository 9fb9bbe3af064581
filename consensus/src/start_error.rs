//! Why a node could not start.

use concord_storage::StorageError;

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
    /// raft-rs refused the recovered state.
    #[error("raft: {0}")]
    Raft(String),
    /// A thread could not be started.
    #[error("cannot start a thread: {0}")]
    Thread(String),
}
