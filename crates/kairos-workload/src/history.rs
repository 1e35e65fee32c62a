//! How an increment transaction is recorded for the history checkers (`kairos-check`).
//!
//! The checker sees each key as an integer register holding the key's **version** (the number
//! of transactions that wrote it). It pairs an `ok` with its `invoke` micro-op by micro-op and
//! judges an `info` by its invocation, so the invocation must name the writes although their
//! values are unknown until the servers reply. Per key, in the transaction's order:
//! * `invoke`: `["r", k, null]` and `["w", k, P]`, where `P` = [`write_placeholder`] is a value
//!   no version reaches and nobody reads (unique per transaction and key, `≥ 2^62`);
//! * `ok`: `["r", k, v]`, `["w", k, v + 1]` with `v` the version read (`v = 0`, a never-written
//!   key, is recorded as `null`, the initial value);
//! * `info` (given up): the invocation's micro-ops.
//!
//! Tiga records its general transactions the same way (per distinct key a read, a write or
//! both), so one checker reads every protocol's history. A given-up transaction that did take
//! effect leaves a version no recorded transaction wrote, which the checkers report as a
//! garbage read.

use kairos_core::{MicroOp, ReadValue};

use crate::txn::{Key, TxnId, Value};

/// The value an invocation records as the write of `key` by `txn` (see the module docs):
/// `2^62 + (key·2^32 + txn)` folded below 2^63, so it fits adya's i64 and no count reaches it.
pub fn write_placeholder(txn: TxnId, key: Key) -> Value {
    const LOW: u64 = (1 << 62) - 1;
    (1 << 62) | ((txn.0 ^ key.rotate_left(32)) & LOW)
}

/// The invocation's micro-ops of a transaction incrementing `keys`: per key, a read of unknown
/// value and a write of the placeholder.
pub fn increment_invocation(txn: TxnId, keys: &[Key]) -> Vec<MicroOp> {
    keys.iter()
        .flat_map(|&key| {
            [MicroOp::Read { key, value: None }, MicroOp::Write { key, value: write_placeholder(txn, key) }]
        })
        .collect()
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
    use kairos_core::NodeId;

    #[test]
    fn placeholders_are_unique_per_txn_and_key_and_fit_an_i64() {
        let (a, b) = (TxnId::new(NodeId(9), 1), TxnId::new(NodeId(9), 2));
        let p = write_placeholder(a, 5);
        assert!(p >= 1 << 62 && i64::try_from(p).is_ok());
        assert_ne!(p, write_placeholder(b, 5));
        assert_ne!(p, write_placeholder(a, 6));
    }

    #[test]
    fn an_increment_reads_then_writes_one_more() {
        let t = TxnId::new(NodeId(1), 1);
        let inv = increment_invocation(t, &[3, 4]);
        assert_eq!(inv.len(), 4);
        assert_eq!(inv[0], MicroOp::Read { key: 3, value: None });
        assert_eq!(inv[1], MicroOp::Write { key: 3, value: write_placeholder(t, 3) });
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
