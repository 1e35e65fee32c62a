//! SWARM-KV's operations: Safe-Guess replication with timestamp locks over In-n-Out max
//! registers (see the crate docs for the whole story).
//!
//! The verb model matters for every rule below: a chain's verbs apply in order but **not
//! atomically**, and a chain may stall between two verbs for any time (a descheduled thread, a
//! slow NIC) or stop for good (a crashed client). A reply shows one node at one moment, nothing
//! more.
//!
//! **Timestamp lock.** Each buffer's first word is the lock word `id|mode` of the latest tuple
//! of that buffer anyone raced for (`mode` READER or WRITER). It only grows: it moves from a
//! word naming an *older* tuple (or 0) to `X|READER` or `X|WRITER` by a CAS whose expected value
//! is the word last read, and nobody ever writes it blindly (the buffer fill writes the copy
//! only). So on each node at most one side ever holds `X`, and at most one side holds it on a
//! majority. Nobody needs the writer's help to lock: a reader can lock `X` on a node the
//! writer's chain never reached.
//!
//! **Write** (update, insert of a known key, delete). One round trip to a majority of the alive
//! replicas (the first try goes to a majority first and widens when one is slow, see
//! [`crate::hedge`]; retries ask every alive replica): fill a buffer, read its lock word, CAS
//! this writer's metadata word to the guessed tuple `T|GUESSED`, read every writer's word. If
//! nothing above `T` was read, the guess was fresh: done in 1 RTT; in the background the word
//! is flipped to `T|VERIFIED` and the in-place copy refreshed on the primary. Otherwise the
//! clock resyncs above what it saw and the writer **always** races readers for `T` — however
//! few replies showed `T` as a maximum: a reader may have read `T` on other nodes, or on these
//! before the newer tuple landed, and returned it (the writer's replies are no proof of the
//! contrary). The race:
//! 1. If fewer than a majority are known to hold a tuple above `T`, read the highest one seen,
//!    `M` (its value), so that the lock round can write it where it is missing.
//! 2. Lock round, on every node: write `M` (value, then metadata) where no tuple above `T` is
//!    known, then CAS the lock word to `T|WRITER`, then read back. The writer locks only nodes
//!    known to hold a tuple above `T`, unless a majority already does. `M` is
//!    always written with the value fetched for `M` itself: when a round shows a higher tuple,
//!    that one becomes `M` and its value is fetched first (campaign seed 22175: a retried lock
//!    round wrote a newer tuple's metadata over the older tuple's value, so later reads of the
//!    newer, VERIFIED tuple returned the older value). A node given `M` in a round is locked
//!    only in the next, once its read-back shows `M` there (the CAS that gives it `M` may
//!    fail; `writer_lock` says why that matters).
//! 3. Won on a majority, with a tuple above `T` on a majority: no reader can lock `T` on a
//!    majority any more, and no reader can even see `T` as a maximum again (every majority read
//!    meets a node holding more), so rewrite under a fresh timestamp above everything read, in
//!    a fresh buffer and flagged [`meta::REWRITE`] (`rewrite` says why not in `T`'s buffer);
//!    like an ABD write it completes once on a majority. Because step 2 puts `M` before the
//!    lock, a writer that crashes after winning leaves no key on which readers would spin.
//! 4. Found `T|READER` anywhere: a reader saw `T` as the maximum of two majority reads made
//!    after this write began. Every write that completed before this one began is on a majority
//!    and would have shown above `T` in those reads, so none is above `T`: the write is
//!    complete at `T`, ordered before every higher tuple (all concurrent with it), and the reader
//!    may return it.
//! 5. Neither (lock words moved since they were read, or nodes not heard from): again, with
//!    the words just read.
//! 6. A **deletion** is the highest tuple there is, and nothing is written above it. A write
//!    that meets one (another writer's, or this writer's own earlier delete) races for `T` as
//!    in 1-5, with the deletion as `M` (only its word is written back: it has no value). A
//!    reader's lock on `T` means `T` took effect before the deletion: the write completes. Won
//!    on a majority: no reader returns `T` ever, so the write did not take effect and reports
//!    `Deleted`, once the deletion is on a majority ([`crate::deletion`]). (It used to report
//!    `Deleted` as soon as it read a deletion, also after a reader had returned its value: a
//!    review's schedule, now the test
//!    `an_update_a_reader_returned_before_a_delete_completes_despite_the_delete`.)
//!    Rule c of the read takes a writer's earlier tuple `x0` for a completed write once it
//!    sees the writer's next operation's tuple; an operation that reported `Deleted` completed
//!    *without* effect, so after it the writer writes nothing on that key again (the deletion
//!    is final: its later writes report `Deleted` at once). Before, its next update landed
//!    where the deletion had not, and a read that saw it there returned `x0`, the value of a
//!    write that reported `Deleted` (a review's schedule,
//!    `a_read_never_returns_an_update_that_reported_deleted`). A client restarted with the same
//!    writer id has forgotten what its earlier instance learned, so until one of its own
//!    operations on a key has a definite outcome (a value, or `Deleted`), its tuples there
//!    carry [`meta::REWRITE`] and rule c does not use them: a definite outcome after a
//!    deletion reached a majority is `Deleted`, so a tuple without the flag follows no
//!    operation of its writer that reported `Deleted` (the review of that fix:
//!    `a_restarted_writer_does_not_make_a_read_return_an_update_that_reported_deleted`).
//!
//! Without failures a stale write takes at most 5 round trips (write, fetch `M`, give `M` where
//! it is missing, lock, rewrite); where a majority already holds a tuple above `T`, 3.
//!
//! **Read** (get). Iterations of one round trip each: read every writer's word on a majority
//! (and the in-place copy on the primary; from the second iteration on, also the lock word and
//! copy of the previous iteration's maximum, and the round waits for one of the nodes that
//! showed that maximum as well, unless each of them failed: only they are sure to hold its
//! value, and a round that ended without them would go round again for nothing, as often as
//! their replies are late — campaign seed 20563 went round 12 times, bound 9, while one such
//! node's replies were stalled). `X` is the highest tuple the read has seen so far
//! — in this iteration **or any earlier one**: the read's maximum never goes down. A lower
//! maximum in a later iteration only means that its majority missed the nodes holding `X` (a
//! stalled writer's chain may have reached one node), not that `X` went away; the reference
//! implementation's reader keeps the highest tuple it saw too. A deletion as `X` is reported
//! once it is on a majority ([`crate::deletion`]). Otherwise:
//! a. `X` VERIFIED → return its value (in-place copy if it matches, else follow the pointer);
//! b. `X` GUESSED and already the maximum at the end of the previous iteration → lock round on
//!    every node: where `X`'s writer word is older than `X`, write `X`'s value into its buffer
//!    and then `X` into the word (a node never holds `X`'s metadata without its value, so a
//!    later primary crash loses nothing); CAS the lock word from the state just read to
//!    `X|READER`; read back. Won on a majority with `X` installed on a majority → return `X`
//!    and, in the background, mark it VERIFIED (and refresh the in-place copy) so the next reads
//!    take 1 RTT. Lost → the words read back are the next iteration (`X` stays a candidate
//!    unless its writer holds the lock somewhere: then the writer is moving above `X`). The
//!    lock round needs `X`'s value from a node that answered; if none of the nodes that showed
//!    `X` is alive any more, `X`'s value may be lost for good and the read starts over (safe:
//!    every rule rests only on what the read saw since it started).
//! c. the maximum was once `x0`, an *earlier* operation of `X`'s writer (lower tuple, and `X`
//!    not flagged [`meta::REWRITE`]: `X` is its operation's first tuple, so `x0` belongs to an
//!    earlier one) → `x0`'s operation completed before `X`'s began,
//!    both within the read: return `x0`. This needs the maximum to be monotone: with a
//!    maximum taken afresh in each iteration, a read that saw a pending write `T` on one node
//!    and then the writer's previous tuple on another majority took that *older* tuple for the
//!    writer's next operation and returned `T` unlocked; `T`'s writer then found no reader's
//!    lock, rewrote `T` above a write that began after the read ended, and a later read
//!    returned `T` again (campaign seed 8350; the schedule test
//!    `a_reader_does_not_take_an_older_tuple_of_a_writer_as_that_writers_next_operation`).
//! d. otherwise remember `X` and read again.
//!
//! A lock round fails only if `X`'s writer holds `X` somewhere (it then puts a tuple above `X`
//! on a majority before it rewrites, so `X` is not the maximum for long) or lock words moved
//! between the read and the CAS; it never waits for the writer's chain, so a stalled or crashed
//! writer cannot stall readers. A read takes at most `2 × writers + 1` iterations when lock
//! rounds are not disturbed (counted as `read_iterations_max`; see the contention test and the
//! client-crash campaign).

use crate::client::{KvError, KvOp, Outbox};
use crate::engine::{words_by_node, Client, NodeMap, Op, Shape, Stage, UnsafeSwitch};
use crate::meta;
use crate::verbs::{MemNodeId, Verb, VerbOutcome};
use kairos_core::LocalTime;

pub(crate) fn begin(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    if let KvOp::Get { .. } = op.op {
        return read_round(c, op, now, out);
    }
    if op.slot.is_some_and(|slot| c.deleted_slots.contains(&slot)) {
        // Rule 6's last paragraph: no tuple of this writer follows one that reported Deleted.
        return c.finish(op, Err(KvError::Deleted), now, out);
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
    if !op.slot.is_some_and(|slot| c.settled_slots.contains(&slot)) {
        // This client (instance) has no definite outcome on the key yet: rule 6's last
        // paragraph.
        op.tuple |= meta::REWRITE;
    }
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
    let mut lock = None;
    if let Some(buf) = op.buf {
        // The copy only: the lock word is never written blindly (see the module docs).
        verbs.push(Verb::Write { addr: l.buffer_copy(w, buf), data: meta::encode_copy(op.tuple, value_of(op)) });
        lock = Some(verbs.len());
        verbs.push(Verb::Read { addr: l.buffer_lock(w, buf), len: 8 });
    }
    let expected = c.my_word(slot, node);
    // CAS-emulated max: never lower the word (e.g. below this writer's own deletion).
    let new = if meta::id(expected) >= meta::id(op.tuple) { expected } else { op.tuple };
    let cas = verbs.len();
    verbs.push(Verb::Cas { addr: l.meta_word(slot, w), expected, new });
    let words = verbs.len();
    verbs.push(Verb::Read { addr: l.meta_words(slot), len: l.meta_words_bytes() });
    (verbs, Shape { cas_my: Some((cas, expected)), words: Some(words), lock, ..Shape::default() })
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
    if op.rtt == 0 {
        // The first try of a write that began with it (not an insert after its lookup) goes to
        // a majority first, as reads do (see `crate::hedge`): a write is complete once a
        // majority holds its tuple, whichever majority.
        c.send_round_majority_first(op, Stage::Write, chains, need, now, out);
    } else {
        // A retry or a rewrite (contention) asks every replica: one failed CAS — a reader
        // wrote this writer's tuple back there — must not cost another round.
        c.send_round(op, Stage::Write, chains, need, now, out);
    }
}

/// A new key's directory entry and first value went out together: if another client's slot
/// for the same key is lower, write there instead; otherwise this is an ordinary write.
fn after_create(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let fp = crate::index::fingerprint(op.op.key());
    let mut lowest = op.slot;
    for words in crate::engine::window_words(op).values() {
        if let Some(&s) = crate::index::slots_in_window(&c.cfg.layout, words, fp).first() {
            lowest = Some(lowest.map_or(s, |l| l.min(s)));
        }
    }
    match lowest {
        Some(s) if Some(s) != op.slot => {
            c.bump("insert_redirects");
            op.slot = Some(s);
            c.index.insert(op.op.key(), s);
            match prepare_write(c, op, now) {
                Ok(()) => write_round(c, op, now, out),
                Err(e) => c.finish(op, Err(e), now, out),
            }
        }
        _ => {
            if let Some(s) = op.slot {
                c.index.insert(op.op.key(), s);
            }
            after_write(c, op, now, out)
        }
    }
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
    // The highest tuple of another writer, or a deletion (this writer's own included: its own
    // earlier delete makes this write as invisible as anyone's).
    let mut max_other = 0u64;
    for (node, ws) in &words {
        let cas_my = op.shapes.get(node).and_then(|s| s.cas_my);
        if let (Some(prev), Some((_, expected))) = (cas_previous(op, *node, cas_my.map(|x| x.0)), cas_my) {
            if prev == expected || meta::id(prev) >= t {
                written += 1;
            }
        }
        for (i, word) in ws.iter().enumerate() {
            if i != w || meta::is_deleted(*word) {
                max_other = max_other.max(*word);
            }
        }
    }
    if matches!(op.op, KvOp::Delete { .. }) {
        if written >= c.majority() {
            c.pool.delete(op.slot.unwrap_or(0), now);
            return c.finish(op, Ok(None), now, out);
        }
        c.bump("write_retries");
        return write_round(c, op, now, out);
    }
    // A deletion seen here is raced for like any tuple above T (rule 6 of the module docs).
    if written < c.majority() {
        c.bump("write_retries");
        return write_round(c, op, now, out);
    }
    if op.fresh || meta::id(max_other) < t || c.cfg.unsafe_switch == UnsafeSwitch::TrustGuess {
        if op.rtt == 1 {
            c.bump("write_fast_path");
        }
        return commit(c, op, now, out);
    }
    // A stale guess: whatever the replies show, a reader may have chosen T (the replies are one
    // moment of chains that are ordered, not atomic), so always race readers for T's lock.
    c.bump("stale_guesses");
    let live_ts = words.values().flatten().map(|w| meta::ts(*w)).filter(|t| *t < meta::DELETED_TS).max();
    c.resync(live_ts.unwrap_or(0), now.saturating_since(op.started), now);
    op.lock_for = op.tuple;
    op.locks.clear();
    op.above.clear();
    op.value = None;
    op.target = 0;
    learn_stale(c, op);
    if op.above.len() >= c.majority() || !needs_value(op) {
        writer_lock(c, op, now, out)
    } else {
        writer_prepare(c, op, now, out)
    }
}

/// Whether the lock round still lacks the value of the tuple above T it may have to write
/// (a deletion has none: only its metadata is written back).
fn needs_value(op: &Op) -> bool {
    op.value.is_none() && !meta::is_deleted(op.target)
}

/// What a stale writer learns from any round's replies: its buffer's lock word per node, every
/// node's words (`observed`), the nodes holding another writer's tuple above T (`above`), and
/// the highest such tuple (`target`; when it rises, the value fetched for the old one is
/// dropped).
fn learn_stale(c: &Client, op: &mut Op) {
    let w = c.cfg.writer as usize;
    let t = meta::id(op.tuple);
    for (node, lw) in lock_words_by_node(op) {
        op.locks.insert(node, lw);
    }
    for (node, ws) in words_by_node(op) {
        let top = ws.iter().enumerate().filter(|(i, x)| *i != w || meta::is_deleted(**x)).map(|(_, x)| *x).max();
        let top = top.unwrap_or(0);
        if meta::id(top) > t {
            op.above.insert(node);
        }
        if meta::id(top) > meta::id(op.target) {
            op.target = top;
            // The value fetched was the older target's: the lock round must never write it
            // under this tuple (campaign seed 22175), so fetch the new target's first.
            op.value = None;
        }
        op.observed.insert(node, ws);
    }
}

/// T is above the words of too many nodes: fetch the highest tuple `M` seen (words, this
/// writer's lock word and M's buffer) so that the lock round can write M where it is missing.
fn writer_prepare(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    c.bump("writer_prepares");
    let slot = op.slot.unwrap_or(0);
    let l = &c.cfg.layout;
    let (mw, mb) = (meta::writer(op.target), meta::buf(op.target));
    let (w, buf) = (c.cfg.writer, op.buf.unwrap_or(0));
    let chains = c
        .alive_replicas(slot)
        .into_iter()
        .map(|node| {
            let verbs = vec![
                Verb::Read { addr: l.meta_words(slot), len: l.meta_words_bytes() },
                Verb::Read { addr: l.buffer_lock(w, buf), len: 8 },
                Verb::Read { addr: l.buffer_copy(mw, mb), len: l.copy_bytes_max() },
            ];
            (node, verbs, Shape { words: Some(0), lock: Some(1), copy: Some(2), ..Shape::default() })
        })
        .collect();
    let need = c.majority();
    c.send_round(op, Stage::WriterPrepare, chains, need, now, out);
}

fn after_writer_prepare(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let asked = op.target;
    learn_stale(c, op);
    if op.above.len() >= c.majority() || !needs_value(op) {
        return writer_lock(c, op, now, out);
    }
    if meta::id(op.target) != meta::id(asked) {
        // A higher tuple appeared meanwhile: fetch that one.
        return writer_prepare(c, op, now, out);
    }
    match find_value(c, op, asked) {
        Some(v) => {
            op.value = Some(v);
            writer_lock(c, op, now, out)
        }
        // Torn or recycled (then a newer tuple of its writer exists): look again.
        None => writer_prepare(c, op, now, out),
    }
}

/// Whether a lock word `word` may still move to a mode of `x`: it names an older tuple of the
/// buffer (or `x` unlocked, as the load phase writes it).
fn lock_open_for(word: u64, x: u64) -> bool {
    meta::id(word) < meta::id(x) || word == meta::lock(x, meta::LOCK_FREE)
}

/// The writer's side of T's timestamp lock. On every node: where no tuple above T is known,
/// write M (value, then metadata); CAS the lock word from the state last read to `T|WRITER`
/// where a tuple above T is known to be (elsewhere the CAS only probes); then read back. A node
/// given M in this round is locked in the next one, once its read-back shows M there: the CAS
/// that gives it M fails if M's writer's word moved since it was read (a VERIFIED flip is
/// enough), and a lock there would guard a node holding nothing above T — readers would then
/// spin on T for good once the writer crashed (a review's schedule,
/// `a_stale_writer_never_locks_a_node_its_covering_write_missed`).
fn writer_lock(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    c.bump("writer_lock_rounds");
    let slot = op.slot.unwrap_or(0);
    let l = &c.cfg.layout;
    let (w, buf) = (c.cfg.writer, op.buf.unwrap_or(0));
    let m = op.target;
    let (mw, mb) = (meta::writer(m), meta::buf(m));
    let mine = meta::lock(op.tuple, meta::LOCK_WRITER);
    let mut chains = Vec::new();
    for node in c.alive_replicas(slot) {
        let mut verbs = Vec::new();
        let mut shape = Shape::default();
        // Once a majority holds a tuple above T, no reader can choose T any more: lock anywhere.
        let covered = op.above.contains(&node) || op.above.len() >= c.majority();
        if !covered {
            let seen = op.observed.get(&node).and_then(|ws| ws.get(mw as usize)).copied();
            if let (true, Some(o)) = (meta::is_deleted(m), seen) {
                // A deletion has no value: its word alone (see `crate::deletion`).
                if meta::id(o) < meta::id(m) {
                    shape.cas_other = Some((verbs.len(), o));
                    verbs.push(Verb::Cas { addr: l.meta_word(slot, mw), expected: o, new: m });
                }
            } else if let (Some(v), Some(o)) = (&op.value, seen) {
                if meta::id(o) < meta::id(m) {
                    verbs.push(Verb::Write { addr: l.buffer_copy(mw, mb), data: meta::encode_copy(m, v) });
                    shape.cas_other = Some((verbs.len(), o));
                    verbs.push(Verb::Cas { addr: l.meta_word(slot, mw), expected: o, new: m });
                }
            }
        }
        let expected = op.locks.get(&node).copied().or_else(|| c.my_locks.get(buf, node)).unwrap_or(0);
        // Lock only where a tuple above T is known to be; elsewhere just probe.
        let new = if covered && lock_open_for(expected, op.tuple) { mine } else { expected };
        shape.lock_cas = Some((verbs.len(), expected, new));
        verbs.push(Verb::Cas { addr: l.buffer_lock(w, buf), expected, new });
        shape.words = Some(verbs.len());
        verbs.push(Verb::Read { addr: l.meta_words(slot), len: l.meta_words_bytes() });
        shape.lock = Some(verbs.len());
        verbs.push(Verb::Read { addr: l.buffer_lock(w, buf), len: 8 });
        chains.push((node, verbs, shape));
    }
    let need = c.majority();
    c.send_round(op, Stage::WriterLock, chains, need, now, out);
}

fn after_writer_lock(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let mine = meta::lock(op.tuple, meta::LOCK_WRITER);
    let theirs = meta::lock(op.tuple, meta::LOCK_READER);
    let outcomes = lock_outcomes(op);
    learn_stale(c, op);
    let won = outcomes.iter().filter(|(_, prev, exp, new)| (prev == exp && *new == mine) || *prev == mine).count();
    let reader = outcomes.iter().any(|(_, prev, _, _)| *prev == theirs);
    let max_seen = words_by_node(op).values().flatten().map(|w| meta::ts(*w)).filter(|t| *t < meta::DELETED_TS).max();
    if let Some(ts) = max_seen {
        c.resync(ts, now.saturating_since(op.started), now);
    }
    if won >= c.majority() && op.above.len() >= c.majority() {
        // No reader can lock T on a majority now, and a majority holds a tuple above T, so no
        // reader will ever choose T: rewrite above everything read — unless the key was
        // deleted, above which nothing can be written: then T never took effect.
        c.bump("writer_lock_won");
        match crate::deletion::find(&op.observed) {
            Some(d) => {
                let observed = words_by_node(op);
                crate::deletion::confirm(c, op, d, observed, now, out)
            }
            None => rewrite(c, op, now, out),
        }
    } else if reader {
        // A reader saw T as the maximum of two majority reads made after this write began, so
        // no write above T had completed before it began: the write is complete at T (and the
        // reader may have returned it).
        c.bump("writer_lock_lost");
        commit(c, op, now, out)
    } else {
        // Undecided (lock words moved since last read, nodes not heard from): again, with what
        // this round read.
        c.bump("writer_lock_retries");
        if op.above.len() < c.majority() && needs_value(op) {
            writer_prepare(c, op, now, out)
        } else {
            writer_lock(c, op, now, out)
        }
    }
}

/// Per replied node: (node, word the lock CAS found, expected, new).
fn lock_outcomes(op: &Op) -> Vec<(MemNodeId, u64, u64, u64)> {
    let mut v = Vec::new();
    for node in op.replies.keys() {
        let Some((i, expected, new)) = op.shapes.get(node).and_then(|s| s.lock_cas) else { continue };
        if let Some(prev) = cas_previous(op, *node, Some(i)) {
            v.push((*node, prev, expected, new));
        }
    }
    v
}

/// The lock word read by the verb at `shape.lock` (alone, or as the first word of a buffer).
fn lock_words_by_node(op: &Op) -> NodeMap<u64> {
    let mut m = NodeMap::new();
    for (node, outs) in &op.replies {
        let Some(i) = op.shapes.get(node).and_then(|s| s.lock) else { continue };
        if let Some(VerbOutcome::Read(bytes)) = outs.get(i) {
            if let Some(w) = meta::first_word(bytes) {
                m.insert(*node, w);
            }
        }
    }
    m
}

/// Writes again above every timestamp read since the operation began (after `resync`): like an
/// ABD write, this one is complete once it is on a majority, whatever it reads.
///
/// The rewrite takes a **fresh buffer**, and `T`'s retires: helpers' chains that write `T`'s
/// copy into `T`'s buffer (readers' lock rounds, stale writers' `M`) may land any time later,
/// and in `T`'s buffer they would overwrite the rewritten tuple's value (a review's schedule,
/// now `a_readers_slow_lock_chain_does_not_clobber_a_rewrite_in_the_same_buffer`). The new
/// tuple carries [`meta::REWRITE`], so that readers do not take `T` for an earlier operation
/// (read rule c); whoever writes the word back keeps the flag. Out of buffers, the outcome is
/// unknown (`Timeout`, and `T`'s buffer is pinned): a reader that saw `T` as its maximum and
/// then this writer's next operation returns `T` by rule c (a review's schedule, when this
/// reported `OutOfBuffers`, "certainly no effect"). Out of timestamps likewise: `T` was written
/// and may have been returned, so `TimestampExhausted` (a definite failure) would be wrong.
fn rewrite(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    c.bump("rewrites");
    op.fresh = true;
    let Ok(ts) = c.guess_ts(now) else { return c.finish(op, Err(KvError::Timeout), now, out) };
    let Some(buf) = c.pool.allocate(now) else { return c.finish(op, Err(KvError::Timeout), now, out) };
    if let Some(old) = op.buf.replace(buf) {
        c.pool.abandon(old, now);
    }
    op.tuple = meta::pack(ts, buf, c.cfg.writer, false) | meta::REWRITE;
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
    // The nodes the last round wrote (a replica it did not reach has no T to verify); the
    // primary also gets the in-place copy.
    for node in c.alive_replicas(slot).into_iter().filter(|n| op.nodes.contains(n) || Some(*n) == primary) {
        let l = &c.cfg.layout;
        let mut verbs = vec![Verb::Cas { addr: l.meta_word(slot, c.cfg.writer), expected, new: verified }];
        if Some(node) == primary {
            verbs.push(Verb::Write { addr: l.inplace(node, slot), data: copy.clone() });
        }
        c.send_background(node, verbs, Some((0, slot, expected, verified)), now, out);
    }
    c.finish(op, Ok(None), now, out);
}

fn read_round(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let slot = op.slot.unwrap_or(0);
    let mut chains = c.meta_read_chains(slot, true);
    // From the second iteration on, also read the buffer (lock word and copy) of the maximum
    // seen last time: if it is the maximum again, the lock round needs both.
    op.lock_for = op.prev_max;
    op.locks.clear();
    if op.prev_max != 0 {
        let l = &c.cfg.layout;
        let (xw, xb) = (meta::writer(op.prev_max), meta::buf(op.prev_max));
        for (node, verbs, shape) in &mut chains {
            // Only the nodes that showed the maximum are sure to hold its value: wait for one
            // of them rather than go round again without it (campaign seed 20563).
            shape.holder = op.max_from.contains(node);
            shape.lock = Some(verbs.len());
            verbs.push(Verb::Read { addr: l.buffer_lock(xw, xb), len: 8 });
            shape.copy = Some(verbs.len());
            verbs.push(Verb::Read { addr: l.buffer_copy(xw, xb), len: l.copy_bytes_max() });
        }
    }
    let need = c.majority();
    if op.iterations == 0 {
        c.send_round_majority_first(op, Stage::Read, chains, need, now, out);
    } else {
        // Later iterations ask every replica: the tuple the read is after may sit only on
        // nodes a fixed majority would miss (see `crate::hedge`).
        c.send_round(op, Stage::Read, chains, need, now, out);
    }
}

/// The value of `target` from any replied copy (in-place or buffer). A copy whose header names
/// `target` but whose hash fails was torn by a concurrent write (counted as `torn_copies`).
fn find_value(c: &mut Client, op: &Op, target: u64) -> Option<Vec<u8>> {
    let max = c.cfg.layout.config.value_size as usize;
    let mut torn = 0;
    let mut found = None;
    'nodes: for (node, outs) in &op.replies {
        let Some(shape) = op.shapes.get(node) else { continue };
        for i in [shape.inplace, shape.copy].into_iter().flatten() {
            if let Some(VerbOutcome::Read(bytes)) = outs.get(i) {
                match meta::decode_copy(bytes, max) {
                    Some((t, v)) if meta::id(t) == meta::id(target) => {
                        found = Some(v);
                        break 'nodes;
                    }
                    Some(_) => {}
                    None => {
                        if meta::first_word(bytes).is_some_and(|w| meta::id(w) == meta::id(target)) {
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
    let here = words.values().flatten().copied().max().unwrap_or(0);
    // The read's maximum never goes down: a lower maximum in this iteration only means that
    // its majority missed the nodes holding the higher tuple (see the module docs, rule c).
    let x = here.max(op.read_max);
    if meta::id(x) != meta::id(op.read_max) {
        op.max_from.clear();
    }
    op.read_max = x;
    for (node, ws) in &words {
        if ws.iter().any(|w| meta::id(*w) == meta::id(x)) {
            op.max_from.insert(*node);
        }
    }
    op.observed = words;
    for (node, lw) in lock_words_by_node(op) {
        op.locks.insert(node, lw);
    }
    if x == 0 {
        return c.finish(op, Ok(None), now, out);
    }
    if meta::is_deleted(x) {
        // Reported only once on a majority (see `crate::deletion`).
        let observed = std::mem::take(&mut op.observed);
        return crate::deletion::confirm(c, op, x, observed, now, out);
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
    if meta::id(x) == meta::id(op.prev_max) && meta::id(op.lock_for) == meta::id(x) {
        if let Some(v) = find_value(c, op, x) {
            return reader_lock(c, op, x, v, now, out);
        }
        // X's copy was torn, or no node that answered holds X: read again (X stays the
        // candidate) — unless every node that showed X is now suspected (crashed): then X's
        // value may be gone for good, and the read starts over.
        c.bump("lock_value_misses");
        if !op.max_from.iter().any(|n| c.members.is_alive(*n)) {
            restart_read(c, op);
        }
        return read_round(c, op, now, out);
    }
    if let Some(&x0) = op.seen.get(&xw) {
        if !meta::is_rewrite(x) && meta::id(x0) < meta::id(x) {
            // x is the first tuple of an operation of x's writer begun after x0's, and both
            // were the read's maximum in turn: x0's operation completed during the read.
            // Return it.
            return fetch(c, op, x0, true, now, out);
        }
    }
    op.seen.insert(xw, x);
    op.prev_max = x;
    read_round(c, op, now, out)
}

/// Forgets what the read saw: it starts over as a new read (safe at any time — every rule
/// rests only on what the read saw since it last started).
fn restart_read(c: &mut Client, op: &mut Op) {
    c.bump("read_restarts");
    op.read_max = 0;
    op.max_from.clear();
    op.prev_max = 0;
    op.seen.clear();
}

/// The reader's side of X's timestamp lock, on every node: where X's writer word is older than
/// X, write X's value into its buffer, then X into the word (so a node never holds X's metadata
/// without its value); CAS the lock word from the state last read to `X|READER`; read back the
/// words and X's buffer (the next iteration if the lock is lost).
fn reader_lock(c: &mut Client, op: &mut Op, x: u64, value: Vec<u8>, now: LocalTime, out: &mut Outbox) {
    let slot = op.slot.unwrap_or(0);
    let xw = meta::writer(x);
    let xb = meta::buf(x);
    let l = &c.cfg.layout;
    let mine = meta::lock(x, meta::LOCK_READER);
    let mut chains = Vec::new();
    for node in c.alive_replicas(slot) {
        let mut verbs = Vec::new();
        let mut shape = Shape::default();
        if let Some(&o) = op.observed.get(&node).and_then(|ws| ws.get(xw as usize)) {
            if meta::id(o) < meta::id(x) {
                verbs.push(Verb::Write { addr: l.buffer_copy(xw, xb), data: meta::encode_copy(x, &value) });
                shape.cas_other = Some((verbs.len(), o));
                // X as its writer wrote it, GUESSED: its REWRITE flag is what read rule c goes
                // by (a review's schedule dropped it here, and a read returned a rewritten
                // operation's first tuple as an earlier, completed one).
                verbs.push(Verb::Cas { addr: l.meta_word(slot, xw), expected: o, new: x & !meta::VERIFIED });
            }
        }
        let expected = op.locks.get(&node).copied().unwrap_or(0);
        let new = if lock_open_for(expected, x) { mine } else { expected };
        shape.lock_cas = Some((verbs.len(), expected, new));
        verbs.push(Verb::Cas { addr: l.buffer_lock(xw, xb), expected, new });
        shape.words = Some(verbs.len());
        verbs.push(Verb::Read { addr: l.meta_words(slot), len: l.meta_words_bytes() });
        shape.lock = Some(verbs.len());
        verbs.push(Verb::Read { addr: l.buffer_lock(xw, xb), len: 8 });
        shape.copy = Some(verbs.len());
        verbs.push(Verb::Read { addr: l.buffer_copy(xw, xb), len: l.copy_bytes_max() });
        chains.push((node, verbs, shape));
    }
    op.target = x;
    op.value = Some(value);
    let need = c.majority();
    c.send_round(op, Stage::ReaderLock, chains, need, now, out);
}

fn after_reader_lock(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    let x = op.target;
    let xw = meta::writer(x) as usize;
    let mine = meta::lock(x, meta::LOCK_READER);
    let outcomes = lock_outcomes(op);
    let won = outcomes.iter().filter(|(_, prev, exp, new)| (prev == exp && *new == mine) || *prev == mine).count();
    let words = words_by_node(op);
    let installed = words.values().filter(|ws| ws.get(xw).is_some_and(|o| meta::id(*o) >= meta::id(x))).count();
    if won >= c.majority() && installed >= c.majority() {
        c.bump("reader_lock_won");
        let v = op.value.take().unwrap_or_default();
        // X is linearized and on a majority: mark it VERIFIED (and refresh the in-place copy)
        // in the background, so the next reads take one round trip.
        let slot = op.slot.unwrap_or(0);
        // (Flags kept: without its REWRITE flag the CAS missed every node holding a rewrite.)
        let (guessed, verified) = (x & !meta::VERIFIED, x | meta::VERIFIED);
        let primary = c.primary(slot);
        for node in c.alive_replicas(slot) {
            let l = &c.cfg.layout;
            let mut verbs = vec![Verb::Cas { addr: l.meta_word(slot, xw as u32), expected: guessed, new: verified }];
            if Some(node) == primary {
                verbs.push(Verb::Write { addr: l.inplace(node, slot), data: meta::encode_copy(verified, &v) });
            }
            c.send_background(node, verbs, None, now, out);
        }
        return c.finish(op, Ok(Some(v)), now, out);
    }
    c.bump("reader_lock_lost");
    // The words read after the lock attempt are the next iteration. If X's writer holds the
    // lock somewhere it may win and move above X: X is no candidate any more; otherwise (lock
    // words moved since they were read) X may be locked again at once with what was just read.
    let writer_holds = outcomes.iter().any(|(_, prev, _, _)| *prev == meta::lock(x, meta::LOCK_WRITER));
    op.lock_for = x;
    op.locks.clear();
    op.prev_max = if writer_holds { 0 } else { x };
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
                    let addr = c.cfg.layout.inplace(primary, slot);
                    c.bump("inplace_repairs");
                    c.send_background(primary, vec![Verb::Write { addr, data }], None, now, out);
                }
            }
            c.finish(op, Ok(Some(v)), now, out)
        }
        None => {
            // Torn, or a buffer recycled after a newer tuple superseded it: read again, from
            // scratch (the tuple asked for may never be found again).
            c.bump("fetch_misses");
            restart_read(c, op);
            read_round(c, op, now, out)
        }
    }
}

pub(crate) fn advance(c: &mut Client, op: &mut Op, now: LocalTime, out: &mut Outbox) {
    match op.stage {
        Stage::Write => after_write(c, op, now, out),
        Stage::Create => after_create(c, op, now, out),
        Stage::WriterPrepare => after_writer_prepare(c, op, now, out),
        Stage::WriterLock => after_writer_lock(c, op, now, out),
        Stage::Read => after_read(c, op, now, out),
        Stage::ReaderLock => after_reader_lock(c, op, now, out),
        Stage::Fetch { .. } => after_fetch(c, op, now, out),
        _ => {}
    }
}
