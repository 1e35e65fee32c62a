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

/// A multi-shard transaction released here and not yet in the log.
#[derive(Debug)]
struct Unlogged {
    released_ts: Ts,
    /// Keys whose current value depends on it.
    keys: Vec<Key>,
    /// Transactions whose fast reply waits for it.
    waiters: Vec<TxnId>,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(super) struct ReplyGate {
    /// Per key, the unlogged multi-shard transactions its current (released) value depends on.
    taint: Map<Key, Vec<TxnId>>,
    unlogged: Map<TxnId, Unlogged>,
    /// `unlogged` by release timestamp, to forget those that never reach the log.
    by_ts: BTreeSet<(Ts, TxnId)>,
    /// Fast replies waiting, with how many unlogged transactions each still waits for.
    held: Map<TxnId, (TigaMsg, usize)>,
}

impl ReplyGate {
    /// `piece` was released at `ts` with `reply`: returns the reply if it may leave now, else
    /// holds it until what it read from is logged.
    pub(super) fn released(&mut self, piece: &Piece, ts: Ts, reply: TigaMsg) -> Option<TigaMsg> {
        let mut deps: Vec<TxnId> = piece.reads.iter().filter_map(|k| self.taint.get(k)).flatten().copied().collect();
        deps.sort_unstable();
        deps.dedup();
        let mut taint = deps.clone();
        if piece.shards.len() > 1 {
            taint.push(piece.txn);
            self.by_ts.insert((ts, piece.txn));
            self.unlogged.insert(piece.txn, Unlogged { released_ts: ts, keys: Vec::new(), waiters: Vec::new() });
        }
        // A write replaces the key's value: it depends on what this transaction depends on.
        for k in &piece.writes {
            for d in self.taint.get(k).into_iter().flatten() {
                if let Some(u) = self.unlogged.get_mut(d) {
                    u.keys.retain(|x| x != k);
                }
            }
            if taint.is_empty() {
                self.taint.remove(k);
            } else {
                for d in &taint {
                    if let Some(u) = self.unlogged.get_mut(d) {
                        u.keys.push(*k);
                    }
                }
                self.taint.insert(*k, taint.clone());
            }
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

    fn forget(&mut self, txn: TxnId) -> Option<Unlogged> {
        let u = self.unlogged.remove(&txn)?;
        self.by_ts.remove(&(u.released_ts, txn));
        for k in &u.keys {
            if let Some(t) = self.taint.get_mut(k) {
                t.retain(|d| *d != txn);
                if t.is_empty() {
                    self.taint.remove(k);
                }
            }
        }
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
}
