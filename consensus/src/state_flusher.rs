//! The state flusher: a thread that makes the state store durable while the apply thread goes
//! on applying.
//!
//! A flush can take long (on redb it writes every commit since the last one, then syncs). Run
//! on the apply thread, it held every caller of the node for that time. Here
//! the apply thread only asks for a flush, with the applied index of each group as of the
//! asking; once the store reports every earlier commit durable, this thread publishes those
//! indexes as the groups' durable applied indexes, below which the raft worker may compact the
//! log. A store whose flush cannot run beside commits (plain redb: one writer) makes the next
//! commit wait for it, no worse than flushing on the apply thread.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;
use std::time::Instant;

use concord_storage::{GroupId, StateStore};
use metrics::Histogram;

use crate::id_map::IdMap;
use crate::status::{SharedGroupStatus, stop_groups};

/// Groups' applied indexes as of a flush request.
type AppliedIndexes = Vec<(GroupId, u64)>;

/// What a flush needs, shared by the thread and whoever flushes directly.
struct FlushParts {
    store: Arc<dyn StateStore>,
    statuses: IdMap<Arc<SharedGroupStatus>>,
    /// `concord_state_flush_duration_seconds`.
    flush_duration: Histogram,
}

/// A flush thread for one apply thread's groups.
pub(crate) struct StateFlusher {
    parts: Arc<FlushParts>,
    /// Room for one request; `None` once stopped.
    requests: Option<SyncSender<AppliedIndexes>>,
    /// A flush was asked for and has not finished.
    busy: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StateFlusher {
    /// Starts the thread, named `name`, for the groups of `statuses`.
    pub(crate) fn spawn(
        name: String,
        store: Arc<dyn StateStore>,
        statuses: IdMap<Arc<SharedGroupStatus>>,
    ) -> std::io::Result<StateFlusher> {
        let parts = Arc::new(FlushParts {
            store,
            statuses,
            flush_duration: metrics::histogram!("concord_state_flush_duration_seconds"),
        });
        let busy = Arc::new(AtomicBool::new(false));
        let (requests, inbox) = sync_channel::<AppliedIndexes>(1);
        let thread = {
            let parts = Arc::clone(&parts);
            let busy = Arc::clone(&busy);
            std::thread::Builder::new().name(name).spawn(move || {
                concord_storage::lower_this_threads_priority();
                for applied in inbox {
                    flush_and_publish(&parts, &applied);
                    busy.store(false, Ordering::Release);
                }
            })?
        };
        Ok(StateFlusher {
            parts,
            requests: Some(requests),
            busy,
            thread: Some(thread),
        })
    }

    /// Starts a flush that publishes `applied` as durable once done. `false` (and nothing
    /// started) while the previous flush still runs: the caller asks again later.
    pub(crate) fn try_start(&self, applied: &IdMap<u64>) -> bool {
        let Some(requests) = &self.requests else {
            return false;
        };
        if self.busy.swap(true, Ordering::AcqRel) {
            return false;
        }
        let indexes = applied.iter().map(|(&group, &index)| (group, index));
        match requests.try_send(indexes.collect()) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.busy.store(false, Ordering::Release);
                false
            }
        }
    }

    /// Waits for the running flush, stops the thread, then flushes once more on this thread
    /// and publishes `applied`: what the caller applied last is durable when this returns.
    pub(crate) fn finish(&mut self, applied: &IdMap<u64>) {
        self.stop();
        let indexes: AppliedIndexes = applied.iter().map(|(&g, &i)| (g, i)).collect();
        flush_and_publish(&self.parts, &indexes);
    }

    fn stop(&mut self) {
        self.requests = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for StateFlusher {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Flushes the store; then publishes `applied` as the groups' durable applied indexes, or
/// stops every group if the flush failed.
fn flush_and_publish(parts: &FlushParts, applied: &[(GroupId, u64)]) {
    let started = Instant::now();
    let flushed = parts.store.flush();
    parts.flush_duration.record(started.elapsed().as_secs_f64());
    if let Err(error) = flushed {
        let reason = format!("state store flush failed: {error}");
        stop_groups(parts.statuses.values().map(|status| &**status), &reason);
        return;
    }
    for &(group, index) in applied {
        if let Some(status) = parts.statuses.get(&group) {
            // A snapshot installed meanwhile may have published a later index: keep it.
            status
                .durable_applied_index
                .fetch_max(index, Ordering::AcqRel);
        }
    }
}
