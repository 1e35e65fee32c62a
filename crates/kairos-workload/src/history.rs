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
//! Tiga records its general transactions the same way (per distinct key a read, a write or
//! both), so one checker reads every protocol's history. A given-up transaction may have taken
//! effect: the checkers then take it to have written some single value to each such key, which
//! a later transaction may read although no recorded transaction wrote it (`kairos-check`'s
//! serial search binds the unknown value to the first read of it).

use kairos_core::{MicroOp, ReadValue};

use crate::txn::{Key, Value};

/// The invocation's micro-ops of a transaction incrementing `keys`: per key, a read and a write,
/// both of unknown value.
pub fn increment_invocation(keys: &[Key]) -> Vec<MicroOp> {
    keys.iter().flat_map(|&key| [MicroOp::Read { key, value: None }, MicroOp::WriteUnknown { key }]).collect()
}

/// The completion's micro-ops of a committed increment: per key, the value `read(key)`
/// returned (0, a never-written key, is the initial `null`) and the value written, one more.
pub fn increment_completion(keys: &[Key], mut read: impl FnMut(Key) -> Value) -> Vec<MicroOp> {
    let mut ops = Vec::with_capacity(2 * keys.len());
    for &key in keys {
        let v = read(key);
        ops.push(MicroOp::Read { key, value: (v != 0).then_some(ReadValue::Int(v)) });
        ops.push(MicroOp::Write { key, value: v.saturating_add(1) });
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_increment_reads_then_writes_one_more() {
        let inv = increment_invocation(&[3, 4]);
        assert_eq!(
            inv,
            vec![
                MicroOp::Read { key: 3, value: None },
                MicroOp::WriteUnknown { key: 3 },
                MicroOp::Read { key: 4, value: None },
                MicroOp::WriteUnknown { key: 4 },
            ]
        );
        let done = increment_completion(&[3, 4], |k| if k == 3 { 0 } else { 7 });
        assert_eq!(
            done,
            vec![
                MicroOp::Read { key: 3, value: None },
                MicroOp::Write { key: 3, value: 1 },
                MicroOp::Read { key: 4, value: Some(ReadValue::Int(7)) },
                MicroOp::Write { key: 4, value: 8 },
            ]
        );
    }
}
