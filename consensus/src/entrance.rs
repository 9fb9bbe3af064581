//! Where callers enter a node: the groups' queues and statuses and the workers' mailboxes,
//! shared by [`crate::RaftNode`] and [`crate::SoloNode`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use concord_storage::GroupId;
use parking_lot::Mutex;

use crate::id_map::IdMap;
use crate::mailbox::Mailbox;
use crate::pending::{ReadPermit, ReadResponder};
use crate::proposal_queue::{BatchRefused, CommandKind, ProposalQueue, QueuedCommand};
use crate::status::SharedGroupStatus;
use crate::{GroupHealth, GroupStatus, NodeConfig, Pending, ProposeError};

/// How long a shutdown waits for the node's threads.
const THREAD_JOIN_TIMEOUT: Duration = Duration::from_secs(10);

/// What callers and peers reach a group by.
pub(crate) struct GroupHandle {
    pub(crate) queue: Arc<ProposalQueue>,
    pub(crate) status: Arc<SharedGroupStatus>,
    /// The worker owning the group: `group % workers`.
    pub(crate) worker: usize,
}

/// The caller-facing half of a node.
pub(crate) struct Entrance {
    pub(crate) groups: IdMap<GroupHandle>,
    pub(crate) mailboxes: Vec<Arc<Mailbox>>,
    pub(crate) stopping: AtomicBool,
    max_command_bytes: usize,
    max_waiting_reads: usize,
    /// `concord_raft_proposals_refused_total{reason="overloaded"}`.
    overloaded: metrics::Counter,
}

impl Entrance {
    pub(crate) fn new(config: &NodeConfig) -> Self {
        let per_group_gauges = config.groups.len() <= crate::metrics::PER_GROUP_GAUGES_MAX_GROUPS;
        let node_removals = Arc::new(AtomicUsize::new(0));
        let groups = config
            .groups
            .iter()
            .map(|&group| {
                let handle = GroupHandle {
                    queue: Arc::new(ProposalQueue::new(
                        config.proposal_queue_capacity,
                        config.proposal_queue_capacity_bytes,
                    )),
                    status: Arc::new(SharedGroupStatus::new(
                        group,
                        per_group_gauges,
                        node_removals.clone(),
                    )),
                    worker: (group % config.workers as u64) as usize,
                };
                (group, handle)
            })
            .collect();
        Entrance {
            groups,
            mailboxes: (0..config.workers)
                .map(|_| Arc::new(Mailbox::new()))
                .collect(),
            stopping: AtomicBool::new(false),
            max_command_bytes: config.max_command_bytes,
            max_waiting_reads: config.max_waiting_reads,
            overloaded: crate::metrics::overloaded(),
        }
    }

    pub(crate) fn handle(&self, group: GroupId) -> Result<&GroupHandle, ProposeError> {
        self.groups
            .get(&group)
            .ok_or(ProposeError::UnknownGroup { group })
    }

    /// The group's handle if it may take work now: known, running, and led by this node or by
    /// a leader this node knows (a follower forwards proposals and reads to it).
    fn available(&self, group: GroupId) -> Result<&GroupHandle, ProposeError> {
        let handle = self.handle(group)?;
        if let Some(reason) = handle.status.stopped_reason() {
            return Err(ProposeError::Stopped { group, reason });
        }
        if self.stopping.load(Ordering::Acquire) {
            return Err(ProposeError::Stopped {
                group,
                reason: "the node is shutting down".into(),
            });
        }
        if handle.status.removed.load(Ordering::Acquire) {
            return Err(ProposeError::Refused {
                group,
                reason: "this node was removed from the group: ask another member".into(),
            });
        }
        if !handle.status.is_leader.load(Ordering::Acquire)
            && handle.status.leader.load(Ordering::Acquire) == 0
        {
            return Err(ProposeError::NotLeader {
                group,
                leader: None,
            });
        }
        Ok(handle)
    }

    /// Queues `command` for `group`'s next entry (an entry of its own if it is an admin
    /// command), or refuses it at once.
    pub(crate) fn propose(
        &self,
        group: GroupId,
        command: Bytes,
        kind: CommandKind,
    ) -> Pending<Bytes> {
        if let Err(error) = self.fits_an_entry(&command) {
            return Pending::ready(group, Err(error));
        }
        let handle = match self.available(group) {
            Ok(handle) => handle,
            Err(error) => return Pending::ready(group, Err(error)),
        };
        let (pending, responder) = Pending::new(group);
        match handle.queue.push(QueuedCommand {
            command,
            kind,
            responder,
        }) {
            Ok(was_empty) => {
                if was_empty {
                    self.wake_for_proposals(group, handle.worker);
                }
                pending
            }
            Err(_) => {
                self.overloaded.increment(1);
                Pending::ready(group, Err(ProposeError::Overloaded { group }))
            }
        }
    }

    /// Queues every client command of `commands` for `group`, in order, or refuses them all
    /// at once: the batch resolves when each command has its own answer.
    pub(crate) fn propose_batch(
        &self,
        group: GroupId,
        commands: Vec<Bytes>,
    ) -> Pending<Vec<Result<Bytes, ProposeError>>> {
        if let Err(error) = commands
            .iter()
            .try_for_each(|command| self.fits_an_entry(command))
        {
            return Pending::ready(group, Err(error));
        }
        let handle = match self.available(group) {
            Ok(handle) => handle,
            Err(error) => return Pending::ready(group, Err(error)),
        };
        let (pending, responders) = Pending::batch(group, commands.len());
        let batch = commands
            .into_iter()
            .zip(responders)
            .map(|(command, responder)| QueuedCommand {
                command,
                kind: CommandKind::Client,
                responder,
            })
            .collect();
        match handle.queue.push_batch(batch) {
            Ok(was_empty) => {
                if was_empty {
                    self.wake_for_proposals(group, handle.worker);
                }
                pending
            }
            Err(BatchRefused::Full) => {
                self.overloaded.increment(1);
                Pending::ready(group, Err(ProposeError::Overloaded { group }))
            }
            Err(BatchRefused::NeverFits {
                commands,
                bytes,
                capacity,
                capacity_bytes,
            }) => Pending::ready(
                group,
                Err(ProposeError::Refused {
                    group,
                    reason: format!(
                        "a batch of {commands} commands ({bytes} bytes) is larger than the \
                         group's proposal queue ({capacity} commands, {capacity_bytes} bytes): \
                         split it"
                    ),
                }),
            ),
        }
    }

    /// `TooLarge` for a command larger than an entry may be.
    fn fits_an_entry(&self, command: &Bytes) -> Result<(), ProposeError> {
        if command.len() > self.max_command_bytes {
            return Err(ProposeError::TooLarge {
                bytes: command.len(),
                limit_bytes: self.max_command_bytes,
            });
        }
        Ok(())
    }

    /// Tells `group`'s worker that its queue has commands.
    fn wake_for_proposals(&self, group: GroupId, worker: usize) {
        let mailbox = &self.mailboxes[worker];
        mailbox.inbox.lock().proposals.push(group);
        mailbox.wake();
    }

    /// Hands a read barrier for `group` to its worker (served from the leader's lease when
    /// `lease` and the node holds one), or refuses it at once (with `Overloaded` when the
    /// group has `max_waiting_reads` reads waiting already).
    pub(crate) fn read_barrier(&self, group: GroupId, lease: bool) -> Pending<u64> {
        let handle = match self.available(group) {
            Ok(handle) => handle,
            Err(error) => return Pending::ready(group, Err(error)),
        };
        let Some(permit) = ReadPermit::take(&handle.status, self.max_waiting_reads) else {
            self.overloaded.increment(1);
            return Pending::ready(group, Err(ProposeError::Overloaded { group }));
        };
        let (pending, responder) = Pending::new(group);
        let reader = ReadResponder::new(responder, permit);
        let mailbox = &self.mailboxes[handle.worker];
        mailbox.inbox.lock().reads.push((group, reader, lease));
        mailbox.wake();
        pending
    }

    /// The groups worker `index` owns, in id order.
    pub(crate) fn worker_groups(&self, index: usize) -> Vec<(GroupId, &GroupHandle)> {
        let mut owned: Vec<(GroupId, &GroupHandle)> = self
            .groups
            .iter()
            .filter(|(_, handle)| handle.worker == index)
            .map(|(&group, handle)| (group, handle))
            .collect();
        owned.sort_unstable_by_key(|&(group, _)| group);
        owned
    }

    pub(crate) fn status(&self, group: GroupId) -> Result<GroupStatus, ProposeError> {
        Ok(self.handle(group)?.status.snapshot(group))
    }

    pub(crate) fn health(&self, group: GroupId) -> Result<GroupHealth, ProposeError> {
        Ok(self.handle(group)?.status.health())
    }

    pub(crate) fn groups(&self) -> Vec<GroupId> {
        let mut groups: Vec<GroupId> = self.groups.keys().copied().collect();
        groups.sort_unstable();
        groups
    }

    /// The voters of the node's groups, as their configurations say (each once, sorted).
    pub(crate) fn voters(&self) -> Vec<crate::NodeId> {
        // Read in place, not copied per group: the leader balance asks every interval, and a
        // node may hold thousands of groups over a handful of voters.
        let mut voters: Vec<crate::NodeId> = Vec::new();
        for handle in self.groups.values() {
            for &voter in &handle.status.members.lock().voters {
                if !voters.contains(&voter) {
                    voters.push(voter);
                }
            }
        }
        voters.sort_unstable();
        voters
    }

    /// Refuses new work, tells every worker to stop, and joins `threads`.
    pub(crate) fn shutdown(&self, threads: &Mutex<Vec<JoinHandle<()>>>) {
        self.stopping.store(true, Ordering::Release);
        for mailbox in &self.mailboxes {
            mailbox.inbox.lock().shutdown = true;
            mailbox.wake();
        }
        let threads: Vec<JoinHandle<()>> = threads.lock().drain(..).collect();
        // A thread stuck in a store that no longer answers (a flush that never returns) must
        // not hold the process: past the deadline it is left behind. Nothing acknowledged
        // depends on it — answers follow the log's sync, and a restart replays the log.
        let deadline = Instant::now() + THREAD_JOIN_TIMEOUT;
        for thread in threads {
            while !thread.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if thread.is_finished() {
                let _ = thread.join();
            } else {
                tracing::error!(
                    thread = thread.thread().name().unwrap_or("unnamed"),
                    timeout_ms = THREAD_JOIN_TIMEOUT.as_millis() as u64,
                    "a node thread did not stop in time; left behind"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use concord_storage::raft::prelude::ConfState;

    use super::*;
    use crate::GroupMembers;

    fn members(voters: &[crate::NodeId]) -> GroupMembers {
        let mut conf_state = ConfState::default();
        conf_state.set_voters(voters.to_vec());
        GroupMembers::from_conf_state(&conf_state)
    }

    #[test]
    fn voters_lists_each_voter_of_every_group_once_in_order() {
        let entrance = Entrance::new(&NodeConfig::new(1, vec![1], vec![0, 1, 2, 3]));
        assert!(entrance.voters().is_empty(), "no group has members yet");
        let configurations: [&[crate::NodeId]; 4] = [&[3, 1, 2], &[2, 1], &[], &[5, 3, 4]];
        for (group, voters) in configurations.iter().enumerate() {
            let handle = entrance.handle(group as GroupId).unwrap();
            handle
                .status
                .set_members(group as GroupId, members(voters), 1);
        }
        assert_eq!(entrance.voters(), vec![1, 2, 3, 4, 5]);
    }
}
