//! How an increment transaction is recorded for the history checkers (`kairos-check`).
//!
//! The checker sees each key as an integer register holding the key's **version** (the number
//! of transactions that wrote it). It pairs an `ok` with its `invoke` micro-op by micro-op and
//! judges an `info` by its invocation, so the invocation must name the writes although their
//! values are unknown until the servers reply. Per key, in the transaction's order:
//! * `invoke`: `["r", k, null]` and `["w", k, null]`: a write of unknown value
//!   ([`MicroOp::WriteUnknown`]);
//! * `ok`: `["r", k, v]`, `["w", k, v + 1]` with `v` the version read (`v = 0`, a never-written
//!   key, is recorded as `null`, the initial value);
//! * `info` (given up): the invocation's micro-ops.
//!
//! A transaction that [only reads](crate::reads_only) (TPC-C's order-status and stock-level)
//! has only the reads: `["r", k, null]` invoked, `["r", k, v]` completed.
//!
//! Tiga records its general transactions the same way (per distinct key a read, a write or
//! both), so one checker reads every protocol's history. A given-up transaction may have taken
//! effect: the checkers then take it to have written some single value to each such key, which
//! a later transaction may read although no recorded transaction wrote it (`kairos-check`'s
//! serial search binds the unknown value to the first read of it).

use std::collections::BTreeSet;

use kairos_core::{MicroOp, ReadValue};

use crate::txn::{Key, Value};

/// The invocation's micro-ops of a transaction incrementing `keys`: per key, a read and a write,
/// both of unknown value; with `reads_only`, the reads alone.
pub fn increment_invocation(keys: &[Key], reads_only: bool) -> Vec<MicroOp> {
    let mut ops = Vec::with_capacity(2 * keys.len());
    for &key in keys {
        ops.push(MicroOp::Read { key, value: None });
        if !reads_only {
            ops.push(MicroOp::WriteUnknown { key });
        }
    }
    ops
}

/// The completion's micro-ops of a committed increment: per key, the value `read(key)`
/// returned (0, a never-written key, is the initial `null`) and the value written, one more;
/// with `reads_only`, the values read alone.
pub fn increment_completion(keys: &[Key], reads_only: bool, mut read: impl FnMut(Key) -> Value) -> Vec<MicroOp> {
    let mut ops = Vec::with_capacity(2 * keys.len());
    for &key in keys {
        let v = read(key);
        ops.push(MicroOp::Read { key, value: (v != 0).then_some(ReadValue::Int(v)) });
        if !reads_only {
            ops.push(MicroOp::Write { key, value: v.saturating_add(1) });
        }
    }
    ops
}

/// The Jepsen processes of one coordinator: one per transaction in flight, numbered by slot
/// (`0..max`, added to the coordinator's process-id base). A transaction takes the smallest
/// free slot when it is invoked and frees it when it completes, so a process never has two
/// operations in flight, and a coordinator never uses the ids (`base + max` on) of the next.
#[derive(Clone, Debug)]
pub struct ProcessSlots {
    free: BTreeSet<u64>,
    handed_out: u64,
    max: u64,
}

impl ProcessSlots {
    /// Slots `0..max`.
    pub fn new(max: usize) -> Self {
        ProcessSlots { free: BTreeSet::new(), handed_out: 0, max: max as u64 }
    }

    /// The smallest free slot, or `None` if all `max` are taken.
    pub fn take(&mut self) -> Option<u64> {
        if let Some(slot) = self.free.pop_first() {
            return Some(slot);
        }
        (self.handed_out < self.max).then(|| {
            self.handed_out += 1;
            self.handed_out - 1
        })
    }

    /// Gives `slot` back (its transaction completed).
    pub fn give_back(&mut self, slot: u64) {
        self.free.insert(slot);
    }

    /// The invariant, given how many transactions are in flight (each holding one slot): every
    /// slot handed out is held or free, none beyond `max`. A slot given back while its
    /// transaction is in flight, or never given back, breaks the count.
    pub fn check(&self, in_flight: usize) -> Result<(), String> {
        let (free, handed_out) = (self.free.len(), self.handed_out);
        if (in_flight + free) as u64 != handed_out {
            return Err(format!(
                "{in_flight} transactions in flight hold process slots and {free} slots are free, but {handed_out} \
                 were handed out"
            ));
        }
        if handed_out > self.max || self.free.last().is_some_and(|&s| s >= self.max) {
            return Err(format!("process slots beyond the {} reserved for this coordinator", self.max));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_increment_reads_then_writes_one_more() {
        let inv = increment_invocation(&[3, 4], false);
        assert_eq!(
            inv,
            vec![
                MicroOp::Read { key: 3, value: None },
                MicroOp::WriteUnknown { key: 3 },
                MicroOp::Read { key: 4, value: None },
                MicroOp::WriteUnknown { key: 4 },
            ]
        );
        let done = increment_completion(&[3, 4], false, |k| if k == 3 { 0 } else { 7 });
        assert_eq!(
            done,
            vec![
                MicroOp::Read { key: 3, value: None },
                MicroOp::Write { key: 3, value: 1 },
                MicroOp::Read { key: 4, value: Some(ReadValue::Int(7)) },
                MicroOp::Write { key: 4, value: 8 },
            ]
        );
        // A read-only transaction (order-status, stock-level) reads and writes nothing.
        assert_eq!(
            increment_invocation(&[3, 4], true),
            vec![MicroOp::Read { key: 3, value: None }, MicroOp::Read { key: 4, value: None }]
        );
        assert_eq!(
            increment_completion(&[3, 4], true, |_| 7),
            vec![
                MicroOp::Read { key: 3, value: Some(ReadValue::Int(7)) },
                MicroOp::Read { key: 4, value: Some(ReadValue::Int(7)) }
            ]
        );
    }

    #[test]
    fn slots_are_reused_smallest_first_and_the_invariant_catches_misuse() {
        let mut slots = ProcessSlots::new(3);
        assert_eq!((slots.take(), slots.take(), slots.take(), slots.take()), (Some(0), Some(1), Some(2), None));
        slots.give_back(1);
        assert_eq!(slots.check(2), Ok(()));
        assert_eq!(slots.take(), Some(1));
        assert_eq!(slots.check(3), Ok(()));
        // Given back while its transaction is still in flight: two operations on one process.
        slots.give_back(2);
        assert!(slots
            .check(3)
            .unwrap_err()
            .contains("3 transactions in flight hold process slots and 1 slots are free"));
        // Never given back: a leak.
        assert!(slots.check(1).unwrap_err().contains("but 3 were handed out"));
        let mut beyond = ProcessSlots::new(1);
        beyond.give_back(5);
        assert!(beyond.check(0).is_err());
    }
}
