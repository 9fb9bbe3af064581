//! How long an idle raft or apply thread watches for work before it parks, learned from how
//! soon work came back after its earlier idle spells.
//!
//! Parking costs a wake-up when work comes (a futex wake, a context switch, and on a virtual
//! machine an idle CPU that must be brought back), and a request crosses several threads.
//! Watching costs CPU for as long as it lasts. So a thread watches only as long as work has
//! lately been coming back: the window doubles when work came after the thread had parked
//! but within the bound, and halves when none came within the bound. A node at a low rate
//! parks at once; a node serving one client after another keeps its threads awake between
//! requests; a saturated node is rarely idle at all. A thread also stops watching (for this
//! spell) when one of its yields was long enough that another thread must have run in it:
//! the CPU is wanted elsewhere (the process's other threads, other processes), and watching
//! would only take turns from them.

use std::time::{Duration, Instant};

/// The first window after a miss, when the window was zero.
const GROW_START: Duration = Duration::from_micros(25);

/// A look at the clock this long after the previous one means the thread did not have the CPU
/// in between: a yield on a CPU nobody else wants returns in a few microseconds.
const CPU_WANTED_AFTER: Duration = Duration::from_micros(20);

/// One thread's watch window (see the module documentation).
#[derive(Debug)]
pub(crate) struct IdleSpin {
    bound: Duration,
    window: Duration,
}

/// Where an idle spell stands: started when the thread found no work.
pub(crate) struct IdleSpell {
    started: Instant,
    watch_until: Instant,
    last_look: Instant,
    cpu_wanted: bool,
}

impl IdleSpin {
    /// A window that starts closed and never exceeds `bound` (zero: always park at once).
    pub(crate) fn new(bound: Duration) -> Self {
        Self {
            bound,
            window: Duration::ZERO,
        }
    }

    /// The thread found no work: how long it watches before it parks (never past `deadline`,
    /// when it stops waiting anyway).
    pub(crate) fn begin(&self, deadline: Instant) -> IdleSpell {
        let started = Instant::now();
        IdleSpell {
            started,
            watch_until: (started + self.window).min(deadline),
            last_look: started,
            cpu_wanted: false,
        }
    }

    /// The spell ended: `work_came` if work arrived (rather than the thread's own deadline).
    /// A spell cut short because the CPU was wanted elsewhere teaches nothing about when work
    /// comes.
    pub(crate) fn end(&mut self, spell: &IdleSpell, work_came: bool) {
        if spell.cpu_wanted {
            return;
        }
        let idle = spell.started.elapsed();
        self.learn(work_came.then_some(idle));
    }

    /// Adjusts the window to an idle spell that ended with work after `idle`, or with none.
    fn learn(&mut self, idle_before_work: Option<Duration>) {
        match idle_before_work {
            // Caught while watching: the window is right.
            Some(idle) if idle <= self.window => {}
            // Parked, and work came soon after: watch longer next time.
            Some(idle) if idle <= self.bound => {
                self.window = (self.window * 2).max(GROW_START).min(self.bound);
            }
            // Nothing came within the bound: watching was (or would have been) wasted.
            _ => {
                self.window /= 2;
                if self.window < GROW_START {
                    self.window = Duration::ZERO;
                }
            }
        }
    }

    #[cfg(test)]
    fn window(&self) -> Duration {
        self.window
    }
}

impl IdleSpell {
    /// `true` while the thread should keep watching rather than park: until its window ends,
    /// or until it finds that another thread had the CPU since its last look.
    pub(crate) fn keep_watching(&mut self) -> bool {
        self.look(Instant::now())
    }

    fn look(&mut self, now: Instant) -> bool {
        if now.duration_since(self.last_look) > CPU_WANTED_AFTER {
            self.cpu_wanted = true;
        }
        self.last_look = now;
        !self.cpu_wanted && now < self.watch_until
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUND: Duration = Duration::from_micros(400);

    #[test]
    fn a_new_window_is_closed() {
        let spin = IdleSpin::new(BOUND);
        assert_eq!(spin.window(), Duration::ZERO);
        assert!(!spin.begin(far_future()).keep_watching());
    }

    fn far_future() -> Instant {
        Instant::now() + Duration::from_secs(3600)
    }

    #[test]
    fn a_thread_never_watches_past_its_deadline() {
        let spin = open_window();
        let deadline = Instant::now() + Duration::from_micros(100);
        let mut spell = spin.begin(deadline);
        let step = Duration::from_micros(10);
        let mut at = spell.started;
        while at + step < deadline {
            at += step;
            assert!(spell.look(at), "still watching before the deadline");
        }
        assert!(!spell.look(deadline), "the deadline ended the watch");
        assert!(
            !spell.cpu_wanted,
            "stopped by the deadline, not by a late look"
        );
    }

    fn open_window() -> IdleSpin {
        let mut spin = IdleSpin::new(BOUND);
        for _ in 0..5 {
            spin.learn(Some(Duration::from_micros(300)));
        }
        assert_eq!(spin.window(), BOUND);
        spin
    }

    #[test]
    fn a_thread_watches_until_its_window_ends() {
        let spin = open_window();
        let mut spell = spin.begin(far_future());
        let (start, step) = (spell.started, Duration::from_micros(10));
        let mut at = Duration::ZERO;
        while at + step < BOUND {
            at += step;
            assert!(spell.look(start + at), "still watching at {at:?}");
        }
        assert!(!spell.look(start + BOUND), "the window ended");
        assert!(!spell.cpu_wanted);
    }

    #[test]
    fn a_long_gap_between_looks_stops_the_watch() {
        let mut spin = open_window();
        let mut spell = spin.begin(far_future());
        let start = spell.started;
        assert!(spell.look(start + Duration::from_micros(10)));
        // Another thread ran in between: stop, and stay stopped.
        assert!(!spell.look(start + Duration::from_micros(100)));
        assert!(!spell.look(start + Duration::from_micros(105)));
        // Work came soon after, but the spell says nothing about when work comes.
        spin.end(&spell, true);
        assert_eq!(spin.window(), BOUND);
    }

    #[test]
    fn work_that_comes_soon_after_parking_opens_the_window_up_to_the_bound() {
        let mut spin = IdleSpin::new(BOUND);
        let gap = Duration::from_micros(300);
        let mut windows = Vec::new();
        for _ in 0..6 {
            spin.learn(Some(gap));
            windows.push(spin.window().as_micros());
        }
        // Grows until it covers the gap, then stays: the gap is caught while watching.
        assert_eq!(windows, [25, 50, 100, 200, 400, 400]);
    }

    #[test]
    fn the_window_never_passes_the_bound() {
        let mut spin = IdleSpin::new(Duration::from_micros(60));
        for _ in 0..10 {
            spin.learn(Some(Duration::from_micros(59)));
        }
        assert_eq!(spin.window(), Duration::from_micros(60));
    }

    #[test]
    fn spells_without_work_within_the_bound_close_the_window() {
        let mut spin = open_window();
        spin.learn(Some(Duration::from_millis(10)));
        assert_eq!(spin.window(), BOUND / 2);
        spin.learn(None);
        spin.learn(None);
        assert_eq!(spin.window(), Duration::from_micros(50));
        spin.learn(None);
        assert_eq!(spin.window(), GROW_START);
        spin.learn(None);
        assert_eq!(spin.window(), Duration::ZERO);
    }

    #[test]
    fn a_zero_bound_never_watches() {
        let mut spin = IdleSpin::new(Duration::ZERO);
        for _ in 0..10 {
            spin.learn(Some(Duration::ZERO));
            spin.learn(Some(Duration::from_micros(10)));
        }
        assert_eq!(spin.window(), Duration::ZERO);
    }
}
