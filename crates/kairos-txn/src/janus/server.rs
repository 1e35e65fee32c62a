//! A Janus server: one replica of one shard. It answers pre-accepts with the transactions
//! each new one conflicts with here, records accepted and committed dependencies, executes
//! committed transactions in the order [`super::graph`] derives, and answers inquiries.
//!
//! # Dependencies a replica reports
//! For each key of the new transaction on this shard: **every** transaction that accessed the
//! key here and has not executed here yet, plus the **last** one that executed here (whose
//! committed ancestry holds every earlier executed accessor, since this replica executed them
//! in a conflict order every server shares). Janus's code reports only the last accessor;
//! with a slow path that unions only a majority's replies that can leave two conflicting
//! transactions unordered (module docs of [`super`]).
//!
//! # Waiting for ancestors
//! An ancestor this server has not seen committed blocks execution. If it touches this shard
//! its commit is on its way (the coordinator sends it to every replica); after `inquire_after`
//! the server asks another replica of its shard. If it does not touch this shard, the server
//! asks a server of one of its shards at once (the one in its own row first — in the
//! co-located placement, the same region). The asked server answers once it knows the
//! commit. Waiting never forms a cycle: a commit never waits for an execution.
//!
//! # Memory
//! An executed transaction's record (its dependencies and values read, for inquiries and
//! resent commits) is dropped `forget_after` after it executed, or, while a key here still
//! names it as its last executed accessor (every pre-accept on the key reports it), once
//! `forget_after` has passed since a later one took its place: at most one such record per
//! key. (Dropped while still reported, it was named in normal operation after a key sat idle
//! for `forget_after`, and the other shards of the transaction that depended on it asked about
//! it forever: a review's schedule.) Its id stays in a set, so that nothing executes twice.
//! A message that names a dropped transaction later than that (a delay no campaign injects),
//! or an inquiry about an ancestor of a kept record that was itself dropped, stalls what
//! depends on it here, never executes anything twice.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use kairos_core::{Ctx, LocalTime, NodeId, Process, TimerId};
use kairos_workload::txn::{Key, ShardId, TxnId, Value};
use kairos_workload::{reads_only, Pieces, Topology};
use xxhash_rust::xxh3::xxh3_64;

use super::graph::Known;
use super::msg::{shards_of, Answer, Dep, JanusMsg, ShardSet};
use super::waits::Waits;
use super::JanusConfig;
use crate::store::Store;

kairos_core::timers! {
    /// A Janus server's timers.
    pub enum ServerTimer {
        /// Inquire again about overdue ancestors; forget old executed transactions.
        Repair = 1,
    }
}

/// Recently written keys a server remembers for the cross-replica check.
pub const RECENT_WRITES: usize = 32;

#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Status {
    PreAccepted,
    Accepted,
    Committed,
    Executed,
}

/// What a server holds of one transaction.
#[derive(Clone, Debug)]
struct Vertex {
    shards: ShardSet,
    /// Its keys on this shard (empty for a transaction of other shards, or not yet known), and
    /// what it runs here besides (TPC-C's pieces).
    keys: Vec<Key>,
    pieces: Pieces,
    status: Status,
    /// Accepted or committed dependencies (the reported ones while pre-accepted).
    deps: Vec<Dep>,
    /// What this replica reported at pre-accept (repeated to a repeated pre-accept).
    reported: Option<Vec<Dep>>,
    /// Listed among its keys' accessors here.
    listed: bool,
    /// The coordinator asked for the values read.
    reply: bool,
    /// Values read, once executed here.
    reads: Vec<(Key, Value)>,
}

impl Vertex {
    fn new(shards: ShardSet, keys: Vec<Key>, pieces: Pieces, status: Status, deps: Vec<Dep>) -> Self {
        Vertex { shards, keys, pieces, status, deps, reported: None, listed: false, reply: false, reads: Vec::new() }
    }
}

/// A key's accessors on this replica.
#[derive(Clone, Debug, Default)]
struct Accessors {
    pending: Vec<Dep>,
    last_executed: Option<Dep>,
}

/// An ancestor not committed here that execution waits for (who waits: [`Waits`]), and the
/// inquiries about it.
#[derive(Clone, Debug)]
struct Blocker {
    shards: ShardSet,
    since: LocalTime,
    asked_at: Option<LocalTime>,
    asked: u32,
}

/// A key's writes here, as a count and a hash chain of the writers (the cross-replica check:
/// two replicas that applied the same number of writes to a key applied the same ones, in the
/// same order).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyChain {
    pub writes: u64,
    pub hash: u64,
}

/// The server's counters.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    pub pre_accepts: u64,
    pub accepts: u64,
    pub commits: u64,
    pub executed_local: u64,
    pub executed_foreign: u64,
    /// Components of more than one transaction executed.
    pub cycles: u64,
    pub inquiries_sent: u64,
    pub inquiries_answered: u64,
    pub forgotten: u64,
}

/// See the module docs.
pub struct Server {
    topology: Topology,
    config: JanusConfig,
    shard: ShardId,
    replica: u32,
    vertices: BTreeMap<TxnId, Vertex>,
    /// Every transaction executed here (ids only; kept for good).
    executed: BTreeSet<TxnId>,
    /// Executed transactions whose record is kept, oldest first.
    forget_queue: VecDeque<(LocalTime, TxnId)>,
    /// Executed transactions past `forget_after` whose record is kept while some key here
    /// still names it as its last executed accessor (module docs): at most one per key.
    kept_as_last: BTreeSet<TxnId>,
    /// Transactions pre-accepted or accepted here, oldest first: one not committed here
    /// `inquire_after` later is asked about (its commit may have been lost, and nothing
    /// else may ever depend on it here).
    uncommitted_queue: VecDeque<(LocalTime, TxnId)>,
    accessors: BTreeMap<Key, Accessors>,
    blockers: BTreeMap<TxnId, Blocker>,
    /// The committed transactions that wait, and what for.
    waits: Waits,
    /// Servers waiting for a transaction's commit (inquiries not answered yet).
    inquirers: BTreeMap<TxnId, BTreeSet<NodeId>>,
    inquirers_total: usize,
    store: Store,
    version: u64,
    chains: BTreeMap<Key, KeyChain>,
    recent_writes: VecDeque<Key>,
    stats: ServerStats,
}

impl Server {
    /// The shard store, to give it a TPC-C shard's warehouses before the server starts.
    pub fn store_mut(&mut self) -> &mut Store {
        &mut self.store
    }

    pub fn new(topology: &Topology, config: &JanusConfig, shard: ShardId, replica: u32) -> Self {
        Server {
            topology: topology.clone(),
            config: config.clone(),
            shard,
            replica,
            vertices: BTreeMap::new(),
            executed: BTreeSet::new(),
            forget_queue: VecDeque::new(),
            kept_as_last: BTreeSet::new(),
            uncommitted_queue: VecDeque::new(),
            accessors: BTreeMap::new(),
            blockers: BTreeMap::new(),
            waits: Waits::default(),
            inquirers: BTreeMap::new(),
            inquirers_total: 0,
            store: Store::default(),
            version: 0,
            chains: BTreeMap::new(),
            recent_writes: VecDeque::new(),
            stats: ServerStats::default(),
        }
    }

    pub fn stats(&self) -> ServerStats {
        self.stats
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The write count and writer chain of `key` here.
    pub fn key_chain(&self, key: Key) -> KeyChain {
        self.chains.get(&key).copied().unwrap_or_default()
    }

    /// The keys this server wrote last (at most [`RECENT_WRITES`]).
    pub fn recent_writes(&self) -> impl Iterator<Item = Key> + '_ {
        self.recent_writes.iter().copied()
    }

    /// The uncommitted ancestors execution waits for here: (transaction, its shards, how many
    /// blocked components wait for it, inquiries sent about it).
    pub fn waiting_for(&self) -> Vec<(TxnId, ShardSet, usize, u32)> {
        self.blockers.iter().map(|(t, b)| (*t, b.shards, self.waits.waiting_for_commit(*t), b.asked)).collect()
    }

    /// No blocked component is registered and no commit awaited ([`Waits::is_idle`]).
    pub fn waits_idle(&self) -> bool {
        self.waits.is_idle()
    }

    /// Transactions this server holds a record of (executed ones until forgotten).
    pub fn records(&self) -> usize {
        self.vertices.len()
    }

    /// Executed transactions whose record is kept only because a key here names it as its
    /// last executed accessor (module docs): at most one per key.
    pub fn records_kept_as_last(&self) -> usize {
        self.kept_as_last.len()
    }

    fn my_bit(&self) -> ShardSet {
        1 << self.shard
    }

    /// Whether `keys` are a valid piece for this shard, and `shards` a valid set holding it.
    /// The set of every shard: a transaction's shard set must lie within it.
    fn all_shards(&self) -> ShardSet {
        if self.topology.shard_count() >= 64 {
            u64::MAX
        } else {
            (1u64 << self.topology.shard_count()) - 1
        }
    }

    fn valid_piece(&self, shards: ShardSet, keys: &[Key]) -> bool {
        shards & self.my_bit() != 0
            && shards & !self.all_shards() == 0
            && !keys.is_empty()
            && keys.len() <= self.config.keys_max
            && keys.iter().all(|k| self.topology.shard_of_key(*k) == self.shard)
    }

    fn valid_deps(&self, deps: &[Dep]) -> bool {
        let all = self.all_shards();
        deps.len() <= self.config.deps_max && deps.iter().all(|d| d.shards != 0 && d.shards & !all == 0)
    }

    /// Lists `txn` among its keys' accessors (once).
    fn list(&mut self, txn: TxnId) {
        let Some(v) = self.vertices.get_mut(&txn) else { return };
        if v.listed || v.keys.is_empty() {
            return;
        }
        v.listed = true;
        let dep = Dep { txn, shards: v.shards };
        for k in v.keys.clone() {
            self.accessors.entry(k).or_default().pending.push(dep);
        }
    }

    fn on_pre_accept(
        &mut self,
        ctx: &mut Ctx<'_, JanusMsg>,
        txn: TxnId,
        shards: ShardSet,
        mut keys: Vec<Key>,
        pieces: Pieces,
    ) {
        keys.sort_unstable();
        keys.dedup();
        if !self.valid_piece(shards, &keys) {
            ctx.metric("janus.ignored", 1);
            return;
        }
        let (shard, replica) = (self.shard, self.replica);
        let reply = move |deps: Vec<Dep>| JanusMsg::PreAcceptOk { txn, shard, replica, deps };
        if let Some(v) = self.vertices.get(&txn) {
            // A repeated pre-accept gets the same answer; one that arrives after an accept or
            // commit reached this replica first is not part of the pre-accept round.
            if let Some(deps) = &v.reported {
                ctx.send(txn.coordinator(), reply(deps.clone()));
            }
            return;
        }
        if self.executed.contains(&txn) {
            return;
        }
        self.stats.pre_accepts += 1;
        let mut deps: Vec<Dep> = Vec::new();
        for k in &keys {
            if let Some(a) = self.accessors.get(k) {
                deps.extend(a.pending.iter().copied());
                deps.extend(a.last_executed);
            }
        }
        deps.sort_unstable();
        deps.dedup_by_key(|d| d.txn);
        deps.retain(|d| d.txn != txn);
        let vertex = Vertex {
            reported: Some(deps.clone()),
            ..Vertex::new(shards, keys, pieces, Status::PreAccepted, deps.clone())
        };
        self.vertices.insert(txn, vertex);
        self.uncommitted_queue.push_back((ctx.now(), txn));
        self.list(txn);
        ctx.send(txn.coordinator(), reply(deps));
    }

    fn on_accept(&mut self, ctx: &mut Ctx<'_, JanusMsg>, txn: TxnId, shards: ShardSet, deps: Vec<Dep>) {
        if shards & self.my_bit() == 0 || !self.valid_deps(&deps) {
            ctx.metric("janus.ignored", 1);
            return;
        }
        self.stats.accepts += 1;
        if !self.executed.contains(&txn) {
            if !self.vertices.contains_key(&txn) {
                self.uncommitted_queue.push_back((ctx.now(), txn));
            }
            let v = self
                .vertices
                .entry(txn)
                .or_insert_with(|| Vertex::new(shards, Vec::new(), Pieces::default(), Status::Accepted, Vec::new()));
            if v.status < Status::Committed {
                v.status = Status::Accepted;
                v.deps = deps;
            }
        }
        ctx.send(txn.coordinator(), JanusMsg::AcceptOk { txn, shard: self.shard, replica: self.replica });
    }

    /// `here`: the keys and pieces of `txn` on this shard.
    fn on_commit(
        &mut self,
        ctx: &mut Ctx<'_, JanusMsg>,
        txn: TxnId,
        shards: ShardSet,
        here: (Vec<Key>, Pieces),
        deps: Vec<Dep>,
        reply: bool,
    ) {
        let (mut keys, pieces) = here;
        keys.sort_unstable();
        keys.dedup();
        if !self.valid_piece(shards, &keys) || !self.valid_deps(&deps) {
            ctx.metric("janus.ignored", 1);
            return;
        }
        if self.executed.contains(&txn) {
            if let Some(v) = self.vertices.get(&txn).filter(|_| reply) {
                ctx.send(txn.coordinator(), JanusMsg::Executed { txn, shard: self.shard, reads: v.reads.clone() });
            }
            return;
        }
        self.stats.commits += 1;
        let woken = self.learn_commit(ctx, txn, shards, keys, pieces, deps);
        if let Some(v) = self.vertices.get_mut(&txn) {
            v.reply |= reply;
        }
        self.try_execute(ctx, &[&[txn], &woken[..]].concat());
    }

    /// `txn` is committed with `deps` (from its coordinator or an inquiry); `keys` and
    /// `pieces`: what it runs on this shard, if known. Returns what waited for it and may run
    /// now (for the caller to walk, with `txn`).
    fn learn_commit(
        &mut self,
        ctx: &mut Ctx<'_, JanusMsg>,
        txn: TxnId,
        shards: ShardSet,
        keys: Vec<Key>,
        pieces: Pieces,
        deps: Vec<Dep>,
    ) -> Vec<TxnId> {
        let local = shards & self.my_bit() != 0;
        // A fresh record starts below committed, so that the commit below fills it in.
        let v = self
            .vertices
            .entry(txn)
            .or_insert_with(|| Vertex::new(shards, Vec::new(), Pieces::default(), Status::Accepted, Vec::new()));
        if v.status == Status::Executed {
            return Vec::new();
        }
        if v.status < Status::Committed {
            v.status = Status::Committed;
            v.deps = deps.clone();
            v.shards = shards;
        }
        if local && v.keys.is_empty() {
            v.keys = keys;
            v.pieces = pieces;
        }
        self.list(txn);
        if let Some(asking) = self.inquirers.remove(&txn) {
            self.inquirers_total -= asking.len();
            let answer = self.inquiry_answer(txn);
            if let Some(answer) = answer {
                for to in asking {
                    self.stats.inquiries_answered += 1;
                    ctx.send(to, answer.clone());
                }
            }
        }
        self.blockers.remove(&txn);
        self.waits.committed(txn)
    }

    /// Whether some key of `txn` here names it as its last executed accessor.
    fn is_last_executed(&self, txn: TxnId) -> bool {
        let keys = self.vertices.get(&txn).map_or(&[][..], |v| &v.keys[..]);
        keys.iter().any(|k| self.accessors.get(k).and_then(|a| a.last_executed).is_some_and(|d| d.txn == txn))
    }

    /// Drops an executed transaction's record (its id stays in `executed`).
    fn forget(&mut self, txn: TxnId) {
        self.vertices.remove(&txn);
        self.stats.forgotten += 1;
    }

    fn inquiry_answer(&self, txn: TxnId) -> Option<JanusMsg> {
        let v = self.vertices.get(&txn).filter(|v| v.status >= Status::Committed)?;
        Some(JanusMsg::InquireReply(Answer {
            txn,
            shards: v.shards,
            deps: v.deps.clone(),
            shard: self.shard,
            keys: v.keys.clone(),
            pieces: v.pieces.clone(),
        }))
    }

    /// Executes whatever of `roots` and their ancestry can run, registers the rest with
    /// everything each waits for ([`Waits`]), and walks again what the runs released.
    fn try_execute(&mut self, ctx: &mut Ctx<'_, JanusMsg>, roots: &[TxnId]) {
        if self.config.unsafe_execute_without_deps {
            for t in roots {
                if self.vertices.get(t).is_some_and(|v| v.status == Status::Committed) {
                    self.execute(ctx, *t);
                }
            }
            return;
        }
        let mut roots = roots.to_vec();
        while !roots.is_empty() {
            let (vertices, executed) = (&self.vertices, &self.executed);
            let outcome = self.waits.walk(&roots, |t| {
                if executed.contains(&t) {
                    return Known::Executed;
                }
                match vertices.get(&t) {
                    Some(v) if v.status == Status::Committed => Known::Committed(&v.deps),
                    _ => Known::Waiting,
                }
            });
            ctx.metric("janus.walk_edges", outcome.edges);
            for component in outcome.run {
                if component.len() > 1 {
                    self.stats.cycles += 1;
                }
                for t in component {
                    self.execute(ctx, t);
                }
            }
            let now = ctx.now();
            // Ask about every foreign ancestor the walk met at once (a local one's commit is on
            // its way; the repair round asks about it if it is late).
            for u in outcome.waiting {
                let b = self.blockers.entry(u.txn).or_insert_with(|| Blocker {
                    shards: u.shards,
                    since: now,
                    asked_at: None,
                    asked: 0,
                });
                if b.shards & (1 << self.shard) == 0 && b.asked_at.is_none() {
                    self.inquire(ctx, u.txn);
                }
            }
            roots = outcome.next;
        }
    }

    /// Asks a server of one of `txn`'s shards for its commit (rotating over the candidates
    /// on every new inquiry; this server's row first).
    fn inquire(&mut self, ctx: &mut Ctx<'_, JanusMsg>, txn: TxnId) {
        let (n, me) = (self.topology.replicas_per_shard(), ctx.me());
        let Some(b) = self.blockers.get_mut(&txn) else { return };
        // A transaction of this shard is executable here only with its keys on this shard,
        // which only this shard's replicas know.
        let ask = if b.shards & (1 << self.shard) != 0 { 1 << self.shard } else { b.shards };
        let mut candidates: Vec<NodeId> = Vec::new();
        for row in 0..n {
            let r = (self.replica as usize + row) % n;
            for s in shards_of(ask) {
                if let Some(node) = self.topology.shards.get(s as usize).and_then(|rs| rs.get(r)) {
                    if *node != me {
                        candidates.push(*node);
                    }
                }
            }
        }
        let Some(to) = candidates.get(b.asked as usize % candidates.len().max(1)).copied() else { return };
        b.asked += 1;
        b.asked_at = Some(ctx.now());
        self.stats.inquiries_sent += 1;
        ctx.metric("janus.inquiries", 1);
        ctx.send(to, JanusMsg::Inquire { txn });
    }

    fn on_inquire(&mut self, ctx: &mut Ctx<'_, JanusMsg>, from: NodeId, txn: TxnId) {
        if self.topology.locate(from).is_none() {
            return;
        }
        if let Some(answer) = self.inquiry_answer(txn) {
            self.stats.inquiries_answered += 1;
            ctx.send(from, answer);
            return;
        }
        if self.inquirers_total >= self.config.inquirers_max {
            ctx.metric("janus.inquiries_dropped", 1);
            return;
        }
        if self.inquirers.entry(txn).or_default().insert(from) {
            self.inquirers_total += 1;
        }
    }

    fn on_inquire_reply(&mut self, ctx: &mut Ctx<'_, JanusMsg>, from: NodeId, answer: Answer) {
        let Answer { txn, shards, deps, shard, mut keys, mut pieces } = answer;
        if self.topology.locate(from).map(|(s, _)| s) != Some(shard)
            || shards & (1 << shard) == 0
            || !self.valid_deps(&deps)
            || self.executed.contains(&txn)
        {
            return;
        }
        let local = shards & self.my_bit() != 0;
        if local {
            // Only a replica of this shard knows the keys to execute here.
            keys.sort_unstable();
            keys.dedup();
            if shard != self.shard || !self.valid_piece(shards, &keys) {
                return;
            }
        } else {
            keys.clear();
            pieces = Pieces::default();
        }
        let mut roots = self.learn_commit(ctx, txn, shards, keys, pieces, deps);
        if local {
            roots.insert(0, txn);
        }
        self.try_execute(ctx, &roots);
    }

    /// Runs `txn` here (its keys on this shard, if any) and marks it executed.
    fn execute(&mut self, ctx: &mut Ctx<'_, JanusMsg>, txn: TxnId) {
        if self.executed.contains(&txn) {
            return;
        }
        let Some(v) = self.vertices.get_mut(&txn) else { return };
        v.status = Status::Executed;
        let dep = Dep { txn, shards: v.shards };
        let local = v.shards & (1 << self.shard) != 0;
        let keys = v.keys.clone();
        let pieces = v.pieces.clone();
        let mut reads = Vec::with_capacity(keys.len());
        let mut superseded = Vec::new();
        let writes = !reads_only(&pieces);
        for &k in &keys {
            let value = self.store.get(k).value;
            reads.push((k, value));
            if writes {
                self.version += 1;
                self.store.put(k, value.wrapping_add(1), self.version);
                let chain = self.chains.entry(k).or_default();
                let mut bytes = [0u8; 16];
                bytes[..8].copy_from_slice(&chain.hash.to_le_bytes());
                bytes[8..].copy_from_slice(&txn.0.to_le_bytes());
                *chain = KeyChain { writes: chain.writes + 1, hash: xxh3_64(&bytes) };
                self.recent_writes.push_back(k);
                if self.recent_writes.len() > RECENT_WRITES {
                    self.recent_writes.pop_front();
                }
            }
            if let Some(a) = self.accessors.get_mut(&k) {
                a.pending.retain(|d| d.txn != txn);
                if let Some(old) = a.last_executed.replace(dep) {
                    superseded.push(old.txn);
                }
            }
        }
        // A record kept as a key's last executed accessor that no key names any more is kept
        // `forget_after` again: the pre-accepts that reported it may still make their senders
        // ask about it.
        for old in superseded {
            if self.kept_as_last.contains(&old) && !self.is_last_executed(old) {
                self.kept_as_last.remove(&old);
                self.forget_queue.push_back((ctx.now(), old));
            }
        }
        self.store.run_pieces(&pieces, &keys);
        let Some(v) = self.vertices.get_mut(&txn) else { return };
        let reply = v.reply;
        v.reads = reads.clone();
        self.executed.insert(txn);
        self.forget_queue.push_back((ctx.now(), txn));
        if local {
            self.stats.executed_local += 1;
            ctx.metric("janus.executed", 1);
            if reply {
                ctx.send(txn.coordinator(), JanusMsg::Executed { txn, shard: self.shard, reads });
            }
        } else {
            self.stats.executed_foreign += 1;
        }
    }

    fn on_repair(&mut self, ctx: &mut Ctx<'_, JanusMsg>) {
        let now = ctx.now();
        // An awaited commit that is known here by now (defensive: learning it normally
        // wakes its waiters) no longer blocks: its waiters are walked again.
        let done: Vec<TxnId> = self
            .waits
            .commits_awaited()
            .filter(|t| {
                self.executed.contains(t) || self.vertices.get(t).is_some_and(|v| v.status >= Status::Committed)
            })
            .collect();
        for t in done {
            self.blockers.remove(&t);
            let woken = self.waits.committed(t);
            self.try_execute(ctx, &woken);
        }
        while let Some(&(at, txn)) = self.uncommitted_queue.front() {
            if now.saturating_since(at) < self.config.inquire_after {
                break;
            }
            self.uncommitted_queue.pop_front();
            if let Some(v) = self.vertices.get(&txn).filter(|v| v.status < Status::Committed) {
                let shards = v.shards;
                self.blockers.entry(txn).or_insert_with(|| Blocker { shards, since: at, asked_at: None, asked: 0 });
            }
        }
        let due: Vec<TxnId> = self
            .blockers
            .iter()
            .filter(|(_, b)| {
                let last = b.asked_at.unwrap_or(b.since);
                now.saturating_since(last) >= self.config.inquire_after
            })
            .map(|(t, _)| *t)
            .take(self.config.inquiries_per_repair)
            .collect();
        for t in due {
            self.inquire(ctx, t);
        }
        while let Some(&(at, txn)) = self.forget_queue.front() {
            if now.saturating_since(at) < self.config.forget_after {
                break;
            }
            self.forget_queue.pop_front();
            if self.is_last_executed(txn) {
                // Later pre-accepts here still report it: whoever gets such a report may ask
                // about it (module docs).
                self.kept_as_last.insert(txn);
            } else {
                self.forget(txn);
            }
        }
        ctx.set_timer(ServerTimer::Repair, self.config.repair_interval);
    }
}

impl Process for Server {
    type Msg = JanusMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, JanusMsg>) {
        ctx.set_timer(ServerTimer::Repair, self.config.repair_interval);
    }

    fn on_message(&mut self, ctx: &mut Ctx<'_, JanusMsg>, from: NodeId, msg: JanusMsg) {
        match msg {
            JanusMsg::PreRead(request) => {
                if let Some(answer) = self.store.answer_pre_read(request) {
                    ctx.send(from, JanusMsg::PreReadAnswer(answer));
                }
            }
            // Only a transaction's own coordinator pre-accepts, accepts and commits it.
            JanusMsg::PreAccept { txn, shards, keys, pieces } if from == txn.coordinator() => {
                self.on_pre_accept(ctx, txn, shards, keys, pieces)
            }
            JanusMsg::Accept { txn, shards, deps } if from == txn.coordinator() => {
                self.on_accept(ctx, txn, shards, deps)
            }
            JanusMsg::Commit { txn, shards, keys, pieces, deps, reply } if from == txn.coordinator() => {
                self.on_commit(ctx, txn, shards, (keys, pieces), deps, reply)
            }
            JanusMsg::Inquire { txn } => self.on_inquire(ctx, from, txn),
            JanusMsg::InquireReply(answer) => self.on_inquire_reply(ctx, from, answer),
            _ => ctx.metric("janus.ignored", 1),
        }
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_, JanusMsg>, timer: TimerId) {
        if let Some(ServerTimer::Repair) = <ServerTimer as kairos_core::Timer>::from_id(timer) {
            self.on_repair(ctx);
        }
    }

    fn invariants(&self) -> Result<(), String> {
        if self.inquirers_total != self.inquirers.values().map(BTreeSet::len).sum::<usize>() {
            return Err("the inquirers count drifted".into());
        }
        if self.inquirers_total > self.config.inquirers_max {
            return Err(format!("{} inquirers held, above the limit", self.inquirers_total));
        }
        Ok(())
    }
}
