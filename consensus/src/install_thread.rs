//! The thread that installs an apply stage's fetched snapshots.
//!
//! A thread of its own, so that the stage's other groups go on applying while a large state is
//! written; one that lives on, so that what an install allocates is there for the next one to
//! reuse. It takes every install queued when it looks (up to a count and a size), and installs
//! them together (`snapshot_install::install_all`): one synced mark, one restore and one flush
//! of the state store for all of them, where one each would make a member that catches up
//! many groups pay a few syncs per group.
//!
//! A stopping node waits for the installs under way (they are all or nothing, and not to be cut
//! short) but begins none of those waiting behind them: each could take as long again, and the
//! leader sends a snapshot again once the node is back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::time::Instant;

use concord_storage::{GroupId, StateStore};

use crate::mailbox::{SnapshotEvent, SnapshotFailure};
use crate::node_loop::install_marks::InstallMarks;
use crate::node_loop::snapshot_install::{self, FetchedState};
use crate::status::SharedGroupStatus;

/// Installs that may wait for the install thread, and the most it takes into one batch. Past
/// it, the apply thread waits to hand one over until the install thread takes the next batch:
/// fetches go on while installs run, so a member catching up many groups fills the queue.
const INSTALLS_QUEUED: usize = 16;

/// The fetched states' bytes at which the thread takes no more installs into a batch, which so
/// holds at most this and one state more: the store may hold a batch's restores in memory until
/// their one commit.
const MAX_BATCH_BYTES: u64 = 16 * 1024 * 1024;

/// An install handed to the install thread: the fetched state, and the status the group's
/// new applied index is published in.
pub(crate) struct InstallJob {
    pub(crate) state: FetchedState,
    pub(crate) status: Arc<SharedGroupStatus>,
}

/// Tells the raft worker how an install went.
pub(crate) type InstallReport = Arc<dyn Fn(GroupId, SnapshotEvent) + Send + Sync>;

/// What every install of the thread writes to and whom it tells.
pub(crate) struct InstallTarget {
    pub(crate) store: Arc<dyn StateStore>,
    pub(crate) marks: Arc<InstallMarks>,
    pub(crate) report: InstallReport,
}

/// The running thread and the way to it.
pub(crate) struct Installer {
    jobs: SyncSender<InstallJob>,
    stopping: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Installer {
    /// Starts the thread, named `name`.
    pub(crate) fn spawn(name: String, target: InstallTarget) -> std::io::Result<Installer> {
        let (jobs, inbox) = std::sync::mpsc::sync_channel::<InstallJob>(INSTALLS_QUEUED);
        let stopping = Arc::new(AtomicBool::new(false));
        let stopping_seen = stopping.clone();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || run(&inbox, &stopping_seen, &target))?;
        Ok(Installer {
            jobs,
            stopping,
            thread,
        })
    }

    /// Queues `job`, waiting while the queue is full; hands it back if the thread is gone.
    pub(crate) fn send(&self, job: InstallJob) -> Result<(), InstallJob> {
        self.jobs.send(job).map_err(|error| error.0)
    }

    /// Lets the installs under way finish, fails those waiting, and waits for the thread.
    pub(crate) fn stop(self) {
        self.stopping.store(true, Ordering::Release);
        drop(self.jobs);
        let _ = self.thread.join();
    }
}

fn run(inbox: &Receiver<InstallJob>, stopping: &AtomicBool, target: &InstallTarget) {
    while let Ok(first) = inbox.recv() {
        let mut batch_bytes = fetched_bytes(&first);
        let mut batch = vec![first];
        while batch.len() < INSTALLS_QUEUED && batch_bytes < MAX_BATCH_BYTES {
            let Ok(job) = inbox.try_recv() else {
                break;
            };
            batch_bytes += fetched_bytes(&job);
            batch.push(job);
        }
        if stopping.load(Ordering::Acquire) {
            for job in batch {
                let skipped = "the node stopped before installing it".to_string();
                let failed = snapshot_install::abandon(&job.state.path, skipped);
                (target.report)(job.state.group, failed);
            }
            continue;
        }
        install_batch(batch, target);
    }
}

/// The size of `job`'s fetched state on disk (0 if it cannot be read: its install fails).
fn fetched_bytes(job: &InstallJob) -> u64 {
    std::fs::metadata(&job.state.path).map_or(0, |meta| meta.len())
}

fn install_batch(batch: Vec<InstallJob>, target: &InstallTarget) {
    let started = Instant::now();
    let (states, statuses): (Vec<FetchedState>, Vec<Arc<SharedGroupStatus>>) =
        batch.into_iter().map(|job| (job.state, job.status)).unzip();
    let outcomes = snapshot_install::install_all(target.store.as_ref(), &target.marks, &states);
    // Each install's share of the batch's time, so that the times add up to the thread's.
    let share = started.elapsed() / u32::try_from(states.len()).unwrap_or(u32::MAX);
    for ((state, status), outcome) in states.iter().zip(statuses).zip(outcomes) {
        crate::metrics::snapshot_install(share, outcome.is_ok());
        let event = match outcome {
            Ok(index) => {
                status.set_applied(index);
                status
                    .durable_applied_index
                    .fetch_max(index, Ordering::AcqRel);
                SnapshotEvent::Installed(index)
            }
            Err(reason) => {
                SnapshotEvent::Failed(SnapshotFailure::Broken(format!("installing: {reason}")))
            }
        };
        (target.report)(state.group, event);
    }
}
