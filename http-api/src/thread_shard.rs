//! Per-thread shards of what every request updates: the HTTP threads each update
//! their own copy, so that a request does not pull a cache line the other threads wrote
//! (an atomic shared by all of them costs a transfer between cores on every request).

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Shards per sharded value: more than there are HTTP threads on most machines; threads
/// beyond it share.
pub(crate) const THREAD_SHARDS: usize = 8;

/// One shard, alone on its cache lines (two, for CPUs that fetch lines in pairs).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Padded<T>(pub T);

/// The shard of the calling thread: threads take shards in turn, on first use.
pub(crate) fn this_threads_shard() -> usize {
    static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: Cell<Option<usize>> = const { Cell::new(None) };
    }
    SHARD.with(|shard| match shard.get() {
        Some(index) => index,
        None => {
            let index = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % THREAD_SHARDS;
            shard.set(Some(index));
            index
        }
    })
}
