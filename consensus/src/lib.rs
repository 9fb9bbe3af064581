//! Concord's replication layer: the raft-rs multi-raft node, its runtime and transport.
//!
//! Not built yet: the design is in the repository's ARCHITECTURE.md and the open consensus
//! issue. This crate exists so the workspace has its final shape; it depends on the engine
//! crate's storage traits, which is where the raft log lives.
