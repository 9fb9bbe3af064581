//! The node loop: one worker skeleton for [`crate::RaftNode`] and [`crate::SoloNode`].
//!
//! A node's groups are spread over worker threads (`group % workers`). Each worker runs the
//! round of `worker.rs` over its groups — inbox, proposals, clock, one log write and one sync
//! for all of them, hand-off to its apply thread, timeouts — and drives each group's
//! [`replica::Replica`], where raft and solo differ: `raft_node/replica.rs` wraps a raft-rs
//! `RawNode`, `solo.rs` appends without replication.

pub(crate) mod group;
pub(crate) mod replica;
mod worker;

pub(crate) use worker::{WorkerParts, spawn};

use crate::NodeConfig;
use crate::entrance::Entrance;

/// State shared by a node's handle, its workers and (for raft) its peers.
pub(crate) struct NodeShared {
    pub(crate) config: NodeConfig,
    pub(crate) entrance: Entrance,
}
