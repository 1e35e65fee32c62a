//! Linearizability of single-key register operations, per key.
//!
//! Operations have one micro-op: `["r",k,v]`, `["w",k,v]` or `["cas",k,[old,new]]`. The
//! register starts as `nil`. `fail` operations did not happen (a failed CAS did not take effect);
//! `info` (or never-completed) writes and CASes may have happened at any point after their
//! invocation: they get a response "at infinity", so a linearization may also place them last,
//! where they change nothing observable; an `info` CAS whose expectation does not hold simply
//! fails. `info` reads carry no information and are dropped.
//!
//! Two checkers: [`wgl`] (ours: Wing–Gong–Lowe with Lowe's memoization) and [`todc`] (the
//! external `todc-utils` crate). On a violation we binary-search the smallest prefix of the
//! key's history that is already non-linearizable and report the operation that completes it.

pub(crate) mod todc;
pub(crate) mod wgl;

use std::collections::BTreeMap;

use kairos_core::history::{MicroOp, ReadValue};

use crate::ops::{Op, Outcome};
use crate::report::{Anomaly, CheckerVerdict};
use crate::CheckError;

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum LinOp {
    Read(Option<u64>),
    Write(u64),
    Cas(u64, u64),
    /// A CAS with unknown outcome: succeeds if it can, otherwise leaves the register alone.
    MaybeCas(u64, u64),
}

/// The sequential register: `(valid, next state)`.
pub(crate) fn apply(op: &LinOp, s: Option<u64>) -> (bool, Option<u64>) {
    match *op {
        LinOp::Read(v) => (v == s, s),
        LinOp::Write(v) => (true, Some(v)),
        LinOp::Cas(e, n) => (s == Some(e), if s == Some(e) { Some(n) } else { s }),
        LinOp::MaybeCas(e, n) => (true, if s == Some(e) { Some(n) } else { s }),
    }
}

/// One operation on one key: `[start, end)` in history positions; `end = None` is infinity.
#[derive(Clone, Debug)]
pub(crate) struct KeyOp {
    pub index: u64,
    pub start: usize,
    pub end: Option<usize>,
    pub op: LinOp,
}

pub(crate) fn by_key(ops: &[Op]) -> Result<BTreeMap<u64, Vec<KeyOp>>, CheckError> {
    let mut out: BTreeMap<u64, Vec<KeyOp>> = BTreeMap::new();
    for o in ops {
        let [m] = o.value.as_slice() else {
            return Err(CheckError::Unsupported(format!(
                "linearizability needs single-micro-op operations; op index {} has {}",
                o.index,
                o.value.len()
            )));
        };
        let info = o.outcome == Outcome::Info;
        let end = if info { None } else { o.done_pos };
        let lop = match (m, o.outcome) {
            (_, Outcome::Fail) => continue,
            (MicroOp::Read { .. }, Outcome::Info) => continue,
            (MicroOp::Read { value: None, .. }, _) => LinOp::Read(None),
            (MicroOp::Read { value: Some(ReadValue::Int(v)), .. }, _) => LinOp::Read(Some(*v)),
            (MicroOp::Write { value, .. }, _) => LinOp::Write(*value),
            (MicroOp::Cas { expected, new, .. }, Outcome::Info) => LinOp::MaybeCas(*expected, *new),
            (MicroOp::Cas { expected, new, .. }, _) => LinOp::Cas(*expected, *new),
            (MicroOp::Read { value: Some(ReadValue::List(_)), .. }, _) | (MicroOp::Append { .. }, _) => {
                return Err(CheckError::Unsupported(format!(
                    "linearizability checks registers; op index {} is a list operation",
                    o.index
                )))
            }
        };
        out.entry(m.key()).or_default().push(KeyOp { index: o.index, start: o.inv_pos, end, op: lop });
    }
    Ok(out)
}

/// The history cut just before position `p`: operations invoked before `p`; those not yet
/// complete become unknown-outcome (reads dropped, CAS may-or-may-not).
pub(crate) fn prefix(ops: &[KeyOp], p: usize) -> Vec<KeyOp> {
    ops.iter()
        .filter(|o| o.start < p)
        .filter_map(|o| {
            if o.end.is_some_and(|e| e < p) {
                return Some(o.clone());
            }
            let op = match o.op {
                LinOp::Read(_) => return None,
                LinOp::Cas(e, n) | LinOp::MaybeCas(e, n) => LinOp::MaybeCas(e, n),
                w => w,
            };
            Some(KeyOp { end: None, op, ..o.clone() })
        })
        .collect()
}

pub(crate) fn check(ops: &[Op]) -> Result<Vec<(CheckerVerdict, Vec<Anomaly>)>, CheckError> {
    let keys = by_key(ops)?;
    let mut ours_bad = Vec::new();
    let mut todc_bad = Vec::new();
    let mut todc_skipped = Vec::new();
    for (k, kops) in &keys {
        if !wgl::linearizable(kops) {
            ours_bad.push(explain(*k, kops, wgl::NAME));
        }
        match todc::linearizable(kops) {
            Some(true) => {}
            Some(false) => todc_bad.push(explain(*k, kops, todc::NAME)),
            None => todc_skipped.push(*k),
        }
    }
    let n = keys.len();
    let ours = CheckerVerdict {
        name: wgl::NAME.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        valid: Some(ours_bad.is_empty()),
        detail: format!("{} of {n} keys non-linearizable", ours_bad.len()),
    };
    let todc_valid = if !todc_bad.is_empty() {
        Some(false)
    } else if todc_skipped.is_empty() {
        Some(true)
    } else {
        None
    };
    let todc = CheckerVerdict {
        name: todc::NAME.into(),
        version: todc::VERSION.into(),
        valid: todc_valid,
        detail: format!(
            "{} of {n} keys non-linearizable; {} keys skipped (more than {} operations: todc-utils is quadratic)",
            todc_bad.len(),
            todc_skipped.len(),
            todc::MAX_OPS
        ),
    };
    Ok(vec![(ours, ours_bad), (todc, todc_bad)])
}

/// Smallest non-linearizable prefix of this key's history, found with the named checker.
fn explain(key: u64, kops: &[KeyOp], checker: &str) -> Anomaly {
    let lin = |ops: &[KeyOp]| {
        if checker == wgl::NAME {
            wgl::linearizable(ops)
        } else {
            todc::linearizable(ops).unwrap_or(true)
        }
    };
    let mut ends: Vec<usize> = kops.iter().filter_map(|o| o.end).collect();
    ends.sort_unstable();
    // Smallest completion position p such that the prefix through p is non-linearizable.
    let (mut lo, mut hi) = (0usize, ends.len());
    while lo < hi {
        let mid = (lo + hi) / 2;
        if lin(&prefix(kops, ends[mid] + 1)) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    let Some(&cut) = ends.get(lo) else {
        return Anomaly {
            name: "non-linearizable".into(),
            ops: kops.iter().map(|o| o.index).collect(),
            explanation: format!("key {key}: no linearization of its {} operations exists", kops.len()),
            checker: checker.into(),
        };
    };
    let culprit = kops.iter().find(|o| o.end == Some(cut)).expect("an op ends at cut");
    let window = prefix(kops, cut + 1);
    let last_write = window
        .iter()
        .filter(|o| !matches!(o.op, LinOp::Read(_)) && o.end.is_some_and(|e| e < culprit.start))
        .max_by_key(|o| o.end);
    let mut involved: Vec<&KeyOp> =
        window.iter().filter(|o| o.end.is_none_or(|e| e > culprit.start) && o.index != culprit.index).collect();
    involved.extend(last_write);
    involved.sort_by_key(|o| o.start);
    involved.truncate(20);
    let mut ops: Vec<u64> = involved.iter().map(|o| o.index).collect();
    ops.push(culprit.index);
    let desc =
        |o: &KeyOp| format!("op {} {:?} [{}, {}]", o.index, o.op, o.start, o.end.map_or("∞".into(), |e| e.to_string()));
    let mut text = format!(
        "key {key}: the history up to {} is linearizable, but not once it completes; involved operations (history positions of invocation and completion):\n",
        desc(culprit)
    );
    for o in &involved {
        text.push_str(&format!("  {}\n", desc(o)));
    }
    Anomaly { name: "non-linearizable".into(), ops, explanation: text.trim_end().into(), checker: checker.into() }
}
