//! The node loop: one worker skeleton for [`crate::RaftNode`] and [`crate::SoloNode`].
//!
//! A node's groups are spread over worker threads (`group % workers`). Each worker runs the
//! round of `worker.rs` over its groups — inbox, proposals, clock, one log write and one sync
//! for all of them, hand-off to its apply thread, timeouts — and drives each group's
//! [`replica::Replica`], where raft and solo differ: `raft_node/replica/` wraps a raft-rs
//! `RawNode`, `solo.rs` appends without replication.

pub(crate) mod event_lines;
pub(crate) mod forward_tag;
pub(crate) mod group;
pub(crate) mod install_marks;
mod leadership;
pub(crate) mod log_sync_record;
pub(crate) mod log_write_clock;
pub(crate) mod peer_reading;
mod position_set;
mod proposal_wave;
mod recovery;
pub(crate) mod replica;
mod returning_peers;
mod sleepers;
pub(crate) mod snapshot_install;
mod worker;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use concord_storage::{GroupId, StorageError, Stores};
use parking_lot::Mutex;

use crate::entrance::Entrance;
use crate::log_compaction::EntrySizes;
use crate::transport::Transport;
use crate::{NodeConfig, StartError, StateMachineFactory};
use group::{Group, GroupState};
use install_marks::InstallMarks;
use log_write_clock::LogWriteClock;
use replica::Replica;
use snapshot_install::SnapshotFiles;
use worker::WorkerParts;

/// State shared by a node's handle, its workers and (for raft) its peers.
pub(crate) struct NodeShared {
    pub(crate) config: NodeConfig,
    pub(crate) entrance: Entrance,
    /// Members some group removed: the network forgets each once no group of this node has
    /// it any more (the first worker checks on every tick).
    pub(crate) peers_removed: Mutex<Vec<crate::NodeId>>,
    /// When each worker's log write in progress began.
    pub(crate) log_writes: LogWriteClock,
    /// A worker stopped its groups for a failure (a log write or read that failed, a round
    /// that panicked); they stay stopped until the node restarts.
    pub(crate) worker_failed: AtomicBool,
    /// The first failed read of the log (`raft_node/storage.rs`), for every worker to stop on.
    pub(crate) log_read_failure: LogReadFailure,
}

/// The first read of a node's log that failed, shared by all its groups: once set, the log
/// can no longer be trusted, and the node's workers stop their groups.
pub(crate) type LogReadFailure = Arc<OnceLock<StorageError>>;

impl NodeShared {
    pub(crate) fn new(config: NodeConfig) -> Self {
        NodeShared {
            entrance: Entrance::new(&config),
            log_writes: LogWriteClock::new(config.workers),
            config,
            peers_removed: Mutex::default(),
            worker_failed: AtomicBool::new(false),
            log_read_failure: LogReadFailure::default(),
        }
    }
}

/// Opens every group of the node, each replica through `open_replica(group, applied index)`,
/// and starts each worker with its apply thread; returns their threads. If any group fails to
/// open, the workers already started are stopped again.
pub(crate) fn start_workers<R: Replica>(
    shared: &Arc<NodeShared>,
    stores: &Stores,
    factory: &Arc<dyn StateMachineFactory>,
    transport: Option<Arc<dyn Transport>>,
    kind: &'static str,
    mut open_replica: impl FnMut(GroupId, u64) -> Result<R, StartError>,
) -> Result<Vec<JoinHandle<()>>, StartError> {
    let known_peers = transport
        .as_ref()
        .map(|transport| transport.known_peers())
        .unwrap_or_default();
    let record = shared.config.log_sync_record.as_deref();
    let log_synced_before = match record {
        Some(path) => log_sync_record::read(path)?,
        None => None,
    };
    recovery::check_logs_against_state(
        stores,
        &shared.config,
        &known_peers,
        log_synced_before == Some(true),
    )?;
    if let Some(path) = record {
        log_sync_record::record_this_run(path, stores, log_synced_before)?;
    }
    let snapshot_files = Arc::new(
        SnapshotFiles::open(shared.config.snapshot_dir.as_deref(), shared.config.node_id)
            .map_err(StartError::Thread)?,
    );
    let install_marks = Arc::new(InstallMarks::new(shared.config.snapshot_dir.as_deref()));
    let mut threads = Vec::new();
    for index in 0..shared.config.workers {
        let started =
            open_worker_groups(shared, stores, index, &mut open_replica).and_then(|groups| {
                let parts = WorkerParts {
                    index,
                    shared: shared.clone(),
                    stores: stores.clone(),
                    factory: factory.clone(),
                    transport: transport.clone(),
                    snapshot_files: snapshot_files.clone(),
                    install_marks: install_marks.clone(),
                    kind,
                };
                worker::spawn(parts, groups)
            });
        match started {
            Ok(worker_threads) => threads.extend(worker_threads),
            Err(error) => {
                shared.entrance.shutdown(&Mutex::new(threads));
                return Err(error);
            }
        }
    }
    Ok(threads)
}

fn open_worker_groups<R: Replica>(
    shared: &NodeShared,
    stores: &Stores,
    index: usize,
    open_replica: &mut impl FnMut(GroupId, u64) -> Result<R, StartError>,
) -> Result<Vec<Group<R>>, StartError> {
    let mut groups = Vec::new();
    let size_step_bytes = shared.config.log_keep().size_step_bytes();
    for (group, handle) in shared.entrance.worker_groups(index) {
        let applied = stores.state.applied_index(group)?;
        let replica = open_replica(group, applied)?;
        handle.status.opened(applied, stores.log.last_index(group)?);
        let state = GroupState::new(
            group,
            handle.queue.clone(),
            handle.status.clone(),
            applied,
            EntrySizes::new(size_step_bytes),
        );
        groups.push(Group { state, replica });
    }
    Ok(groups)
}
