//! A shard replica of 2PL+Paxos / OCC+Paxos: a Multi-Paxos log replica, the shard store
//! applied from it, and — on the ready leader — the concurrency control (see the parent
//! module's docs).
//!
//! Every replica applies the committed log: prepare records enter `prepared`, commit records
//! apply their writes (version = slot + 1) and, like abort records, move the attempt to the
//! bounded `done` memory of *logged* outcomes. Applying a record depends only on the log (a
//! prepare record is skipped only when a commit or abort record of the attempt precedes it), so
//! every replica builds the same store. Aborts a leader decides alone (refusals, no votes,
//! wounds) go to a separate bounded `unlogged` memory that only answers requests (it makes them
//! at-most-once) and never influences applying. Only the leader keeps `active` attempts and the
//! lock table; it rebuilds them from `prepared` when it becomes ready and drops them when it
//! loses leadership.
//!
//! A one-phase record (a single-shard attempt) is prepare and decision at once: applying it
//! commits or aborts the attempt by the deterministic rule of the parent module's docs, and the
//! leader that proposed it answers its `Vote` then.
//!
//! Aborts need no log record while the shard has had one leader: an attempt the leader refuses
//! or votes no on was never prepared. After a leadership change, an abort the leader decides
//! alone is logged too (on the coordinator's `Decide(abort)`): an earlier leader may have
//! proposed a prepare record for the attempt that a later election could still recover, and
//! the abort record after it keeps every replica from holding the attempt prepared forever.

use super::{Cc, ClassicConfig, Record, TxnKey, TxnMsg};
use crate::store::Store;
use kairos_consensus::paxos::{Ballot, MultiPaxos};
use kairos_core::{Ctx, NodeId, Process, Stored, Timer, TimerId};
use kairos_workload::txn::{Key, ShardId, Value};
use kairos_workload::{reads_only, Pieces, Topology};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

kairos_core::timers! {
    /// A 2PC server's timers (both its shard log's).
    pub enum ServerTimer {
        /// The Multi-Paxos tick.
        PaxosTick = 1,
        /// The shard log's batch timer ([`kairos_consensus::paxos::PaxosConfig::batch_interval`]).
        PaxosBatch = 2,
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    /// 2PL: waiting for `missing` more locks.
    Waiting { missing: usize },
    /// 2PL: holds its locks; values sent.
    Locked,
    /// The prepare record is proposed in `ballot`, not yet committed. The leader votes yes only
    /// if it is still the ready leader of that ballot when the record is applied.
    Preparing { ballot: Ballot },
    /// The prepare record is committed (vote yes sent).
    Prepared,
    /// Prepared in the log before this leader was ready (an earlier leader's record): it holds
    /// its keys until decided, but this leader votes no for it — the record may come from a
    /// deposed leader that locked or validated against stale state, and only a leader that
    /// proposed and committed a record in its own ballot may vote yes for it.
    Recovered,
    /// A commit (`commit`) or abort record is proposed.
    Deciding { commit: bool },
}

#[derive(Clone, Debug)]
struct Active {
    /// (age, attempt): smaller is older. NCC: (timestamp, attempt).
    prio: (u64, TxnKey),
    /// Asked to commit in one phase (its outcome is its one-phase record's, no `Decide`).
    one_phase: bool,
    /// The keys it locks.
    keys: Vec<Key>,
    /// 2PL: its locks are shared (it only reads); otherwise exclusive.
    shared: bool,
    state: State,
    /// NCC: the values it read (sent with `Executed`), when its `Execute` arrived, and its
    /// pieces (TPC-C) to prepare with its writes.
    values: Vec<(Key, Value)>,
    arrival_ns: u64,
    pieces: Pieces,
}

impl Active {
    fn new(prio: (u64, TxnKey), one_phase: bool, keys: Vec<Key>, state: State) -> Self {
        Active {
            prio,
            one_phase,
            keys,
            shared: false,
            state,
            values: Vec::new(),
            arrival_ns: 0,
            pieces: Pieces::default(),
        }
    }
}

#[derive(Clone, Debug, Default)]
struct KeyLock {
    /// One exclusive holder, or shared holders; attempts recovered prepared from the log may
    /// share a key.
    holders: BTreeSet<TxnKey>,
    /// By (age, attempt): the oldest is granted first.
    waiters: BTreeSet<(u64, TxnKey)>,
}

/// How an attempt ended in the log (a commit or abort record was applied).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Outcome {
    Committed,
    Aborted,
}

#[derive(Clone, Debug)]
struct Prepared {
    keys: Vec<Key>,
    writes: Vec<(Key, Value)>,
    /// TPC-C's pieces, run when the attempt commits.
    pieces: Pieces,
    /// NCC: the timestamp the writes commit at (0 for 2PL and OCC).
    ts: u64,
}

/// Counters of one replica.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    pub reads: u64,
    pub wounded: u64,
    pub lock_waits: u64,
    pub validation_failures: u64,
    pub prepared: u64,
    pub committed: u64,
    pub aborted: u64,
    pub refused: u64,
    /// 2PL prepares refused because the versions the coordinator read are not the leader's
    /// (values from a deposed leader).
    pub stale_reads: u64,
    /// One-phase records that applied as aborts (a version read was no longer the latest, or
    /// a prepared attempt held a key: a record a deposed leader proposed).
    pub one_phase_invalid: u64,
    /// NCC: pieces aborted early by the timestamp rules (a newer version or read, or an
    /// undecided version with a timestamp not below theirs).
    pub early_aborts: u64,
}

/// See the module docs.
pub struct TxnServer {
    cc: Cc,
    config: ClassicConfig,
    shard: ShardId,
    shards: usize,
    paxos: MultiPaxos<Record>,
    store: Store,
    prepared: BTreeMap<TxnKey, Prepared>,
    /// How many prepared attempts hold each key (the one-phase rule looks keys up here).
    prepared_keys: BTreeMap<Key, u32>,
    /// Outcomes logged (commit / abort records applied), in log order: the same on every replica.
    done: BTreeMap<TxnKey, Outcome>,
    done_order: VecDeque<TxnKey>,
    /// Aborts this replica decided alone as leader (no record; they never affect applying), with
    /// the ballot in which an abort record for them was proposed, if one was.
    unlogged: BTreeMap<TxnKey, Option<Ballot>>,
    unlogged_order: VecDeque<TxnKey>,
    /// One-phase attempts this leader answers once the abort record it proposed for them is
    /// applied (a *no* after a leadership change must be logged first).
    vote_on_apply: BTreeSet<TxnKey>,
    leading: bool,
    active: BTreeMap<TxnKey, Active>,
    locks: BTreeMap<Key, KeyLock>,
    /// NCC, every replica (applied from the log): the timestamp of each key's latest committed
    /// version.
    ncc_committed_ts: BTreeMap<Key, u64>,
    /// NCC, the leader only: each key's read mark, the largest timestamp that read its latest
    /// committed version (lost with leadership: module docs of [`crate::ncc`]).
    ncc_read_mark: BTreeMap<Key, u64>,
    stats: ServerStats,
}

impl TxnServer {
    /// The shard store, to give it a TPC-C shard's warehouses before the server starts.
    pub fn store_mut(&mut self) -> &mut Store {
        &mut self.store
    }

    /// Replica `replica` of `shard`. A restarted replica is built the same way; the host then
    /// hands it its durable Paxos state ([`Process::on_recover`]) and it rebuilds its store by
    /// applying the log again.
    pub fn new(cc: Cc, topology: &Topology, config: &ClassicConfig, shard: ShardId, replica: u32) -> Self {
        let replicas = topology.shards.get(shard as usize).cloned().unwrap_or_default();
        let leader = topology.leader.get(shard as usize).copied().unwrap_or(0);
        TxnServer {
            cc,
            config: config.clone(),
            shard,
            shards: topology.shard_count(),
            paxos: MultiPaxos::new(config.paxos.clone(), replicas, replica, leader, ServerTimer::PaxosTick.id())
                .with_batch_timer(ServerTimer::PaxosBatch.id()),
            store: Store::default(),
            prepared: BTreeMap::new(),
            prepared_keys: BTreeMap::new(),
            done: BTreeMap::new(),
            done_order: VecDeque::new(),
            unlogged: BTreeMap::new(),
            unlogged_order: VecDeque::new(),
            vote_on_apply: BTreeSet::new(),
            leading: false,
            active: BTreeMap::new(),
            locks: BTreeMap::new(),
            ncc_committed_ts: BTreeMap::new(),
            ncc_read_mark: BTreeMap::new(),
            stats: ServerStats::default(),
        }
    }

    pub fn stats(&self) -> ServerStats {
        self.stats
    }

    pub fn paxos(&self) -> &MultiPaxos<Record> {
        &self.paxos
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Attempts prepared and not yet decided in the applied log.
    pub fn prepared_count(&self) -> usize {
        self.prepared.len()
    }

    fn mine(&self, key: Key) -> bool {
        self.shards > 0 && kairos_workload::shard_of(key, self.shards) == self.shard
    }

    /// Attempts holding locks on this (leader) replica.
    pub fn locks_held(&self) -> usize {
        self.locks.len()
    }

    /// Attempts the leader tracks (waiting, locked, preparing, prepared, deciding).
    pub fn active_count(&self) -> usize {
        self.active.len()
    }

    fn insert_prepared(&mut self, tk: TxnKey, prepared: Prepared) {
        for k in &prepared.keys {
            *self.prepared_keys.entry(*k).or_default() += 1;
        }
        if let Some(old) = self.prepared.insert(tk, prepared) {
            self.forget_prepared_keys(&old.keys);
        }
    }

    fn remove_prepared(&mut self, tk: TxnKey) -> Option<Prepared> {
        let p = self.prepared.remove(&tk)?;
        self.forget_prepared_keys(&p.keys);
        Some(p)
    }

    fn forget_prepared_keys(&mut self, keys: &[Key]) {
        for k in keys {
            if let Some(n) = self.prepared_keys.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    self.prepared_keys.remove(k);
                }
            }
        }
    }

    /// The one-phase rule (parent module docs), at the record's position in the log: every
    /// version read is still the latest and no prepared attempt holds one of the keys.
    fn one_phase_valid(&self, reads: &[(Key, u64)], writes: &[(Key, Value)]) -> bool {
        self.config.unsafe_skip_validation
            || (reads.iter().all(|(k, ver)| self.store.get(*k).version == *ver)
                && reads
                    .iter()
                    .map(|(k, _)| k)
                    .chain(writes.iter().map(|(k, _)| k))
                    .all(|k| !self.prepared_keys.contains_key(k)))
    }

    /// A commit or abort record of `tk` was applied (called in log order only).
    fn remember_done(&mut self, tk: TxnKey, outcome: Outcome) {
        self.unlogged.remove(&tk);
        if self.done.insert(tk, outcome).is_none() {
            self.done_order.push_back(tk);
            while self.done_order.len() > self.config.done_max {
                if let Some(old) = self.done_order.pop_front() {
                    self.done.remove(&old);
                }
            }
        }
    }

    /// This leader aborted `tk` alone (no record).
    fn remember_unlogged(&mut self, tk: TxnKey) {
        if self.done.contains_key(&tk) || self.unlogged.contains_key(&tk) {
            return;
        }
        self.unlogged.insert(tk, None);
        self.unlogged_order.push_back(tk);
        while self.unlogged_order.len() > self.config.done_max {
            if let Some(old) = self.unlogged_order.pop_front() {
                self.unlogged.remove(&old);
            }
        }
    }

    /// Whether a newer attempt of the same transaction is known here (the request is stale).
    fn superseded(&self, tk: TxnKey) -> bool {
        let newer = TxnKey { txn: tk.txn, attempt: tk.attempt.saturating_add(1) };
        let last = TxnKey { txn: tk.txn, attempt: u32::MAX };
        tk.attempt == u32::MAX
            || self.active.range(newer..=last).next().is_some()
            || self.done.range(newer..=last).next().is_some()
            || self.unlogged.range(newer..=last).next().is_some()
    }

    fn reply(&self, ctx: &mut Ctx<'_, TxnMsg>, tk: TxnKey, msg: TxnMsg) {
        ctx.send(tk.txn.coordinator(), msg);
    }

    // ---------------------------------------------------------------- leadership

    /// Rebuild or drop the leader's volatile state when readiness changes.
    fn sync_leadership(&mut self, ctx: &mut Ctx<'_, TxnMsg>) {
        let ready = self.paxos.is_ready();
        if ready == self.leading {
            return;
        }
        self.leading = ready;
        self.active.clear();
        self.locks.clear();
        self.ncc_read_mark.clear();
        self.vote_on_apply.clear();
        if ready {
            ctx.metric("txn.server_became_leader", 1);
            let prepared: Vec<(TxnKey, Vec<Key>, u64)> =
                self.prepared.iter().map(|(tk, p)| (*tk, p.keys.clone(), p.ts)).collect();
            for (tk, keys, ts) in prepared {
                for k in &keys {
                    self.locks.entry(*k).or_default().holders.insert(tk);
                }
                // NCC: a recovered undecided version keeps its timestamp (later pieces wait for
                // it or abort early by it); 2PL and OCC: the oldest, never wounded.
                self.active.insert(tk, Active::new((ts, tk), false, keys, State::Recovered));
            }
        }
    }

    // ---------------------------------------------------------------- the log

    fn propose(&mut self, ctx: &mut Ctx<'_, TxnMsg>, record: Record) -> bool {
        let ok = self.paxos.propose(ctx, record).is_ok();
        self.apply_committed(ctx);
        ok
    }

    fn apply_committed(&mut self, ctx: &mut Ctx<'_, TxnMsg>) {
        for (slot, record) in self.paxos.take_committed() {
            match record {
                Record::Prepare { tk, keys, writes, pieces, ts } => {
                    // Only a logged outcome (an earlier commit / abort record) skips it: the
                    // same decision on every replica.
                    if self.done.contains_key(&tk) {
                        continue;
                    }
                    self.insert_prepared(tk, Prepared { keys, writes, pieces, ts });
                    // Yes only from the ready leader of the ballot that proposed the record: a
                    // message that deposes this leader may also commit its record (the new
                    // leader recovered it), before `sync_leadership` has run.
                    let (ready, ballot) = (self.paxos.is_ready(), self.paxos.ballot());
                    if self.leading && ready {
                        if let Some(a) = self.active.get_mut(&tk) {
                            if a.state == (State::Preparing { ballot }) {
                                a.state = State::Prepared;
                                self.stats.prepared += 1;
                                let shard = self.shard;
                                let yes = if self.cc == Cc::Ncc {
                                    let (values, arrival_ns) = (a.values.clone(), a.arrival_ns);
                                    TxnMsg::Executed { tk, shard, values, arrival_ns }
                                } else {
                                    TxnMsg::Vote { tk, shard, yes: true }
                                };
                                self.reply(ctx, tk, yes);
                                if self.cc == Cc::Locking && self.config.unsafe_early_release {
                                    self.release(ctx, tk, false);
                                }
                            }
                        }
                    }
                }
                Record::Commit { tk } => {
                    if let Some(p) = self.remove_prepared(tk) {
                        self.store.run_pieces(&p.pieces, &p.keys);
                        for (k, v) in p.writes {
                            self.store.put(k, v, slot + 1);
                            if self.cc == Cc::Ncc {
                                let committed = self.ncc_committed_ts.entry(k).or_default();
                                *committed = (*committed).max(p.ts);
                                // A read mark at or below the committed timestamp says nothing more.
                                if self.ncc_read_mark.get(&k).is_some_and(|m| *m <= p.ts) {
                                    self.ncc_read_mark.remove(&k);
                                }
                            }
                        }
                        self.stats.committed += 1;
                    }
                    self.remember_done(tk, Outcome::Committed);
                    self.finish(ctx, tk, Outcome::Committed, false);
                }
                Record::Abort { tk } => {
                    if self.remove_prepared(tk).is_some() {
                        self.stats.aborted += 1;
                    }
                    self.remember_done(tk, Outcome::Aborted);
                    self.finish(ctx, tk, Outcome::Aborted, false);
                }
                Record::CommitOnePhase { tk, reads, writes, pieces } => {
                    // An abort record logged first (after a leadership change) decided it.
                    if self.done.contains_key(&tk) {
                        continue;
                    }
                    let outcome = if self.one_phase_valid(&reads, &writes) {
                        // The keys it read or wrote (a read-only attempt writes none).
                        let keys: Vec<Key> = reads.iter().chain(&writes).map(|(k, _)| *k).collect();
                        self.store.run_pieces(&pieces, &keys);
                        for (k, v) in writes {
                            self.store.put(k, v, slot + 1);
                        }
                        self.stats.committed += 1;
                        Outcome::Committed
                    } else {
                        self.stats.one_phase_invalid += 1;
                        ctx.metric("txn.server_one_phase_invalid", 1);
                        Outcome::Aborted
                    };
                    self.remember_done(tk, outcome);
                    self.finish(ctx, tk, outcome, true);
                }
            }
        }
    }

    /// A decision record of `tk` (`one_phase`: its one-phase record) is applied: the leader
    /// releases the keys and answers — the outcome to a one-phase attempt it proposed or a *no*
    /// it logged first, an acknowledgement to a decision.
    fn finish(&mut self, ctx: &mut Ctx<'_, TxnMsg>, tk: TxnKey, outcome: Outcome, one_phase: bool) {
        let asked = self.vote_on_apply.remove(&tk);
        if !self.leading {
            return;
        }
        let proposed = self.active.contains_key(&tk);
        self.release(ctx, tk, true);
        let shard = self.shard;
        if asked || (one_phase && proposed) {
            self.reply(ctx, tk, TxnMsg::Vote { tk, shard, yes: outcome == Outcome::Committed });
        } else if !one_phase {
            self.reply(ctx, tk, TxnMsg::DecideAck { tk, shard });
        }
    }

    // ---------------------------------------------------------------- locks

    /// Releases `tk`'s locks (and wait positions) and grants waiters; with `forget`, drops
    /// its active state too.
    fn release(&mut self, ctx: &mut Ctx<'_, TxnMsg>, tk: TxnKey, forget: bool) {
        let Some(a) = self.active.get(&tk) else { return };
        let (prio, keys) = (a.prio, a.keys.clone());
        if forget {
            self.active.remove(&tk);
        }
        for k in keys {
            if let Some(l) = self.locks.get_mut(&k) {
                l.holders.remove(&tk);
                l.waiters.remove(&prio);
            }
            self.grant(ctx, k);
        }
    }

    /// Whether attempt `tk`, whose locks are `shared` or not, conflicts with `holder`'s lock:
    /// unless both only read. (An attempt recovered from the log holds its keys exclusively.)
    fn lock_conflict(active: &BTreeMap<TxnKey, Active>, holder: TxnKey, tk: TxnKey, shared: bool) -> bool {
        holder != tk && !(shared && active.get(&holder).is_some_and(|a| a.shared))
    }

    /// Grants `key` to its waiters oldest first, as long as each is compatible with the
    /// holders (so several readers at once; never a younger one past an older one).
    fn grant(&mut self, ctx: &mut Ctx<'_, TxnMsg>, key: Key) {
        if self.cc == Cc::Ncc {
            self.ncc_grant(ctx, key);
            return;
        }
        let mut ready = Vec::new();
        let active = &self.active;
        if let Some(l) = self.locks.get_mut(&key) {
            while let Some(&(age, tk)) = l.waiters.first() {
                let shared = active.get(&tk).is_some_and(|a| a.shared);
                if l.holders.iter().any(|h| Self::lock_conflict(active, *h, tk, shared)) {
                    break;
                }
                l.waiters.remove(&(age, tk));
                l.holders.insert(tk);
                ready.push(tk);
            }
            if l.holders.is_empty() && l.waiters.is_empty() {
                self.locks.remove(&key);
            }
        }
        for tk in ready {
            let Some(a) = self.active.get_mut(&tk) else { continue };
            if let State::Waiting { missing } = &mut a.state {
                *missing = missing.saturating_sub(1);
                if *missing == 0 {
                    a.state = State::Locked;
                    self.send_values(ctx, tk);
                }
            }
        }
    }

    /// Aborts attempt `tk` here (it is not prepared): releases it, remembers it, tells its
    /// coordinator.
    fn refuse(&mut self, ctx: &mut Ctx<'_, TxnMsg>, tk: TxnKey) {
        self.release(ctx, tk, true);
        self.remember_unlogged(tk);
        self.stats.refused += 1;
        let shard = self.shard;
        self.reply(ctx, tk, TxnMsg::Refused { tk, shard });
    }

    fn send_values(&mut self, ctx: &mut Ctx<'_, TxnMsg>, tk: TxnKey) {
        let Some(a) = self.active.get(&tk) else { return };
        let values = a
            .keys
            .iter()
            .map(|k| {
                let v = self.store.get(*k);
                (*k, v.value, v.version)
            })
            .collect();
        let shard = self.shard;
        self.reply(ctx, tk, TxnMsg::ReadReply { tk, shard, values });
    }

    // ---------------------------------------------------------------- requests

    fn on_read(&mut self, ctx: &mut Ctx<'_, TxnMsg>, tk: TxnKey, age_ns: u64, keys: Vec<Key>, shared: bool) {
        self.stats.reads += 1;
        let mut keys = keys;
        keys.sort_unstable();
        keys.dedup();
        if keys.is_empty() || keys.len() > self.config.keys_per_request_max || !keys.iter().all(|k| self.mine(*k)) {
            ctx.metric("txn.server_bad_request", 1);
            return;
        }
        if let Some(a) = self.active.get(&tk) {
            // A retransmission: answer again if the values were sent, or say it still waits.
            if matches!(a.state, State::Locked) || self.cc == Cc::Optimistic {
                self.send_values(ctx, tk);
            } else if matches!(a.state, State::Waiting { .. }) {
                let shard = self.shard;
                self.reply(ctx, tk, TxnMsg::Waiting { tk, shard });
            }
            return;
        }
        if self.done.contains_key(&tk) || self.unlogged.contains_key(&tk) || self.superseded(tk) {
            let shard = self.shard;
            self.reply(ctx, tk, TxnMsg::Refused { tk, shard });
            return;
        }
        if self.cc == Cc::Optimistic {
            let values = keys
                .iter()
                .map(|k| {
                    let v = self.store.get(*k);
                    (*k, v.value, v.version)
                })
                .collect();
            let shard = self.shard;
            self.reply(ctx, tk, TxnMsg::ReadReply { tk, shard, values });
            return;
        }
        if self.active.len() >= self.config.active_max {
            self.stats.refused += 1;
            let shard = self.shard;
            self.reply(ctx, tk, TxnMsg::Refused { tk, shard });
            return;
        }
        // An older attempt of the same transaction that still holds locks is over.
        let older: Vec<TxnKey> = self
            .active
            .range(TxnKey { txn: tk.txn, attempt: 0 }..tk)
            .filter(|(_, a)| matches!(a.state, State::Waiting { .. } | State::Locked))
            .map(|(t, _)| *t)
            .collect();
        for t in older {
            self.release(ctx, t, true);
            self.remember_unlogged(t);
        }
        let prio = (age_ns, tk);
        let waiting = State::Waiting { missing: keys.len() };
        self.active.insert(tk, Active { shared, ..Active::new(prio, false, keys.clone(), waiting) });
        for k in &keys {
            // Wound every younger, unprepared holder that conflicts (again after each round:
            // releasing a victim may grant the key to another younger waiter).
            loop {
                let victims: Vec<TxnKey> = self.locks.get(k).map_or_else(Vec::new, |l| {
                    l.holders
                        .iter()
                        .filter(|h| Self::lock_conflict(&self.active, **h, tk, shared))
                        .filter(|h| {
                            self.active.get(h).is_some_and(|a| {
                                a.prio > prio && matches!(a.state, State::Waiting { .. } | State::Locked)
                            })
                        })
                        .copied()
                        .collect()
                });
                if victims.is_empty() {
                    break;
                }
                for v in victims {
                    self.stats.wounded += 1;
                    ctx.metric("txn.server_wounded", 1);
                    self.refuse(ctx, v);
                }
            }
            let active = &self.active;
            let l = self.locks.entry(*k).or_default();
            if l.waiters.is_empty() && !l.holders.iter().any(|h| Self::lock_conflict(active, *h, tk, shared)) {
                l.holders.insert(tk);
            } else {
                // Queued by age: granted at once if it is the oldest compatible waiter.
                l.waiters.insert(prio);
                self.grant(ctx, *k);
                if !self.locks.get(k).is_some_and(|l| l.holders.contains(&tk)) {
                    self.stats.lock_waits += 1;
                }
            }
        }
        // Count at the end: a wound above may have granted a key `tk` was waiting for (and a
        // grant of every key has already sent the values).
        let missing = keys.iter().filter(|k| !self.locks.get(k).is_some_and(|l| l.holders.contains(&tk))).count();
        if let Some(a) = self.active.get_mut(&tk) {
            if missing > 0 {
                a.state = State::Waiting { missing };
            } else if a.state != State::Locked {
                a.state = State::Locked;
                self.send_values(ctx, tk);
            }
        }
    }

    /// `(writes, pieces)`: the values the attempt writes here, and its TPC-C pieces.
    fn on_prepare(
        &mut self,
        ctx: &mut Ctx<'_, TxnMsg>,
        tk: TxnKey,
        reads: Vec<(Key, u64)>,
        (writes, pieces): (Vec<(Key, Value)>, Pieces),
        one_phase: bool,
    ) {
        let shard = self.shard;
        let vote = |yes| TxnMsg::Vote { tk, shard, yes };
        if let Some(&outcome) = self.done.get(&tk) {
            self.reply(ctx, tk, vote(outcome == Outcome::Committed));
            return;
        }
        if self.unlogged.contains_key(&tk) {
            self.vote_no(ctx, tk, one_phase);
            return;
        }
        if writes.len() > self.config.keys_per_request_max
            || reads.len() > self.config.keys_per_request_max
            || !writes.iter().all(|(k, _)| self.mine(*k))
            || !reads.iter().all(|(k, _)| self.mine(*k))
        {
            ctx.metric("txn.server_bad_request", 1);
            return;
        }
        match self.active.get(&tk).map(|a| a.state.clone()) {
            Some(State::Preparing { .. }) => {}
            Some(State::Prepared) => self.reply(ctx, tk, vote(true)),
            // The decision is known (the coordinator only decides after the votes): repeat it.
            Some(State::Deciding { commit }) => self.reply(ctx, tk, vote(commit)),
            Some(State::Recovered) => self.reply(ctx, tk, vote(false)),
            Some(State::Waiting { .. }) => self.refuse_prepare(ctx, tk, one_phase),
            Some(State::Locked) => {
                // 2PL: every write must be under an exclusive lock this attempt holds.
                let a = &self.active[&tk];
                let covered = writes.iter().all(|(k, _)| a.keys.contains(k));
                if !covered {
                    self.refuse_prepare(ctx, tk, one_phase);
                    return;
                }
                // ... and the values the writes derive from must be this leader's: the
                // coordinator may have taken the values from a deposed leader's late reply
                // while this leader holds the locks. Under the locks the versions cannot have
                // changed since this leader read them, so equal versions mean equal values
                // (a version is the slot of the commit record that wrote it). The test-only
                // early-release bug skips this second line of defence, which would hide it.
                let fresh = self.config.unsafe_early_release
                    || a.keys
                        .iter()
                        .all(|k| reads.iter().any(|(rk, ver)| rk == k && self.store.get(*k).version == *ver));
                if !fresh {
                    self.stats.stale_reads += 1;
                    ctx.metric("txn.server_stale_read", 1);
                    self.refuse_prepare(ctx, tk, one_phase);
                    return;
                }
                let keys = a.keys.clone();
                self.start_prepare(ctx, tk, keys, reads, (writes, pieces), one_phase);
            }
            None if self.cc == Cc::Optimistic => {
                if self.superseded(tk) || self.active.len() >= self.config.active_max {
                    self.remember_unlogged(tk);
                    self.vote_no(ctx, tk, one_phase);
                    return;
                }
                let keys: BTreeSet<Key> = reads.iter().map(|(k, _)| *k).chain(writes.iter().map(|(k, _)| *k)).collect();
                let valid = self.config.unsafe_skip_validation
                    || (reads.iter().all(|(k, ver)| self.store.get(*k).version == *ver)
                        && keys.iter().all(|k| self.locks.get(k).is_none_or(|l| l.holders.is_empty())));
                if !valid {
                    self.stats.validation_failures += 1;
                    ctx.metric("txn.server_validation_failed", 1);
                    self.remember_unlogged(tk);
                    self.vote_no(ctx, tk, one_phase);
                    return;
                }
                let keys: Vec<Key> = keys.into_iter().collect();
                for k in &keys {
                    self.locks.entry(*k).or_default().holders.insert(tk);
                }
                let active = Active::new((0, tk), one_phase, keys.clone(), State::Locked);
                self.active.insert(tk, active);
                self.start_prepare(ctx, tk, keys, reads, (writes, pieces), one_phase);
            }
            None => {
                // 2PL: the locks are gone (wounded, a new leader, or never taken).
                self.remember_unlogged(tk);
                self.vote_no(ctx, tk, one_phase);
            }
        }
    }

    /// Refuses the prepare of attempt `tk`, which is not prepared here: two-phase, `Refused`
    /// (the coordinator aborts it); one-phase, a *no* vote ([`Self::vote_no`]).
    fn refuse_prepare(&mut self, ctx: &mut Ctx<'_, TxnMsg>, tk: TxnKey, one_phase: bool) {
        if !one_phase {
            self.refuse(ctx, tk);
            return;
        }
        self.release(ctx, tk, true);
        self.remember_unlogged(tk);
        self.stats.refused += 1;
        self.vote_no(ctx, tk, true);
    }

    /// Votes no for `tk`, which this leader did not prepare. A one-phase attempt's *no* is its
    /// outcome; once the shard has changed leaders an earlier leader may have proposed its
    /// one-phase record, so the *no* waits for an abort record, and the outcome of the log is
    /// the answer (parent module docs).
    fn vote_no(&mut self, ctx: &mut Ctx<'_, TxnMsg>, tk: TxnKey, one_phase: bool) {
        if one_phase && self.stale_prepares_possible() {
            // Bounded: beyond the bound nothing is answered and the coordinator asks again.
            if self.vote_on_apply.len() < self.config.active_max {
                self.vote_on_apply.insert(tk);
                self.log_abort(ctx, tk);
            }
            return;
        }
        let shard = self.shard;
        self.reply(ctx, tk, TxnMsg::Vote { tk, shard, yes: false });
    }

    fn start_prepare(
        &mut self,
        ctx: &mut Ctx<'_, TxnMsg>,
        tk: TxnKey,
        keys: Vec<Key>,
        reads: Vec<(Key, u64)>,
        (writes, pieces): (Vec<(Key, Value)>, Pieces),
        one_phase: bool,
    ) {
        let ballot = self.paxos.ballot();
        if let Some(a) = self.active.get_mut(&tk) {
            a.state = State::Preparing { ballot };
            a.one_phase = one_phase;
        }
        let ts = if self.cc == Cc::Ncc { self.active.get(&tk).map_or(0, |a| a.prio.0) } else { 0 };
        let record = if one_phase {
            Record::CommitOnePhase { tk, reads, writes, pieces }
        } else {
            Record::Prepare { tk, keys, writes, pieces, ts }
        };
        if !self.propose(ctx, record) {
            // The log refuses (overloaded): vote no.
            self.release(ctx, tk, true);
            self.remember_unlogged(tk);
            self.vote_no(ctx, tk, one_phase);
        }
    }

    // ---------------------------------------------------------------- NCC

    /// NCC's rule for a piece at timestamp `ts` on `key` when no undecided version is in its
    /// way: it executes unless the latest committed version or a read of it is not older.
    fn ncc_too_late(&self, key: Key, ts: u64) -> bool {
        self.ncc_committed_ts.get(&key).is_some_and(|c| *c >= ts)
            || self.ncc_read_mark.get(&key).is_some_and(|m| *m > ts)
    }

    /// NCC: executes attempt `tk` at timestamp `ts` on `keys` (module docs of [`crate::ncc`]).
    fn on_execute(&mut self, ctx: &mut Ctx<'_, TxnMsg>, tk: TxnKey, ts: u64, keys: Vec<Key>, pieces: Pieces) {
        let shard = self.shard;
        let mut keys = keys;
        keys.sort_unstable();
        keys.dedup();
        if self.cc != Cc::Ncc
            || keys.is_empty()
            || keys.len() > self.config.keys_per_request_max
            || !keys.iter().all(|k| self.mine(*k))
        {
            ctx.metric("txn.server_bad_request", 1);
            return;
        }
        self.stats.reads += 1;
        if let Some(&outcome) = self.done.get(&tk) {
            // Decided: the coordinator had every answer; this only repeats the outcome.
            self.reply(ctx, tk, TxnMsg::Vote { tk, shard, yes: outcome == Outcome::Committed });
            return;
        }
        if self.unlogged.contains_key(&tk) {
            self.reply(ctx, tk, TxnMsg::Refused { tk, shard });
            return;
        }
        if let Some(a) = self.active.get(&tk) {
            // A retransmission: answer from the attempt's state.
            let answer = match a.state {
                State::Waiting { .. } => Some(TxnMsg::Waiting { tk, shard }),
                State::Prepared => {
                    Some(TxnMsg::Executed { tk, shard, values: a.values.clone(), arrival_ns: a.arrival_ns })
                }
                State::Deciding { commit } => Some(TxnMsg::Vote { tk, shard, yes: commit }),
                // Prepared by an earlier leader: only the proposer may say yes (parent docs).
                State::Recovered => Some(TxnMsg::Vote { tk, shard, yes: false }),
                State::Locked | State::Preparing { .. } => None,
            };
            if let Some(m) = answer {
                self.reply(ctx, tk, m);
            }
            return;
        }
        if self.superseded(tk) || self.active.len() >= self.config.active_max {
            self.remember_unlogged(tk);
            self.stats.refused += 1;
            self.reply(ctx, tk, TxnMsg::Refused { tk, shard });
            return;
        }
        let mut active = Active::new((ts, tk), false, keys.clone(), State::Waiting { missing: keys.len() });
        active.arrival_ns = ctx.now().as_nanos();
        active.pieces = pieces;
        self.active.insert(tk, active);
        let mut missing = 0;
        for k in &keys {
            // The undecided version in the way (unknown holders count as newest: abort).
            let undecided = self.locks.get(k).and_then(|l| {
                l.holders.iter().filter(|h| **h != tk).map(|h| self.active.get(h).map_or(u64::MAX, |a| a.prio.0)).max()
            });
            match undecided {
                // Response timing control: wait for the decision of an older undecided version.
                Some(older) if older < ts && !self.config.unsafe_ncc_skip_wait => {
                    self.locks.entry(*k).or_default().waiters.insert((ts, tk));
                    self.stats.lock_waits += 1;
                    missing += 1;
                }
                Some(older) if older < ts => {
                    // The test-only bug: execute on the committed version under it.
                    self.locks.entry(*k).or_default().holders.insert(tk);
                }
                Some(_) => {
                    self.ncc_abort_early(ctx, tk);
                    return;
                }
                None if self.ncc_too_late(*k, ts) => {
                    self.ncc_abort_early(ctx, tk);
                    return;
                }
                None => {
                    self.locks.entry(*k).or_default().holders.insert(tk);
                    let mark = self.ncc_read_mark.entry(*k).or_default();
                    *mark = (*mark).max(ts);
                }
            }
        }
        if missing == 0 {
            self.ncc_execute(ctx, tk);
        } else if let Some(a) = self.active.get_mut(&tk) {
            a.state = State::Waiting { missing };
        }
    }

    /// NCC: `key` has no undecided version any more: the waiting piece with the smallest
    /// timestamp executes on it, or aborts early if the version just committed (or a read) is
    /// not older; the others now wait for that one.
    fn ncc_grant(&mut self, ctx: &mut Ctx<'_, TxnMsg>, key: Key) {
        let mut granted = None;
        let mut late = Vec::new();
        while self.locks.get(&key).is_some_and(|l| l.holders.is_empty()) {
            let Some((ts, tk)) = self.locks.get_mut(&key).and_then(|l| l.waiters.pop_first()) else { break };
            if self.ncc_too_late(key, ts) {
                late.push(tk);
                continue;
            }
            self.locks.entry(key).or_default().holders.insert(tk);
            let mark = self.ncc_read_mark.entry(key).or_default();
            *mark = (*mark).max(ts);
            granted = Some(tk);
        }
        if self.locks.get(&key).is_some_and(|l| l.holders.is_empty() && l.waiters.is_empty()) {
            self.locks.remove(&key);
        }
        for tk in late {
            self.ncc_abort_early(ctx, tk);
        }
        let Some(tk) = granted else { return };
        let Some(a) = self.active.get_mut(&tk) else { return };
        if let State::Waiting { missing } = &mut a.state {
            *missing = missing.saturating_sub(1);
            if *missing == 0 {
                self.ncc_execute(ctx, tk);
            }
        }
    }

    /// NCC: every key of `tk` is claimed at its timestamp: read the committed values, write
    /// the increments, and prepare them (the leader answers `Executed` once the record is
    /// durable).
    fn ncc_execute(&mut self, ctx: &mut Ctx<'_, TxnMsg>, tk: TxnKey) {
        let Some(a) = self.active.get_mut(&tk) else { return };
        a.values = a.keys.iter().map(|k| (*k, self.store.get(*k).value)).collect();
        let writes = if reads_only(&a.pieces) {
            Vec::new()
        } else {
            a.values.iter().map(|(k, v)| (*k, v.saturating_add(1))).collect()
        };
        let (keys, pieces) = (a.keys.clone(), a.pieces.clone());
        self.start_prepare(ctx, tk, keys, Vec::new(), (writes, pieces), false);
    }

    /// NCC: the rules abort `tk` here before it executed everywhere (its coordinator aborts it).
    fn ncc_abort_early(&mut self, ctx: &mut Ctx<'_, TxnMsg>, tk: TxnKey) {
        self.stats.early_aborts += 1;
        ctx.metric("txn.server_ncc_early_aborts", 1);
        self.refuse(ctx, tk);
    }

    fn on_decide(&mut self, ctx: &mut Ctx<'_, TxnMsg>, tk: TxnKey, commit: bool) {
        let shard = self.shard;
        if self.done.contains_key(&tk) {
            self.reply(ctx, tk, TxnMsg::DecideAck { tk, shard });
            return;
        }
        if self.active.get(&tk).is_some_and(|a| a.one_phase && matches!(a.state, State::Preparing { .. })) {
            // Its one-phase record decides it; no coordinator decision applies.
            ctx.metric("txn.server_decide_ignored", 1);
            return;
        }
        let state = self.active.get(&tk).map(|a| a.state.clone());
        match state {
            Some(State::Deciding { .. }) => {}
            Some(before @ (State::Preparing { .. } | State::Prepared | State::Recovered)) => {
                if let Some(a) = self.active.get_mut(&tk) {
                    a.state = State::Deciding { commit };
                }
                let record = if commit { Record::Commit { tk } } else { Record::Abort { tk } };
                if !self.propose(ctx, record) {
                    // Overloaded: the coordinator will resend the decision.
                    if let Some(a) = self.active.get_mut(&tk) {
                        a.state = before;
                    }
                }
            }
            Some(State::Waiting { .. }) | Some(State::Locked) | None if !commit => {
                self.release(ctx, tk, true);
                self.remember_unlogged(tk);
                if self.stale_prepares_possible() {
                    self.log_abort(ctx, tk);
                } else {
                    self.reply(ctx, tk, TxnMsg::DecideAck { tk, shard });
                }
            }
            // A commit for an attempt this leader has not prepared: it cannot have been decided
            // (votes need a durable prepare record, which a ready leader holds), so ignore.
            _ => ctx.metric("txn.server_decide_ignored", 1),
        }
    }

    /// Whether the log may hold, or later recover, a prepare record this leader does not know:
    /// one an earlier leader proposed but never got committed. Only once leadership changed.
    /// Such a record may surface in a later election; an abort record after it keeps the
    /// replicas from treating the attempt as prepared forever.
    fn stale_prepares_possible(&self) -> bool {
        self.paxos.ballot().round > 0
    }

    /// Records an abort decided without a log record in the log too (acknowledged on apply).
    /// Once per ballot: a resent `Decide(abort)` waits for the record already proposed (a new
    /// ballot may have lost it, so it is proposed again there).
    fn log_abort(&mut self, ctx: &mut Ctx<'_, TxnMsg>, tk: TxnKey) {
        let ballot = self.paxos.ballot();
        if self.unlogged.get(&tk) == Some(&Some(ballot)) {
            return;
        }
        ctx.metric("txn.server_abort_logged", 1);
        if self.paxos.propose(ctx, Record::Abort { tk }).is_ok() {
            if let Some(b) = self.unlogged.get_mut(&tk) {
                *b = Some(ballot);
            }
        }
        self.apply_committed(ctx);
    }
}

impl Process for TxnServer {
    type Msg = TxnMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, TxnMsg>) {
        self.paxos.start(ctx);
        self.sync_leadership(ctx);
    }

    fn on_message(&mut self, ctx: &mut Ctx<'_, TxnMsg>, from: NodeId, msg: TxnMsg) {
        match msg {
            TxnMsg::Paxos(m) => {
                self.paxos.on_message(ctx, from, m);
                self.apply_committed(ctx);
            }
            TxnMsg::PreRead(request) => {
                if let Some(answer) = self.store.answer_pre_read(request) {
                    ctx.send(from, TxnMsg::PreReadAnswer(answer));
                }
            }
            TxnMsg::Read { .. } | TxnMsg::Prepare { .. } if self.cc == Cc::Ncc => {
                ctx.metric("txn.server_bad_request", 1);
            }
            TxnMsg::Execute { .. } if self.cc != Cc::Ncc => ctx.metric("txn.server_bad_request", 1),
            TxnMsg::Read { .. } | TxnMsg::Prepare { .. } | TxnMsg::Execute { .. } | TxnMsg::Decide { .. }
                if !self.paxos.is_ready() =>
            {
                if !self.paxos.is_leader() {
                    let reply = TxnMsg::NotLeader { shard: self.shard, leader: self.paxos.leader_hint() };
                    ctx.send(from, reply);
                }
            }
            TxnMsg::Read { tk, age_ns, keys, shared } => self.on_read(ctx, tk, age_ns, keys, shared),
            TxnMsg::Prepare { tk, reads, writes, pieces, one_phase } => {
                self.on_prepare(ctx, tk, reads, (writes, pieces), one_phase)
            }
            TxnMsg::Execute { tk, ts, keys, pieces } => self.on_execute(ctx, tk, ts, keys, pieces),
            TxnMsg::Decide { tk, commit } => self.on_decide(ctx, tk, commit),
            TxnMsg::Executed { .. }
            | TxnMsg::ReadReply { .. }
            | TxnMsg::Refused { .. }
            | TxnMsg::Waiting { .. }
            | TxnMsg::Vote { .. }
            | TxnMsg::DecideAck { .. }
            | TxnMsg::NotLeader { .. }
            | TxnMsg::PreReadAnswer(_) => ctx.metric("txn.server_unexpected", 1),
        }
        self.sync_leadership(ctx);
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_, TxnMsg>, timer: TimerId) {
        self.paxos.on_timer(ctx, timer);
        self.apply_committed(ctx);
        self.sync_leadership(ctx);
    }

    fn invariants(&self) -> Result<(), String> {
        self.paxos.invariants()
    }

    /// Only the Paxos log is durable: the store, the prepared attempts and the logged outcomes
    /// are rebuilt as the log is applied again.
    fn on_recover(&mut self, stored: &Stored) {
        self.paxos.recover(stored);
    }
}
