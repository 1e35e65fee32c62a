//! MongoDB's cluster time: a hybrid logical clock shaped like a BSON `Timestamp`.
//!
//! A [`ClusterTime`] is `(secs, inc)`: wall-clock seconds and a counter within the second,
//! compared as the `u64` `secs << 32 | inc`. A [`LogicalClock`] holds a node's current cluster
//! time and changes it by exactly these rules (docs/causal.md, "The clock"; MongoDB's
//! `LogicalClock`, 3.6–4.4):
//!
//! * **Tick** — [`LogicalClock::reserve_ticks`], only when a primary writes (reserves `n` oplog
//!   slots), given the node's wall clock:
//!   1. if `clock.secs < wall whole seconds`, the clock jumps to `(wall_secs, 0)`;
//!   2. otherwise, if `clock.inc + n > 2³¹−1`, it rolls to `(clock.secs + 1, 0)`;
//!   3. if the result `(s, i)` has `s > 2³¹−1` or `i + n > 2³¹−1`, the reservation fails with
//!      "cluster time cannot be advanced beyond its maximum value" (MongoDB code 40482) and the
//!      clock is unchanged;
//!   4. the write gets `(s, i + 1)` (the first reserved time) and the clock ends at `(s, i + n)`
//!      (the last reserved time).
//!
//!   `n` must be in `1..=2³¹−1`. Both fields are capped at 2³¹−1 ([`MAX_COMPONENT`], the signed
//!   32-bit maximum MongoDB keeps for compatibility with signed Timestamp readers), so the
//!   largest valid time is [`ClusterTime::MAX`] and wall seconds beyond 2³¹−1 (year 2038) fail.
//! * **Receive** — [`LogicalClock::advance`], for gossip in (`$clusterTime` on a message):
//!   first the *rate limiter*: a time whose `secs` is more than `max_acceptable_drift_secs`
//!   (MongoDB's `maxAcceptableLogicalClockDriftSecs`, default 365 days) ahead of this node's wall
//!   clock seconds is rejected with `ClusterTimeFailsRateLimiter` (205); a time beyond
//!   [`ClusterTime::MAX`] is rejected with 40484. Then `clock = max(clock, received)`, **no
//!   tick**. A rejected time leaves the clock unchanged.
//! * **Trusted source** — [`LogicalClock::advance_trusted`], for a secondary moving its clock to
//!   the applied oplog time: like receive but without the rate limiter (an idle node's wall clock
//!   may be far behind); only the maximum is checked (40483).
//!
//! This module knows nothing of signatures. Time proofs (HMAC-SHA1 over `as_u64() | 0xFFFF`,
//! [`crate::time_proof`]), the key ring ([`crate::keys`]) and the validator that decides whether
//! a received time may reach [`LogicalClock::advance`] ([`crate::validator`], whose
//! [`gossip_in`](crate::gossip_in) chains the two) live next to it; by the time a `ClusterTime`
//! gets here, the caller has already validated its signature. The signature errors
//! (`KeyNotFound` 211, `TimeProofMismatch` 204) and `InvalidOptions` (72, afterClusterTime
//! ahead of the clock, [`LogicalClock::check_after_cluster_time`]) share [`ClusterTimeError`].

use kairos_core::LocalTime;
use serde::{Deserialize, Serialize};
use std::fmt;
use thiserror::Error;

/// Largest value of either field of a [`ClusterTime`]: 2³¹ − 1.
pub const MAX_COMPONENT: u32 = i32::MAX as u32;

/// Default of `max_acceptable_drift_secs` (MongoDB's `maxAcceptableLogicalClockDriftSecs`):
/// 365 days.
pub const DEFAULT_MAX_ACCEPTABLE_DRIFT_SECS: u64 = 365 * 24 * 60 * 60;

/// A point of cluster time: `(secs, inc)`, ordered as `secs << 32 | inc`.
///
/// The derived order compares `secs` first, then `inc`, which is exactly the order of
/// [`as_u64`](Self::as_u64).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ClusterTime {
    pub secs: u32,
    pub inc: u32,
}

impl ClusterTime {
    /// `Timestamp(0, 0)`, the clock of a node that has seen nothing.
    pub const ZERO: ClusterTime = ClusterTime { secs: 0, inc: 0 };
    /// The largest time a [`LogicalClock`] accepts: `Timestamp(2³¹−1, 2³¹−1)`.
    pub const MAX: ClusterTime = ClusterTime { secs: MAX_COMPONENT, inc: MAX_COMPONENT };

    pub const fn new(secs: u32, inc: u32) -> Self {
        ClusterTime { secs, inc }
    }

    /// `secs << 32 | inc` (the BSON Timestamp's 64-bit value).
    pub const fn as_u64(self) -> u64 {
        (self.secs as u64) << 32 | self.inc as u64
    }

    /// Inverse of [`as_u64`](Self::as_u64).
    pub const fn from_u64(v: u64) -> Self {
        ClusterTime { secs: (v >> 32) as u32, inc: v as u32 }
    }

    /// Whether both fields are within [`MAX_COMPONENT`] (MongoDB's maximum possible time).
    pub const fn is_valid(self) -> bool {
        self.secs <= MAX_COMPONENT && self.inc <= MAX_COMPONENT
    }
}

impl fmt::Display for ClusterTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({}, {})", self.secs, self.inc)
    }
}

/// Which operation hit the maximum (MongoDB reports each with its own code).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum AdvanceKind {
    /// [`LogicalClock::reserve_ticks`] — code 40482.
    ReserveTicks,
    /// [`LogicalClock::advance_trusted`] — code 40483.
    TrustedSource,
    /// [`LogicalClock::advance`] — code 40484.
    Gossip,
}

/// Errors of the logical clock, each carrying MongoDB's numeric code ([`Self::code`]) and code
/// name ([`Self::code_name`]) so a replica-set member can answer exactly as MongoDB does.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ClusterTimeError {
    /// A received time is too far ahead of this node's wall clock (code 205).
    #[error(
        "new cluster time {received} is too far from this node's wall clock time: its {}s is more \
         than maxAcceptableLogicalClockDriftSecs ({max_drift_secs}s) ahead of the wall clock's \
         {wall_secs}s (ClusterTimeFailsRateLimiter, code 205); the time was not applied — check \
         the sender's clock or raise the limit",
        received.secs
    )]
    FailsRateLimiter { received: ClusterTime, wall_secs: u64, max_drift_secs: u64 },
    /// The clock would pass [`ClusterTime::MAX`] (codes 40482 / 40483 / 40484).
    #[error(
        "cluster time cannot be advanced beyond its maximum value: {attempted} plus {ticks} \
         tick(s) passes {} (code {}); the clock was left at {current}",
        ClusterTime::MAX,
        kind.code()
    )]
    BeyondMaximum {
        kind: AdvanceKind,
        /// The clock's value when the operation was refused (unchanged).
        current: ClusterTime,
        /// The time the operation would have started ticking from (or the received time);
        /// wide because a jump or roll-over may lie beyond `u32`.
        attempted: WideTime,
        ticks: u64,
    },
    /// `reserve_ticks` was asked for 0 or more than 2³¹−1 ticks (BadValue, code 2).
    #[error(
        "cannot reserve {ticks} cluster-time ticks: the count must be between 1 and {MAX_COMPONENT} (BadValue, code 2)"
    )]
    InvalidTickCount { ticks: u64 },
    /// A received time above the last validated one carried no signature, or a key id this
    /// node does not hold (or whose key had expired before that time) (code 211).
    #[error(
        "cannot validate cluster time {time}: {} (KeyNotFound, code 211); the time was not \
         applied — a time from another cluster, a dummy-signed time from an untrusted sender, or \
         keys not yet replicated to this node",
        match key_id {
            None => "it carries no signature".to_string(),
            Some(id) => format!("no signing key with keyId {id} valid for that time"),
        }
    )]
    KeyNotFound { time: ClusterTime, key_id: Option<i64> },
    /// A received time's signature hash is not the HMAC of that time under the named key
    /// (code 204).
    #[error(
        "cluster time {time}: the signature (keyId {key_id}) does not match the time \
         (TimeProofMismatch, code 204); the time was not applied — it was forged, altered, or \
         signed for another time range"
    )]
    TimeProofMismatch { time: ClusterTime, key_id: i64 },
    /// `readConcern.afterClusterTime` is greater than this node's cluster time (code 72).
    #[error(
        "readConcern afterClusterTime {after_cluster_time} is greater than this node's cluster \
         time {current} (InvalidOptions, code 72); the time cannot have been produced by this \
         cluster — gossip the matching $clusterTime with the request"
    )]
    InvalidOptions { after_cluster_time: ClusterTime, current: ClusterTime },
}

/// A `(secs, inc)` pair that may lie beyond `u32` (for error reports only).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct WideTime {
    pub secs: u64,
    pub inc: u64,
}

impl fmt::Display for WideTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({}, {})", self.secs, self.inc)
    }
}

impl From<ClusterTime> for WideTime {
    fn from(t: ClusterTime) -> Self {
        WideTime { secs: u64::from(t.secs), inc: u64::from(t.inc) }
    }
}

impl AdvanceKind {
    pub const fn code(self) -> i32 {
        match self {
            AdvanceKind::ReserveTicks => 40482,
            AdvanceKind::TrustedSource => 40483,
            AdvanceKind::Gossip => 40484,
        }
    }
    pub const fn code_name(self) -> &'static str {
        match self {
            AdvanceKind::ReserveTicks => "Location40482",
            AdvanceKind::TrustedSource => "Location40483",
            AdvanceKind::Gossip => "Location40484",
        }
    }
}

impl ClusterTimeError {
    /// MongoDB's numeric error code.
    pub const fn code(&self) -> i32 {
        match self {
            ClusterTimeError::FailsRateLimiter { .. } => 205,
            ClusterTimeError::BeyondMaximum { kind, .. } => kind.code(),
            ClusterTimeError::InvalidTickCount { .. } => 2,
            ClusterTimeError::KeyNotFound { .. } => 211,
            ClusterTimeError::TimeProofMismatch { .. } => 204,
            ClusterTimeError::InvalidOptions { .. } => 72,
        }
    }

    /// MongoDB's `codeName`.
    pub const fn code_name(&self) -> &'static str {
        match self {
            ClusterTimeError::FailsRateLimiter { .. } => "ClusterTimeFailsRateLimiter",
            ClusterTimeError::BeyondMaximum { kind, .. } => kind.code_name(),
            ClusterTimeError::InvalidTickCount { .. } => "BadValue",
            ClusterTimeError::KeyNotFound { .. } => "KeyNotFound",
            ClusterTimeError::TimeProofMismatch { .. } => "TimeProofMismatch",
            ClusterTimeError::InvalidOptions { .. } => "InvalidOptions",
        }
    }
}

/// A node's cluster-time clock. See the [module docs](self) for the rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogicalClock {
    time: ClusterTime,
    max_acceptable_drift_secs: u64,
}

impl Default for LogicalClock {
    fn default() -> Self {
        Self::new()
    }
}

impl LogicalClock {
    /// A clock at `Timestamp(0, 0)` with the default rate limit (365 days).
    pub const fn new() -> Self {
        LogicalClock { time: ClusterTime::ZERO, max_acceptable_drift_secs: DEFAULT_MAX_ACCEPTABLE_DRIFT_SECS }
    }

    /// Sets `maxAcceptableLogicalClockDriftSecs`: how many seconds a received time may be ahead
    /// of this node's wall clock. (0 accepts nothing ahead of the wall clock's second.)
    pub const fn with_max_acceptable_drift_secs(mut self, secs: u64) -> Self {
        self.max_acceptable_drift_secs = secs;
        self
    }

    /// Starts the clock at `time` (e.g. the last oplog entry after a restart). No checks: the
    /// caller restores a time this node itself produced or validated.
    pub const fn with_time(mut self, time: ClusterTime) -> Self {
        self.time = time;
        self
    }

    /// The current cluster time (the last time handed out or received).
    pub const fn current(&self) -> ClusterTime {
        self.time
    }

    pub const fn max_acceptable_drift_secs(&self) -> u64 {
        self.max_acceptable_drift_secs
    }

    /// Reserves `n` consecutive cluster times for a primary's write, given this node's wall
    /// clock reading. Returns the first reserved time; the clock ends at the last one. On error
    /// the clock is unchanged.
    pub fn reserve_ticks(&mut self, n: u64, wall: LocalTime) -> Result<ClusterTime, ClusterTimeError> {
        let max = u64::from(MAX_COMPONENT);
        if n == 0 || n > max {
            return Err(ClusterTimeError::InvalidTickCount { ticks: n });
        }
        let wall_secs = wall.whole_secs();
        let (secs, inc) = if u64::from(self.time.secs) < wall_secs {
            (wall_secs, 0)
        } else if u64::from(self.time.inc) + n > max {
            (u64::from(self.time.secs) + 1, 0)
        } else {
            (u64::from(self.time.secs), u64::from(self.time.inc))
        };
        if secs > max || inc + n > max {
            return Err(ClusterTimeError::BeyondMaximum {
                kind: AdvanceKind::ReserveTicks,
                current: self.time,
                attempted: WideTime { secs, inc },
                ticks: n,
            });
        }
        // secs ≤ 2³¹−1 and inc + n ≤ 2³¹−1: both fit u32.
        let secs = secs as u32;
        let first = ClusterTime::new(secs, (inc + 1) as u32);
        self.time = ClusterTime::new(secs, (inc + n) as u32);
        Ok(first)
    }

    /// Gossip in: applies the rate limiter against this node's wall clock, then
    /// `clock = max(clock, received)` without ticking. On error the clock is unchanged.
    pub fn advance(&mut self, received: ClusterTime, wall: LocalTime) -> Result<(), ClusterTimeError> {
        let wall_secs = wall.whole_secs();
        let secs = u64::from(received.secs);
        if secs > wall_secs && secs - wall_secs > self.max_acceptable_drift_secs {
            return Err(ClusterTimeError::FailsRateLimiter {
                received,
                wall_secs,
                max_drift_secs: self.max_acceptable_drift_secs,
            });
        }
        self.advance_checked(received, AdvanceKind::Gossip)
    }

    /// Checks a request's `readConcern.afterClusterTime` against this clock: a time greater than
    /// the clock is refused with `InvalidOptions` (72); otherwise the caller waits until it has
    /// applied up to `after_cluster_time`.
    pub fn check_after_cluster_time(&self, after_cluster_time: ClusterTime) -> Result<(), ClusterTimeError> {
        if after_cluster_time > self.time {
            return Err(ClusterTimeError::InvalidOptions { after_cluster_time, current: self.time });
        }
        Ok(())
    }

    /// From a trusted source (a secondary applying oplog entries): `clock = max(clock,
    /// received)` with no rate limiter and no tick; only the maximum is checked.
    pub fn advance_trusted(&mut self, received: ClusterTime) -> Result<(), ClusterTimeError> {
        self.advance_checked(received, AdvanceKind::TrustedSource)
    }

    fn advance_checked(&mut self, received: ClusterTime, kind: AdvanceKind) -> Result<(), ClusterTimeError> {
        if !received.is_valid() {
            return Err(ClusterTimeError::BeyondMaximum {
                kind,
                current: self.time,
                attempted: received.into(),
                ticks: 0,
            });
        }
        if received > self.time {
            self.time = received;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MAX: u32 = MAX_COMPONENT;

    fn ct(secs: u32, inc: u32) -> ClusterTime {
        ClusterTime::new(secs, inc)
    }

    /// A wall clock reading of `secs` whole seconds plus a fraction that must be ignored.
    fn wall(secs: u64) -> LocalTime {
        LocalTime::from_nanos(secs * 1_000_000_000 + 999_999_999)
    }

    #[test]
    fn constants() {
        assert_eq!(MAX_COMPONENT, 2_147_483_647);
        assert_eq!(DEFAULT_MAX_ACCEPTABLE_DRIFT_SECS, 31_536_000);
        assert_eq!(LogicalClock::new().max_acceptable_drift_secs(), 31_536_000);
        assert_eq!(LogicalClock::default().current(), ClusterTime::ZERO);
    }

    #[test]
    fn u64_encoding_display_and_serde() {
        let t = ct(1_767_225_600, 7);
        assert_eq!(t.as_u64(), (1_767_225_600u64 << 32) | 7);
        assert_eq!(ClusterTime::from_u64(t.as_u64()), t);
        assert_eq!(ClusterTime::from_u64(u64::MAX), ct(u32::MAX, u32::MAX));
        assert_eq!(t.to_string(), "Timestamp(1767225600, 7)");
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(json, r#"{"secs":1767225600,"inc":7}"#);
        assert_eq!(serde_json::from_str::<ClusterTime>(&json).unwrap(), t);
    }

    #[test]
    fn ordered_by_secs_then_inc() {
        assert!(ct(1, 0) > ct(0, u32::MAX));
        assert!(ct(5, 2) > ct(5, 1));
        assert!(ct(5, 1) == ct(5, 1));
        let mut v = vec![ct(3, 0), ct(1, 9), ct(2, 5), ct(2, 4), ct(1, 10)];
        v.sort();
        assert_eq!(v, vec![ct(1, 9), ct(1, 10), ct(2, 4), ct(2, 5), ct(3, 0)]);
    }

    proptest! {
        #[test]
        fn order_equals_u64_order(a in any::<u64>(), b in any::<u64>()) {
            let (x, y) = (ClusterTime::from_u64(a), ClusterTime::from_u64(b));
            prop_assert_eq!(x.cmp(&y), a.cmp(&b));
            prop_assert_eq!(x.as_u64(), a);
        }

        /// Successive reservations are strictly increasing and never overlap, whatever the
        /// wall clock does.
        #[test]
        fn reservations_strictly_increase(steps in proptest::collection::vec((1u64..5, 0u64..20), 1..100)) {
            let mut c = LogicalClock::new().with_time(ct(10, MAX - 50));
            let mut last = c.current();
            for (n, w) in steps {
                let first = c.reserve_ticks(n, wall(w)).unwrap();
                prop_assert!(first > last);
                prop_assert_eq!(c.current().secs, first.secs);
                prop_assert_eq!(u64::from(c.current().inc), u64::from(first.inc) + n - 1);
                last = c.current();
            }
        }
    }

    #[test]
    fn tick_jumps_to_wall_seconds_when_behind() {
        let mut c = LogicalClock::new().with_time(ct(100, 57));
        assert_eq!(c.reserve_ticks(1, wall(200)), Ok(ct(200, 1)));
        assert_eq!(c.current(), ct(200, 1));
        // From zero too.
        let mut c = LogicalClock::new();
        assert_eq!(c.reserve_ticks(1, wall(1_767_225_600)), Ok(ct(1_767_225_600, 1)));
    }

    #[test]
    fn tick_does_not_jump_when_clock_is_ahead_or_equal() {
        let mut c = LogicalClock::new().with_time(ct(300, 4));
        assert_eq!(c.reserve_ticks(1, wall(200)), Ok(ct(300, 5)));
        // Same second as the wall clock: no reset of inc.
        let mut c = LogicalClock::new().with_time(ct(200, 4));
        assert_eq!(c.reserve_ticks(1, wall(200)), Ok(ct(200, 5)));
    }

    #[test]
    fn inc_increments_by_one_per_tick() {
        let mut c = LogicalClock::new();
        let w = wall(50);
        let got: Vec<_> = (0..4).map(|_| c.reserve_ticks(1, w).unwrap()).collect();
        assert_eq!(got, vec![ct(50, 1), ct(50, 2), ct(50, 3), ct(50, 4)]);
        assert_eq!(c.current(), ct(50, 4));
    }

    #[test]
    fn inc_rolls_over_to_next_second_at_2_31_minus_1() {
        // inc may reach exactly 2^31-1 ...
        let mut c = LogicalClock::new().with_time(ct(10, MAX - 1));
        assert_eq!(c.reserve_ticks(1, wall(10)), Ok(ct(10, MAX)));
        // ... and the next tick rolls to (secs+1, 0) and hands out (secs+1, 1).
        assert_eq!(c.reserve_ticks(1, wall(10)), Ok(ct(11, 1)));
        assert_eq!(c.current(), ct(11, 1));
    }

    #[test]
    fn multi_tick_reservation_returns_first_and_ends_at_last() {
        let mut c = LogicalClock::new().with_time(ct(10, 5));
        assert_eq!(c.reserve_ticks(3, wall(10)), Ok(ct(10, 6)));
        assert_eq!(c.current(), ct(10, 8));
        // After a wall jump: (wall, 1) .. (wall, n).
        assert_eq!(c.reserve_ticks(4, wall(20)), Ok(ct(20, 1)));
        assert_eq!(c.current(), ct(20, 4));
        // Exactly fits: inc + n == 2^31-1.
        let mut c = LogicalClock::new().with_time(ct(10, MAX - 3));
        assert_eq!(c.reserve_ticks(3, wall(0)), Ok(ct(10, MAX - 2)));
        assert_eq!(c.current(), ct(10, MAX));
        // One more than fits rolls the whole block into the next second.
        let mut c = LogicalClock::new().with_time(ct(10, MAX - 3));
        assert_eq!(c.reserve_ticks(4, wall(0)), Ok(ct(11, 1)));
        assert_eq!(c.current(), ct(11, 4));
        // The largest block.
        let mut c = LogicalClock::new();
        assert_eq!(c.reserve_ticks(u64::from(MAX), wall(7)), Ok(ct(7, 1)));
        assert_eq!(c.current(), ct(7, MAX));
    }

    #[test]
    fn tick_count_must_be_1_to_2_31_minus_1() {
        let mut c = LogicalClock::new().with_time(ct(3, 3));
        for n in [0, u64::from(MAX) + 1, u64::MAX] {
            let e = c.reserve_ticks(n, wall(3)).unwrap_err();
            assert_eq!(e, ClusterTimeError::InvalidTickCount { ticks: n });
            assert_eq!((e.code(), e.code_name()), (2, "BadValue"));
        }
        assert_eq!(c.current(), ct(3, 3));
    }

    #[test]
    fn reaching_the_maximum_is_an_error_and_leaves_the_clock_unchanged() {
        // Rolling over from the last second is impossible.
        let start = ct(MAX, MAX - 1);
        let mut c = LogicalClock::new().with_time(start);
        assert_eq!(c.reserve_ticks(1, wall(0)), Ok(ct(MAX, MAX)));
        let e = c.reserve_ticks(1, wall(0)).unwrap_err();
        assert!(e.to_string().contains("cannot be advanced beyond its maximum value"), "{e}");
        assert_eq!((e.code(), e.code_name()), (40482, "Location40482"));
        assert_eq!(c.current(), ct(MAX, MAX));
        // A multi-tick block that does not fit in the last second.
        let mut c = LogicalClock::new().with_time(ct(MAX, 10));
        assert!(c.reserve_ticks(u64::from(MAX) - 10, wall(0)).is_ok());
        let mut c = LogicalClock::new().with_time(ct(MAX, 10));
        let e = c.reserve_ticks(u64::from(MAX) - 9, wall(0)).unwrap_err();
        assert_eq!(e.code(), 40482);
        assert_eq!(c.current(), ct(MAX, 10));
        // A wall clock beyond 2^31-1 seconds (year 2038) cannot be jumped to.
        let mut c = LogicalClock::new().with_time(ct(5, 5));
        let e = c.reserve_ticks(1, wall(u64::from(MAX) + 1)).unwrap_err();
        assert!(matches!(e, ClusterTimeError::BeyondMaximum { kind: AdvanceKind::ReserveTicks, .. }));
        assert_eq!(c.current(), ct(5, 5));
        // A clock restored beyond the maximum cannot tick (no u32 overflow either).
        let mut c = LogicalClock::new().with_time(ct(u32::MAX, u32::MAX));
        assert_eq!(c.reserve_ticks(1, wall(0)).unwrap_err().code(), 40482);
    }

    #[test]
    fn receive_takes_the_max_without_ticking() {
        let mut c = LogicalClock::new().with_time(ct(100, 5));
        // Smaller: no move.
        c.advance(ct(99, 1_000), wall(100)).unwrap();
        assert_eq!(c.current(), ct(100, 5));
        c.advance(ct(100, 4), wall(100)).unwrap();
        assert_eq!(c.current(), ct(100, 5));
        // Equal: no tick.
        c.advance(ct(100, 5), wall(100)).unwrap();
        assert_eq!(c.current(), ct(100, 5));
        // Larger: moves exactly there, even far ahead of the wall clock (within the limit) and
        // even when the wall clock is ahead of both (receive never reads the wall as a time).
        c.advance(ct(100, 6), wall(500)).unwrap();
        assert_eq!(c.current(), ct(100, 6));
        c.advance(ct(4_000, 0), wall(100)).unwrap();
        assert_eq!(c.current(), ct(4_000, 0));
    }

    #[test]
    fn rate_limiter_boundary_with_default_limit() {
        let w: u64 = 1_767_225_600;
        let limit = DEFAULT_MAX_ACCEPTABLE_DRIFT_SECS;
        let mut c = LogicalClock::new().with_time(ct(w as u32, 0));
        // Exactly at the limit: accepted.
        let at = ct((w + limit) as u32, 3);
        c.advance(at, wall(w)).unwrap();
        assert_eq!(c.current(), at);
        // One second over: rejected with 205, clock unchanged.
        let over = ct((w + limit + 1) as u32, 0);
        let e = c.advance(over, wall(w)).unwrap_err();
        assert_eq!(e, ClusterTimeError::FailsRateLimiter { received: over, wall_secs: w, max_drift_secs: limit });
        assert_eq!((e.code(), e.code_name()), (205, "ClusterTimeFailsRateLimiter"));
        assert!(e.to_string().contains("too far from this node's wall clock time"), "{e}");
        assert_eq!(c.current(), at);
    }

    #[test]
    fn rate_limiter_boundary_with_custom_limit() {
        let mut c = LogicalClock::new().with_max_acceptable_drift_secs(10);
        assert_eq!(c.max_acceptable_drift_secs(), 10);
        // The fraction of the wall second is ignored: wall(1000) is 1000.999999999 s.
        c.advance(ct(1_010, MAX), wall(1_000)).unwrap();
        assert_eq!(c.current(), ct(1_010, MAX));
        let e = c.advance(ct(1_011, 0), wall(1_000)).unwrap_err();
        assert_eq!(e.code(), 205);
        assert_eq!(c.current(), ct(1_010, MAX));
        // Times behind the wall clock are never rate-limited.
        let mut c = LogicalClock::new().with_max_acceptable_drift_secs(0);
        c.advance(ct(5, 0), wall(1_000)).unwrap();
        c.advance(ct(1_000, 9), wall(1_000)).unwrap();
        assert_eq!(c.current(), ct(1_000, 9));
        assert_eq!(c.advance(ct(1_001, 0), wall(1_000)).unwrap_err().code(), 205);
    }

    #[test]
    fn receive_beyond_maximum_is_rejected_after_the_rate_limiter() {
        let mut c = LogicalClock::new().with_time(ct(10, 0)).with_max_acceptable_drift_secs(u64::from(u32::MAX));
        let e = c.advance(ct(20, MAX + 1), wall(10)).unwrap_err();
        assert_eq!((e.code(), e.code_name()), (40484, "Location40484"));
        assert!(e.to_string().contains("cannot be advanced beyond its maximum value"));
        let e = c.advance(ct(MAX + 1, 0), wall(10)).unwrap_err();
        assert_eq!(e.code(), 40484);
        // With the default limit, the rate limiter speaks first.
        let mut d = LogicalClock::new();
        assert_eq!(d.advance(ct(u32::MAX, 0), wall(10)).unwrap_err().code(), 205);
        assert_eq!(c.current(), ct(10, 0));
        assert_eq!(d.current(), ClusterTime::ZERO);
    }

    #[test]
    fn trusted_source_skips_the_rate_limiter_but_not_the_maximum() {
        let mut c = LogicalClock::new().with_max_acceptable_drift_secs(1);
        c.advance_trusted(ct(2_000_000_000, 1)).unwrap();
        assert_eq!(c.current(), ct(2_000_000_000, 1));
        c.advance_trusted(ct(1, 1)).unwrap();
        assert_eq!(c.current(), ct(2_000_000_000, 1));
        let e = c.advance_trusted(ct(MAX + 1, 0)).unwrap_err();
        assert_eq!((e.code(), e.code_name()), (40483, "Location40483"));
        assert_eq!(c.current(), ct(2_000_000_000, 1));
    }

    #[test]
    fn after_cluster_time_above_the_clock_is_invalid_options() {
        let c = LogicalClock::new().with_time(ct(100, 5));
        assert_eq!(c.check_after_cluster_time(ct(100, 5)), Ok(()));
        assert_eq!(c.check_after_cluster_time(ct(3, 0)), Ok(()));
        let e = c.check_after_cluster_time(ct(100, 6)).unwrap_err();
        assert_eq!(e, ClusterTimeError::InvalidOptions { after_cluster_time: ct(100, 6), current: ct(100, 5) });
        assert_eq!((e.code(), e.code_name()), (72, "InvalidOptions"));
        assert!(e.to_string().contains("greater than this node's cluster time"), "{e}");
    }

    #[test]
    fn signature_error_codes_and_messages() {
        let e = ClusterTimeError::KeyNotFound { time: ct(1, 2), key_id: None };
        assert_eq!((e.code(), e.code_name()), (211, "KeyNotFound"));
        assert!(e.to_string().contains("carries no signature"), "{e}");
        let e = ClusterTimeError::KeyNotFound { time: ct(1, 2), key_id: Some(42) };
        assert!(e.to_string().contains("keyId 42"), "{e}");
        let e = ClusterTimeError::TimeProofMismatch { time: ct(1, 2), key_id: 42 };
        assert_eq!((e.code(), e.code_name()), (204, "TimeProofMismatch"));
        assert!(e.to_string().contains("Timestamp(1, 2)"), "{e}");
    }

    #[test]
    fn sim_epoch_fits_cluster_time() {
        let mut c = LogicalClock::new();
        let t = c.reserve_ticks(1, crate::SIM_EPOCH).unwrap();
        assert_eq!(t, ct(1_767_225_600, 1));
    }
}
