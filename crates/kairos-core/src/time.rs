//! Time as integer nanoseconds in newtypes, so true time and a node's clock reading can never
//! be mixed up by accident. Spans are [`std::time::Duration`] (itself integer nanoseconds).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// True time in nanoseconds since the start of a simulation. Only the simulator and the
/// history recorder see it; a role never does.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SimTime(pub u64);

/// A node's clock reading in nanoseconds since the Unix epoch. Under the simulator it is true
/// time shifted by the node's clock model (offset, drift, jitter, steps), so two nodes may
/// disagree; under the TCP host it is the system clock.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LocalTime(pub u64);

macro_rules! time_newtype {
    ($t:ident) => {
        impl $t {
            pub const ZERO: $t = $t(0);
            pub const fn from_nanos(ns: u64) -> Self {
                $t(ns)
            }
            pub const fn from_micros(us: u64) -> Self {
                $t(us * 1_000)
            }
            pub const fn from_millis(ms: u64) -> Self {
                $t(ms * 1_000_000)
            }
            pub const fn from_secs(s: u64) -> Self {
                $t(s * 1_000_000_000)
            }
            pub const fn as_nanos(self) -> u64 {
                self.0
            }
            pub fn as_secs_f64(self) -> f64 {
                self.0 as f64 / 1e9
            }
            pub fn as_millis_f64(self) -> f64 {
                self.0 as f64 / 1e6
            }
            /// Whole seconds (what a wall-clock-seconds reader like MongoDB's ClusterTime sees).
            pub const fn whole_secs(self) -> u64 {
                self.0 / 1_000_000_000
            }
            pub fn saturating_add(self, d: Duration) -> Self {
                $t(self.0.saturating_add(duration_nanos(d)))
            }
            pub fn saturating_sub(self, d: Duration) -> Self {
                $t(self.0.saturating_sub(duration_nanos(d)))
            }
            /// `self - earlier`, or zero if `earlier` is later.
            pub fn saturating_since(self, earlier: Self) -> Duration {
                Duration::from_nanos(self.0.saturating_sub(earlier.0))
            }
        }

        impl std::ops::Add<Duration> for $t {
            type Output = $t;
            fn add(self, d: Duration) -> $t {
                self.saturating_add(d)
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:.6}s", self.as_secs_f64())
            }
        }
    };
}

time_newtype!(SimTime);
time_newtype!(LocalTime);

/// A [`Duration`] as whole nanoseconds, saturating at `u64::MAX` (584 years).
pub fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_instead_of_wrapping() {
        assert_eq!(SimTime(u64::MAX) + Duration::from_secs(1), SimTime(u64::MAX));
        assert_eq!(LocalTime(5).saturating_sub(Duration::from_nanos(9)), LocalTime(0));
        assert_eq!(SimTime(10).saturating_since(SimTime(15)), Duration::ZERO);
        assert_eq!(SimTime::from_millis(3).saturating_since(SimTime::from_millis(1)), Duration::from_millis(2));
        assert_eq!(LocalTime::from_secs(7).whole_secs(), 7);
    }
}
