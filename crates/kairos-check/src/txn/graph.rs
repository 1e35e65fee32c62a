//! Naming why no serial order exists: our own dependency graph and cycle classification.
//!
//! Version order, inferred only from what serializability itself implies:
//! * registers: the initial `nil` precedes every written value; a transaction that read `v`
//!   and then wrote `v'` to the same key installed `v'` after `v`;
//! * lists: the longest read of a key gives the order of its appends.
//!
//! Edges (Adya): `ww` (consecutive versions' writers), `wr` (writer → reader of a version), `rw`
//! (reader of a version → writer of the next), and, for strict serializability, real-time
//! edges (an `ok` transaction completed before another was invoked), encoded through a chain of
//! virtual "moment" nodes so that they cost O(n) instead of O(n²).
//!
//! Names: a cycle of only `ww` edges is G0; `ww`/`wr` G1c; exactly one `rw` G-single; more
//! G2-item; a `-realtime` suffix when it needs a real-time edge.

use std::collections::{HashMap, VecDeque};

use super::{Effect, Ext, KeyKind, Txn, OURS};
use crate::ops::Outcome;
use crate::report::Anomaly;

const WW: u8 = 1;
const WR: u8 = 2;
const RW: u8 = 4;
const RT: u8 = 8;

struct G {
    /// Real transactions are nodes `0..n`; virtual moments follow.
    n: usize,
    adj: Vec<Vec<(u32, u8, u64)>>,
}

impl G {
    fn link(&mut self, a: usize, b: usize, t: u8, key: u64) {
        if a != b {
            self.adj[a].push((b as u32, t, key));
        }
    }
}

/// Strongly connected components over edges in `mask` (iterative Tarjan).
fn sccs(g: &G, mask: u8) -> Vec<u32> {
    let n = g.adj.len();
    const UNSEEN: u32 = u32::MAX;
    let mut index = vec![UNSEEN; n];
    let mut low = vec![0u32; n];
    let mut on = vec![false; n];
    let mut comp = vec![UNSEEN; n];
    let mut stack: Vec<u32> = Vec::new();
    let mut next = 0u32;
    let mut ncomp = 0u32;
    for root in 0..n {
        if index[root] != UNSEEN {
            continue;
        }
        let mut call: Vec<(u32, usize)> = vec![(root as u32, 0)];
        index[root] = next;
        low[root] = next;
        next += 1;
        stack.push(root as u32);
        on[root] = true;
        while let Some(&mut (v, ref mut ei)) = call.last_mut() {
            let vu = v as usize;
            if let Some(&(w, t, _)) = g.adj[vu].get(*ei) {
                *ei += 1;
                if t & mask == 0 {
                    continue;
                }
                let wu = w as usize;
                if index[wu] == UNSEEN {
                    index[wu] = next;
                    low[wu] = next;
                    next += 1;
                    stack.push(w);
                    on[wu] = true;
                    call.push((w, 0));
                } else if on[wu] {
                    low[vu] = low[vu].min(index[wu]);
                }
            } else {
                call.pop();
                if let Some(&(p, _)) = call.last() {
                    low[p as usize] = low[p as usize].min(low[vu]);
                }
                if low[vu] == index[vu] {
                    loop {
                        let w = stack.pop().expect("tarjan stack");
                        on[w as usize] = false;
                        comp[w as usize] = ncomp;
                        if w == v {
                            break;
                        }
                    }
                    ncomp += 1;
                }
            }
        }
    }
    comp
}

/// Shortest path from `from` to `to` over `mask` edges, staying inside component `c`.
fn path(g: &G, comp: &[u32], from: usize, to: usize, mask: u8) -> Option<Vec<(usize, usize, u8, u64)>> {
    let c = comp[from];
    let mut prev: HashMap<usize, (usize, u8, u64)> = HashMap::new();
    let mut q = VecDeque::from([from]);
    while let Some(v) = q.pop_front() {
        for &(w, t, k) in &g.adj[v] {
            let w = w as usize;
            if t & mask == 0 || comp[w] != c || w == from || prev.contains_key(&w) {
                continue;
            }
            prev.insert(w, (v, t, k));
            if w == to {
                let mut out = Vec::new();
                let mut x = to;
                while x != from {
                    let (p, t, k) = prev[&x];
                    out.push((p, x, t, k));
                    x = p;
                }
                out.reverse();
                return Some(out);
            }
            q.push_back(w);
        }
    }
    None
}

fn any_cycle(g: &G, mask: u8) -> Option<Vec<(usize, usize, u8, u64)>> {
    let comp = sccs(g, mask);
    let mut size: HashMap<u32, usize> = HashMap::new();
    for &c in &comp {
        *size.entry(c).or_default() += 1;
    }
    let (best, _) = comp.iter().enumerate().filter(|(_, c)| size[c] > 1).min_by_key(|(i, c)| (size[c], *i))?;
    // A cycle through `best`: a path to one of its in-component predecessors, then back.
    for &(w, t, k) in &g.adj[best] {
        if t & mask != 0 && comp[w as usize] == comp[best] {
            let mut p = path(g, &comp, w as usize, best, mask)?;
            p.insert(0, (best, w as usize, t, k));
            return Some(p);
        }
    }
    None
}

fn single_rw(g: &G, rest: u8) -> Option<Vec<(usize, usize, u8, u64)>> {
    let comp = sccs(g, rest | RW);
    let mut tries = 0;
    for a in 0..g.adj.len() {
        for &(b, t, k) in &g.adj[a] {
            if t != RW || comp[a] != comp[b as usize] {
                continue;
            }
            tries += 1;
            if tries > 5000 {
                return None;
            }
            if let Some(mut p) = path(g, &comp, b as usize, a, rest) {
                p.insert(0, (a, b as usize, RW, k));
                return Some(p);
            }
        }
    }
    None
}

fn build(txns: &[Txn], kinds: &HashMap<u64, KeyKind>, strict: bool) -> G {
    let n = txns.len();
    let mut g = G { n, adj: vec![Vec::new(); n] };
    let live = |t: &Txn| t.outcome != Outcome::Fail;
    let mut writer: HashMap<(u64, u64), usize> = HashMap::new();
    let mut reg_readers: HashMap<(u64, Option<u64>), Vec<usize>> = HashMap::new();
    let mut written: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut longest: HashMap<u64, Vec<u64>> = HashMap::new();
    for (i, t) in txns.iter().enumerate() {
        if !live(t) {
            continue;
        }
        for (k, e) in &t.writes {
            match e {
                Effect::Reg(v) => {
                    if t.outcome == Outcome::Ok || !writer.contains_key(&(*k, *v)) {
                        writer.insert((*k, *v), i);
                    }
                    written.entry(*k).or_default().push(*v);
                }
                Effect::Append(vs) => {
                    for v in vs {
                        writer.insert((*k, *v), i);
                    }
                }
            }
        }
        if t.outcome != Outcome::Ok {
            continue;
        }
        for (k, e) in &t.reads {
            match e {
                Ext::Reg(v) if kinds.get(k) != Some(&KeyKind::List) => reg_readers.entry((*k, *v)).or_default().push(i),
                Ext::List(l) => {
                    let cur = longest.entry(*k).or_default();
                    if l.len() > cur.len() {
                        *cur = l.clone();
                    }
                }
                Ext::Reg(_) => {}
            }
        }
    }
    // Registers: version successor pairs (v1 -> v2).
    let mut succ: Vec<(u64, Option<u64>, u64)> = Vec::new();
    for (k, vs) in &written {
        let nil_readers = reg_readers.get(&(*k, None)).map_or(0, Vec::len);
        if nil_readers.saturating_mul(vs.len()) <= 1_000_000 {
            succ.extend(vs.iter().map(|v| (*k, None, *v)));
        }
    }
    for t in txns.iter().filter(|t| t.outcome == Outcome::Ok) {
        for (k, e) in &t.reads {
            if let (Ext::Reg(Some(v1)), Some((_, Effect::Reg(v2)))) = (e, t.writes.iter().find(|(wk, _)| wk == k)) {
                succ.push((*k, Some(*v1), *v2));
            }
        }
    }
    for (k, v1, v2) in succ {
        let Some(&w2) = writer.get(&(k, v2)) else { continue };
        if let Some(&w1) = v1.and_then(|v| writer.get(&(k, v))) {
            g.link(w1, w2, WW, k);
        }
        for &r in reg_readers.get(&(k, v1)).map_or(&[][..], Vec::as_slice) {
            g.link(r, w2, RW, k);
        }
    }
    for ((k, v), rs) in &reg_readers {
        if let Some(&w) = v.and_then(|v| writer.get(&(*k, v))) {
            for &r in rs {
                g.link(w, r, WR, *k);
            }
        }
    }
    // Lists.
    for (k, order) in &longest {
        for pair in order.windows(2) {
            if let (Some(&a), Some(&b)) = (writer.get(&(*k, pair[0])), writer.get(&(*k, pair[1]))) {
                g.link(a, b, WW, *k);
            }
        }
    }
    for (i, t) in txns.iter().enumerate().filter(|(_, t)| t.outcome == Outcome::Ok) {
        for (k, e) in &t.reads {
            let l: &[u64] = match e {
                Ext::List(l) => l,
                Ext::Reg(None) if kinds.get(k) == Some(&KeyKind::List) => &[],
                _ => continue,
            };
            if let Some(&w) = l.last().and_then(|v| writer.get(&(*k, *v))) {
                g.link(w, i, WR, *k);
            }
            if let Some(order) = longest.get(k) {
                if order.starts_with(l) {
                    if let Some(&w) = order.get(l.len()).and_then(|v| writer.get(&(*k, *v))) {
                        g.link(i, w, RW, *k);
                    }
                }
            }
        }
    }
    if strict {
        let mut ends: Vec<(usize, usize)> =
            txns.iter().enumerate().filter_map(|(i, t)| t.ok_end.map(|e| (e, i))).collect();
        ends.sort_unstable();
        let base = g.adj.len();
        g.adj.resize(base + ends.len(), Vec::new());
        for (j, &(_, t)) in ends.iter().enumerate() {
            g.link(t, base + j, RT, 0);
            if j + 1 < ends.len() {
                g.link(base + j, base + j + 1, RT, 0);
            }
        }
        for (i, t) in txns.iter().enumerate().filter(|(_, t)| live(t)) {
            let j = ends.partition_point(|e| e.0 < t.inv_pos);
            if j > 0 {
                g.link(base + j - 1, i, RT, 0);
            }
        }
    }
    g
}

/// Finds and names the most severe dependency cycle, if any.
pub(crate) fn name_cycle(txns: &[Txn], kinds: &HashMap<u64, KeyKind>, strict: bool) -> Option<Anomaly> {
    let g = build(txns, kinds, strict);
    let families: &[u8] = if strict { &[0, RT] } else { &[0] };
    for &extra in families {
        let found = any_cycle(&g, WW | extra)
            .or_else(|| any_cycle(&g, WW | WR | extra))
            .or_else(|| single_rw(&g, WW | WR | extra))
            .or_else(|| any_cycle(&g, WW | WR | RW | extra));
        if let Some(c) = found {
            return Some(describe(&g, txns, &c));
        }
    }
    None
}

fn describe(g: &G, txns: &[Txn], cycle: &[(usize, usize, u8, u64)]) -> Anomaly {
    // Collapse virtual moment nodes into single real-time steps between transactions.
    let mut steps: Vec<(usize, usize, u8, u64)> = Vec::new();
    let mut pending: Option<usize> = None;
    for &(a, b, t, k) in cycle {
        let from = if a < g.n { a } else { pending.expect("virtual node entered from a transaction") };
        if b < g.n {
            steps.push((from, b, t, k));
            pending = None;
        } else {
            pending = Some(from);
        }
    }
    if let (Some(from), Some(first)) = (pending, steps.first().map(|s| s.0)) {
        steps.push((from, first, RT, 0));
    }
    if steps.is_empty() {
        if let Some(&(a, _, _, _)) = cycle.first() {
            if a < g.n {
                steps.push((a, a, RT, 0));
            }
        }
    }
    let rw = steps.iter().filter(|s| s.2 == RW).count();
    let has = |m: u8| steps.iter().any(|s| s.2 == m);
    let base = match rw {
        0 if has(WR) => "G1c",
        0 => "G0",
        1 => "G-single",
        _ => "G2-item",
    };
    let name = if has(RT) { format!("{base}-realtime") } else { base.to_string() };
    let mut text = String::from("dependency cycle:\n");
    for (a, b, t, k) in &steps {
        let (ta, tb) = (txns[*a].index, txns[*b].index);
        let why = match *t {
            WW => format!("T{ta} wrote key {k} and T{tb} wrote its next version"),
            WR => format!("T{tb} read T{ta}'s write of key {k}"),
            RW => format!("T{ta} read a version of key {k} that T{tb} overwrote"),
            _ => format!("T{ta} completed before T{tb} was invoked (real time)"),
        };
        text.push_str(&format!("  T{ta} -> T{tb}: {why}\n"));
    }
    text.push_str("so no serial order can place each of these transactions after its predecessor");
    let mut ops: Vec<u64> = steps.iter().map(|s| txns[s.0].index).collect();
    ops.dedup();
    Anomaly { name, ops, explanation: text, checker: OURS.into() }
}
