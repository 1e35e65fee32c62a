//! Linearizability of single-key register operations, per key.
//!
//! Operations have one micro-op: `["r",k,v]`, `["w",k,v]` or `["cas",k,[old,new]]`. The
//! register starts as `nil`. Where values are integers, a write of [`TOMBSTONE`] deletes the key
//! for good: no other write or CAS may follow it (an unknown-outcome one after it simply did not
//! happen; a CAS from the tombstone to it changes nothing). Text values have no tombstone.
//! `fail` operations did not happen (a failed CAS did not take effect); `info` (or
//! never-completed) writes and CASes may have happened at any point after their
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
use std::sync::Arc;

use kairos_core::history::{MicroOp, ReadValue, TOMBSTONE};

use crate::ops::{Op, Outcome};
use crate::parse::symbols::Symbols;
use crate::report::{Anomaly, CheckerVerdict};
use crate::CheckError;

/// What a read returned.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Expect {
    /// The initial value (nil; a key-value store's "").
    Nil,
    Value(u64),
    List(Vec<u64>),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum LinOp {
    Read(Expect),
    Write(u64),
    /// A write with unknown outcome: takes effect if it can (not after a deletion).
    MaybeWrite(u64),
    /// Appends a value: to a list (Jepsen), or to a string (a key-value store's `append`).
    Append(u64),
    Cas(u64, u64),
    /// A CAS with unknown outcome: succeeds if it can, otherwise leaves the register alone.
    MaybeCas(u64, u64),
}

/// A key's state: the values written or appended since the last write, in order (empty:
/// initial). A register holds one; a list or an appended-to string several.
pub(crate) type State = Vec<u64>;

/// Value texts, for reads compared to a concatenation of appended strings. `None`: values are
/// integers (ids are the values), and a read matches only the one value it names.
#[derive(Clone, Debug, Default)]
pub(crate) struct Texts(Option<Arc<Vec<String>>>);

impl Texts {
    pub fn new(symbols: &Symbols) -> Texts {
        if !symbols.values.is_renamed() {
            return Texts(None);
        }
        let n = symbols.values.len();
        Texts(Some(Arc::new((0..n as u64).map(|id| symbols.value_text(id)).collect())))
    }

    fn text(&self, id: u64) -> &str {
        self.0.as_ref().and_then(|t| t.get(id as usize)).map_or("", String::as_str)
    }

    /// An empty string written or appended leaves no fragment.
    fn empty(&self, id: u64) -> bool {
        self.0.is_some() && self.text(id).is_empty()
    }

    /// Whether a read of `v` matches a state of several fragments (their concatenation).
    fn concatenates_to(&self, s: &State, v: u64) -> bool {
        let Some(_) = &self.0 else { return false };
        let want = self.text(v);
        let mut rest = want;
        for f in s {
            match rest.strip_prefix(self.text(*f)) {
                Some(r) => rest = r,
                None => return false,
            }
        }
        rest.is_empty()
    }
}

/// Whether writing `v` over state `s` leaves a deleted key deleted (module docs: the tombstone);
/// a review's CAS from the tombstone brought a deleted key back, and both checkers accepted it.
fn revives_not(s: &State, v: u64, texts: &Texts) -> bool {
    texts.0.is_some() || s.as_slice() != [TOMBSTONE] || v == TOMBSTONE
}

/// The sequential object: `(valid, next state)`.
pub(crate) fn apply(op: &LinOp, s: &State, texts: &Texts) -> (bool, State) {
    match op {
        LinOp::Read(Expect::Nil) => (s.is_empty(), s.clone()),
        LinOp::Read(Expect::Value(v)) => (s.as_slice() == [*v] || texts.concatenates_to(s, *v), s.clone()),
        LinOp::Read(Expect::List(l)) => (s == l, s.clone()),
        LinOp::Write(v) | LinOp::MaybeWrite(v) => {
            let allowed = revives_not(s, *v, texts);
            let written = if texts.empty(*v) { vec![] } else { vec![*v] };
            match op {
                LinOp::Write(_) => (allowed, written),
                _ => (true, if allowed { written } else { s.clone() }),
            }
        }
        LinOp::Append(v) => {
            let mut n = s.clone();
            if !texts.empty(*v) {
                n.push(*v);
            }
            (true, n)
        }
        LinOp::Cas(e, n) => {
            let ok = s.as_slice() == [*e] && revives_not(s, *n, texts);
            (ok, if ok { vec![*n] } else { s.clone() })
        }
        LinOp::MaybeCas(e, n) => {
            (true, if s.as_slice() == [*e] && revives_not(s, *n, texts) { vec![*n] } else { s.clone() })
        }
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
            (MicroOp::Read { value: None, .. }, _) => LinOp::Read(Expect::Nil),
            (MicroOp::Read { value: Some(ReadValue::Int(v)), .. }, _) => LinOp::Read(Expect::Value(*v)),
            (MicroOp::Read { value: Some(ReadValue::List(l)), .. }, _) => LinOp::Read(Expect::List(l.clone())),
            (MicroOp::Write { value, .. }, Outcome::Info) => LinOp::MaybeWrite(*value),
            (MicroOp::Write { value, .. }, _) => LinOp::Write(*value),
            (MicroOp::WriteUnknown { key }, _) => {
                return Err(CheckError::Unsupported(format!(
                    "linearizability checking needs the value of every write; op index {} writes key {key} with an \
                     unknown value (null)",
                    o.index
                )))
            }
            (MicroOp::Append { value, .. }, _) => LinOp::Append(*value),
            (MicroOp::Cas { expected, new, .. }, Outcome::Info) => LinOp::MaybeCas(*expected, *new),
            (MicroOp::Cas { expected, new, .. }, _) => LinOp::Cas(*expected, *new),
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
            let op = match &o.op {
                LinOp::Read(_) => return None,
                LinOp::Cas(e, n) | LinOp::MaybeCas(e, n) => LinOp::MaybeCas(*e, *n),
                LinOp::Write(v) | LinOp::MaybeWrite(v) => LinOp::MaybeWrite(*v),
                w => w.clone(),
            };
            Some(KeyOp { end: None, op, ..o.clone() })
        })
        .collect()
}

/// Default step budget of our search per key, first pass.
pub(crate) const DEFAULT_BUDGET_PER_KEY: u64 = 2_000_000;
/// With the default budget: if no key was found non-linearizable but some were undecided,
/// they get this much more (a valid verdict needs every key decided; an invalid one needs
/// only one, so a bad history does not pay for its hardest keys).
const SECOND_PASS_FACTOR: u64 = 10;

pub(crate) fn check(
    ops: &[Op],
    symbols: &Symbols,
    budget: Option<u64>,
) -> Result<Vec<(CheckerVerdict, Vec<Anomaly>)>, CheckError> {
    let keys = by_key(ops)?;
    let texts = Texts::new(symbols);
    let mut budget_used = budget.unwrap_or(DEFAULT_BUDGET_PER_KEY);
    let mut ours: BTreeMap<u64, Option<bool>> =
        keys.iter().map(|(k, kops)| (*k, wgl::linearizable(kops, &texts, budget_used))).collect();
    let any_bad = ours.values().any(|v| *v == Some(false));
    if budget.is_none() && !any_bad && ours.values().any(Option::is_none) {
        budget_used = DEFAULT_BUDGET_PER_KEY * SECOND_PASS_FACTOR;
        for (k, v) in ours.iter_mut().filter(|(_, v)| v.is_none()) {
            *v = wgl::linearizable(&keys[k], &texts, budget_used);
        }
    }
    let budget = budget_used;
    let mut ours_bad = Vec::new();
    let mut ours_unknown = Vec::new();
    let mut todc_bad = Vec::new();
    let mut todc_skipped = Vec::new();
    for (k, kops) in &keys {
        match ours[k] {
            Some(true) => {}
            Some(false) => ours_bad.push(explain(*k, kops, wgl::NAME, &texts, symbols, budget)),
            None => {
                // todc-utils has no budget: a key our search could not settle would not end.
                ours_unknown.push(symbols.key_name(*k));
                todc_skipped.push(*k);
                continue;
            }
        }
        match todc::linearizable(kops, &texts) {
            Some(true) => {}
            Some(false) => todc_bad.push(explain(*k, kops, todc::NAME, &texts, symbols, budget)),
            None => todc_skipped.push(*k),
        }
    }
    let n = keys.len();
    let ours_valid = match (ours_bad.is_empty(), ours_unknown.is_empty()) {
        (false, _) => Some(false),
        (true, true) => Some(true),
        (true, false) => None,
    };
    let mut detail = format!("{} of {n} keys non-linearizable", ours_bad.len());
    if !ours_unknown.is_empty() {
        let shown: Vec<&str> = ours_unknown.iter().take(5).map(String::as_str).collect();
        detail.push_str(&format!(
            "; {} keys undecided within the budget of {budget} steps per key (e.g. {}): raise it with --search-budget",
            ours_unknown.len(),
            shown.join(", ")
        ));
    }
    let ours =
        CheckerVerdict { name: wgl::NAME.into(), version: env!("CARGO_PKG_VERSION").into(), valid: ours_valid, detail };
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
            "{} of {n} keys non-linearizable; {} keys skipped (more than {} operations, since todc-utils is quadratic, \
             or undecided by kairos-wgl within its budget, since todc-utils has none)",
            todc_bad.len(),
            todc_skipped.len(),
            todc::MAX_OPS
        ),
    };
    Ok(vec![(ours, ours_bad), (todc, todc_bad)])
}

/// Smallest non-linearizable prefix of this key's history, found with the named checker.
fn explain(key: u64, kops: &[KeyOp], checker: &str, texts: &Texts, symbols: &Symbols, budget: u64) -> Anomaly {
    // A prefix the search cannot settle counts as linearizable: the binary search then moves
    // on to longer prefixes, and ends at the whole history at worst, which is known bad.
    let lin = |ops: &[KeyOp]| {
        if checker == wgl::NAME {
            wgl::linearizable(ops, texts, budget).unwrap_or(true)
        } else {
            todc::linearizable(ops, texts).unwrap_or(true)
        }
    };
    let key_name = symbols.key_name(key);
    let key = &key_name;
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
