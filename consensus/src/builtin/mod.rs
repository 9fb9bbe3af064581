//! Small built-in state machines for tests and benchmarks.

mod counter;
mod kv;
mod noop;

pub use counter::CounterStateMachine;
pub use kv::{KvCommand, KvStateMachine};
pub use noop::NoopStateMachine;
