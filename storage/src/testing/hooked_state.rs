//! A state store (in memory, or one given) with a hook before its reads, commits, flushes and
//! restores: a disk that fails, or one that stalls, for the tests of what sits above a state
//! store.

use std::sync::Arc;

use crate::{
    GroupCommit, GroupId, GroupRestore, KeyRange, KeyValue, MemStateStore, StateSnapshot,
    StateStore, StorageResult, WriteSet,
};

/// Which call of a [`HookedState`] is about to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateCall {
    /// `get` or `scan`.
    Read,
    /// `commit` or `commit_groups`.
    Commit,
    /// `flush`.
    Flush,
    /// `for_each_key`.
    Keys,
    /// `restore` or `restore_groups`, of this many groups (restored together).
    Restore {
        /// The groups the call restores.
        groups: usize,
    },
}

/// The hook: an error fails the call, and the call waits while the hook runs.
pub type StateHook = Box<dyn Fn(StateCall) -> StorageResult<()> + Send + Sync>;

/// A state store (an empty [`MemStateStore`], or one given) that runs a hook before each
/// read, commit, flush, key walk and restore.
pub struct HookedState {
    inner: Arc<dyn StateStore>,
    hook: StateHook,
}

impl HookedState {
    /// An empty store calling `hook`.
    pub fn new(hook: StateHook) -> HookedState {
        HookedState::over(Arc::new(MemStateStore::new()), hook)
    }

    /// `inner`, with what it holds, calling `hook`.
    pub fn over(inner: Arc<dyn StateStore>, hook: StateHook) -> HookedState {
        HookedState { inner, hook }
    }
}

impl StateStore for HookedState {
    fn get(&self, group: GroupId, key: &[u8]) -> StorageResult<Option<Vec<u8>>> {
        (self.hook)(StateCall::Read)?;
        self.inner.get(group, key)
    }
    fn scan(&self, group: GroupId, range: &KeyRange, limit: usize) -> StorageResult<Vec<KeyValue>> {
        (self.hook)(StateCall::Read)?;
        self.inner.scan(group, range, limit)
    }
    fn applied_index(&self, group: GroupId) -> StorageResult<u64> {
        self.inner.applied_index(group)
    }
    fn commit(&self, group: GroupId, writes: WriteSet, applied_index: u64) -> StorageResult<()> {
        (self.hook)(StateCall::Commit)?;
        self.inner.commit(group, writes, applied_index)
    }
    fn commit_groups(&self, commits: Vec<GroupCommit>) -> StorageResult<()> {
        (self.hook)(StateCall::Commit)?;
        self.inner.commit_groups(commits)
    }
    fn flush(&self) -> StorageResult<()> {
        (self.hook)(StateCall::Flush)?;
        self.inner.flush()
    }
    fn snapshot(&self, group: GroupId) -> StorageResult<StateSnapshot<'_>> {
        self.inner.snapshot(group)
    }
    fn for_each_key(&self, group: GroupId, visit: &mut dyn FnMut(&[u8])) -> StorageResult<()> {
        (self.hook)(StateCall::Keys)?;
        self.inner.for_each_key(group, visit)
    }
    fn restore_groups(&self, restores: &mut [GroupRestore<'_>]) -> StorageResult<()> {
        (self.hook)(StateCall::Restore {
            groups: restores.len(),
        })?;
        self.inner.restore_groups(restores)
    }
    fn groups(&self) -> StorageResult<Vec<GroupId>> {
        self.inner.groups()
    }
}
