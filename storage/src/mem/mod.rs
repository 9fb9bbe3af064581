//! The in-memory backend: no disk at all. It is the shape of in-memory raft benchmarks and of
//! tests; nothing survives the process.

mod group_values;
mod log_store;
mod state_store;

pub use log_store::MemLogStore;
pub use state_store::MemStateStore;
