//! Transactional checkers: serializability and strict serializability.
//!
//! Two independent checkers run on every history:
//! * [`adya`] — the external `adya` crate (Elle-style dependency-graph cycle detection);
//! * ours — direct anomaly checks ([`direct`]), an exact search for a serial order
//!   ([`search`]), and, when there is none, a dependency graph of our own ([`graph`]) that
//!   names the cycle. A serial order the search finds is replayed ([`replay`]) before it counts.

pub(crate) mod adya;
pub(crate) mod direct;
pub(crate) mod graph;
pub(crate) mod replay;
pub(crate) mod search;

use std::collections::HashMap;

use kairos_core::history::{MicroOp, ReadValue};

use crate::ops::{Op, Outcome};
use crate::report::{Anomaly, CheckerVerdict};
use crate::CheckError;

pub(crate) const OURS: &str = "kairos-serial-search";

/// The register/list nature of a key, fixed by its first use.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum KeyKind {
    Register,
    List,
}

/// What a transaction required of the state before it ran (its first access of a key).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Ext {
    Reg(Option<u64>),
    List(Vec<u64>),
}

/// What a transaction left behind in a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Effect {
    Reg(u64),
    /// A register write of a value the history does not know (`["w", k, null]`, only in a
    /// transaction that is not `ok`): if the transaction took effect, it wrote some single
    /// non-`nil` value, which any read may have seen.
    RegUnknown,
    Append(Vec<u64>),
}

#[derive(Clone, Debug)]
pub(crate) struct Txn {
    pub index: u64,
    pub outcome: Outcome,
    pub inv_pos: usize,
    /// Completion position if `ok`.
    pub ok_end: Option<usize>,
    pub reads: Vec<(u64, Ext)>,
    pub writes: Vec<(u64, Effect)>,
    /// Register values this transaction wrote and then overwrote.
    pub intermediate: Vec<(u64, u64)>,
}

/// Extracts transactions (and "internal" anomalies: a transaction contradicting itself).
/// Transactions, the kind of each key, and "internal" anomalies.
pub(crate) type Extracted = (Vec<Txn>, HashMap<u64, KeyKind>, Vec<Anomaly>);

pub(crate) fn extract(ops: &[Op]) -> Result<Extracted, CheckError> {
    let mut kinds: HashMap<u64, KeyKind> = HashMap::new();
    let mut internal = Vec::new();
    let mut txns = Vec::with_capacity(ops.len());
    for op in ops {
        let kind_of = |kinds: &mut HashMap<u64, KeyKind>, k: u64, kind: KeyKind| -> Result<(), CheckError> {
            let prev = *kinds.entry(k).or_insert(kind);
            if prev != kind {
                return Err(CheckError::Unsupported(format!(
                    "key {k} is used both as a register and as a list (op index {})",
                    op.index
                )));
            }
            Ok(())
        };
        let ok = op.outcome == Outcome::Ok;
        let mut t = Txn {
            index: op.index,
            outcome: op.outcome,
            inv_pos: op.inv_pos,
            ok_end: op.ok_end(),
            reads: vec![],
            writes: vec![],
            intermediate: vec![],
        };
        // Per key: the value we know this txn sees now (registers), or its external prefix and
        // own appends (lists).
        let mut reg: HashMap<u64, Option<u64>> = HashMap::new();
        let mut list_ext: HashMap<u64, Vec<u64>> = HashMap::new();
        let mut own: HashMap<u64, Vec<u64>> = HashMap::new();
        // The last value written per key (`None`: unknown).
        let mut last_write: HashMap<u64, Option<u64>> = HashMap::new();
        // Registers whose current value in this transaction is unknown (written with `null`).
        let mut unknown: std::collections::HashSet<u64> = std::collections::HashSet::new();
        let mut broken = None;
        for m in &op.value {
            match m {
                MicroOp::Read { key, value } => {
                    let k = *key;
                    match value {
                        Some(ReadValue::List(_)) => kind_of(&mut kinds, k, KeyKind::List)?,
                        Some(ReadValue::Int(_)) => kind_of(&mut kinds, k, KeyKind::Register)?,
                        None => {}
                    }
                    if !ok {
                        continue;
                    }
                    let is_list = matches!(value, Some(ReadValue::List(_))) || kinds.get(&k) == Some(&KeyKind::List);
                    if is_list {
                        let l: &[u64] = match value {
                            Some(ReadValue::List(l)) => l,
                            None => &[],
                            Some(ReadValue::Int(_)) => unreachable!("kind checked above"),
                        };
                        let mine = own.get(&k).map(Vec::as_slice).unwrap_or(&[]);
                        match list_ext.get(&k) {
                            Some(ext) => {
                                let want: Vec<u64> = ext.iter().chain(mine).copied().collect();
                                if want != l {
                                    broken.get_or_insert(format!(
                                        "read key {k} as {l:?} but its own earlier reads and appends imply {want:?}"
                                    ));
                                }
                            }
                            None => {
                                if l.len() < mine.len() || &l[l.len() - mine.len()..] != mine {
                                    broken.get_or_insert(format!(
                                        "read key {k} as {l:?}, which lacks its own appends {mine:?}"
                                    ));
                                } else {
                                    let ext = l[..l.len() - mine.len()].to_vec();
                                    t.reads.push((k, Ext::List(ext.clone())));
                                    list_ext.insert(k, ext);
                                }
                            }
                        }
                    } else {
                        let v = match value {
                            Some(ReadValue::Int(v)) => Some(*v),
                            _ => None,
                        };
                        match reg.get(&k) {
                            Some(seen) if *seen != v => {
                                broken.get_or_insert(format!(
                                    "read key {k} as {v:?} but its own earlier read or write said {seen:?}"
                                ));
                            }
                            Some(_) => {}
                            None => {
                                t.reads.push((k, Ext::Reg(v)));
                                reg.insert(k, v);
                            }
                        }
                    }
                }
                MicroOp::Write { key, value } => {
                    kind_of(&mut kinds, *key, KeyKind::Register)?;
                    reg.insert(*key, Some(*value));
                    unknown.remove(key);
                    if let Some(Some(prev)) = last_write.insert(*key, Some(*value)) {
                        t.intermediate.push((*key, prev));
                    }
                }
                MicroOp::WriteUnknown { key } => {
                    // Only outside `ok` (pairing rejects it there), where reads are not recorded.
                    kind_of(&mut kinds, *key, KeyKind::Register)?;
                    reg.remove(key);
                    unknown.insert(*key);
                    if let Some(Some(prev)) = last_write.insert(*key, None) {
                        t.intermediate.push((*key, prev));
                    }
                }
                MicroOp::Cas { key, expected, new } => {
                    kind_of(&mut kinds, *key, KeyKind::Register)?;
                    match reg.get(key) {
                        // After its own write of an unknown value: nothing to require of the state.
                        None if unknown.contains(key) => {}
                        Some(seen) if *seen != Some(*expected) => {
                            if ok {
                                broken.get_or_insert(format!(
                                    "cas on key {key} expected {expected} but its own earlier access said {seen:?}"
                                ));
                            }
                        }
                        Some(_) => {}
                        None => t.reads.push((*key, Ext::Reg(Some(*expected)))),
                    }
                    reg.insert(*key, Some(*new));
                    unknown.remove(key);
                    if let Some(Some(prev)) = last_write.insert(*key, Some(*new)) {
                        t.intermediate.push((*key, prev));
                    }
                }
                MicroOp::Append { key, value } => {
                    kind_of(&mut kinds, *key, KeyKind::List)?;
                    own.entry(*key).or_default().push(*value);
                }
            }
        }
        let mut writes: Vec<(u64, Effect)> =
            last_write.into_iter().map(|(k, v)| (k, v.map_or(Effect::RegUnknown, Effect::Reg))).collect();
        writes.extend(own.into_iter().map(|(k, v)| (k, Effect::Append(v))));
        writes.sort_by_key(|w| w.0);
        t.writes = writes;
        t.reads.sort_by_key(|r| r.0);
        if let Some(why) = broken {
            internal.push(Anomaly {
                name: "internal".into(),
                ops: vec![op.index],
                explanation: format!("T{} {why}", op.index),
                checker: OURS.into(),
            });
        }
        txns.push(t);
    }
    Ok((txns, kinds, internal))
}

/// The default step budget of the serial search: 2,000,000 plus 20 per transaction.
pub(crate) fn default_budget(txns: usize) -> u64 {
    2_000_000 + 20 * txns as u64
}

/// Our two checkers: the serial-order search (with the direct anomalies, and a named cycle
/// when no order exists) and the dependency-graph checker.
pub(crate) fn check_ours(
    ops: &[Op],
    strict: bool,
    budget: Option<u64>,
) -> Result<Vec<(CheckerVerdict, Vec<Anomaly>)>, CheckError> {
    let (txns, kinds, mut anomalies) = extract(ops)?;
    anomalies.extend(direct::anomalies(&txns, &kinds));
    let dsg = graph::check(&txns, &kinds, strict, &anomalies);
    let budget = budget.unwrap_or_else(|| default_budget(txns.len()));
    let result = search::search(&txns, strict, budget);
    let model = if strict { "strict-serializable" } else { "serializable" };
    let (valid, detail) = match &result {
        search::Outcome::Serial(order) => {
            if let Err(why) = replay::replay(&txns, order, strict) {
                (
                    None,
                    format!(
                        "internal error of this checker, please report it: the {model} order the search found does \
                         not replay ({why})"
                    ),
                )
            } else if anomalies.is_empty() {
                (Some(true), format!("found a {model} order of {} transactions", order.len()))
            } else {
                (
                    Some(false),
                    format!(
                        "direct anomalies found, yet the search found a {model} order: an internal inconsistency of this checker"
                    ),
                )
            }
        }
        search::Outcome::NoOrder { steps } => {
            (Some(false), format!("exhaustive search ({steps} steps) found no {model} order"))
        }
        search::Outcome::Budget { steps, placed_max, to_place } => {
            if anomalies.is_empty() {
                (
                    None,
                    format!(
                        "search budget of {steps} steps exhausted: the longest partial order placed {placed_max} of the \
                         {to_place} transactions that must be placed; raise it with --search-budget"
                    ),
                )
            } else {
                (Some(false), format!("direct anomalies found (search budget of {steps} steps exhausted)"))
            }
        }
    };
    if valid == Some(false) {
        if let Some(a) = graph::name_cycle(&txns, &kinds, strict) {
            if !anomalies.iter().any(|x| x.name == a.name) {
                anomalies.push(a);
            }
        }
        if anomalies.is_empty() {
            anomalies.push(Anomaly {
                name: if strict { "strict-serializability-violation" } else { "serializability-violation" }.into(),
                ops: vec![],
                explanation: format!(
                    "no {model} order of the committed transactions exists, but no dependency cycle could be named"
                ),
                checker: OURS.into(),
            });
        }
    }
    let search = CheckerVerdict { name: OURS.into(), version: env!("CARGO_PKG_VERSION").into(), valid, detail };
    Ok(vec![(search, anomalies), dsg])
}
