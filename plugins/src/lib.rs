//! Concord's WebAssembly state-machine host (wasmtime) and its plugins.
//!
//! Not built yet: see the open plugins issue. Plugin logic will reach its data through the
//! engine crate's `StateTransaction`.
