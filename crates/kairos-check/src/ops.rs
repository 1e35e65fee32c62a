//! Pairing invocations with completions into operations.

use std::collections::HashMap;

use kairos_core::history::{HistoryRecord, MicroOp, OpType};

use crate::CheckError;

/// How an operation ended. A missing completion counts as [`Outcome::Info`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Ok,
    Fail,
    Info,
}

/// One operation: invocation plus (optional) completion.
#[derive(Clone, Debug)]
pub(crate) struct Op {
    /// Position of the invocation in the history.
    pub inv_pos: usize,
    /// Position of the completion (`ok`/`fail`/`info`), if any.
    pub done_pos: Option<usize>,
    /// The index reported for this operation: its completion's, else its invocation's.
    pub index: u64,
    pub process: u64,
    pub outcome: Outcome,
    /// The completion's micro-ops for `ok` (reads filled in); otherwise the invocation's.
    pub value: Vec<MicroOp>,
}

impl Op {
    /// Position after which this operation has certainly finished (None: never, for info).
    pub fn ok_end(&self) -> Option<usize> {
        if self.outcome == Outcome::Ok {
            self.done_pos
        } else {
            None
        }
    }
}

/// Why an `ok` completion's micro-ops are malformed: a write of unknown value (`["w", k, null]`),
/// which only an invocation, an `info` or a `fail` may carry — an `ok` took effect and must say
/// what it wrote.
pub(crate) fn unknown_write_in_ok(value: &[MicroOp]) -> Option<String> {
    value.iter().enumerate().find_map(|(i, m)| match m {
        MicroOp::WriteUnknown { key } => Some(format!(
            "an ok completion must carry the value of every write, but its micro-op {} writes key {key} with an \
             unknown value (null)",
            i + 1
        )),
        _ => None,
    })
}

/// Operations in invocation order. Structure was validated by the parser; records built in
/// memory are validated again here (without line numbers).
pub(crate) fn pair(records: &[HistoryRecord]) -> Result<Vec<Op>, CheckError> {
    let mut ops: Vec<Op> = Vec::new();
    let mut in_flight: HashMap<u64, usize> = HashMap::new();
    for (pos, r) in records.iter().enumerate() {
        let e = &r.event;
        match e.op_type {
            OpType::Invoke => {
                if in_flight.insert(e.process, ops.len()).is_some() {
                    return Err(CheckError::Structure(format!(
                        "record index {}: process {} invoked a second operation while one is in flight",
                        r.index, e.process
                    )));
                }
                ops.push(Op {
                    inv_pos: pos,
                    done_pos: None,
                    index: r.index,
                    process: e.process,
                    outcome: Outcome::Info,
                    value: e.value.clone(),
                });
            }
            t => {
                let Some(i) = in_flight.remove(&e.process) else {
                    return Err(CheckError::Structure(format!(
                        "record index {}: completion on process {} with no invocation in flight",
                        r.index, e.process
                    )));
                };
                let op = &mut ops[i];
                op.done_pos = Some(pos);
                op.index = r.index;
                op.outcome = match t {
                    OpType::Ok => Outcome::Ok,
                    OpType::Fail => Outcome::Fail,
                    _ => Outcome::Info,
                };
                if t == OpType::Ok {
                    if let Some(why) = unknown_write_in_ok(&e.value) {
                        return Err(CheckError::Structure(format!("record index {}: {why}", r.index)));
                    }
                    if e.value.len() != op.value.len() {
                        return Err(CheckError::Structure(format!(
                            "record index {}: completion has {} micro-ops but its invocation had {}",
                            r.index,
                            e.value.len(),
                            op.value.len()
                        )));
                    }
                    op.value = e.value.clone();
                } else if op.value.is_empty() {
                    op.value = e.value.clone();
                }
            }
        }
    }
    Ok(ops)
}
