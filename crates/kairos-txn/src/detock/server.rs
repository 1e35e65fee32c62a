//! A Detock server: one per (shard, replica). The shard's *home* ([`home`]) logs and
//! executes; the other replicas of the shard only store its log.
//!
//! - **Log** (home only): batches what coordinators submit — and what it finds in another
//!   home's log that also touches its shard (*adoption*: a lost submission cannot leave a
//!   transaction half-logged) — into a batch every `batch_interval`, and replicates each
//!   batch to its followers; a batch is committed once `f` followers stored it (a majority
//!   with the home). Committed batches go, in order, to every home, this one included.
//! - **Follower** (every other replica): stores the batches of its home and acknowledges each.
//! - **Executor** (home only): reads every home's log in order — all of it, also the
//!   transactions that do not touch this shard, so that every home sees the same graph — and
//!   adds an edge from the previous transaction on each key to the next. A transaction is
//!   *complete* once every involved home's log holds it; it runs once it and all its
//!   ancestors are complete, its strongly connected component as a unit, members in id order
//!   ([`crate::janus::graph::plan`], the planner Janus uses), on this shard's keys, and the
//!   home answers the coordinator with the values read.
//!
//! Loss is repaired by pulls on a periodic timer: a home sends a batch again to followers whose
//! acknowledgement is overdue; an executor missing a home's next batch (a later one arrived,
//! or nothing for a while) asks that home for it again; coordinators resubmit to the homes
//! that have not answered, and a home answers a transaction it executed from its kept results.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use kairos_core::{Ctx, LocalTime, NodeId, Process, Timer, TimerId};
use kairos_workload::txn::{Key, ShardId, TxnId, Value};
use kairos_workload::{reads_only, Pieces, Topology};

use super::msg::{Batch, DetockMsg, LoggedTxn};
use super::{home, DetockConfig};
use crate::janus::graph::Known;
use crate::janus::msg::{Dep, ShardSet};
use crate::janus::waits::Waits;
use crate::store::Store;

kairos_core::timers! {
    /// A Detock server's timers.
    pub enum ServerTimer {
        /// The home closes its current batch.
        BatchTick = 1,
        /// The periodic repair of lost messages.
        Repair = 2,
    }
}

/// Batches sent again, or asked for, per repair round and peer, at most.
const REPAIR_BATCH: u64 = 16;

/// Keys per transaction at most (the check for repeated keys is quadratic).
pub const KEYS_MAX: usize = 256;

/// A transaction in the executor's graph (removed once executed here).
/// How a transaction reaches a home's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Admission {
    /// Its coordinator's submission: refused while the log is full.
    Submitted,
    /// Read in another home's log (`on_batch` adopts it): never refused.
    Adopted,
}

#[derive(Clone, Debug)]
struct Vertex {
    shards: ShardSet,
    /// The homes whose log held it so far.
    seen: ShardSet,
    keys: Vec<Key>,
    pieces: Pieces,
    /// The previous transaction on each of its keys, in the log of that key's shard.
    deps: Vec<Dep>,
}

impl Vertex {
    fn complete(&self) -> bool {
        self.seen == self.shards
    }
}

/// A batch this home sent to its followers and not yet committed.
#[derive(Clone, Debug)]
struct Replicating {
    batch: Arc<Batch>,
    acks: BTreeSet<u32>,
    sent_at: LocalTime,
}

/// The home's parts: its log and its executor.
#[derive(Clone, Debug, Default)]
struct Home {
    // The log.
    batch: Vec<LoggedTxn>,
    next_number: u64,
    replicating: BTreeMap<u64, Replicating>,
    committed_upto: u64,
    /// Committed batches kept for executors that ask again (the last `log_keep`).
    committed: BTreeMap<u64, Arc<Batch>>,
    /// Transactions this home logged (to log each once), and whether each ran here.
    logged: BTreeMap<TxnId, bool>,
    logged_order: VecDeque<(TxnId, LocalTime)>,
    /// Per coordinator, the highest sequence number forgotten: an older submission (a replayed
    /// message) is refused rather than logged again.
    forgotten: BTreeMap<NodeId, u32>,
    // The executor.
    /// Per shard, the next batch of its home's log to read.
    next_batch: Vec<u64>,
    /// Per shard, when its last batch was read (or asked for).
    read_at: Vec<LocalTime>,
    /// Batches received ahead of their turn.
    held: BTreeMap<(ShardId, u64), Arc<Batch>>,
    /// The last transaction logged on each key (in its shard's log), while it is unexecuted.
    last_on_key: BTreeMap<Key, TxnId>,
    vertices: BTreeMap<TxnId, Vertex>,
    /// The complete transactions that wait, and for which incomplete ones ("committed" to
    /// the planner is complete here).
    waits: Waits,
    store: Store,
    /// Values read by executed transactions of this shard, kept for resubmissions.
    results: BTreeMap<TxnId, Vec<(Key, Value)>>,
    results_order: VecDeque<TxnId>,
}

/// The server's counters.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    pub batches_sent: u64,
    pub batches_committed: u64,
    pub txns_logged: u64,
    pub txns_adopted: u64,
    pub txns_executed: u64,
    /// Components of more than one transaction (deadlocks resolved by id order).
    pub cycles: u64,
    pub appends_again: u64,
    pub sync_fetches: u64,
}

/// See the module docs.
pub struct Server {
    topology: Topology,
    config: DetockConfig,
    shard: ShardId,
    replica: u32,
    home: Option<Home>,
    /// A follower's stored batches of its home's log (the last `log_keep`).
    stored: BTreeMap<u64, Arc<Batch>>,
    stats: ServerStats,
}

impl Server {
    pub fn new(topology: &Topology, config: &DetockConfig, shard: ShardId, replica: u32) -> Self {
        let shards = topology.shard_count();
        let home = (home(shard, topology.replicas_per_shard()) == replica).then(|| Home {
            next_number: 1,
            next_batch: vec![1; shards],
            read_at: vec![LocalTime::ZERO; shards],
            ..Home::default()
        });
        Server {
            topology: topology.clone(),
            config: config.clone(),
            shard,
            replica,
            home,
            stored: BTreeMap::new(),
            stats: ServerStats::default(),
        }
    }

    pub fn stats(&self) -> ServerStats {
        self.stats
    }

    /// The shard's data (empty at a follower: only the home executes).
    pub fn store(&self) -> Option<&Store> {
        self.home.as_ref().map(|h| &h.store)
    }

    /// The shard store (the home's), to give it a TPC-C shard's warehouses before the server
    /// starts.
    pub fn store_mut(&mut self) -> Option<&mut Store> {
        self.home.as_mut().map(|h| &mut h.store)
    }

    /// Transactions in the executor's graph not yet executed (0 at a follower).
    pub fn unexecuted(&self) -> usize {
        self.home.as_ref().map_or(0, |h| h.vertices.len())
    }

    /// No blocked component is registered and no completion awaited
    /// ([`Waits::is_idle`]).
    pub fn waits_idle(&self) -> bool {
        self.home.as_ref().is_none_or(|h| h.waits.is_idle())
    }

    /// Keys whose last logged transaction has not run here (0 at a follower): what the
    /// executor remembers beyond its graph.
    pub fn keys_tracked(&self) -> usize {
        self.home.as_ref().map_or(0, |h| h.last_on_key.len())
    }

    fn shards_of_keys(&self, keys: &[Key]) -> ShardSet {
        keys.iter().fold(0, |set, k| set | 1 << self.topology.shard_of_key(*k))
    }

    fn home_node(&self, shard: ShardId) -> Option<NodeId> {
        let n = self.topology.replicas_per_shard();
        self.topology.shards.get(shard as usize)?.get(home(shard, n) as usize).copied()
    }

    fn followers(&self) -> Vec<(u32, NodeId)> {
        let peers = &self.topology.shards[self.shard as usize];
        peers.iter().enumerate().filter(|(r, _)| *r as u32 != self.replica).map(|(r, n)| (r as u32, *n)).collect()
    }

    /// Whether `keys` is a transaction this deployment can run: distinct keys, from one to
    /// [`KEYS_MAX`], on at most 64 shards (a shard set is a bit mask).
    fn valid_keys(&self, keys: &[Key]) -> bool {
        !keys.is_empty()
            && keys.len() <= KEYS_MAX
            && self.topology.shard_count() <= 64
            && keys.iter().enumerate().all(|(i, k)| !keys[..i].contains(k))
    }

    // ----- The log -----

    fn on_submit(&mut self, ctx: &mut Ctx<'_, DetockMsg>, from: NodeId, txn: TxnId, keys: Vec<Key>, pieces: Pieces) {
        // (Valid keys first: a shard set holds at most 64 shards.)
        if !self.valid_keys(&keys) || self.shards_of_keys(&keys) & (1 << self.shard) == 0 || from != txn.coordinator() {
            ctx.metric("detock.submit_refused", 1);
            return;
        }
        let Some(h) = self.home.as_mut() else { return };
        if h.logged.contains_key(&txn) {
            // A resubmission: answer it if it ran here already (else the answer is coming).
            if let Some(reads) = h.results.get(&txn) {
                ctx.send(from, DetockMsg::Reply { txn, shard: self.shard, reads: reads.clone() });
            }
            return;
        }
        if h.forgotten.get(&txn.coordinator()).is_some_and(|f| txn.seq() <= *f) {
            ctx.metric("detock.stale_submits", 1);
            return;
        }
        self.log(ctx, txn, keys, pieces, Admission::Submitted);
    }

    /// Appends `txn` to the current batch, unless it was submitted and the log is full (the
    /// coordinator resubmits). An adoption is never refused: the transaction is in another
    /// home's log already, and each log entry is read once — refused, it stayed half-logged,
    /// incomplete at every executor, and so did everything after it on its keys (a review's
    /// schedule: a home cut off from its followers under load).
    fn log(
        &mut self,
        ctx: &mut Ctx<'_, DetockMsg>,
        txn: TxnId,
        keys: Vec<Key>,
        pieces: Pieces,
        admission: Admission,
    ) -> bool {
        let horizon = self.config.resubmit_after * (self.config.max_sends + 1);
        let now = ctx.now();
        let Some(h) = self.home.as_mut() else { return false };
        let full = h.batch.len() >= self.config.batch_max || h.replicating.len() >= self.config.batches_in_flight_max;
        if full && admission == Admission::Submitted {
            ctx.metric("detock.log_full", 1);
            return false;
        }
        h.batch.push(LoggedTxn { txn, keys, pieces });
        h.logged.insert(txn, false);
        h.logged_order.push_back((txn, now));
        self.stats.txns_logged += 1;
        // Forget transactions logged longer ago than any resubmission comes, once they ran
        // here (one that has not, and those after it, stay: its entry may still be on its way
        // to the executors, and another home's entry of it must not make this home log it again).
        while let Some(&(old, at)) = h.logged_order.front() {
            if now.saturating_since(at) <= horizon || h.logged.get(&old) == Some(&false) {
                break;
            }
            h.logged_order.pop_front();
            h.logged.remove(&old);
            let f = h.forgotten.entry(old.coordinator()).or_default();
            *f = (*f).max(old.seq());
        }
        true
    }

    fn on_batch_tick(&mut self, ctx: &mut Ctx<'_, DetockMsg>) {
        ctx.set_timer(ServerTimer::BatchTick, self.config.batch_interval);
        let followers = self.followers();
        let shard = self.shard;
        let Some(h) = self.home.as_mut() else { return };
        if h.batch.is_empty() {
            return;
        }
        let batch = Arc::new(Batch { shard, number: h.next_number, txns: std::mem::take(&mut h.batch) });
        h.next_number += 1;
        h.replicating
            .insert(batch.number, Replicating { batch: batch.clone(), acks: BTreeSet::new(), sent_at: ctx.now() });
        self.stats.batches_sent += 1;
        for (_, node) in &followers {
            ctx.send(*node, DetockMsg::Append(batch.clone()));
        }
        self.commit_in_order(ctx);
    }

    fn on_append_ack(&mut self, ctx: &mut Ctx<'_, DetockMsg>, replica: u32, number: u64) {
        let Some(h) = self.home.as_mut() else { return };
        let Some(r) = h.replicating.get_mut(&number) else { return };
        r.acks.insert(replica);
        self.commit_in_order(ctx);
    }

    /// Commits the replicated batches, in order, and sends each to every home.
    fn commit_in_order(&mut self, ctx: &mut Ctx<'_, DetockMsg>) {
        let f = self.topology.f();
        let homes: Vec<NodeId> = (0..self.topology.shard_count() as u32).filter_map(|s| self.home_node(s)).collect();
        loop {
            let Some(h) = self.home.as_mut() else { return };
            let next = h.committed_upto + 1;
            let Some(r) = h.replicating.get(&next).filter(|r| r.acks.len() >= f) else { return };
            let batch = r.batch.clone();
            h.replicating.remove(&next);
            h.committed_upto = next;
            h.committed.insert(next, batch.clone());
            while h.committed.len() > self.config.log_keep {
                h.committed.pop_first();
            }
            self.stats.batches_committed += 1;
            for node in &homes {
                if *node != ctx.me() {
                    ctx.send(*node, DetockMsg::LogSync(batch.clone()));
                }
            }
            self.on_log_sync(ctx, batch);
        }
    }

    // ----- Follower -----

    fn on_append(&mut self, ctx: &mut Ctx<'_, DetockMsg>, from: NodeId, batch: Arc<Batch>) {
        if self.home.is_some() || batch.shard != self.shard || batch.number == 0 {
            return;
        }
        let number = batch.number;
        self.stored.insert(number, batch);
        while self.stored.len() > self.config.log_keep {
            self.stored.pop_first();
        }
        ctx.send(from, DetockMsg::AppendAck { shard: self.shard, number });
    }

    // ----- The executor -----

    fn on_log_sync(&mut self, ctx: &mut Ctx<'_, DetockMsg>, batch: Arc<Batch>) {
        let s = batch.shard;
        let held_max = self.config.held_max;
        let Some(h) = self.home.as_mut() else { return };
        let Some(&next) = h.next_batch.get(s as usize) else { return };
        if batch.number < next || h.held.contains_key(&(s, batch.number)) {
            return;
        }
        if batch.number > next && h.held.len() >= held_max {
            ctx.metric("detock.held_refused", 1);
            return;
        }
        h.held.insert((s, batch.number), batch);
        let mut complete = Vec::new();
        loop {
            let Some(h) = self.home.as_mut() else { return };
            let next = h.next_batch[s as usize];
            let Some(batch) = h.held.remove(&(s, next)) else { break };
            h.next_batch[s as usize] = next + 1;
            h.read_at[s as usize] = ctx.now();
            self.read_batch(ctx, &batch, &mut complete);
        }
        self.try_execute(ctx, &complete);
    }

    /// Adds one batch of shard `batch.shard`'s log to the graph; collects the transactions it
    /// completed.
    fn read_batch(&mut self, ctx: &mut Ctx<'_, DetockMsg>, batch: &Batch, complete: &mut Vec<TxnId>) {
        let s = batch.shard;
        for t in &batch.txns {
            if !self.valid_keys(&t.keys) || self.shards_of_keys(&t.keys) & (1 << s) == 0 {
                ctx.metric("detock.malformed_entries", 1);
                continue;
            }
            let shards = self.shards_of_keys(&t.keys);
            let mine = shards & (1 << self.shard) != 0;
            if self.config.unsafe_skip_foreign_txns && !mine {
                // The injected bug (the Tiga artifact's filter): a home never sees the edges
                // through transactions of other shards, so homes may order a cycle differently.
                continue;
            }
            let Some(h) = self.home.as_mut() else { return };
            if let Some(v) = h.vertices.get(&t.txn) {
                if v.seen & (1 << s) != 0 || v.shards != shards {
                    ctx.metric("detock.malformed_entries", 1);
                    continue;
                }
            }
            let mut deps = Vec::new();
            for &k in &t.keys {
                if self.topology.shard_of_key(k) != s {
                    continue;
                }
                let Some(h) = self.home.as_mut() else { return };
                if let Some(prev) = h.last_on_key.insert(k, t.txn).filter(|p| *p != t.txn) {
                    // An executed predecessor has left the graph: nothing to wait for.
                    if let Some(p) = h.vertices.get(&prev) {
                        deps.push(Dep { txn: prev, shards: p.shards });
                    }
                }
            }
            let Some(h) = self.home.as_mut() else { return };
            let v = h.vertices.entry(t.txn).or_insert_with(|| Vertex {
                shards,
                seen: 0,
                keys: t.keys.clone(),
                pieces: t.pieces.clone(),
                deps: Vec::new(),
            });
            v.seen |= 1 << s;
            v.deps.extend(deps);
            if v.complete() {
                complete.push(t.txn);
                complete.extend(h.waits.committed(t.txn));
            }
            // Another home logged a transaction of this shard: log it here too, unless this
            // home did already (its entry is on the way), so that one lost submission cannot
            // leave it incomplete and everything after it on its keys waiting forever.
            if mine
                && s != self.shard
                && !h.logged.contains_key(&t.txn)
                && self.log(ctx, t.txn, t.keys.clone(), t.pieces.clone(), Admission::Adopted)
            {
                self.stats.txns_adopted += 1;
                ctx.metric("detock.adopted", 1);
            }
        }
    }

    /// Executes whatever of `roots` and their ancestry can run, registers the rest with
    /// everything each waits for ([`Waits`]), and walks again what the runs released.
    fn try_execute(&mut self, ctx: &mut Ctx<'_, DetockMsg>, roots: &[TxnId]) {
        let mut roots = roots.to_vec();
        while !roots.is_empty() {
            let Some(h) = self.home.as_mut() else { return };
            let vertices = &h.vertices;
            let outcome = h.waits.walk(&roots, |t| match vertices.get(&t) {
                // Executed here: executed transactions leave the graph.
                None => Known::Executed,
                Some(v) if v.complete() => Known::Committed(&v.deps),
                Some(_) => Known::Waiting,
            });
            for component in outcome.run {
                if component.len() > 1 {
                    self.stats.cycles += 1;
                    ctx.metric("detock.cycles", 1);
                }
                for t in component {
                    self.execute(ctx, t);
                }
            }
            roots = outcome.next;
        }
    }

    fn execute(&mut self, ctx: &mut Ctx<'_, DetockMsg>, txn: TxnId) {
        let (shard, keep) = (self.shard, self.config.results_keep);
        let Some(h) = self.home.as_mut() else { return };
        let Some(v) = h.vertices.remove(&txn) else { return };
        // Every home executes every transaction it read, so a key whose last transaction ran
        // needs no entry: the next one on it has nothing to wait for.
        for k in &v.keys {
            if h.last_on_key.get(k) == Some(&txn) {
                h.last_on_key.remove(k);
            }
        }
        if v.shards & (1 << shard) == 0 {
            return;
        }
        let mut reads = Vec::new();
        for &k in &v.keys {
            if self.topology.shard_of_key(k) != shard {
                continue;
            }
            self.stats.txns_executed += 1;
            let old = h.store.get(k);
            if !reads_only(&v.pieces) {
                h.store.put(k, old.value.wrapping_add(1), old.version + 1);
            }
            reads.push((k, old.value));
        }
        h.store.run_pieces(&v.pieces, &v.keys);
        ctx.metric("detock.executed", 1);
        if let Some(ran) = h.logged.get_mut(&txn) {
            *ran = true;
        }
        ctx.send(txn.coordinator(), DetockMsg::Reply { txn, shard, reads: reads.clone() });
        h.results.insert(txn, reads);
        h.results_order.push_back(txn);
        while h.results_order.len() > keep {
            if let Some(old) = h.results_order.pop_front() {
                h.results.remove(&old);
            }
        }
    }

    fn on_sync_fetch(&mut self, ctx: &mut Ctx<'_, DetockMsg>, from: NodeId, shard: ShardId, first: u64) {
        let Some(h) = self.home.as_ref().filter(|_| shard == self.shard) else { return };
        for (_, batch) in h.committed.range(first..first.saturating_add(REPAIR_BATCH)) {
            ctx.send(from, DetockMsg::LogSync(batch.clone()));
        }
    }

    // ----- Repair -----

    fn on_repair(&mut self, ctx: &mut Ctx<'_, DetockMsg>) {
        ctx.set_timer(ServerTimer::Repair, self.config.repair_interval);
        let now = ctx.now();
        let followers = self.followers();
        let homes: Vec<Option<NodeId>> = (0..self.topology.shard_count() as u32).map(|s| self.home_node(s)).collect();
        let (me, overdue) = (ctx.me(), self.config.inquire_after);
        let Some(h) = self.home.as_mut() else { return };
        // Batches whose acknowledgements are overdue: send them again to the silent followers.
        for r in h.replicating.values_mut().take(REPAIR_BATCH as usize) {
            if now.saturating_since(r.sent_at) < overdue {
                continue;
            }
            r.sent_at = now;
            for (replica, node) in &followers {
                if !r.acks.contains(replica) {
                    self.stats.appends_again += 1;
                    ctx.metric("detock.appends_again", 1);
                    ctx.send(*node, DetockMsg::Append(r.batch.clone()));
                }
            }
        }
        // A home's next batch is lost — a later one arrived (links are FIFO), or none for a
        // while: ask that home again (it answers with what it has from there on).
        for (s, node) in homes.iter().enumerate() {
            let Some(node) = node.filter(|n| *n != me) else { continue };
            let next = h.next_batch[s];
            let gap = h.held.range((s as ShardId, next)..(s as ShardId + 1, 0)).next().is_some();
            if gap || now.saturating_since(h.read_at[s]) >= overdue {
                h.read_at[s] = now;
                self.stats.sync_fetches += 1;
                ctx.metric("detock.sync_fetches", 1);
                ctx.send(node, DetockMsg::SyncFetch { shard: s as ShardId, from: next });
            }
        }
    }
}

impl Process for Server {
    type Msg = DetockMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, DetockMsg>) {
        if let Some(h) = self.home.as_mut() {
            h.read_at.fill(ctx.now());
            ctx.set_timer(ServerTimer::BatchTick, self.config.batch_interval);
            ctx.set_timer(ServerTimer::Repair, self.config.repair_interval);
        }
    }

    fn on_message(&mut self, ctx: &mut Ctx<'_, DetockMsg>, from: NodeId, msg: DetockMsg) {
        match msg {
            DetockMsg::Submit { txn, keys, pieces } => self.on_submit(ctx, from, txn, keys, pieces),
            DetockMsg::PreRead(request) => {
                if let Some(answer) = self.store().and_then(|s| s.answer_pre_read(request)) {
                    ctx.send(from, DetockMsg::PreReadAnswer(answer));
                }
            }
            // Log batches are accepted only from the home that wrote them.
            DetockMsg::Append(batch) if self.home_node(batch.shard) == Some(from) => self.on_append(ctx, from, batch),
            DetockMsg::AppendAck { shard, number } if shard == self.shard => {
                if let Some((replica, _)) = self.followers().into_iter().find(|(_, n)| *n == from) {
                    self.on_append_ack(ctx, replica, number);
                }
            }
            DetockMsg::LogSync(batch) if self.home_node(batch.shard) == Some(from) => self.on_log_sync(ctx, batch),
            DetockMsg::SyncFetch { shard, from: first } => self.on_sync_fetch(ctx, from, shard, first),
            DetockMsg::Append(_)
            | DetockMsg::AppendAck { .. }
            | DetockMsg::LogSync(_)
            | DetockMsg::Reply { .. }
            | DetockMsg::PreReadAnswer(_) => ctx.metric("detock.ignored", 1),
        }
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_, DetockMsg>, timer: TimerId) {
        match ServerTimer::from_id(timer) {
            Some(ServerTimer::BatchTick) => self.on_batch_tick(ctx),
            Some(ServerTimer::Repair) => self.on_repair(ctx),
            None => {}
        }
    }

    fn invariants(&self) -> Result<(), String> {
        let Some(h) = &self.home else { return Ok(()) };
        if h.committed_upto >= h.next_number {
            return Err(format!("batch {} committed before it was sent", h.committed_upto));
        }
        Ok(())
    }
}
