//! The real system clock, for the TCP host only.
//!
//! [`SystemClock::now`] reads `SystemTime::now()`. It is the one place in Kairos that reads the
//! wall clock, and only `kairos-net` may call it: protocol roles get their time from
//! `Ctx::now`, and the simulator gives each node a [`SimClock`](crate::SimClock) instead.
//! Its readings carry whatever error the host's NTP/PTP daemon leaves, and may jump backward
//! when that daemon steps the clock.

use kairos_core::LocalTime;
use std::time::{SystemTime, UNIX_EPOCH};

/// The host's real-time clock as a [`LocalTime`] (ns since the Unix epoch).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct SystemClock;

impl SystemClock {
    /// Reads the system clock. A clock set before 1970 reads 0; one past year 2554 saturates.
    #[allow(clippy::disallowed_methods)] // the TCP host's sanctioned wall-clock read
    pub fn now() -> LocalTime {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => LocalTime(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            Err(_) => LocalTime(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_plausible_unix_time() {
        let a = SystemClock::now();
        // After 2020-01-01 and before 2100-01-01.
        assert!(a.whole_secs() > 1_577_836_800 && a.whole_secs() < 4_102_444_800, "{a}");
    }
}
