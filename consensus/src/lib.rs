//! Concord's replication layer: commands proposed to a group come back as that command's
//! result once applied, through the [`Consensus`] trait.
//!
//! Two implementations share one node loop (`node_loop/`):
//!
//! - [`RaftNode`]: tikv's raft-rs, many groups per node on dedicated worker threads;
//! - [`SoloNode`]: one node without raft, to measure what raft itself costs.
//!
//! The write path (see `node_loop/worker.rs` for the round in detail):
//!
//! ```text
//! propose(group, cmd) ─► bounded queue per group (full ⇒ Overloaded at once)
//! worker round: drain queue ⇒ ONE entry per group ─► Ready of every group
//!   ─► ONE LogBatch for all the worker's groups ⇒ ONE sync ─► committed entries
//! apply thread (a small round while it idles: the worker): ONE state-store transaction per
//!   batch ─► each caller gets its own result
//! ```
//!
//! # Layout
//!
//! - `consensus.rs`: the [`Consensus`] trait; `pending.rs`: the [`Pending`] future.
//! - `state_machine.rs`: [`StateMachine`] and its errors; `builtin/`: counter, kv and no-op
//!   machines.
//! - `config.rs`: [`NodeConfig`]; `status.rs`: [`GroupStatus`].
//! - `entrance.rs`: where callers enter a node (refusals at the door, queues, mailboxes).
//! - `proposal_queue.rs`, `command_batch.rs`: entry batching; `apply.rs`: the apply stage.
//! - `node_loop/`: the worker round shared by both nodes, and the `Replica` trait where they
//!   differ; `log_compaction.rs`: when a log is compacted.
//! - `raft_node/`: the raft-rs node and its replica; `solo.rs`: the raft-less node.
//! - `transport/`: [`Transport`], the in-process network, and (feature `testing`) a network
//!   with injected faults.
//! - `membership.rs`: membership changes ([`MemberChange`]) and the quorum rule.
//! - `metrics.rs`: the write path's metrics.

mod apply;
mod apply_callers;
mod builtin;
mod cache_padded;
mod command_batch;
mod config;
mod consensus;
mod entrance;
mod error;
mod id_map;
mod idle_spin;
mod install_thread;
mod log_compaction;
mod mailbox;
mod membership;
mod metrics;
mod node_loop;
mod pending;
mod proposal_queue;
mod raft_node;
mod random;
mod solo;
mod start_error;
mod state_flusher;
mod state_machine;
mod status;
pub mod transport;

pub use builtin::{CounterStateMachine, KvCommand, KvStateMachine, NoopStateMachine};
pub use config::NodeConfig;
pub use consensus::Consensus;
pub use error::ProposeError;
pub use membership::{GroupMembers, MAX_MEMBER_ADDRESS_BYTES, MemberChange, refuse_change};
pub use node_loop::log_sync_record::LOG_SYNC_FILE;
pub use node_loop::log_write_clock::{LOG_WRITE_STALL_HOLD, LOG_WRITE_STALLED_AFTER};
pub use pending::Pending;
pub use raft_node::RaftNode;
pub use solo::SoloNode;
pub use start_error::StartError;
pub use state_machine::{
    ADMIN_COMMAND_UNSUPPORTED, ApplyError, CommandError, CommandResult, StateMachine,
    StateMachineFactory,
};
pub use status::{GroupHealth, GroupStatus, VoterProgress};
pub use transport::{GroupMessage, InProcessNetwork, Transport};

/// Identifies a node (a raft peer). Never 0.
pub type NodeId = u64;
