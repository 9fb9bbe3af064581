//! Whether a log write waits for the disk.

/// What [`crate::LogStore::write`] guarantees when it returns.
///
/// A store is opened with one mode and keeps it: the consensus layer's promise that "nothing is
/// acknowledged before it is durable" holds only under [`SyncMode::Sync`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SyncMode {
    /// Every write batch is on stable storage when `write` returns, at the cost of one sync
    /// per batch (however many groups the batch touches); a batch that only moves commit
    /// indexes waits for the next sync instead (see [`crate::LogStore`]'s contract).
    Sync,
    /// Writes reach the backend but nobody waits for the disk; a crash may lose recent batches.
    /// This is the shape of in-memory benchmarks, and never a production setting.
    NoSync,
}

impl SyncMode {
    /// `true` for [`SyncMode::Sync`].
    pub fn is_sync(self) -> bool {
        matches!(self, SyncMode::Sync)
    }
}
