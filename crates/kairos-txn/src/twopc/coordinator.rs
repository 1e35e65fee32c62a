//! The coordinator of 2PL+Paxos / OCC+Paxos: runs each attempt's execute and prepare phases
//! against the shard leaders, decides, answers the client through its [`TxnShell`], and keeps
//! resending the decision until every participant has applied it. NCC+'s coordinator
//! ([`TxnCoordinator::ncc`]) merges the two phases into one `Execute` at a timestamp
//! ([`crate::ncc`]); deciding, resending and timeouts are the same.
//!
//! Retransmission: a periodic tick resends every request unanswered for `retry_timeout` under
//! the same attempt (servers are at-most-once per attempt). A shard whose presumed leader has
//! said nothing at all for twice `retry_timeout` while requests are outstanding is tried at the
//! next replica; a `NotLeader` answer
//! names the leader directly. An attempt without a decision after `attempt_timeout` is
//! aborted (the coordinator is the only one who can commit it, so this is always safe) —
//! except a one-phase attempt (a single-shard transaction, parent module docs) once its
//! `Prepare` is sent: its shard decides it, so only the shard's `Vote` ends it, and the
//! coordinator asks again until it hears one.

use super::{ClassicConfig, TxnKey, TxnMsg};
use crate::shell::{Attempt, ShellTimer, TxnShell, TxnStats};
use kairos_core::{Ctx, LocalTime, NodeId, Process, Stored, Timer, TimerId};
use kairos_workload::txn::{Key, ShardId, TxnId, Value};
use kairos_workload::{reads_only, Pieces, Topology};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// A 2PC coordinator's timers.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CoordinatorTimer {
    /// The shell's (arrivals, backoff).
    Shell(ShellTimer),
    /// The retransmission tick.
    RetryTick,
}

impl Timer for CoordinatorTimer {
    fn id(self) -> TimerId {
        match self {
            CoordinatorTimer::Shell(t) => t.id(),
            CoordinatorTimer::RetryTick => TimerId(1),
        }
    }
    fn from_id(id: TimerId) -> Option<Self> {
        match id.0 {
            1 => Some(CoordinatorTimer::RetryTick),
            _ => ShellTimer::from_id(id).map(CoordinatorTimer::Shell),
        }
    }
}
/// Runs plus decisions waiting for acknowledgements, at most. A decision is never dropped (a
/// participant that never hears it would keep the attempt's keys prepared forever); instead a
/// new attempt is not started while the bound is reached (the shell retries it later).
const DECISIONS_MAX: usize = 200_000;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Phase {
    Reading,
    Preparing,
}

#[derive(Clone, Debug, Default)]
struct Part {
    keys: Vec<Key>,
    /// The attempt's TPC-C pieces on this shard.
    pieces: Pieces,
    values: Option<Vec<(Key, Value, u64)>>,
    voted: bool,
}

#[derive(Clone, Debug)]
struct Run {
    attempt: u32,
    phase: Phase,
    /// One shard, committed in one phase: its `Vote` is the outcome.
    one_phase: bool,
    parts: BTreeMap<ShardId, Part>,
    /// The attempt only reads its keys ([`reads_only`]): it writes none.
    reads_only: bool,
    writes: BTreeMap<ShardId, Vec<(Key, Value)>>,
    /// NCC: the attempt's timestamp (ns).
    ts: u64,
    started_at: LocalTime,
    sent_at: LocalTime,
}

impl Run {
    /// Whether a request of this run to `shard` is unanswered. A shard that already answered
    /// has nothing more to say until the decision: its silence says nothing about its leader.
    fn awaits(&self, shard: ShardId) -> bool {
        self.parts.get(&shard).is_some_and(|part| match self.phase {
            Phase::Reading => part.values.is_none(),
            Phase::Preparing => !part.voted,
        })
    }
}

#[derive(Clone, Debug)]
struct Decision {
    commit: bool,
    waiting: BTreeSet<ShardId>,
    sent_at: LocalTime,
}

/// Protocol counters of one coordinator (beyond the shell's).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CoordinatorStats {
    /// Requests sent again after `retry_timeout`.
    pub resent: u64,
    /// Attempts aborted because a shard refused them (2PL: wounded) or voted no.
    pub refused: u64,
    /// Attempts aborted after `attempt_timeout`.
    pub timed_out: u64,
    /// Client-visible commits.
    pub commits: u64,
}

/// See the module docs.
pub struct TxnCoordinator {
    config: ClassicConfig,
    topology: Topology,
    shell: TxnShell,
    leaders: Vec<u32>,
    heard_from: Vec<LocalTime>,
    runs: BTreeMap<TxnId, Run>,
    ages: BTreeMap<TxnId, u64>,
    decisions: BTreeMap<TxnKey, Decision>,
    /// NCC+: attempts execute at the leaders in one phase (`Execute`) instead of read, then
    /// prepare ([`crate::ncc`]).
    ncc: bool,
    /// NCC: each shard's latest one-way-delay sample (its leader's clock at arrival minus this
    /// clock at sending), ns.
    owd_ns: Vec<u64>,
    stats: CoordinatorStats,
}

impl TxnCoordinator {
    /// The coordinator of NCC+ ([`crate::ncc`]).
    pub fn ncc(topology: &Topology, config: &ClassicConfig, shell: TxnShell) -> Self {
        TxnCoordinator { ncc: true, ..Self::new(topology, config, shell) }
    }

    pub fn new(topology: &Topology, config: &ClassicConfig, shell: TxnShell) -> Self {
        TxnCoordinator {
            ncc: false,
            owd_ns: vec![0; topology.shard_count()],
            config: config.clone(),
            leaders: topology.leader.clone(),
            heard_from: vec![LocalTime::ZERO; topology.shard_count()],
            topology: topology.clone(),
            shell,
            runs: BTreeMap::new(),
            ages: BTreeMap::new(),
            decisions: BTreeMap::new(),
            stats: CoordinatorStats::default(),
        }
    }

    pub fn shell(&self) -> &TxnShell {
        &self.shell
    }

    pub fn txn_stats(&self) -> TxnStats {
        self.shell.stats()
    }

    pub fn stats(&self) -> CoordinatorStats {
        self.stats
    }

    /// Decisions not yet acknowledged by every participant.
    pub fn undecided_acks(&self) -> usize {
        self.decisions.len()
    }

    /// No transaction pending and every decision acknowledged.
    pub fn settled(&self) -> bool {
        self.shell.inflight() == 0 && self.decisions.is_empty()
    }

    fn tick_interval(&self) -> Duration {
        (self.config.retry_timeout / 4).max(Duration::from_millis(5))
    }

    fn leader(&self, shard: ShardId) -> NodeId {
        let replicas = &self.topology.shards[shard as usize];
        replicas[self.leaders[shard as usize] as usize % replicas.len()]
    }

    /// Runs attempt `a` (a new transaction or a retry).
    fn start(&mut self, ctx: &mut Ctx<'_, TxnMsg>, a: Attempt) {
        if self.runs.len() + self.decisions.len() >= DECISIONS_MAX {
            // Each run becomes at most one decision: refusing here bounds both.
            ctx.metric("txn.coordinator_decisions_full", 1);
            self.shell.aborted(ctx, a.txn);
            if self.shell.attempt_of(a.txn).is_none() {
                self.ages.remove(&a.txn);
            }
            return;
        }
        let now = ctx.now();
        self.ages.entry(a.txn).or_insert(now.as_nanos());
        let mut parts: BTreeMap<ShardId, Part> = BTreeMap::new();
        for &k in &a.keys {
            let part = parts.entry(self.topology.shard_of_key(k)).or_default();
            if !part.keys.contains(&k) {
                part.keys.push(k);
            }
        }
        for (shard, part) in parts.iter_mut() {
            let here = a.pieces.iter().filter(|p| self.topology.shard_of_key(u64::from(p.w)) == *shard).cloned();
            part.pieces = here.collect::<Vec<_>>().into();
        }
        // NCC: the timestamp is this clock plus the largest predicted one-way delay to the
        // shards involved (each attempt takes a fresh one).
        let owd_ns = parts.keys().filter_map(|s| self.owd_ns.get(*s as usize)).copied().max().unwrap_or(0);
        let run = Run {
            attempt: a.attempt,
            phase: if self.ncc { Phase::Preparing } else { Phase::Reading },
            one_phase: !self.ncc && self.config.one_phase_commit && parts.len() == 1,
            parts,
            reads_only: reads_only(&a.pieces),
            writes: BTreeMap::new(),
            ts: now.as_nanos().saturating_add(owd_ns),
            started_at: now,
            sent_at: now,
        };
        let tk = TxnKey { txn: a.txn, attempt: a.attempt };
        for shard in run.parts.keys() {
            if self.ncc {
                self.send_execute(ctx, tk, *shard, &run);
            } else {
                self.send_read(ctx, tk, *shard, &run);
            }
        }
        self.runs.insert(a.txn, run);
    }

    fn send_execute(&self, ctx: &mut Ctx<'_, TxnMsg>, tk: TxnKey, shard: ShardId, run: &Run) {
        let part = &run.parts[&shard];
        let (keys, pieces) = (part.keys.clone(), part.pieces.clone());
        ctx.send(self.leader(shard), TxnMsg::Execute { tk, ts: run.ts, keys, pieces });
    }

    /// NCC: shard `shard` executed attempt `tk` at its timestamp and prepared it; with every
    /// shard so, the attempt commits (the safeguard holds: module docs of [`crate::ncc`]).
    fn on_executed(
        &mut self,
        ctx: &mut Ctx<'_, TxnMsg>,
        tk: TxnKey,
        shard: ShardId,
        values: Vec<(Key, Value)>,
        arrival_ns: u64,
    ) {
        let Some(run) = self.runs.get_mut(&tk.txn).filter(|r| r.attempt == tk.attempt) else { return };
        let sent_ns = run.sent_at.as_nanos();
        let Some(part) = run.parts.get_mut(&shard) else { return };
        let mut got: Vec<Key> = values.iter().map(|(k, _)| *k).collect();
        got.sort_unstable();
        let mut want = part.keys.clone();
        want.sort_unstable();
        if part.voted {
            return; // a duplicate (the request was resent)
        }
        if !self.ncc || got != want {
            ctx.metric("txn.coordinator_bad_reply", 1);
            return;
        }
        part.values = Some(values.into_iter().map(|(k, v)| (k, v, 0)).collect());
        part.voted = true;
        if let Some(owd) = self.owd_ns.get_mut(shard as usize) {
            *owd = arrival_ns.saturating_sub(sent_ns);
        }
        if run.parts.values().all(|p| p.voted) {
            self.commit(ctx, tk);
        }
    }

    fn send_read(&self, ctx: &mut Ctx<'_, TxnMsg>, tk: TxnKey, shard: ShardId, run: &Run) {
        let age_ns = self.ages.get(&tk.txn).copied().unwrap_or(0);
        let keys = run.parts[&shard].keys.clone();
        ctx.send(self.leader(shard), TxnMsg::Read { tk, age_ns, keys, shared: run.reads_only });
    }

    fn send_prepare(&self, ctx: &mut Ctx<'_, TxnMsg>, tk: TxnKey, shard: ShardId, run: &Run) {
        let reads = run.parts[&shard].values.iter().flatten().map(|(k, _, ver)| (*k, *ver)).collect();
        let writes = run.writes.get(&shard).cloned().unwrap_or_default();
        let pieces = run.parts[&shard].pieces.clone();
        ctx.send(self.leader(shard), TxnMsg::Prepare { tk, reads, writes, pieces, one_phase: run.one_phase });
    }

    /// Whether the shard, not this coordinator, decides the current run of `tk`: a one-phase
    /// attempt whose `Prepare` is sent.
    fn shard_decides(&self, tk: TxnKey) -> bool {
        self.runs.get(&tk.txn).is_some_and(|r| r.attempt == tk.attempt && r.one_phase && r.phase == Phase::Preparing)
    }

    /// The current run of `tk`, if `tk` is its attempt.
    fn run_of(&mut self, tk: TxnKey) -> Option<&mut Run> {
        self.runs.get_mut(&tk.txn).filter(|r| r.attempt == tk.attempt)
    }

    fn on_values(&mut self, ctx: &mut Ctx<'_, TxnMsg>, tk: TxnKey, shard: ShardId, values: Vec<(Key, Value, u64)>) {
        let Some(run) = self.run_of(tk) else { return };
        if run.phase != Phase::Reading {
            return;
        }
        let Some(part) = run.parts.get_mut(&shard) else { return };
        // Exactly the keys asked for.
        let mut got: Vec<Key> = values.iter().map(|(k, _, _)| *k).collect();
        got.sort_unstable();
        let mut want = part.keys.clone();
        want.sort_unstable();
        if got != want {
            ctx.metric("txn.coordinator_bad_reply", 1);
            return;
        }
        part.values = Some(values);
        if run.parts.values().any(|p| p.values.is_none()) {
            return;
        }
        // Every shard answered: compute the increments (none for a read-only attempt) and
        // prepare.
        run.phase = Phase::Preparing;
        run.sent_at = ctx.now();
        let increment = !run.reads_only;
        run.writes = run
            .parts
            .iter()
            .map(|(s, p)| {
                let values = p.values.iter().flatten().filter(|_| increment);
                (*s, values.map(|(k, v, _)| (*k, v.saturating_add(1))).collect())
            })
            .collect();
        let run = run.clone();
        for shard in run.parts.keys() {
            self.send_prepare(ctx, tk, *shard, &run);
        }
    }

    fn on_vote(&mut self, ctx: &mut Ctx<'_, TxnMsg>, tk: TxnKey, shard: ShardId, yes: bool) {
        let Some(run) = self.run_of(tk) else { return };
        if run.phase != Phase::Preparing {
            return;
        }
        if run.one_phase {
            // The shard's outcome: nothing to decide or acknowledge.
            let Some(run) = self.runs.remove(&tk.txn) else { return };
            if yes {
                let reads: Vec<(Key, Value)> =
                    run.parts.values().flat_map(|p| p.values.iter().flatten().map(|(k, v, _)| (*k, *v))).collect();
                self.ages.remove(&tk.txn);
                self.stats.commits += 1;
                self.shell.committed(ctx, tk.txn, &reads, false);
            } else {
                self.stats.refused += 1;
                self.shell.aborted(ctx, tk.txn);
                if self.shell.attempt_of(tk.txn).is_none() {
                    self.ages.remove(&tk.txn);
                }
            }
            return;
        }
        if !yes {
            self.stats.refused += 1;
            self.abort(ctx, tk);
            return;
        }
        if self.ncc {
            // NCC's yes is `Executed` (it carries the values).
            ctx.metric("txn.coordinator_bad_reply", 1);
            return;
        }
        let Some(run) = self.run_of(tk) else { return };
        let Some(part) = run.parts.get_mut(&shard) else { return };
        part.voted = true;
        if run.parts.values().all(|p| p.voted) {
            self.commit(ctx, tk);
        }
    }

    /// Every shard voted yes for the current run of `tk`: commit it, tell the client at once
    /// (every prepare record is durable) and the participants.
    fn commit(&mut self, ctx: &mut Ctx<'_, TxnMsg>, tk: TxnKey) {
        let Some(run) = self.runs.remove(&tk.txn) else { return };
        let reads: Vec<(Key, Value)> =
            run.parts.values().flat_map(|p| p.values.iter().flatten().map(|(k, v, _)| (*k, *v))).collect();
        self.decide(ctx, tk, run.parts.keys().copied().collect(), true);
        self.ages.remove(&tk.txn);
        self.stats.commits += 1;
        self.shell.committed(ctx, tk.txn, &reads, false);
    }

    /// Aborts the current attempt `tk`: tells every participant, and lets the shell retry.
    fn abort(&mut self, ctx: &mut Ctx<'_, TxnMsg>, tk: TxnKey) {
        let Some(run) = self.runs.remove(&tk.txn) else { return };
        self.decide(ctx, tk, run.parts.keys().copied().collect(), false);
        self.shell.aborted(ctx, tk.txn);
        if self.shell.attempt_of(tk.txn).is_none() {
            self.ages.remove(&tk.txn);
        }
    }

    fn decide(&mut self, ctx: &mut Ctx<'_, TxnMsg>, tk: TxnKey, shards: BTreeSet<ShardId>, commit: bool) {
        for s in &shards {
            ctx.send(self.leader(*s), TxnMsg::Decide { tk, commit });
        }
        self.decisions.insert(tk, Decision { commit, waiting: shards, sent_at: ctx.now() });
    }

    fn on_tick(&mut self, ctx: &mut Ctx<'_, TxnMsg>) {
        ctx.set_timer(CoordinatorTimer::RetryTick, self.tick_interval());
        let now = ctx.now();
        let retry = self.config.retry_timeout;
        // Shards whose presumed leader has been silent: try the next replica.
        for s in 0..self.leaders.len() {
            // Twice the retry timeout: under lock contention a live leader may be silent a while.
            let silent = now.saturating_since(self.heard_from[s]) >= retry * 2;
            let waiting = self.runs.values().any(|r| r.awaits(s as ShardId))
                || self.decisions.values().any(|d| d.waiting.contains(&(s as ShardId)));
            if silent && waiting {
                self.leaders[s] = self.leaders[s].wrapping_add(1) % self.topology.replicas_per_shard().max(1) as u32;
                self.heard_from[s] = now;
                ctx.metric("txn.coordinator_leader_rotations", 1);
            }
        }
        let expired: Vec<TxnKey> = self
            .runs
            .iter()
            .filter(|(_, r)| now.saturating_since(r.started_at) >= self.config.attempt_timeout)
            .map(|(t, r)| TxnKey { txn: *t, attempt: r.attempt })
            .filter(|tk| !self.shard_decides(*tk))
            .collect();
        for tk in expired {
            self.stats.timed_out += 1;
            ctx.metric("txn.coordinator_attempt_timeouts", 1);
            self.abort(ctx, tk);
        }
        let stale: Vec<TxnId> =
            self.runs.iter().filter(|(_, r)| now.saturating_since(r.sent_at) >= retry).map(|(t, _)| *t).collect();
        for txn in stale {
            let Some(run) = self.runs.get_mut(&txn) else { continue };
            run.sent_at = now;
            let run = run.clone();
            let tk = TxnKey { txn, attempt: run.attempt };
            for (shard, part) in &run.parts {
                match run.phase {
                    Phase::Reading if part.values.is_none() => self.send_read(ctx, tk, *shard, &run),
                    Phase::Preparing if !part.voted && self.ncc => self.send_execute(ctx, tk, *shard, &run),
                    Phase::Preparing if !part.voted => self.send_prepare(ctx, tk, *shard, &run),
                    _ => continue,
                }
                self.stats.resent += 1;
                ctx.metric("txn.coordinator_resent", 1);
            }
        }
        let mut resend = Vec::new();
        for (tk, d) in self.decisions.iter_mut().filter(|(_, d)| now.saturating_since(d.sent_at) >= retry) {
            d.sent_at = now;
            resend.extend(d.waiting.iter().map(|s| (*tk, *s, d.commit)));
        }
        for (tk, shard, commit) in resend {
            self.stats.resent += 1;
            ctx.metric("txn.coordinator_resent", 1);
            ctx.send(self.leader(shard), TxnMsg::Decide { tk, commit });
        }
    }
}

impl Process for TxnCoordinator {
    type Msg = TxnMsg;

    /// The shell's process slots ([`TxnShell::invariants`]).
    fn invariants(&self) -> Result<(), String> {
        self.shell.invariants()
    }

    fn on_start(&mut self, ctx: &mut Ctx<'_, TxnMsg>) {
        let now = ctx.now();
        self.heard_from.iter_mut().for_each(|t| *t = now);
        self.shell.start(ctx);
        ctx.set_timer(CoordinatorTimer::RetryTick, self.tick_interval());
    }

    fn on_recover(&mut self, stored: &Stored) {
        self.shell.recover(stored);
    }

    fn on_message(&mut self, ctx: &mut Ctx<'_, TxnMsg>, from: NodeId, msg: TxnMsg) {
        if let TxnMsg::PreReadAnswer(answer) = msg {
            if let Some(a) = self.shell.on_pre_read_answer(ctx, from, answer) {
                self.start(ctx, a);
            }
            return;
        }
        let shard = match &msg {
            TxnMsg::ReadReply { shard, .. }
            | TxnMsg::Executed { shard, .. }
            | TxnMsg::Refused { shard, .. }
            | TxnMsg::Waiting { shard, .. }
            | TxnMsg::Vote { shard, .. }
            | TxnMsg::DecideAck { shard, .. }
            | TxnMsg::NotLeader { shard, .. } => *shard,
            _ => {
                ctx.metric("txn.coordinator_unexpected", 1);
                return;
            }
        };
        // Only the replicas of the named shard speak for it.
        let Some(replica) = self.topology.shards.get(shard as usize).and_then(|rs| rs.iter().position(|n| *n == from))
        else {
            ctx.metric("txn.coordinator_unexpected", 1);
            return;
        };
        if let TxnMsg::NotLeader { leader, .. } = msg {
            let n = self.topology.replicas_per_shard().max(1) as u32;
            match leader {
                Some(l) if l < n && l as usize != replica => {
                    // A named leader gets a full silence window before it is rotated away.
                    self.leaders[shard as usize] = l;
                    self.heard_from[shard as usize] = ctx.now();
                }
                // It knows no leader (e.g. it just stepped down): try the next replica.
                _ if self.leaders[shard as usize] % n == replica as u32 => {
                    self.leaders[shard as usize] = (replica as u32 + 1) % n;
                }
                _ => {}
            }
            return;
        }
        self.heard_from[shard as usize] = ctx.now();
        self.leaders[shard as usize] = replica as u32;
        match msg {
            TxnMsg::ReadReply { tk, shard, values } => self.on_values(ctx, tk, shard, values),
            TxnMsg::Executed { tk, shard, values, arrival_ns } => self.on_executed(ctx, tk, shard, values, arrival_ns),
            // A one-phase attempt's outcome is its shard's vote alone: a refusal may come from
            // a replica that never saw the request another one logged.
            TxnMsg::Refused { tk, .. } if self.run_of(tk).is_some() && !self.shard_decides(tk) => {
                self.stats.refused += 1;
                self.abort(ctx, tk);
            }
            TxnMsg::Vote { tk, shard, yes } => self.on_vote(ctx, tk, shard, yes),
            TxnMsg::DecideAck { tk, shard } => {
                if let Some(d) = self.decisions.get_mut(&tk) {
                    d.waiting.remove(&shard);
                    if d.waiting.is_empty() {
                        self.decisions.remove(&tk);
                    }
                }
            }
            _ => {}
        }
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_, TxnMsg>, timer: TimerId) {
        match CoordinatorTimer::from_id(timer) {
            Some(CoordinatorTimer::Shell(t)) => {
                if let Some(a) = self.shell.on_timer(ctx, t) {
                    self.start(ctx, a);
                }
            }
            Some(CoordinatorTimer::RetryTick) => self.on_tick(ctx),
            None => {}
        }
    }
}
