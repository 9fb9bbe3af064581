//! Small built-in state machines for tests and benchmarks.

mod counter;
mod kv;

pub use counter::CounterStateMachine;
pub use kv::{KvCommand, KvStateMachine};
