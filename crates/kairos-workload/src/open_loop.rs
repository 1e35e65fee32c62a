//! Open-loop load: Poisson arrivals that follow their own schedule.

use std::time::Duration;

use kairos_core::{LocalTime, Rng};
use rand_distr::{Distribution, Exp};

/// Longest gap between arrivals (a tiny rate would otherwise overflow a `Duration`).
const ARRIVAL_GAP_MAX: Duration = Duration::from_secs(24 * 3600);

/// Open-loop load: Poisson arrivals at `rate_per_s` (0: no load generation), until
/// `stop_after` of local time since start or `max_txns` arrivals (admitted or not).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpenLoop {
    pub rate_per_s: f64,
    pub stop_after: Option<Duration>,
    pub max_txns: Option<u64>,
}

impl OpenLoop {
    /// Whether arrivals continue at local time `now`, `arrivals` after a start at `started_at`.
    pub fn generating(&self, started_at: LocalTime, arrivals: u64, now: LocalTime) -> bool {
        let rate = self.rate_per_s;
        rate.is_finite()
            && rate > 0.0
            && self.max_txns.is_none_or(|m| arrivals < m)
            && self.stop_after.is_none_or(|d| now.saturating_since(started_at) < d)
    }

    /// The gap to the next arrival (exponential), or `None` without a valid rate.
    pub fn next_gap(&self, rng: &mut Rng) -> Option<Duration> {
        let exp = Exp::new(self.rate_per_s).ok()?;
        let gap_s: f64 = exp.sample(rng);
        Some(Duration::try_from_secs_f64(gap_s).unwrap_or(ARRIVAL_GAP_MAX).min(ARRIVAL_GAP_MAX))
    }

    /// The arrival after the one due at `due`: when it is due, and the timer to arm at local
    /// time `now`. Arrivals follow their own schedule, so the time a process spends handling
    /// (or waiting behind other work) never slows the offered load: an arrival whose time has
    /// passed is due at once and queues like any event.
    pub fn next_arrival(&self, rng: &mut Rng, due: LocalTime, now: LocalTime) -> Option<(LocalTime, Duration)> {
        let at = due.saturating_add(self.next_gap(rng)?);
        Some((at, at.saturating_since(now)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// Arrivals keep their own schedule: a coordinator that handles an arrival late (busy, or
    /// its timer queued behind other work) does not push every later arrival back.
    #[test]
    fn a_late_arrival_does_not_delay_the_schedule() {
        let load = OpenLoop { rate_per_s: 1000.0, stop_after: None, max_txns: None };
        let start = LocalTime::from_secs(1);
        let (first, after) = load.next_arrival(&mut Rng::seed_from_u64(3), start, start).unwrap();
        assert_eq!(start + after, first);
        // The next arrival is due at the same time whether the first is handled on time or
        // 50 ms late (20 times the mean gap): then it is due at once.
        let late = first + Duration::from_millis(50);
        let (on_time, _) = load.next_arrival(&mut Rng::seed_from_u64(4), first, first).unwrap();
        let (handled_late, after_late) = load.next_arrival(&mut Rng::seed_from_u64(4), first, late).unwrap();
        assert_eq!(on_time, handled_late);
        assert_eq!(after_late, handled_late.saturating_since(late));
    }

    #[test]
    fn arrivals_stop_at_the_count_or_the_time_and_need_a_rate() {
        let start = LocalTime::from_secs(1);
        let by_count = OpenLoop { rate_per_s: 10.0, stop_after: None, max_txns: Some(2) };
        assert!(by_count.generating(start, 1, start) && !by_count.generating(start, 2, start));
        let by_time = OpenLoop { rate_per_s: 10.0, stop_after: Some(Duration::from_secs(1)), max_txns: None };
        assert!(by_time.generating(start, 0, start + Duration::from_millis(999)));
        assert!(!by_time.generating(start, 0, start + Duration::from_secs(1)));
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let load = OpenLoop { rate_per_s: rate, ..OpenLoop::default() };
            assert!(!load.generating(start, 0, start), "rate {rate}");
        }
        let negative = OpenLoop { rate_per_s: -1.0, ..OpenLoop::default() };
        assert_eq!(negative.next_gap(&mut Rng::seed_from_u64(1)), None);
        for tiny in [0.0, 1e-300] {
            let slow = OpenLoop { rate_per_s: tiny, ..OpenLoop::default() };
            assert_eq!(slow.next_gap(&mut Rng::seed_from_u64(1)), Some(ARRIVAL_GAP_MAX), "rate {tiny}");
        }
    }
}
