//! SWARM-KV's operations: Safe-Guess replication with timestamp locks over In-n-Out max
//! registers (see the crate docs for the whole story).
//!
//! **Write** (update, insert of a known key, delete). One round trip to every alive replica
//! (the op waits for a majority): fill a buffer (lock word `T|FREE`, copy of the value), CAS this
//! writer's metadata word to the guessed tuple `T|GUESSED`, read every writer's word. If nothing
//! above `T` was read, the guess was fresh: done in 1 RTT; in the background the word is flipped
//! to `T|VERIFIED` and the in-place copy refreshed on the primary. Otherwise the clock resyncs
//! above what it saw, and: if `T` was the maximum on no replied node, no reader can ever choose it
//! and the writer rewrites under a fresh timestamp (same buffer); else it races readers for `T`'s
//! timestamp lock — winning on a majority means no reader returns `T` and it rewrites; losing
//! means a reader judged `T` fresh, and the write is complete. A rewrite's timestamp is above
//! everything read since the operation began, so it completes once it is on a majority (≤ 3
//! round trips without failures).
//!
//! **Read** (get). Iterations of one round trip each: read every writer's word on a majority
//! (and the in-place copy on the primary); with `X` the maximum:
//! a. `X` VERIFIED → return its value (in-place copy if it matches, else follow the pointer);
//! b. `X` GUESSED and seen in the previous iteration too → lock `X` (reader mode) on a majority,
//!    writing `X` back into its writer's word where it was missing; won → return it;
//! c. a different operation of `X`'s writer was seen before → that one completed; return it;
//! d. otherwise remember `X` and read again.
//!
//! Each iteration either returns or remembers a new tuple, so a read takes at most
//! `2 × writers + 1` iterations when the lock attempts are not disturbed (counted as
//! `read_iterations_max`; see the contention test).

use crate::client::{KvError, KvOp, Outbox};
use crate::engine::{Client, Op, Shape, Stage, UnsafeSwitch};
use crate::meta;
use crate::verbs::{MemNodeId, Verb, VerbOutcome};
use kairos_core::LocalTime;
use std::collections::BTreeMap;

pub(crate) fn begin(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    if let KvOp::Get { .. } = op.op {
        return read_round(c, op, now, out);
    }
    match prepare_write(c, op, now) {
        Ok(()) => write_round(c, op, now, out),
        Err(e) => c.finish(op, Err(e), now, out),
    }
}

/// Picks the write's buffer and guessed tuple (a deletion: the maximal tuple, no buffer).
pub(crate) fn prepare_write(c: &mut Client, op: &mut Op, now: LocalTime) -> Result<(), KvError> {
    if let KvOp::Delete { .. } = op.op {
        op.tuple = meta::pack(meta::DELETED_TS, 0, c.cfg.writer, true);
        return Ok(());
    }
    let buf = match op.buf {
        Some(b) => b,
        None => c.pool.allocate(now).ok_or(KvError::OutOfBuffers)?,
    };
    op.buf = Some(buf);
    op.tuple = meta::pack(c.guess_ts(now)?, buf, c.cfg.writer, false);
    Ok(())
}

fn value_of(op: &Op) -> &[u8] {
    match &op.op {
        KvOp::Update { value, .. } | KvOp::Insert { value, .. } => value,
        _ => &[],
    }
}

/// The write's verbs for one replica: fill the buffer, CAS this writer's word, read all words.
pub(crate) fn write_verbs(c: &Client, op: &Op, node: MemNodeId) -> (Vec<Verb>, Shape) {
    let slot = op.slot.unwrap_or(0);
    let l = &c.cfg.layout;
    let w = c.cfg.writer;
    let mut verbs = Vec::new();
    if let Some(buf) = op.buf {
        let mut data = meta::lock(op.tuple, meta::LOCK_FREE).to_le_bytes().to_vec();
        data.extend_from_slice(&meta::encode_copy(op.tuple, value_of(op)));
        verbs.push(Verb::Write { addr: l.buffer(w, buf), data });
    }
    let expected = c.my_word(slot, node);
    // CAS-emulated max: never lower the word (e.g. below this writer's own deletion).
    let new = if meta::id(expected) >= meta::id(op.tuple) { expected } else { op.tuple };
    let cas = verbs.len();
    verbs.push(Verb::Cas { addr: l.meta_word(slot, w), expected, new });
    let words = verbs.len();
    verbs.push(Verb::Read { addr: l.meta_words(slot), len: l.meta_words_bytes() });
    (verbs, Shape { cas_my: Some((cas, expected)), words: Some(words), ..Shape::default() })
}

fn write_round(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let slot = op.slot.unwrap_or(0);
    let chains = c
        .alive_replicas(slot)
        .into_iter()
        .map(|node| {
            let (verbs, shape) = write_verbs(c, op, node);
            (node, verbs, shape)
        })
        .collect();
    let need = c.majority();
    c.send_round(op, Stage::Write, chains, need, now, out);
}

/// A new key's directory entry and first value went out together: if another client's slot
/// for the same key is lower, write there instead; otherwise this is an ordinary write.
fn after_create(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let fp = crate::index::fingerprint(op.op.key());
    let mut lowest = op.slot;
    for (node, outs) in &op.replies {
        let Some(i) = op.shapes.get(node).and_then(|s| s.window) else { continue };
        if let Some(VerbOutcome::Read(bytes)) = outs.get(i) {
            if let Some(&s) = crate::index::slots_in_window(&c.cfg.layout, &meta::words(bytes), fp).first() {
                lowest = Some(lowest.map_or(s, |l| l.min(s)));
            }
        }
    }
    let key = op.op.key().to_vec();
    match lowest {
        Some(s) if Some(s) != op.slot => {
            c.bump("insert_redirects");
            op.slot = Some(s);
            c.index.insert(key, s);
            match prepare_write(c, op, now) {
                Ok(()) => write_round(c, op, now, out),
                Err(e) => c.finish(op, Err(e), now, out),
            }
        }
        _ => {
            if let Some(s) = op.slot {
                c.index.insert(key, s);
            }
            after_write(c, op, now, out)
        }
    }
}

/// Every replied node's metadata words, read by the verb at `shape.words`.
fn words_by_node(op: &Op) -> BTreeMap<MemNodeId, Vec<u64>> {
    let mut m = BTreeMap::new();
    for (node, outs) in &op.replies {
        let Some(i) = op.shapes.get(node).and_then(|s| s.words) else { continue };
        if let Some(VerbOutcome::Read(bytes)) = outs.get(i) {
            m.insert(*node, meta::words(bytes));
        }
    }
    m
}

fn cas_previous(op: &Op, node: MemNodeId, index: Option<usize>) -> Option<u64> {
    match op.replies.get(&node)?.get(index?)? {
        VerbOutcome::Cas { previous } => Some(*previous),
        _ => None,
    }
}

fn after_write(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let w = c.cfg.writer as usize;
    let t = meta::id(op.tuple);
    let words = words_by_node(op);
    let mut written = 0;
    let mut max_other = 0u64;
    let mut t_max_somewhere = false;
    let mut deleted = false;
    for (node, ws) in &words {
        let shape = op.shapes.get(node).cloned().unwrap_or_default();
        if let (Some(prev), Some((_, expected))) = (cas_previous(op, *node, shape.cas_my.map(|x| x.0)), shape.cas_my) {
            if prev == expected || meta::id(prev) >= t {
                written += 1;
            }
        }
        let mut node_max = 0u64;
        for (i, word) in ws.iter().enumerate() {
            if meta::is_deleted(*word) {
                deleted = true;
            }
            if i != w {
                node_max = node_max.max(meta::id(*word));
            }
        }
        max_other = max_other.max(node_max);
        if node_max < t {
            t_max_somewhere = true;
        }
    }
    if matches!(op.op, KvOp::Delete { .. }) {
        if written >= c.majority() {
            c.pool.supersede(op.slot.unwrap_or(0), now);
            return c.finish(op, Ok(None), now, out);
        }
        c.bump("write_retries");
        return write_round(c, op, now, out);
    }
    if deleted {
        return c.finish(op, Err(KvError::Deleted), now, out);
    }
    if written < c.majority() {
        c.bump("write_retries");
        return write_round(c, op, now, out);
    }
    if op.fresh || max_other < t || c.cfg.unsafe_switch == UnsafeSwitch::TrustGuess {
        if op.rtt == 1 {
            c.bump("write_fast_path");
        }
        return commit(c, op, now, out);
    }
    c.bump("stale_guesses");
    c.resync(meta::ts(max_other), now.saturating_since(op.started), now);
    if !t_max_somewhere {
        return rewrite(c, op, now, out);
    }
    // Race readers for T's timestamp lock.
    let slot = op.slot.unwrap_or(0);
    let l = &c.cfg.layout;
    let buf = op.buf.unwrap_or(0);
    let chains = c
        .alive_replicas(slot)
        .into_iter()
        .map(|node| {
            let verbs = vec![
                Verb::Cas {
                    addr: l.buffer_lock(c.cfg.writer, buf),
                    expected: meta::lock(op.tuple, meta::LOCK_FREE),
                    new: meta::lock(op.tuple, meta::LOCK_WRITER),
                },
                Verb::Read { addr: l.meta_words(slot), len: l.meta_words_bytes() },
            ];
            (node, verbs, Shape { words: Some(1), ..Shape::default() })
        })
        .collect();
    let need = c.majority();
    c.send_round(op, Stage::WriterLock, chains, need, now, out);
}

fn after_writer_lock(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let won = op
        .replies
        .keys()
        .filter(|n| {
            let prev = cas_previous(op, **n, Some(0));
            prev == Some(meta::lock(op.tuple, meta::LOCK_FREE)) || prev == Some(meta::lock(op.tuple, meta::LOCK_WRITER))
        })
        .count();
    let max_seen = words_by_node(op).values().flatten().map(|w| meta::ts(*w)).filter(|t| *t < meta::DELETED_TS).max();
    if let Some(ts) = max_seen {
        c.resync(ts, now.saturating_since(op.started), now);
    }
    if won >= c.majority() {
        c.bump("writer_lock_won");
        rewrite(c, op, now, out)
    } else {
        // A reader may have judged T fresh: the write is complete at T.
        c.bump("writer_lock_lost");
        commit(c, op, now, out)
    }
}

/// Writes again above every timestamp read since the operation began (after `resync`): like an
/// ABD write, this one is complete once it is on a majority, whatever it reads.
fn rewrite(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    c.bump("rewrites");
    op.fresh = true;
    match c.guess_ts(now) {
        Ok(ts) => op.tuple = meta::pack(ts, op.buf.unwrap_or(0), c.cfg.writer, false),
        Err(e) => return c.finish(op, Err(e), now, out),
    }
    write_round(c, op, now, out)
}

/// The write is linearized: complete it, then verify and refresh the in-place copy in the background.
fn commit(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let slot = op.slot.unwrap_or(0);
    let buf = op.buf.take().unwrap_or(0);
    c.pool.commit(slot, buf, now);
    let verified = op.tuple | meta::VERIFIED;
    let copy = meta::encode_copy(verified, value_of(op));
    let primary = c.primary(slot);
    // FIFO per (client, node): this chain runs after the write's own chain on every node, so
    // the word it expects is the guessed tuple even where the write's reply is not in yet.
    let expected = op.tuple & !meta::VERIFIED;
    for node in c.alive_replicas(slot) {
        let l = &c.cfg.layout;
        let mut verbs = vec![Verb::Cas { addr: l.meta_word(slot, c.cfg.writer), expected, new: verified }];
        if Some(node) == primary {
            verbs.push(Verb::Write { addr: l.inplace(slot), data: copy.clone() });
        }
        c.send_background(node, verbs, Some((0, slot, expected, verified)), now, out);
    }
    c.finish(op, Ok(None), now, out);
}

fn read_round(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let slot = op.slot.unwrap_or(0);
    let chains = c.meta_read_chains(slot, true);
    let need = c.majority();
    c.send_round(op, Stage::Read, chains, need, now, out);
}

/// The value of `target` from any replied copy (in-place or buffer). A copy whose header names
/// `target` but whose hash fails was torn by a concurrent write (counted as `torn_copies`).
fn find_value(c: &mut Client, op: &Op, target: u64) -> Option<Vec<u8>> {
    let max = c.cfg.layout.config.value_size as usize;
    let mut torn = 0;
    let mut found = None;
    'nodes: for (node, outs) in &op.replies {
        let shape = op.shapes.get(node).cloned().unwrap_or_default();
        for i in [shape.inplace, shape.copy].into_iter().flatten() {
            if let Some(VerbOutcome::Read(bytes)) = outs.get(i) {
                match meta::decode_copy(bytes, max) {
                    Some((t, v)) if meta::id(t) == meta::id(target) => {
                        found = Some(v);
                        break 'nodes;
                    }
                    Some(_) => {}
                    None => {
                        if meta::words(bytes).first().is_some_and(|w| meta::id(*w) == meta::id(target)) {
                            torn += 1;
                        }
                    }
                }
            }
        }
    }
    for _ in 0..torn {
        c.bump("torn_copies");
    }
    found
}

fn after_read(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    op.iterations += 1;
    c.note_max("read_iterations_max", u64::from(op.iterations));
    let words = words_by_node(op);
    let x = words.values().flatten().copied().max().unwrap_or(0);
    op.observed = words;
    if x == 0 {
        return c.finish(op, Ok(None), now, out);
    }
    if meta::is_deleted(x) {
        return c.finish(op, Err(KvError::Deleted), now, out);
    }
    let xw = meta::writer(x);
    if meta::is_verified(x) || c.cfg.unsafe_switch == UnsafeSwitch::ReadGuessed {
        if xw != c.cfg.writer {
            c.pool.supersede(op.slot.unwrap_or(0), now);
        }
        return match find_value(c, op, x) {
            Some(v) => c.finish(op, Ok(Some(v)), now, out),
            None => fetch(c, op, x, true, now, out),
        };
    }
    if meta::id(x) == meta::id(op.prev_max) {
        return reader_lock(c, op, x, now, out);
    }
    if let Some(&x0) = op.seen.get(&xw) {
        if meta::buf(x0) != meta::buf(x) && meta::id(x0) != meta::id(x) {
            // x's writer started another operation: the one of x0 completed.
            return fetch(c, op, x0, true, now, out);
        }
    }
    op.seen.insert(xw, x);
    op.prev_max = x;
    read_round(c, op, now, out)
}

fn reader_lock(c: &mut Client, op: &mut Op, x: u64, now: LocalTime, out: &mut Outbox) {
    let slot = op.slot.unwrap_or(0);
    let xw = meta::writer(x);
    let xb = meta::buf(x);
    let l = &c.cfg.layout;
    let mut chains = Vec::new();
    for node in c.alive_replicas(slot) {
        let mut verbs = vec![Verb::Cas {
            addr: l.buffer_lock(xw, xb),
            expected: meta::lock(x, meta::LOCK_FREE),
            new: meta::lock(x, meta::LOCK_READER),
        }];
        let mut shape = Shape::default();
        // Write X back into its writer's word where this node had an older one.
        if let Some(&o) = op.observed.get(&node).and_then(|ws| ws.get(xw as usize)) {
            if meta::id(o) < meta::id(x) {
                shape.cas_other = Some((verbs.len(), o));
                verbs.push(Verb::Cas { addr: l.meta_word(slot, xw), expected: o, new: meta::id(x) });
            }
        }
        shape.copy = Some(verbs.len());
        verbs.push(Verb::Read { addr: l.buffer_copy(xw, xb), len: l.copy_bytes_max() });
        shape.words = Some(verbs.len());
        verbs.push(Verb::Read { addr: l.meta_words(slot), len: l.meta_words_bytes() });
        chains.push((node, verbs, shape));
    }
    op.target = x;
    let need = c.majority();
    c.send_round(op, Stage::ReaderLock, chains, need, now, out);
}

fn after_reader_lock(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let x = op.target;
    let xw = meta::writer(x) as usize;
    let free = meta::lock(x, meta::LOCK_FREE);
    let reader = meta::lock(x, meta::LOCK_READER);
    let won = op
        .replies
        .keys()
        .filter(|n| matches!(cas_previous(op, **n, Some(0)), Some(p) if p == free || p == reader))
        .count();
    let words = words_by_node(op);
    let installed = words.values().filter(|ws| ws.get(xw).is_some_and(|o| meta::id(*o) >= meta::id(x))).count();
    if won >= c.majority() && installed >= c.majority() {
        c.bump("reader_lock_won");
        return match find_value(c, op, x) {
            Some(v) => c.finish(op, Ok(Some(v)), now, out),
            None => fetch(c, op, x, true, now, out),
        };
    }
    c.bump("reader_lock_lost");
    // The words read after the lock attempt are the next iteration.
    op.prev_max = 0;
    after_read(c, op, now, out)
}

fn fetch(c: &mut Client, op: &mut Op, x: u64, then_read: bool, now: LocalTime, out: &mut Outbox) {
    c.bump("fetches");
    let slot = op.slot.unwrap_or(0);
    let l = &c.cfg.layout;
    let (xw, xb) = (meta::writer(x), meta::buf(x));
    let chains = c
        .alive_replicas(slot)
        .into_iter()
        .map(|node| {
            let verbs = vec![Verb::Read { addr: l.buffer_copy(xw, xb), len: l.copy_bytes_max() }];
            (node, verbs, Shape { copy: Some(0), ..Shape::default() })
        })
        .collect();
    op.target = x;
    let need = c.majority();
    c.send_round(op, Stage::Fetch { then_read }, chains, need, now, out);
}

fn after_fetch(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    match find_value(c, op, op.target) {
        Some(v) => {
            if meta::is_verified(op.target) {
                // The in-place copy missed a VERIFIED maximum (e.g. the primary changed after a
                // crash): repair it in the background so the next reads take one round trip.
                let slot = op.slot.unwrap_or(0);
                if let Some(primary) = c.primary(slot) {
                    let data = meta::encode_copy(op.target, &v);
                    let addr = c.cfg.layout.inplace(slot);
                    c.bump("inplace_repairs");
                    c.send_background(primary, vec![Verb::Write { addr, data }], None, now, out);
                }
            }
            c.finish(op, Ok(Some(v)), now, out)
        }
        None => {
            // Torn, not there yet, or recycled: read again.
            c.bump("fetch_misses");
            op.prev_max = 0;
            read_round(c, op, now, out)
        }
    }
}

pub(crate) fn advance(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    match op.stage {
        Stage::Write => after_write(c, op, now, out),
        Stage::Create => after_create(c, op, now, out),
        Stage::WriterLock => after_writer_lock(c, op, now, out),
        Stage::Read => after_read(c, op, now, out),
        Stage::ReaderLock => after_reader_lock(c, op, now, out),
        Stage::Fetch { .. } => after_fetch(c, op, now, out),
        _ => {}
    }
}
