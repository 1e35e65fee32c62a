//! Memory recycling of out-of-place buffers.
//!
//! Each writer owns a pool of buffers per node (the same buffer id on every replica). A buffer
//! is **current** while it holds the writer's latest tuple for a key. It is **retired** when that
//! tuple can no longer be the maximum of its key: the writer wrote the key again (with another
//! buffer), deleted it, or saw a newer *verified* tuple of another writer on it. A retired buffer
//! is reused only after a **grace period** (≥ the longest operation), so readers that picked the
//! old tuple before it was superseded can still follow the pointer.
//!
//! Readers never need the grace period: every copy carries its tuple word and a hash over it,
//! so a reader that follows a pointer into a reused buffer sees another tuple (or a torn copy)
//! and retries; the grace period only keeps such retries rare. **Helpers do need it**: a
//! reader's lock round, or a stale writer's, writes a tuple's copy into *its writer's* buffer
//! on the nodes that lack it (so that no node holds a tuple's metadata without its value), and
//! a chain cannot make a write conditional. If such a chain stalls past the grace period and
//! the buffer is reused meanwhile, it lands over the newer tuple's value on that node; should
//! that node become the newer tuple's last holder, the value is lost while its metadata stays
//! the maximum, and reads of the key never finish (a review's schedule, 2026-12-07: a reader's
//! lock chain stalled, its writer updated twice more past the grace period, then the primary
//! crashed). For the same reason a stale write's rewrite never reuses its first tuple's buffer
//! at once: it takes a fresh one (`crate::safe_guess`, step 3). So recycling is safe only
//! while the grace period exceeds the longest time a chain stays in flight: eventual
//! synchrony (operations and clock rates bounded after some time),
//! the assumption the SWARM paper's own recycling design makes. Runs that must not rely on it
//! turn recycling off (every write then takes a fresh buffer). Memory is bounded: a writer
//! holds at most one current buffer per key, plus the buffers retired within one grace period,
//! plus the **pinned** ones below.
//!
//! A write whose outcome is unknown (it timed out, or too few nodes answered) may still land
//! anywhere — its chains can be stalled — and its tuple may be, or become, the maximum of its
//! key. Its buffer is **pinned** to the key: reused, its tuple's value would be gone while its
//! metadata stays the maximum, and readers would look for it forever (campaign seed 2662). A
//! pinned buffer retires when this writer's next write of the key completes (that write's tuple
//! is higher and on a majority; the pinned write's chains, earlier on every connection, can
//! land only before it) or the key is deleted.

use crate::index::FixedHash;
use kairos_core::LocalTime;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct Pool {
    capacity: u32,
    grace: Duration,
    /// Never used yet.
    next_fresh: u32,
    /// Retired buffers in retirement order, with the time they were retired.
    retired: VecDeque<(LocalTime, u32)>,
    /// Current buffer per slot.
    /// Hashed (looked up on every write, never iterated).
    current: HashMap<u64, u32, FixedHash>,
    /// Buffers of writes with an unknown outcome, per slot (see the module docs).
    pinned: BTreeMap<u64, Vec<u32>>,
    /// Allocated for an operation in flight.
    in_flight: u32,
    in_use_max: u32,
}

impl Pool {
    pub fn new(capacity: u32, grace: Duration) -> Self {
        Pool {
            capacity,
            grace,
            next_fresh: 0,
            retired: VecDeque::new(),
            current: HashMap::default(),
            pinned: BTreeMap::new(),
            in_flight: 0,
            in_use_max: 0,
        }
    }

    /// Marks buffers as used from the load phase.
    pub fn absorb(&mut self, slot: u64, buf: u32) {
        self.current.insert(slot, buf);
        self.next_fresh = self.next_fresh.max(buf + 1);
        self.note();
    }

    /// A buffer for a new write: a retired one past its grace period, else a fresh one.
    pub fn allocate(&mut self, now: LocalTime) -> Option<u32> {
        let buf = match self.retired.front() {
            Some((at, b)) if now.saturating_since(*at) >= self.grace => {
                let b = *b;
                self.retired.pop_front();
                b
            }
            _ if self.next_fresh < self.capacity => {
                self.next_fresh += 1;
                self.next_fresh - 1
            }
            _ => return None,
        };
        self.in_flight += 1;
        self.note();
        Some(buf)
    }

    /// The write with `buf` on `slot` completed: `buf` becomes current, the previous one retires.
    pub fn commit(&mut self, slot: u64, buf: u32, now: LocalTime) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if let Some(old) = self.current.insert(slot, buf) {
            if old != buf {
                self.retired.push_back((now, old));
            }
        }
        for old in self.pinned.remove(&slot).unwrap_or_default() {
            if old != buf {
                self.retired.push_back((now, old));
            }
        }
    }

    /// The write with `buf` on `slot` ended with an unknown outcome: keep `buf` until the
    /// writer's next completed write of `slot` (or its deletion).
    pub fn pin(&mut self, slot: u64, buf: u32) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.pinned.entry(slot).or_default().push(buf);
    }

    /// `slot` was deleted: nothing of this writer's can be its maximum again.
    pub fn delete(&mut self, slot: u64, now: LocalTime) {
        self.supersede(slot, now);
        for old in self.pinned.remove(&slot).unwrap_or_default() {
            self.retired.push_back((now, old));
        }
    }

    /// The write with `buf` did not install it (failed, or the key was deleted).
    pub fn abandon(&mut self, buf: u32, now: LocalTime) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.retired.push_back((now, buf));
    }

    /// The writer's tuple on `slot` was superseded for good: retire its buffer.
    pub fn supersede(&mut self, slot: u64, now: LocalTime) {
        if let Some(old) = self.current.remove(&slot) {
            self.retired.push_back((now, old));
        }
    }

    pub fn current(&self, slot: u64) -> Option<u32> {
        self.current.get(&slot).copied()
    }
    /// Buffers holding data or waiting out their grace period.
    pub fn in_use(&self) -> u32 {
        let pinned: usize = self.pinned.values().map(Vec::len).sum();
        self.current.len() as u32 + pinned as u32 + self.retired.len() as u32 + self.in_flight
    }
    pub fn in_use_max(&self) -> u32 {
        self.in_use_max
    }
    /// Buffers ever touched (the pool's high-water mark in memory).
    pub fn touched(&self) -> u32 {
        self.next_fresh
    }
    fn note(&mut self) {
        self.in_use_max = self.in_use_max.max(self.in_use());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retired_buffers_come_back_only_after_the_grace_period() {
        let mut p = Pool::new(3, Duration::from_micros(10));
        let t0 = LocalTime::from_micros(100);
        let a = p.allocate(t0).unwrap();
        p.commit(7, a, t0);
        let b = p.allocate(t0).unwrap();
        p.commit(7, b, t0); // a retires at t0
        let c = p.allocate(t0).unwrap();
        assert_ne!(c, a, "a is still in its grace period");
        p.abandon(c, t0);
        assert_eq!(p.allocate(t0), None, "pool exhausted within the grace period");
        assert_eq!(p.allocate(LocalTime::from_micros(111)), Some(a));
        assert_eq!(p.touched(), 3);
    }

    #[test]
    fn a_write_with_an_unknown_outcome_keeps_its_buffer_until_the_next_write_of_its_key() {
        let g = Duration::from_micros(10);
        let mut p = Pool::new(4, g);
        let t0 = LocalTime::from_micros(100);
        let later = LocalTime::from_micros(1_000);
        let a = p.allocate(t0).unwrap();
        p.commit(7, a, t0);
        let b = p.allocate(t0).unwrap();
        p.pin(7, b); // b's write timed out: its tuple may still land above a's
        let c = p.allocate(later).unwrap();
        assert!(c != a && c != b, "neither the current buffer nor the pinned one is reused");
        p.supersede(7, later); // another writer's verified tuple: a retires, b stays pinned
        assert_eq!(p.allocate(later + g), Some(a));
        p.commit(7, c, later + g); // the next write of the key: b retires now
        assert_eq!(p.allocate(later + g + g), Some(b));
    }
}
