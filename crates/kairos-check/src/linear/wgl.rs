//! Our linearizability checker: Wing & Gong's search with Lowe's memoization.
//!
//! The history is a doubly linked list of call and return entries in time order. We walk it
//! from the head: at a call, we try to linearize the operation now (apply it to the register);
//! if that is legal and the (linearized set, state) pair is new, we lift the call and its return
//! out of the list and restart from the head. Reaching a return whose call is still in the
//! list means the most recent choice was wrong: undo it and try the next call after it. The
//! linearized set is kept as two independent 64-bit Zobrist digests, the state as a 64-bit
//! digest of its values.

use std::collections::HashSet;

use super::{apply, KeyOp, State, Texts};

pub(crate) const NAME: &str = "kairos-wgl";

const NIL: usize = usize::MAX;

struct Entry {
    op: usize,
    call: bool,
    other: usize,
    prev: usize,
    next: usize,
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn state_digest(s: &State) -> u64 {
    s.iter().fold(mix(s.len() as u64), |h, v| mix(h.rotate_left(21) ^ *v))
}

/// `None` when `budget` steps did not settle it.
pub(crate) fn linearizable(ops: &[KeyOp], texts: &Texts, budget: u64) -> Option<bool> {
    if ops.is_empty() {
        return Some(true);
    }
    // Events: (time, is_return, op). Calls before returns at equal positions cannot happen
    // (positions are distinct); infinite returns go last.
    let mut ev: Vec<(usize, bool, usize)> = Vec::with_capacity(2 * ops.len());
    for (i, o) in ops.iter().enumerate() {
        ev.push((o.start, false, i));
        ev.push((o.end.unwrap_or(usize::MAX), true, i));
    }
    ev.sort_unstable();
    // Entry 0 is the head sentinel.
    let mut es: Vec<Entry> = vec![Entry { op: NIL, call: false, other: NIL, prev: NIL, next: 1 }];
    let mut call_at = vec![0usize; ops.len()];
    for (j, &(_, ret, op)) in ev.iter().enumerate() {
        let idx = j + 1;
        es.push(Entry {
            op,
            call: !ret,
            other: NIL,
            prev: idx - 1,
            next: if j + 1 < ev.len() { idx + 1 } else { NIL },
        });
        if ret {
            es[idx].other = call_at[op];
            let c = call_at[op];
            es[c].other = idx;
        } else {
            call_at[op] = idx;
        }
    }
    let lift = |es: &mut Vec<Entry>, e: usize| {
        for x in [e, es[e].other] {
            let (p, n) = (es[x].prev, es[x].next);
            es[p].next = n;
            if n != NIL {
                es[n].prev = p;
            }
        }
    };
    let unlift = |es: &mut Vec<Entry>, e: usize| {
        for x in [es[e].other, e] {
            let (p, n) = (es[x].prev, es[x].next);
            es[p].next = x;
            if n != NIL {
                es[n].prev = x;
            }
        }
    };
    let mut state: State = Vec::new();
    let (mut h1, mut h2) = (0u64, 0u64);
    // (linearized set, state) pairs seen, as digests; the state by a hash of its fragments.
    let mut cache: HashSet<(u64, u64, u64)> = HashSet::new();
    let mut stack: Vec<(usize, State)> = Vec::new();
    let mut e = es[0].next;
    let mut steps = 0u64;
    while es[0].next != NIL {
        steps += 1;
        if steps > budget {
            return None;
        }
        if e == NIL {
            // Cannot happen: the list always ends with a return.
            return Some(false);
        }
        if es[e].call {
            let op = es[e].op;
            let (ok, next) = apply(&ops[op].op, &state, texts);
            let (a, b) = (h1 ^ mix(op as u64), h2 ^ mix(!(op as u64) ^ 0xC0FFEE));
            if ok && cache.insert((a, b, state_digest(&next))) {
                stack.push((e, std::mem::replace(&mut state, next)));
                h1 = a;
                h2 = b;
                lift(&mut es, e);
                e = es[0].next;
            } else {
                e = es[e].next;
            }
        } else {
            let Some((c, s)) = stack.pop() else { return Some(false) };
            state = s;
            let op = es[c].op;
            h1 ^= mix(op as u64);
            h2 ^= mix(!(op as u64) ^ 0xC0FFEE);
            unlift(&mut es, c);
            e = es[c].next;
        }
    }
    Some(true)
}
