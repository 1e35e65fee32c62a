//! A follower's gate on fast replies: a transaction that read (directly, or through other
//! released transactions) what a multi-shard transaction wrote is answered on the fast path
//! only once that multi-shard transaction is in this follower's log.
//!
//! **Why.** A leader releases T2 after a conflicting multi-shard T1 once T1's timestamp is
//! agreed, and T2 may commit on the fast path before T1 is in any follower's log, with a
//! result that read T1's writes. If both shards' leaders then fail, the view change of T1's
//! other shard may lack T1 and hold a later conflicting transaction T3 that f + 1 replicas
//! released. From what f + 1 replicas report, the new leaders cannot tell "T1 was agreed, so
//! T3 never committed" (T1 must be kept) from "T1 never reached that shard's leader, and T3
//! committed" (T1 must be dropped): only the old leaders knew whether T1 was agreed. With the
//! gate, T2's fast commit means a super quorum of T2's shard has T1 in its log, so any f + 1
//! of them include one that reports it there: T1 is *settled* on that shard and every new leader
//! keeps it (`view_change.rs`). A slow commit of T2 puts T1 in the log before it anyway.
//!
//! **Cost.** Only replies that read from a multi-shard transaction still outside the log wait,
//! and only until the leader's next log synchronization reaches this follower: about the
//! slow path's latency for those transactions, nothing for the others.
//!
//! **Transitively.** If T2 wrote a key that T4 reads, T4 waits for T1 too: T2 may stay in the
//! new log (rule (b)) and be re-executed without T1, which would change the value T4 read.
//! So per key we keep the unlogged multi-shard transactions its current value depends on.

use super::FixedMap as Map;
use crate::msg::{Key, Piece, TigaMsg, Ts, TxnId};
use std::collections::BTreeSet;
use std::sync::Arc;

/// The taint map is swept of sets whose transactions are all logged once it holds this many
/// keys, and from then on whenever it has doubled since the last sweep.
const SWEEP_KEYS_MIN: usize = 4_096;

/// A multi-shard transaction released here and not yet in the log.
#[derive(Debug)]
struct Unlogged {
    released_ts: Ts,
    /// Transactions whose fast reply waits for it.
    waiters: Vec<TxnId>,
}

/// See the module docs.
///
/// **Cost.** Under load every transaction of a shard touches a few hot keys (TPC-C's warehouse
/// and district rows), so a key's dependencies soon include every unlogged multi-shard
/// transaction of the shard. A release costs time linear in the dependencies it reads, and
/// nothing per dependency for the keys it writes: those share one set. Logged transactions are
/// dropped from the sets lazily (a set is filtered when it is read, and sets of logged
/// transactions only are swept when the map has grown). Keeping, per transaction, the keys it
/// tainted and removing it from each when it was logged made a release cost the product of
/// both: past saturation, when logs lag and unlogged transactions pile up, a follower spent
/// more per commit the further behind it was (Tiga on TPC-C, measured CPU, 100,000 txn/s
/// offered: a quarter of all samples, and up to 182 µs per commit at the busiest server).
#[derive(Debug)]
pub(super) struct ReplyGate {
    /// Per key, the multi-shard transactions its current (released) value depends on (no
    /// duplicates), one set shared by every key a piece wrote. Only those still in `unlogged`
    /// count; a transaction released again after it was logged makes a stale entry count
    /// again, which only holds a reply longer.
    taint: Map<Key, Arc<[TxnId]>>,
    /// `taint`'s size that triggers the next sweep.
    sweep_at: usize,
    unlogged: Map<TxnId, Unlogged>,
    /// `unlogged` by release timestamp, to forget those that never reach the log.
    by_ts: BTreeSet<(Ts, TxnId)>,
    /// Fast replies waiting, with how many unlogged transactions each still waits for.
    held: Map<TxnId, (TigaMsg, usize)>,
}

impl Default for ReplyGate {
    fn default() -> Self {
        ReplyGate {
            taint: Map::default(),
            sweep_at: SWEEP_KEYS_MIN,
            unlogged: Map::default(),
            by_ts: BTreeSet::new(),
            held: Map::default(),
        }
    }
}

impl ReplyGate {
    /// `piece` was released at `ts` with `reply`: returns the reply if it may leave now, else
    /// holds it until what it read from is logged.
    pub(super) fn released(&mut self, piece: &Piece, ts: Ts, reply: TigaMsg) -> Option<TigaMsg> {
        let mut deps: Vec<TxnId> = Vec::new();
        let mut sets_read = 0;
        for set in piece.reads.iter().filter_map(|k| self.taint.get(k)) {
            sets_read += 1;
            deps.extend(set.iter().filter(|d| self.unlogged.contains_key(d)));
        }
        if sets_read > 1 {
            deps.sort_unstable();
            deps.dedup();
        }
        // A write replaces the key's value: it depends on what this transaction depends on.
        let mut taint = deps.clone();
        if piece.shards.len() > 1 {
            taint.push(piece.txn);
            self.by_ts.insert((ts, piece.txn));
            self.unlogged.insert(piece.txn, Unlogged { released_ts: ts, waiters: Vec::new() });
        }
        let taint: Option<Arc<[TxnId]>> = (!taint.is_empty()).then(|| taint.into());
        for k in &piece.writes {
            match &taint {
                Some(set) => self.taint.insert(*k, set.clone()),
                None => self.taint.remove(k),
            };
        }
        if self.taint.len() > self.sweep_at {
            let unlogged = &self.unlogged;
            self.taint.retain(|_, set| set.iter().any(|d| unlogged.contains_key(d)));
            self.sweep_at = (2 * self.taint.len()).max(SWEEP_KEYS_MIN);
        }
        if deps.is_empty() {
            return Some(reply);
        }
        for d in &deps {
            if let Some(u) = self.unlogged.get_mut(d) {
                u.waiters.push(piece.txn);
            }
        }
        self.held.insert(piece.txn, (reply, deps.len()));
        None
    }

    /// `txn` joined the log: returns the fast replies that waited only for it. A reply still
    /// held for `txn` itself is dropped (its slow reply leaves instead).
    pub(super) fn logged(&mut self, txn: TxnId) -> Vec<(TxnId, TigaMsg)> {
        self.held.remove(&txn);
        let Some(u) = self.forget(txn) else { return Vec::new() };
        let mut ready = Vec::new();
        for w in u.waiters {
            if let Some((_, n)) = self.held.get_mut(&w) {
                *n -= 1;
                if *n == 0 {
                    let (reply, _) = self.held.remove(&w).expect("held");
                    ready.push((w, reply));
                }
            }
        }
        ready
    }

    /// Forgets the unlogged transactions released at or before `before` (they were abandoned,
    /// or the view is changing) with the replies that wait for them: those replies' hashes
    /// include a transaction the leader's log lacks, so they could not make a fast quorum.
    pub(super) fn forget_older(&mut self, before: Ts) {
        while let Some(&(ts, txn)) = self.by_ts.first() {
            if ts > before {
                break;
            }
            if let Some(u) = self.forget(txn) {
                for w in u.waiters {
                    self.held.remove(&w);
                }
            }
        }
    }

    /// Drops `txn` from what replies wait for (the taint sets drop it lazily).
    fn forget(&mut self, txn: TxnId) -> Option<Unlogged> {
        let u = self.unlogged.remove(&txn)?;
        self.by_ts.remove(&(u.released_ts, txn));
        Some(u)
    }

    /// Whether `txn`'s fast reply is held.
    #[cfg(test)]
    fn holds(&self, txn: TxnId) -> bool {
        self.held.contains_key(&txn)
    }

    /// Replies held and multi-shard transactions awaited.
    #[cfg(test)]
    fn len(&self) -> (usize, usize) {
        (self.held.len(), self.unlogged.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{ReplyKind, ServerReply};
    use crate::ops::{Op, OpKind};
    use std::collections::BTreeMap;

    fn piece(txn: u64, shards: Vec<u32>, ops: Vec<Op>) -> Piece {
        Piece::new(TxnId(txn), 0, shards, ops)
    }

    fn reply(txn: u64) -> TigaMsg {
        TigaMsg::Reply(ServerReply {
            view: 0,
            txn: TxnId(txn),
            shard: 0,
            replica: 1,
            kind: ReplyKind::Fast,
            ts: Ts::from_nanos(txn),
            hash: [0; 20],
            result: None,
            owd_ns: 0,
        })
    }

    fn inc(key: &str) -> Op {
        Op::new(key.as_bytes().to_vec(), OpKind::IncrBy(1))
    }

    #[test]
    fn a_reply_that_read_an_unlogged_multi_shard_write_waits_for_it_even_through_another_transaction() {
        let mut gate = ReplyGate::default();
        // T1 (multi-shard) writes a; T2 reads a and writes b; T4 reads b; T5 touches c only.
        assert!(gate.released(&piece(1, vec![0, 1], vec![inc("a")]), Ts::from_nanos(1), reply(1)).is_some());
        assert!(gate.released(&piece(2, vec![0], vec![inc("a"), inc("b")]), Ts::from_nanos(2), reply(2)).is_none());
        assert!(gate.released(&piece(4, vec![0], vec![inc("b")]), Ts::from_nanos(4), reply(4)).is_none());
        assert!(gate.released(&piece(5, vec![0], vec![inc("c")]), Ts::from_nanos(5), reply(5)).is_some());
        assert!(gate.holds(TxnId(2)) && gate.holds(TxnId(4)));
        let ready: Vec<TxnId> = gate.logged(TxnId(1)).into_iter().map(|(t, _)| t).collect();
        assert_eq!(ready, vec![TxnId(2), TxnId(4)]);
        assert_eq!(gate.len(), (0, 0));
        // Nothing is tainted any more.
        assert!(gate.released(&piece(6, vec![0], vec![inc("b")]), Ts::from_nanos(6), reply(6)).is_some());
    }

    #[test]
    fn a_blind_write_ends_the_dependency_and_an_abandoned_transaction_drops_its_waiters() {
        let mut gate = ReplyGate::default();
        gate.released(&piece(1, vec![0, 1], vec![inc("a")]), Ts::from_nanos(1), reply(1));
        let put = Op::new(b"a".to_vec(), OpKind::Set(b"v".to_vec()));
        assert!(
            gate.released(&piece(2, vec![0], vec![put]), Ts::from_nanos(2), reply(2)).is_some(),
            "a blind write reads nothing"
        );
        assert!(
            gate.released(&piece(3, vec![0], vec![inc("a")]), Ts::from_nanos(3), reply(3)).is_some(),
            "a's value is T2's"
        );
        gate.released(&piece(7, vec![0, 1], vec![inc("x")]), Ts::from_nanos(7), reply(7));
        assert!(gate.released(&piece(8, vec![0], vec![inc("x")]), Ts::from_nanos(8), reply(8)).is_none());
        gate.forget_older(Ts::from_nanos(7));
        assert!(!gate.holds(TxnId(8)));
        assert_eq!(gate.len(), (0, 0));
        // A transaction logged before what it waits for: its own slow reply goes instead.
        gate.released(&piece(9, vec![0, 1], vec![inc("y")]), Ts::from_nanos(9), reply(9));
        assert!(gate.released(&piece(10, vec![0], vec![inc("y")]), Ts::from_nanos(10), reply(10)).is_none());
        assert!(gate.logged(TxnId(10)).is_empty());
        assert!(gate.logged(TxnId(9)).is_empty(), "T10's reply is not sent after its slow one");
    }

    /// One step of a gate's life, for the model comparison.
    #[derive(Clone, Debug)]
    enum Step {
        /// The next transaction (multi-shard or not) reads and writes these of keys 0 to 4.
        Release { multi: bool, reads: Vec<u8>, writes: Vec<u8> },
        /// The `i`-th multi-shard transaction released so far (mod their count) joined the log.
        Log(usize),
        /// Forget those released at or before the `i`-th release (mod the count).
        ForgetOlder(usize),
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        let keys = || proptest::collection::vec(0u8..5, 0..3);
        prop_oneof![
            3 => (any::<bool>(), keys(), keys()).prop_map(|(multi, reads, writes)| Step::Release {
                multi,
                reads,
                writes
            }),
            2 => (0usize..64).prop_map(Step::Log),
            1 => (0usize..64).prop_map(Step::ForgetOlder),
        ]
    }

    /// The gate's rule computed eagerly: per key the exact set of unlogged multi-shard
    /// transactions its value depends on, every set updated when one is logged or forgotten.
    #[derive(Default)]
    struct Reference {
        /// Whether a write passes on what the writer read (the rule); off, for a wrong reference.
        intransitive: bool,
        taint: BTreeMap<u8, BTreeSet<u64>>,
        unlogged: BTreeMap<u64, u64>,
        held: BTreeMap<u64, BTreeSet<u64>>,
    }

    impl Reference {
        fn released(&mut self, txn: u64, multi: bool, reads: &[u8], writes: &[u8], ts: u64) -> bool {
            let deps: BTreeSet<u64> = reads.iter().filter_map(|k| self.taint.get(k)).flatten().copied().collect();
            let mut taint = if self.intransitive { BTreeSet::new() } else { deps.clone() };
            if multi {
                taint.insert(txn);
                self.unlogged.insert(txn, ts);
            }
            for k in writes {
                self.taint.insert(*k, taint.clone());
            }
            if deps.is_empty() {
                return true;
            }
            self.held.insert(txn, deps);
            false
        }

        fn drop_txn(&mut self, txn: u64) {
            self.unlogged.remove(&txn);
            for set in self.taint.values_mut() {
                set.remove(&txn);
            }
        }

        fn logged(&mut self, txn: u64) -> BTreeSet<u64> {
            self.held.remove(&txn);
            if !self.unlogged.contains_key(&txn) {
                return BTreeSet::new();
            }
            self.drop_txn(txn);
            let mut ready = BTreeSet::new();
            self.held.retain(|w, deps| {
                if deps.remove(&txn) && deps.is_empty() {
                    ready.insert(*w);
                    return false;
                }
                true
            });
            ready
        }

        fn forget_older(&mut self, before: u64) {
            let old: Vec<u64> = self.unlogged.iter().filter(|(_, ts)| **ts <= before).map(|(t, _)| *t).collect();
            for txn in old {
                self.drop_txn(txn);
                self.held.retain(|_, deps| !deps.contains(&txn));
            }
        }
    }

    /// Runs `steps` through the gate and the reference; returns the first disagreement.
    fn compare(steps: &[Step], sweep_keys_min: usize, mut model: Reference) -> Result<(), String> {
        let mut gate = ReplyGate { sweep_at: sweep_keys_min, ..ReplyGate::default() };
        let mut multi_released: Vec<u64> = Vec::new();
        for (i, step) in steps.iter().enumerate() {
            let t = i as u64 + 1;
            match step {
                Step::Release { multi, reads, writes, .. } => {
                    let (reads, writes): (Vec<u8>, Vec<u8>) = (dedup(reads), dedup(writes));
                    let shards = if *multi { vec![0, 1] } else { vec![0] };
                    let mut p = Piece::new(TxnId(t), 0, shards, Vec::new());
                    p.reads = reads.iter().map(|k| Key::from(*k)).collect();
                    p.writes = writes.iter().map(|k| Key::from(*k)).collect();
                    let sent = gate.released(&p, Ts::from_nanos(t), reply(t)).is_some();
                    if sent != model.released(t, *multi, &reads, &writes, t) {
                        return Err(format!("step {i}: T{t} sent {sent}, the reference disagrees"));
                    }
                    if *multi {
                        multi_released.push(t);
                    }
                }
                Step::Log(j) if !multi_released.is_empty() => {
                    let txn = multi_released[j % multi_released.len()];
                    let ready: BTreeSet<u64> = gate.logged(TxnId(txn)).into_iter().map(|(w, _)| w.0).collect();
                    let want = model.logged(txn);
                    if ready != want {
                        return Err(format!("step {i}: logging T{txn} sent {ready:?}, the reference {want:?}"));
                    }
                }
                Step::ForgetOlder(j) => {
                    let before = (*j as u64) % t;
                    gate.forget_older(Ts::from_nanos(before));
                    model.forget_older(before);
                }
                Step::Log(_) => {}
            }
            let held: BTreeSet<u64> = gate.held.keys().map(|t| t.0).collect();
            if held != model.held.keys().copied().collect() {
                return Err(format!("step {i}: held {held:?}, the reference {:?}", model.held.keys()));
            }
        }
        Ok(())
    }

    fn dedup(keys: &[u8]) -> Vec<u8> {
        keys.iter().copied().collect::<BTreeSet<u8>>().into_iter().collect()
    }

    proptest::proptest! {
        /// The lazily pruned, shared sets hold and send exactly what the eager exact rule
        /// does, with the sweep on every release and with none.
        #[test]
        fn holds_and_sends_what_the_eager_rule_does(steps in proptest::collection::vec(step(), 1..150)) {
            proptest::prop_assert_eq!(compare(&steps, 0, Reference::default()), Ok(()));
            proptest::prop_assert_eq!(compare(&steps, usize::MAX, Reference::default()), Ok(()));
        }
    }

    /// The comparison can fail: against a reference that does not pass dependencies on
    /// through writes, the gate (which does) holds a reply the reference sends.
    #[test]
    fn the_model_comparison_catches_a_difference() {
        let release = |multi, reads: &[u8], writes: &[u8]| Step::Release {
            multi,
            reads: reads.to_vec(),
            writes: writes.to_vec(),
        };
        // T1 (multi-shard) writes key 0; T2 reads 0, writes 1 (held); T3 reads 1 (held through
        // T2); T1 is logged, which sends both.
        let steps = [release(true, &[], &[0]), release(false, &[0], &[1]), release(false, &[1], &[2]), Step::Log(0)];
        assert_eq!(compare(&steps, 0, Reference::default()), Ok(()));
        let wrong = Reference { intransitive: true, ..Reference::default() };
        let e = compare(&steps, 0, wrong).unwrap_err();
        assert!(e.starts_with("step 2: T3 sent false"), "{e}");
    }
}
