//! [`SoloNode`]: one node, no raft. Commands are batched into entries, appended to the log
//! with one sync per round for all groups, and applied off the loop — the same pipeline as
//! [`crate::RaftNode`] without replication, so the two can be compared and raft's own cost
//! seen.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{SyncSender, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use concord_storage::raft::prelude::Entry;
use concord_storage::{GroupId, LogBatch, Stores};
use parking_lot::Mutex;

use crate::apply::{Applier, ApplyMessage, ProposedEntry};
use crate::entrance::Entrance;
use crate::id_map::IdMap;
use crate::log_compaction::{EntrySizes, LogKeep, compact_index, entry_payload_bytes};
use crate::mailbox::{Inbox, Mailbox};
use crate::pending::Responder;
use crate::proposal_queue::ProposalQueue;
use crate::status::SharedGroupStatus;
use crate::{
    Consensus, GroupStatus, NodeConfig, Pending, ProposeError, StartError, StateMachineFactory,
};

/// The term every solo entry carries: there are no elections.
const SOLO_TERM: u64 = 1;

struct SoloShared {
    config: NodeConfig,
    entrance: Entrance,
}

/// A single node that appends, syncs and applies without raft.
pub struct SoloNode {
    shared: Arc<SoloShared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl SoloNode {
    /// Opens every group from `stores`, re-applies logged entries the state has not seen, and
    /// starts the worker and apply threads. `config.voters` must be just this node.
    pub fn start(
        config: NodeConfig,
        stores: Stores,
        factory: Arc<dyn StateMachineFactory>,
    ) -> Result<Arc<SoloNode>, StartError> {
        config.validate().map_err(StartError::Config)?;
        if config.voters != [config.node_id] {
            return Err(StartError::Config(
                "a solo node's voters must be exactly itself".into(),
            ));
        }
        let entrance = Entrance::new(&config);
        for (&group, handle) in &entrance.groups {
            // Always the leader: there is nobody else.
            handle.status.set_leader(config.node_id, true, SOLO_TERM);
            handle
                .status
                .set_last_log_index(stores.log.last_index(group)?);
            let applied = stores.state.applied_index(group)?;
            handle
                .status
                .applied_index
                .store(applied, Ordering::Release);
            // What the state store holds at open is what survived: durable.
            handle
                .status
                .durable_applied_index
                .store(applied, Ordering::Release);
        }
        let shared = Arc::new(SoloShared { config, entrance });
        let mut threads = Vec::new();
        for index in 0..shared.config.workers {
            threads.extend(spawn_worker(index, &shared, &stores, &factory)?);
        }
        Ok(Arc::new(SoloNode {
            shared,
            threads: Mutex::new(threads),
        }))
    }
}

impl Consensus for SoloNode {
    fn propose(&self, group: GroupId, command: Bytes) -> Pending<Bytes> {
        self.shared.entrance.propose(group, command)
    }

    fn read_barrier(&self, group: GroupId) -> Pending<u64> {
        self.shared.entrance.read_barrier(group)
    }

    fn status(&self, group: GroupId) -> Result<GroupStatus, ProposeError> {
        self.shared.entrance.status(group)
    }

    fn groups(&self) -> Vec<GroupId> {
        self.shared.entrance.groups()
    }

    fn shutdown(&self) {
        self.shared.entrance.shutdown(&self.threads);
    }
}

impl Drop for SoloNode {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// One group on a solo worker.
struct SoloRuntime {
    id: GroupId,
    queue: Arc<ProposalQueue>,
    status: Arc<SharedGroupStatus>,
    last_index: u64,
    /// The first index still in the log (entries below it were compacted).
    first_index: u64,
    /// Sizes of the entries appended since start, for the byte bound of log compaction.
    entry_sizes: EntrySizes,
    more_queued: bool,
    /// Reads waiting for apply to reach the index that was last when they arrived.
    reads: Vec<(u64, Responder<u64>)>,
}

fn spawn_worker(
    index: usize,
    shared: &Arc<SoloShared>,
    stores: &Stores,
    factory: &Arc<dyn StateMachineFactory>,
) -> Result<Vec<JoinHandle<()>>, StartError> {
    let mut runtimes = Vec::new();
    let mut statuses = IdMap::default();
    let mut owned: Vec<GroupId> = shared
        .entrance
        .groups
        .iter()
        .filter(|(_, g)| g.worker == index)
        .map(|(&id, _)| id)
        .collect();
    owned.sort_unstable();
    for id in owned {
        let group = &shared.entrance.groups[&id];
        statuses.insert(id, group.status.clone());
        runtimes.push(SoloRuntime {
            id,
            queue: group.queue.clone(),
            status: group.status.clone(),
            last_index: stores.log.last_index(id)?,
            first_index: stores.log.group_state(id)?.first_index(),
            entry_sizes: EntrySizes::default(),
            more_queued: false,
            reads: Vec::new(),
        });
    }
    let mailbox = shared.entrance.mailboxes[index].clone();
    let wake = mailbox.clone();
    let applier = Applier {
        store: stores.state.clone(),
        factory: factory.clone(),
        statuses,
        on_applied: Box::new(move || wake.applied()),
        flush_interval: shared.config.state_flush_interval,
        idle_spin: shared.config.idle_spin,
    };
    let (apply_tx, apply_rx) = sync_channel(shared.config.apply_queue_capacity);
    // Entries logged but not applied before a restart are applied first.
    for runtime in &runtimes {
        let applied = stores.state.applied_index(runtime.id)?;
        if runtime.last_index > applied {
            let entries =
                stores
                    .log
                    .entries(runtime.id, applied + 1, runtime.last_index + 1, None)?;
            let _ = apply_tx.send(ApplyMessage::Apply {
                group: runtime.id,
                entries,
                proposals: Vec::new(),
            });
        }
    }
    let node = shared.config.node_id;
    let apply_thread = std::thread::Builder::new()
        .name(format!("concord-solo-apply-{node}-{index}"))
        .spawn(move || applier.run(apply_rx))
        .map_err(|e| StartError::Thread(e.to_string()))?;
    let shared = shared.clone();
    let stores = stores.clone();
    let worker_thread = std::thread::Builder::new()
        .name(format!("concord-solo-{node}-{index}"))
        .spawn(move || {
            let _ = mailbox.thread.set(std::thread::current());
            run_worker(&shared, &mailbox, &stores, runtimes, apply_tx);
        })
        .map_err(|e| StartError::Thread(e.to_string()))?;
    Ok(vec![worker_thread, apply_thread])
}

/// How often an idle solo worker checks whether a log can be compacted.
const COMPACTION_CHECK_INTERVAL: Duration = Duration::from_millis(100);

fn run_worker(
    shared: &SoloShared,
    mailbox: &Mailbox,
    stores: &Stores,
    mut runtimes: Vec<SoloRuntime>,
    apply_tx: SyncSender<ApplyMessage>,
) {
    let config = &shared.config;
    let positions: IdMap<usize> = runtimes
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id, i))
        .collect();
    let mut next_timeout_scan = Instant::now();
    let mut next_compaction_check = Instant::now();
    loop {
        let inbox: Inbox = mailbox.take();
        if inbox.shutdown {
            break;
        }
        let mut worked = false;
        for group in inbox.proposals {
            if let Some(&position) = positions.get(&group) {
                runtimes[position].more_queued = true;
            }
        }
        for (group, responder) in inbox.reads {
            if let Some(&position) = positions.get(&group) {
                let runtime = &mut runtimes[position];
                runtime.reads.push((runtime.last_index, responder));
                worked = true;
            }
        }
        // Drain each queue into one entry and log all groups' entries with one write.
        let mut batch = LogBatch::new();
        let mut appended: Vec<(usize, Entry, Vec<Responder<Bytes>>)> = Vec::new();
        let mut drained = Vec::new();
        for (position, runtime) in runtimes.iter_mut().enumerate() {
            if !runtime.more_queued || runtime.status.stopped_reason().is_some() {
                continue;
            }
            drained.clear();
            runtime.more_queued = runtime.queue.drain_entry(
                config.max_commands_per_entry,
                config.max_entry_bytes,
                &mut drained,
            );
            if drained.is_empty() {
                continue;
            }
            let mut entry = Entry::default();
            entry.index = runtime.last_index + 1;
            entry.term = SOLO_TERM;
            entry.data =
                crate::command_batch::encode(drained.iter().map(|q| q.command.as_ref())).into();
            runtime
                .entry_sizes
                .appended([(entry.index, entry_payload_bytes(&entry))]);
            batch.append(runtime.id, vec![entry.clone()]);
            runtime.last_index += 1;
            let responders = drained.drain(..).map(|q| q.responder).collect();
            appended.push((position, entry, responders));
        }
        // Compaction rides on a round's write, or every check interval when idle.
        let compactions = if !appended.is_empty() || Instant::now() >= next_compaction_check {
            next_compaction_check = Instant::now() + COMPACTION_CHECK_INTERVAL;
            plan_compactions(&runtimes, config.log_keep(), &mut batch)
        } else {
            Vec::new()
        };
        if !appended.is_empty() || !compactions.is_empty() {
            worked = true;
            let entry_count = batch.entry_count();
            let started = Instant::now();
            if let Err(error) = stores.log.write(batch) {
                let reason = format!("log write failed: {error}");
                for &(position, _) in &compactions {
                    runtimes[position].status.stop(reason.clone());
                }
                for (position, _, mut responders) in appended {
                    runtimes[position].status.stop(reason.clone());
                    for responder in &mut responders {
                        responder.answer(Err(ProposeError::Stopped {
                            group: runtimes[position].id,
                            reason: reason.clone(),
                        }));
                    }
                }
            } else {
                crate::metrics::log_append_batch(started.elapsed(), entry_count);
                for (position, compact_index) in compactions {
                    runtimes[position].first_index = compact_index;
                    runtimes[position].entry_sizes.compacted(compact_index);
                }
                for (position, entry, responders) in appended {
                    let runtime = &runtimes[position];
                    runtime.status.set_last_log_index(entry.index);
                    runtime
                        .status
                        .commit_index
                        .store(entry.index, Ordering::Release);
                    let proposals = vec![ProposedEntry {
                        index: entry.index,
                        term: SOLO_TERM,
                        responders,
                    }];
                    let message = ApplyMessage::Apply {
                        group: runtime.id,
                        entries: vec![entry],
                        proposals,
                    };
                    if apply_tx.send(message).is_err() {
                        runtime.status.stop("the apply thread stopped".into());
                    }
                }
            }
        }
        // Serve reads whose index has applied.
        let reads_waiting = runtimes.iter().any(|r| !r.reads.is_empty());
        mailbox
            .wake_on_apply
            .store(reads_waiting, Ordering::Release);
        for runtime in &mut runtimes {
            if runtime.reads.is_empty() {
                continue;
            }
            let applied = runtime.status.applied_index.load(Ordering::Acquire);
            runtime.reads.retain_mut(|(index, responder)| {
                if *index <= applied {
                    responder.answer(Ok(applied));
                    false
                } else {
                    true
                }
            });
        }
        if Instant::now() >= next_timeout_scan {
            let timeout = config.proposal_timeout;
            for runtime in &mut runtimes {
                let group = runtime.id;
                runtime.reads.retain_mut(|(_, responder)| {
                    if responder.enqueued_at.elapsed() > timeout {
                        responder.answer(Err(ProposeError::Timeout {
                            group,
                            timeout_ms: timeout.as_millis() as u64,
                        }));
                        false
                    } else {
                        true
                    }
                });
            }
            next_timeout_scan = Instant::now() + Duration::from_millis(50);
        }
        let has_more = runtimes.iter().any(|r| r.more_queued);
        if !worked && !has_more {
            mailbox.wait(Instant::now() + Duration::from_millis(50), config.idle_spin);
        }
    }
    let reason = "the node is shutting down".to_string();
    for runtime in &runtimes {
        for mut queued in runtime.queue.take_all() {
            queued.responder.answer(Err(ProposeError::Stopped {
                group: runtime.id,
                reason: reason.clone(),
            }));
        }
    }
    let _ = apply_tx.send(ApplyMessage::Shutdown);
}

/// Adds to `batch` the compaction of every group whose log can be compacted below the
/// state's durable applied index, keeping what `keep` says, as the raft worker does; returns
/// `(position, compact index)` of each.
fn plan_compactions(
    runtimes: &[SoloRuntime],
    keep: LogKeep,
    batch: &mut LogBatch,
) -> Vec<(usize, u64)> {
    let mut compactions = Vec::new();
    for (position, runtime) in runtimes.iter().enumerate() {
        let durable = runtime.status.durable_applied_index.load(Ordering::Acquire);
        if let Some(compact_index) =
            compact_index(durable, runtime.first_index, keep, &runtime.entry_sizes)
        {
            batch.compact(runtime.id, compact_index);
            compactions.push((position, compact_index));
        }
    }
    compactions
}
