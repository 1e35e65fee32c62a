//! Admission control for open-loop load: an adaptive limit on the transactions a coordinator
//! keeps in flight, so that load beyond what the servers can do is refused at the door instead
//! of queueing until everything times out.
//!
//! # Why
//! Open-loop arrivals do not slow down when the servers fall behind. Past saturation every
//! server's queue then grows without bound, and so does every transaction's latency, until
//! retransmissions (duplicate work), give-ups (wasted work) and heartbeats late enough to look
//! like failures (a view change aborts everything in flight) push committed throughput far below
//! the maximum: a collapse. A fixed in-flight cap does not prevent it — the right cap depends on
//! the deployment, the load mix and the CPU per transaction — so the limit adapts.
//!
//! # The rule (a damped Little's-law step on the latency above the floor)
//! The signal is the coordinator's own latency against its **floor**, the smallest commit
//! latency of the last one to two [`FLOOR_WINDOW`]s (the wide-area round trips with no
//! queueing), kept **per path** — per set of shards a transaction touches — because paths
//! differ by whole round trips: once a view change has moved one shard's leader abroad, the
//! transactions touching it commit in 265 ms and the others still in 134, and against a single
//! floor of 134 ms that mix read as 80 ms of queueing. The limit aims at latency = floor +
//! [`QUEUEING_TARGET`]: a little queueing keeps the servers busy through bursts, and the
//! target is absolute because every coordinator waits in the same server queues. Once per
//! floor (about a round trip), from the mean latency of the transactions that finished since
//! the last step and the mean of their paths' floors:
//! - When the servers are saturated, throughput is fixed, so by Little's law the in-flight
//!   count that gives the target latency is `in flight × (mean floor + target) / mean`. The step
//!   applies that factor, clamped to [1/[`STEP_MAX`], [`STEP_MAX`]] and damped (raised to
//!   [`DAMPING`]): the latencies a step sees answer the limit of a round trip before, and
//!   larger steps overshoot and oscillate (measured at 1.5× saturation with steps damped only
//!   to the power 0.5: committed throughput swung between 4k and 16k txn/s per 200 ms).
//! - Down, the step starts from the most transactions in flight since the last step, so an
//!   unused limit (the initial one) falls straight to what is in use; up, the limit grows
//!   only while at least half of it is in use (no evidence the servers could take more
//!   otherwise) and by at least one transaction.
//! - Down, the limit never goes below what carries the finishes of the last [`RATE_WINDOW`]
//!   at the target latency (finishes per second × (mean floor + target), Little's law again).
//!   At saturation the damped step stays above it; it matters where latency above the target
//!   is not queueing: NCC's coordinators next to their servers commit in 0.5 ms, and the few
//!   transactions that wait a wide-area trip for a remote writer's decision took the limit
//!   down to the handful in flight, where the next few waits shed load the servers could
//!   take (13–22 % of it at 26,000–52,000 txn/s offered).
//! - A give-up (no reply at all) halves the limit.
//! - **A stall**: a step is due once per floor, and the first finish after that takes it; when
//!   an arrival comes first, the arrival takes it, and the oldest transaction in flight
//!   counts as one more sample, of latency at least its age. Under load an arrival takes
//!   about every other step, and the oldest in flight is one sample among the many finishes
//!   of a floor: a small pull toward shedding sooner (on TPC-C, `--cpu-us 5`, the default
//!   sweep's maxima moved by −2 % to +22 %; Detock at 15,625 txn/s offered went from 10,182
//!   to 8,934). It decides when transactions stop finishing while arrivals go on. The
//!   dependency-graph protocols do that past their knee:
//!   a strongly connected component runs only once every member is complete, and while
//!   transactions keep arriving it keeps gaining members. On TPC-C at 31,250 txn/s offered
//!   (`--cpu-us 5`), Detock ran one component of 91,929 transactions, all of the run's, just
//!   after the arrivals stopped, and committed none in the measurement window; Janus at 5,000
//!   committed 2 txn/s. Stepping on finishes only, the limit had admitted 100 % and 91 % of
//!   the load. With the ages of what is in flight it sheds enough to keep components small:
//!   20,658 and 3,744 txn/s.
//! - Transactions invoked before the first commit ran on initial estimates and are ignored.
//!
//! **A slow start.** The limit starts at [`LIMIT_START`] (or the maximum, if lower) and, until
//! its first step down, grows by [`STEP_MAX`] per floor while at least half of it is in use
//! and latency stays within the target, as TCP's congestion window doubles before its first
//! loss. A lightly loaded coordinator never reaches it, so it refuses nothing; a loaded one
//! overshoots what the servers take by at most about one doubling, and comes down from there
//! as before. (Not by the Little's-law factor: near the target that is about 1.3 per floor,
//! and after the first step down, damped, about 1 % per floor — from below, the limit would
//! take seconds to reach the knee.) It used to start at the maximum: then every arrival of
//! the first round trip went in before any latency was seen, and past saturation that flood
//! alone sank the servers. Tiga at 256,000 txn/s offered, 4×
//! its maximum (`kairos bench tiga --measured-cpu --load-keys --load 256000 --duration-s 10`),
//! admitted 107,000 transactions in its first 0.75 s, its leaders fell behind, heartbeats came
//! late, view changes followed one another (54 in the run, each merging tens of thousands of
//! released entries in handlers of up to 649 ms), and nothing committed after 1.75 s. The limit
//! never falls below [`LIMIT_MIN`].
//!
//! # When the paths change
//! A view change moves leaders, and with them every path's round trip: the coordinator calls
//! [`AdmissionLimit::paths_changed`], and the limit forgets the old paths (no floors,
//! transactions that ran across the change ignored). Without that a leader moved farther
//! away reads as queueing until the floor window forgets the old floor (2–4 s), and the limit
//! sheds load the servers could take: in the leader-kill experiment (`kairos bench tiga
//! --load 1500 --kill-leader-at-s 1.5`) throughput did not come back to 90% of before within
//! the 5 s run.
//!
//! What the limit does then depends on why the view changed. **After a crash** (the limit
//! came down, if at all, on stalls and give-ups) it starts over, slow start included (with the
//! maximum as the start, before the slow start: the transactions stuck across the outage and
//! the arrivals behind them went in at once; the leader-kill experiment was back at 90 % of
//! before 0.70 s after the crash, detection included).
//! **Under overload** — a step down within the last [`FLOOR_WINDOW`] on finished transactions
//! that had queued beyond the target — it keeps its value, and until its next step down it
//! **regrows** undamped (up to [`STEP_MAX`] per floor while at least half of it is in use and
//! latency stays within the target). A reset there was a collapse: a server far enough behind
//! sends its heartbeat late, a view change follows, every coordinator's limit went back to the
//! maximum, the flood behind it delayed the next heartbeats, and so on. Tiga at 130,000 txn/s
//! offered, about 2.6× its maximum (`kairos bench micro --load 130000 --duration-s 10`,
//! measured CPU), committed nothing in the measurement window; with 500 µs handlers
//! (`--cpu-us 500`), 0 txn/s at 4,400 offered and 60 at 6,600, against about 1,050 at
//! saturation. With the limit kept, view changes stay few (two in each 10 s run with 500 µs
//! handlers, against ten) and throughput holds: 53,111 txn/s at 130,000 offered (49,220 at
//! 65,000), and 946 and 905 with 500 µs handlers.
//! (At 8,800 that model still collapses: every arrival, refused or not, costs its
//! coordinator 500 µs there, and the coordinators saturate.)
//!
//! Written here rather than taken from a crate: the well-known adaptive limiters (tower's,
//! Netflix's concurrency-limits) read the wall clock and run inside an async stack, while the
//! protocol roles are sans-IO and must decide from the virtual time they are handed.

use std::collections::BTreeMap;
use std::time::Duration;

use kairos_core::LocalTime;

/// The limit never falls below this many transactions in flight.
pub const LIMIT_MIN: f64 = 4.0;
/// The limit starts here (module docs: *A slow start*), or at the maximum if that is lower.
pub const LIMIT_START: f64 = 1024.0;
/// The queueing delay the limit aims at: latency = floor + this.
pub const QUEUEING_TARGET: Duration = Duration::from_millis(40);
/// The Little's-law correction of one step is clamped to this factor up, or its inverse down…
pub const STEP_MAX: f64 = 2.0;
/// … and only this power of it is applied (a damped step: the latencies a step sees answer
/// the limit of about one round trip before, so full steps overshoot and oscillate).
pub const DAMPING: f64 = 0.1;
/// The floor is the smallest commit latency of the current and the previous window this long.
pub const FLOOR_WINDOW: Duration = Duration::from_secs(2);
/// Finishes are counted over windows this long for the rate below which a step never takes
/// the limit (module docs).
pub const RATE_WINDOW: Duration = Duration::from_millis(100);
/// Paths with a floor of their own at most; the rest share one (`Path::MAX`).
pub const PATHS_MAX: usize = 256;

/// What a transaction's round trip depends on, for its floor: the bit mask of the shards it
/// touches (`path_of_shards`), or 0 where every transaction takes the same path.
pub type Path = u64;

/// The path of a transaction touching `shards` (shard s sets bit s mod 64).
pub fn path_of_shards(shards: impl IntoIterator<Item = u32>) -> Path {
    shards.into_iter().fold(0, |mask, s| mask | 1 << (s % 64))
}

/// How a transaction the coordinator admitted ended.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Finish {
    Committed,
    /// Aborted for good or for a retry (the protocol knows it took no effect).
    Aborted,
    /// Given up with its outcome unknown (no reply in time).
    GaveUp,
}

/// The adaptive in-flight limit of one coordinator (module docs).
#[derive(Clone, Debug)]
pub struct AdmissionLimit {
    /// Off: a fixed limit of `max` in flight, and `on_finish` learns nothing.
    adaptive: bool,
    limit: f64,
    max: f64,
    /// Per path (the shards a transaction touches): the smallest commit latency of the
    /// current window and of the previous one.
    window_min: BTreeMap<Path, [Option<Duration>; 2]>,
    window_start: LocalTime,
    /// Transactions invoked before this ran on paths that changed since (`paths_changed`):
    /// ignored, floor included.
    since: LocalTime,
    /// Transactions invoked before the first commit ran on initial estimates: not samples.
    first_commit: Option<LocalTime>,
    /// The current control step: latencies summed, samples, the most in flight, a give-up.
    step_until: LocalTime,
    latency_sum: Duration,
    /// The floors of the paths of the same samples.
    floor_sum: Duration,
    samples: u32,
    /// Finishes per second, counted over windows of [`RATE_WINDOW`] (the last full one).
    rate_window_start: LocalTime,
    rate_window_finishes: u32,
    finishes_per_s: f64,
    in_flight_peak: usize,
    gave_up: bool,
    steps_down: u64,
    /// The finishes' own share of the samples since the last step: what shows queueing (a
    /// stall sample shows only that something is stuck).
    finish_latency_sum: Duration,
    finish_target_sum: Duration,
    /// The last step down taken while finished transactions had queued beyond the target.
    queueing_at: Option<LocalTime>,
    /// Since the paths changed with the limit kept, until the first step down: steps up are
    /// not damped.
    regrowing: bool,
    /// Until the first step down (module docs: *A slow start*): steps up double the limit.
    slow_start: bool,
}

impl AdmissionLimit {
    /// A limit that never exceeds `max` transactions in flight; it adapts (module docs: it
    /// starts at [`LIMIT_START`] or `max`, whichever is lower) only when `adaptive`, and is
    /// otherwise the fixed cap `max`.
    pub fn new(max: usize, adaptive: bool) -> Self {
        let max = (max as f64).max(1.0);
        AdmissionLimit {
            adaptive,
            limit: if adaptive { max.min(LIMIT_START) } else { max },
            max,
            window_min: BTreeMap::new(),
            window_start: LocalTime::ZERO,
            since: LocalTime::ZERO,
            first_commit: None,
            step_until: LocalTime::ZERO,
            latency_sum: Duration::ZERO,
            floor_sum: Duration::ZERO,
            samples: 0,
            rate_window_start: LocalTime::ZERO,
            rate_window_finishes: 0,
            finishes_per_s: 0.0,
            in_flight_peak: 0,
            gave_up: false,
            steps_down: 0,
            finish_latency_sum: Duration::ZERO,
            finish_target_sum: Duration::ZERO,
            queueing_at: None,
            regrowing: false,
            slow_start: adaptive,
        }
    }

    /// How many transactions may be in flight now.
    pub fn limit(&self) -> usize {
        self.limit.min(self.max) as usize
    }

    /// Whether a new transaction may start with `in_flight` already in flight.
    pub fn admits(&self, in_flight: usize) -> bool {
        in_flight < self.limit()
    }

    /// The paths to the servers changed at `now` (a view change moved a leader): what the
    /// limit learned describes the old paths, so it forgets them — no floor, and the
    /// transactions invoked before `now` (they ran across the change) ignored. Without this a
    /// lasting rise of the round trip reads as queueing until the floor window forgets the old
    /// floor, and the limit sheds load the servers could take. The limit starts over (slow
    /// start), unless it came down on queueing lately: then it keeps its value and regrows
    /// undamped until its next step down (module docs: *When the paths change*).
    pub fn paths_changed(&mut self, now: LocalTime) {
        if self.adaptive {
            let fresh = AdmissionLimit::new(self.max as usize, true);
            let overloaded = self.queueing_at.is_some_and(|t| now.saturating_since(t) <= FLOOR_WINDOW);
            let (limit, regrowing, slow_start) =
                if overloaded { (self.limit, true, false) } else { (fresh.limit, false, true) };
            let (steps_down, queueing_at) = (self.steps_down, self.queueing_at);
            *self = AdmissionLimit { since: now, steps_down, queueing_at, limit, regrowing, slow_start, ..fresh };
        }
    }

    /// How many control steps lowered the limit.
    pub fn steps_down(&self) -> u64 {
        self.steps_down
    }

    /// The commit latency taken as uncongested on `path` (module docs), once a commit on it
    /// was seen.
    pub fn path_floor(&self, path: Path) -> Option<Duration> {
        self.window_min.get(&path)?.iter().flatten().min().copied()
    }

    /// The smallest floor of any path: the shortest round trip (module docs).
    pub fn floor(&self) -> Option<Duration> {
        self.window_min.values().flatten().flatten().min().copied()
    }

    /// A transaction on `path` (for example the bit mask of the shards it touches) invoked at
    /// `invoked_at` finished at `now`, with `in_flight` transactions (itself included) in flight
    /// just before. Returns whether the limit was lowered.
    pub fn on_finish(
        &mut self,
        now: LocalTime,
        invoked_at: LocalTime,
        path: Path,
        in_flight: usize,
        finish: Finish,
    ) -> bool {
        if !self.adaptive || invoked_at < self.since {
            return false;
        }
        let latency = now.saturating_since(invoked_at);
        self.rate_window_finishes += 1;
        let rate_elapsed = now.saturating_since(self.rate_window_start);
        if rate_elapsed >= RATE_WINDOW {
            self.finishes_per_s = f64::from(self.rate_window_finishes) / rate_elapsed.as_secs_f64();
            (self.rate_window_start, self.rate_window_finishes) = (now, 0);
        }
        if now.saturating_since(self.window_start) >= FLOOR_WINDOW {
            self.window_min.retain(|_, [previous, current]| {
                (*previous, *current) = (*current, None);
                previous.is_some()
            });
            self.window_start = now;
        }
        let path =
            if self.window_min.len() < PATHS_MAX || self.window_min.contains_key(&path) { path } else { Path::MAX };
        if finish == Finish::Committed {
            let current = &mut self.window_min.entry(path).or_default()[1];
            *current = Some(current.map_or(latency, |m| m.min(latency)));
        }
        let (Some(floor), Some(first)) = (self.floor(), self.first_commit) else {
            if finish == Finish::Committed {
                self.first_commit = Some(now);
                self.step_until = now + latency;
            }
            return false;
        };
        if invoked_at < first {
            return false;
        }
        self.in_flight_peak = self.in_flight_peak.max(in_flight);
        if finish == Finish::GaveUp {
            self.gave_up = true;
        } else if let Some(path_floor) = self.path_floor(path) {
            self.latency_sum += latency;
            self.floor_sum += path_floor;
            self.samples += 1;
            self.finish_latency_sum += latency;
            self.finish_target_sum += path_floor + QUEUEING_TARGET;
        }
        if now < self.step_until {
            return false;
        }
        self.step(now, floor)
    }

    /// An arrival at `now`, with `in_flight` transactions in flight of which the oldest was
    /// invoked at `oldest_invoked_at`: takes the control step if one is due and no finish came
    /// to take it, counting the oldest transaction in flight as one more sample, of latency at
    /// least its age (module docs: *A stall*). Call it before [`AdmissionLimit::admits`].
    /// Returns whether the limit was lowered.
    pub fn on_arrival(&mut self, now: LocalTime, in_flight: usize, oldest_invoked_at: Option<LocalTime>) -> bool {
        let (Some(floor), Some(first)) = (self.floor(), self.first_commit) else { return false };
        if !self.adaptive || now < self.step_until {
            return false;
        }
        self.in_flight_peak = self.in_flight_peak.max(in_flight);
        if let Some(oldest) = oldest_invoked_at {
            // Those invoked before the first commit or a change of paths are not samples; the
            // first invoked after it is at least as old as either (with arrivals going on,
            // some are in flight). Its path is unknown here: the largest floor is the least it
            // could take.
            let invoked_at = oldest.max(first).max(self.since);
            let floor_max = self.window_min.values().flatten().flatten().max().copied().unwrap_or(floor);
            self.latency_sum += now.saturating_since(invoked_at);
            self.floor_sum += floor_max;
            self.samples += 1;
        }
        self.step(now, floor)
    }

    /// One control step at `now` from the samples since the last one (module docs).
    fn step(&mut self, now: LocalTime, floor: Duration) -> bool {
        self.step_until = now + floor;
        let step = if self.gave_up {
            1.0 / STEP_MAX
        } else if self.samples > 0 {
            let target = self.floor_sum + QUEUEING_TARGET * self.samples;
            let factor = (target.as_secs_f64() / self.latency_sum.as_secs_f64()).clamp(1.0 / STEP_MAX, STEP_MAX);
            if self.slow_start && factor >= 1.0 {
                STEP_MAX
            } else if self.regrowing && factor > 1.0 {
                factor
            } else {
                factor.powf(DAMPING)
            }
        } else {
            1.0
        };
        let peak = self.in_flight_peak as f64;
        let floor_mean = if self.samples > 0 { self.floor_sum / self.samples } else { floor };
        // What carries the finishes of the last window at the target latency (Little's law).
        let carries = self.finishes_per_s * (floor_mean + QUEUEING_TARGET).as_secs_f64();
        let queueing = self.finish_latency_sum > self.finish_target_sum;
        (self.latency_sum, self.floor_sum, self.samples) = (Duration::ZERO, Duration::ZERO, 0);
        (self.finish_latency_sum, self.finish_target_sum) = (Duration::ZERO, Duration::ZERO);
        (self.in_flight_peak, self.gave_up) = (0, false);
        if step < 1.0 {
            if queueing {
                self.queueing_at = Some(now);
            }
            (self.regrowing, self.slow_start) = (false, false);
            self.limit = (self.limit.min(peak) * step).max(carries.min(self.max)).max(LIMIT_MIN);
            self.steps_down += 1;
            return true;
        }
        if peak * 2.0 >= self.limit {
            self.limit = (self.limit * step).max(self.limit + 1.0).min(self.max);
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Feeds `n` finishes of latency `latency` 1 ms apart from `*now` with `in_flight` in flight,
    /// each just after an arrival (the oldest in flight as old as the one finishing).
    fn feed(a: &mut AdmissionLimit, now: &mut LocalTime, n: u32, latency: Duration, in_flight: usize) {
        for _ in 0..n {
            *now = *now + ms(1);
            a.on_arrival(*now, in_flight, Some(now.saturating_sub(latency)));
            a.on_finish(*now, now.saturating_sub(latency), 0, in_flight, Finish::Committed);
        }
    }

    #[test]
    fn a_stall_lowers_the_limit_below_what_is_in_flight_without_any_finish() {
        let mut a = AdmissionLimit::new(1000, true);
        let mut now = LocalTime::from_secs(1);
        feed(&mut a, &mut now, 1_000, ms(100), 20);
        assert_eq!((a.limit(), a.steps_down()), (1000, 0));
        // Nothing finishes from here on while arrivals go on, one per millisecond.
        let stalled_from = now;
        let mut in_flight = 20;
        for _ in 0..1_000 {
            now = now + ms(1);
            a.on_arrival(now, in_flight, Some(stalled_from));
            if a.admits(in_flight) {
                in_flight += 1;
            }
        }
        assert!(a.steps_down() >= 5, "a step per floor once the oldest is late: {}", a.steps_down());
        // Admissions stopped within three floors (300 arrivals) of the stall, and the limit
        // went on falling below what is in flight.
        assert!(in_flight < 20 + 300 && a.limit() < in_flight * 3 / 4, "admitted {in_flight}, limit {}", a.limit());
    }

    #[test]
    fn an_unloaded_coordinator_is_never_limited() {
        let mut a = AdmissionLimit::new(1000, true);
        let mut now = LocalTime::from_secs(1);
        feed(&mut a, &mut now, 10_000, ms(100), 20);
        assert_eq!((a.limit(), a.steps_down()), (1000, 0));
        assert!(a.admits(999) && !a.admits(1000));
    }

    #[test]
    fn switched_off_it_is_the_fixed_cap_whatever_the_latency() {
        let mut a = AdmissionLimit::new(1000, false);
        let mut now = LocalTime::from_secs(1);
        feed(&mut a, &mut now, 100, ms(100), 900);
        feed(&mut a, &mut now, 5000, ms(900), 900);
        assert_eq!((a.limit(), a.steps_down(), a.floor()), (1000, 0, None));
        assert!(a.admits(999) && !a.admits(1000));
    }

    #[test]
    fn queueing_above_the_target_lowers_the_limit_from_what_is_in_flight_and_its_absence_raises_it() {
        let mut a = AdmissionLimit::new(10_000, true);
        let mut now = LocalTime::from_secs(1);
        feed(&mut a, &mut now, 1000, ms(100), 500);
        assert_eq!((a.floor(), a.limit()), (Some(ms(100)), LIMIT_START as usize), "less than half in use: no growth");
        // Latency 300 ms = floor + 200 ms: Little's law asks for 140/300 of the 500 in flight;
        // the damped step takes (140/300)^0.1 of it per round trip.
        while a.steps_down() == 0 {
            feed(&mut a, &mut now, 1, ms(300), 500);
        }
        let first = a.limit();
        let full_queue = (500.0 * (140.0f64 / 300.0).powf(DAMPING)) as usize;
        assert!((full_queue..500).contains(&first), "{first}");
        feed(&mut a, &mut now, 1000, ms(300), 500);
        let lowered = a.limit();
        assert!(lowered < first && a.steps_down() >= 10, "{lowered} {}", a.steps_down());
        // Back at the floor with the limit in use: it grows again, and never past the maximum.
        feed(&mut a, &mut now, 2000, ms(100), lowered);
        assert!(a.limit() > lowered, "{} {lowered}", a.limit());
        // Not when little of it is used (after the step that still sees the last period's use).
        let quarter = a.limit() / 4;
        feed(&mut a, &mut now, 200, ms(100), quarter);
        let used = a.limit();
        feed(&mut a, &mut now, 2000, ms(100), quarter);
        assert_eq!(a.limit(), used);
    }

    #[test]
    fn a_give_up_halves_the_limit_and_it_never_falls_below_the_minimum() {
        let mut a = AdmissionLimit::new(1000, true);
        let mut now = LocalTime::from_secs(1);
        feed(&mut a, &mut now, 7000, ms(100), 400);
        now = now + ms(200);
        assert!(a.on_finish(now, now.saturating_sub(ms(6000)), 0, 400, Finish::GaveUp));
        assert_eq!(a.limit(), 200);
        for _ in 0..100 {
            now = now + ms(200);
            a.on_finish(now, now.saturating_sub(ms(6000)), 0, 1, Finish::GaveUp);
        }
        assert_eq!(a.limit(), LIMIT_MIN as usize);
    }

    /// The floor is a windowed minimum: when the leaders move farther away, the new round
    /// trip becomes the floor within two windows and stops reading as queueing.
    #[test]
    fn the_floor_follows_a_lasting_change_of_round_trip() {
        let mut a = AdmissionLimit::new(1000, true);
        let mut now = LocalTime::from_secs(1);
        feed(&mut a, &mut now, 100, ms(100), 10);
        feed(&mut a, &mut now, 6000, ms(200), 10);
        assert_eq!(a.floor(), Some(ms(200)));
        let steps = a.steps_down();
        feed(&mut a, &mut now, 1000, ms(200), 10);
        assert_eq!(a.steps_down(), steps);
    }

    /// Transactions invoked before the first commit (on the initial delay estimates) say
    /// nothing about queueing.
    #[test]
    fn transactions_invoked_before_the_first_commit_are_ignored() {
        let mut a = AdmissionLimit::new(1000, true);
        let t0 = LocalTime::from_secs(1);
        a.on_finish(t0, t0.saturating_sub(ms(100)), 0, 50, Finish::Committed);
        for i in 1..500 {
            assert!(!a.on_finish(t0 + ms(i), t0.saturating_sub(ms(400)), 0, 50, Finish::Committed));
        }
        assert_eq!(a.limit(), 1000);
    }

    /// A view change moves a leader farther away for good: the limit forgets the old paths at
    /// once, so the slower round trip is the new floor, not queueing, and nothing is shed.
    #[test]
    fn after_the_paths_change_a_slower_round_trip_is_the_new_floor() {
        let mut a = AdmissionLimit::new(1000, true);
        let mut now = LocalTime::from_secs(1);
        feed(&mut a, &mut now, 1000, ms(100), 10);
        a.paths_changed(now);
        assert_eq!((a.floor(), a.limit()), (None, 1000), "nothing had queued: the limit is at the maximum");
        // What was in flight across the change finishes late: ignored.
        for i in 1..100 {
            assert!(!a.on_finish(now + ms(i), now.saturating_sub(ms(50)), 0, 500, Finish::Committed));
        }
        assert_eq!(a.floor(), None);
        feed(&mut a, &mut now, 3000, ms(200), 10);
        assert_eq!((a.floor(), a.limit(), a.steps_down()), (Some(ms(200)), 1000, 0));
        // Without the change, the same history sheds load for a while.
        let mut b = AdmissionLimit::new(1000, true);
        let mut now = LocalTime::from_secs(1);
        feed(&mut b, &mut now, 1000, ms(100), 10);
        feed(&mut b, &mut now, 1000, ms(200), 10);
        assert!(b.steps_down() > 0 && b.limit() < 1000, "{} {}", b.steps_down(), b.limit());
    }

    /// Overload: the limit came down on queueing, then a server far behind sent its heartbeat
    /// late and a view change followed. The limit keeps its value (a reset to the maximum let
    /// the whole overload in at once, and the next heartbeats came late too: the collapse the
    /// module docs describe), and regrows undamped while the new paths show no queueing.
    #[test]
    fn after_the_paths_change_the_limit_keeps_its_value_and_regrows_undamped() {
        let mut a = AdmissionLimit::new(1000, true);
        let mut now = LocalTime::from_secs(1);
        feed(&mut a, &mut now, 500, ms(100), 10);
        // Queueing: 400 ms against a 100 ms floor, the limit in full use.
        feed(&mut a, &mut now, 2000, ms(400), 1000);
        let shed = a.limit();
        assert!(shed < 500, "the limit came down: {shed}");
        a.paths_changed(now);
        assert_eq!((a.floor(), a.limit()), (None, shed), "kept, not back at the maximum");
        // The new paths are quiet (latency at the floor, so Little's law asks for (floor +
        // target) / floor = 1.4× as many in flight) and the limit is in use: once the new floor
        // is known, each step takes the whole 1.4× (damped it would be 1.4^0.1 = 1.03×)…
        feed(&mut a, &mut now, 100, ms(100), shed);
        let mut limits = vec![a.limit()];
        for _ in 0..3 {
            let in_use = a.limit();
            feed(&mut a, &mut now, 100, ms(100), in_use);
            limits.push(a.limit());
        }
        assert!(limits.windows(2).all(|w| w[1] >= w[0] * 13 / 10), "undamped: {limits:?}");
        // … until the first step down, after which steps are damped again.
        let in_use = a.limit();
        feed(&mut a, &mut now, 200, ms(400), in_use);
        let down = a.limit();
        feed(&mut a, &mut now, 100, ms(100), down);
        assert!(a.limit() < down * 12 / 10, "damped again: {down} → {}", a.limit());
    }

    /// The slow start: from [`LIMIT_START`], a limit in use at the floor's latency doubles per
    /// floor up to the maximum; the first step down ends it, and growth is damped from then on.
    #[test]
    fn the_limit_starts_low_and_grows_undamped_until_its_first_step_down() {
        let mut a = AdmissionLimit::new(15_000, true);
        assert_eq!(a.limit(), LIMIT_START as usize, "nothing admitted on no evidence beyond the start");
        let mut now = LocalTime::from_secs(1);
        // Always all of it in use, at the floor's latency: 1024 × 2^n reaches 15,000 in 4
        // floors (400 finishes).
        let mut floors = 0;
        while a.limit() < 15_000 {
            let in_use = a.limit();
            feed(&mut a, &mut now, 100, ms(100), in_use);
            floors += 1;
            assert!(floors <= 5, "still {} after {floors} floors", a.limit());
        }
        assert_eq!(a.steps_down(), 0);
        // Queueing: a step down, and the slow start is over.
        while a.steps_down() == 0 {
            feed(&mut a, &mut now, 1, ms(300), 15_000);
        }
        let down = a.limit();
        feed(&mut a, &mut now, 100, ms(100), down);
        assert!(a.limit() < down * 12 / 10, "damped after the slow start: {down} → {}", a.limit());
    }

    /// A crash: transactions stop finishing, the stalls take the limit down, then the view
    /// changes. Nothing had queued, so the limit starts over (at the maximum here, which is
    /// below [`LIMIT_START`]) and what was stuck across the outage goes in with the arrivals
    /// behind it.
    #[test]
    fn after_a_crash_stall_the_paths_change_starts_the_limit_over() {
        let mut a = AdmissionLimit::new(1000, true);
        let mut now = LocalTime::from_secs(1);
        feed(&mut a, &mut now, 500, ms(100), 300);
        let stalled_since = now;
        for _ in 0..1000 {
            now = now + ms(1);
            a.on_arrival(now, 300, Some(stalled_since));
        }
        assert!(a.limit() < 300, "the stall took the limit down: {}", a.limit());
        a.paths_changed(now);
        assert_eq!(a.limit(), 1000);
    }

    /// NCC's coordinators next to their servers commit in 0.5 ms, but a transaction that meets
    /// a remote writer's undecided version waits for its decision, a wide-area trip: a tail of
    /// protocol waits above the 40 ms target. A step then went down from the one or two
    /// transactions in flight to the minimum of 4, and the limit never grew back (it grows only
    /// while half of it is in use), so the next few waits shed arrivals the servers could take
    /// (13–22 % of NCC's load at 26,000–52,000 txn/s). A step never goes below what carries the
    /// finishes of the last window at the target latency.
    #[test]
    fn a_sub_millisecond_floor_with_a_tail_of_protocol_waits_keeps_what_carries_the_load() {
        let mut a = AdmissionLimit::new(1000, true);
        let mut now = LocalTime::from_secs(1);
        // 2,000 finishes per second: every 50th waited 60 ms for a remote decision.
        for i in 0..20_000u32 {
            now = now + Duration::from_micros(500);
            let latency = if i % 50 == 0 { ms(60) } else { Duration::from_micros(500) };
            a.on_finish(now, now.saturating_sub(latency), 0, 2, Finish::Committed);
        }
        assert!(a.steps_down() > 0, "the waits read as queueing");
        // 2,000/s × (0.5 + 40) ms = 81 in flight at least.
        assert!(a.limit() >= 80, "limit {} after {} steps down", a.limit(), a.steps_down());
    }

    /// Transactions on different shards take different round trips: a steady mix of 134 ms
    /// and 265 ms paths is no queueing, however far its mean is from the shortest floor.
    #[test]
    fn each_path_is_measured_against_its_own_floor() {
        let (short, long) = (path_of_shards([0, 2]), path_of_shards([1, 2]));
        let mut a = AdmissionLimit::new(1000, true);
        let mut now = LocalTime::from_secs(1);
        for i in 0..6000 {
            now = now + ms(1);
            let (path, latency) = if i % 2 == 0 { (short, ms(134)) } else { (long, ms(265)) };
            // 1,000 finishes per second at a mean of 200 ms: 200 in flight (Little's law).
            a.on_finish(now, now.saturating_sub(latency), path, 200, Finish::Committed);
        }
        assert_eq!((a.path_floor(short), a.path_floor(long)), (Some(ms(134)), Some(ms(265))));
        assert_eq!((a.limit(), a.steps_down()), (1000, 0));
        // Queueing on the long path alone still lowers the limit.
        for _ in 0..2000 {
            now = now + ms(1);
            a.on_finish(now, now.saturating_sub(ms(400)), long, 400, Finish::Committed);
        }
        assert!(a.steps_down() > 0 && a.limit() < 400, "{} {}", a.steps_down(), a.limit());
    }
}
