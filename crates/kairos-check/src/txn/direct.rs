//! Anomalies visible without a serial-order search: aborted reads (G1a), intermediate reads
//! (G1b), reads of values nobody wrote, lost updates, and list reads that no single append
//! order explains — among them a read in which one transaction's appends are not one run in
//! the order it made them (a review's history read `[2, 1, 3]` after one transaction appended
//! 1 then 2: adya and the dependency graph both took it for valid, and only the serial
//! search, when within its budget, refuted it).
//!
//! A register that a transaction which may have taken effect (`info`, or never completed)
//! wrote with an unknown value ([`Effect::RegUnknown`]) may hold any value that write chose:
//! a read of it may have seen that write, so nothing that needs to know a read value's writer
//! (aborted, intermediate, future and garbage reads, lost updates) is inferred from its reads.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{Effect, Ext, KeyKind, Txn, OURS};
use crate::ops::Outcome;
use crate::report::Anomaly;

/// Why list read `l` of key `k` by transaction `reader` is no state of the list: in every
/// state, each other transaction's appends to `k` are one run, in the order it made them, and
/// whole — except a run at the end of the read, which may stop short only where the G1b check
/// above says so. `None` when it is one, or when an ambiguous value hides who wrote what.
fn split_appends(
    txns: &[Txn],
    reader: usize,
    k: u64,
    l: &[u64],
    appended: &HashMap<(u64, u64), (usize, usize)>,
    ambiguous: &HashSet<(u64, u64)>,
) -> Option<String> {
    if l.iter().any(|v| ambiguous.contains(&(k, *v))) {
        return None;
    }
    let mut done: HashSet<usize> = HashSet::new();
    let mut pos = 0;
    while pos < l.len() {
        let Some(&(w, first)) = appended.get(&(k, l[pos])) else {
            pos += 1;
            continue;
        };
        let run_start = pos;
        while pos < l.len() && appended.get(&(k, l[pos])).is_some_and(|&(x, _)| x == w) {
            pos += 1;
        }
        if w == reader {
            continue;
        }
        let all = txns[w].writes.iter().find_map(|(wk, e)| match e {
            Effect::Append(vs) if *wk == k => Some(vs.as_slice()),
            _ => None,
        })?;
        let run = &l[run_start..pos];
        let writer = txns[w].index;
        if !done.insert(w) {
            return Some(format!("T{writer}'s appends {all:?} are not one run"));
        }
        if first != 0 || !all.starts_with(run) {
            return Some(format!("it shows {run:?} of T{writer}'s appends {all:?}, not in their order from the first"));
        }
        if run.len() < all.len() && pos < l.len() {
            return Some(format!(
                "it shows {run:?} of T{writer}'s appends {all:?}, and then other transactions' appends"
            ));
        }
    }
    None
}

fn anomaly(name: &str, ops: Vec<u64>, explanation: String) -> Anomaly {
    Anomaly { name: name.into(), ops, explanation, checker: OURS.into() }
}

pub(crate) fn anomalies(txns: &[Txn], _kinds: &HashMap<u64, KeyKind>) -> Vec<Anomaly> {
    let mut out = Vec::new();
    // A value written more than once names no single writer: nothing below is inferred from it
    // except a read of a value that only failed transactions wrote.
    let ambiguous = super::graph::ambiguous_writes(txns);
    // Who wrote what: committed-or-unknown writers, failed writers, intermediate writers.
    let mut writer: HashMap<(u64, u64), usize> = HashMap::new();
    let mut failed: HashMap<(u64, u64), usize> = HashMap::new();
    let mut inter: HashMap<(u64, u64), usize> = HashMap::new();
    // For list appends: the position of each element within its transaction's appends to k.
    let mut appended: HashMap<(u64, u64), (usize, usize)> = HashMap::new();
    // Registers that a transaction which may have taken effect wrote with an unknown value.
    let mut unknown: HashSet<u64> = HashSet::new();
    for (i, t) in txns.iter().enumerate() {
        for (k, e) in &t.writes {
            let vals: Vec<u64> = match e {
                Effect::Reg(v) => vec![*v],
                Effect::RegUnknown => {
                    if t.outcome != Outcome::Fail {
                        unknown.insert(*k);
                    }
                    vec![]
                }
                Effect::Append(vs) => vs.clone(),
            };
            for (j, v) in vals.iter().enumerate() {
                if t.outcome == Outcome::Fail {
                    failed.insert((*k, *v), i);
                } else {
                    writer.insert((*k, *v), i);
                    if matches!(e, Effect::Append(_)) {
                        appended.insert((*k, *v), (i, j));
                    }
                }
            }
        }
        for (k, v) in &t.intermediate {
            // Written, overwritten, and written again last: its final value (ABA in one).
            if t.writes.iter().any(|(wk, e)| wk == k && *e == Effect::Reg(*v)) {
                continue;
            }
            if t.outcome == Outcome::Fail {
                failed.insert((*k, *v), i);
            } else {
                inter.insert((*k, *v), i);
            }
        }
    }
    let mut longest: BTreeMap<u64, (usize, Vec<u64>)> = BTreeMap::new();
    let mut lost: BTreeMap<(u64, Ext), Vec<usize>> = BTreeMap::new();
    for (i, t) in txns.iter().enumerate() {
        if t.outcome != Outcome::Ok {
            continue;
        }
        for (k, ext) in &t.reads {
            // A read of a register that may hold an unknown write's value: whatever it saw,
            // that write may have written it (a `nil` read is the exception: no write writes
            // `nil`, so it saw the initial value).
            if unknown.contains(k) && *ext != Ext::Reg(None) {
                continue;
            }
            // Two transactions that read the same ambiguous value may have read two versions.
            // (A list only grows: two equal list reads are one version.)
            let ambiguous_read = matches!(ext, Ext::Reg(Some(v)) if ambiguous.contains(&(*k, *v)));
            if t.writes.iter().any(|(wk, _)| wk == k) && !ambiguous_read {
                lost.entry((*k, ext.clone())).or_default().push(i);
            }
            let vals: &[u64] = match ext {
                Ext::Reg(None) => &[],
                Ext::Reg(Some(v)) => std::slice::from_ref(v),
                Ext::List(l) => l,
            };
            let is_list = matches!(ext, Ext::List(_));
            let mut seen = HashSet::new();
            for (pos, v) in vals.iter().enumerate() {
                if ambiguous.contains(&(*k, *v)) {
                    continue;
                }
                if !seen.insert(*v) {
                    out.push(anomaly(
                        "duplicate-elements",
                        vec![t.index],
                        format!("T{} read key {k} as {vals:?}, in which {v} appears twice", t.index),
                    ));
                    break;
                }
                let live_writer = writer.contains_key(&(*k, *v)) || inter.contains_key(&(*k, *v));
                if let (Some(&w), false) = (failed.get(&(*k, *v)), live_writer) {
                    out.push(anomaly(
                        "G1a",
                        vec![t.index, txns[w].index],
                        format!(
                            "T{} read {v} from key {k}, written by T{}, which failed (aborted read)",
                            t.index, txns[w].index
                        ),
                    ));
                } else if let Some(&w) = inter.get(&(*k, *v)) {
                    if !is_list && w != i {
                        out.push(anomaly(
                            "G1b",
                            vec![t.index, txns[w].index],
                            format!(
                                "T{} read key {k} = {v}, which T{} overwrote before committing (intermediate read)",
                                t.index, txns[w].index
                            ),
                        ));
                    }
                } else if let Some(&w) = writer.get(&(*k, *v)) {
                    if is_list && pos + 1 == vals.len() {
                        // The read ends at v: it must include all of v's writer's later appends.
                        if let (Some(&(wi, j)), Some((_, Effect::Append(all)))) =
                            (appended.get(&(*k, *v)), txns[w].writes.iter().find(|(wk, _)| wk == k))
                        {
                            if wi != i && j + 1 < all.len() {
                                out.push(anomaly(
                                    "G1b",
                                    vec![t.index, txns[w].index],
                                    format!(
                                        "T{} read key {k} as {vals:?}, ending with {v}, but T{} appended {:?} after {v} in the same transaction (intermediate read)",
                                        t.index, txns[w].index, &all[j + 1..]
                                    ),
                                ));
                            }
                        }
                    }
                    if w == i {
                        out.push(anomaly(
                            "future-read",
                            vec![t.index],
                            format!("T{} read {v} from key {k} before it wrote it itself", t.index),
                        ));
                    }
                } else {
                    out.push(anomaly(
                        "garbage-read",
                        vec![t.index],
                        format!("T{} read {v} from key {k}, which no transaction wrote", t.index),
                    ));
                }
            }
            if let Ext::List(l) = ext {
                if let Some(why) = split_appends(txns, i, *k, l, &appended, &ambiguous) {
                    out.push(anomaly(
                        "incompatible-order",
                        vec![t.index],
                        format!("T{} read key {k} as {l:?}: {why}", t.index),
                    ));
                }
                let e = longest.entry(*k).or_insert((i, vec![]));
                if l.len() > e.1.len() {
                    *e = (i, l.clone());
                }
            }
        }
    }
    // Every list read must be a prefix of the longest one: one append order per key.
    for t in txns.iter().filter(|t| t.outcome == Outcome::Ok) {
        for (k, ext) in &t.reads {
            if let (Ext::List(l), Some((li, long))) = (ext, longest.get(k)) {
                if !long.starts_with(l) {
                    out.push(anomaly(
                        "incompatible-order",
                        vec![t.index, txns[*li].index],
                        format!(
                            "T{} read key {k} as {l:?} and T{} read it as {long:?}: no single order of appends explains both",
                            t.index, txns[*li].index
                        ),
                    ));
                }
            }
        }
    }
    for ((k, ext), ts) in lost {
        if ts.len() >= 2 {
            let names: Vec<String> = ts.iter().map(|&t| format!("T{}", txns[t].index)).collect();
            out.push(anomaly(
                "lost-update",
                ts.iter().map(|&t| txns[t].index).collect(),
                format!(
                    "{} all read key {k} in the same state {ext:?} and then wrote it; in any serial order all but the first would have seen another's write (lost update)",
                    names.join(", ")
                ),
            ));
        }
    }
    out
}
