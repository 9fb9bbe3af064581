//! The vote a member holds back after it restarts with its log.
//!
//! Before it stopped, the member may have answered a leader whose lease still runs, and
//! raft-rs, which forgot that leader, would vote at once. So for as many ticks as its own
//! election timeout it refuses other candidates' votes and does not campaign, and for longer
//! when its ticks were shortened across the restart: a leader that has not heard the member's
//! new hello still counts on the quiet it said before (`lease.rs`).
//!
//! The hold counts ticks, and a sleeping group is not ticked. The time a group sleeps
//! therefore counts toward the hold when it wakes, in whole ticks; without that a member
//! whose group fell asleep during the hold would refuse every vote for the rest of it once
//! woken, however long after the quiet ended, and its group could elect no leader meanwhile.

use std::time::{Duration, Instant};

/// How much longer a restarted member holds back its vote.
#[derive(Debug)]
pub(super) struct VoteHold {
    ticks_left: usize,
    tick_interval: Duration,
    /// When the group fell asleep with ticks left.
    asleep_since: Option<Instant>,
}

impl VoteHold {
    /// No hold: a member new to the group, or one that lost its log (a member that lost it
    /// votes only once caught up, which `replica/catching_up.rs` sees to).
    pub(super) fn none(tick_interval: Duration) -> Self {
        VoteHold {
            ticks_left: 0,
            tick_interval,
            asleep_since: None,
        }
    }

    /// The hold of a member restarted with its log: its own election timeout
    /// (`election_ticks`, with check-quorum), or enough ticks of `tick_interval` to outlast
    /// `previous_quiet`, the quiet it said to its peers before it stopped, if that is longer.
    /// A tick may come at once after the start, so one more than the quiet's length in ticks.
    pub(super) fn after_restart(
        election_ticks: usize,
        check_quorum: bool,
        previous_quiet: Duration,
        tick_interval: Duration,
    ) -> Self {
        let own = if check_quorum { election_ticks } else { 0 };
        let ticks_left = if previous_quiet.is_zero() || tick_interval.is_zero() {
            own
        } else {
            let previous_ticks = previous_quiet.as_nanos().div_ceil(tick_interval.as_nanos()) + 1;
            own.max(usize::try_from(previous_ticks).unwrap_or(usize::MAX))
        };
        VoteHold {
            ticks_left,
            tick_interval,
            asleep_since: None,
        }
    }

    /// Whether the member still holds its vote.
    pub(super) fn holds(&self) -> bool {
        self.ticks_left > 0
    }

    pub(super) fn tick(&mut self) {
        self.ticks_left = self.ticks_left.saturating_sub(1);
    }

    /// The group falls asleep: its ticks stop until it wakes.
    pub(super) fn fell_asleep(&mut self) {
        if self.holds() {
            self.asleep_since = Some(Instant::now());
        }
    }

    /// The group is awake (called on every wake-up, asleep or not): the whole ticks it slept
    /// through count toward the hold.
    pub(super) fn woke(&mut self) {
        if let Some(since) = self.asleep_since.take() {
            self.slept(since.elapsed());
        }
    }

    fn slept(&mut self, duration: Duration) {
        let ticks = duration
            .as_nanos()
            .checked_div(self.tick_interval.as_nanos())
            .unwrap_or(0);
        let ticks = usize::try_from(ticks).unwrap_or(usize::MAX);
        self.ticks_left = self.ticks_left.saturating_sub(ticks);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_restarted_with_shorter_ticks_holds_its_vote_for_the_quiet_it_said_before() {
        let tick = Duration::from_millis(20);
        let hold = |check_quorum, said_before| {
            VoteHold::after_restart(10, check_quorum, said_before, tick).ticks_left
        };
        // Nothing said before, or a shorter quiet: the election timeout.
        assert_eq!(hold(true, Duration::ZERO), 10);
        assert_eq!(hold(true, tick * 5), 10);
        // 10 ticks of 200 ms before (a quiet of 1.8 s), 20 ms now: 90 ticks and one more,
        // since the first may come at once.
        let said_before = Duration::from_millis(1800);
        assert_eq!(hold(true, said_before), 91);
        assert_eq!(hold(true, said_before + Duration::from_millis(1)), 92);
        // Without check-quorum now, a lease may still count on the quiet said before.
        assert_eq!(hold(false, Duration::ZERO), 0);
        assert_eq!(hold(false, said_before), 91);
        assert!(!VoteHold::none(tick).holds());
    }

    #[test]
    fn ticks_and_whole_ticks_asleep_count_toward_the_hold() {
        let tick = Duration::from_millis(20);
        let mut hold = VoteHold::after_restart(10, true, Duration::ZERO, tick);
        hold.tick();
        assert_eq!(hold.ticks_left, 9);
        // Only whole ticks count: 59 ms asleep is two.
        hold.slept(Duration::from_millis(59));
        assert_eq!(hold.ticks_left, 7);
        hold.slept(Duration::from_secs(60));
        assert!(!hold.holds());
        hold.tick();
        assert!(!hold.holds());
        // Ticks of zero length (never configured so) count nothing asleep.
        let mut untimed = VoteHold::after_restart(10, true, Duration::ZERO, Duration::ZERO);
        untimed.slept(Duration::from_secs(1));
        assert_eq!(untimed.ticks_left, 10);
    }

    #[test]
    fn only_a_sleep_during_the_hold_is_timed_and_a_wake_ends_it() {
        let tick = Duration::from_millis(1);
        let mut held = VoteHold::after_restart(1000, true, Duration::ZERO, tick);
        held.woke();
        assert_eq!(held.ticks_left, 1000, "awake all along: nothing slept");
        held.fell_asleep();
        std::thread::sleep(Duration::from_millis(5));
        held.woke();
        let after_sleep = held.ticks_left;
        assert!(after_sleep <= 995, "{after_sleep}");
        held.woke();
        assert_eq!(held.ticks_left, after_sleep, "one sleep counts once");

        let mut over = VoteHold::none(tick);
        over.fell_asleep();
        assert!(
            over.asleep_since.is_none(),
            "no hold: the clock is not read"
        );
    }
}
