//! Causal session guarantees over list-append histories (ours; no external checker exists).
//!
//! Sessions are processes; a session's operations are in its process order. Only `ok`
//! operations are observations; an `info` append may or may not appear; a `fail` append must
//! never appear. Appended values must be unique per key (a failed append aside), so each key's
//! reads must all be prefixes of one list (its append order), taken from the longest read. A
//! history that appends a value twice to a key (in two operations that are not `fail`, or in
//! one) gets no verdict: a read no longer says which append it saw. (A review found it
//! unchecked: two sessions each appended 5 and read `[5]`, and the history was proved valid,
//! though a read of one element can hold only one session's own append.)
//!
//! Checks, in micro-op order within an operation and across a session's later operations:
//! * **prefix consistency** (`incompatible-order`): every read of `k` is a prefix of the longest;
//!   plus `aborted-read` (a failed append seen), `garbage-read` (a value nobody appended),
//!   `duplicate-elements`;
//! * **read-your-writes**: a session's read of `k` contains every value the session appended to
//!   `k` in an earlier `ok` operation (or earlier in the same operation);
//! * **monotonic-reads**: a session's read of `k` extends (has as prefix) its previous read of `k`;
//! * **monotonic-writes**: if a session appended `a` (to `k1`) in an `ok` operation and later
//!   appended `b` (to `k2`), then (same key) `a` precedes `b` in `k`'s append order, and
//!   (any keys) every session that has observed `b` must, in every later read of `k1` (later
//!   micro-ops of the same operation, or later operations), observe `a`;
//! * **writes-follow-reads**: if a session read `k1` as `L` and later appended `w` (to `k2`), every
//!   session that has observed `w` must, in every later read of `k1`, observe all of `L`.
//!
//! An observation is a read that contains the value. Obligations are per observing session and
//! key, keeping the strongest (latest in the key's order) required value. They are
//! **transitive**: a value an observer must see brings its own obligations, and those of the
//! values they require, and so on (`c` followed a read of `b`, which followed a read of `a`:
//! whoever saw `c` must see `b` and `a`). What a session *read* — a list, so every value up
//! to its last — is in the causal past of what it appends afterwards; a value it only appended
//! brings its own obligations, not those of the values before it in its key's order (its
//! appender need not have seen them). An `info` append that someone observed took effect, in
//! its session's context: it carries that context's obligations, and follows the session's
//! earlier appends to its key. (A review found the transitivity and the `info` context
//! missing: a chain of three sessions, and an observed `info` append, each hid a
//! writes-follow-reads violation.)

use std::collections::{BTreeMap, HashMap, HashSet};

use kairos_core::history::{MicroOp, ReadValue};

use crate::ops::{Op, Outcome};
use crate::report::{Anomaly, CheckerVerdict};
use crate::CheckError;

pub const NAME: &str = "kairos-causal";

fn anomaly(name: &str, ops: Vec<u64>, explanation: String) -> Anomaly {
    Anomaly { name: name.into(), ops, explanation, checker: NAME.into() }
}

/// Why an observer must see a value.
#[derive(Clone, Debug)]
struct Need {
    /// The value that must be visible, and its key.
    key: u64,
    value: u64,
    guarantee: &'static str,
    /// Op index that created the dependency, and op index of the observed write's op.
    source: u64,
    via: u64,
}

/// One observer's obligations, closed transitively (module docs).
#[derive(Default)]
struct Obligations {
    /// Per key, how many values of its order (from the first) had their obligations taken:
    /// the prefix the observer saw, or must see as some appender's read.
    expanded: HashMap<u64, usize>,
    /// Single values (appended, not read, by whoever required them) whose obligations were
    /// taken.
    taken: HashSet<(u64, u64)>,
}

impl Obligations {
    /// The observer saw `value` of `key` in a read (so every value before it too): it takes
    /// their obligations, and those of the values they require, and so on (module docs).
    fn observe(
        &mut self,
        key: u64,
        value: u64,
        deps: &HashMap<(u64, u64), Vec<Need>>,
        pos: &HashMap<(u64, u64), usize>,
        longest: &HashMap<u64, Vec<u64>>,
        needs: &mut HashMap<u64, Need>,
    ) {
        // (key, value, whether the whole prefix up to it is required: it was read).
        let mut work = vec![(key, value, true)];
        while let Some((k, v, read)) = work.pop() {
            let at = pos.get(&(k, v)).copied();
            if at.is_some_and(|p| self.expanded.get(&k).is_some_and(|done| *done > p)) {
                continue;
            }
            let values: Vec<u64> = match at {
                Some(p) if read => {
                    let done = self.expanded.entry(k).or_default();
                    let from = *done;
                    *done = p + 1;
                    longest[&k][from..=p].to_vec()
                }
                _ if self.taken.insert((k, v)) => vec![v],
                _ => continue,
            };
            for v in values {
                for d in deps.get(&(k, v)).into_iter().flatten() {
                    let stronger = match needs.get(&d.key) {
                        None => true,
                        Some(cur) => {
                            let rank = |x: u64| pos.get(&(d.key, x)).copied().unwrap_or(usize::MAX);
                            rank(d.value) > rank(cur.value)
                        }
                    };
                    if stronger {
                        needs.insert(d.key, d.clone());
                    }
                    work.push((d.key, d.value, d.guarantee == "writes-follow-reads"));
                }
            }
        }
    }
}

pub(crate) fn check(ops: &[Op]) -> Result<(CheckerVerdict, Vec<Anomaly>), CheckError> {
    let mut out = Vec::new();
    // Appenders and the order of each key.
    let mut appender: HashMap<(u64, u64), usize> = HashMap::new();
    let mut failed: HashMap<(u64, u64), usize> = HashMap::new();
    let mut longest: HashMap<u64, Vec<u64>> = HashMap::new();
    // A value appended twice to a key (module docs): the first one found.
    let mut twice = None;
    for (i, o) in ops.iter().enumerate() {
        for m in &o.value {
            match m {
                MicroOp::Append { key, value } => {
                    if o.outcome == Outcome::Fail {
                        failed.insert((*key, *value), i);
                    } else if let Some(j) = appender.insert((*key, *value), i) {
                        twice.get_or_insert((*key, *value, ops[j].index, o.index));
                    }
                }
                MicroOp::Read { key, value: Some(ReadValue::List(l)) } if o.outcome == Outcome::Ok => {
                    let cur = longest.entry(*key).or_default();
                    if l.len() > cur.len() {
                        *cur = l.clone();
                    }
                }
                MicroOp::Read { value: Some(ReadValue::Int(_)), .. }
                | MicroOp::Write { .. }
                | MicroOp::WriteUnknown { .. }
                | MicroOp::Cas { .. } => {
                    return Err(CheckError::Unsupported(format!(
                        "causal checks list-append sessions; op index {} has a register micro-op",
                        o.index
                    )))
                }
                _ => {}
            }
        }
    }
    if let Some((key, value, a, b)) = twice {
        let v = CheckerVerdict {
            name: NAME.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            valid: None,
            detail: format!(
                "not checked: value {value} is appended to key {key} more than once (ops {a} and {b}), and this \
                 checker needs appended values unique per key to tell which append a read saw"
            ),
        };
        return Ok((v, vec![]));
    }
    let pos: HashMap<(u64, u64), usize> =
        longest.iter().flat_map(|(k, l)| l.iter().enumerate().map(move |(i, v)| ((*k, *v), i))).collect();
    // Per-read sanity.
    for o in ops.iter().filter(|o| o.outcome == Outcome::Ok) {
        for m in &o.value {
            let MicroOp::Read { key, value: Some(ReadValue::List(l)) } = m else { continue };
            let long = &longest[key];
            if !long.starts_with(l) {
                out.push(anomaly(
                    "incompatible-order",
                    vec![o.index],
                    format!("op {} read key {key} as {l:?}, not a prefix of {long:?} read elsewhere", o.index),
                ));
            }
            let mut seen = HashSet::new();
            for v in l {
                if !seen.insert(*v) {
                    out.push(anomaly(
                        "duplicate-elements",
                        vec![o.index],
                        format!("op {} read {v} twice in key {key}", o.index),
                    ));
                }
                // A value that an operation which is not `fail` appended is no aborted read, even
                // if a failed operation appended it too.
                if appender.contains_key(&(*key, *v)) {
                    continue;
                }
                if let Some(&f) = failed.get(&(*key, *v)) {
                    out.push(anomaly(
                        "aborted-read",
                        vec![o.index, ops[f].index],
                        format!("op {} read {v} in key {key}, appended by failed op {}", o.index, ops[f].index),
                    ));
                } else {
                    out.push(anomaly(
                        "garbage-read",
                        vec![o.index],
                        format!("op {} read {v} in key {key}, which nobody appended", o.index),
                    ));
                }
            }
        }
    }
    // Each ok append's causal dependencies, from its own session's past.
    let mut sessions: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (i, o) in ops.iter().enumerate() {
        sessions.entry(o.process).or_default().push(i);
    }
    let mut deps: HashMap<(u64, u64), Vec<Need>> = HashMap::new();
    for idxs in sessions.values() {
        let mut last_read: HashMap<u64, (Vec<u64>, u64)> = HashMap::new();
        let mut appended: HashMap<u64, (u64, u64)> = HashMap::new();
        for &i in idxs {
            let o = &ops[i];
            // An `info` append carries its session's context (module docs), but it may not
            // have happened: it adds nothing to the context of the session's later appends.
            let ok = o.outcome == Outcome::Ok;
            if o.outcome == Outcome::Fail {
                continue;
            }
            for m in &o.value {
                match m {
                    MicroOp::Read { key, value: Some(ReadValue::List(l)) } if ok => {
                        last_read.insert(*key, (l.clone(), o.index));
                    }
                    MicroOp::Append { key, value } => {
                        let mut d = Vec::new();
                        for (k1, (l, src)) in &last_read {
                            if let Some(&v) = l.last() {
                                d.push(Need {
                                    key: *k1,
                                    value: v,
                                    guarantee: "writes-follow-reads",
                                    source: *src,
                                    via: o.index,
                                });
                            }
                        }
                        // An `info` append someone read took effect: it follows the session's
                        // earlier appends to its key too.
                        let took_effect = ok || pos.contains_key(&(*key, *value));
                        for (k1, (v, src)) in &appended {
                            if *k1 == *key && took_effect {
                                if let (Some(pa), Some(pb)) = (pos.get(&(*key, *v)), pos.get(&(*key, *value))) {
                                    if pa > pb {
                                        out.push(anomaly(
                                            "monotonic-writes",
                                            vec![*src, o.index],
                                            format!("op {src} appended {v} to key {key} before op {} appended {value} in the same session, yet {value} precedes {v} in the key's order", o.index),
                                        ));
                                    }
                                } else if pos.contains_key(&(*key, *value)) {
                                    out.push(anomaly(
                                        "monotonic-writes",
                                        vec![*src, o.index],
                                        format!("op {src} appended {v} to key {key} before op {} appended {value} in the same session, yet {value} was read without {v}", o.index),
                                    ));
                                }
                            }
                            d.push(Need {
                                key: *k1,
                                value: *v,
                                guarantee: "monotonic-writes",
                                source: *src,
                                via: o.index,
                            });
                        }
                        deps.insert((*key, *value), d);
                        if ok {
                            appended.insert(*key, (*value, o.index));
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    // Walk every session, accumulating what it must observe.
    for idxs in sessions.values() {
        let mut own: HashMap<u64, (u64, u64)> = HashMap::new();
        let mut prev: HashMap<u64, (Vec<u64>, u64)> = HashMap::new();
        let mut needs: HashMap<u64, Need> = HashMap::new();
        let mut seen_len: HashMap<u64, usize> = HashMap::new();
        let mut obligations = Obligations::default();
        for &i in idxs {
            let o = &ops[i];
            if o.outcome != Outcome::Ok {
                continue;
            }
            for m in &o.value {
                match m {
                    MicroOp::Append { key, value } => {
                        own.insert(*key, (*value, o.index));
                    }
                    MicroOp::Read { key, value } => {
                        let l: &[u64] = match value {
                            Some(ReadValue::List(l)) => l,
                            _ => &[],
                        };
                        let has = |v: u64| l.contains(&v);
                        if let Some(&(v, src)) = own.get(key) {
                            if !has(v) {
                                out.push(anomaly(
                                    "read-your-writes",
                                    vec![src, o.index],
                                    format!("op {} read key {key} as {l:?}, missing {v} which its session appended in op {src}", o.index),
                                ));
                            }
                        }
                        if let Some((p, src)) = prev.get(key) {
                            if !l.starts_with(p) {
                                out.push(anomaly(
                                    "monotonic-reads",
                                    vec![*src, o.index],
                                    format!("op {} read key {key} as {l:?}, which does not extend the session's earlier read {p:?} (op {src})", o.index),
                                ));
                            }
                        }
                        if let Some(n) = needs.get(key) {
                            if !has(n.value) {
                                out.push(anomaly(
                                    n.guarantee,
                                    vec![n.source, n.via, o.index],
                                    format!(
                                        "op {} read key {key} as {l:?}, missing {}: the session had observed the write of op {}, which followed (in its own session) op {} that {} {} of key {key}",
                                        o.index,
                                        n.value,
                                        n.via,
                                        n.source,
                                        if n.guarantee == "monotonic-writes" { "appended" } else { "had read" },
                                        n.value
                                    ),
                                ));
                            }
                        }
                        // New observations add obligations.
                        let from = seen_len.get(key).copied().unwrap_or(0).min(l.len());
                        for v in &l[from..] {
                            obligations.observe(*key, *v, &deps, &pos, &longest, &mut needs);
                        }
                        seen_len.insert(*key, l.len().max(from));
                        prev.insert(*key, (l.to_vec(), o.index));
                    }
                    _ => {}
                }
            }
        }
    }
    let n_ok = ops.iter().filter(|o| o.outcome == Outcome::Ok).count();
    let v = CheckerVerdict {
        name: NAME.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        valid: Some(out.is_empty()),
        detail: format!("{} sessions, {n_ok} ok operations", sessions.len()),
    };
    Ok((v, out))
}
