//! The Janus coordinator: pre-accepts a transaction at every replica of every shard it
//! touches, commits on the fast path when each shard's replicas all reported the same
//! dependencies, otherwise accepts the union of the replies at a majority of each shard first
//! (the slow path), then sends the commit and waits for one execution reply per shard.
//!
//! The commit asks only the replica that answered the pre-accept first on each shard (the
//! closest) for the values read; a resent commit asks every replica. Janus never aborts, and
//! without recovery (module docs of [`super`]) a coordinator never gives a transaction up: it
//! resends every `resend_after` until the transaction commits and every shard has answered.

use std::collections::{BTreeMap, BTreeSet};

use kairos_core::{Ctx, NodeId, Process, Timer, TimerId};
use kairos_workload::txn::{Key, ShardId, TxnId, Value};
use kairos_workload::{Pieces, Topology};

use super::msg::{Dep, JanusMsg, ShardSet};
use super::JanusConfig;
use crate::shell::{Attempt, TxnShell};

/// A Janus coordinator's timers: the shell's, and one per transaction (its round is
/// overdue).
pub use crate::shell::TxnTimer as CoordinatorTimer;

#[derive(Clone, Debug)]
enum Phase {
    /// Shard → replica → the dependencies it reported.
    PreAccept(BTreeMap<ShardId, BTreeMap<u32, Vec<Dep>>>),
    /// Shard → replicas that accepted.
    Accept {
        deps: Vec<Dep>,
        oks: BTreeMap<ShardId, BTreeSet<u32>>,
    },
    Commit {
        deps: Vec<Dep>,
        reads: BTreeMap<ShardId, Vec<(Key, Value)>>,
        fast: bool,
    },
}

#[derive(Clone, Debug)]
struct Pending {
    shards: ShardSet,
    keys: BTreeMap<ShardId, Vec<Key>>,
    /// Its pieces (TPC-C) by shard.
    pieces: BTreeMap<ShardId, Pieces>,
    phase: Phase,
    /// The replica of each shard that answered the pre-accept first.
    closest: BTreeMap<ShardId, u32>,
}

/// The coordinator's counters.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CoordinatorStats {
    pub fast: u64,
    pub slow: u64,
    pub resends: u64,
}

/// See the module docs.
pub struct Coordinator {
    topology: Topology,
    config: JanusConfig,
    shell: TxnShell,
    txns: BTreeMap<TxnId, Pending>,
    stats: CoordinatorStats,
}

impl Coordinator {
    pub fn new(topology: &Topology, config: &JanusConfig, shell: TxnShell) -> Self {
        Coordinator {
            topology: topology.clone(),
            config: config.clone(),
            shell,
            txns: BTreeMap::new(),
            stats: CoordinatorStats::default(),
        }
    }

    pub fn shell(&self) -> &TxnShell {
        &self.shell
    }

    pub fn stats(&self) -> CoordinatorStats {
        self.stats
    }

    /// Invokes a transaction on `keys` now (tests drive coordinators this way).
    pub fn invoke(&mut self, ctx: &mut Ctx<'_, JanusMsg>, keys: Vec<Key>) -> bool {
        match self.shell.invoke(ctx, keys) {
            Some(a) => {
                self.begin(ctx, a);
                true
            }
            None => false,
        }
    }

    fn n(&self) -> usize {
        self.topology.replicas_per_shard()
    }

    fn majority(&self) -> usize {
        self.n() / 2 + 1
    }

    fn replica_node(&self, shard: ShardId, replica: u32) -> Option<NodeId> {
        self.topology.shards.get(shard as usize)?.get(replica as usize).copied()
    }

    fn begin(&mut self, ctx: &mut Ctx<'_, JanusMsg>, a: Attempt) {
        let mut keys: BTreeMap<ShardId, Vec<Key>> = BTreeMap::new();
        for k in a.keys {
            let piece = keys.entry(self.topology.shard_of_key(k)).or_default();
            if !piece.contains(&k) {
                piece.push(k);
            }
        }
        let shards = keys.keys().fold(0, |set, s| set | (1 << s));
        let pieces = keys
            .keys()
            .map(|&s| {
                let here = a.pieces.iter().filter(|p| self.topology.shard_of_key(u64::from(p.w)) == s).cloned();
                (s, here.collect::<Vec<_>>().into())
            })
            .collect();
        let pending =
            Pending { shards, keys, pieces, phase: Phase::PreAccept(BTreeMap::new()), closest: BTreeMap::new() };
        self.txns.insert(a.txn, pending);
        self.send_round(ctx, a.txn, false);
    }

    /// Sends the current round of `txn` (to the replicas that have not answered it, when
    /// `resend`).
    fn send_round(&mut self, ctx: &mut Ctx<'_, JanusMsg>, txn: TxnId, resend: bool) {
        let Some(p) = self.txns.get(&txn) else { return };
        let n = self.n() as u32;
        let mut out: Vec<(NodeId, JanusMsg)> = Vec::new();
        for (&shard, keys) in &p.keys {
            let pieces = p.pieces.get(&shard).cloned().unwrap_or_default();
            for r in 0..n {
                let Some(node) = self.replica_node(shard, r) else { continue };
                let msg = match &p.phase {
                    Phase::PreAccept(replies) => {
                        if replies.get(&shard).is_some_and(|m| m.contains_key(&r)) {
                            continue;
                        }
                        JanusMsg::PreAccept { txn, shards: p.shards, keys: keys.clone(), pieces: pieces.clone() }
                    }
                    Phase::Accept { deps, oks } => {
                        if oks.get(&shard).is_some_and(|s| s.contains(&r)) {
                            continue;
                        }
                        JanusMsg::Accept { txn, shards: p.shards, deps: deps.clone() }
                    }
                    Phase::Commit { deps, reads, .. } => {
                        if resend && reads.contains_key(&shard) {
                            continue;
                        }
                        let reply = resend || p.closest.get(&shard).is_none_or(|c| *c == r);
                        JanusMsg::Commit {
                            txn,
                            shards: p.shards,
                            keys: keys.clone(),
                            pieces: pieces.clone(),
                            deps: deps.clone(),
                            reply,
                        }
                    }
                };
                out.push((node, msg));
            }
        }
        if resend {
            self.stats.resends += 1;
            ctx.metric("janus.resends", 1);
        }
        for (to, msg) in out {
            ctx.send(to, msg);
        }
        ctx.set_timer(CoordinatorTimer::Txn(txn.seq()), self.config.resend_after);
    }

    fn on_pre_accept_ok(
        &mut self,
        ctx: &mut Ctx<'_, JanusMsg>,
        txn: TxnId,
        shard: ShardId,
        replica: u32,
        deps: Vec<Dep>,
    ) {
        let (n, majority) = (self.n(), self.majority());
        let Some(p) = self.txns.get_mut(&txn) else { return };
        if !p.keys.contains_key(&shard) || deps.len() > self.config.deps_max {
            return;
        }
        let Phase::PreAccept(replies) = &mut p.phase else { return };
        p.closest.entry(shard).or_insert(replica);
        replies.entry(shard).or_default().insert(replica, deps);
        let agree = |m: &BTreeMap<u32, Vec<Dep>>| m.values().all(|d| Some(d) == m.values().next());
        let all_in = p.keys.keys().all(|s| replies.get(s).is_some_and(|m| m.len() >= n));
        let majorities = p.keys.keys().all(|s| replies.get(s).is_some_and(|m| m.len() >= majority));
        let disagreement = replies.values().any(|m| !agree(m));
        if all_in && !disagreement {
            self.decide(ctx, txn, true);
        } else if majorities && disagreement {
            self.decide(ctx, txn, false);
        }
    }

    /// Pre-accept is over: commit the union of the replies at once (`fast`), or accept it first.
    fn decide(&mut self, ctx: &mut Ctx<'_, JanusMsg>, txn: TxnId, fast: bool) {
        let Some(p) = self.txns.get_mut(&txn) else { return };
        let Phase::PreAccept(replies) = &p.phase else { return };
        let mut deps: Vec<Dep> = replies.values().flat_map(|m| m.values().flatten().copied()).collect();
        deps.sort_unstable();
        deps.dedup_by_key(|d| d.txn);
        if fast {
            self.stats.fast += 1;
            ctx.metric("janus.fast", 1);
            p.phase = Phase::Commit { deps, reads: BTreeMap::new(), fast: true };
        } else {
            self.stats.slow += 1;
            ctx.metric("janus.slow", 1);
            p.phase = Phase::Accept { deps, oks: BTreeMap::new() };
        }
        self.send_round(ctx, txn, false);
    }

    fn on_accept_ok(&mut self, ctx: &mut Ctx<'_, JanusMsg>, txn: TxnId, shard: ShardId, replica: u32) {
        let majority = self.majority();
        let Some(p) = self.txns.get_mut(&txn) else { return };
        if !p.keys.contains_key(&shard) {
            return;
        }
        let Phase::Accept { deps, oks } = &mut p.phase else { return };
        oks.entry(shard).or_default().insert(replica);
        if p.keys.keys().all(|s| oks.get(s).is_some_and(|r| r.len() >= majority)) {
            p.phase = Phase::Commit { deps: std::mem::take(deps), reads: BTreeMap::new(), fast: false };
            self.send_round(ctx, txn, false);
        }
    }

    fn on_executed(&mut self, ctx: &mut Ctx<'_, JanusMsg>, txn: TxnId, shard: ShardId, reads: Vec<(Key, Value)>) {
        let Some(p) = self.txns.get_mut(&txn) else { return };
        let Some(keys) = p.keys.get(&shard) else { return };
        if reads.len() != keys.len() || !reads.iter().all(|(k, _)| keys.contains(k)) {
            return;
        }
        let Phase::Commit { reads: got, fast, .. } = &mut p.phase else { return };
        got.insert(shard, reads);
        if got.len() < p.keys.len() {
            return;
        }
        let fast = *fast;
        let all: Vec<(Key, Value)> = got.values().flatten().copied().collect();
        self.txns.remove(&txn);
        ctx.cancel_timer(CoordinatorTimer::Txn(txn.seq()));
        self.shell.committed(ctx, txn, &all, fast);
    }

    fn on_txn_timer(&mut self, ctx: &mut Ctx<'_, JanusMsg>, seq: u32) {
        let txn = TxnId::new(ctx.me(), seq);
        let majority = self.majority();
        let Some(p) = self.txns.get(&txn) else { return };
        // A replica that has not answered the pre-accept in time: go slow with a majority.
        if let Phase::PreAccept(replies) = &p.phase {
            if p.keys.keys().all(|s| replies.get(s).is_some_and(|m| m.len() >= majority)) {
                self.decide(ctx, txn, false);
                return;
            }
        }
        self.send_round(ctx, txn, true);
    }

    fn is_replica(&self, from: NodeId, shard: ShardId, replica: u32) -> bool {
        self.replica_node(shard, replica) == Some(from)
    }
}

impl Process for Coordinator {
    type Msg = JanusMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, JanusMsg>) {
        self.shell.start(ctx);
    }

    fn on_message(&mut self, ctx: &mut Ctx<'_, JanusMsg>, from: NodeId, msg: JanusMsg) {
        match msg {
            JanusMsg::PreReadAnswer(answer) => {
                if let Some(a) = self.shell.on_pre_read_answer(ctx, from, answer) {
                    self.begin(ctx, a);
                }
            }
            JanusMsg::PreAcceptOk { txn, shard, replica, deps } if self.is_replica(from, shard, replica) => {
                self.on_pre_accept_ok(ctx, txn, shard, replica, deps)
            }
            JanusMsg::AcceptOk { txn, shard, replica } if self.is_replica(from, shard, replica) => {
                self.on_accept_ok(ctx, txn, shard, replica)
            }
            JanusMsg::Executed { txn, shard, reads } if self.topology.locate(from).is_some_and(|(s, _)| s == shard) => {
                self.on_executed(ctx, txn, shard, reads)
            }
            _ => ctx.metric("janus.ignored", 1),
        }
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_, JanusMsg>, timer: TimerId) {
        match CoordinatorTimer::from_id(timer) {
            Some(CoordinatorTimer::Shell(t)) => {
                if let Some(a) = self.shell.on_timer(ctx, t) {
                    self.begin(ctx, a);
                }
            }
            Some(CoordinatorTimer::Txn(seq)) => self.on_txn_timer(ctx, seq),
            None => {}
        }
    }

    fn invariants(&self) -> Result<(), String> {
        self.shell.invariants()
    }

    fn on_recover(&mut self, stored: &kairos_core::Stored) {
        self.shell.recover(stored);
    }
}
