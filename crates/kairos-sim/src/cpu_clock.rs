//! The clock of the measured-CPU service model: the CPU time of the calling thread, so that a
//! handler is charged what it computed, not the time the operating system spent running
//! other processes while it was descheduled (this machine is shared: wall-clock timing would
//! charge the neighbours' work to the protocol). Falls back to the monotonic wall clock where
//! per-thread CPU time is unavailable.

use std::time::Duration;

/// The calling thread's CPU time since an arbitrary origin.
#[cfg(unix)]
pub fn now() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID needs nothing else.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return wall();
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// What reading the clock twice costs by itself: the least of many back-to-back pairs,
/// measured once per process. On Linux the thread CPU clock is a system call (about 0.6 µs a
/// pair here), so every handler's measurement includes about that much that is not the
/// handler's; the measured-CPU model subtracts it, or a protocol that handles more events
/// would pay for the measurement, not for its code. The least is taken so that nothing of a
/// handler's own cost is ever subtracted.
pub fn overhead() -> Duration {
    use std::sync::OnceLock;
    static OVERHEAD: OnceLock<Duration> = OnceLock::new();
    *OVERHEAD.get_or_init(|| {
        (0..2_000)
            .map(|_| {
                let started = now();
                now().saturating_sub(started)
            })
            .min()
            .unwrap_or_default()
    })
}

#[cfg(not(unix))]
pub fn now() -> Duration {
    wall()
}

#[allow(clippy::disallowed_methods)] // the fallback host clock of the measured-CPU model
fn wall() -> Duration {
    use std::sync::OnceLock;
    use std::time::Instant;
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_measurement_overhead_is_small_and_stable() {
        let o = super::overhead();
        assert!(o < std::time::Duration::from_millis(1), "{o:?}");
        assert_eq!(o, super::overhead(), "measured once");
    }

    #[test]
    fn thread_cpu_time_advances_with_work_and_not_with_sleep() {
        let a = super::now();
        std::thread::sleep(std::time::Duration::from_millis(30));
        let b = super::now();
        let mut x = 0u64;
        for i in 0..3_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let c = super::now();
        assert!(b >= a && c > b);
        if cfg!(unix) {
            assert!(b - a < std::time::Duration::from_millis(15), "sleeping must not count as CPU time: {:?}", b - a);
        }
    }
}
