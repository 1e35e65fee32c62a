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
//! # TPC-C: pieces run in the order of the versions read
//! IR applies commits in whatever order they arrive, which is right for the values of
//! MicroBench's keys (a version is a commit timestamp; the newest stays) but not for TPC-C's
//! pieces, which change rows in place and do not commute (two new-orders of a district take
//! consecutive order ids). A commit that carries pieces therefore runs them, and writes its
//! keys, only once this replica's store holds, for every key it writes, exactly the version
//! the transaction read; until then it is *held* (decided and acknowledged, its prepared entry
//! kept so that conflicting prepares here still abstain or retry), and the commit that writes
//! the awaited version releases it.
//!
//! Why that order exists and is the serial order: the transaction reads every key it writes,
//! and TAPIR-OCC commits transactions serializably in timestamp order, so on each key the
//! committed writers form a chain in which each read the version the previous one wrote. A
//! replica that applies the chain link by link runs every piece on the rows the transaction
//! saw, as the serial execution does. A commit whose timestamp is not past a key's version
//! here was applied already (a late duplicate); one that finds a key at a version between the
//! one it read and its own timestamp would break the chain, which TAPIR-OCC rules out: it is
//! counted (`pieces_out_of_order`) and reported by the replica's invariant.
//!
//! A predecessor whose commit never comes (its coordinator crashed, or gave up delivering it)
//! holds its successors here for good; the replica then lags behind on those keys as it would
//! on their values without pieces (its reads are stale and abort), and the end-of-run checks
//! compare only replicas that applied as much.
//!
//! # Durable state: a journal of the messages that change it
//! A replica that forgot its store, prepared list and IR record and answered as if fresh would
//! be unsafe: its validation would accept stale reads, and together with one other replica that
//! missed the latest commit it would form f + 1 PREPARE-OKs on the slow path (a stale read
//! committed). So every prepare, finalize, commit and abort for this shard is journaled
//! ([`Ctx::persist`]) before the replica answers it, and its handling depends only on the
//! replica's state and the message (no clock, no randomness): a restarted replica replays the
//! journal ([`Process::on_recover`]) and is exactly the replica that crashed, as if it had been
//! slow. After `max(4096, size of the state)` records the whole state is written as one
//! snapshot instead. This takes the place of IR's replica recovery (fetching the record from
//! f + 1 replicas in a view change), which a replica with a disk does not need; a replica
//! whose disk is lost is not detected (the history checker catches what follows, see
//! `tests/tapir.rs`).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use kairos_core::{Ctx, LocalTime, NodeId, Process, Rng, Stored, TimerId};
use kairos_workload::txn::{Key, ShardId, Ts, TxnId, Value};
use kairos_workload::{Pieces, Topology};
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

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
    /// Messages ignored: malformed, for another shard, stale operations, over a limit.
    pub ignored: u64,
    /// Journal records replayed at the last restart.
    pub replayed: u64,
    /// Journal records a restart could not decode (written by another version of Kairos).
    pub journal_unreadable: u64,
    /// Commits that had to wait for a predecessor's before running their pieces.
    pub commits_held: u64,
    /// Commits that found a key at a version between the one they read and their own
    /// timestamp (module docs: impossible under TAPIR-OCC; the invariant reports it).
    pub pieces_out_of_order: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Prepared {
    op: OpId,
    ts: Ts,
    reads: Vec<Key>,
    writes: Vec<Key>,
}

/// A committed transaction whose pieces wait for the versions it read (module docs).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Held {
    op: OpId,
    ts: Ts,
    reads: Vec<(Key, Ts)>,
    writes: Vec<(Key, Value)>,
    pieces: Pieces,
}

/// Where a commit with pieces stands against this replica's store (module docs).
enum Order {
    /// Every written key is at the version read: run it now.
    Next,
    /// This key is not yet at the version read (which follows).
    Waits(Key, Ts),
    /// Every written key is at or past the commit's timestamp: it ran here already.
    Ran,
    /// A written key is past the version read but before the commit: the chain is broken.
    Broken,
}

/// How a transaction attempt ended at a replica (the cross-replica check compares them: every
/// replica of every shard the attempt touched must decide it alike).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Committed(Ts),
    Aborted,
}

/// Decisions a replica keeps for the cross-replica check ([`Replica::decisions_since`]).
const DECISIONS_KEPT: usize = 4_096;

/// IR's record of a transaction's newest consensus operation.
#[derive(Copy, Clone, Debug, Serialize, Deserialize)]
struct Record {
    op: OpId,
    result: PrepareResult,
}

/// Handlers between two checks of the prepared-key indexes ([`Replica::check_indexes`]), at
/// least (see `invariants`).
const INDEX_CHECK_EVERY: u32 = 64;

/// Journal records between two snapshots, at least (module docs).
const RECORDS_PER_SNAPSHOT: usize = 4_096;

/// The state a replica journals (module docs); a snapshot is all of it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct State {
    store: Store,
    /// Key → the largest commit timestamp of a committed transaction that read it.
    last_read: BTreeMap<Key, Ts>,
    prepared: BTreeMap<TxnId, Prepared>,
    records: BTreeMap<TxnId, Record>,
    done: BTreeMap<TxnId, OpId>,
    done_order: VecDeque<TxnId>,
    held: BTreeMap<TxnId, Held>,
}

/// See the module docs.
pub struct Replica {
    shard: ShardId,
    replica: u32,
    shard_count: usize,
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
    /// Committed transactions whose pieces wait (module docs), and the index of what each
    /// waits for: (key, version) → the transactions waiting for that key to reach it.
    held: BTreeMap<TxnId, Held>,
    waiting: BTreeMap<(Key, Ts), Vec<TxnId>>,
    /// Journal records written since the last snapshot.
    journaled: usize,
    /// The latest decisions, in the order taken, and how many were ever taken (not journaled:
    /// replaying the journal takes them again).
    decisions: VecDeque<(OpId, Decision)>,
    decisions_taken: u64,
    stats: ReplicaStats,
    /// Handlers since the indexes were last checked (the check is amortized; see `invariants`).
    handlers_since_check: std::cell::Cell<u32>,
}

impl Replica {
    /// The shard store, to give it a TPC-C shard's warehouses before the server starts.
    pub fn store_mut(&mut self) -> &mut Store {
        &mut self.store
    }

    pub fn new(topology: &Topology, config: &TapirConfig, shard: ShardId, replica: u32) -> Self {
        Replica {
            shard,
            replica,
            shard_count: topology.shard_count(),
            config: config.clone(),
            store: Store::default(),
            last_read: BTreeMap::new(),
            prepared: BTreeMap::new(),
            prepared_reads: BTreeMap::new(),
            prepared_writes: BTreeMap::new(),
            records: BTreeMap::new(),
            done: BTreeMap::new(),
            done_order: VecDeque::new(),
            held: BTreeMap::new(),
            waiting: BTreeMap::new(),
            journaled: 0,
            decisions: VecDeque::new(),
            decisions_taken: 0,
            stats: ReplicaStats::default(),
            handlers_since_check: std::cell::Cell::new(0),
        }
    }

    /// The journaled state, for a snapshot.
    fn state(&self) -> State {
        State {
            store: self.store.clone(),
            last_read: self.last_read.clone(),
            prepared: self.prepared.clone(),
            records: self.records.clone(),
            done: self.done.clone(),
            done_order: self.done_order.clone(),
            held: self.held.clone(),
        }
    }

    /// Takes `s` as the state, rebuilding the prepared-key indexes from the prepared list and
    /// the waiting index from the held commits.
    fn restore(&mut self, s: State) {
        (self.store, self.last_read, self.records, self.done, self.done_order) =
            (s.store, s.last_read, s.records, s.done, s.done_order);
        self.prepared.clear();
        self.prepared_reads.clear();
        self.prepared_writes.clear();
        for p in s.prepared.into_values() {
            self.prepare(p.op, p.ts, p.reads, p.writes);
        }
        self.waiting.clear();
        self.held = s.held;
        for (txn, h) in &self.held {
            if let Order::Waits(k, v) = self.order(h) {
                self.waiting.entry((k, v)).or_default().push(*txn);
            }
        }
    }

    /// Journals `msg` (already handled), or the whole state once the journal is long.
    fn journal(&mut self, ctx: &mut Ctx<'_, TapirMsg>, msg: &TapirMsg) {
        let size = self.store.len() + self.prepared.len() + self.records.len() + self.done.len() + self.held.len();
        if self.journaled >= RECORDS_PER_SNAPSHOT.max(size) {
            if let Ok(bytes) = postcard::to_allocvec(&self.state()) {
                ctx.persist_snapshot(bytes);
                self.journaled = 0;
                return;
            }
        }
        if let Ok(bytes) = postcard::to_allocvec(msg) {
            ctx.persist(bytes);
            self.journaled += 1;
        }
    }

    pub fn stats(&self) -> &ReplicaStats {
        &self.stats
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The decisions taken since the first `taken` (those still kept: the last
    /// `DECISIONS_KEPT`), and how many were ever taken. A restarted replica counts again
    /// from 0.
    pub fn decisions_since(&self, taken: u64) -> (impl Iterator<Item = &(OpId, Decision)>, u64) {
        let kept_from = self.decisions_taken - self.decisions.len() as u64;
        let skip = taken.saturating_sub(kept_from).min(self.decisions.len() as u64) as usize;
        (self.decisions.iter().skip(skip), self.decisions_taken)
    }

    /// How many decisions this replica took since it started (or restarted).
    pub fn decisions_taken(&self) -> u64 {
        self.decisions_taken
    }

    fn decide(&mut self, op: OpId, decision: Decision) {
        if self.decisions.len() == DECISIONS_KEPT {
            self.decisions.pop_front();
        }
        self.decisions.push_back((op, decision));
        self.decisions_taken += 1;
    }

    /// Transactions in the prepared list.
    pub fn prepared_count(&self) -> usize {
        self.prepared.len()
    }

    /// Committed transactions whose pieces wait for a predecessor's commit (module docs).
    pub fn held_count(&self) -> usize {
        self.held.len()
    }

    fn ignore(&mut self, ctx: &mut Ctx<'_, TapirMsg>) {
        self.stats.ignored += 1;
        ctx.metric("tapir.replica_ignored", 1);
    }

    /// Keys must belong to this shard and be few.
    fn keys_ok(&self, keys: impl ExactSizeIterator<Item = Key> + Clone) -> bool {
        keys.len() <= self.config.keys_max
            && keys.clone().all(|k| kairos_workload::shard_of(k, self.shard_count) == self.shard)
            && {
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

    /// The prepared-key indexes that TAPIR-OCC-CHECK reads agree with the prepared table:
    /// every prepared transaction is listed under each key it reads and writes, at its
    /// timestamp, and nothing else is listed (a stale entry would block or admit the wrong
    /// transactions). Linear in the prepared table, which `prepared_max` bounds.
    fn check_indexes(&self) -> Result<(), String> {
        for (index, name, keys_of) in [
            (&self.prepared_reads, "read", (|p: &Prepared| &p.reads) as fn(&Prepared) -> &Vec<Key>),
            (&self.prepared_writes, "write", |p: &Prepared| &p.writes),
        ] {
            let mut expected = 0;
            for (txn, p) in &self.prepared {
                let keys: BTreeSet<&Key> = keys_of(p).iter().collect();
                expected += keys.len();
                if let Some(k) = keys.into_iter().find(|k| !index.get(k).is_some_and(|set| set.contains(&(p.ts, *txn))))
                {
                    return Err(format!("prepared {txn:?} at {} is missing from the {name} index of key {k}", p.ts));
                }
            }
            let listed: usize = index.values().map(BTreeSet::len).sum();
            if listed != expected || index.values().any(BTreeSet::is_empty) {
                return Err(format!(
                    "the {name} index lists {listed} (timestamp, transaction) entries; the prepared table has \
                     {expected}"
                ));
            }
        }
        // Every held commit waits under exactly the (key, version) it needs next.
        for (txn, c) in &self.held {
            let Order::Waits(k, v) = self.order(c) else {
                return Err(format!("held {txn:?} at {} could run, but waits", c.ts));
            };
            if !self.waiting.get(&(k, v)).is_some_and(|w| w.contains(txn)) {
                return Err(format!("held {txn:?} at {} is not indexed under key {k} at version {v}", c.ts));
            }
        }
        let indexed: usize = self.waiting.values().map(Vec::len).sum();
        if indexed != self.held.len() {
            return Err(format!("the waiting index lists {indexed} commits; {} are held", self.held.len()));
        }
        Ok(())
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
        for k in writes.iter().filter(|_| !self.config.unsafe_unindexed_writes) {
            self.prepared_writes.entry(*k).or_default().insert((ts, op.txn));
        }
        self.prepared.insert(op.txn, Prepared { op, ts, reads, writes });
    }

    /// TAPIR-OCC-CHECK (module docs). The transaction's own earlier entry is already gone.
    /// The commit timestamp of `k`'s latest version (the shared store's version number).
    fn committed_at(&self, k: Key) -> Ts {
        Ts::from_nanos(self.store.get(k).version)
    }

    fn occ_check(&self, txn: TxnId, ts: Ts, reads: &[(Key, Ts)], writes: &[Key]) -> PrepareResult {
        let check_prepared = !self.config.unsafe_skip_prepared_check;
        let others = |set: Option<&BTreeSet<(Ts, TxnId)>>| {
            set.into_iter().flatten().filter(move |(_, t)| *t != txn).map(|(ts, _)| *ts).max()
        };
        for &(k, version) in reads {
            if version < self.committed_at(k) {
                return PrepareResult::Abort;
            }
            if check_prepared && others(self.prepared_writes.get(&k)).is_some() {
                return PrepareResult::Abstain;
            }
        }
        let mut retry: Option<Ts> = None;
        for &k in writes {
            let mut bound = self.committed_at(k).max(self.last_read.get(&k).copied().unwrap_or(Ts::ZERO));
            if check_prepared {
                bound = bound.max(others(self.prepared_reads.get(&k)).unwrap_or(Ts::ZERO));
                bound = bound.max(others(self.prepared_writes.get(&k)).unwrap_or(Ts::ZERO));
            }
            if ts <= bound {
                retry = retry.max(Some(bound.next()));
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

    /// Applies a commit, or holds it until its pieces can run (module docs). Returns whether
    /// it was taken (false: too many are held; it stays unacknowledged and comes again).
    fn on_commit(&mut self, ctx: &mut Ctx<'_, TapirMsg>, c: Held) -> bool {
        let writes_rows = !c.pieces.is_empty() && !c.writes.is_empty();
        if writes_rows && (self.finished(c.op) || self.held.contains_key(&c.op.txn)) {
            // A retransmission: its pieces ran or wait here already.
            return true;
        }
        let ordered = writes_rows && !self.config.unsafe_pieces_in_arrival_order;
        if ordered && self.held.len() >= self.config.held_max {
            self.ignore(ctx);
            return false;
        }
        for &(k, _) in &c.reads {
            let r = self.last_read.entry(k).or_insert(Ts::ZERO);
            *r = (*r).max(c.ts);
        }
        if !self.finished(c.op) {
            self.stats.commits += 1;
            self.decide(c.op, Decision::Committed(c.ts));
        }
        self.records.remove(&c.op.txn);
        self.mark_done(c.op);
        ctx.metric("tapir.replica_commits", 1);
        if !ordered {
            for &(k, v) in &c.writes {
                self.store.put(k, v, c.ts.as_nanos());
            }
            self.run_pieces(&c);
            self.unprepare(c.op.txn);
            return true;
        }
        let txn = c.op.txn;
        self.held.insert(txn, c);
        self.release(txn);
        if self.held.contains_key(&txn) {
            self.stats.commits_held += 1;
            ctx.metric("tapir.commits_held", 1);
        }
        true
    }

    /// Where held commit `c` stands against the store (its written keys were checked to be
    /// among those it read).
    fn order(&self, c: &Held) -> Order {
        let (mut ran, mut waits) = (0, None);
        for &(k, _) in &c.writes {
            let read = c.reads.iter().find(|(r, _)| *r == k).map_or(Ts::ZERO, |(_, v)| *v);
            let at = self.committed_at(k);
            if at >= c.ts {
                ran += 1;
            } else if at > read {
                return Order::Broken;
            } else if at < read {
                waits = waits.or(Some((k, read)));
            }
        }
        match (ran, waits) {
            (0, None) => Order::Next,
            (0, Some((k, v))) => Order::Waits(k, v),
            (n, None) if n == c.writes.len() => Order::Ran,
            _ => Order::Broken,
        }
    }

    /// Runs held commit `txn` if its turn has come, then every held commit that this makes
    /// next, in turn.
    fn release(&mut self, txn: TxnId) {
        let mut ready = vec![txn];
        while let Some(txn) = ready.pop() {
            let Some(c) = self.held.get(&txn) else { continue };
            let run = match self.order(c) {
                Order::Waits(k, v) => {
                    self.waiting.entry((k, v)).or_default().push(txn);
                    continue;
                }
                Order::Next => true,
                Order::Ran => false,
                // Reported by the invariant; applied so that nothing stays held for it.
                Order::Broken => {
                    self.stats.pieces_out_of_order += 1;
                    true
                }
            };
            let Some(c) = self.held.remove(&txn) else { continue };
            if run {
                for &(k, v) in &c.writes {
                    self.store.put(k, v, c.ts.as_nanos());
                }
                self.run_pieces(&c);
                for &(k, _) in &c.writes {
                    ready.extend(self.waiting.remove(&(k, c.ts)).into_iter().flatten());
                }
            }
            self.unprepare(txn);
        }
    }

    /// Runs a commit's pieces for this replica's warehouses.
    fn run_pieces(&mut self, c: &Held) {
        if !c.pieces.is_empty() {
            let keys: Vec<Key> = c.reads.iter().map(|(k, _)| *k).collect();
            self.store.run_pieces(&c.pieces, &keys);
        }
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
            self.decide(op, Decision::Aborted);
        }
        self.mark_done(op);
    }
}

impl Process for Replica {
    type Msg = TapirMsg;

    fn on_start(&mut self, _ctx: &mut Ctx<'_, TapirMsg>) {}

    fn on_message(&mut self, ctx: &mut Ctx<'_, TapirMsg>, from: NodeId, msg: TapirMsg) {
        let durable = match &msg {
            TapirMsg::Prepare { shard, .. }
            | TapirMsg::Finalize { shard, .. }
            | TapirMsg::Commit { shard, .. }
            | TapirMsg::Abort { shard, .. } => *shard == self.shard,
            _ => false,
        };
        let copy = durable.then(|| msg.clone());
        self.handle(ctx, from, msg);
        if let Some(msg) = copy {
            self.journal(ctx, &msg);
        }
    }

    fn on_timer(&mut self, _ctx: &mut Ctx<'_, TapirMsg>, _timer: TimerId) {}

    /// The prepared-key indexes agree with the prepared table (`Replica::check_indexes`),
    /// checked after every 64th handler, or every n-th with n prepared transactions if more: the
    /// check is linear in the prepared table, so this keeps its cost per handler constant (run
    /// after every handler it took most of a Tapir run's time; every 64th, 82% of a run's time
    /// past saturation, where thousands of transactions stay prepared).
    fn invariants(&self) -> Result<(), String> {
        if self.stats.pieces_out_of_order > 0 {
            return Err(format!(
                "{} commits found a key past the version they read and before their timestamp: TPC-C pieces ran \
                 out of the serial order",
                self.stats.pieces_out_of_order
            ));
        }
        let n = self.handlers_since_check.get() + 1;
        let every = INDEX_CHECK_EVERY.max(u32::try_from(self.prepared.len().max(self.held.len())).unwrap_or(u32::MAX));
        if n < every {
            self.handlers_since_check.set(n);
            return Ok(());
        }
        self.handlers_since_check.set(0);
        self.check_indexes()
    }

    /// The last snapshot, then every journaled message since, handled again with their
    /// answers dropped (module docs). Replay stops at a record that does not decode.
    fn on_recover(&mut self, stored: &Stored) {
        match stored.snapshot.as_deref().map(postcard::from_bytes::<State>) {
            Some(Ok(s)) => self.restore(s),
            Some(Err(_)) => self.stats.journal_unreadable += 1,
            None => {}
        }
        let mut rng = Rng::seed_from_u64(0);
        let mut dropped = Vec::new();
        for record in &stored.records {
            let Ok(msg) = postcard::from_bytes::<TapirMsg>(record) else {
                self.stats.journal_unreadable += 1;
                break;
            };
            let mut ctx = Ctx::new(NodeId(u32::MAX), LocalTime::ZERO, &mut rng, &mut dropped);
            self.handle(&mut ctx, NodeId(u32::MAX), msg);
            dropped.clear();
            self.stats.replayed += 1;
        }
        self.journaled = stored.records.len();
    }
}

impl Replica {
    /// Handles one message; depends only on the state and the message (module docs).
    fn handle(&mut self, ctx: &mut Ctx<'_, TapirMsg>, from: NodeId, msg: TapirMsg) {
        let (shard, replica) = (self.shard, self.replica);
        match msg {
            TapirMsg::Ping { nonce } => ctx.send(from, TapirMsg::Pong { nonce, shard, replica }),
            TapirMsg::PreRead(request) => {
                if let Some(answer) = self.store.answer_pre_read(request) {
                    ctx.send(from, TapirMsg::PreReadAnswer(answer));
                }
            }
            TapirMsg::Read { txn, attempt, keys } => {
                if !self.keys_ok(keys.iter().copied()) {
                    return self.ignore(ctx);
                }
                self.stats.reads += 1;
                let values = keys
                    .iter()
                    .map(|&key| {
                        let v = self.store.get(key);
                        ReadResult { key, value: v.value, version: Ts::from_nanos(v.version) }
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
            TapirMsg::Commit { op, shard: s, ts, reads, writes, pieces } => {
                let read = |k: Key| reads.iter().any(|(r, _)| *r == k);
                if s != shard
                    || !self.keys_ok(reads.iter().map(|(k, _)| *k))
                    || !self.keys_ok(writes.iter().map(|(k, _)| *k))
                    || !writes.iter().all(|(k, _)| read(*k))
                {
                    return self.ignore(ctx);
                }
                if self.on_commit(ctx, Held { op, ts, reads, writes, pieces }) {
                    ctx.send(from, TapirMsg::Done { op, shard, replica });
                }
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
            | TapirMsg::Done { .. }
            | TapirMsg::PreReadAnswer(_) => self.ignore(ctx),
        }
    }
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

    /// Timestamps and versions in tests are written as bare nanoseconds.
    fn t(ns: u64) -> Ts {
        Ts::from_nanos(ns)
    }

    fn prepare(r: &mut Replica, op: OpId, ts: u64, reads: &[(Key, u64)], writes: &[Key]) -> Option<PrepareResult> {
        deliver(r, prepare_msg(op, ts, reads, writes)).into_iter().find_map(|m| {
            if let TapirMsg::PrepareReply { result, .. } = m {
                Some(result)
            } else {
                None
            }
        })
    }

    fn commit(r: &mut Replica, op: OpId, ts: u64, key: Key, value: Value) {
        let (reads, writes, pieces) = (vec![(key, Ts::ZERO)], vec![(key, value)], Pieces::default());
        deliver(r, TapirMsg::Commit { op, shard: 0, ts: t(ts), reads, writes, pieces });
    }

    #[test]
    fn occ_check_returns_each_result_of_the_paper() {
        let mut r = replica(TapirConfig::default());
        commit(&mut r, op(1, 1, 1), 100, 3, 7);
        assert_eq!(r.store().get(3).version, 100);
        // A read of the version before 100 is stale.
        assert_eq!(prepare(&mut r, op(2, 1, 1), 150, &[(3, 0)], &[3]), Some(PrepareResult::Abort));
        // A write at a timestamp not past the committed read and version must retry later.
        assert_eq!(prepare(&mut r, op(3, 1, 1), 90, &[(3, 100)], &[3]), Some(PrepareResult::Retry(t(101))));
        // Valid: prepared.
        assert_eq!(prepare(&mut r, op(4, 1, 1), 200, &[(3, 100)], &[3]), Some(PrepareResult::Ok));
        assert_eq!(r.prepared_count(), 1);
        // Another transaction reading key 3 meets the prepared write: abstain.
        assert_eq!(prepare(&mut r, op(5, 1, 1), 300, &[(3, 100)], &[3]), Some(PrepareResult::Abstain));
        // A blind write below the prepared read's timestamp must retry past it.
        assert_eq!(prepare(&mut r, op(6, 1, 1), 150, &[], &[3]), Some(PrepareResult::Retry(t(201))));
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
        assert_eq!(prepare(&mut r, op(2, 1, 1), 40, &[(5, 0)], &[4]), Some(PrepareResult::Retry(t(51))));
        let msg = TapirMsg::Finalize {
            op: op(2, 1, 1),
            shard: 0,
            ts: t(40),
            reads: vec![(5, t(0))],
            writes: vec![4],
            result: PrepareResult::Ok,
        };
        assert!(matches!(deliver(&mut r, msg)[..], [TapirMsg::FinalizeReply { .. }]));
        assert_eq!(r.prepared_count(), 2);
    }

    /// Delivers `msg` and applies what the replica persisted to `stored`, as a host does.
    fn deliver_stored(r: &mut Replica, stored: &mut Stored, msg: TapirMsg) -> Vec<TapirMsg> {
        let mut rng = Rng::seed_from_u64(1);
        let mut effects = Vec::new();
        r.on_message(&mut Ctx::new(NodeId(1), LocalTime::ZERO, &mut rng, &mut effects), COORD, msg);
        let mut sent = Vec::new();
        for e in effects {
            match e {
                Effect::Persist(p) => stored.apply(p),
                Effect::Send { msg, .. } => sent.push(msg),
                _ => {}
            }
        }
        sent
    }

    fn prepare_msg(op: OpId, ts: u64, reads: &[(Key, u64)], writes: &[Key]) -> TapirMsg {
        let reads = reads.iter().map(|(k, v)| (*k, t(*v))).collect();
        TapirMsg::Prepare { op, shard: 0, ts: t(ts), reads, writes: writes.to_vec() }
    }

    /// A restarted replica replays its journal and is the replica that crashed: it rejects a
    /// stale read, keeps its prepared list and answers a retransmission as before, also after
    /// the journal was compacted into a snapshot. Negative control: a replica whose disk was
    /// wiped accepts the stale read.
    #[test]
    fn a_restarted_replica_replays_its_journal_and_votes_as_before() {
        let topology = Topology { shards: vec![vec![NodeId(0), NodeId(1), NodeId(2)]], leader: vec![0] };
        // A short memory of finished transactions keeps the state small, so the journal
        // compacts after RECORDS_PER_SNAPSHOT records.
        let config = TapirConfig { done_max: 100, ..TapirConfig::default() };
        let mut stored = Stored::default();
        let mut r = Replica::new(&topology, &config, 0, 1);
        let (reads, writes, pieces) = (vec![(3, Ts::ZERO)], vec![(3, 7)], Pieces::default());
        let commit = TapirMsg::Commit { op: op(1, 1, 1), shard: 0, ts: t(9), reads, writes, pieces };
        deliver_stored(&mut r, &mut stored, commit);
        let answer = deliver_stored(&mut r, &mut stored, prepare_msg(op(2, 1, 1), 20, &[(3, 9)], &[3]));
        assert!(matches!(answer[..], [TapirMsg::PrepareReply { result: PrepareResult::Ok, .. }]), "{answer:?}");
        deliver_stored(&mut r, &mut stored, TapirMsg::Ping { nonce: 5 });
        assert_eq!(stored.records.len(), 2, "pings are not journaled");

        let mut back = Replica::new(&topology, &config, 0, 1);
        back.on_recover(&stored);
        assert_eq!((back.stats().replayed, back.prepared_count(), back.store().get(3).value), (2, 1, 7));
        // A stale read of key 3 (version 0 < 9) aborts, as on the replica that crashed.
        assert_eq!(prepare(&mut back, op(3, 1, 1), 30, &[(3, 0)], &[4]), Some(PrepareResult::Abort));
        // The retransmitted prepare gets the recorded answer.
        let again = deliver(&mut back, prepare_msg(op(2, 1, 1), 20, &[(3, 9)], &[3]));
        assert_eq!(again, answer);

        // Compaction: thousands of commits later the journal is a snapshot plus a short tail.
        for i in 0..5_000u64 {
            let c = TapirMsg::Commit {
                op: op(100 + i as u32, 1, 1),
                shard: 0,
                ts: t(100 + i),
                reads: vec![(i % 10, Ts::ZERO)],
                writes: vec![(i % 10, i)],
                pieces: Pieces::default(),
            };
            deliver_stored(&mut r, &mut stored, c);
        }
        assert!(stored.snapshot.is_some() && stored.records.len() < 5_000, "{}", stored.records.len());
        let mut compacted = Replica::new(&topology, &config, 0, 1);
        compacted.on_recover(&stored);
        assert_eq!(compacted.stats().journal_unreadable, 0);
        assert_eq!((compacted.prepared_count(), compacted.store().len()), (r.prepared_count(), r.store().len()));
        assert_eq!(compacted.store().get(9).value, 4_999);
        assert_eq!(prepare(&mut compacted, op(3, 1, 1), 30, &[(3, 0)], &[4]), Some(PrepareResult::Abort));

        let mut wiped = Replica::new(&topology, &config, 0, 1);
        wiped.on_recover(&Stored::default());
        assert_eq!(prepare(&mut wiped, op(3, 1, 1), 30, &[(3, 0)], &[4]), Some(PrepareResult::Ok));
    }

    /// The index invariant can fail: a replica whose write index lost a prepared transaction
    /// (which would let a conflicting write prepare) or kept a finished one (which would block
    /// its keys for good) breaks it; the replica as it runs does not.
    #[test]
    fn prepared_indexes_that_disagree_with_the_prepared_table_break_the_invariant() {
        let two_prepared = || {
            let mut r = replica(TapirConfig::default());
            assert_eq!(prepare(&mut r, op(1, 0, 0), 10, &[(5, 0)], &[5, 6]), Some(PrepareResult::Ok));
            assert_eq!(prepare(&mut r, op(2, 0, 0), 11, &[(7, 0)], &[7]), Some(PrepareResult::Ok));
            r
        };
        let mut r = two_prepared();
        assert_eq!(r.check_indexes(), Ok(()));
        let mut lost = two_prepared();
        lost.prepared_writes.remove(&6);
        assert!(lost.check_indexes().unwrap_err().contains("missing from the write index of key 6"));
        let mut kept = two_prepared();
        kept.prepared.remove(&op(2, 0, 0).txn);
        assert!(kept.check_indexes().unwrap_err().contains("the read index lists 2"));
        commit(&mut r, op(1, 0, 1), 10, 5, 50);
        assert_eq!(r.check_indexes(), Ok(()), "a commit takes the transaction out of both indexes");
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

    /// Two new-orders of one district (consecutive order ids: their pieces do not commute)
    /// reach two replicas in opposite orders. The one that gets the second first holds it
    /// until the first arrives; both end with the same rows. A late duplicate changes nothing,
    /// and a replica restarted while holding one holds it again after its replay.
    #[test]
    fn commits_with_pieces_run_in_the_order_of_the_versions_read() {
        use kairos_workload::tpcc::input::NewOrderLine;
        use kairos_workload::tpcc::piece::{Piece, Step};
        use kairos_workload::tpcc::{ConflictKey, TpccScale};
        let topology = Topology { shards: vec![vec![NodeId(0), NodeId(1), NodeId(2)]], leader: vec![0] };
        let scale = TpccScale::small(1, 100);
        let key = ConflictKey::DistrictOrders { w: 0, d: 0 }.encode(&scale);
        let fresh = || {
            let mut r = Replica::new(&topology, &TapirConfig::default(), 0, 1);
            *r.store_mut() = Store::tpcc(&scale, 7, 0, 1);
            r
        };
        let new_order = |seq: u32, customer: u32, read: u64, ts: u64| {
            let lines = vec![NewOrderLine { item: 3, supply_w: 0, quantity: 2 }];
            let piece = Piece { w: 0, steps: vec![Step::NewOrder { d: 0, customer, lines, date: ts }] };
            let (reads, writes) = (vec![(key, t(read))], vec![(key, read + 1)]);
            TapirMsg::Commit { op: op(seq, 1, 1), shard: 0, ts: t(ts), reads, writes, pieces: vec![piece].into() }
        };
        let (first, second) = (new_order(1, 4, 0, 10), new_order(2, 5, 10, 20));

        let mut in_order = fresh();
        deliver(&mut in_order, first.clone());
        deliver(&mut in_order, second.clone());
        let mut reversed = fresh();
        let mut stored = Stored::default();
        let done = deliver_stored(&mut reversed, &mut stored, second.clone());
        assert!(matches!(done[..], [TapirMsg::Done { .. }]), "a held commit is acknowledged: {done:?}");
        assert_eq!((reversed.held_count(), reversed.store().get(key).version), (1, 0));
        assert!(!reversed.store().same_data(in_order.store()));

        let mut restarted = fresh();
        restarted.on_recover(&stored);
        assert_eq!(restarted.held_count(), 1);
        for r in [&mut reversed, &mut restarted] {
            deliver(r, first.clone());
            assert_eq!((r.held_count(), r.store().get(key).version, r.stats().commits_held), (0, 20, 1));
            assert!(r.store().same_data(in_order.store()));
            deliver(r, first.clone());
            deliver(r, second.clone());
            assert!(r.store().same_data(in_order.store()), "duplicates change nothing");
            assert_eq!(r.invariants(), Ok(()));
        }
        // The negative control of the rule: run as they arrive, the rows differ.
        let config = TapirConfig { unsafe_pieces_in_arrival_order: true, ..TapirConfig::default() };
        let mut unordered = Replica::new(&topology, &config, 0, 1);
        *unordered.store_mut() = Store::tpcc(&scale, 7, 0, 1);
        deliver(&mut unordered, second);
        deliver(&mut unordered, first);
        assert!(!unordered.store().same_data(in_order.store()));
    }
}
