//! Naming why no serial order exists: our own dependency graph and cycle classification.
//!
//! Version order, inferred only from what serializability itself implies:
//! * registers: the initial `nil` precedes every written value; a transaction that read `v`
//!   and then wrote `v'` to the same key installed `v'` after `v`;
//! * lists: the longest read of a key gives the order of its appends.
//!
//! A register that a transaction which may have taken effect wrote with an unknown value
//! (`["w", k, null]` in an `info`) may hold that value: a read of it other than `nil` may have
//! seen that write, whatever its value, so it names no writer and gives no edge (a `nil` read
//! still precedes every write). Such a read, or such a write by a transaction known to have
//! happened, leaves the key's version order unknown, so the graph can then only refute.
//!
//! Edges (Adya): `ww` (consecutive versions' writers), `wr` (writer → reader of a version), `rw`
//! (reader of a version → writer of the next), and, for strict serializability, real-time
//! edges (an `ok` transaction completed before another was invoked), encoded through a chain of
//! virtual "moment" nodes so that they cost O(n) instead of O(n²).
//!
//! Names: a cycle of only `ww` edges is G0; `ww`/`wr` G1c; exactly one `rw` G-single; more
//! G2-item; a `-realtime` suffix when it needs a real-time edge.

use std::collections::{HashMap, HashSet, VecDeque};

use super::{Effect, Ext, KeyKind, Txn, OURS};
use crate::ops::Outcome;
use crate::report::{Anomaly, CheckerVerdict};

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

/// (key, value) pairs that do not identify their writer: appended twice, or written by more
/// than one transaction (as its final or an intermediate write) with at least one of them
/// final. (A value only ever overwritten is an intermediate read's, whoever wrote it: G1b.)
/// No edge is inferred from them, and no version order that needs them is complete.
pub(crate) fn ambiguous_writes(txns: &[Txn]) -> HashSet<(u64, u64)> {
    // Per value: how many transactions wrote it, and whether one of them wrote it last.
    let mut writers: HashMap<(u64, u64), (usize, bool)> = HashMap::new();
    let mut dup = HashSet::new();
    for t in txns.iter().filter(|t| t.outcome != Outcome::Fail) {
        let mut written: Vec<((u64, u64), bool)> = t.intermediate.iter().map(|kv| (*kv, false)).collect();
        for (k, e) in &t.writes {
            match e {
                Effect::Reg(v) => written.push(((*k, *v), true)),
                Effect::RegUnknown => {}
                Effect::Append(vs) => {
                    let mut once = HashSet::new();
                    for v in vs {
                        if !once.insert(*v) {
                            dup.insert((*k, *v));
                        }
                        written.push(((*k, *v), true));
                    }
                }
            }
        }
        // A transaction that writes a value twice to a register still names itself.
        written.sort_unstable_by_key(|(kv, last)| (*kv, !*last));
        written.dedup_by_key(|(kv, _)| *kv);
        for (kv, last) in written {
            let w = writers.entry(kv).or_default();
            *w = (w.0 + 1, w.1 || last);
        }
    }
    dup.extend(writers.into_iter().filter(|(_, (n, last))| *n > 1 && *last).map(|(kv, _)| kv));
    dup
}

/// Why the inferred version order of some key is not total (at most a few examples), so an
/// acyclic graph proves nothing. Empty: every key's version order is known, and the graph is
/// Adya's direct serialization graph itself.
type Gaps = Vec<String>;

fn build(txns: &[Txn], kinds: &HashMap<u64, KeyKind>, strict: bool) -> (G, Gaps) {
    let n = txns.len();
    let mut g = G { n, adj: vec![Vec::new(); n] };
    let mut gaps: Gaps = Vec::new();
    fn gap(gaps: &mut Gaps, why: String) {
        if gaps.len() < 3 {
            gaps.push(why);
        }
    }
    let live = |t: &Txn| t.outcome != Outcome::Fail;
    let dup = ambiguous_writes(txns);
    let mut writer: HashMap<(u64, u64), usize> = HashMap::new();
    let mut reg_readers: HashMap<(u64, Option<u64>), Vec<usize>> = HashMap::new();
    let mut written: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut longest: HashMap<u64, Vec<u64>> = HashMap::new();
    // Registers written with an unknown value by a transaction that may have taken effect, and
    // those writers.
    let mut unknown: HashMap<u64, Vec<usize>> = HashMap::new();
    for (i, t) in txns.iter().enumerate() {
        if !live(t) {
            continue;
        }
        for (k, e) in &t.writes {
            if *e == Effect::RegUnknown {
                unknown.entry(*k).or_default().push(i);
            }
        }
    }
    // Per such register, an `ok` transaction that read a value of it other than nil.
    let mut uncertain: HashMap<u64, usize> = HashMap::new();
    for (i, t) in txns.iter().enumerate() {
        if !live(t) {
            continue;
        }
        for (k, e) in &t.writes {
            match e {
                Effect::Reg(v) => {
                    if !dup.contains(&(*k, *v)) {
                        writer.insert((*k, *v), i);
                        written.entry(*k).or_default().push(*v);
                    }
                }
                Effect::RegUnknown => {}
                Effect::Append(vs) => {
                    for v in vs.iter().filter(|v| !dup.contains(&(*k, **v))) {
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
                Ext::Reg(Some(_)) if unknown.contains_key(k) => {
                    uncertain.entry(*k).or_insert(i);
                }
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
    if let Some((k, v)) = dup.iter().min() {
        gap(
            &mut gaps,
            format!("key {k}: value {v} was written by more than one transaction, so it does not identify its writer"),
        );
    }
    // A transaction is in every serialization if it is `ok`, or if an `ok` transaction read a
    // value it wrote. Unobserved `info` transactions may not have happened: they get no
    // outgoing edge, so they lie on no cycle, and an order may leave them out.
    let mut observed = vec![false; n];
    for (i, t) in txns.iter().enumerate() {
        observed[i] = t.outcome == Outcome::Ok;
    }
    for (k, v) in reg_readers.keys() {
        if let Some(&w) = v.and_then(|v| writer.get(&(*k, v))) {
            observed[w] = true;
        }
    }
    for (k, order) in &longest {
        for v in order {
            if let Some(&w) = writer.get(&(*k, *v)) {
                observed[w] = true;
            }
        }
    }
    let mut unknown_keys: Vec<(&u64, &Vec<usize>)> = unknown.iter().collect();
    unknown_keys.sort_unstable();
    for (k, ws) in unknown_keys {
        if let Some(&r) = uncertain.get(k) {
            gap(
                &mut gaps,
                format!(
                    "key {k}: T{} may have written an unknown value to it, so T{}'s read of it does not identify \
                     its writer",
                    txns[ws[0]].index, txns[r].index
                ),
            );
        } else if let Some(&w) = ws.iter().find(|&&w| observed[w]) {
            gap(&mut gaps, format!("key {k}: T{} took effect and wrote an unknown value to it", txns[w].index));
        }
    }
    // Registers: version successor pairs (v1 -> v2): nil precedes every value; a transaction
    // that read v1 and wrote v2 installed v2 right after v1.
    let mut succ: Vec<(u64, Option<u64>, u64)> = Vec::new();
    for (k, vs) in &written {
        let nil_readers = reg_readers.get(&(*k, None)).map_or(0, Vec::len);
        if nil_readers.saturating_mul(vs.len()) <= 1_000_000 {
            succ.extend(vs.iter().map(|v| (*k, None, *v)));
        } else {
            // Too many edges to draw: without them the graph is not the DSG (a review's stale
            // read of `nil` after a chain of writes went unseen, and was called proved).
            gap(
                &mut gaps,
                format!(
                    "key {k}: {nil_readers} reads of nil and {} values written, too many rw edges to draw",
                    vs.len()
                ),
            );
        }
    }
    let mut wfr: HashMap<u64, Vec<(Option<u64>, u64)>> = HashMap::new();
    for t in txns.iter().filter(|t| t.outcome == Outcome::Ok) {
        for (k, e) in &t.reads {
            if let (Ext::Reg(v1), Some((_, Effect::Reg(v2)))) = (e, t.writes.iter().find(|(wk, _)| wk == k)) {
                if let Some(v1) = v1.filter(|v1| !unknown.contains_key(k) && !dup.contains(&(*k, *v1))) {
                    succ.push((*k, Some(v1), *v2));
                }
                wfr.entry(*k).or_default().push((*v1, *v2));
            }
        }
    }
    for (k, vs) in &written {
        let included: Vec<u64> = vs.iter().copied().filter(|v| observed[writer[&(*k, *v)]]).collect();
        if included.len() > 1 && gaps.len() < 3 {
            if let Err(why) = register_chain(&included, wfr.get(k).map_or(&[][..], Vec::as_slice)) {
                gap(&mut gaps, format!("key {k}: {why}"));
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
    // Lists: the longest read orders the observed appends; every other append of a transaction
    // that happened comes after them (a read that ended before it would otherwise have shown it).
    let mut tail_appenders: HashMap<u64, Vec<usize>> = HashMap::new();
    for (i, t) in txns.iter().enumerate().filter(|(i, _)| observed[*i]) {
        for (k, e) in &t.writes {
            if let Effect::Append(vs) = e {
                let order = longest.get(k).map_or(&[][..], Vec::as_slice);
                if vs.iter().any(|v| !order.contains(v)) {
                    tail_appenders.entry(*k).or_default().push(i);
                }
            }
        }
    }
    let empty = Vec::new();
    let list_keys: HashSet<u64> = longest.keys().chain(tail_appenders.keys()).copied().collect();
    for k in &list_keys {
        let order = longest.get(k).unwrap_or(&empty);
        for pair in order.windows(2) {
            if let (Some(&a), Some(&b)) = (writer.get(&(*k, pair[0])), writer.get(&(*k, pair[1]))) {
                g.link(a, b, WW, *k);
            }
        }
        let last = order.last().and_then(|v| writer.get(&(*k, *v)));
        for &t in tail_appenders.get(k).unwrap_or(&Vec::new()) {
            if let Some(&w) = last {
                g.link(w, t, WW, *k);
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
            let order = longest.get(k).unwrap_or(&empty);
            if order.starts_with(l) {
                if let Some(&w) = order.get(l.len()).and_then(|v| writer.get(&(*k, *v))) {
                    g.link(i, w, RW, *k);
                } else if l.len() == order.len() {
                    for &w in tail_appenders.get(k).unwrap_or(&Vec::new()) {
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
    (g, gaps)
}

/// Whether the written values of a register form one chain from nil, each link a
/// transaction that read the previous version and wrote the next (or a head with no
/// recorded predecessor, when it is the only one).
fn register_chain(included: &[u64], wfr: &[(Option<u64>, u64)]) -> Result<(), String> {
    let set: HashSet<u64> = included.iter().copied().collect();
    let mut next: HashMap<Option<u64>, u64> = HashMap::new();
    let mut has_pred: HashSet<u64> = HashSet::new();
    for &(v1, v2) in wfr {
        if !set.contains(&v2) {
            continue;
        }
        if let Some(other) = next.insert(v1, v2) {
            if other != v2 {
                return Err(format!("two transactions overwrote the same version {v1:?} ({other} and {v2})"));
            }
        }
        if v1.is_some() {
            has_pred.insert(v2);
        }
    }
    let heads: Vec<u64> = included.iter().copied().filter(|v| !has_pred.contains(v)).collect();
    let [head] = heads.as_slice() else {
        return Err(format!(
            "{} written values follow no read of the previous version (blind writes), so their order is unknown",
            heads.len()
        ));
    };
    let mut len = 1;
    let mut cur = *head;
    while let Some(&v) = next.get(&Some(cur)) {
        cur = v;
        len += 1;
        if len > included.len() {
            return Err("its versions form a cycle".into());
        }
    }
    if len == included.len() {
        Ok(())
    } else {
        Err(format!("only {len} of its {} written values form one chain of read-then-write", included.len()))
    }
}

/// Finds and names the most severe dependency cycle, if any.
pub(crate) fn name_cycle(txns: &[Txn], kinds: &HashMap<u64, KeyKind>, strict: bool) -> Option<Anomaly> {
    let (g, _) = build(txns, kinds, strict);
    find_cycle(&g, txns, strict)
}

fn find_cycle(g: &G, txns: &[Txn], strict: bool) -> Option<Anomaly> {
    let families: &[u8] = if strict { &[0, RT] } else { &[0] };
    for &extra in families {
        let found = any_cycle(g, WW | extra)
            .or_else(|| any_cycle(g, WW | WR | extra))
            .or_else(|| single_rw(g, WW | WR | extra))
            .or_else(|| any_cycle(g, WW | WR | RW | extra));
        if let Some(c) = found {
            return Some(describe(g, txns, &c));
        }
    }
    None
}

pub(crate) const NAME: &str = "kairos-dsg";

/// The dependency-graph checker: Adya's direct serialization graph (plus real-time edges for
/// strict serializability, O(n log n) through a chain of "moment" nodes), from the version
/// order that the history itself implies. A cycle is an anomaly. No cycle proves the model
/// when that version order is total for every key and no direct anomaly was found (Adya's
/// theorem: an acyclic DSG over a complete version order admits a serial order, any
/// topological order, which respects real time when real-time edges are in the graph);
/// otherwise the verdict is unknown and says which key's order is not known.
pub(crate) fn check(
    txns: &[Txn],
    kinds: &HashMap<u64, KeyKind>,
    strict: bool,
    direct: &[Anomaly],
) -> (CheckerVerdict, Vec<Anomaly>) {
    let model = if strict { "strict-serializable" } else { "serializable" };
    let (g, gaps) = build(txns, kinds, strict);
    let verdict =
        |valid, detail| CheckerVerdict { name: NAME.into(), version: env!("CARGO_PKG_VERSION").into(), valid, detail };
    let edges: usize = g.adj.iter().map(Vec::len).sum();
    if let Some(mut a) = find_cycle(&g, txns, strict) {
        a.checker = NAME.into();
        let detail = format!("{} cycle in the dependency graph ({} transactions, {edges} edges)", a.name, txns.len());
        return (verdict(Some(false), detail), vec![a]);
    }
    if !direct.is_empty() {
        return (verdict(None, "no cycle, but direct anomalies were found: not a proof".into()), vec![]);
    }
    if gaps.is_empty() {
        let detail =
            format!("no cycle in the complete dependency graph ({} transactions, {edges} edges): {model}", txns.len());
        (verdict(Some(true), detail), vec![])
    } else {
        let detail = format!(
            "no cycle, but the history does not fix every version order, so this proves nothing: {}",
            gaps.join("; ")
        );
        (verdict(None, detail), vec![])
    }
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
