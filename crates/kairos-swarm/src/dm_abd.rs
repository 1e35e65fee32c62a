//! DM-ABD: ABD over passive memory with out-of-place updates — the classic two-round-trip
//! baseline, on the same layout and verbs as SWARM-KV.
//!
//! * update: read every writer's word on a majority (round 1); fill a buffer and CAS this
//!   writer's word to `(max ts + 1)` VERIFIED on a majority (round 2) — or above this writer's
//!   previous timestamp if that is higher, so that tuple identities never repeat.
//! * get: read the words and the in-place copy (round 1); write the maximum back into its
//!   writer's word on a majority — with its value where a node lacks it — and fetch the value if
//!   the in-place copy did not hold it (round 2).
//! * a get or update that reads a deletion reports it once it is on a majority, writing it
//!   back first where it is missing ([`crate::deletion`]).

use crate::client::{KvError, KvOp, Outbox};
use crate::engine::{words_by_node, Client, Op, Shape, Stage};
use crate::meta;
use crate::verbs::{Verb, VerbOutcome};
use kairos_core::LocalTime;

pub(crate) fn begin(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let slot = op.slot.unwrap_or(0);
    let chains = c.meta_read_chains(slot, matches!(op.op, KvOp::Get { .. }));
    let need = c.majority();
    c.send_round_majority_first(op, Stage::AbdRead, chains, need, now, out);
}

fn copy_value(c: &Client, op: &Op, target: u64) -> Option<Vec<u8>> {
    let max = c.cfg.layout.config.value_size as usize;
    op.replies
        .iter()
        .find_map(|(node, outs)| {
            let shape = op.shapes.get(node)?;
            [shape.inplace, shape.copy].into_iter().flatten().find_map(|i| match outs.get(i) {
                Some(VerbOutcome::Read(b)) => {
                    meta::decode_copy(b, max).filter(|(t, _)| meta::id(*t) == meta::id(target))
                }
                _ => None,
            })
        })
        .map(|(_, v)| v)
}

fn after_read(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let words = words_by_node(op);
    let x = words.values().flatten().copied().max().unwrap_or(0);
    let w = c.cfg.writer;
    let value = match &op.op {
        KvOp::Get { .. } => {
            if x == 0 {
                return c.finish(op, Ok(None), now, out);
            }
            if meta::is_deleted(x) {
                // Reported only once on a majority (see `crate::deletion`).
                return crate::deletion::confirm(c, op, x, words, now, out);
            }
            // Round 2: write back, and fetch the value if the in-place copy did not hold it.
            op.target = x;
            op.value = copy_value(c, op, x);
            op.observed = words;
            return back_round(c, op, now, out);
        }
        KvOp::Delete { .. } => None,
        KvOp::Update { value, .. } | KvOp::Insert { value, .. } => Some(value.clone()),
    };
    if meta::is_deleted(x) {
        // Nothing of this write is anywhere yet; the deletion it read is reported once on a
        // majority (see `crate::deletion`).
        return crate::deletion::confirm(c, op, x, words, now, out);
    }
    let tuple = match &value {
        None => meta::pack(meta::DELETED_TS, 0, w, true),
        Some(_) => {
            let Some(buf) = op.buf.or_else(|| c.pool.allocate(now)) else {
                return c.finish(op, Err(KvError::OutOfBuffers), now, out);
            };
            op.buf = Some(buf);
            // Above everything read, and above this writer's own earlier tuples: a tuple's
            // identity (timestamp, buffer, writer) must never repeat, or a recycled buffer's
            // stale copy would pass for the new tuple's.
            let ts = (meta::ts(x) + 1).max(c.last_ts + 1);
            c.last_ts = ts;
            meta::pack(ts, buf, w, true)
        }
    };
    op.tuple = tuple;
    op.value = value;
    write_round(c, op, now, out);
}

/// Writes `op.target` back into its writer's word on every replica that had an older one (with
/// its value, when known), and reads the value where it is missing. A replica the first round
/// did not hear from gets the same write-back, from an empty word: its CAS's answer says what
/// it holds if that guess was wrong (a review's schedule counted such a node's empty chain
/// towards the majority: the read returned a value that was on one node, which then crashed).
fn back_round(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let (x, slot) = (op.target, op.slot.unwrap_or(0));
    let l = c.cfg.layout.clone();
    let (xw, xb) = (meta::writer(x), meta::buf(x));
    let mut chains = Vec::new();
    for node in c.alive_replicas(slot) {
        let mut verbs = Vec::new();
        let mut shape = Shape::default();
        let o = op.observed.get(&node).and_then(|ws| ws.get(xw as usize)).copied().unwrap_or(0);
        let addr = l.meta_word(slot, xw);
        if meta::id(o) >= meta::id(x) {
            shape.cas_other = Some((verbs.len(), o));
            verbs.push(Verb::Cas { addr, expected: o, new: o });
        } else if let Some(v) = &op.value {
            verbs.push(Verb::Write { addr: l.buffer_copy(xw, xb), data: meta::encode_copy(x, v) });
            shape.cas_other = Some((verbs.len(), o));
            verbs.push(Verb::Cas { addr, expected: o, new: x });
        }
        if op.value.is_none() {
            shape.copy = Some(verbs.len());
            verbs.push(Verb::Read { addr: l.buffer_copy(xw, xb), len: l.copy_bytes_max() });
        }
        chains.push((node, verbs, shape));
    }
    let need = c.majority();
    // Majority-first like DM-ABD's other rounds (see `crate::hedge`): the write-back is
    // complete once a majority holds the tuple.
    c.send_round_majority_first(op, Stage::AbdBack, chains, need, now, out);
}

fn write_round(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let slot = op.slot.unwrap_or(0);
    let l = c.cfg.layout.clone();
    let w = c.cfg.writer;
    let mut chains = Vec::new();
    for node in c.alive_replicas(slot) {
        let mut verbs = Vec::new();
        if let (Some(buf), Some(v)) = (op.buf, &op.value) {
            let mut data = meta::lock(op.tuple, meta::LOCK_FREE).to_le_bytes().to_vec();
            data.extend_from_slice(&meta::encode_copy(op.tuple, v));
            verbs.push(Verb::Write { addr: l.buffer(w, buf), data });
        }
        let expected = c.my_word(slot, node);
        let new = if meta::id(expected) >= meta::id(op.tuple) { expected } else { op.tuple };
        let cas = verbs.len();
        verbs.push(Verb::Cas { addr: l.meta_word(slot, w), expected, new });
        chains.push((node, verbs, Shape { cas_my: Some((cas, expected)), ..Shape::default() }));
    }
    let need = c.majority();
    c.send_round_majority_first(op, Stage::AbdWrite, chains, need, now, out);
}

fn after_write(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let t = meta::id(op.tuple);
    let written = op
        .replies
        .iter()
        .filter(|(node, outs)| {
            let Some((i, expected)) = op.shapes.get(node).and_then(|s| s.cas_my) else { return false };
            matches!(outs.get(i), Some(VerbOutcome::Cas { previous }) if *previous == expected || meta::id(*previous) >= t)
        })
        .count();
    if written < c.majority() {
        c.bump("write_retries");
        return write_round(c, op, now, out);
    }
    let slot = op.slot.unwrap_or(0);
    match op.buf.take() {
        Some(buf) => {
            c.pool.commit(slot, buf, now);
            if let (Some(primary), Some(v)) = (c.primary(slot), &op.value) {
                let data = meta::encode_copy(op.tuple, v);
                let addr = c.cfg.layout.inplace(primary, slot);
                c.send_background(primary, vec![Verb::Write { addr, data }], None, now, out);
            }
        }
        None => c.pool.delete(slot, now),
    }
    c.finish(op, Ok(None), now, out)
}

fn after_back(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let x = op.target;
    if meta::writer(x) != c.cfg.writer {
        c.pool.supersede(op.slot.unwrap_or(0), now);
    }
    let xw = meta::writer(x) as usize;
    let writers = c.cfg.layout.config.writers as usize;
    // What each replica's write-back CAS found: it holds x (or newer) now, or the word to
    // write back from next time.
    for (node, outs) in &op.replies {
        let Some((i, expected)) = op.shapes.get(node).and_then(|s| s.cas_other) else { continue };
        let Some(VerbOutcome::Cas { previous }) = outs.get(i) else { continue };
        let now_holds = if *previous == expected && meta::id(expected) < meta::id(x) { x } else { *previous };
        let words = op.observed.entry(*node).or_insert_with(|| vec![0; writers.max(xw + 1)]);
        if let Some(word) = words.get_mut(xw) {
            *word = now_holds;
        }
    }
    let holders = op.observed.values().filter(|ws| ws.get(xw).is_some_and(|o| meta::id(*o) >= meta::id(x))).count();
    if op.value.is_none() {
        match copy_value(c, op, x) {
            Some(v) => op.value = Some(v),
            None => {
                // The buffer was torn or recycled under us: start over.
                c.bump("fetch_misses");
                return begin(c, op, now, out);
            }
        }
    }
    if holders < c.majority() {
        // Not on a majority yet (the value was fetched in this round, or a CAS met another
        // word than the one read): again, from what the replicas said.
        c.bump("write_back_retries");
        return back_round(c, op, now, out);
    }
    let v = op.value.clone().expect("known above");
    c.finish(op, Ok(Some(v)), now, out)
}

pub(crate) fn advance(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    match op.stage {
        Stage::AbdRead => after_read(c, op, now, out),
        Stage::AbdWrite => after_write(c, op, now, out),
        Stage::AbdBack => after_back(c, op, now, out),
        _ => {}
    }
}
