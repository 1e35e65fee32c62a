//! Our second transactional checker: an exact search for a serial order.
//!
//! A Wing–Gong–Lowe-style depth-first search over transactions, applied one at a time to a
//! key → state model (a register's value, or a digest of a list's contents). A transaction can
//! go next when every external read it made matches the model (`enabled`) and, for strict
//! serializability, when every `ok` transaction that completed before it was invoked is already
//! placed (`real-time minimal`). `ok` transactions must all be placed; `info` transactions may be
//! placed or left out (they may or may not have happened); `fail` transactions never are.
//!
//! Writes of unknown value (`["w", k, null]`, in an `info` or never-completed transaction):
//! placing such a transaction puts `k` in the state "unknown" — it wrote some single value, not
//! `nil`, that nobody has seen yet. A read of `k` in that state (other than of `nil`) matches,
//! and placing the reader *binds* `k` to the value it read: later reads must agree until the
//! next write, exactly as if the write's value had been that one. This is exact: every
//! serial order in which the write wrote some value `x` is explored with `x` the value its
//! first reader saw (and a write nobody read constrains nothing). The binding is part of the
//! state, so memoization stays sound.
//!
//! Pruning:
//! * Lowe's memoization: a (set of placed transactions, model state) pair already explored is
//!   not explored again. Both are kept as 64-bit Zobrist-style digests (a collision could, in
//!   principle, prune a branch wrongly; with 128 bits of digest this is negligible).
//! * A read-only transaction that is enabled (and real-time minimal) and binds nothing is placed
//!   at once with no alternative: placing it earlier never disables anything. One that would
//!   bind an unknown value changes the state, so it is a candidate among the writers.
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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

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

/// Token of a register written with an unknown value not yet read: even and non-zero, so no
/// register value (0 or odd) or list (odd) has it.
const UNKNOWN: u64 = 2;

/// Whether a read of token `t` is satisfied by the state token `s`, and whether it binds it: an
/// unknown value can be anything but the initial `nil` (token 0).
fn read_matches(s: u64, t: u64) -> (bool, bool) {
    let binds = s == UNKNOWN && t != 0;
    (s == t || binds, binds)
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
    /// A write of unknown value: the key's state becomes [`UNKNOWN`].
    Unknown,
    Append(Vec<u64>),
}

struct Node {
    reads: Vec<(usize, u64)>,
    writes: Vec<(usize, W)>,
    ok: bool,
    inv_pos: usize,
    ok_end: Option<usize>,
    txn: usize,
    /// An `info` transaction that only writes values unknown (no read, no known write).
    only_unknown: bool,
    /// Per read: whether a known write writes that value, and its [`chain_scores`] score.
    read_meta: Vec<(bool, u64)>,
}

/// Where a frame is in its (lazily enumerated) list of candidates.
enum Cursor {
    /// A read-only transaction forced next (or already tried).
    Single(Option<u32>),
    /// The others, by group ([`GROUPS`]), each in its order; `from` is the first position
    /// (score, id) still to try in the current group.
    Writers { group: u8, from: (u64, u32) },
}

/// Candidate groups, tried in this order: `ok` transactions that bind unknown values only to
/// values no known write writes, or to the value the key held before (by chain score, then
/// id); `ok` writers that strand no reader; `ok` writers that strand a reader; `info`
/// transactions by rank ([`State::info_rank`]) 0, 1; last, `ok` transactions that bind an
/// unknown value to another value a known write writes (so that write must come again).
const GROUPS: u8 = 6;

struct Frame {
    cursor: Cursor,
    child: Option<(u32, usize)>,
}

/// Which candidate set an unplaced transaction whose reads all match the model is in.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Member {
    None,
    /// Read-only, and binds nothing.
    Ro,
    /// A writer that binds nothing (or an `info` one).
    Writer {
        info: bool,
    },
    /// An `ok` transaction that would bind an unknown value, with its chain score
    /// ([`chain_scores`]).
    Binder {
        score: u64,
    },
}

/// The candidate sets, keyed by invocation order (binders by their score first); `member` says
/// where each transaction is.
struct Sets {
    ro: BTreeSet<u32>,
    /// Writers: `ok` (`[0]`) and `info` (`[1]`).
    w: [BTreeSet<u32>; 2],
    bind: BTreeSet<(u64, u32)>,
    member: Vec<Member>,
}

impl Sets {
    fn set(&mut self, r: u32, want: Member) {
        let have = self.member[r as usize];
        if have == want {
            return;
        }
        match have {
            Member::None => false,
            Member::Ro => self.ro.remove(&r),
            Member::Writer { info } => self.w[usize::from(info)].remove(&r),
            Member::Binder { score } => self.bind.remove(&(score, r)),
        };
        match want {
            Member::None => false,
            Member::Ro => self.ro.insert(r),
            Member::Writer { info } => self.w[usize::from(info)].insert(r),
            Member::Binder { score } => self.bind.insert((score, r)),
        };
        self.member[r as usize] = want;
    }
}

/// Per (key, value) read of a key that may hold an unknown value: the smallest id (invocation
/// order) of an `ok` transaction reading it or a value that `ok` read-then-write transactions
/// install after it, directly or not. Binding an unknown value to the value of the chain that
/// began first is tried first: the history most likely ran that way.
fn chain_scores(nodes: &[Node], key_readers: &[Vec<(u32, u64)>]) -> HashMap<(usize, u64), u64> {
    let mut first: HashMap<(usize, u64), u64> = HashMap::new();
    let mut succ: HashMap<(usize, u64), Vec<u64>> = HashMap::new();
    for (k, rs) in key_readers.iter().enumerate() {
        for &(r, v) in rs {
            let n = &nodes[r as usize];
            if !n.ok {
                continue;
            }
            let e = first.entry((k, v)).or_insert(u64::MAX);
            *e = (*e).min(u64::from(r));
            for (wk, w) in &n.writes {
                if let (true, W::Set(v2)) = (*wk == k, w) {
                    succ.entry((k, v)).or_default().push(*v2);
                }
            }
        }
    }
    // Depth-first, iteratively (chains are long); a value met again on the current path (a
    // cycle, through repeated values) counts as unscored.
    let mut score: HashMap<(usize, u64), u64> = HashMap::new();
    let mut on_path: HashSet<(usize, u64)> = HashSet::new();
    let mut starts: Vec<(usize, u64)> = first.keys().copied().collect();
    starts.sort_unstable();
    for start in starts {
        let mut stack: Vec<((usize, u64), usize)> = vec![(start, 0)];
        while let Some(&mut (x, ref mut i)) = stack.last_mut() {
            if *i == 0 {
                if score.contains_key(&x) {
                    stack.pop();
                    continue;
                }
                on_path.insert(x);
            }
            let next = succ.get(&x).and_then(|s| s.get(*i)).map(|&v2| (x.0, v2));
            *i += 1;
            match next {
                Some(y) if !score.contains_key(&y) && !on_path.contains(&y) => stack.push((y, 0)),
                Some(_) => {}
                None => {
                    let own = first.get(&x).copied().unwrap_or(u64::MAX);
                    let best = succ.get(&x).map_or(u64::MAX, |s| {
                        s.iter().map(|v2| score.get(&(x.0, *v2)).copied().unwrap_or(u64::MAX)).min().unwrap_or(u64::MAX)
                    });
                    score.insert(x, own.min(best));
                    on_path.remove(&x);
                    stack.pop();
                }
            }
        }
    }
    score
}

struct State {
    nodes: Vec<Node>,
    strict: bool,
    tok: Vec<u64>,
    state_hash: u64,
    applied_hash: u64,
    readers: HashMap<(usize, u64), Vec<u32>>,
    /// Per key that some transaction writes with an unknown value: the unplaced `ok`
    /// transactions that read it as a value (not `nil`), and those of them that read a value no
    /// known write writes.
    pending: Vec<u32>,
    /// What is left to place, per register (lists are not counted): `ok` readers and known
    /// writers of each (key, token), writers of unknown values of each key; the values of each
    /// key that are orphaned ([`State::orphan`]); the keys that are overdrawn
    /// ([`State::recheck`]), and how many: while any is, the branch is dead.
    readers_left: HashMap<(usize, u64), u32>,
    writers_left: HashMap<(usize, u64), u32>,
    unknown_left: Vec<u32>,
    orphans: Vec<u32>,
    /// Per key: the deadlines ([`State::deadline`]) of its orphaned values (with how many
    /// share each), and its unplaced writers of unknown values.
    orphan_deadlines: Vec<BTreeMap<u32, u32>>,
    unknown_ids: Vec<BTreeSet<u32>>,
    /// Per register (key, token) read by an `ok` transaction, for strict serializability: the
    /// transactions invoked before the last of its readers completed are those below this.
    deadline: HashMap<(usize, u64), u32>,
    overdrawn: Vec<bool>,
    dead_keys: u32,
    list_key: Vec<bool>,
    /// Per key that some transaction writes with an unknown value: all its readers and the token
    /// each reads (empty for other keys). A change to or from [`UNKNOWN`] visits them all.
    key_readers: Vec<Vec<(u32, u64)>>,
    /// Per unplaced transaction: its reads the model does not satisfy, and those that would bind
    /// an unknown value.
    mismatch: Vec<u32>,
    binds: Vec<u32>,
    applied: Vec<bool>,
    sets: Sets,
    ends: BTreeSet<(usize, u32)>,
    /// Per key: the token it held before it last became [`UNKNOWN`].
    before_unknown: Vec<u64>,
    /// (key, token, `before_unknown`) to restore, newest last.
    undo: Vec<(usize, u64, u64)>,
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

    /// Puts `r` in the candidate set its state calls for (none if placed or not enabled).
    fn refresh(&mut self, r: u32) {
        let ri = r as usize;
        let n = &self.nodes[ri];
        let want = if self.applied[ri] || self.mismatch[ri] > 0 {
            Member::None
        } else if self.binds[ri] > 0 && n.ok {
            let score = n
                .reads
                .iter()
                .zip(&n.read_meta)
                .filter(|(&(k, v), _)| read_matches(self.tok[k], v).1)
                .map(|(_, &(_, chain))| chain)
                .min()
                .unwrap_or(u64::MAX);
            Member::Binder { score }
        } else if n.writes.is_empty() {
            Member::Ro
        } else {
            Member::Writer { info: !n.ok }
        };
        self.sets.set(r, want);
    }

    fn set_token(&mut self, k: usize, new: u64) {
        let old = self.tok[k];
        if old == new {
            return;
        }
        if self.list_key[k] {
            self.tok[k] = new;
        } else {
            let before = (self.orphan(k, old), self.orphan(k, new));
            self.tok[k] = new;
            self.recount(k, old, before.0, self.orphan(k, old));
            self.recount(k, new, before.1, self.orphan(k, new));
            self.recheck(k);
        }
        self.state_hash ^= Self::contrib(k, old) ^ Self::contrib(k, new);
        if old != UNKNOWN && new != UNKNOWN {
            for (t, up) in [(old, true), (new, false)] {
                let Some(rs) = self.readers.get_mut(&(k, t)).map(std::mem::take) else { continue };
                for &r in &rs {
                    let ri = r as usize;
                    if self.applied[ri] {
                        continue;
                    }
                    if up {
                        self.mismatch[ri] += 1;
                    } else {
                        self.mismatch[ri] -= 1;
                    }
                    self.refresh(r);
                }
                self.readers.insert((k, t), rs);
            }
        } else {
            let rs = std::mem::take(&mut self.key_readers[k]);
            for &(r, t) in &rs {
                let ri = r as usize;
                if self.applied[ri] {
                    continue;
                }
                let (m0, b0) = read_matches(old, t);
                let (m1, b1) = read_matches(new, t);
                self.mismatch[ri] = self.mismatch[ri] + u32::from(m0) - u32::from(m1);
                self.binds[ri] = self.binds[ri] + u32::from(b1) - u32::from(b0);
                if (m0, b0) != (m1, b1) {
                    self.refresh(r);
                }
            }
            self.key_readers[k] = rs;
        }
    }

    /// Whether value (token) `t` of register `k` is orphaned: an unplaced `ok` transaction
    /// reads it, the register does not hold it, and no unplaced transaction writes it as a known
    /// value — only an unknown write, bound by that reader, can still provide it.
    fn orphan(&self, k: usize, t: u64) -> bool {
        t != 0
            && self.tok[k] != t
            && self.readers_left.get(&(k, t)).is_some_and(|&c| c > 0)
            && self.writers_left.get(&(k, t)).is_none_or(|&c| c == 0)
    }

    fn recount(&mut self, k: usize, t: u64, was: bool, is: bool) {
        if is == was {
            return;
        }
        let d = self.deadline.get(&(k, t)).copied().unwrap_or(u32::MAX);
        let ds = &mut self.orphan_deadlines[k];
        if is {
            self.orphans[k] += 1;
            *ds.entry(d).or_insert(0) += 1;
        } else {
            self.orphans[k] -= 1;
            match ds.get_mut(&d) {
                Some(c) if *c > 1 => *c -= 1,
                _ => {
                    ds.remove(&d);
                }
            }
        }
    }

    /// Whether register `k` is overdrawn, so that some `ok` transaction can never be placed:
    /// * an unplaced `ok` transaction reads it as `nil` but it was written (no write writes
    ///   `nil`);
    /// * or more of its values are orphaned than unknown values can still be bound (each
    ///   unknown write is bound once, by its first reader; so is the current value if unknown);
    /// * or (strict serializability) the key's value is known and an orphaned value's readers
    ///   all completed before any unplaced unknown write to the key was invoked: that write
    ///   must follow them in real time, so it cannot be what they read.
    fn recheck(&mut self, k: usize) {
        let supply = self.unknown_left[k] + u32::from(self.tok[k] == UNKNOWN);
        let nil_read = self.tok[k] != 0 && self.readers_left.get(&(k, 0)).is_some_and(|&c| c > 0);
        let late = self.tok[k] != UNKNOWN
            && self.orphan_deadlines[k]
                .first_key_value()
                .is_some_and(|(&d, _)| self.unknown_ids[k].first().is_none_or(|&u| u >= d));
        let over = nil_read || self.orphans[k] > supply || late;
        if over != self.overdrawn[k] {
            self.overdrawn[k] = over;
            if over {
                self.dead_keys += 1;
            } else {
                self.dead_keys -= 1;
            }
        }
    }

    /// Takes transaction `t`'s reads (if `ok`) and writes out of (or back into) what is left to
    /// place.
    fn count_left(&mut self, t: usize, add: bool) {
        let step = |c: &mut u32| {
            if add {
                *c += 1;
            } else {
                *c -= 1;
            }
        };
        if self.nodes[t].ok {
            for r in 0..self.nodes[t].reads.len() {
                let (k, v) = self.nodes[t].reads[r];
                if self.list_key[k] {
                    continue;
                }
                let was = self.orphan(k, v);
                step(self.readers_left.entry((k, v)).or_insert(0));
                let is = self.orphan(k, v);
                self.recount(k, v, was, is);
                self.recheck(k);
            }
        }
        for w in 0..self.nodes[t].writes.len() {
            let k = self.nodes[t].writes[w].0;
            if self.list_key[k] {
                continue;
            }
            match self.nodes[t].writes[w].1 {
                W::Set(v) => {
                    let was = self.orphan(k, v);
                    step(self.writers_left.entry((k, v)).or_insert(0));
                    let is = self.orphan(k, v);
                    self.recount(k, v, was, is);
                }
                W::Unknown => {
                    step(&mut self.unknown_left[k]);
                    if add {
                        self.unknown_ids[k].insert(t as u32);
                    } else {
                        self.unknown_ids[k].remove(&(t as u32));
                    }
                }
                W::Append(_) => continue,
            }
            self.recheck(k);
        }
    }

    /// Counts `ok` transaction `t`'s reads (not of `nil`) of keys that may hold unknown values in
    /// (or out of) [`State::pending`].
    fn count_pending(&mut self, t: usize, add: bool) {
        for &(k, v) in &self.nodes[t].reads {
            if v == 0 || self.key_readers[k].is_empty() {
                continue;
            }
            if add {
                self.pending[k] += 1;
            } else {
                self.pending[k] -= 1;
            }
        }
    }

    fn apply(&mut self, t: u32) {
        let ti = t as usize;
        self.applied[ti] = true;
        self.refresh(t);
        self.count_left(ti, false);
        if let Some(e) = self.nodes[ti].ok_end {
            self.ends.remove(&(e, t));
        }
        if self.nodes[ti].ok {
            self.remaining_ok -= 1;
            self.count_pending(ti, false);
        }
        // Its reads of unknown values bind them (it is enabled: every other read matches).
        if self.binds[ti] > 0 {
            for r in 0..self.nodes[ti].reads.len() {
                let (k, want) = self.nodes[ti].reads[r];
                if read_matches(self.tok[k], want).1 {
                    self.undo.push((k, UNKNOWN, self.before_unknown[k]));
                    self.set_token(k, want);
                }
            }
        }
        for w in 0..self.nodes[ti].writes.len() {
            let k = self.nodes[ti].writes[w].0;
            let old = self.tok[k];
            let new = match &self.nodes[ti].writes[w].1 {
                W::Set(x) => *x,
                W::Unknown => UNKNOWN,
                W::Append(vs) => vs.iter().fold(old, |a, v| list_push(a, *v)),
            };
            self.undo.push((k, old, self.before_unknown[k]));
            if new == UNKNOWN && old != UNKNOWN {
                self.before_unknown[k] = old;
            }
            self.set_token(k, new);
        }
        self.applied_hash ^= mix(t as u64 ^ 0x00DD_BA11);
        self.order.push(t);
    }

    fn unapply(&mut self, t: u32, mark: usize) {
        let ti = t as usize;
        while self.undo.len() > mark {
            let (k, old, before) = self.undo.pop().expect("undo entry");
            self.set_token(k, old);
            self.before_unknown[k] = before;
        }
        self.applied[ti] = false;
        // Placed transactions' counts are not kept up to date: recount.
        let (mut mismatch, mut binds) = (0, 0);
        for &(k, v) in &self.nodes[ti].reads {
            let (m, b) = read_matches(self.tok[k], v);
            mismatch += u32::from(!m);
            binds += u32::from(b);
        }
        (self.mismatch[ti], self.binds[ti]) = (mismatch, binds);
        self.count_left(ti, true);
        if let Some(e) = self.nodes[ti].ok_end {
            self.ends.insert((e, t));
        }
        if self.nodes[ti].ok {
            self.remaining_ok += 1;
            self.count_pending(ti, true);
        }
        self.refresh(t);
        self.applied_hash ^= mix(t as u64 ^ 0x00DD_BA11);
        self.order.pop();
    }

    /// Whether `ok` transaction `t` would bind some unknown value to a value that is surprising
    /// there (a heuristic): not the one the key held before the unknown write (as if that write
    /// wrote it again), and either a value some known write writes (which then has to come
    /// again) or one that leaves an unplaced reader of the value held before stranded.
    fn surprising(&self, t: u32) -> bool {
        let n = &self.nodes[t as usize];
        n.reads.iter().zip(&n.read_meta).any(|(&(k, v), &(written, _))| {
            let before = self.before_unknown[k];
            read_matches(self.tok[k], v).1
                && v != before
                && (written || self.readers_left.get(&(k, before)).is_some_and(|&c| c > 0))
        })
    }

    /// Would placing `t` now leave an unplaced `ok` reader of a key's current value unsatisfiable?
    fn strands(&self, t: u32) -> bool {
        self.nodes[t as usize].writes.iter().any(|(k, _)| self.waits_for_current(*k, t))
    }

    /// Whether an unplaced `ok` transaction other than `t` reads key `k`'s current value.
    fn waits_for_current(&self, k: usize, t: u32) -> bool {
        self.readers
            .get(&(k, self.tok[k]))
            .is_some_and(|rs| rs.iter().any(|&r| r != t && !self.applied[r as usize] && self.nodes[r as usize].ok))
    }

    /// Unplaced `ok` transactions that read key `k` as its current value (not `nil`).
    fn current_readers(&self, k: usize) -> u32 {
        let cur = self.tok[k];
        if cur == 0 {
            return 0;
        }
        self.readers.get(&(k, cur)).map_or(0, |rs| {
            rs.iter().filter(|&&r| !self.applied[r as usize] && self.nodes[r as usize].ok).count() as u32
        })
    }

    /// Whether an `info` transaction that only writes values unknown may go next: only if some
    /// unplaced `ok` transaction reads one of its keys as a value (not `nil`) other than the
    /// key's current, known one — a value it may make readable. Exact: in any serial order such
    /// a transaction can be moved later, up to just before the first transaction that reads one
    /// of its keys while its value is current (later readers see an unknown value, bound to what
    /// they read; it has no completion, so real time does not hold it back), or dropped if there
    /// is none; and if that reader read every such key as it was before, moved past it too. So
    /// some serial order, if any, places it only right before (with others like it) an `ok`
    /// reader of one of its keys that reads another value than the current known one.
    fn demanded(&self, t: u32) -> bool {
        let n = &self.nodes[t as usize];
        !n.only_unknown
            || n.writes.iter().any(|(k, _)| self.tok[*k] != UNKNOWN && self.pending[*k] > self.current_readers(*k))
    }

    /// The order in which `info` candidates are tried (a heuristic: any order is exact): those
    /// that strand no reader first. One that only writes unknown values strands none (a reader
    /// of the value it overwrites may read it again; a `nil` reader makes the branch dead).
    fn info_rank(&self, t: u32) -> u8 {
        u8::from(!self.nodes[t as usize].only_unknown && self.strands(t))
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
        match self.sets.ro.range(..cut).next() {
            Some(&t) => Cursor::Single(Some(t)),
            None => Cursor::Writers { group: 0, from: (0, 0) },
        }
    }

    /// The next candidate of a frame whose state is the current one (the state is restored
    /// exactly before a frame is resumed, so the enumeration is the same ordered list each time).
    fn next_candidate(&self, cursor: &mut Cursor) -> Option<u32> {
        match cursor {
            Cursor::Single(t) => t.take(),
            Cursor::Writers { group, from } => {
                let cut = self.cut();
                while *group < GROUPS {
                    let g = *group;
                    let found = match g {
                        0 | 5 => {
                            let surprising = g == 5;
                            self.sets
                                .bind
                                .range(*from..)
                                .find(|&&(_, t)| t < cut && self.surprising(t) == surprising)
                                .copied()
                        }
                        1 | 2 => {
                            let strands = g == 2;
                            let set = &self.sets.w[0];
                            set.range(from.1..cut).find(|&&t| self.strands(t) == strands).map(|&t| (0, t))
                        }
                        _ => self.sets.w[1]
                            .range(from.1..cut)
                            .find(|&&t| self.info_rank(t) == g - 3 && self.demanded(t))
                            .map(|&t| (0, t)),
                    };
                    if let Some((score, t)) = found {
                        *from = (score, t + 1);
                        return Some(t);
                    }
                    *group += 1;
                    *from = (0, 0);
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
    let mut list_keys = Vec::new();
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
        for (k, _) in t.reads.iter().filter(|(_, e)| matches!(e, Ext::List(_))) {
            list_keys.push(kid(*k));
        }
        for (k, _) in t.writes.iter().filter(|(_, e)| matches!(e, Effect::Append(_))) {
            list_keys.push(kid(*k));
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
                        Effect::RegUnknown => W::Unknown,
                        Effect::Append(vs) => W::Append(vs.clone()),
                    },
                )
            })
            .collect();
        let only_unknown = !ok && t.reads.is_empty() && t.writes.iter().all(|(_, e)| *e == Effect::RegUnknown);
        let read_meta = vec![];
        nodes.push(Node { reads, writes, ok, inv_pos: t.inv_pos, ok_end: t.ok_end, txn: i, only_unknown, read_meta });
    }
    let n = nodes.len();
    let mut st = State {
        strict,
        tok: vec![0; key_ids.len()],
        state_hash: 0,
        applied_hash: 0,
        readers: HashMap::new(),
        key_readers: vec![Vec::new(); key_ids.len()],
        mismatch: vec![0; n],
        binds: vec![0; n],
        applied: vec![false; n],
        sets: Sets {
            ro: BTreeSet::new(),
            w: [BTreeSet::new(), BTreeSet::new()],
            bind: BTreeSet::new(),
            member: vec![Member::None; n],
        },
        pending: vec![0; key_ids.len()],
        readers_left: HashMap::new(),
        writers_left: HashMap::new(),
        unknown_left: vec![0; key_ids.len()],
        orphans: vec![0; key_ids.len()],
        orphan_deadlines: vec![BTreeMap::new(); key_ids.len()],
        unknown_ids: vec![BTreeSet::new(); key_ids.len()],
        deadline: HashMap::new(),
        overdrawn: vec![false; key_ids.len()],
        dead_keys: 0,
        list_key: vec![false; key_ids.len()],
        ends: nodes.iter().enumerate().filter_map(|(i, x)| x.ok_end.filter(|_| x.ok).map(|e| (e, i as u32))).collect(),
        before_unknown: vec![0; key_ids.len()],
        undo: Vec::new(),
        order: Vec::new(),
        remaining_ok: nodes.iter().filter(|x| x.ok).count(),
        nodes,
    };
    let mut may_be_unknown = vec![false; st.tok.len()];
    // (key, token) pairs some transaction writes as a known value.
    let mut attributed: HashSet<(usize, u64)> = HashSet::new();
    for x in &st.nodes {
        for (k, w) in &x.writes {
            match w {
                W::Unknown => may_be_unknown[*k] = true,
                W::Set(v) => {
                    attributed.insert((*k, *v));
                }
                W::Append(_) => {}
            }
        }
    }
    for i in 0..n {
        let reads = std::mem::take(&mut st.nodes[i].reads);
        for (k, t) in &reads {
            st.readers.entry((*k, *t)).or_default().push(i as u32);
            if may_be_unknown[*k] {
                st.key_readers[*k].push((i as u32, *t));
            }
            if *t != 0 {
                st.mismatch[i] += 1;
            }
        }
        st.nodes[i].reads = reads;
        st.refresh(i as u32);
    }
    let chain = chain_scores(&st.nodes, &st.key_readers);
    for x in &mut st.nodes {
        x.read_meta =
            x.reads.iter().map(|kv| (attributed.contains(kv), chain.get(kv).copied().unwrap_or(u64::MAX))).collect();
    }
    for k in list_keys {
        st.list_key[k] = true;
    }
    if strict {
        let mut last_end: HashMap<(usize, u64), usize> = HashMap::new();
        for x in st.nodes.iter().filter(|x| x.ok) {
            for &kv in &x.reads {
                let e = last_end.entry(kv).or_insert(0);
                *e = (*e).max(x.ok_end.unwrap_or(usize::MAX));
            }
        }
        let nodes = &st.nodes;
        st.deadline =
            last_end.into_iter().map(|(kv, e)| (kv, nodes.partition_point(|x| x.inv_pos < e) as u32)).collect();
    }
    for i in 0..n {
        if st.nodes[i].ok {
            st.count_pending(i, true);
        }
        st.count_left(i, true);
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
        // A placement that left an `ok` transaction unplaceable ends its branch.
        if st.dead_keys == 0 && memo.insert((st.applied_hash, st.state_hash)) {
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
