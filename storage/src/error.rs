//! The one error type of the storage layer.

use std::path::PathBuf;

use crate::GroupId;

/// Why a storage call failed.
///
/// Callers branch on the variant: [`StorageError::Compacted`] and [`StorageError::Unavailable`]
/// are the answers raft-rs expects for reads outside the stored range and are converted to its
/// own error type by `From`; [`StorageError::InvalidRequest`] is a bug in the caller; everything
/// else means the store can no longer be trusted and the group using it must stop.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// The requested log index is below the first stored index: it was compacted away.
    #[error("group {group}: log index {index} is compacted (first index is {first_index})")]
    Compacted {
        /// The group whose log was read.
        group: GroupId,
        /// The index that was asked for.
        index: u64,
        /// The first index still stored.
        first_index: u64,
    },

    /// The requested log index is above the last stored index.
    #[error("group {group}: log index {index} is unavailable (last index is {last_index})")]
    Unavailable {
        /// The group whose log was read.
        group: GroupId,
        /// The index that was asked for.
        index: u64,
        /// The last index stored.
        last_index: u64,
    },

    /// The call itself was wrong (a gap in appended entries, an empty range turned around, an
    /// applied index going backwards). Nothing was written.
    #[error("invalid request: {reason}")]
    InvalidRequest {
        /// What was wrong with the request.
        reason: String,
    },

    /// A key, value or batch is larger than the store accepts. Nothing was written.
    #[error("{what} is {actual_bytes} bytes, over the limit of {limit_bytes} bytes")]
    TooLarge {
        /// What was too large ("key", "value", ...).
        what: &'static str,
        /// Its size.
        actual_bytes: usize,
        /// The limit.
        limit_bytes: usize,
    },

    /// An operating-system I/O call failed.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// Stored data failed a check: a checksum, a decode, or a structural invariant such as a
    /// hole in a log. The data directory needs attention; nothing was silently dropped.
    #[error("corrupted data in {path}: {detail}")]
    Corrupted {
        /// The file or directory holding the bad data.
        path: PathBuf,
        /// What check failed, and where.
        detail: String,
    },

    /// The data directory was written by an incompatible format version or another backend.
    #[error("incompatible data directory {path}: {detail}")]
    IncompatibleFormat {
        /// The data directory.
        path: PathBuf,
        /// What does not match.
        detail: String,
    },

    /// A state snapshot stream is malformed: bad magic, truncated, out of order or failing its
    /// checksum. Nothing was restored.
    #[error("invalid snapshot stream: {detail}")]
    InvalidSnapshot {
        /// What is wrong with the stream.
        detail: String,
    },

    /// Writing a state store's commits beneath it failed at an earlier flush; the store takes
    /// no more writes. Reopening it recovers from its last good flush, and the raft log replays
    /// what came after.
    #[error("an earlier flush of the state failed, so no more writes are taken: {detail}")]
    FlushFailed {
        /// Why that flush failed.
        detail: String,
    },

    /// The backend library (redb or sled) reported an error.
    #[error("{backend} error on {path}: {detail}")]
    Backend {
        /// Which backend.
        backend: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The backend's own message.
        detail: String,
    },
}

impl StorageError {
    /// Shorthand for [`StorageError::InvalidRequest`].
    pub(crate) fn invalid(reason: impl Into<String>) -> Self {
        StorageError::InvalidRequest {
            reason: reason.into(),
        }
    }

    /// Shorthand for [`StorageError::Corrupted`].
    pub(crate) fn corrupted(path: impl Into<PathBuf>, detail: impl Into<String>) -> Self {
        StorageError::Corrupted {
            path: path.into(),
            detail: detail.into(),
        }
    }
}

/// raft-rs reacts to `Compacted` and `Unavailable` specially (it sends a snapshot, or waits);
/// every other failure stops the raft group, which is what an unusable store must do.
impl From<StorageError> for raft::Error {
    fn from(error: StorageError) -> Self {
        match error {
            StorageError::Compacted { .. } => raft::Error::Store(raft::StorageError::Compacted),
            StorageError::Unavailable { .. } => raft::Error::Store(raft::StorageError::Unavailable),
            other => raft::Error::Store(raft::StorageError::Other(Box::new(other))),
        }
    }
}

/// Result of a storage call.
pub type StorageResult<T> = Result<T, StorageError>;
