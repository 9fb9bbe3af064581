//! Test support, behind the `testing` feature: a linearizability checker for histories of
//! session operations, for the tests of this crate and of the server.

pub mod linearizability;
