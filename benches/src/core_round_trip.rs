//! How long a cache line takes to go from one core to the other and back, measured between two
//! threads pinned to two of the CPUs this process may use.
//!
//! Every hand-off between the engine's threads (a proposal queued for the raft thread, an
//! entry for the apply thread, an answer for the caller's task) moves cache lines between
//! cores, so a benchmark's rate depends on this figure as well as on the cores' speed. On a
//! virtual machine it is not fixed: it follows where the host places the two virtual CPUs (on
//! cores that share a cache, or not), which can change from one minute to the next. Each case
//! measures it just before it starts and just after it ends, and its result carries both.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};

/// Round trips per try: long enough to average out a timer's grain, short enough (tens of
/// milliseconds at the slowest placements seen) to run before every case.
const ROUND_TRIPS: u64 = 50_000;

/// Tries per measurement; the median is reported.
const TRIES: usize = 3;

/// A try that has not finished by then is given up (a core taken by another process).
const TRY_LIMIT: Duration = Duration::from_secs(1);

/// The median, over a few tries, of one round trip's nanoseconds between the first two CPUs
/// this process may use; `None` with fewer than two, or if a try could not finish in time.
pub fn core_round_trip_ns() -> Option<f64> {
    let (first, second) = two_allowed_cpus()?;
    let mut tries = Vec::with_capacity(TRIES);
    for _ in 0..TRIES {
        tries.push(one_try(first, second)?);
    }
    tries.sort_by(f64::total_cmp);
    Some(tries[TRIES / 2])
}

/// The readable line for a case's round trips before and after it, if either was measured.
pub fn core_round_trip_text(before_ns: Option<f64>, after_ns: Option<f64>) -> Option<String> {
    let shown = |nanos: Option<f64>| nanos.map_or("-".to_string(), |n| format!("{n:.0} ns"));
    if before_ns.is_none() && after_ns.is_none() {
        return None;
    }
    Some(format!(
        "a cache line's round trip between two cores: {} before the case, {} after",
        shown(before_ns),
        shown(after_ns)
    ))
}

fn two_allowed_cpus() -> Option<(usize, usize)> {
    let allowed = sched_getaffinity(None).ok()?;
    let mut cpus = (0..CpuSet::MAX_CPU).filter(|&cpu| allowed.is_set(cpu));
    Some((cpus.next()?, cpus.next()?))
}

/// Pins the calling thread to `cpu`.
fn pin_to(cpu: usize) -> bool {
    let mut only = CpuSet::new();
    only.set(cpu);
    sched_setaffinity(None, &only).is_ok()
}

/// One try: a counter passed back and forth, each side waiting for the other's increment.
fn one_try(first: usize, second: usize) -> Option<f64> {
    let counter = Arc::new(AtomicU64::new(0));
    let answering = counter.clone();
    let deadline = Instant::now() + TRY_LIMIT;
    let answerer = std::thread::spawn(move || {
        if !pin_to(second) {
            return false;
        }
        for round in 0..ROUND_TRIPS {
            if !wait_for(&answering, 2 * round + 1, deadline) {
                return false;
            }
            answering.store(2 * round + 2, Ordering::Release);
        }
        true
    });
    let asker = std::thread::spawn(move || {
        if !pin_to(first) {
            return None;
        }
        let started = Instant::now();
        for round in 0..ROUND_TRIPS {
            counter.store(2 * round + 1, Ordering::Release);
            if !wait_for(&counter, 2 * round + 2, deadline) {
                return None;
            }
        }
        Some(started.elapsed())
    });
    let took = asker.join().ok()?;
    let answered = answerer.join().ok()?;
    let took = took.filter(|_| answered)?;
    Some(took.as_nanos() as f64 / ROUND_TRIPS as f64)
}

/// Spins until `counter` holds `value`; `false` if `deadline` passes first (looked at every
/// few thousand spins, not on each).
fn wait_for(counter: &AtomicU64, value: u64, deadline: Instant) -> bool {
    let mut spins = 0u32;
    while counter.load(Ordering::Acquire) != value {
        std::hint::spin_loop();
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(4096) && Instant::now() > deadline {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_shows_what_was_measured() {
        assert_eq!(core_round_trip_text(None, None), None);
        assert_eq!(
            core_round_trip_text(Some(52.4), None).as_deref(),
            Some("a cache line's round trip between two cores: 52 ns before the case, - after")
        );
    }

    #[test]
    fn waiting_for_the_other_core_ends_at_the_deadline() {
        let counter = AtomicU64::new(0);
        assert!(!wait_for(&counter, 1, Instant::now()), "never set");
        counter.store(1, Ordering::Release);
        assert!(wait_for(&counter, 1, Instant::now()), "already set");
    }
}
