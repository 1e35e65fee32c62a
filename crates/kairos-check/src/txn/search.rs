//! Our second transactional checker: an exact search for a serial order.
//!
//! A Wing–Gong–Lowe-style depth-first search over transactions, applied one at a time to a
//! key → state model (a register's value, or a digest of a list's contents). A transaction can
//! go next when every external read it made matches the model (`enabled`) and, for strict
//! serializability, when every `ok` transaction that completed before it was invoked is already
//! placed (`real-time minimal`). `ok` transactions must all be placed; `info` transactions may be
//! placed or left out (they may or may not have happened); `fail` transactions never are.
//!
//! Pruning:
//! * Lowe's memoization: a (set of placed transactions, model state) pair already explored is
//!   not explored again. Both are kept as 64-bit Zobrist-style digests (a collision could, in
//!   principle, prune a branch wrongly; with 128 bits of digest this is negligible).
//! * A read-only transaction that is enabled (and real-time minimal) is placed at once with no
//!   alternative: placing it earlier never disables anything.
//! * Writers that would strand an unplaced reader of the current value are tried last; `info`
//!   writers after `ok` ones; otherwise invocation order.
//!
//! Cost: a step never scans the whole real-time frontier. Enabled transactions (every external
//! read matches the model) are indexed incrementally — readers are filed under the (key, value)
//! they need, so a write re-examines only the readers of the key's old and new value — in
//! ordered sets by invocation order, split into read-only, `ok` writers and `info` writers. The
//! real-time-minimal ones are a prefix of those sets (invoked before the earliest completion of
//! an unplaced `ok` transaction, kept in an ordered set of completions). A frame enumerates its
//! candidates lazily, in the order above, resuming where it stopped when the search backtracks
//! into it (the state is then restored exactly, so it is the same list as if materialized): the
//! set of alternatives tried — hence exactness, the step count and the budget — is that of an
//! eager enumeration, but a step that succeeds at once costs O(log n) plus the candidates it
//! skips, instead of O(concurrency). (Materializing and sorting every frame's candidates made
//! histories with thousands of concurrent transactions quadratic: 12–20 s for 40,000.)
//!
//! Limits: the number of search steps is bounded; beyond it the verdict is unknown. Histories
//! of read-modify-write transactions with unique written values are close to linear time.
//! Histories with many concurrent blind writes may exhaust the budget when they are *not*
//! serializable (the search must then refute every interleaving).

use std::collections::{BTreeSet, HashMap, HashSet};

use super::{Effect, Ext, Txn};
use crate::ops::Outcome as OpOutcome;

pub(crate) enum Outcome {
    /// A serial order (indexes into the transaction list).
    Serial(Vec<usize>),
    NoOrder {
        steps: u64,
    },
    Budget {
        steps: u64,
        /// The most transactions placed in one partial order, and how many must be placed.
        placed_max: usize,
        to_place: usize,
    },
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Token of a register value (`None` = initial = 0).
pub(crate) fn reg_token(v: Option<u64>) -> u64 {
    v.map_or(0, |v| mix(v ^ 0x5151_5151) | 1)
}

/// Token of a list after appending `v` to a list with token `t` (empty list = 0).
pub(crate) fn list_push(t: u64, v: u64) -> u64 {
    mix(t.rotate_left(17) ^ mix(v.wrapping_add(0xA5A5))) | 1
}

fn ext_token(e: &Ext) -> u64 {
    match e {
        Ext::Reg(v) => reg_token(*v),
        Ext::List(l) => l.iter().fold(0, |t, v| list_push(t, *v)),
    }
}

enum W {
    Set(u64),
    Append(Vec<u64>),
}

struct Node {
    reads: Vec<(usize, u64)>,
    writes: Vec<(usize, W)>,
    ok: bool,
    inv_pos: usize,
    ok_end: Option<usize>,
    txn: usize,
}

/// Where a frame is in its (lazily enumerated) list of candidates.
enum Cursor {
    /// A read-only transaction forced next (or already tried).
    Single(Option<u32>),
    /// Writers in the order (`ok` before `info`, non-stranding before stranding, invocation
    /// order): `group` is `2 * info + strands`, `from` the smallest transaction still to try in it.
    Writers { group: u8, from: u32 },
}

struct Frame {
    cursor: Cursor,
    child: Option<(u32, usize)>,
}

struct State {
    nodes: Vec<Node>,
    strict: bool,
    tok: Vec<u64>,
    state_hash: u64,
    applied_hash: u64,
    readers: HashMap<(usize, u64), Vec<u32>>,
    mismatch: Vec<u32>,
    applied: Vec<bool>,
    /// Unplaced transactions whose reads all match the model, read-only ones apart and writers
    /// split into `ok` (`[0]`) and `info` (`[1]`); all keyed by invocation order.
    enabled_ro: BTreeSet<u32>,
    enabled_w: [BTreeSet<u32>; 2],
    ends: BTreeSet<(usize, u32)>,
    undo: Vec<(usize, u64)>,
    order: Vec<u32>,
    remaining_ok: usize,
}

impl State {
    fn contrib(k: usize, t: u64) -> u64 {
        if t == 0 {
            0
        } else {
            mix((k as u64).wrapping_mul(0x2545_F491_4F6C_DD1D) ^ t)
        }
    }

    fn enable(&mut self, r: u32) {
        Self::set_enabled(&self.nodes, &mut self.enabled_ro, &mut self.enabled_w, r, true);
    }

    fn disable(&mut self, r: u32) {
        Self::set_enabled(&self.nodes, &mut self.enabled_ro, &mut self.enabled_w, r, false);
    }

    fn set_token(&mut self, k: usize, new: u64) {
        let old = self.tok[k];
        if old == new {
            return;
        }
        let rs = self.readers.get(&(k, old)).map_or(&[][..], Vec::as_slice);
        for &r in rs {
            self.mismatch[r as usize] += 1;
            if self.mismatch[r as usize] == 1 && !self.applied[r as usize] {
                Self::set_enabled(&self.nodes, &mut self.enabled_ro, &mut self.enabled_w, r, false);
            }
        }
        let rs = self.readers.get(&(k, new)).map_or(&[][..], Vec::as_slice);
        for &r in rs {
            self.mismatch[r as usize] -= 1;
            if self.mismatch[r as usize] == 0 && !self.applied[r as usize] {
                Self::set_enabled(&self.nodes, &mut self.enabled_ro, &mut self.enabled_w, r, true);
            }
        }
        self.tok[k] = new;
        self.state_hash ^= Self::contrib(k, old) ^ Self::contrib(k, new);
    }

    fn set_enabled(nodes: &[Node], ro: &mut BTreeSet<u32>, w: &mut [BTreeSet<u32>; 2], r: u32, on: bool) {
        let n = &nodes[r as usize];
        let set = if n.writes.is_empty() { ro } else { &mut w[usize::from(!n.ok)] };
        if on {
            set.insert(r);
        } else {
            set.remove(&r);
        }
    }

    fn apply(&mut self, t: u32) {
        let ti = t as usize;
        self.applied[ti] = true;
        self.disable(t);
        if let Some(e) = self.nodes[ti].ok_end {
            self.ends.remove(&(e, t));
        }
        if self.nodes[ti].ok {
            self.remaining_ok -= 1;
        }
        for w in 0..self.nodes[ti].writes.len() {
            let k = self.nodes[ti].writes[w].0;
            let old = self.tok[k];
            let new = match &self.nodes[ti].writes[w].1 {
                W::Set(x) => *x,
                W::Append(vs) => vs.iter().fold(old, |a, v| list_push(a, *v)),
            };
            self.undo.push((k, old));
            self.set_token(k, new);
        }
        self.applied_hash ^= mix(t as u64 ^ 0x00DD_BA11);
        self.order.push(t);
    }

    fn unapply(&mut self, t: u32, mark: usize) {
        let ti = t as usize;
        while self.undo.len() > mark {
            let (k, old) = self.undo.pop().expect("undo entry");
            self.set_token(k, old);
        }
        self.applied[ti] = false;
        if let Some(e) = self.nodes[ti].ok_end {
            self.ends.insert((e, t));
        }
        if self.nodes[ti].ok {
            self.remaining_ok += 1;
        }
        if self.mismatch[ti] == 0 {
            self.enable(t);
        }
        self.applied_hash ^= mix(t as u64 ^ 0x00DD_BA11);
        self.order.pop();
    }

    /// Would placing `t` now leave an unplaced `ok` reader of a key's current value unsatisfiable?
    fn strands(&self, t: u32) -> bool {
        self.nodes[t as usize].writes.iter().any(|(k, _)| {
            self.readers
                .get(&(*k, self.tok[*k]))
                .is_some_and(|rs| rs.iter().any(|&r| r != t && !self.applied[r as usize] && self.nodes[r as usize].ok))
        })
    }

    /// Transactions invoked before the first unplaced `ok` transaction completed (all, when not
    /// strict) are real-time minimal: ids below this bound.
    fn cut(&self) -> u32 {
        if !self.strict {
            return self.nodes.len() as u32;
        }
        let threshold = self.ends.first().map_or(usize::MAX, |e| e.0);
        self.nodes.partition_point(|n| n.inv_pos < threshold) as u32
    }

    /// The candidates of the current state, enumerated lazily: an enabled, real-time-minimal
    /// read-only transaction alone if there is one (the first in invocation order), else every
    /// enabled, real-time-minimal writer.
    fn cursor(&self) -> Cursor {
        let cut = self.cut();
        match self.enabled_ro.range(..cut).next() {
            Some(&t) => Cursor::Single(Some(t)),
            None => Cursor::Writers { group: 0, from: 0 },
        }
    }

    /// The next candidate of a frame whose state is the current one (the state is restored
    /// exactly before a frame is resumed, so the enumeration is the same ordered list each time).
    fn next_candidate(&self, cursor: &mut Cursor) -> Option<u32> {
        match cursor {
            Cursor::Single(t) => t.take(),
            Cursor::Writers { group, from } => {
                let cut = self.cut();
                while *group < 4 {
                    let want_strands = *group % 2 == 1;
                    if *from < cut {
                        let set = &self.enabled_w[usize::from(*group / 2)];
                        if let Some(&t) = set.range(*from..cut).find(|&&t| self.strands(t) == want_strands) {
                            *from = t + 1;
                            return Some(t);
                        }
                    }
                    *group += 1;
                    *from = 0;
                }
                None
            }
        }
    }
}

pub(crate) fn search(txns: &[Txn], strict: bool, budget: u64) -> Outcome {
    let mut key_ids: HashMap<u64, usize> = HashMap::new();
    let mut kid = |k: u64| {
        let n = key_ids.len();
        *key_ids.entry(k).or_insert(n)
    };
    let mut nodes = Vec::new();
    for (i, t) in txns.iter().enumerate() {
        let ok = t.outcome == OpOutcome::Ok;
        let usable = match t.outcome {
            OpOutcome::Ok => !(t.reads.is_empty() && t.writes.is_empty()),
            OpOutcome::Info => !t.writes.is_empty(),
            OpOutcome::Fail => false,
        };
        if !usable {
            continue;
        }
        let reads = t.reads.iter().map(|(k, e)| (kid(*k), ext_token(e))).collect();
        let writes = t
            .writes
            .iter()
            .map(|(k, e)| {
                (
                    kid(*k),
                    match e {
                        Effect::Reg(v) => W::Set(reg_token(Some(*v))),
                        Effect::Append(vs) => W::Append(vs.clone()),
                    },
                )
            })
            .collect();
        nodes.push(Node { reads, writes, ok, inv_pos: t.inv_pos, ok_end: t.ok_end, txn: i });
    }
    let n = nodes.len();
    let mut st = State {
        strict,
        tok: vec![0; key_ids.len()],
        state_hash: 0,
        applied_hash: 0,
        readers: HashMap::new(),
        mismatch: vec![0; n],
        applied: vec![false; n],
        enabled_ro: BTreeSet::new(),
        enabled_w: [BTreeSet::new(), BTreeSet::new()],
        ends: nodes.iter().enumerate().filter_map(|(i, x)| x.ok_end.filter(|_| x.ok).map(|e| (e, i as u32))).collect(),
        undo: Vec::new(),
        order: Vec::new(),
        remaining_ok: nodes.iter().filter(|x| x.ok).count(),
        nodes,
    };
    for i in 0..n {
        let reads = std::mem::take(&mut st.nodes[i].reads);
        for (k, t) in &reads {
            st.readers.entry((*k, *t)).or_default().push(i as u32);
            if *t != 0 {
                st.mismatch[i] += 1;
            }
        }
        st.nodes[i].reads = reads;
        if st.mismatch[i] == 0 {
            st.enable(i as u32);
        }
    }

    let mut memo: HashSet<(u64, u64)> = HashSet::new();
    let mut stack: Vec<Frame> = Vec::new();
    let mut steps: u64 = 0;
    let mut placed_max = 0usize;
    let to_place = st.remaining_ok;
    loop {
        placed_max = placed_max.max(to_place - st.remaining_ok);
        if st.remaining_ok == 0 {
            return Outcome::Serial(st.order.iter().map(|&t| st.nodes[t as usize].txn).collect());
        }
        steps += 1;
        if steps > budget {
            return Outcome::Budget { steps: budget, placed_max, to_place };
        }
        if memo.insert((st.applied_hash, st.state_hash)) {
            let cursor = st.cursor();
            stack.push(Frame { cursor, child: None });
        }
        loop {
            let Some(f) = stack.last_mut() else {
                return Outcome::NoOrder { steps };
            };
            if let Some((t, mark)) = f.child.take() {
                st.unapply(t, mark);
            }
            let f = stack.last_mut().expect("frame");
            if let Some(t) = st.next_candidate(&mut f.cursor) {
                let mark = st.undo.len();
                f.child = Some((t, mark));
                st.apply(t);
                break;
            }
            stack.pop();
        }
    }
}
