//! Majority-first rounds: a read or write contacts the primary and just enough other replicas
//! for a majority, and **widens** to the remaining replicas when one of those fails or has not
//! replied within a few round trips (a hedged request). The others are rotated by slot, so every
//! client picks the same majority for a key and reads meet the writes' nodes in the common case.
//!
//! Why: a round needs a majority of replies (and a read the primary's in-place copy); the third
//! replica's chain only costs the client and the node work (on shm, where the client runs its own
//! verbs, it is a third of an operation's cost). SWARM-KV's and DM-ABD's rules hold for *any*
//! majority — a write is complete once a majority holds its tuple, and a read sees it through any
//! majority — so which majority answers changes nothing but latency. The SWARM paper's artifact
//! does the same: its replicas beyond the first majority are "lazy", contacted only when a server
//! is dead. The cost: a replica outside the majority lags until a round widens to it, so after a
//! crash of a majority node the surviving majority holds each value once, as a minimal-quorum
//! system does. The writer's own word on a lagging replica is corrected by its first CAS there
//! (the reply shows the word, see `Client::on_reply`). Only a SWARM-KV write's **first** try is
//! majority-first: its retries, the lock rounds of a stale write and its rewrite ask every
//! replica, so that under contention one failed CAS or one slow chain does not cost another
//! round; the background verification goes to the nodes the write reached. DM-ABD's rounds
//! (read, write, write-back) are all majority-first.
//!
//! What it costs under contention: a round that waits for both of two replies, not the first
//! two of three, reads the words later and sees a concurrent writer's newer tuple more often.
//! With 16 writers on one key (`swarm_safety.rs`), 118 of 832 updates took one round trip
//! against 220 when writes asked every replica (none takes more than 4); at the paper's
//! defaults the one-round-trip share of updates stays above 99.5 %.
//!
//! Only the **first** iteration of a SWARM-KV read is majority-first (DM-ABD reads have one).
//! A later iteration is after a tuple it saw before, which may sit on one node only — a stalled
//! writer's chain reached it, or a widened round did — and a fixed majority could miss that node
//! every time (campaign seed 353: 209 iterations). The common case takes one iteration.
//!
//! When to widen: after [`RttFloor::widen_after`] — eight times the lowest round trip of the last
//! few hundred replies (at least [`WIDEN_AFTER_MIN`], at most the tick of the chain timeout),
//! measured by the client itself so that one rule fits the simulator (µs), shm (sub-µs) and TCP
//! (tens of µs). The minimum, not a mean: a stalled chain must not teach the client to wait longer
//! for the next stalled chain. A node's failure reply or chain timeout widens at once.

use std::time::Duration;

/// Widening never happens sooner than this after a round starts.
pub const WIDEN_AFTER_MIN: Duration = Duration::from_micros(2);
/// Round trips of a reply that a read waits before it widens.
pub const WIDEN_AFTER_RTTS: u32 = 8;
/// Replies per window of the windowed minimum.
const WINDOW_REPLIES: u32 = 256;

/// The lowest chain round trip over the last one or two windows of `WINDOW_REPLIES` replies.
#[derive(Clone, Debug, Default)]
pub struct RttFloor {
    current: Option<Duration>,
    previous: Option<Duration>,
    samples: u32,
}

impl RttFloor {
    pub fn sample(&mut self, rtt: Duration) {
        self.current = Some(self.current.map_or(rtt, |c| c.min(rtt)));
        self.samples += 1;
        if self.samples >= WINDOW_REPLIES {
            self.previous = self.current.take();
            self.samples = 0;
        }
    }

    /// The lowest round trip seen recently, if any reply came back yet.
    pub fn floor(&self) -> Option<Duration> {
        match (self.current, self.previous) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// How long a majority-first round waits for its majority before it widens; `ceiling` until
    /// the first reply, and never more than `ceiling`.
    pub fn widen_after(&self, ceiling: Duration) -> Duration {
        match self.floor() {
            Some(rtt) => (rtt * WIDEN_AFTER_RTTS).max(WIDEN_AFTER_MIN).min(ceiling),
            None => ceiling,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_the_windowed_minimum_and_forgets_an_old_window() {
        let mut f = RttFloor::default();
        let ceiling = Duration::from_micros(500);
        assert_eq!(f.widen_after(ceiling), ceiling);
        f.sample(Duration::from_micros(3));
        f.sample(Duration::from_millis(1)); // a stalled chain does not raise the floor
        assert_eq!(f.floor(), Some(Duration::from_micros(3)));
        assert_eq!(f.widen_after(ceiling), Duration::from_micros(24));
        // Two whole windows of slower replies later, the old minimum is forgotten.
        for _ in 0..2 * WINDOW_REPLIES {
            f.sample(Duration::from_micros(40));
        }
        assert_eq!(f.floor(), Some(Duration::from_micros(40)));
        assert_eq!(f.widen_after(ceiling), Duration::from_micros(320));
        f.sample(Duration::from_millis(10));
        assert_eq!(f.widen_after(ceiling), Duration::from_micros(320));
        let mut fast = RttFloor::default();
        fast.sample(Duration::from_nanos(100));
        assert_eq!(fast.widen_after(ceiling), WIDEN_AFTER_MIN);
    }
}
