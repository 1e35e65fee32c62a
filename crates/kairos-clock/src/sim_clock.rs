//! A simulated node clock: true time in, a skewed local reading out.
//!
//! The simulator owns true time ([`SimTime`], nanoseconds since the start of a run). Every node
//! has a [`SimClock`] that turns true time `t` into that node's reading ([`LocalTime`],
//! nanoseconds since the Unix epoch):
//!
//! ```text
//! reading(t) = SIM_EPOCH + t + offset + ⌊drift_ppb · t / 10⁹⌋ + Σ steps(at ≤ t) + jitter
//! ```
//!
//! * **offset** — a constant signed error in ns (how far off the node was when it last synced).
//! * **drift** — a rate error in parts per billion (1 ppm = 1 000 ppb), integer arithmetic, so the
//!   error grows by `drift_ppb` ns per true second. Clamped to ±(10⁹ − 1) ppb so a clock never
//!   stops or runs backwards because of drift.
//! * **steps** — jumps of the clock at chosen true times ([`SimClock::add_step`]) or right away
//!   ([`SimClock::step_now`]), forward or backward, as `ntpd`/`chronyd` do when they step the
//!   clock instead of slewing it.
//! * **jitter** — bounded noise on each reading, uniform in `[-jitter_ns, +jitter_ns]`, drawn from
//!   the generator the simulator passes to [`SimClock::read`] (no draw when `jitter_ns == 0`).
//!
//! The sum is computed in `i128` and saturated into `[0, u64::MAX]`: a reading is never below 0.
//!
//! # Monotonicity
//!
//! A real `CLOCK_REALTIME` under NTP slewing never goes backwards, except when the daemon
//! *steps* it. The model keeps that property by default (`monotonic = true`): for two
//! consecutive readings `r1`, `r2` of one clock, with step deltas summing to `Σ` taking effect
//! in between,
//!
//! ```text
//! r2 ≥ r1 + Σ        (so r2 ≥ r1 when no step happened; a backward step may go back by |Σ|)
//! ```
//!
//! It does so by clamping a reading that jitter would pull below the previous one. The price is
//! a small upward bias (at most `jitter_ns`) when a node reads its clock more often than the
//! jitter changes sign. [`SimClock::with_monotonic`]`(false)` gives raw, unclamped readings
//! instead. Steps are by design the one way a clock goes backwards.
//!
//! Steps take effect at the first reading at or after their `at` time; [`SimClock::read`]
//! expects non-decreasing true times (the simulator's clock only moves forward).

use kairos_core::{LocalTime, Rng, SimTime};
use rand::Rng as _;
use std::collections::VecDeque;
use std::time::Duration;

/// The Unix time at which every simulation starts: 2026-01-01T00:00:00Z, in nanoseconds.
/// A node with a perfect clock reads `SIM_EPOCH_NS + t` at true time `t`.
pub const SIM_EPOCH_NS: u64 = 1_767_225_600_000_000_000;

/// [`SIM_EPOCH_NS`] as a clock reading.
pub const SIM_EPOCH: LocalTime = LocalTime(SIM_EPOCH_NS);

/// Largest drift magnitude accepted, in parts per billion: with it a clock still advances.
pub const MAX_DRIFT_PPB: i64 = 999_999_999;

const NS_PER_SEC: i128 = 1_000_000_000;

/// A jump of a clock by `delta_ns` (negative = backward) at true time `at`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Step {
    pub at: SimTime,
    pub delta_ns: i64,
}

/// One node's simulated clock. See the [module docs](self) for the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimClock {
    offset_ns: i64,
    drift_ppb: i64,
    jitter_ns: u64,
    monotonic: bool,
    /// Steps not yet taken, sorted by `at` (ties keep insertion order).
    pending: VecDeque<Step>,
    /// Sum of steps already taken (including `step_now`).
    applied_steps_ns: i64,
    /// Lowest value the next reading may take when `monotonic`: the previous reading plus the
    /// steps taken since. `None` before the first reading.
    floor: Option<i128>,
}

impl Default for SimClock {
    fn default() -> Self {
        Self::perfect()
    }
}

impl SimClock {
    /// A clock that reads exactly `SIM_EPOCH + t`: no offset, drift, jitter or steps.
    pub fn perfect() -> Self {
        SimClock {
            offset_ns: 0,
            drift_ppb: 0,
            jitter_ns: 0,
            monotonic: true,
            pending: VecDeque::new(),
            applied_steps_ns: 0,
            floor: None,
        }
    }

    /// A clock with the given constant offset (ns), drift (ppb) and jitter bound (ns).
    pub fn new(offset_ns: i64, drift_ppb: i64, jitter_ns: u64) -> Self {
        Self::perfect().with_offset_ns(offset_ns).with_drift_ppb(drift_ppb).with_jitter_ns(jitter_ns)
    }

    /// Sets the constant offset in nanoseconds (positive = ahead of true time).
    pub fn with_offset_ns(mut self, offset_ns: i64) -> Self {
        self.offset_ns = offset_ns;
        self
    }

    /// Sets the drift in parts per billion (positive = runs fast), clamped to ±[`MAX_DRIFT_PPB`].
    pub fn with_drift_ppb(mut self, drift_ppb: i64) -> Self {
        self.drift_ppb = drift_ppb.clamp(-MAX_DRIFT_PPB, MAX_DRIFT_PPB);
        self
    }

    /// Sets the drift in parts per million (`ppm · 1000` ppb, clamped like [`Self::with_drift_ppb`]).
    pub fn with_drift_ppm(self, drift_ppm: i64) -> Self {
        self.with_drift_ppb(drift_ppm.saturating_mul(1_000))
    }

    /// Sets the jitter bound: each reading adds noise uniform in `[-jitter_ns, +jitter_ns]`.
    /// Bounds above `i64::MAX` are clamped to it.
    pub fn with_jitter_ns(mut self, jitter_ns: u64) -> Self {
        self.jitter_ns = jitter_ns.min(i64::MAX as u64);
        self
    }

    /// Chooses monotonic readings (the default) or raw ones; see the module docs.
    pub fn with_monotonic(mut self, monotonic: bool) -> Self {
        self.monotonic = monotonic;
        self
    }

    /// Adds the steps of `steps` (builder form of [`Self::add_step`]).
    pub fn with_steps(mut self, steps: impl IntoIterator<Item = Step>) -> Self {
        for s in steps {
            self.add_step(s.at, s.delta_ns);
        }
        self
    }

    pub fn offset_ns(&self) -> i64 {
        self.offset_ns
    }
    pub fn drift_ppb(&self) -> i64 {
        self.drift_ppb
    }
    pub fn jitter_ns(&self) -> u64 {
        self.jitter_ns
    }
    pub fn is_monotonic(&self) -> bool {
        self.monotonic
    }

    /// Steps scheduled but not yet taken, in the order they will be taken.
    pub fn pending_steps(&self) -> impl ExactSizeIterator<Item = &Step> + '_ {
        self.pending.iter()
    }

    /// Sum of the steps taken so far (scheduled ones that fired, plus [`Self::step_now`]).
    pub fn applied_steps_ns(&self) -> i64 {
        self.applied_steps_ns
    }

    /// Schedules a jump of `delta_ns` (negative = backward) at true time `at`. It takes effect
    /// at the first [`read`](Self::read) at or after `at` (at the next read if `at` is past).
    pub fn add_step(&mut self, at: SimTime, delta_ns: i64) {
        // Insert after every step with `at` ≤ the new one, so equal times keep insertion order.
        let idx = self.pending.partition_point(|s| s.at <= at);
        self.pending.insert(idx, Step { at, delta_ns });
    }

    /// Jumps the clock by `delta_ns` right away (negative = backward): the next reading moves
    /// by exactly that much relative to where it would have been.
    pub fn step_now(&mut self, delta_ns: i64) {
        self.take_step(delta_ns);
    }

    fn take_step(&mut self, delta_ns: i64) {
        self.applied_steps_ns = self.applied_steps_ns.saturating_add(delta_ns);
        if let Some(f) = self.floor.as_mut() {
            *f += i128::from(delta_ns);
        }
    }

    /// `⌊drift_ppb · t / 10⁹⌋`: the error drift has accumulated by true time `t`.
    fn drift_error_ns(&self, true_time: SimTime) -> i128 {
        (i128::from(true_time.as_nanos()) * i128::from(self.drift_ppb)).div_euclid(NS_PER_SEC)
    }

    /// The clock's error at true time `t` without jitter: offset + drift + every step with
    /// `at ≤ t` (taken or pending). Does not change the clock.
    pub fn nominal_error_ns(&self, true_time: SimTime) -> i128 {
        let pending: i128 = self.pending.iter().take_while(|s| s.at <= true_time).map(|s| i128::from(s.delta_ns)).sum();
        i128::from(self.offset_ns) + self.drift_error_ns(true_time) + i128::from(self.applied_steps_ns) + pending
    }

    /// The reading at true time `t` without jitter or monotonic clamping. Does not change the
    /// clock.
    pub fn nominal_reading(&self, true_time: SimTime) -> LocalTime {
        saturate(i128::from(SIM_EPOCH_NS) + i128::from(true_time.as_nanos()) + self.nominal_error_ns(true_time))
    }

    /// Reads the clock at true time `true_time`, drawing jitter from `rng` (one draw when
    /// `jitter_ns > 0`, none otherwise). Takes every pending step with `at ≤ true_time`.
    pub fn read(&mut self, true_time: SimTime, rng: &mut Rng) -> LocalTime {
        while let Some(s) = self.pending.front().copied() {
            if s.at > true_time {
                break;
            }
            self.pending.pop_front();
            self.take_step(s.delta_ns);
        }
        let jitter: i128 = if self.jitter_ns == 0 {
            0
        } else {
            let j = self.jitter_ns as i64; // ≤ i64::MAX by construction
            i128::from(rng.random_range(-j..=j))
        };
        let mut raw = i128::from(SIM_EPOCH_NS)
            + i128::from(true_time.as_nanos())
            + i128::from(self.offset_ns)
            + self.drift_error_ns(true_time)
            + i128::from(self.applied_steps_ns)
            + jitter;
        if self.monotonic {
            if let Some(f) = self.floor {
                raw = raw.max(f);
            }
        }
        let reading = saturate(raw);
        self.floor = Some(i128::from(reading.as_nanos()));
        reading
    }

    /// How much true time passes while this clock advances by `local` (ignoring jitter and
    /// steps): `local · 10⁹ / (10⁹ + drift_ppb)`, rounded up. The simulator uses it to fire a
    /// timer set for `local` of this node's time.
    pub fn true_duration_for_local(&self, local: Duration) -> Duration {
        let rate = NS_PER_SEC + i128::from(self.drift_ppb); // > 0 by the drift clamp
        let local_ns = i128::try_from(local.as_nanos()).unwrap_or(i128::MAX / NS_PER_SEC);
        let local_ns = local_ns.min(i128::from(u64::MAX));
        let true_ns = (local_ns * NS_PER_SEC + rate - 1) / rate;
        Duration::from_nanos(u64::try_from(true_ns).unwrap_or(u64::MAX))
    }
}

fn saturate(ns: i128) -> LocalTime {
    LocalTime(ns.clamp(0, i128::from(u64::MAX)) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kairos_core::Rng;
    use proptest::prelude::*;
    use rand::SeedableRng;

    fn rng(seed: u64) -> Rng {
        Rng::seed_from_u64(seed)
    }

    #[test]
    fn sim_epoch_is_2026_01_01_utc() {
        // 56 years since 1970, 14 of them leap years (1972..=2024).
        let days: u64 = 56 * 365 + 14;
        assert_eq!(SIM_EPOCH_NS, days * 86_400 * 1_000_000_000);
        assert_eq!(SIM_EPOCH.whole_secs(), 1_767_225_600);
    }

    #[test]
    fn perfect_clock_reads_epoch_plus_true_time_without_touching_rng() {
        let mut c = SimClock::perfect();
        let mut r = rng(1);
        let before = r.clone();
        for t in [0, 1, 999, 5_000_000_000, 3_600_000_000_000] {
            assert_eq!(c.read(SimTime(t), &mut r), LocalTime(SIM_EPOCH_NS + t));
        }
        assert_eq!(r, before, "a jitter-free clock must not draw from the rng");
    }

    #[test]
    fn offset_and_drift_are_exact_integer_arithmetic() {
        let mut r = rng(2);
        // +3 ms offset, +50 ppm drift: after 10 s the drift adds 500 µs.
        let mut c = SimClock::new(3_000_000, 0, 0).with_drift_ppm(50);
        assert_eq!(c.drift_ppb(), 50_000);
        let t = SimTime::from_secs(10);
        assert_eq!(c.read(t, &mut r), LocalTime(SIM_EPOCH_NS + 10_000_000_000 + 3_000_000 + 500_000));
        // Negative drift floors: -1 ppb over 1.5 ns of true time = -1.5e-9 ns -> -1.
        let c = SimClock::new(0, -1, 0);
        assert_eq!(c.nominal_error_ns(SimTime(1)), -1);
        assert_eq!(c.nominal_error_ns(SimTime(0)), 0);
        assert_eq!(c.nominal_error_ns(SimTime::from_secs(2)), -2);
    }

    #[test]
    fn drift_is_clamped_so_clock_never_stops() {
        assert_eq!(SimClock::perfect().with_drift_ppb(-5_000_000_000).drift_ppb(), -MAX_DRIFT_PPB);
        assert_eq!(SimClock::perfect().with_drift_ppm(i64::MAX).drift_ppb(), MAX_DRIFT_PPB);
    }

    #[test]
    fn jitter_is_bounded_and_seeded() {
        let j = 1_000;
        let mut c = SimClock::perfect().with_jitter_ns(j).with_monotonic(false);
        let mut r = rng(3);
        let mut seen_neg = false;
        let mut seen_pos = false;
        let mut readings = Vec::new();
        for i in 0..2_000u64 {
            let t = SimTime::from_millis(i);
            let err = i128::from(c.read(t, &mut r).as_nanos()) - i128::from(SIM_EPOCH_NS + t.as_nanos());
            assert!(err.abs() <= i128::from(j), "jitter {err} out of ±{j}");
            seen_neg |= err < 0;
            seen_pos |= err > 0;
            readings.push(err);
        }
        assert!(seen_neg && seen_pos, "jitter must go both ways");
        // Same seed, same readings.
        let mut c2 = SimClock::perfect().with_jitter_ns(j).with_monotonic(false);
        let mut r2 = rng(3);
        for (i, want) in readings.iter().enumerate() {
            let t = SimTime::from_millis(i as u64);
            let got = i128::from(c2.read(t, &mut r2).as_nanos()) - i128::from(SIM_EPOCH_NS + t.as_nanos());
            assert_eq!(got, *want);
        }
    }

    #[test]
    fn raw_jitter_can_go_backwards_but_monotonic_does_not() {
        let mut raw = SimClock::perfect().with_jitter_ns(1_000_000).with_monotonic(false);
        let mut mono = SimClock::perfect().with_jitter_ns(1_000_000);
        let (mut r1, mut r2) = (rng(4), rng(4));
        let (mut raw_back, mut last_raw, mut last_mono) = (false, LocalTime(0), LocalTime(0));
        for i in 0..1_000u64 {
            let t = SimTime::from_micros(i * 10);
            let a = raw.read(t, &mut r1);
            let b = mono.read(t, &mut r2);
            raw_back |= a < last_raw;
            assert!(b >= last_mono, "monotonic clock went back at step {i}");
            assert!(b >= a, "clamping only ever raises a reading");
            last_raw = a;
            last_mono = b;
        }
        assert!(raw_back, "raw readings with 1 ms jitter every 10 µs must go back sometimes");
    }

    #[test]
    fn scheduled_steps_fire_at_their_time_forward_and_backward() {
        let mut r = rng(5);
        let mut c = SimClock::perfect();
        c.add_step(SimTime::from_secs(2), -500_000_000); // back 0.5 s at t = 2 s
        c.add_step(SimTime::from_secs(1), 100); // forward 100 ns at t = 1 s (inserted out of order)
        assert_eq!(c.pending_steps().map(|s| s.at.as_nanos()).collect::<Vec<_>>(), vec![1_000_000_000, 2_000_000_000]);
        let e = |c: &mut SimClock, t: SimTime, r: &mut Rng| {
            c.read(t, r).as_nanos() as i128 - (SIM_EPOCH_NS + t.as_nanos()) as i128
        };
        assert_eq!(e(&mut c, SimTime::from_secs(1), &mut r), 100);
        assert_eq!(e(&mut c, SimTime(1_999_999_999), &mut r), 100);
        let before = c.read(SimTime(1_999_999_999), &mut r);
        let after = c.read(SimTime::from_secs(2), &mut r);
        assert!(after < before, "a backward step makes the clock go back even when monotonic");
        assert_eq!(before.as_nanos() - after.as_nanos(), 500_000_000 - 1);
        assert_eq!(c.applied_steps_ns(), 100 - 500_000_000);
        assert_eq!(c.pending_steps().len(), 0);
    }

    #[test]
    fn nominal_error_counts_pending_steps_without_taking_them() {
        let mut c = SimClock::new(7, 0, 0);
        c.add_step(SimTime::from_secs(5), 1_000);
        assert_eq!(c.nominal_error_ns(SimTime::from_secs(4)), 7);
        assert_eq!(c.nominal_error_ns(SimTime::from_secs(5)), 1_007);
        assert_eq!(c.pending_steps().len(), 1);
        assert_eq!(c.nominal_reading(SimTime::from_secs(5)), LocalTime(SIM_EPOCH_NS + 5_000_001_007));
    }

    #[test]
    fn step_now_moves_the_next_reading_by_exactly_delta() {
        let mut r = rng(6);
        let mut c = SimClock::new(0, 10_000, 0);
        let t = SimTime::from_secs(3);
        let a = c.read(t, &mut r);
        c.step_now(-2_000_000);
        let b = c.read(t, &mut r);
        assert_eq!(a.as_nanos() - b.as_nanos(), 2_000_000);
        c.step_now(5);
        assert_eq!(c.read(t, &mut r).as_nanos(), b.as_nanos() + 5);
    }

    #[test]
    fn readings_saturate_at_zero_and_at_max() {
        let mut r = rng(7);
        let mut c = SimClock::new(i64::MIN, 0, 0);
        assert_eq!(c.read(SimTime(0), &mut r), LocalTime(0));
        c.step_now(i64::MIN);
        assert_eq!(c.read(SimTime(10), &mut r), LocalTime(0));
        let mut c = SimClock::new(i64::MAX, MAX_DRIFT_PPB, 0);
        c.step_now(i64::MAX);
        assert_eq!(c.read(SimTime(u64::MAX), &mut r), LocalTime(u64::MAX));
    }

    #[test]
    fn true_duration_for_local_inverts_drift() {
        let fast = SimClock::perfect().with_drift_ppm(100); // runs 1.0001x
        let d = fast.true_duration_for_local(Duration::from_secs(1));
        // 1 s local = 1e18 / 1_000_100_000 ns true, rounded up.
        assert_eq!(d, Duration::from_nanos(999_900_010));
        assert_eq!(SimClock::perfect().true_duration_for_local(Duration::from_millis(3)), Duration::from_millis(3));
        let slow = SimClock::perfect().with_drift_ppm(-100);
        assert!(slow.true_duration_for_local(Duration::from_secs(1)) > Duration::from_secs(1));
    }

    proptest! {
        /// For consecutive readings r1, r2 with step deltas Σ taken in between: r2 ≥ r1 + Σ.
        #[test]
        fn monotonic_except_by_steps(
            seed in any::<u64>(),
            offset in -1_000_000_000i64..1_000_000_000,
            drift in -100_000i64..100_000,
            jitter in 0u64..10_000_000,
            steps in proptest::collection::vec((0u64..10_000_000_000, -1_000_000_000i64..1_000_000_000), 0..5),
            gaps in proptest::collection::vec(0u64..50_000_000, 1..200),
        ) {
            let mut c = SimClock::new(offset, drift, jitter);
            for (at, d) in &steps { c.add_step(SimTime(*at), *d); }
            let mut r = rng(seed);
            let mut t = 0u64;
            let mut last: Option<(LocalTime, i64)> = None;
            for g in gaps {
                t += g;
                let reading = c.read(SimTime(t), &mut r);
                let applied = c.applied_steps_ns();
                if let Some((prev, prev_applied)) = last {
                    let sigma = i128::from(applied) - i128::from(prev_applied);
                    prop_assert!(i128::from(reading.as_nanos()) >= i128::from(prev.as_nanos()) + sigma);
                }
                // And the reading is within jitter of nominal, or held by the floor above it.
                let nominal = i128::from(c.nominal_reading(SimTime(t)).as_nanos());
                prop_assert!(i128::from(reading.as_nanos()) >= nominal - i128::from(jitter));
                last = Some((reading, applied));
            }
        }
    }
}
