//! Panics as lines of the node's log.
//!
//! The node catches the panics it can go on after — raft-rs asserting on a message (the group
//! stops), a storage library panicking on a damaged file or a failing disk (an error names the
//! file) — and reports them as errors. Rust's default panic hook still prints each one first,
//! in its own form and outside the log's format and levels, so that a reader who filters the log
//! by level, or a collector that parses its lines, misses it. Once logging is set up the server
//! replaces that hook: a panic becomes one error line naming the thread, the place and the
//! message, with the backtrace when `RUST_BACKTRACE` asks for one.

use std::backtrace::{Backtrace, BacktraceStatus};
use std::panic::PanicHookInfo;

/// Writes every later panic as an error line of the log (`tracing`), in place of Rust's
/// default hook. Call it once the log's subscriber is installed: a panic before that would
/// reach no subscriber and go unsaid.
pub fn log_panics() {
    std::panic::set_hook(Box::new(log_panic));
}

fn log_panic(info: &PanicHookInfo<'_>) {
    let current = std::thread::current();
    let thread = current.name().unwrap_or("unnamed");
    let location = info
        .location()
        .map_or_else(|| "unknown".to_string(), ToString::to_string);
    let message = info.payload_as_str().unwrap_or("a panic without a message");
    // `capture` follows RUST_BACKTRACE (and RUST_LIB_BACKTRACE), as the default hook does.
    let backtrace = Backtrace::capture();
    if backtrace.status() == BacktraceStatus::Captured {
        tracing::error!(thread, location, %backtrace, "panicked: {message}");
    } else {
        tracing::error!(thread, location, "panicked: {message}");
    }
}
