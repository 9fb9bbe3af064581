//! Background threads yield the CPU to the request path.
//!
//! The state flush and the WAL checkpoint have loose deadlines: a flush that falls behind only
//! holds more commits in memory (bounded: past the bound, the committing thread flushes
//! itself) and keeps more log; a checkpoint that falls behind keeps more segments on disk.
//! On a machine whose cores are all busy serving requests, a flush that takes a core for
//! hundreds of milliseconds stalls the requests instead. So these threads run 10 nice levels
//! below the threads that serve: the scheduler still gives them a share of a busy core, and
//! all of an idle one.

/// Nice levels a background thread runs below the thread that started it.
#[cfg(target_os = "linux")]
const NICE_LEVELS_BELOW: i32 = 10;

/// The nicest value there is.
#[cfg(target_os = "linux")]
const NICE_MAX: i32 = 19;

/// Lowers the calling thread's CPU priority by 10 nice levels (at most to the lowest). On
/// Linux a thread has a nice value of its own; elsewhere the value belongs to the whole
/// process, so nothing is changed there. A refusal is not an error: the thread runs as it was
/// (and `concord_background_priority_refused_total` counts it).
pub fn lower_this_threads_priority() {
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{getpriority_process, setpriority_process};
        let thread = Some(rustix::thread::gettid());
        let lowered = getpriority_process(thread)
            .and_then(|nice| setpriority_process(thread, (nice + NICE_LEVELS_BELOW).min(NICE_MAX)));
        if lowered.is_err() {
            metrics::counter!("concord_background_priority_refused_total").increment(1);
        }
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_os = "linux")]
    #[test]
    fn a_background_thread_runs_ten_nice_levels_below_its_parent_and_alone() {
        use rustix::process::getpriority_process;
        let nice_of_this_thread = || getpriority_process(Some(rustix::thread::gettid())).unwrap();
        let parent = nice_of_this_thread();
        let background = std::thread::spawn(move || {
            super::lower_this_threads_priority();
            nice_of_this_thread()
        })
        .join()
        .unwrap();
        assert_eq!(
            background,
            (parent + super::NICE_LEVELS_BELOW).min(super::NICE_MAX)
        );
        // The background thread's own: the thread that started it keeps its value.
        assert_eq!(nice_of_this_thread(), parent);
    }
}
