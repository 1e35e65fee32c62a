//! A Tapir replica of one shard: IR's replica side (a record of consensus operations with
//! their results, idempotent answers to retransmissions, finalized results) and TAPIR-OCC
//! over the shard's [`Store`] (versions are commit timestamps).
//!
//! # TAPIR-OCC-CHECK (paper, Figure 8), for a transaction proposed at timestamp `ts`
//! For every key read at version `v`: ABORT if a newer version is committed (`v` <
//! latest version); ABSTAIN if another transaction is prepared to write the key. For every
//! key written: RETRY (suggesting a larger timestamp) if another prepared transaction read it
//! at a later timestamp, if `ts` is not past the latest committed version or the latest
//! committed read of the key, or (linearizable mode) if another prepared transaction writes
//! it at a later timestamp. Otherwise PREPARE-OK: the transaction enters the prepared list.
//!
//! Deliberate deviations from Figure 8, both more conservative (they only turn a PREPARE-OK
//! into ABSTAIN or RETRY, never the reverse, so they cost concurrency, not safety): the paper
//! abstains only if the version read is older than the smallest prepared write of the key
//! (`version < MIN(PREPARED-WRITES(key))`); here any other prepared write of a key read
//! abstains (a superset of the paper's condition). For writes the paper
//! retries when `ts` is *below* the largest prepared read or committed version and suggests
//! that value; here `ts` must be *strictly past* the committed version, the committed reads
//! and (linearizable mode) the prepared reads and writes, and the suggestion is one past the
//! largest, so that two transactions never share a timestamp on a key.
//!
//! A finalized PREPARE-OK (IR slow path) enters the prepared list even where this replica had
//! voted otherwise, as IR's merge would do; commit applies the writes at the commit timestamp
//! and records the reads' timestamp; abort drops the prepared entry. Both are remembered (the
//! newest [`OpId`] per transaction, the last `done_max` transactions) so that a late or
//! duplicated prepare of a finished operation is ignored.
//!
//! # A restarted replica refuses to vote
//! A replica that crashed lost its store, prepared list and IR record. Answering as if it were
//! fresh would be unsafe: its validation would accept stale reads, and together with one other
//! replica that missed the latest commit it would form f + 1 PREPARE-OKs on the slow path
//! (a stale read committed). IR's replica recovery (fetching the record from f + 1 replicas
//! in a view change) is not implemented, so a restarted replica ([`Replica::restarted`])
//! stays **recovering**: it ignores pings (so no coordinator picks it as the closest replica),
//! reads, prepares and finalizes, and only acknowledges commits and aborts (without applying
//! them: it never serves or votes again) so coordinators stop redelivering them. Its shard
//! keeps working with the f + 1 others, exactly as if it had stayed down.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use kairos_core::{Ctx, NodeId, Process, TimerId};
use kairos_tiga::msg::{Key, ShardId, Ts, TxnId, Value};
use kairos_tiga::Topology;

use super::msg::{OpId, PrepareResult, ReadResult, TapirMsg};
use super::TapirConfig;
use crate::store::Store;

/// A replica's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicaStats {
    pub reads: u64,
    pub prepare_ok: u64,
    pub prepare_abort: u64,
    pub prepare_abstain: u64,
    pub prepare_retry: u64,
    pub commits: u64,
    pub aborts: u64,
    /// Messages ignored: malformed, for another shard, stale operations, over a limit, or
    /// anything but a commit or abort while recovering.
    pub ignored: u64,
}

#[derive(Clone, Debug)]
struct Prepared {
    op: OpId,
    ts: Ts,
    reads: Vec<Key>,
    writes: Vec<Key>,
}

/// IR's record of a transaction's newest consensus operation.
#[derive(Copy, Clone, Debug)]
struct Record {
    op: OpId,
    result: PrepareResult,
}

/// See the module docs.
pub struct Replica {
    shard: ShardId,
    replica: u32,
    shard_count: u64,
    config: TapirConfig,
    store: Store,
    /// Key → the largest commit timestamp of a committed transaction that read it.
    last_read: BTreeMap<Key, Ts>,
    prepared: BTreeMap<TxnId, Prepared>,
    prepared_reads: BTreeMap<Key, BTreeSet<(Ts, TxnId)>>,
    prepared_writes: BTreeMap<Key, BTreeSet<(Ts, TxnId)>>,
    records: BTreeMap<TxnId, Record>,
    done: BTreeMap<TxnId, OpId>,
    done_order: VecDeque<TxnId>,
    /// Restarted after a crash with its state lost: never votes or serves (module docs).
    recovering: bool,
    stats: ReplicaStats,
}

impl Replica {
    pub fn new(topology: &Topology, config: &TapirConfig, shard: ShardId, replica: u32) -> Self {
        Replica {
            shard,
            replica,
            shard_count: topology.shard_count().max(1) as u64,
            config: config.clone(),
            store: Store::default(),
            last_read: BTreeMap::new(),
            prepared: BTreeMap::new(),
            prepared_reads: BTreeMap::new(),
            prepared_writes: BTreeMap::new(),
            records: BTreeMap::new(),
            done: BTreeMap::new(),
            done_order: VecDeque::new(),
            recovering: false,
            stats: ReplicaStats::default(),
        }
    }

    /// The replica a crashed one restarts as: it lost its state and refuses to vote or serve
    /// reads until recovery exists (module docs).
    pub fn restarted(topology: &Topology, config: &TapirConfig, shard: ShardId, replica: u32) -> Self {
        Replica { recovering: true, ..Replica::new(topology, config, shard, replica) }
    }

    /// Whether this replica restarted with its state lost (and so never votes).
    pub fn is_recovering(&self) -> bool {
        self.recovering
    }

    pub fn stats(&self) -> &ReplicaStats {
        &self.stats
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Transactions in the prepared list.
    pub fn prepared_count(&self) -> usize {
        self.prepared.len()
    }

    fn ignore(&mut self, ctx: &mut Ctx<'_, TapirMsg>) {
        self.stats.ignored += 1;
        ctx.metric("tapir.replica_ignored", 1);
    }

    /// Keys must belong to this shard and be few.
    fn keys_ok(&self, keys: impl ExactSizeIterator<Item = Key> + Clone) -> bool {
        keys.len() <= self.config.keys_max && keys.clone().all(|k| k % self.shard_count == u64::from(self.shard)) && {
            let mut v: Vec<Key> = keys.collect();
            let n = v.len();
            v.sort_unstable();
            v.dedup();
            v.len() == n
        }
    }

    /// The transaction finished (committed or aborted) at `op` or later.
    fn finished(&self, op: OpId) -> bool {
        self.done.get(&op.txn).is_some_and(|d| *d >= op)
    }

    fn mark_done(&mut self, op: OpId) {
        match self.done.get_mut(&op.txn) {
            Some(d) => *d = (*d).max(op),
            None => {
                self.done.insert(op.txn, op);
                self.done_order.push_back(op.txn);
                while self.done_order.len() > self.config.done_max {
                    if let Some(old) = self.done_order.pop_front() {
                        self.done.remove(&old);
                    }
                }
            }
        }
    }

    fn unprepare(&mut self, txn: TxnId) {
        let Some(p) = self.prepared.remove(&txn) else { return };
        for (keys, index) in [(&p.reads, &mut self.prepared_reads), (&p.writes, &mut self.prepared_writes)] {
            for k in keys {
                if let Some(set) = index.get_mut(k) {
                    set.remove(&(p.ts, txn));
                    if set.is_empty() {
                        index.remove(k);
                    }
                }
            }
        }
    }

    fn prepare(&mut self, op: OpId, ts: Ts, reads: Vec<Key>, writes: Vec<Key>) {
        for k in &reads {
            self.prepared_reads.entry(*k).or_default().insert((ts, op.txn));
        }
        for k in &writes {
            self.prepared_writes.entry(*k).or_default().insert((ts, op.txn));
        }
        self.prepared.insert(op.txn, Prepared { op, ts, reads, writes });
    }

    /// TAPIR-OCC-CHECK (module docs). The transaction's own earlier entry is already gone.
    fn occ_check(&self, txn: TxnId, ts: Ts, reads: &[(Key, Ts)], writes: &[Key]) -> PrepareResult {
        let check_prepared = !self.config.unsafe_skip_prepared_check;
        let others = |set: Option<&BTreeSet<(Ts, TxnId)>>| {
            set.into_iter().flatten().filter(move |(_, t)| *t != txn).map(|(ts, _)| *ts).max()
        };
        for &(k, version) in reads {
            if version < self.store.get(k).version {
                return PrepareResult::Abort;
            }
            if check_prepared && others(self.prepared_writes.get(&k)).is_some() {
                return PrepareResult::Abstain;
            }
        }
        let mut retry: Option<Ts> = None;
        for &k in writes {
            let mut bound = self.store.get(k).version.max(self.last_read.get(&k).copied().unwrap_or(0));
            if check_prepared {
                bound = bound.max(others(self.prepared_reads.get(&k)).unwrap_or(0));
                bound = bound.max(others(self.prepared_writes.get(&k)).unwrap_or(0));
            }
            if ts <= bound {
                retry = retry.max(Some(bound.saturating_add(1)));
            }
        }
        match retry {
            Some(at) => PrepareResult::Retry(at),
            None => PrepareResult::Ok,
        }
    }

    fn on_prepare(
        &mut self,
        ctx: &mut Ctx<'_, TapirMsg>,
        from: NodeId,
        op: OpId,
        ts: Ts,
        reads: Vec<(Key, Ts)>,
        writes: Vec<Key>,
    ) {
        if self.finished(op) {
            return self.ignore(ctx);
        }
        let result = match self.records.get(&op.txn) {
            // A retransmission: answer as before (IR: the record holds the result).
            Some(r) if r.op == op => r.result,
            Some(r) if r.op > op => return self.ignore(ctx),
            _ => {
                if !self.records.contains_key(&op.txn) && self.records.len() >= self.config.records_max {
                    return self.ignore(ctx);
                }
                self.unprepare(op.txn);
                let mut result = self.occ_check(op.txn, ts, &reads, &writes);
                if result == PrepareResult::Ok && self.prepared.len() >= self.config.prepared_max {
                    result = PrepareResult::Abstain;
                }
                match result {
                    PrepareResult::Ok => {
                        self.stats.prepare_ok += 1;
                        self.prepare(op, ts, reads.iter().map(|(k, _)| *k).collect(), writes);
                    }
                    PrepareResult::Abort => self.stats.prepare_abort += 1,
                    PrepareResult::Abstain => self.stats.prepare_abstain += 1,
                    PrepareResult::Retry(_) => self.stats.prepare_retry += 1,
                }
                self.records.insert(op.txn, Record { op, result });
                result
            }
        };
        ctx.send(from, TapirMsg::PrepareReply { op, shard: self.shard, replica: self.replica, result });
    }

    /// IR finalize: the coordinator decided `result` for `entry.op` on the slow path.
    fn on_finalize(&mut self, ctx: &mut Ctx<'_, TapirMsg>, from: NodeId, entry: Prepared, result: PrepareResult) {
        let op = entry.op;
        let reply = TapirMsg::FinalizeReply { op, shard: self.shard, replica: self.replica };
        if self.finished(op) {
            return ctx.send(from, reply);
        }
        if self.records.get(&op.txn).is_some_and(|r| r.op > op) {
            return self.ignore(ctx);
        }
        if !self.records.contains_key(&op.txn) && self.records.len() >= self.config.records_max {
            return self.ignore(ctx);
        }
        self.records.insert(op.txn, Record { op, result });
        if result == PrepareResult::Ok && self.prepared.get(&op.txn).is_none_or(|p| p.op != op) {
            self.unprepare(op.txn);
            self.prepare(op, entry.ts, entry.reads, entry.writes);
        } else if result != PrepareResult::Ok {
            self.unprepare(op.txn);
        }
        ctx.send(from, reply);
    }

    fn on_commit(&mut self, ctx: &mut Ctx<'_, TapirMsg>, op: OpId, ts: Ts, reads: &[Key], writes: &[(Key, Value)]) {
        for &(k, v) in writes {
            self.store.put(k, v, ts);
        }
        for &k in reads {
            let r = self.last_read.entry(k).or_insert(0);
            *r = (*r).max(ts);
        }
        if !self.finished(op) {
            self.stats.commits += 1;
        }
        self.unprepare(op.txn);
        self.records.remove(&op.txn);
        self.mark_done(op);
        ctx.metric("tapir.replica_commits", 1);
    }

    fn on_abort(&mut self, op: OpId) {
        if self.prepared.get(&op.txn).is_some_and(|p| p.op <= op) {
            self.unprepare(op.txn);
        }
        if self.records.get(&op.txn).is_some_and(|r| r.op <= op) {
            self.records.remove(&op.txn);
        }
        if !self.finished(op) {
            self.stats.aborts += 1;
        }
        self.mark_done(op);
    }
}

impl Process for Replica {
    type Msg = TapirMsg;

    fn on_start(&mut self, _ctx: &mut Ctx<'_, TapirMsg>) {}

    fn on_message(&mut self, ctx: &mut Ctx<'_, TapirMsg>, from: NodeId, msg: TapirMsg) {
        let (shard, replica) = (self.shard, self.replica);
        if self.recovering {
            // Acknowledge commits and aborts (so coordinators stop redelivering them) without
            // applying them; ignore everything else (module docs).
            return match msg {
                TapirMsg::Commit { op, shard: s, .. } | TapirMsg::Abort { op, shard: s } if s == shard => {
                    ctx.send(from, TapirMsg::Done { op, shard, replica })
                }
                _ => {
                    ctx.metric("tapir.replica_recovering_ignored", 1);
                    self.ignore(ctx)
                }
            };
        }
        match msg {
            TapirMsg::Ping { nonce } => ctx.send(from, TapirMsg::Pong { nonce, shard, replica }),
            TapirMsg::Read { txn, attempt, keys } => {
                if !self.keys_ok(keys.iter().copied()) {
                    return self.ignore(ctx);
                }
                self.stats.reads += 1;
                let values = keys
                    .iter()
                    .map(|&key| {
                        let v = self.store.get(key);
                        ReadResult { key, value: v.value, version: v.version }
                    })
                    .collect();
                ctx.send(from, TapirMsg::ReadReply { txn, attempt, shard, replica, values });
            }
            TapirMsg::Prepare { op, shard: s, ts, reads, writes } => {
                if s != shard || !self.keys_ok(reads.iter().map(|(k, _)| *k)) || !self.keys_ok(writes.iter().copied()) {
                    return self.ignore(ctx);
                }
                self.on_prepare(ctx, from, op, ts, reads, writes);
            }
            TapirMsg::Finalize { op, shard: s, ts, reads, writes, result } => {
                if s != shard || !self.keys_ok(reads.iter().map(|(k, _)| *k)) || !self.keys_ok(writes.iter().copied()) {
                    return self.ignore(ctx);
                }
                let reads = reads.into_iter().map(|(k, _)| k).collect();
                self.on_finalize(ctx, from, Prepared { op, ts, reads, writes }, result);
            }
            TapirMsg::Commit { op, shard: s, ts, reads, writes } => {
                if s != shard || !self.keys_ok(reads.iter().copied()) || !self.keys_ok(writes.iter().map(|(k, _)| *k)) {
                    return self.ignore(ctx);
                }
                self.on_commit(ctx, op, ts, &reads, &writes);
                ctx.send(from, TapirMsg::Done { op, shard, replica });
            }
            TapirMsg::Abort { op, shard: s } => {
                if s != shard {
                    return self.ignore(ctx);
                }
                self.on_abort(op);
                ctx.send(from, TapirMsg::Done { op, shard, replica });
            }
            TapirMsg::Pong { .. }
            | TapirMsg::ReadReply { .. }
            | TapirMsg::PrepareReply { .. }
            | TapirMsg::FinalizeReply { .. }
            | TapirMsg::Done { .. } => self.ignore(ctx),
        }
    }

    fn on_timer(&mut self, _ctx: &mut Ctx<'_, TapirMsg>, _timer: TimerId) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use kairos_core::{Effect, LocalTime, Rng};
    use rand::SeedableRng;

    const COORD: NodeId = NodeId(9);

    fn replica(config: TapirConfig) -> Replica {
        let topology = Topology { shards: vec![vec![NodeId(0), NodeId(1), NodeId(2)]], leader: vec![0] };
        Replica::new(&topology, &config, 0, 1)
    }

    fn deliver(r: &mut Replica, msg: TapirMsg) -> Vec<TapirMsg> {
        let mut rng = Rng::seed_from_u64(1);
        let mut effects = Vec::new();
        r.on_message(&mut Ctx::new(NodeId(1), LocalTime::ZERO, &mut rng, &mut effects), COORD, msg);
        effects.into_iter().filter_map(|e| if let Effect::Send { msg, .. } = e { Some(msg) } else { None }).collect()
    }

    fn op(seq: u32, attempt: u32, round: u32) -> OpId {
        OpId { txn: TxnId::new(COORD, seq), attempt, round }
    }

    fn prepare(r: &mut Replica, op: OpId, ts: Ts, reads: &[(Key, Ts)], writes: &[Key]) -> Option<PrepareResult> {
        let msg = TapirMsg::Prepare { op, shard: 0, ts, reads: reads.to_vec(), writes: writes.to_vec() };
        deliver(r, msg).into_iter().find_map(|m| {
            if let TapirMsg::PrepareReply { result, .. } = m {
                Some(result)
            } else {
                None
            }
        })
    }

    fn commit(r: &mut Replica, op: OpId, ts: Ts, key: Key, value: Value) {
        deliver(r, TapirMsg::Commit { op, shard: 0, ts, reads: vec![key], writes: vec![(key, value)] });
    }

    #[test]
    fn occ_check_returns_each_result_of_the_paper() {
        let mut r = replica(TapirConfig::default());
        commit(&mut r, op(1, 1, 1), 100, 3, 7);
        assert_eq!(r.store().get(3).version, 100);
        // A read of the version before 100 is stale.
        assert_eq!(prepare(&mut r, op(2, 1, 1), 150, &[(3, 0)], &[3]), Some(PrepareResult::Abort));
        // A write at a timestamp not past the committed read and version must retry later.
        assert_eq!(prepare(&mut r, op(3, 1, 1), 90, &[(3, 100)], &[3]), Some(PrepareResult::Retry(101)));
        // Valid: prepared.
        assert_eq!(prepare(&mut r, op(4, 1, 1), 200, &[(3, 100)], &[3]), Some(PrepareResult::Ok));
        assert_eq!(r.prepared_count(), 1);
        // Another transaction reading key 3 meets the prepared write: abstain.
        assert_eq!(prepare(&mut r, op(5, 1, 1), 300, &[(3, 100)], &[3]), Some(PrepareResult::Abstain));
        // A blind write below the prepared read's timestamp must retry past it.
        assert_eq!(prepare(&mut r, op(6, 1, 1), 150, &[], &[3]), Some(PrepareResult::Retry(201)));
        // Keys of another shard, or messages for another shard, are ignored.
        let mut two = {
            let topology = Topology { shards: vec![vec![NodeId(0)], vec![NodeId(1)]], leader: vec![0, 0] };
            Replica::new(&topology, &TapirConfig::default(), 0, 0)
        };
        assert_eq!(prepare(&mut two, op(7, 1, 1), 10, &[(1, 0)], &[1]), None);
        assert_eq!(two.stats().ignored, 1);
    }

    #[test]
    fn retransmissions_are_answered_from_the_record_and_finished_operations_are_ignored() {
        let mut r = replica(TapirConfig::default());
        let a = op(1, 1, 1);
        assert_eq!(prepare(&mut r, a, 50, &[(4, 0)], &[4]), Some(PrepareResult::Ok));
        // A retransmission gets the recorded answer (no second validation against itself).
        assert_eq!(prepare(&mut r, a, 50, &[(4, 0)], &[4]), Some(PrepareResult::Ok));
        assert_eq!(r.stats().prepare_ok, 1);
        // A newer round replaces the entry; the older round is then ignored.
        assert_eq!(prepare(&mut r, op(1, 1, 2), 60, &[(4, 0)], &[4]), Some(PrepareResult::Ok));
        assert_eq!(prepare(&mut r, a, 50, &[(4, 0)], &[4]), None);
        assert_eq!(r.prepared_count(), 1);
        // Abort drops it; a late prepare of the aborted operation does not bring it back.
        let done = deliver(&mut r, TapirMsg::Abort { op: op(1, 1, 2), shard: 0 });
        assert!(matches!(done[..], [TapirMsg::Done { .. }]));
        assert_eq!(r.prepared_count(), 0);
        assert_eq!(prepare(&mut r, op(1, 1, 2), 60, &[(4, 0)], &[4]), None);
        assert_eq!(r.prepared_count(), 0);
        // The next attempt is a new operation.
        assert_eq!(prepare(&mut r, op(1, 2, 1), 70, &[(4, 0)], &[4]), Some(PrepareResult::Ok));
        // Commit applies at the timestamp and is idempotent.
        commit(&mut r, op(1, 2, 1), 70, 4, 1);
        commit(&mut r, op(1, 2, 1), 70, 4, 1);
        assert_eq!((r.store().get(4).value, r.store().get(4).version, r.prepared_count()), (1, 70, 0));
        assert_eq!(r.stats().commits, 1);
    }

    #[test]
    fn a_finalized_prepare_ok_enters_the_prepared_list() {
        let mut r = replica(TapirConfig::default());
        assert_eq!(prepare(&mut r, op(1, 1, 1), 50, &[(4, 0)], &[4]), Some(PrepareResult::Ok));
        // Transaction 2 abstained here but was decided PREPARE-OK on the slow path elsewhere.
        assert_eq!(prepare(&mut r, op(2, 1, 1), 40, &[(5, 0)], &[4]), Some(PrepareResult::Retry(51)));
        let msg = TapirMsg::Finalize {
            op: op(2, 1, 1),
            shard: 0,
            ts: 40,
            reads: vec![(5, 0)],
            writes: vec![4],
            result: PrepareResult::Ok,
        };
        assert!(matches!(deliver(&mut r, msg)[..], [TapirMsg::FinalizeReply { .. }]));
        assert_eq!(r.prepared_count(), 2);
    }

    /// A restarted replica has lost its store: it must not validate (it would accept the stale
    /// read below) nor serve reads; it only acknowledges commits and aborts.
    #[test]
    fn a_restarted_replica_refuses_to_vote_or_serve_reads() {
        let topology = Topology { shards: vec![vec![NodeId(0), NodeId(1), NodeId(2)]], leader: vec![0] };
        let mut r = Replica::restarted(&topology, &TapirConfig::default(), 0, 1);
        assert!(r.is_recovering());
        // Version 0 of key 3 may well be stale (the lost store had a newer one): no vote.
        assert_eq!(prepare(&mut r, op(1, 1, 1), 50, &[(3, 0)], &[3]), None);
        let finalize = TapirMsg::Finalize {
            op: op(1, 1, 1),
            shard: 0,
            ts: 50,
            reads: vec![(3, 0)],
            writes: vec![3],
            result: PrepareResult::Ok,
        };
        assert!(deliver(&mut r, finalize).is_empty());
        assert!(deliver(&mut r, TapirMsg::Read { txn: op(2, 1, 1).txn, attempt: 1, keys: vec![3] }).is_empty());
        assert!(deliver(&mut r, TapirMsg::Ping { nonce: 1 }).is_empty(), "not a candidate for reads");
        assert_eq!(r.prepared_count(), 0);
        let done =
            deliver(&mut r, TapirMsg::Commit { op: op(3, 1, 1), shard: 0, ts: 9, reads: vec![], writes: vec![(3, 1)] });
        assert!(matches!(done[..], [TapirMsg::Done { .. }]));
        assert!(matches!(deliver(&mut r, TapirMsg::Abort { op: op(4, 1, 1), shard: 0 })[..], [TapirMsg::Done { .. }]));
        assert!(deliver(&mut r, TapirMsg::Abort { op: op(4, 1, 1), shard: 1 }).is_empty(), "another shard's");
        assert!(r.store().is_empty(), "nothing applied");
    }

    #[test]
    fn the_unsafe_switch_skips_the_prepared_checks() {
        let mut r = replica(TapirConfig { unsafe_skip_prepared_check: true, ..TapirConfig::default() });
        assert_eq!(prepare(&mut r, op(1, 1, 1), 50, &[(4, 0)], &[4]), Some(PrepareResult::Ok));
        assert_eq!(
            prepare(&mut r, op(2, 1, 1), 60, &[(4, 0)], &[4]),
            Some(PrepareResult::Ok),
            "the conflict goes unseen"
        );
    }
}
