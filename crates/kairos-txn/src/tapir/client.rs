//! The Tapir coordinator (the paper's client library, co-located with the application): the
//! execution phase (reads from the closest replica of each shard), the prepare as an IR
//! consensus operation on every replica of every involved shard (fast or slow path per shard),
//! RETRY rounds at a larger timestamp, the commit decision, and the asynchronous commit or
//! abort as IR inconsistent operations.
//!
//! # Timestamps
//! A prepare's timestamp is the coordinator's clock reading (loosely synchronized clocks:
//! only performance depends on them), raised past every version read and past the previous
//! timestamp this coordinator chose, so that a transaction is ordered after what it read. A
//! RETRY round uses the largest timestamp the replicas suggested.
//!
//! # Timers
//! Besides the shell's, each transaction in flight has one timer (`TXN_TIMER_BASE + seq`):
//! in the read phase it resends unanswered reads to the next replica of the shard; in the
//! prepare phase it first marks the end of the wait for a super quorum (then shards with
//! f + 1 replies are decided on the slow path) and afterwards resends unanswered prepares and
//! finalizes. Commits and aborts being delivered have their own (`FINISH_TIMER_BASE + seq`),
//! and `PING_TIMER` re-pings every replica every `ping_interval`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kairos_core::{Ctx, LocalTime, NodeId, Process, Stored, Timer, TimerId};
use kairos_workload::txn::{Key, ShardId, Ts, TxnId, Value};
use kairos_workload::{reads_only, Pieces, Topology};

use super::ir::{Confirms, ConsensusQuorum};
use super::msg::{OpId, PrepareResult, ReadResult, TapirMsg};
use super::TapirConfig;
use crate::shell::{Attempt, ShellTimer, TxnShell, TXN_TIMER_BASE};

/// A Tapir client's timers.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ClientTimer {
    /// The shell's (arrivals, backoff).
    Shell(ShellTimer),
    /// The periodic ping that finds the closest replicas and measures round trips.
    Ping,
    /// A transaction's (its sequence number) read or prepare round is overdue.
    Txn(u32),
    /// A transaction's commit or abort is not yet acknowledged: resend it.
    Finish(u32),
}

const FINISH_TIMER_BASE: u64 = 2 << 32;

impl Timer for ClientTimer {
    fn id(self) -> TimerId {
        match self {
            ClientTimer::Shell(t) => t.id(),
            ClientTimer::Ping => TimerId(1),
            ClientTimer::Txn(seq) => TimerId(TXN_TIMER_BASE + u64::from(seq)),
            ClientTimer::Finish(seq) => TimerId(FINISH_TIMER_BASE + u64::from(seq)),
        }
    }
    fn from_id(id: TimerId) -> Option<Self> {
        let seq_from = |base: u64| id.0.checked_sub(base).and_then(|n| u32::try_from(n).ok());
        if id.0 == 1 {
            Some(ClientTimer::Ping)
        } else if let Some(seq) = seq_from(FINISH_TIMER_BASE) {
            Some(ClientTimer::Finish(seq))
        } else if let Some(seq) = seq_from(TXN_TIMER_BASE) {
            Some(ClientTimer::Txn(seq))
        } else {
            ShellTimer::from_id(id).map(ClientTimer::Shell)
        }
    }
}

#[derive(Clone, Debug)]
struct ShardPrepare {
    quorum: ConsensusQuorum,
    /// The shard's result once decided, and whether on the fast path.
    decided: Option<(PrepareResult, bool)>,
    /// Slow-path PREPARE-OK: replicas that confirmed the finalize (final at f + 1).
    finalized: Confirms,
}

#[derive(Clone, Debug)]
enum Phase {
    /// Execution phase: shard → replica index the read went to.
    Reading { asked: BTreeMap<ShardId, u32> },
    /// Prepare round `round` at `ts`.
    Preparing { round: u32, ts: Ts, shards: BTreeMap<ShardId, ShardPrepare>, waited: bool },
}

#[derive(Clone, Debug)]
struct Txn {
    attempt: u32,
    /// Keys by shard (deduplicated, sorted).
    keys: BTreeMap<ShardId, Vec<Key>>,
    reads: BTreeMap<Key, ReadResult>,
    /// TPC-C's pieces (none for MicroBench), and whether they only read (then the keys are
    /// read and validated, not written).
    pieces: Pieces,
    reads_only: bool,
    phase: Phase,
    /// Sends of the current phase's messages (first send included).
    sends: u32,
}

/// Commit or abort of an operation being delivered to every replica of its shards.
#[derive(Clone, Debug)]
struct Finishing {
    op: OpId,
    msgs: BTreeMap<ShardId, (TapirMsg, Confirms)>,
    sends: u32,
}

/// The coordinator's counters.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CoordinatorStats {
    /// Shard prepares decided on the fast path / the slow path.
    pub shard_fast: u64,
    pub shard_slow: u64,
    /// Prepare rounds started again at a larger timestamp after RETRY.
    pub retry_rounds: u64,
    /// Attempts aborted: stale read, abstentions, too many rounds, no answers.
    pub aborted: u64,
    pub read_resends: u64,
    pub prepare_resends: u64,
    pub finish_resends: u64,
}

/// See the module docs.
pub struct Coordinator {
    topology: Topology,
    config: TapirConfig,
    shell: TxnShell,
    /// Per shard: replica index → round-trip time measured by the start-up ping.
    rtt: Vec<BTreeMap<u32, Duration>>,
    /// Per shard: the replica reads go to — the first to answer the latest ping round
    /// (replica 0 before any answer), or the one that answered a read that timed out elsewhere.
    closest: Vec<u32>,
    /// The current ping round, when it was sent, and the shards that answered it.
    ping_round: u64,
    ping_sent: LocalTime,
    ping_answered: BTreeSet<ShardId>,
    last_ts: Ts,
    txns: BTreeMap<TxnId, Txn>,
    finishing: BTreeMap<TxnId, Finishing>,
    stats: CoordinatorStats,
}

impl Coordinator {
    pub fn new(topology: &Topology, config: &TapirConfig, shell: TxnShell) -> Self {
        let shards = topology.shard_count();
        Coordinator {
            topology: topology.clone(),
            config: config.clone(),
            shell,
            rtt: vec![BTreeMap::new(); shards],
            closest: vec![0; shards],
            ping_round: 0,
            ping_sent: LocalTime::ZERO,
            ping_answered: BTreeSet::new(),
            last_ts: Ts::ZERO,
            txns: BTreeMap::new(),
            finishing: BTreeMap::new(),
            stats: CoordinatorStats::default(),
        }
    }

    pub fn shell(&self) -> &TxnShell {
        &self.shell
    }

    pub fn stats(&self) -> CoordinatorStats {
        self.stats
    }

    /// Commits and aborts still being delivered.
    pub fn finishing_count(&self) -> usize {
        self.finishing.len()
    }

    /// Invokes a transaction on `keys` now (tests drive coordinators this way).
    pub fn invoke(&mut self, ctx: &mut Ctx<'_, TapirMsg>, keys: Vec<Key>) -> bool {
        match self.shell.invoke(ctx, keys) {
            Some(a) => {
                self.begin(ctx, a);
                true
            }
            None => false,
        }
    }

    fn replicas(&self, shard: ShardId) -> &[NodeId] {
        self.topology.shards.get(shard as usize).map_or(&[], Vec::as_slice)
    }

    fn n(&self) -> usize {
        self.topology.replicas_per_shard()
    }

    fn begin(&mut self, ctx: &mut Ctx<'_, TapirMsg>, a: Attempt) {
        let mut keys: BTreeMap<ShardId, Vec<Key>> = BTreeMap::new();
        for k in a.keys {
            let v = keys.entry(self.topology.shard_of_key(k)).or_default();
            if !v.contains(&k) {
                v.push(k);
            }
        }
        for v in keys.values_mut() {
            v.sort_unstable();
        }
        let asked: BTreeMap<ShardId, u32> = keys.keys().map(|s| (*s, self.closest[*s as usize])).collect();
        for (s, r) in &asked {
            let msg = TapirMsg::Read { txn: a.txn, attempt: a.attempt, keys: keys[s].clone() };
            ctx.send(self.replicas(*s)[*r as usize], msg);
        }
        let reads_only = reads_only(&a.pieces);
        let txn = Txn {
            attempt: a.attempt,
            keys,
            reads: BTreeMap::new(),
            pieces: a.pieces,
            reads_only,
            phase: Phase::Reading { asked },
            sends: 1,
        };
        self.txns.insert(a.txn, txn);
        ctx.set_timer(ClientTimer::Txn(a.txn.seq()), self.config.retry_interval);
    }

    fn on_read_reply(
        &mut self,
        ctx: &mut Ctx<'_, TapirMsg>,
        txn_id: TxnId,
        attempt: u32,
        (shard, replica): (ShardId, u32),
        values: Vec<ReadResult>,
    ) {
        let Some(txn) = self.txns.get_mut(&txn_id) else { return };
        let Phase::Reading { asked } = &mut txn.phase else { return };
        let Some(want) = txn.keys.get(&shard) else { return };
        if txn.attempt != attempt || !asked.contains_key(&shard) {
            return;
        }
        // Exactly the keys asked (`want` is sorted and deduplicated): a reply naming a key twice
        // and another not at all must not pass (the missing one would read as 0).
        let mut got: Vec<Key> = values.iter().map(|v| v.key).collect();
        got.sort_unstable();
        if got != *want {
            ctx.metric("tapir.bad_reply", 1);
            return;
        }
        asked.remove(&shard);
        for v in values {
            txn.reads.insert(v.key, v);
        }
        if txn.sends > 1 && replica != self.closest[shard as usize] {
            // The closest replica did not answer in time (down?): read from this one until the
            // next ping round says otherwise.
            self.closest[shard as usize] = replica;
        }
        if asked.is_empty() {
            let ts = self.next_ts(ctx, txn_id, Ts::ZERO);
            self.start_round(ctx, txn_id, 1, ts);
        }
    }

    /// A fresh timestamp: the local clock, past every version `txn` read, past `at_least` and
    /// past this coordinator's previous timestamp.
    fn next_ts(&mut self, ctx: &Ctx<'_, TapirMsg>, txn: TxnId, at_least: Ts) -> Ts {
        let read_max = self.txns.get(&txn).and_then(|t| t.reads.values().map(|r| r.version).max()).unwrap_or(Ts::ZERO);
        let ts = Ts::at(ctx.now()).max(read_max.next()).max(at_least).max(self.last_ts.next());
        self.last_ts = ts;
        ts
    }

    /// `txn`'s keys at `shard`, each with the version read, and the keys it writes there
    /// (all of them, unless the transaction only reads).
    fn reads_at(txn: &Txn, shard: ShardId) -> (Vec<(Key, Ts)>, Vec<Key>) {
        let keys = txn.keys.get(&shard).cloned().unwrap_or_default();
        let reads = keys.iter().map(|k| (*k, txn.reads.get(k).map_or(Ts::ZERO, |r| r.version))).collect();
        (reads, if txn.reads_only { Vec::new() } else { keys })
    }

    fn prepare_msg(txn: &Txn, op: OpId, shard: ShardId, ts: Ts) -> TapirMsg {
        let (reads, writes) = Self::reads_at(txn, shard);
        TapirMsg::Prepare { op, shard, ts, reads, writes }
    }

    /// IR's finalize of a slow-path PREPARE-OK (the only result that needs to be durable).
    fn finalize_msg(txn: &Txn, op: OpId, shard: ShardId, ts: Ts) -> TapirMsg {
        let (reads, writes) = Self::reads_at(txn, shard);
        TapirMsg::Finalize { op, shard, ts, reads, writes, result: PrepareResult::Ok }
    }

    fn start_round(&mut self, ctx: &mut Ctx<'_, TapirMsg>, txn_id: TxnId, round: u32, ts: Ts) {
        let Some(txn) = self.txns.get(&txn_id) else { return };
        let op = OpId { txn: txn_id, attempt: txn.attempt, round };
        let mut shards = BTreeMap::new();
        let mut wait = Duration::ZERO;
        for &s in txn.keys.keys() {
            ctx.send_all(self.replicas(s).iter().copied(), &Self::prepare_msg(txn, op, s, ts));
            shards.insert(
                s,
                ShardPrepare {
                    quorum: ConsensusQuorum::new(&self.topology),
                    decided: None,
                    finalized: Confirms::default(),
                },
            );
            wait = wait.max(self.fast_path_wait(s));
        }
        let Some(txn) = self.txns.get_mut(&txn_id) else { return };
        txn.phase = Phase::Preparing { round, ts, shards, waited: false };
        txn.sends = 1;
        ctx.set_timer(ClientTimer::Txn(txn_id.seq()), wait);
    }

    /// How long to wait for a super quorum of shard `s`: once every replica answered a ping, the largest round trip × 1.25 + `fast_path_slack`, at most
    /// `fast_path_wait_max`; before that (or if a replica never answered), the maximum.
    fn fast_path_wait(&self, s: ShardId) -> Duration {
        match self.rtt.get(s as usize).filter(|m| m.len() == self.n()).and_then(|m| m.values().max()) {
            Some(rtt) => (rtt.mul_f64(1.25) + self.config.fast_path_slack).min(self.config.fast_path_wait_max),
            None => self.config.fast_path_wait_max,
        }
    }

    fn on_prepare_reply(
        &mut self,
        ctx: &mut Ctx<'_, TapirMsg>,
        op: OpId,
        shard: ShardId,
        replica: u32,
        result: PrepareResult,
    ) {
        let Some(txn) = self.txns.get_mut(&op.txn) else { return };
        let Phase::Preparing { round, shards, waited, .. } = &mut txn.phase else { return };
        if txn.attempt != op.attempt || *round != op.round {
            return;
        }
        let waited = *waited;
        let Some(sp) = shards.get_mut(&shard) else { return };
        if !sp.quorum.record(replica, result) || sp.decided.is_some() {
            return;
        }
        self.try_decide(ctx, op, shard, waited);
        self.advance(ctx, op.txn);
    }

    /// Decides shard `shard` of `op` if its replies allow: the fast path, a stale read, every
    /// replica answered, or (after the wait for a super quorum) f + 1 replies.
    fn try_decide(&mut self, ctx: &mut Ctx<'_, TapirMsg>, op: OpId, shard: ShardId, waited: bool) {
        let Some(txn) = self.txns.get_mut(&op.txn) else { return };
        let Phase::Preparing { ts, shards, .. } = &mut txn.phase else { return };
        let Some(sp) = shards.get_mut(&shard) else { return };
        if sp.decided.is_some() {
            return;
        }
        if let Some(r) = sp.quorum.fast() {
            sp.decided = Some((r, true));
            self.stats.shard_fast += 1;
            ctx.metric("tapir.shard_fast", 1);
            return;
        }
        if !(sp.quorum.any_abort() || sp.quorum.complete() || waited) {
            return;
        }
        let Some(r) = sp.quorum.decide() else { return };
        sp.decided = Some((r, false));
        self.stats.shard_slow += 1;
        ctx.metric("tapir.shard_slow", 1);
        ctx.metric(
            if sp.quorum.complete() {
                "tapir.shard_slow_disagreed"
            } else if sp.quorum.any_abort() {
                "tapir.shard_slow_stale"
            } else {
                "tapir.shard_slow_timeout"
            },
            1,
        );
        if r == PrepareResult::Ok {
            let ts = *ts;
            let msg = Self::finalize_msg(txn, op, shard, ts);
            ctx.send_all(self.topology.shards[shard as usize].iter().copied(), &msg);
        }
    }

    fn on_finalize_reply(&mut self, ctx: &mut Ctx<'_, TapirMsg>, op: OpId, shard: ShardId, replica: u32) {
        let Some(txn) = self.txns.get_mut(&op.txn) else { return };
        let Phase::Preparing { round, shards, .. } = &mut txn.phase else { return };
        if txn.attempt != op.attempt || *round != op.round {
            return;
        }
        if let Some(sp) = shards.get_mut(&shard) {
            if sp.decided.is_some() && sp.finalized.mark(replica) {
                self.advance(ctx, op.txn);
            }
        }
    }

    /// Acts on the shards' decisions: abort as soon as one shard says so; once every shard is
    /// final, commit if all prepared, else retry at the largest suggested timestamp.
    fn advance(&mut self, ctx: &mut Ctx<'_, TapirMsg>, txn_id: TxnId) {
        let f = self.topology.f();
        let Some(txn) = self.txns.get(&txn_id) else { return };
        let Phase::Preparing { round, shards, .. } = &txn.phase else { return };
        let round = *round;
        let mut all_final = true;
        let mut all_fast = true;
        let mut retry_at: Option<Ts> = None;
        for sp in shards.values() {
            match sp.decided {
                None => all_final = false,
                Some((PrepareResult::Abort | PrepareResult::Abstain, _)) => {
                    return self.abort_attempt(ctx, txn_id, "tapir.abort_conflict");
                }
                Some((PrepareResult::Retry(at), _)) => retry_at = retry_at.max(Some(at)),
                Some((PrepareResult::Ok, fast)) => {
                    all_fast &= fast;
                    if !fast && sp.finalized.count() < f + 1 {
                        all_final = false;
                    }
                }
            }
        }
        if !all_final {
            return;
        }
        if let Some(at) = retry_at {
            if round >= self.config.prepare_rounds_max {
                return self.abort_attempt(ctx, txn_id, "tapir.abort_rounds");
            }
            self.stats.retry_rounds += 1;
            ctx.metric("tapir.retry_rounds", 1);
            let ts = self.next_ts(ctx, txn_id, at);
            return self.start_round(ctx, txn_id, round + 1, ts);
        }
        // "Fast": every shard on IR's fast path in the first round — one round trip to prepare.
        self.commit(ctx, txn_id, all_fast && round == 1);
    }

    fn commit(&mut self, ctx: &mut Ctx<'_, TapirMsg>, txn_id: TxnId, fast: bool) {
        let Some(txn) = self.txns.remove(&txn_id) else { return };
        let Phase::Preparing { round, ts, .. } = txn.phase else { return };
        ctx.cancel_timer(ClientTimer::Txn(txn_id.seq()));
        let op = OpId { txn: txn_id, attempt: txn.attempt, round };
        let reads: Vec<(Key, Value)> = txn.reads.values().map(|r| (r.key, r.value)).collect();
        self.shell.committed(ctx, txn_id, &reads, fast);
        let last_shard = txn.keys.keys().next_back().copied().filter(|_| txn.keys.len() > 1);
        let msgs = txn
            .keys
            .keys()
            .map(|&shard| {
                if self.config.unsafe_abort_last_shard_on_commit && Some(shard) == last_shard {
                    return (shard, TapirMsg::Abort { op, shard });
                }
                let (reads, writes) = Self::reads_at(&txn, shard);
                let writes =
                    writes.iter().map(|k| (*k, txn.reads.get(k).map_or(0, |r| r.value).saturating_add(1))).collect();
                let here = txn.pieces.iter().filter(|p| self.topology.shard_of_key(u64::from(p.w)) == shard).cloned();
                let pieces = here.collect::<Vec<_>>().into();
                (shard, TapirMsg::Commit { op, shard, ts, reads, writes, pieces })
            })
            .collect();
        self.finish(ctx, op, msgs);
    }

    /// Gives up on the current attempt and tells the shell, which retries after a backoff or
    /// records `fail`. That is the right record for every give-up path (stale read,
    /// abstentions, too many rounds, unanswered reads, prepares or finalizes): the attempt
    /// took no effect, because only this coordinator decides commit (there is no cooperative
    /// termination or recovery coordinator that could commit it later) and the `Abort` it sends
    /// only drops prepared entries. Tapir never abandons a transaction with an unknown outcome
    /// (a commit is decided, and answered, before the asynchronous `Commit`), so it never
    /// records `info`.
    fn abort_attempt(&mut self, ctx: &mut Ctx<'_, TapirMsg>, txn_id: TxnId, why: &'static str) {
        let Some(txn) = self.txns.remove(&txn_id) else { return };
        ctx.cancel_timer(ClientTimer::Txn(txn_id.seq()));
        self.stats.aborted += 1;
        ctx.metric(why, 1);
        if let Phase::Preparing { round, .. } = txn.phase {
            let op = OpId { txn: txn_id, attempt: txn.attempt, round };
            let msgs = txn.keys.keys().map(|&shard| (shard, TapirMsg::Abort { op, shard })).collect();
            self.finish(ctx, op, msgs);
        }
        self.shell.aborted(ctx, txn_id);
    }

    /// Delivers a commit or an abort (one message per shard) to every replica, resent with
    /// capped backoff until each acknowledges. At most `finishing_max` are being delivered;
    /// beyond, the oldest is given up (module docs of [`super`]).
    fn finish(&mut self, ctx: &mut Ctx<'_, TapirMsg>, op: OpId, msgs: BTreeMap<ShardId, TapirMsg>) {
        let mut tracked = BTreeMap::new();
        for (shard, msg) in msgs {
            ctx.send_all(self.replicas(shard).iter().copied(), &msg);
            tracked.insert(shard, (msg, Confirms::default()));
        }
        while !self.finishing.contains_key(&op.txn) && self.finishing.len() >= self.config.finishing_max.max(1) {
            let Some((old, _)) = self.finishing.pop_first() else { break };
            ctx.cancel_timer(ClientTimer::Finish(old.seq()));
            ctx.metric("tapir.finish_given_up", 1);
        }
        self.finishing.insert(op.txn, Finishing { op, msgs: tracked, sends: 1 });
        ctx.set_timer(ClientTimer::Finish(op.txn.seq()), self.config.retry_interval);
    }

    fn on_done(&mut self, ctx: &mut Ctx<'_, TapirMsg>, op: OpId, shard: ShardId, replica: u32) {
        let n = self.n();
        let Some(fin) = self.finishing.get_mut(&op.txn) else { return };
        if fin.op != op {
            return;
        }
        if let Some((_, acks)) = fin.msgs.get_mut(&shard) {
            acks.mark(replica);
        }
        if fin.msgs.values().all(|(_, acks)| acks.count() >= n) {
            self.finishing.remove(&op.txn);
            ctx.cancel_timer(ClientTimer::Finish(op.txn.seq()));
        }
    }

    fn on_finish_timer(&mut self, ctx: &mut Ctx<'_, TapirMsg>, txn_id: TxnId) {
        let Some(fin) = self.finishing.get_mut(&txn_id) else { return };
        fin.sends = fin.sends.saturating_add(1);
        for (&shard, (msg, acks)) in &fin.msgs {
            for (r, node) in self.topology.shards[shard as usize].iter().enumerate() {
                if !acks.has(r as u32) {
                    ctx.send(*node, msg.clone());
                    self.stats.finish_resends += 1;
                }
            }
        }
        let gap = self.config.retry_interval.saturating_mul(1 << (fin.sends - 1).min(20));
        ctx.set_timer(
            ClientTimer::Finish(txn_id.seq()),
            gap.min(self.config.finish_backoff_max.max(self.config.retry_interval)),
        );
    }

    fn on_txn_timer(&mut self, ctx: &mut Ctx<'_, TapirMsg>, txn_id: TxnId) {
        let n = self.n() as u32;
        let timer = ClientTimer::Txn(txn_id.seq());
        let Some(txn) = self.txns.get_mut(&txn_id) else { return };
        match &mut txn.phase {
            Phase::Reading { asked } => {
                if txn.sends >= self.config.read_sends_max {
                    return self.abort_attempt(ctx, txn_id, "tapir.abort_unanswered");
                }
                txn.sends += 1;
                // The replica asked may be down: ask the next one.
                for (s, r) in asked.iter_mut() {
                    *r = (*r + 1) % n.max(1);
                    let msg = TapirMsg::Read { txn: txn_id, attempt: txn.attempt, keys: txn.keys[s].clone() };
                    ctx.send(self.topology.shards[*s as usize][*r as usize], msg);
                    self.stats.read_resends += 1;
                    ctx.metric("tapir.read_resends", 1);
                }
                ctx.set_timer(timer, self.config.retry_interval);
            }
            Phase::Preparing { round, waited, shards, .. } => {
                let op = OpId { txn: txn_id, attempt: txn.attempt, round: *round };
                if !*waited {
                    // The wait for a super quorum is over: decide from f + 1 replies.
                    *waited = true;
                    let undecided: Vec<ShardId> =
                        shards.iter().filter(|(_, sp)| sp.decided.is_none()).map(|(s, _)| *s).collect();
                    for s in undecided {
                        self.try_decide(ctx, op, s, true);
                    }
                    self.advance(ctx, txn_id);
                    if let Some(txn) = self.txns.get(&txn_id) {
                        if txn.attempt == op.attempt
                            && matches!(txn.phase, Phase::Preparing { round, .. } if round == op.round)
                        {
                            ctx.set_timer(timer, self.config.retry_interval);
                        }
                    }
                    return;
                }
                if txn.sends >= self.config.prepare_sends_max {
                    return self.abort_attempt(ctx, txn_id, "tapir.abort_unanswered");
                }
                txn.sends += 1;
                let Phase::Preparing { ts, shards, .. } = &txn.phase else { return };
                for (&s, sp) in shards {
                    let replicas = &self.topology.shards[s as usize];
                    let msg = match sp.decided {
                        None => Self::prepare_msg(txn, op, s, *ts),
                        Some((PrepareResult::Ok, false)) => Self::finalize_msg(txn, op, s, *ts),
                        Some(_) => continue,
                    };
                    for (r, node) in replicas.iter().enumerate() {
                        let answered = if sp.decided.is_none() {
                            sp.quorum.has_replied(r as u32)
                        } else {
                            sp.finalized.has(r as u32)
                        };
                        if !answered {
                            ctx.send(*node, msg.clone());
                            self.stats.prepare_resends += 1;
                            ctx.metric("tapir.prepare_resends", 1);
                        }
                    }
                }
                ctx.set_timer(timer, self.config.retry_interval);
            }
        }
    }

    fn on_pong(&mut self, ctx: &Ctx<'_, TapirMsg>, nonce: u64, shard: ShardId, replica: u32) {
        if nonce != self.ping_round {
            return;
        }
        let Some(m) = self.rtt.get_mut(shard as usize) else { return };
        if self.ping_answered.insert(shard) {
            // Every ping of a round left at once: the first answer comes from the closest replica.
            self.closest[shard as usize] = replica;
        }
        m.insert(replica, ctx.now().saturating_since(self.ping_sent));
    }

    /// Pings every replica (a new round), and again after `ping_interval`.
    fn ping(&mut self, ctx: &mut Ctx<'_, TapirMsg>) {
        self.ping_round += 1;
        self.ping_sent = ctx.now();
        self.ping_answered.clear();
        let servers: BTreeSet<NodeId> = self.topology.shards.iter().flatten().copied().collect();
        ctx.send_all(servers, &TapirMsg::Ping { nonce: self.ping_round });
        ctx.set_timer(ClientTimer::Ping, self.config.ping_interval);
    }
}

impl Process for Coordinator {
    type Msg = TapirMsg;

    /// The shell's process slots ([`TxnShell::invariants`]).
    fn invariants(&self) -> Result<(), String> {
        self.shell.invariants()
    }

    fn on_start(&mut self, ctx: &mut Ctx<'_, TapirMsg>) {
        self.ping(ctx);
        self.shell.start(ctx);
    }

    fn on_recover(&mut self, stored: &Stored) {
        self.shell.recover(stored);
    }

    fn on_message(&mut self, ctx: &mut Ctx<'_, TapirMsg>, from: NodeId, msg: TapirMsg) {
        // Replies must come from the replica they name.
        let named = match &msg {
            TapirMsg::Pong { shard, replica, .. }
            | TapirMsg::ReadReply { shard, replica, .. }
            | TapirMsg::PrepareReply { shard, replica, .. }
            | TapirMsg::FinalizeReply { shard, replica, .. }
            | TapirMsg::Done { shard, replica, .. } => Some((*shard, *replica)),
            _ => None,
        };
        if let Some((shard, replica)) = named {
            if self.replicas(shard).get(replica as usize) != Some(&from) {
                return ctx.metric("tapir.coordinator_ignored", 1);
            }
        }
        match msg {
            TapirMsg::Pong { nonce, shard, replica } => self.on_pong(ctx, nonce, shard, replica),
            TapirMsg::ReadReply { txn, attempt, shard, replica, values } => {
                self.on_read_reply(ctx, txn, attempt, (shard, replica), values)
            }
            TapirMsg::PrepareReply { op, shard, replica, result } => {
                self.on_prepare_reply(ctx, op, shard, replica, result)
            }
            TapirMsg::FinalizeReply { op, shard, replica } => self.on_finalize_reply(ctx, op, shard, replica),
            TapirMsg::Done { op, shard, replica } => self.on_done(ctx, op, shard, replica),
            TapirMsg::PreReadAnswer(answer) => {
                if let Some(a) = self.shell.on_pre_read_answer(ctx, from, answer) {
                    self.begin(ctx, a);
                }
            }
            TapirMsg::Ping { .. }
            | TapirMsg::PreRead(_)
            | TapirMsg::Read { .. }
            | TapirMsg::Prepare { .. }
            | TapirMsg::Finalize { .. }
            | TapirMsg::Commit { .. }
            | TapirMsg::Abort { .. } => ctx.metric("tapir.coordinator_ignored", 1),
        }
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_, TapirMsg>, timer: TimerId) {
        let me = ctx.me();
        match ClientTimer::from_id(timer) {
            Some(ClientTimer::Shell(t)) => {
                if let Some(a) = self.shell.on_timer(ctx, t) {
                    self.begin(ctx, a);
                }
            }
            Some(ClientTimer::Ping) => self.ping(ctx),
            Some(ClientTimer::Txn(seq)) => self.on_txn_timer(ctx, TxnId::new(me, seq)),
            Some(ClientTimer::Finish(seq)) => self.on_finish_timer(ctx, TxnId::new(me, seq)),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kairos_core::{Effect, HistoryEvent, OpType, Rng};
    use kairos_workload::FixedKeys;
    use kairos_workload::OpenLoop;
    use rand::SeedableRng;

    const ME: NodeId = NodeId(9);

    /// A coordinator of one shard with three replicas (nodes 0, 1, 2), and a driver that
    /// feeds it messages and collects what it sends, arms and records.
    struct Harness {
        c: Coordinator,
        rng: Rng,
        now: LocalTime,
        sent: Vec<(NodeId, TapirMsg)>,
        timers: Vec<(TimerId, Duration)>,
        history: Vec<HistoryEvent>,
    }

    impl Harness {
        fn new() -> Self {
            Self::with_config(&TapirConfig::default())
        }

        fn with_config(config: &TapirConfig) -> Self {
            let topology = Topology { shards: vec![vec![NodeId(0), NodeId(1), NodeId(2)]], leader: vec![0] };
            let shell =
                TxnShell::new(Box::new(FixedKeys::new(vec![])), OpenLoop::default(), crate::ShellConfig::default(), 0);
            let c = Coordinator::new(&topology, config, shell);
            let mut h = Harness {
                c,
                rng: Rng::seed_from_u64(3),
                now: LocalTime(1_000),
                sent: vec![],
                timers: vec![],
                history: vec![],
            };
            h.with(|c, ctx| c.on_start(ctx));
            h
        }

        fn with(&mut self, f: impl FnOnce(&mut Coordinator, &mut Ctx<'_, TapirMsg>)) {
            let mut effects = Vec::new();
            f(&mut self.c, &mut Ctx::new(ME, self.now, &mut self.rng, &mut effects));
            for e in effects {
                match e {
                    Effect::Send { to, msg } => self.sent.push((to, msg)),
                    Effect::SetTimer { id, after } => self.timers.push((id, after)),
                    Effect::History(h) => self.history.push(h),
                    _ => {}
                }
            }
        }

        fn deliver(&mut self, from: u32, msg: TapirMsg) {
            self.with(|c, ctx| c.on_message(ctx, NodeId(from), msg));
        }

        fn take_sent(&mut self) -> Vec<(NodeId, TapirMsg)> {
            std::mem::take(&mut self.sent)
        }

        /// Invokes an increment of key 3 and answers its read (value 5 at version 40).
        fn read_done(&mut self) -> TxnId {
            self.with(|c, ctx| assert!(c.invoke(ctx, vec![3])));
            self.take_sent();
            let txn = TxnId::new(ME, 0);
            let values = vec![ReadResult { key: 3, value: 5, version: Ts::from_nanos(40) }];
            self.deliver(0, TapirMsg::ReadReply { txn, attempt: 1, shard: 0, replica: 0, values });
            txn
        }

        fn prepares(&mut self) -> Vec<(OpId, Ts)> {
            self.take_sent()
                .into_iter()
                .filter_map(|(_, m)| if let TapirMsg::Prepare { op, ts, .. } = m { Some((op, ts)) } else { None })
                .collect()
        }
    }

    #[test]
    fn timer_ids_decode_to_the_timer_that_set_them() {
        use ClientTimer::*;
        let samples = [Ping, Txn(0), Txn(u32::MAX), Finish(0), Finish(u32::MAX)];
        let shell = [ShellTimer::Arrival, ShellTimer::Backoff(0), ShellTimer::Backoff(u32::MAX)].map(Shell);
        kairos_core::check_timer_encoding(&[&samples[..], &shell[..]].concat()).unwrap();
        assert_eq!(ClientTimer::from_id(TimerId(2)), None);
    }
    #[test]
    fn fast_path_commits_and_sends_the_commit_to_every_replica() {
        let mut h = Harness::new();
        let txn = h.read_done();
        let prepares = h.prepares();
        assert_eq!(prepares.len(), 3);
        let (op, ts) = prepares[0];
        assert!(ts > Ts::from_nanos(40), "the timestamp is past the version read");
        for r in 0..3 {
            h.deliver(r, TapirMsg::PrepareReply { op, shard: 0, replica: r, result: PrepareResult::Ok });
        }
        assert_eq!(h.history.last().unwrap().op_type, OpType::Ok);
        let commits: Vec<_> = h.take_sent().into_iter().filter(|(_, m)| matches!(m, TapirMsg::Commit { .. })).collect();
        assert_eq!(commits.len(), 3);
        assert!(matches!(&commits[0].1, TapirMsg::Commit { writes, ts: t, .. } if writes == &vec![(3, 6)] && *t == ts));
        assert_eq!((h.c.shell().stats().committed_fast, h.c.stats().shard_fast), (1, 1));
        assert_eq!(op.txn, txn);
    }

    /// A commit is redelivered to the replicas that did not acknowledge it, with doubling gaps
    /// capped at `finish_backoff_max`, for as long as it takes; past `finishing_max`
    /// deliveries the oldest is given up.
    #[test]
    fn commits_are_redelivered_with_capped_backoff_and_bounded_in_number() {
        let config = TapirConfig { finishing_max: 1, ..TapirConfig::default() };
        let mut h = Harness::with_config(&config);
        let commit_one = |h: &mut Harness, seq: u32, key: Key| -> OpId {
            h.with(|c, ctx| assert!(c.invoke(ctx, vec![key])));
            h.take_sent();
            let txn = TxnId::new(ME, seq);
            let values = vec![ReadResult { key, value: 0, version: Ts::ZERO }];
            h.deliver(0, TapirMsg::ReadReply { txn, attempt: 1, shard: 0, replica: 0, values });
            let (op, _) = h.prepares()[0];
            for r in 0..3 {
                h.deliver(r, TapirMsg::PrepareReply { op, shard: 0, replica: r, result: PrepareResult::Ok });
            }
            op
        };
        let op = commit_one(&mut h, 0, 3);
        h.deliver(0, TapirMsg::Done { op, shard: 0, replica: 0 });
        let timer = ClientTimer::Finish(op.txn.seq()).id();
        let mut gaps = Vec::new();
        for _ in 0..30 {
            h.take_sent();
            h.timers.clear();
            h.with(|c, ctx| c.on_timer(ctx, timer));
            let resent = h.take_sent();
            assert_eq!(resent.len(), 2, "only the replicas that did not acknowledge");
            assert!(resent.iter().all(|(to, m)| to.0 != 0 && matches!(m, TapirMsg::Commit { .. })));
            gaps.extend(h.timers.iter().filter(|(id, _)| *id == timer).map(|(_, after)| after.as_secs()));
        }
        assert_eq!(&gaps[..5], &[2, 4, 8, 8, 8]);
        assert_eq!(gaps.len(), 30, "never given up while it is the only one");
        // A second commit exceeds finishing_max = 1: the oldest is given up.
        commit_one(&mut h, 1, 4);
        assert_eq!(h.c.finishing_count(), 1);
        h.take_sent();
        h.with(|c, ctx| c.on_timer(ctx, timer));
        assert!(h.take_sent().is_empty(), "the first commit is no longer redelivered");
    }

    /// A read reply must carry exactly the keys asked: values for [3, 3] where [3, 4] were
    /// asked are rejected (key 4 would otherwise read as 0).
    #[test]
    fn a_read_reply_with_a_duplicated_key_is_rejected() {
        let mut h = Harness::new();
        h.with(|c, ctx| assert!(c.invoke(ctx, vec![4, 3])));
        h.take_sent();
        let txn = TxnId::new(ME, 0);
        let v = |key| ReadResult { key, value: 5, version: Ts::from_nanos(40) };
        for values in [vec![v(3), v(3)], vec![v(3)], vec![v(3), v(4), v(4)], vec![v(3), v(5)]] {
            h.deliver(0, TapirMsg::ReadReply { txn, attempt: 1, shard: 0, replica: 0, values });
            assert!(h.prepares().is_empty());
        }
        h.deliver(0, TapirMsg::ReadReply { txn, attempt: 1, shard: 0, replica: 0, values: vec![v(4), v(3)] });
        assert_eq!(h.prepares().len(), 3);
    }

    #[test]
    fn slow_path_finalizes_at_f_plus_one_after_the_wait_for_a_super_quorum() {
        let mut h = Harness::new();
        let txn = h.read_done();
        let (op, _) = h.prepares()[0];
        h.deliver(0, TapirMsg::PrepareReply { op, shard: 0, replica: 0, result: PrepareResult::Ok });
        h.deliver(1, TapirMsg::PrepareReply { op, shard: 0, replica: 1, result: PrepareResult::Ok });
        // A reply naming a replica other than its sender is ignored.
        h.deliver(0, TapirMsg::PrepareReply { op, shard: 0, replica: 2, result: PrepareResult::Ok });
        assert!(h.take_sent().is_empty(), "waiting for the super quorum");
        h.with(|c, ctx| c.on_timer(ctx, ClientTimer::Txn(txn.seq()).id()));
        let finalizes = h.take_sent();
        assert_eq!(finalizes.len(), 3);
        assert!(finalizes.iter().all(|(_, m)| matches!(m, TapirMsg::Finalize { result: PrepareResult::Ok, .. })));
        h.deliver(0, TapirMsg::FinalizeReply { op, shard: 0, replica: 0 });
        assert!(h.history.iter().all(|e| e.op_type == OpType::Invoke), "final only at f + 1");
        h.deliver(2, TapirMsg::FinalizeReply { op, shard: 0, replica: 2 });
        assert_eq!(h.history.last().unwrap().op_type, OpType::Ok);
        assert_eq!((h.c.shell().stats().committed_fast, h.c.stats().shard_slow), (0, 1));
    }

    #[test]
    fn retry_prepares_again_at_the_suggested_timestamp_and_abstentions_abort() {
        let mut h = Harness::new();
        let txn = h.read_done();
        let (op, _) = h.prepares()[0];
        for (r, at) in [(0, 500), (1, 700), (2, 600)] {
            h.deliver(
                r,
                TapirMsg::PrepareReply { op, shard: 0, replica: r, result: PrepareResult::Retry(Ts::from_nanos(at)) },
            );
        }
        let round2 = h.prepares();
        assert_eq!(round2.len(), 3);
        let (op2, ts2) = round2[0];
        assert_eq!((op2.round, op2.attempt), (2, 1));
        assert!(ts2 >= Ts::from_nanos(700));
        // Replies to the old round no longer count.
        h.deliver(0, TapirMsg::PrepareReply { op, shard: 0, replica: 0, result: PrepareResult::Ok });
        assert!(h.take_sent().is_empty());
        for r in 0..2 {
            h.deliver(r, TapirMsg::PrepareReply { op: op2, shard: 0, replica: r, result: PrepareResult::Abstain });
        }
        h.deliver(2, TapirMsg::PrepareReply { op: op2, shard: 0, replica: 2, result: PrepareResult::Ok });
        let aborts = h.take_sent();
        assert_eq!(aborts.len(), 3);
        assert!(aborts.iter().all(|(_, m)| matches!(m, TapirMsg::Abort { op, .. } if *op == op2)));
        assert_eq!(h.c.shell().attempt_of(txn), Some(1), "the shell retries after a backoff");
        assert_eq!((h.c.stats().retry_rounds, h.c.stats().aborted), (1, 1));
    }
}
