//! A Calvin+ server: one per (shard, replica), playing three parts.
//!
//! - **Sequencer** (the shard's designated replica only, [`designated`]): batches the
//!   transactions submitted to it into an epoch every `epoch_interval` (empty epochs too) and
//!   multicasts each to its shard's replicas with a deadline = send time + the largest
//!   one-way delay it has measured to them (a percentile of recent samples). When an epoch
//!   has run at every involved shard it answers the coordinators.
//! - **Replica of the shard's epoch log** (every server, Nezha's receiver side): holds each
//!   epoch until its local clock passes the deadline and releases epochs in order; replies
//!   *fast* to every replica of the shard when the epoch arrived before its deadline, and
//!   *synced* once it holds the sequencer's own reply with the same log hash. An epoch is
//!   committed at a replica with the sequencer's reply plus a super quorum of fast replies
//!   with its hash (fast path), or plus f synced ones (slow path). Committed epochs are
//!   reported, in order, to the scheduler of every shard in this server's row (replica index).
//! - **Scheduler** (every server, for its shard, in its row): executes the reported epochs in
//!   Calvin's global order (epoch number, then shard), each epoch's transactions in batch
//!   order, on its shard's keys, and sends the values read to the sequencer when this row is
//!   the sequencer's.
//!
//! Loss is repaired by pulls on a periodic timer: a replica fetches epochs it lacks and asks
//! again for replies it misses; a scheduler stuck on a position asks for that report again; a
//! sequencer re-reports an epoch whose results are overdue (a scheduler that already ran it
//! sends its kept results again). Coordinators resubmit, and the sequencer answers a
//! transaction it already batched without batching it twice.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use kairos_core::{Ctx, LocalTime, NodeId, Process, Timer, TimerId};
use kairos_workload::txn::{Key, ShardId, TxnId, Value};
use kairos_workload::{reads_only, Pieces, Topology};
use xxhash_rust::xxh3::xxh3_64;

use super::msg::{BatchedTxn, CalvinMsg, EpochBody, ReplyKind};
use super::{designated, CalvinConfig};
use crate::store::Store;

kairos_core::timers! {
    /// A Calvin+ server's timers.
    pub enum ServerTimer {
        /// The sequencer closes its current epoch.
        EpochTick = 1,
        /// The next held epoch's deadline.
        Release = 2,
        /// The periodic repair of lost messages.
        Repair = 3,
    }
}

/// A transaction's values read on one shard.
type TxnReads = (TxnId, Vec<(Key, Value)>);

/// Executed positions whose order hash a scheduler remembers (for the cross-row check).
pub const EXECUTION_MEMORY: usize = 4_096;

/// Epochs fetched or inquired about per repair round, at most.
const REPAIR_BATCH: u64 = 16;

/// A released or held epoch of this server's shard.
#[derive(Clone, Debug)]
struct LogEntry {
    body: Arc<EpochBody>,
    /// Arrived (on this server's clock) no later than its deadline.
    on_time: bool,
    /// The log hash up to this epoch, once released.
    hash: Option<u64>,
    /// The synced reply was sent.
    synced_sent: bool,
    /// Arrival time minus send time (the sequencer's one-way-delay sample).
    owd_ns: u64,
    /// When it was released (local time).
    released_at: LocalTime,
}

/// The replies a replica collected for one epoch of its shard.
#[derive(Clone, Debug, Default)]
struct Votes {
    /// Replica → log hash of its fast reply.
    fast: BTreeMap<u32, u64>,
    /// Replica → log hash of its synced reply.
    synced: BTreeMap<u32, u64>,
    /// Committed here, and whether on the fast path.
    committed: Option<bool>,
}

/// A transaction of a reported epoch, waiting for its shards' results at the sequencer.
#[derive(Clone, Debug)]
struct Gathering {
    awaiting: BTreeSet<ShardId>,
    reads: Vec<(Key, Value)>,
}

/// An epoch the sequencer reported and whose transactions have not all executed everywhere.
#[derive(Clone, Debug)]
struct Outstanding {
    body: Arc<EpochBody>,
    fast: bool,
    txns: BTreeMap<TxnId, Gathering>,
    reported_at: LocalTime,
}

/// What the sequencer knows of a submitted transaction (for resubmissions).
#[derive(Clone, Debug)]
enum Known {
    Waiting { coordinator: NodeId },
    Done { reads: Vec<(Key, Value)>, fast: bool },
}

/// The sequencer's part of a designated replica.
#[derive(Clone, Debug, Default)]
struct Sequencer {
    next_epoch: u64,
    batch: Vec<BatchedTxn>,
    known: BTreeMap<TxnId, Known>,
    /// `known`'s transactions and when they were submitted, oldest first: a finished one is
    /// forgotten once no coordinator resubmits it any more (module docs of [`super::coordinator`]).
    known_order: VecDeque<(TxnId, LocalTime)>,
    /// Per coordinator, the highest sequence number forgotten: an older submission (a
    /// replayed message) is refused rather than batched again.
    forgotten: BTreeMap<NodeId, u32>,
    outstanding: BTreeMap<u64, Outstanding>,
    /// Per replica: recent one-way-delay samples (ns), oldest first.
    owd: Vec<VecDeque<u64>>,
}

/// The server's counters.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    pub epochs_sent: u64,
    pub epochs_committed_fast: u64,
    pub epochs_committed_slow: u64,
    pub epochs_late: u64,
    pub txns_executed: u64,
    pub fetches: u64,
    pub inquiries: u64,
    pub report_fetches: u64,
    pub results_resent: u64,
}

/// See the module docs.
pub struct Server {
    topology: Topology,
    config: CalvinConfig,
    shard: ShardId,
    replica: u32,
    sequencer: Option<Sequencer>,
    // The shard's epoch log.
    log: BTreeMap<u64, LogEntry>,
    released_upto: u64,
    last_hash: u64,
    votes: BTreeMap<u64, Votes>,
    reported_upto: u64,
    /// The highest epoch of this shard heard of (from any message).
    epoch_heard_max: u64,
    /// When the last new epoch arrived.
    epoch_arrived_at: LocalTime,
    // The scheduler.
    reports: BTreeMap<(u64, ShardId), Arc<EpochBody>>,
    next_position: (u64, ShardId),
    progressed_at: LocalTime,
    store: Store,
    executed: u64,
    /// Results sent to sequencers, kept for resends: (shard, epoch) → reads.
    kept_results: BTreeMap<(ShardId, u64), Vec<TxnReads>>,
    /// Positions executed, and the hash chain of their order after each of the last
    /// [`EXECUTION_MEMORY`] (equal on every row for a shard).
    positions: u64,
    execution_hashes: VecDeque<u64>,
    /// Positions executed under [`CalvinConfig::unsafe_execute_in_arrival_order`].
    arrival_executed: BTreeSet<(u64, ShardId)>,
    stats: ServerStats,
}

impl Server {
    /// The shard store, to give it a TPC-C shard's warehouses before the server starts.
    pub fn store_mut(&mut self) -> &mut Store {
        &mut self.store
    }

    pub fn new(topology: &Topology, config: &CalvinConfig, shard: ShardId, replica: u32) -> Self {
        let n = topology.replicas_per_shard();
        let sequencer = (designated(shard, n) == replica).then(|| Sequencer {
            next_epoch: 1,
            owd: vec![VecDeque::new(); n],
            ..Sequencer::default()
        });
        Server {
            topology: topology.clone(),
            config: config.clone(),
            shard,
            replica,
            sequencer,
            log: BTreeMap::new(),
            released_upto: 0,
            last_hash: 0,
            votes: BTreeMap::new(),
            reported_upto: 0,
            epoch_heard_max: 0,
            epoch_arrived_at: LocalTime::ZERO,
            reports: BTreeMap::new(),
            next_position: (1, 0),
            progressed_at: LocalTime::ZERO,
            store: Store::default(),
            executed: 0,
            kept_results: BTreeMap::new(),
            positions: 0,
            execution_hashes: VecDeque::new(),
            arrival_executed: BTreeSet::new(),
            stats: ServerStats::default(),
        }
    }

    pub fn stats(&self) -> ServerStats {
        self.stats
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Positions (epoch, shard) this scheduler executed.
    pub fn positions_executed(&self) -> u64 {
        self.positions
    }

    /// The hash chain of the first `count` executed positions, if still remembered (the last
    /// [`EXECUTION_MEMORY`]): two schedulers of one shard must agree on it.
    pub fn execution_hash_at(&self, count: u64) -> Option<u64> {
        if count == 0 {
            return Some(0);
        }
        let first = self.positions.checked_sub(self.execution_hashes.len() as u64)?;
        let i = count.checked_sub(first + 1)?;
        self.execution_hashes.get(i as usize).copied()
    }

    fn n(&self) -> usize {
        self.topology.replicas_per_shard()
    }

    /// The server of `shard` in this server's row (replica index).
    fn row_node(&self, shard: ShardId) -> Option<NodeId> {
        self.topology.shards.get(shard as usize).and_then(|r| r.get(self.replica as usize)).copied()
    }

    fn leader(&self) -> u32 {
        designated(self.shard, self.n())
    }

    fn peers(&self) -> Vec<NodeId> {
        self.topology.shards[self.shard as usize].clone()
    }

    /// The current deadline headroom: the largest over replicas of the configured percentile
    /// of its recent one-way-delay samples (the initial bound before a replica has any).
    fn bound_ns(&self) -> u64 {
        let Some(seq) = &self.sequencer else { return 0 };
        let initial = self.config.initial_bound.as_nanos() as u64;
        let mut bound = 0;
        for (r, samples) in seq.owd.iter().enumerate() {
            if r as u32 == self.replica {
                continue;
            }
            if samples.is_empty() {
                bound = bound.max(initial);
                continue;
            }
            let mut v: Vec<u64> = samples.iter().copied().collect();
            v.sort_unstable();
            let i = ((v.len() - 1) as f64 * self.config.owd_percentile / 100.0).round() as usize;
            bound = bound.max(v[i.min(v.len() - 1)]);
        }
        bound
    }

    // ----- Sequencer -----

    fn on_submit(&mut self, ctx: &mut Ctx<'_, CalvinMsg>, from: NodeId, txn: TxnId, keys: Vec<Key>, pieces: Pieces) {
        let horizon = self.config.resubmit_after * (self.config.max_sends + 1);
        let now = ctx.now();
        let Some(seq) = self.sequencer.as_mut() else {
            ctx.metric("calvin.submit_not_sequencer", 1);
            return;
        };
        match seq.known.get(&txn) {
            Some(Known::Done { reads, fast, .. }) => {
                ctx.send(from, CalvinMsg::Reply { txn, reads: reads.clone(), fast: *fast });
                return;
            }
            Some(Known::Waiting { .. }) => return,
            None => {}
        }
        if seq.forgotten.get(&txn.coordinator()).is_some_and(|f| txn.seq() <= *f) {
            ctx.metric("calvin.stale_submits", 1);
            return;
        }
        if keys.is_empty() || seq.batch.len() >= self.config.batch_max {
            ctx.metric("calvin.submit_refused", 1);
            return;
        }
        seq.batch.push(BatchedTxn { txn, keys, pieces });
        seq.known.insert(txn, Known::Waiting { coordinator: from });
        seq.known_order.push_back((txn, now));
        // Forget finished transactions submitted longer ago than any resubmission comes
        // (a waiting one, and those after it, stay).
        while let Some(&(old, at)) = seq.known_order.front() {
            if now.saturating_since(at) <= horizon || matches!(seq.known.get(&old), Some(Known::Waiting { .. })) {
                break;
            }
            seq.known_order.pop_front();
            seq.known.remove(&old);
            let f = seq.forgotten.entry(old.coordinator()).or_default();
            *f = (*f).max(old.seq());
        }
    }

    fn on_epoch_tick(&mut self, ctx: &mut Ctx<'_, CalvinMsg>) {
        let bound = self.bound_ns();
        let Some(seq) = self.sequencer.as_mut() else { return };
        let now = ctx.now().as_nanos();
        let body = Arc::new(EpochBody {
            shard: self.shard,
            epoch: seq.next_epoch,
            sent_ns: now,
            deadline_ns: now + bound,
            txns: std::mem::take(&mut seq.batch),
        });
        seq.next_epoch += 1;
        self.stats.epochs_sent += 1;
        ctx.set_timer(ServerTimer::EpochTick, self.config.epoch_interval);
        for (r, node) in self.peers().into_iter().enumerate() {
            if r as u32 != self.replica {
                ctx.send(node, CalvinMsg::Epoch(body.clone()));
            }
        }
        self.on_epoch(ctx, body);
    }

    /// The sequencer registers a reported epoch's transactions to gather their results.
    fn gather(&mut self, ctx: &mut Ctx<'_, CalvinMsg>, body: &Arc<EpochBody>, fast: bool) {
        let shard_of = |k: Key| self.topology.shard_of_key(k);
        let Some(seq) = self.sequencer.as_mut() else { return };
        if body.txns.is_empty() {
            return;
        }
        let txns = body
            .txns
            .iter()
            .map(|t| (t.txn, Gathering { awaiting: t.keys.iter().map(|k| shard_of(*k)).collect(), reads: Vec::new() }))
            .collect();
        seq.outstanding.insert(body.epoch, Outstanding { body: body.clone(), fast, txns, reported_at: ctx.now() });
    }

    fn on_results(
        &mut self,
        ctx: &mut Ctx<'_, CalvinMsg>,
        epoch: u64,
        from: ShardId,
        reads: Vec<(TxnId, Vec<(Key, Value)>)>,
    ) {
        let Some(seq) = self.sequencer.as_mut() else { return };
        let Some(out) = seq.outstanding.get_mut(&epoch) else { return };
        let fast = out.fast;
        for (txn, kv) in reads {
            let Some(g) = out.txns.get_mut(&txn) else { continue };
            if !g.awaiting.remove(&from) {
                continue;
            }
            g.reads.extend(kv);
            if g.awaiting.is_empty() {
                let Some(g) = out.txns.remove(&txn) else { continue };
                if let Some(Known::Waiting { coordinator }) = seq.known.get(&txn).cloned() {
                    ctx.send(coordinator, CalvinMsg::Reply { txn, reads: g.reads.clone(), fast });
                    seq.known.insert(txn, Known::Done { reads: g.reads, fast });
                }
            }
        }
        if out.txns.is_empty() {
            seq.outstanding.remove(&epoch);
        }
    }

    // ----- Replica of the shard's epoch log -----

    fn on_epoch(&mut self, ctx: &mut Ctx<'_, CalvinMsg>, body: Arc<EpochBody>) {
        if body.shard != self.shard || body.epoch == 0 {
            return;
        }
        self.epoch_heard_max = self.epoch_heard_max.max(body.epoch);
        if body.epoch <= self.released_upto || self.log.contains_key(&body.epoch) {
            return;
        }
        let on_time = ctx.now().as_nanos() <= body.deadline_ns;
        if !on_time {
            self.stats.epochs_late += 1;
            ctx.metric("calvin.epochs_late", 1);
        }
        // The sequencer's one-way-delay sample rides on this replica's replies.
        let owd_ns = ctx.now().as_nanos().saturating_sub(body.sent_ns);
        // The sequencer never replies synced: its own log is the reference.
        let synced_sent = self.replica == self.leader();
        self.votes.entry(body.epoch).or_default();
        self.log.insert(
            body.epoch,
            LogEntry { body, on_time, hash: None, synced_sent, owd_ns, released_at: LocalTime::ZERO },
        );
        self.epoch_arrived_at = ctx.now();
        self.release_due(ctx);
    }

    /// Releases held epochs in order whose deadline has passed on this clock; arms the
    /// release timer for the next one.
    fn release_due(&mut self, ctx: &mut Ctx<'_, CalvinMsg>) {
        loop {
            let e = self.released_upto + 1;
            let Some(entry) = self.log.get_mut(&e) else { return };
            let now = ctx.now().as_nanos();
            if now < entry.body.deadline_ns {
                ctx.set_timer(ServerTimer::Release, Duration::from_nanos(entry.body.deadline_ns - now));
                return;
            }
            let mut bytes = Vec::with_capacity(32 + 8 * entry.body.txns.len());
            bytes.extend_from_slice(&self.last_hash.to_le_bytes());
            bytes.extend_from_slice(&e.to_le_bytes());
            bytes.extend_from_slice(&entry.body.deadline_ns.to_le_bytes());
            for t in &entry.body.txns {
                bytes.extend_from_slice(&t.txn.coordinator().0.to_le_bytes());
                bytes.extend_from_slice(&t.txn.seq().to_le_bytes());
            }
            let hash = xxh3_64(&bytes);
            entry.hash = Some(hash);
            entry.released_at = ctx.now();
            self.last_hash = hash;
            self.released_upto = e;
            if entry.on_time {
                let owd = entry.owd_ns;
                self.vouch(ctx, e, ReplyKind::Fast, hash, owd);
            }
            self.maybe_synced(ctx, e);
            self.try_commit(ctx, e);
        }
    }

    /// Sends this replica's reply for `e` to every replica of the shard (itself directly).
    fn vouch(&mut self, ctx: &mut Ctx<'_, CalvinMsg>, e: u64, kind: ReplyKind, hash: u64, owd_ns: u64) {
        let msg =
            CalvinMsg::EpochReply { shard: self.shard, epoch: e, replica: self.replica, kind, log_hash: hash, owd_ns };
        for (r, node) in self.peers().into_iter().enumerate() {
            if r as u32 != self.replica {
                ctx.send(node, msg.clone());
            }
        }
        self.record_vote(e, self.replica, kind, hash);
    }

    fn record_vote(&mut self, e: u64, replica: u32, kind: ReplyKind, hash: u64) {
        if e <= self.reported_upto {
            return;
        }
        let v = self.votes.entry(e).or_default();
        match kind {
            ReplyKind::Fast => v.fast.insert(replica, hash),
            ReplyKind::Synced => v.synced.insert(replica, hash),
        };
    }

    /// The sequencer's reply for `e`, if this replica holds it.
    fn leader_hash(&self, e: u64) -> Option<u64> {
        self.votes.get(&e).and_then(|v| v.fast.get(&self.leader()).copied())
    }

    /// A follower that released `e` and holds the sequencer's reply with the same hash
    /// replies synced (once).
    fn maybe_synced(&mut self, ctx: &mut Ctx<'_, CalvinMsg>, e: u64) {
        let Some(leader_hash) = self.leader_hash(e) else { return };
        let Some(entry) = self.log.get_mut(&e) else { return };
        if entry.synced_sent || entry.hash != Some(leader_hash) {
            return;
        }
        entry.synced_sent = true;
        // A late epoch's delay sample reaches the sequencer here (it sent no fast reply).
        let owd = if entry.on_time { 0 } else { entry.owd_ns };
        self.vouch(ctx, e, ReplyKind::Synced, leader_hash, owd);
    }

    fn on_epoch_reply(
        &mut self,
        ctx: &mut Ctx<'_, CalvinMsg>,
        e: u64,
        replica: u32,
        kind: ReplyKind,
        hash: u64,
        owd_ns: u64,
    ) {
        if replica as usize >= self.n() || e == 0 {
            return;
        }
        self.epoch_heard_max = self.epoch_heard_max.max(e);
        if let Some(seq) = self.sequencer.as_mut() {
            if owd_ns > 0 && replica != self.replica {
                let w = &mut seq.owd[replica as usize];
                w.push_back(owd_ns);
                if w.len() > self.config.owd_window {
                    w.pop_front();
                }
            }
        }
        self.record_vote(e, replica, kind, hash);
        if replica == self.leader() {
            self.maybe_synced(ctx, e);
        }
        self.try_commit(ctx, e);
    }

    fn try_commit(&mut self, ctx: &mut Ctx<'_, CalvinMsg>, e: u64) {
        let (f, super_quorum, leader) = (self.topology.f(), self.topology.super_quorum(), self.leader());
        let Some(mine) = self.log.get(&e).and_then(|x| x.hash) else { return };
        let Some(v) = self.votes.get_mut(&e) else { return };
        let Some(leader_hash) = v.fast.get(&leader).copied() else { return };
        if v.committed.is_some() {
            return;
        }
        if mine != leader_hash {
            // Impossible with one sender per shard; a mismatch would be a bug, not a slow path.
            ctx.metric("calvin.hash_mismatch", 1);
            return;
        }
        let fast = v.fast.values().filter(|h| **h == leader_hash).count() >= super_quorum;
        let slow = 1 + v.synced.iter().filter(|(r, h)| **r != leader && **h == leader_hash).count() > f;
        if !(fast || slow) {
            return;
        }
        v.committed = Some(fast);
        if fast {
            self.stats.epochs_committed_fast += 1;
        } else {
            self.stats.epochs_committed_slow += 1;
        }
        self.report_in_order(ctx);
    }

    /// Reports committed epochs, in order, to the scheduler of every shard in this row.
    fn report_in_order(&mut self, ctx: &mut Ctx<'_, CalvinMsg>) {
        loop {
            let e = self.reported_upto + 1;
            let Some(fast) = self.votes.get(&e).and_then(|v| v.committed) else { return };
            let Some(body) = self.log.get(&e).map(|x| x.body.clone()) else { return };
            self.votes.remove(&e);
            self.reported_upto = e;
            self.gather(ctx, &body, fast);
            self.report(ctx, &body, None);
            // Keep a window of the log for replicas and schedulers that ask again.
            while self.log.len() > self.config.log_keep {
                let Some((&first, _)) = self.log.first_key_value() else { break };
                self.log.remove(&first);
            }
        }
    }

    /// Sends `body` to the scheduler of each shard (`only`: of that one) in this row.
    fn report(&mut self, ctx: &mut Ctx<'_, CalvinMsg>, body: &Arc<EpochBody>, only: Option<ShardId>) {
        let row = self.replica as usize;
        for s in 0..self.topology.shard_count() {
            if only.is_some_and(|o| o as usize != s) {
                continue;
            }
            if s == self.shard as usize {
                self.on_report(ctx, body.clone());
            } else if let Some(node) = self.topology.shards[s].get(row) {
                ctx.send(*node, CalvinMsg::Report(body.clone()));
            }
        }
    }

    // ----- Scheduler -----

    fn on_report(&mut self, ctx: &mut Ctx<'_, CalvinMsg>, body: Arc<EpochBody>) {
        let position = (body.epoch, body.shard);
        if body.shard as usize >= self.topology.shard_count() || body.epoch == 0 {
            return;
        }
        let executed = if self.config.unsafe_execute_in_arrival_order {
            // The injected bug: run each report as it arrives, out of the global order.
            !self.arrival_executed.insert(position)
        } else {
            position < self.next_position
        };
        if executed {
            // Already executed: the sequencer asks again for results it lost.
            if let Some(reads) = self.kept_results.get(&(body.shard, body.epoch)) {
                let to = self.topology.shards[body.shard as usize][self.replica as usize];
                let msg =
                    CalvinMsg::Results { shard: body.shard, epoch: body.epoch, from: self.shard, reads: reads.clone() };
                self.stats.results_resent += 1;
                ctx.send(to, msg);
            }
            return;
        }
        if self.reports.len() >= self.config.reports_max && !self.reports.contains_key(&position) {
            ctx.metric("calvin.reports_refused", 1);
            return;
        }
        if self.config.unsafe_execute_in_arrival_order {
            self.execute(ctx, &body);
            return;
        }
        self.reports.insert(position, body);
        while let Some(body) = self.reports.remove(&self.next_position) {
            self.execute(ctx, &body);
            let (e, s) = self.next_position;
            self.next_position = if (s as usize) + 1 < self.topology.shard_count() { (e, s + 1) } else { (e + 1, 0) };
            self.progressed_at = ctx.now();
        }
    }

    fn execute(&mut self, ctx: &mut Ctx<'_, CalvinMsg>, body: &EpochBody) {
        let mut reads = Vec::new();
        for t in &body.txns {
            let mut kv = Vec::new();
            let writes = !reads_only(&t.pieces);
            for &k in &t.keys {
                if self.topology.shard_of_key(k) != self.shard {
                    continue;
                }
                let v = self.store.get(k).value;
                if writes {
                    self.executed += 1;
                    self.store.put(k, v.wrapping_add(1), self.executed);
                }
                kv.push((k, v));
            }
            if !kv.is_empty() {
                self.store.run_pieces(&t.pieces, &t.keys);
                self.stats.txns_executed += 1;
                reads.push((t.txn, kv));
            }
        }
        let mut bytes = self.execution_hashes.back().copied().unwrap_or(0).to_le_bytes().to_vec();
        bytes.extend_from_slice(&body.epoch.to_le_bytes());
        bytes.extend_from_slice(&body.shard.to_le_bytes());
        self.positions += 1;
        self.execution_hashes.push_back(xxh3_64(&bytes));
        if self.execution_hashes.len() > EXECUTION_MEMORY {
            self.execution_hashes.pop_front();
        }
        ctx.metric("calvin.positions_executed", 1);
        let sequencer_row = designated(body.shard, self.n());
        if reads.is_empty() || sequencer_row != self.replica {
            return;
        }
        let to = self.topology.shards[body.shard as usize][sequencer_row as usize];
        ctx.send(
            to,
            CalvinMsg::Results { shard: body.shard, epoch: body.epoch, from: self.shard, reads: reads.clone() },
        );
        self.kept_results.insert((body.shard, body.epoch), reads);
        while self.kept_results.len() > self.config.log_keep {
            self.kept_results.pop_first();
        }
    }

    fn on_report_fetch(&mut self, ctx: &mut Ctx<'_, CalvinMsg>, from: NodeId, shard: ShardId, from_epoch: u64) {
        if shard != self.shard {
            return;
        }
        let upto = self.reported_upto.min(from_epoch.saturating_add(REPAIR_BATCH));
        for e in from_epoch..=upto {
            if let Some(entry) = self.log.get(&e) {
                ctx.send(from, CalvinMsg::Report(entry.body.clone()));
            }
        }
    }

    // ----- Repair -----

    fn on_repair(&mut self, ctx: &mut Ctx<'_, CalvinMsg>) {
        ctx.set_timer(ServerTimer::Repair, self.config.repair_interval);
        let peers = self.peers();
        let leader = self.leader();
        // Epochs this replica lacks, taken as lost when a later one arrived (links are FIFO) or
        // when none arrived for a while though later ones were heard of: fetch each from the
        // other replicas in turn (any of them holds what it released; the sequencer may be the
        // one that went quiet).
        let first_missing = self.released_upto + 1;
        let quiet = ctx.now().saturating_since(self.epoch_arrived_at) >= self.config.repair_interval * 4;
        let last_held = self.log.last_key_value().map_or(0, |(e, _)| *e);
        let others: Vec<NodeId> =
            peers.iter().enumerate().filter(|(r, _)| *r as u32 != self.replica).map(|(_, n)| *n).collect();
        for e in first_missing..=self.epoch_heard_max.min(first_missing + REPAIR_BATCH) {
            if !self.log.contains_key(&e) && self.replica != leader && (e < last_held || quiet) && !others.is_empty() {
                ctx.metric("calvin.epoch_fetches", 1);
                let to = others[self.stats.fetches as usize % others.len()];
                self.stats.fetches += 1;
                ctx.send(to, CalvinMsg::FetchEpoch { shard: self.shard, epoch: e });
            }
        }
        // Released epochs not yet committed here: ask the replicas whose replies are missing.
        let now = ctx.now();
        for e in (self.reported_upto + 1)..=self.released_upto.min(self.reported_upto + REPAIR_BATCH) {
            let Some(v) = self.votes.get(&e) else { continue };
            let overdue =
                self.log.get(&e).is_some_and(|x| now.saturating_since(x.released_at) >= self.config.inquire_after);
            if !overdue {
                continue;
            }
            for (r, node) in peers.iter().enumerate() {
                let r = r as u32;
                if r != self.replica && !v.fast.contains_key(&r) && !v.synced.contains_key(&r) {
                    self.stats.inquiries += 1;
                    ctx.metric("calvin.inquiries", 1);
                    ctx.send(*node, CalvinMsg::Inquire { shard: self.shard, epoch: e });
                }
            }
        }
        // The scheduler's next position is lost — a later report of its shard arrived (links
        // are FIFO), or nothing ran for longer than a report takes: ask for it again.
        let (e, s) = self.next_position;
        let gap = self.reports.range((e, s)..).any(|((_, from), _)| *from == s);
        let stalled = ctx.now().saturating_since(self.progressed_at) >= self.config.inquire_after;
        if (gap || stalled) && !self.reports.contains_key(&self.next_position) {
            // (This server's own replica reports its shard's epochs when they commit.)
            let node = self.topology.shards.get(s as usize).and_then(|r| r.get(self.replica as usize));
            if let Some(node) = node.filter(|_| s != self.shard) {
                self.stats.report_fetches += 1;
                ctx.metric("calvin.report_fetches", 1);
                ctx.send(*node, CalvinMsg::ReportFetch { shard: s, from_epoch: e });
            }
        }
        // The sequencer: results overdue — report again to the shards that have not answered.
        let overdue = self.config.inquire_after;
        let mut again = Vec::new();
        if let Some(seq) = self.sequencer.as_mut() {
            for out in seq.outstanding.values_mut() {
                if now.saturating_since(out.reported_at) < overdue {
                    continue;
                }
                out.reported_at = now;
                let shards: BTreeSet<ShardId> = out.txns.values().flat_map(|g| g.awaiting.iter().copied()).collect();
                again.extend(shards.into_iter().map(|s| (out.body.clone(), s)));
            }
        }
        for (body, s) in again {
            ctx.metric("calvin.reports_again", 1);
            self.report(ctx, &body, Some(s));
        }
    }

    fn on_fetch(&mut self, ctx: &mut Ctx<'_, CalvinMsg>, from: NodeId, shard: ShardId, epoch: u64) {
        if shard != self.shard {
            return;
        }
        if let Some(entry) = self.log.get(&epoch) {
            ctx.send(from, CalvinMsg::Epoch(entry.body.clone()));
        }
    }

    fn on_inquire(&mut self, ctx: &mut Ctx<'_, CalvinMsg>, from: NodeId, shard: ShardId, epoch: u64) {
        if shard != self.shard {
            return;
        }
        self.epoch_heard_max = self.epoch_heard_max.max(epoch);
        let Some(entry) = self.log.get(&epoch) else { return };
        let Some(hash) = entry.hash else { return };
        let owd = 0;
        let reply =
            |kind| CalvinMsg::EpochReply { shard, epoch, replica: self.replica, kind, log_hash: hash, owd_ns: owd };
        if entry.on_time || self.replica == self.leader() {
            ctx.send(from, reply(ReplyKind::Fast));
        }
        if entry.synced_sent && self.replica != self.leader() {
            ctx.send(from, reply(ReplyKind::Synced));
        }
    }
}

impl Process for Server {
    type Msg = CalvinMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, CalvinMsg>) {
        self.progressed_at = ctx.now();
        if self.sequencer.is_some() {
            ctx.set_timer(ServerTimer::EpochTick, self.config.epoch_interval);
        }
        ctx.set_timer(ServerTimer::Repair, self.config.repair_interval);
    }

    fn on_message(&mut self, ctx: &mut Ctx<'_, CalvinMsg>, from: NodeId, msg: CalvinMsg) {
        match msg {
            CalvinMsg::Submit { txn, keys, pieces } => self.on_submit(ctx, from, txn, keys, pieces),
            CalvinMsg::PreRead(request) => {
                if let Some(answer) = self.store.answer_pre_read(request) {
                    ctx.send(from, CalvinMsg::PreReadAnswer(answer));
                }
            }
            CalvinMsg::Ping { nonce } => {
                if self.sequencer.is_some() {
                    ctx.send(from, CalvinMsg::Pong { nonce });
                }
            }
            // Epochs, reports and results are accepted only from the servers that send them:
            // a replica of this shard, the reporting replica in this row, a scheduler in it.
            CalvinMsg::Epoch(body) if self.peers().contains(&from) => self.on_epoch(ctx, body),
            CalvinMsg::EpochReply { shard, epoch, replica, kind, log_hash, owd_ns } => {
                if shard == self.shard && self.topology.shards[shard as usize].get(replica as usize) == Some(&from) {
                    self.on_epoch_reply(ctx, epoch, replica, kind, log_hash, owd_ns);
                }
            }
            CalvinMsg::FetchEpoch { shard, epoch } => self.on_fetch(ctx, from, shard, epoch),
            CalvinMsg::Inquire { shard, epoch } => self.on_inquire(ctx, from, shard, epoch),
            CalvinMsg::Report(body) if self.row_node(body.shard) == Some(from) => self.on_report(ctx, body),
            CalvinMsg::ReportFetch { shard, from_epoch } => self.on_report_fetch(ctx, from, shard, from_epoch),
            CalvinMsg::Results { shard, epoch, from: s, reads }
                if shard == self.shard && self.row_node(s) == Some(from) =>
            {
                self.on_results(ctx, epoch, s, reads)
            }
            CalvinMsg::Epoch(_)
            | CalvinMsg::Report(_)
            | CalvinMsg::Results { .. }
            | CalvinMsg::Reply { .. }
            | CalvinMsg::Pong { .. }
            | CalvinMsg::PreReadAnswer(_) => ctx.metric("calvin.ignored", 1),
        }
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_, CalvinMsg>, timer: TimerId) {
        match ServerTimer::from_id(timer) {
            Some(ServerTimer::EpochTick) => self.on_epoch_tick(ctx),
            Some(ServerTimer::Release) => self.release_due(ctx),
            Some(ServerTimer::Repair) => self.on_repair(ctx),
            None => {}
        }
    }

    fn invariants(&self) -> Result<(), String> {
        if self.reported_upto > self.released_upto {
            return Err(format!("reported epoch {} before releasing it ({})", self.reported_upto, self.released_upto));
        }
        Ok(())
    }
}
