//! An independent check of the serial search's witness: replays the order it found on a plain
//! key → state model and confirms it explains the history.
//!
//! The search is fast because of its bookkeeping (incremental enabled sets, pruning, unknown
//! values bound lazily); a slip there could make it return an order that does not explain the
//! history, which would be a wrong *valid*. So a "valid" stands only if this replay accepts the
//! order: every `ok` transaction placed exactly once, no `fail` one, every external read seeing
//! the state left by the transactions before it, and (strict serializability) no transaction
//! placed after one that was invoked after it completed. A write of unknown value leaves the key
//! holding "some value": the first read after it (of anything but `nil`) fixes which.

use std::collections::{BTreeSet, HashMap};

use super::{Effect, Ext, Txn};
use crate::ops::Outcome;

#[derive(Clone, Debug, PartialEq)]
enum Held {
    Reg(Option<u64>),
    /// Written with a value no read has seen yet.
    Unknown,
    List(Vec<u64>),
}

/// `Ok(())` if `order` (indexes into `txns`) is a serial order explaining the history.
pub(crate) fn replay(txns: &[Txn], order: &[usize], strict: bool) -> Result<(), String> {
    let mut placed = vec![false; txns.len()];
    // Completion positions of the `ok` transactions not placed yet (for real time).
    let mut ends: BTreeSet<(usize, usize)> = txns
        .iter()
        .enumerate()
        .filter_map(|(i, t)| t.ok_end.filter(|_| t.outcome == Outcome::Ok).map(|e| (e, i)))
        .collect();
    let mut held: HashMap<u64, Held> = HashMap::new();
    for &i in order {
        let t = txns.get(i).ok_or_else(|| format!("position {i} names no transaction"))?;
        if std::mem::replace(&mut placed[i], true) {
            return Err(format!("T{} is placed twice", t.index));
        }
        if t.outcome == Outcome::Fail {
            return Err(format!("T{} failed but is placed", t.index));
        }
        if let Some(&(end, first)) = ends.iter().find(|&&(_, j)| j != i).filter(|_| strict) {
            if end < t.inv_pos {
                return Err(format!(
                    "T{} is placed before T{}, which completed before it was invoked",
                    t.index, txns[first].index
                ));
            }
        }
        if let Some(e) = t.ok_end {
            ends.remove(&(e, i));
        }
        for (k, ext) in &t.reads {
            let cur = held.entry(*k).or_insert_with(|| match ext {
                Ext::Reg(_) => Held::Reg(None),
                Ext::List(_) => Held::List(vec![]),
            });
            let fits = match (&*cur, ext) {
                (Held::Reg(v), Ext::Reg(want)) => v == want,
                (Held::Unknown, Ext::Reg(Some(_))) => true,
                (Held::List(l), Ext::List(want)) => l == want,
                // `nil` and the empty list are the same initial state (a list key read as `nil`).
                (Held::List(l), Ext::Reg(None)) => l.is_empty(),
                (Held::Reg(None), Ext::List(want)) => want.is_empty(),
                _ => false,
            };
            if !fits {
                return Err(format!("T{} reads key {k} as {ext:?}, but it holds {cur:?} there", t.index));
            }
            if *cur == Held::Unknown {
                let Ext::Reg(v) = ext else { unreachable!("matched above") };
                *cur = Held::Reg(*v);
            }
        }
        for (k, e) in &t.writes {
            match e {
                Effect::Reg(v) => {
                    held.insert(*k, Held::Reg(Some(*v)));
                }
                Effect::RegUnknown => {
                    held.insert(*k, Held::Unknown);
                }
                Effect::Append(vs) => match held.entry(*k).or_insert(Held::Reg(None)) {
                    Held::List(l) => l.extend(vs),
                    empty @ Held::Reg(None) => *empty = Held::List(vs.clone()),
                    other => return Err(format!("T{} appends to key {k}, which holds {other:?}", t.index)),
                },
            }
        }
    }
    let missing = txns
        .iter()
        .enumerate()
        .find(|(i, t)| t.outcome == Outcome::Ok && !placed[*i] && !(t.reads.is_empty() && t.writes.is_empty()));
    match missing {
        Some((_, t)) => Err(format!("ok transaction T{} is not placed", t.index)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(
        index: u64,
        outcome: Outcome,
        inv_pos: usize,
        ok_end: Option<usize>,
        reads: Vec<(u64, Ext)>,
        writes: Vec<(u64, Effect)>,
    ) -> Txn {
        Txn { index, outcome, inv_pos, ok_end, reads, writes, intermediate: vec![] }
    }

    /// T0 gave up after writing an unknown value to key 1; T1 read 5 there, T2 read 5 again.
    fn history() -> Vec<Txn> {
        vec![
            txn(0, Outcome::Info, 0, None, vec![], vec![(1, Effect::RegUnknown)]),
            txn(1, Outcome::Ok, 1, Some(2), vec![(1, Ext::Reg(Some(5)))], vec![]),
            txn(2, Outcome::Ok, 3, Some(4), vec![(1, Ext::Reg(Some(5)))], vec![(2, Effect::Append(vec![7]))]),
        ]
    }

    #[test]
    fn a_good_order_replays_and_binds_the_unknown_value_once() {
        assert_eq!(replay(&history(), &[0, 1, 2], true), Ok(()));
        let mut h = history();
        h[2].reads[0].1 = Ext::Reg(Some(6));
        assert!(replay(&h, &[0, 1, 2], true).unwrap_err().contains("T2 reads key 1"));
    }

    #[test]
    fn every_way_an_order_can_be_wrong_is_caught() {
        let h = history();
        assert!(replay(&h, &[1, 2], true).unwrap_err().contains("T1 reads key 1"));
        assert!(replay(&h, &[0, 1], true).unwrap_err().contains("T2 is not placed"));
        assert!(replay(&h, &[0, 1, 1, 2], true).unwrap_err().contains("placed twice"));
        assert!(replay(&h, &[0, 2, 1], true).unwrap_err().contains("completed before it was invoked"));
        assert_eq!(replay(&h, &[0, 2, 1], false), Ok(()));
        let mut failed = h.clone();
        failed[0].outcome = Outcome::Fail;
        assert!(replay(&failed, &[0, 1, 2], true).unwrap_err().contains("failed"));
        let mut nil = h;
        nil[1].reads[0].1 = Ext::Reg(None);
        assert!(replay(&nil, &[0, 1, 2], true).unwrap_err().contains("T1 reads key 1"));
    }
}
