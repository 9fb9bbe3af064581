//! The thread that reads the sessions a node stored before it started into its
//! [`ExpiryIndex`], one main group after another, each from one consistent view of its state
//! (`StateStore::snapshot`): what is written after a view was taken is recorded as it is
//! applied. Until a group is read whole, scans walk it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use concord_storage::{StateStore, StorageError};

use crate::expiry_index::{ExpiryIndex, SessionWrite};

/// The thread that reads the sessions stored before a node started into its index.
#[derive(Debug)]
pub(crate) struct IndexBuilder {
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl IndexBuilder {
    /// Starts reading every main group of `index` from `state`, group after group.
    pub(crate) fn start(
        index: Arc<ExpiryIndex>,
        state: Arc<dyn StateStore>,
    ) -> std::io::Result<IndexBuilder> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("concord-expiry-index".into())
            .spawn(move || {
                // Its deadline is loose: until it is done, scans walk.
                concord_storage::lower_this_threads_priority();
                build(&index, state.as_ref(), &stopping);
            })?;
        Ok(IndexBuilder {
            stop,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Stops the thread (at its next session) and waits for it: it holds a view of the store.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(thread) = thread
            && thread.join().is_err()
        {
            tracing::error!("the expiry index's builder panicked");
        }
    }
}

fn build(index: &ExpiryIndex, state: &dyn StateStore, stop: &AtomicBool) {
    // A failing store fails every group alike: one line says how many, with the first error.
    let mut unreadable_groups = 0usize;
    let mut first_error = None;
    let mut unreadable = |group, error: StorageError| {
        tracing::debug!(group, %error, "reading sessions for the expiry index; scans walk the group");
        unreadable_groups += 1;
        first_error.get_or_insert((group, error));
    };
    'groups: for group in index.main_groups() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let epoch = index.build_started(group);
        let snapshot = match state.snapshot(group) {
            Ok(snapshot) => snapshot,
            Err(error) => {
                unreadable(group, error);
                continue;
            }
        };
        for record in snapshot.records {
            if stop.load(Ordering::Acquire) {
                return;
            }
            match record {
                Ok((key, value)) => {
                    if let Some(SessionWrite::Expires(client_id, expiry)) =
                        SessionWrite::of(&key, Some(&value))
                    {
                        index.learn(group, client_id, expiry);
                    }
                }
                Err(error) => {
                    unreadable(group, error);
                    continue 'groups;
                }
            }
        }
        index.built(group, epoch);
    }
    if let Some((first_group, error)) = first_error {
        tracing::warn!(
            groups = unreadable_groups,
            first_group,
            %error,
            "reading sessions for the expiry index failed; scans walk these groups"
        );
    }
}
