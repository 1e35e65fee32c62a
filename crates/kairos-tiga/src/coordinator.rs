//! Tiga's coordinator: stamps each one-shot transaction with a future timestamp, sends it to
//! every replica of every shard it touches, and decides commit from the replies.
//!
//! # Timestamps
//! `T.ts = now + headroom`, where headroom is, over the involved shards, the largest one-way
//! delay (OWD) to the farthest member of the shard's *closest* super quorum, plus the margin Δ
//! and the configured shift (saturating at 0); zero with `zero_headroom`. OWDs come from the
//! replies (`owd_ns`, measured by the servers): per (shard, replica) a window of the samples
//! of the last `owd_window` of local time, estimate = its `owd_percentile` (nearest rank,
//! rounded up to its 10 µs bucket, coarser when `owd_cap` exceeds 655 ms: `owd_window.rs`),
//! capped at `owd_cap`; with no sample in the window, the configured initial bound.
//!
//! **Per-transaction quorum choice** (`quorum_choice`, beyond the paper; needs the one-way
//! delays among each shard's replicas, [`Coordinator::with_replica_owd`]): the super-quorum
//! headroom buys the fast path, but the slow path needs only the leader to have the
//! transaction by its timestamp. Per transaction the coordinator predicts both commit times —
//! fast: headroom + the replies of the closest super quorum; slow: the leader's headroom +
//! the later of the leader's reply and the f-th follower's reply after log synchronization
//! (half a sync interval, leader → follower → coordinator) — and takes the headroom of the
//! earlier one. Either commit rule stays as it is, so correctness does not depend on the
//! choice (a timestamp is safe whatever its headroom: late arrivals are bumped or held).
//!
//! # Commit
//! Per shard at timestamp t: the leader's latest reply is at t and either (fast) a super
//! quorum of replicas, leader included, has its latest fast reply at t with the leader's log
//! hash, or (slow) at least f followers sent a slow reply at t. Across shards: t* = max of the
//! leaders' latest timestamps; the transaction commits once every leader's latest reply is at t*
//! and every shard is committed at t*. A replica's reply with a smaller timestamp than one it
//! already sent is discarded. The result is the leaders' reads.
//!
//! # Retransmission
//! Not committed after `retry_timeout`: resend with the same [`TxnId`] and a fresh timestamp
//! (replies are kept: per replica the latest timestamp wins). After `max_sends` sends, give up:
//! the outcome is unknown (`info`); later replies are ignored.
//!
//! # History encoding (checked by `kairos-check`)
//! Jepsen processes run one operation at a time, so a coordinator with many transactions in
//! flight uses one process per in-flight transaction: `process = process_id_base + slot`,
//! where `slot < inflight_max` is the smallest slot free at invocation and is freed when the
//! transaction commits or is given up. Coordinators must be given disjoint ranges
//! (`process_id_base` spaced by at least `inflight_max`).
//!
//! A transaction is a list of [`Op`]s on byte-string keys ([`crate::ops`]); the checker sees
//! each distinct key as an integer register holding the key's **version** (the number of
//! transactions that wrote it), under the key [`history_key`]. `kairos-check` pairs an `ok`
//! with its `invoke` micro-op by micro-op (same count) and judges an `info` by its
//! invocation's micro-ops, so the invocation must name the writes, but the written versions
//! are unknown until the leaders reply. Per distinct key, in order of first appearance:
//! * `invoke`: `["r", k, null]` if the transaction's first operation on the key reads it, and
//!   `["w", k, null]` (a write of unknown value, [`MicroOp::WriteUnknown`]) if it writes the key;
//! * `ok`: `["r", k, v]`, `["w", k, v + 1]` with `v` the version the leader saw (`v = 0`, a
//!   never-written key, is recorded as `null`, the initial value);
//! * `info` (given up): the invocation's micro-ops.
//!
//! A MicroBench transaction increments each of its keys by 1, so there the version is the
//! value and the history is that of the original increment-only procedure.
//!
//! A given-up transaction may have taken effect: the checkers then take it to have written some
//! single version to each key it writes, which a later transaction may read although no
//! recorded transaction wrote it.
//!
//! # Admission
//! With `admission_control` (off in the library's default config, on in `kairos bench`), the
//! open-loop load's arrivals are admitted under the adaptive in-flight limit of
//! [`kairos_workload::admission`]: past saturation the coordinator refuses arrivals (counted
//! in `tiga.admission_dropped`) rather than letting every server queue grow until transactions
//! time out and throughput collapses. A view change resets the limit (it moves the paths).
//! Transactions submitted by a front end ([`Coordinator::submit`]) are bounded by
//! `inflight_max` only.
//!
//! # Results for a front end
//! With [`Coordinator::with_completions`], every finished transaction also leaves a
//! [`Completion`] (each operation's output, or unknown) for [`Coordinator::take_completions`]:
//! how a gateway that submits transactions on behalf of clients learns their results.
//!
//! # Metrics (cumulative counters)
//! `tiga.committed`, `tiga.committed_fast` (every shard by the fast rule), `tiga.committed_slow`
//! (some shard needed the slow rule), `tiga.ts_revised` (committed, and the leaders' first
//! timestamps differed), `tiga.retransmissions`, `tiga.info`, `tiga.sends` (sends of every
//! finished transaction), `tiga.committed_sends_1` / `_2` / `_3plus` (commits by sends needed),
//! `tiga.rejected` (bad transactions), `tiga.admission_dropped` (in-flight limit),
//! `tiga.admission_steps_down` (steps that lowered the adaptive limit),
//! `tiga.ignored_replies` (garbage, stale or late replies).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use kairos_core::{
    duration_nanos, Ctx, HistoryEvent, LocalTime, MicroOp, NodeId, OpType, Process, ReadValue, Timer, TimerId,
};
use thiserror::Error;

use crate::msg::{Key, Piece, PieceResult, ReplyKind, ServerReply, ShardId, Submit, TigaMsg, Ts, TxnId};
use crate::ops::{distinct_keys, history_key, key_id, Op, OpOutput};
use crate::owd_window::OwdWindow;
use crate::topology::{TigaConfig, Topology};
use kairos_workload::history::ProcessSlots;
use kairos_workload::tpcc::pre_read::{self, PreRead, PreReadAnswer, PreReadRequest};
use kairos_workload::{
    path_of_shards, reads_only, AdmissionLimit, Finish, KindSample, OpenLoop, Pieces, TxnSource, TxnWork,
    KIND_SAMPLES_MAX,
};

/// A transaction the coordinator refuses; nothing was sent or recorded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TxnError {
    #[error("a transaction needs at least one operation")]
    NoKeys,
    #[error("a transaction may name at most {max} keys, this one names {keys}; split it")]
    TooManyKeys { keys: usize, max: usize },
    #[error("a transaction may hold at most {max} operations, this one holds {ops}; split it")]
    TooManyOps { ops: usize, max: usize },
    #[error("a transaction may carry at most {max} bytes of keys and values, this one carries {bytes}; split it")]
    TooLarge { bytes: usize, max: usize },
    #[error("keys {a:?} and {b:?} have the same 64-bit id; rename one")]
    KeyCollision { a: String, b: String },
    #[error(
        "key {key:?} belongs to shard {shard}, which the topology does not serve (no replicas or no valid leader)"
    )]
    UnknownShard { key: String, shard: ShardId },
    #[error("{inflight} transactions are in flight, the limit is {max}; submit again once some complete")]
    Overloaded { inflight: usize, max: usize },
    #[error("this coordinator has used all 2^32 transaction ids; run a new coordinator node")]
    IdsExhausted,
}

/// Counts for tests (the same events as the metrics).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CoordinatorStats {
    pub committed: u64,
    pub committed_fast: u64,
    pub committed_slow: u64,
    pub ts_revised: u64,
    pub retransmissions: u64,
    pub info: u64,
    pub rejected: u64,
    pub admission_dropped: u64,
    pub ignored_replies: u64,
    /// Views this coordinator moved to.
    pub view_changes: u64,
}

impl std::ops::AddAssign for CoordinatorStats {
    /// Sums two coordinators' counters (e.g. all coordinators of a region).
    fn add_assign(&mut self, o: Self) {
        let CoordinatorStats {
            committed,
            committed_fast,
            committed_slow,
            ts_revised,
            retransmissions,
            info,
            rejected,
            admission_dropped,
            ignored_replies,
            view_changes,
        } = o;
        self.committed += committed;
        self.committed_fast += committed_fast;
        self.committed_slow += committed_slow;
        self.ts_revised += ts_revised;
        self.retransmissions += retransmissions;
        self.info += info;
        self.rejected += rejected;
        self.admission_dropped += admission_dropped;
        self.ignored_replies += ignored_replies;
        self.view_changes += view_changes;
    }
}

/// A coordinator's timers.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CoordinatorTimer {
    /// The next open-loop arrival.
    Arrival,
    /// A transaction (its sequence number) is not committed yet: resend or give up.
    Retry(u32),
}

impl Timer for CoordinatorTimer {
    fn id(self) -> TimerId {
        match self {
            CoordinatorTimer::Arrival => TimerId(0),
            CoordinatorTimer::Retry(seq) => TimerId(1 + u64::from(seq)),
        }
    }
    fn from_id(id: TimerId) -> Option<Self> {
        match id.0 {
            0 => Some(CoordinatorTimer::Arrival),
            n => u32::try_from(n - 1).ok().map(CoordinatorTimer::Retry),
        }
    }
}

/// How a finished transaction turned out, for the front end that submitted it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    pub txn: TxnId,
    /// Each operation's output, in the transaction's order; `None`: given up, outcome unknown.
    pub outputs: Option<Vec<OpOutput>>,
}

/// The invocation's micro-ops of a general transaction (see the module docs).
pub fn ops_invocation(ops: &[Op]) -> Vec<MicroOp> {
    let mut out = Vec::new();
    for (k, read, written) in distinct_keys(ops) {
        let key = history_key(k);
        if read {
            out.push(MicroOp::Read { key, value: None });
        }
        if written {
            out.push(MicroOp::WriteUnknown { key });
        }
    }
    out
}

/// A replica's latest fast reply, with the leader's result (none for followers).
#[derive(Clone, Debug)]
struct Fast {
    ts: Ts,
    hash: [u8; 20],
    result: Option<PieceResult>,
}

#[derive(Clone, Debug, Default)]
struct ReplicaReplies {
    fast: Option<Fast>,
    slow_ts: Option<Ts>,
}

#[derive(Clone, Debug)]
struct Pending {
    ops: Vec<Op>,
    /// One piece per involved shard, by shard id.
    pieces: Vec<Arc<Piece>>,
    slot: u64,
    invoked_at: LocalTime,
    /// When its first submit went out: no submit goes out later than
    /// [`Coordinator::resend_window`] after it (servers refuse older transactions).
    first_send_at: Option<LocalTime>,
    sends: u32,
    invoke: Vec<MicroOp>,
    /// Each replica's latest replies: `width` entries per piece, in `pieces`' order, by
    /// replica index.
    replies: Vec<ReplicaReplies>,
    width: usize,
    /// Each piece's leader's first fast-reply timestamp (to count revised timestamps).
    first_leader_ts: Vec<Option<Ts>>,
    /// The transaction's type, for per-type statistics (TPC-C).
    kind: Option<u8>,
    /// The pre-read a by-name TPC-C transaction waits for before its pieces are sent (while
    /// it waits, `sends` counts pre-read requests; see [`Coordinator::send`]).
    pre_read: Option<PreRead>,
}

impl Pending {
    /// The replies of the replicas of the `i`th piece's shard: `width` slots, of which a shard
    /// with fewer replicas leaves the last ones empty (no reply is ever stored there: replies
    /// come only from the shard's replicas, and an empty slot counts toward no quorum).
    fn replies_of(&self, i: usize) -> &[ReplicaReplies] {
        self.replies.get(i * self.width..(i + 1) * self.width).unwrap_or(&[])
    }

    /// The latest fast reply of the leader `leader` of the `i`th piece's shard.
    fn leader_fast(&self, i: usize, leader: Option<&u32>) -> Option<&Fast> {
        self.replies_of(i).get(*leader? as usize)?.fast.as_ref()
    }
}

/// The coordinator role (see the module docs).
pub struct Coordinator {
    topology: Topology,
    config: TigaConfig,
    workload: Box<dyn TxnSource>,
    owd_initial: Vec<Vec<Duration>>,
    owd: Vec<Vec<OwdWindow>>,
    owd_percentile: f64,
    process_id_base: u64,
    view: u64,
    load: OpenLoop,
    started_at: LocalTime,
    /// When the current (last scheduled) arrival of the open-loop load is due.
    arrival_due: LocalTime,
    arrivals: u64,
    next_seq: u64,
    pending: BTreeMap<TxnId, Pending>,
    slots: ProcessSlots,
    /// The open-loop load's adaptive in-flight limit (`TigaConfig::admission_control`).
    admission: AdmissionLimit,
    stats: CoordinatorStats,
    /// Finished transactions not yet taken, if a front end asked for them.
    completions: Option<VecDeque<Completion>>,
    /// Finished transactions of a workload with types (TPC-C), one sample each.
    kind_samples: Vec<KindSample>,
    /// `replica_owd[shard][a][b]`: one-way delay from replica a to replica b of the shard (for
    /// the per-transaction quorum choice; empty: the paper's super-quorum headroom always).
    replica_owd: Vec<Vec<Vec<Duration>>>,
}

impl Coordinator {
    /// `region_owd_initial[shard][replica]` is the OWD bound used before any sample (a missing
    /// entry counts as `owd_cap`); `process_id` is the base of this coordinator's Jepsen
    /// process ids (see the module docs). No load is generated until [`Coordinator::with_open_loop`].
    pub fn new(
        topology: Topology,
        config: TigaConfig,
        workload: Box<dyn TxnSource>,
        region_owd_initial: Vec<Vec<Duration>>,
        process_id: u64,
    ) -> Self {
        let owd = topology.shards.iter().map(|rs| vec![OwdWindow::new(config.owd_cap); rs.len()]).collect();
        let p = config.owd_percentile;
        let owd_percentile = if p.is_nan() { 0.5 } else { p.clamp(0.0, 1.0) };
        let admission = AdmissionLimit::new(config.inflight_max, config.admission_control);
        let slots = ProcessSlots::new(config.inflight_max);
        Coordinator {
            topology,
            config,
            workload,
            owd_initial: region_owd_initial,
            owd,
            owd_percentile,
            process_id_base: process_id,
            view: 0,
            load: OpenLoop::default(),
            started_at: LocalTime::ZERO,
            arrival_due: LocalTime::ZERO,
            arrivals: 0,
            next_seq: 0,
            pending: BTreeMap::new(),
            replica_owd: Vec::new(),
            slots,
            admission,
            stats: CoordinatorStats::default(),
            completions: None,
            kind_samples: Vec::new(),
        }
    }

    /// Generate open-loop load from the workload source once started.
    pub fn with_open_loop(mut self, load: OpenLoop) -> Self {
        self.load = load;
        self
    }

    /// Keep a [`Completion`] of every finished transaction for [`Coordinator::take_completions`]
    /// (a front end must take them after every handler call; they are not bounded otherwise
    /// than by `inflight_max` per handler).
    pub fn with_completions(mut self) -> Self {
        self.completions = Some(VecDeque::new());
        self
    }

    /// The transactions finished since the last call (see [`Coordinator::with_completions`]).
    pub fn take_completions(&mut self) -> Vec<Completion> {
        self.completions.as_mut().map(|c| c.drain(..).collect()).unwrap_or_default()
    }

    pub fn stats(&self) -> CoordinatorStats {
        self.stats
    }

    /// Transactions sent and neither committed nor given up.
    pub fn inflight(&self) -> usize {
        self.pending.len()
    }

    /// The current OWD estimate for (shard, replica) at local time `now`: the window's
    /// percentile, else the initial bound; capped. `None` for a replica that does not exist.
    pub fn owd_estimate(&mut self, now: LocalTime, shard: ShardId, replica: u32) -> Option<Duration> {
        let (window, p, cap) = (self.config.owd_window, self.owd_percentile, self.config.owd_cap);
        let w = self.owd.get_mut(shard as usize)?.get_mut(replica as usize)?;
        w.expire(now, window);
        let est = match w.estimate(p) {
            Some(ns) => Duration::from_nanos(ns),
            None => self.owd_initial.get(shard as usize).and_then(|r| r.get(replica as usize)).copied().unwrap_or(cap),
        };
        Some(est.min(cap))
    }

    /// The one-way delays among each shard's replicas (`owd[shard][a][b]`, a → b), which the
    /// per-transaction quorum choice needs (see the module docs).
    pub fn with_replica_owd(mut self, owd: Vec<Vec<Vec<Duration>>>) -> Self {
        self.replica_owd = owd;
        self
    }

    /// The headroom a transaction on `shards` gets at local time `now` (see the module docs).
    pub fn headroom(&mut self, now: LocalTime, shards: &[ShardId]) -> Duration {
        if self.config.zero_headroom {
            return Duration::ZERO;
        }
        let (sq, f) = (self.topology.super_quorum(), self.topology.f());
        let kth = |v: &mut Vec<Duration>, k: usize| {
            v.sort_unstable();
            v.get(k.clamp(1, v.len().max(1)) - 1).copied().unwrap_or_default()
        };
        // Fast: reach the closest super quorum by the timestamp; their replies come back.
        let (mut fast_headroom, mut slow_headroom, mut slow_rest) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
        let choose = self.config.quorum_choice && !self.replica_owd.is_empty();
        for &s in shards {
            let n = self.topology.shards.get(s as usize).map_or(0, Vec::len);
            let est: Vec<Duration> = (0..n as u32).filter_map(|r| self.owd_estimate(now, s, r)).collect();
            if est.is_empty() {
                continue;
            }
            fast_headroom = fast_headroom.max(kth(&mut est.clone(), sq));
            if !choose {
                continue;
            }
            // Slow: reach the leader; then the later of its reply and the f-th follower's
            // reply after log synchronization.
            let leader = self.topology.leader.get(s as usize).map_or(0, |l| *l as usize).min(est.len() - 1);
            let hop = |a: usize, b: usize| {
                self.replica_owd.get(s as usize).and_then(|m| m.get(a)).and_then(|m| m.get(b)).copied()
            };
            let mut followers: Vec<Duration> = (0..est.len())
                .filter(|r| *r != leader)
                .filter_map(|r| hop(leader, r).map(|h| self.config.sync_interval / 2 + h + est[r]))
                .collect();
            slow_headroom = slow_headroom.max(est[leader]);
            slow_rest = slow_rest.max(est[leader].max(kth(&mut followers, f)));
        }
        // The fast path's replies travel back as far as the headroom went out (symmetric links).
        let owd = if choose && slow_headroom + slow_rest < fast_headroom * 2 { slow_headroom } else { fast_headroom };
        let base = i128::from(duration_nanos(owd + self.config.margin));
        let shifted = (base + i128::from(self.config.headroom_shift_ns)).clamp(0, i128::from(u64::MAX));
        Duration::from_nanos(shifted as u64)
    }

    /// Starts a transaction that increments `keys` by 1 (MicroBench; see [`Op::increment`]).
    pub fn submit_increments(&mut self, ctx: &mut Ctx<'_, TigaMsg>, keys: &[Key]) -> Result<TxnId, TxnError> {
        self.submit(ctx, keys.iter().map(|k| Op::increment(*k)).collect())
    }

    /// Starts a transaction running `ops` (in this order): records its invocation, sends it
    /// to every replica of every involved shard, and arms its retry timer.
    pub fn submit(&mut self, ctx: &mut Ctx<'_, TigaMsg>, ops: Vec<Op>) -> Result<TxnId, TxnError> {
        self.submit_work(ctx, ops, Pieces::default(), None)
    }

    /// [`Coordinator::submit`] of a transaction that also runs TPC-C pieces (the servers run
    /// them with `ops`, see [`crate::tpcc`]), of type `kind`.
    pub fn submit_work(
        &mut self,
        ctx: &mut Ctx<'_, TigaMsg>,
        ops: Vec<Op>,
        tpcc: Pieces,
        kind: Option<u8>,
    ) -> Result<TxnId, TxnError> {
        match self.plan(ctx.me(), &ops, &tpcc) {
            Ok((txn, pieces)) => {
                // `plan` refused it if `inflight_max` are pending, so a slot is free.
                let Some(slot) = self.slots.take() else {
                    return Err(TxnError::Overloaded { inflight: self.pending.len(), max: self.config.inflight_max });
                };
                self.next_seq += 1;
                let invoke = ops_invocation(&ops);
                ctx.record(HistoryEvent::new(OpType::Invoke, self.process_id_base + slot, "txn", invoke.clone()));
                let width = self.topology.shards.iter().map(Vec::len).max().unwrap_or(0);
                let p = Pending {
                    replies: vec![ReplicaReplies::default(); pieces.len() * width],
                    width,
                    first_leader_ts: vec![None; pieces.len()],
                    ops,
                    pieces,
                    slot,
                    invoked_at: ctx.now(),
                    first_send_at: None,
                    sends: 0,
                    invoke,
                    kind,
                    pre_read: pre_read::pre_read_of(&tpcc),
                };
                self.pending.insert(txn, p);
                self.send(ctx, txn);
                Ok(txn)
            }
            Err(e) => {
                if matches!(e, TxnError::Overloaded { .. }) {
                    self.stats.admission_dropped += 1;
                    ctx.metric("tiga.admission_dropped", 1);
                } else {
                    self.stats.rejected += 1;
                    ctx.metric("tiga.rejected", 1);
                }
                Err(e)
            }
        }
    }

    /// Validates a transaction and splits it into pieces, changing nothing.
    fn plan(&self, me: NodeId, ops: &[Op], tpcc: &Pieces) -> Result<(TxnId, Vec<Arc<Piece>>), TxnError> {
        if ops.is_empty() {
            return Err(TxnError::NoKeys);
        }
        if ops.len() > self.config.ops_per_txn_max {
            return Err(TxnError::TooManyOps { ops: ops.len(), max: self.config.ops_per_txn_max });
        }
        let bytes: usize = ops.iter().map(Op::payload_bytes).sum();
        if bytes > self.config.txn_bytes_max {
            return Err(TxnError::TooLarge { bytes, max: self.config.txn_bytes_max });
        }
        let keys = distinct_keys(ops);
        if keys.len() > self.config.keys_per_txn_max {
            return Err(TxnError::TooManyKeys { keys: keys.len(), max: self.config.keys_per_txn_max });
        }
        let mut ids: BTreeMap<Key, &[u8]> = BTreeMap::new();
        for (k, _, _) in &keys {
            if let Some(other) = ids.insert(key_id(k), k) {
                let show = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
                return Err(TxnError::KeyCollision { a: show(other), b: show(k) });
            }
        }
        let mut by_shard: BTreeMap<ShardId, Vec<Op>> = BTreeMap::new();
        for op in ops {
            let key = &op.key;
            let shard = if self.topology.shard_count() == 0 { 0 } else { self.config.shard_of(&self.topology, key) };
            let served = self
                .topology
                .shards
                .get(shard as usize)
                .zip(self.topology.leader.get(shard as usize))
                .is_some_and(|(rs, &l)| (l as usize) < rs.len());
            if !served {
                return Err(TxnError::UnknownShard { key: String::from_utf8_lossy(key).into_owned(), shard });
            }
            by_shard.entry(shard).or_default().push(op.clone());
        }
        if self.pending.len() >= self.config.inflight_max {
            return Err(TxnError::Overloaded { inflight: self.pending.len(), max: self.config.inflight_max });
        }
        let seq = u32::try_from(self.next_seq).map_err(|_| TxnError::IdsExhausted)?;
        let txn = TxnId::new(me, seq);
        let shards: Vec<ShardId> = by_shard.keys().copied().collect();
        // A multi-shard transaction's pieces carry all its operations (a view change may need
        // to rebuild one shard's piece from another's).
        let txn_ops = if shards.len() > 1 { ops.to_vec() } else { Vec::new() };
        let pieces = by_shard
            .into_iter()
            .map(|(shard, ops)| {
                Arc::new(
                    Piece::new(txn, shard, shards.clone(), ops).with_txn_ops(txn_ops.clone()).with_tpcc(tpcc.clone()),
                )
            })
            .collect();
        Ok((txn, pieces))
    }

    /// A server told of a newer view: take its leaders and resend everything in flight in it
    /// (same ids, fresh timestamps; a resend for a view change does not count as a retry).
    fn on_new_view(&mut self, ctx: &mut Ctx<'_, TigaMsg>, from: NodeId, view: crate::view::View) {
        if view.number <= self.view || !view.fits(&self.topology) || self.topology.locate(from).is_none() {
            return;
        }
        self.view = view.number;
        self.topology.leader = view.leaders;
        self.admission.paths_changed(ctx.now());
        self.stats.view_changes += 1;
        ctx.metric("tiga.coordinator_view_changes", 1);
        let inflight: Vec<TxnId> = self.pending.keys().copied().collect();
        let window = self.resend_window();
        for txn in inflight {
            if let Some(p) = self.pending.get_mut(&txn) {
                if !self.config.unsafe_accept_old_view_replies {
                    p.replies.fill(ReplicaReplies::default());
                    p.first_leader_ts.fill(None);
                }
                // Free, but not past the resend window: a later submit would reach servers
                // that may have forgotten the transaction (they refuse it; it gives up).
                if p.first_send_at.is_some_and(|at| ctx.now().saturating_since(at) > window) {
                    continue;
                }
                p.sends = p.sends.saturating_sub(1);
            }
            self.send(ctx, txn);
        }
    }

    /// How long after a transaction's first submit it may be sent again: up to its last
    /// retry, due `retry_timeout × (max_sends − 1)` after it, with half a `retry_timeout` for
    /// a late timer (a busy coordinator). A view change's resend does not count as a retry,
    /// but does not extend this. Servers refuse a transaction first sent `retry_timeout ×
    /// max_sends + future_slack` ago: a submit sent in the window has at least half a
    /// `retry_timeout` and the slack to arrive.
    fn resend_window(&self) -> Duration {
        (self.config.retry_timeout * self.config.max_sends).saturating_sub(self.config.retry_timeout / 2)
    }

    /// (Re)sends `txn` with a fresh timestamp and re-arms its retry timer; or, while it waits
    /// for its pre-read, (re)sends that, to the customer's shard's leader and then to the next
    /// replica each time (any replica can answer: `kairos_workload::tpcc::pre_read`).
    fn send(&mut self, ctx: &mut Ctx<'_, TigaMsg>, txn: TxnId) {
        if let Some((read, p)) = self.pending.get_mut(&txn).and_then(|p| Some((p.pre_read?, p))) {
            let shard = read.shard(self.topology.shard_count()) as usize;
            let replicas = self.topology.shards.get(shard).map_or(&[][..], Vec::as_slice);
            let leader = self.topology.leader.get(shard).copied().unwrap_or(0) as usize;
            if !replicas.is_empty() {
                let to = replicas[(leader + p.sends as usize) % replicas.len()];
                p.sends += 1;
                ctx.metric("tiga.pre_reads_sent", 1);
                ctx.send(to, TigaMsg::PreRead(PreReadRequest { txn, read }));
            }
            return ctx.set_timer(retry_timer(txn), self.config.retry_timeout);
        }
        let now = ctx.now();
        let shards: Vec<ShardId> = match self.pending.get(&txn) {
            Some(p) => p.pieces.iter().map(|pc| pc.shard).collect(),
            None => return,
        };
        let headroom = self.headroom(now, &shards);
        let Some(p) = self.pending.get_mut(&txn) else { return };
        p.sends += 1;
        let ts = Ts::at(now + headroom);
        let first_send_time = *p.first_send_at.get_or_insert(now);
        for piece in &p.pieces {
            let replicas = self.topology.shards.get(piece.shard as usize).map_or(&[][..], Vec::as_slice);
            for &node in replicas {
                ctx.send(
                    node,
                    TigaMsg::Submit(Submit {
                        view: self.view,
                        piece: Arc::clone(piece),
                        ts,
                        send_time: now,
                        first_send_time,
                    }),
                );
            }
        }
        ctx.set_timer(retry_timer(txn), self.config.retry_timeout);
    }

    /// A replica answered `txn`'s pre-read: name the customer by id in its pieces and send
    /// them. Answers from outside the customer's shard, late or duplicated ones are ignored.
    fn on_pre_read_answer(&mut self, ctx: &mut Ctx<'_, TigaMsg>, from: NodeId, answer: PreReadAnswer) {
        let shards = self.topology.shard_count();
        let from_shard =
            self.topology.shards.get(answer.read.shard(shards) as usize).is_some_and(|rs| rs.contains(&from));
        let Some(p) = self.pending.get_mut(&answer.txn).filter(|p| from_shard && p.pre_read == Some(answer.read))
        else {
            return self.ignore(ctx);
        };
        p.pre_read = None;
        p.sends = 0;
        if let (Some(customer), Some(first)) = (answer.customer, p.pieces.first()) {
            let tpcc = pre_read::resolve(&first.tpcc, answer.read, customer);
            p.pieces = p.pieces.iter().map(|pc| Arc::new((**pc).clone().with_tpcc(tpcc.clone()))).collect();
        }
        ctx.metric("tiga.pre_reads_answered", 1);
        self.send(ctx, answer.txn);
    }

    fn ignore(&mut self, ctx: &mut Ctx<'_, TigaMsg>) {
        self.stats.ignored_replies += 1;
        ctx.metric("tiga.ignored_replies", 1);
    }

    fn on_reply(&mut self, ctx: &mut Ctx<'_, TigaMsg>, from: NodeId, reply: ServerReply) {
        let ServerReply { view, txn, shard, replica, kind, ts, hash, result, owd_ns } = reply;
        let genuine = self.topology.shards.get(shard as usize).and_then(|rs| rs.get(replica as usize)) == Some(&from);
        if !genuine || (view != self.view && !self.config.unsafe_accept_old_view_replies) {
            return self.ignore(ctx);
        }
        if kind == ReplyKind::Fast && owd_ns > 0 {
            let (now, window) = (ctx.now(), self.config.owd_window);
            if let Some(w) = self.owd.get_mut(shard as usize).and_then(|rs| rs.get_mut(replica as usize)) {
                w.expire(now, window);
                w.push(now, owd_ns);
            }
        }
        let is_leader = self.topology.leader.get(shard as usize) == Some(&replica);
        let Some(p) = self.pending.get_mut(&txn) else { return self.ignore(ctx) };
        let Some(i) = p.pieces.iter().position(|pc| pc.shard == shard) else { return self.ignore(ctx) };
        let piece = &p.pieces[i];
        let Some(r) = p.replies.get_mut(i * p.width + replica as usize) else { return self.ignore(ctx) };
        match kind {
            ReplyKind::Fast => {
                if r.fast.as_ref().is_some_and(|f| f.ts > ts) {
                    return self.ignore(ctx);
                }
                let result = if is_leader {
                    match result {
                        Some(res)
                            if res.outputs.len() == piece.ops.len() && res.versions.len() == piece.distinct_keys() =>
                        {
                            Some(res)
                        }
                        _ => return self.ignore(ctx),
                    }
                } else {
                    None
                };
                r.fast = Some(Fast { ts, hash, result });
                if is_leader {
                    p.first_leader_ts[i].get_or_insert(ts);
                }
            }
            ReplyKind::Slow => {
                if is_leader || r.slow_ts.is_some_and(|t| t > ts) {
                    return self.ignore(ctx);
                }
                r.slow_ts = Some(ts);
            }
        }
        self.try_commit(ctx, txn);
    }

    /// Commits `txn` if the rule of the module docs holds.
    fn try_commit(&mut self, ctx: &mut Ctx<'_, TigaMsg>, txn: TxnId) {
        let Some(p) = self.pending.get(&txn) else { return };
        let Some(all_fast) = self.committed_path(p) else { return };
        self.finished(ctx, txn, Finish::Committed);
        let Some(p) = self.pending.remove(&txn) else { return };
        self.sample_kind(ctx, &p, true);
        let (value, outputs) = self.completion(&p);
        ctx.record(HistoryEvent::new(OpType::Ok, self.process_id_base + p.slot, "txn", value));
        if let Some(c) = self.completions.as_mut() {
            c.push_back(Completion { txn, outputs: Some(outputs) });
        }
        ctx.cancel_timer(retry_timer(txn));
        self.slots.give_back(p.slot);
        self.stats.committed += 1;
        ctx.metric("tiga.committed", 1);
        if all_fast {
            self.stats.committed_fast += 1;
            ctx.metric("tiga.committed_fast", 1);
        } else {
            self.stats.committed_slow += 1;
            ctx.metric("tiga.committed_slow", 1);
        }
        let mut firsts = p.first_leader_ts.iter().flatten();
        let first = firsts.next();
        if firsts.any(|t| Some(t) != first) {
            self.stats.ts_revised += 1;
            ctx.metric("tiga.ts_revised", 1);
        }
        ctx.metric("tiga.sends", u64::from(p.sends));
        ctx.metric(
            match p.sends {
                0 | 1 => "tiga.committed_sends_1",
                2 => "tiga.committed_sends_2",
                _ => "tiga.committed_sends_3plus",
            },
            1,
        );
    }

    /// A committed transaction's history micro-ops (see the module docs) and its outputs in
    /// transaction order, from the leaders' results.
    fn completion(&self, p: &Pending) -> (Vec<MicroOp>, Vec<OpOutput>) {
        let result = |i: usize| -> Option<&PieceResult> {
            p.leader_fast(i, self.topology.leader.get(p.pieces.get(i)?.shard as usize))?.result.as_ref()
        };
        let piece_of = |key: &[u8]| {
            let shard = self.config.shard_of(&self.topology, key);
            p.pieces.iter().position(|pc| pc.shard == shard)
        };
        // Each piece's distinct keys, in the order its result's versions follow.
        let piece_keys: Vec<_> = p.pieces.iter().map(|pc| distinct_keys(&pc.ops)).collect();
        let mut history = Vec::new();
        for (k, read, written) in distinct_keys(&p.ops) {
            let version = piece_of(k)
                .and_then(|i| {
                    let at = piece_keys[i].iter().position(|d| d.0 == k)?;
                    result(i)?.versions.get(at).copied()
                })
                .unwrap_or(0);
            let key = history_key(k);
            if read {
                history.push(MicroOp::Read { key, value: (version != 0).then_some(ReadValue::Int(version)) });
            }
            if written {
                history.push(MicroOp::Write { key, value: version.saturating_add(1) });
            }
        }
        // Each piece's outputs are in its operations' order, which is the transaction's order
        // restricted to that shard.
        let mut next = vec![0usize; p.pieces.len()];
        let outputs = p
            .ops
            .iter()
            .map(|op| {
                let Some(i) = piece_of(&op.key) else { return OpOutput::Nil };
                let out = result(i).and_then(|r| r.outputs.get(next[i]).cloned()).unwrap_or(OpOutput::Nil);
                next[i] += 1;
                out
            })
            .collect();
        (history, outputs)
    }

    /// `Some(every shard fast)` if `p` is committed, else `None`.
    fn committed_path(&self, p: &Pending) -> Option<bool> {
        let leader_fast = |i: usize| p.leader_fast(i, self.topology.leader.get(p.pieces[i].shard as usize));
        let mut t_star = None;
        for i in 0..p.pieces.len() {
            t_star = t_star.max(Some(leader_fast(i)?.ts));
        }
        let t_star = t_star?;
        let (sq, f) = (self.topology.super_quorum(), self.topology.f());
        let mut all_fast = true;
        for i in 0..p.pieces.len() {
            let lf = leader_fast(i)?;
            if lf.ts != t_star {
                return None;
            }
            let (mut same, mut synced) = (0, 0);
            for r in p.replies_of(i) {
                let hash_ok = |x: &Fast| x.hash == lf.hash || self.config.unsafe_ignore_log_hash;
                same += usize::from(r.fast.as_ref().is_some_and(|x| x.ts == t_star && hash_ok(x)));
                synced += usize::from(r.slow_ts == Some(t_star));
            }
            if same >= sq {
                continue;
            }
            if synced >= f {
                all_fast = false;
                continue;
            }
            return None;
        }
        Some(all_fast)
    }

    /// `committed`: else given up (outcome unknown). Tiga never aborts: one attempt each.
    fn sample_kind(&mut self, ctx: &Ctx<'_, TigaMsg>, p: &Pending, committed: bool) {
        if let Some(kind) = p.kind.filter(|_| self.kind_samples.len() < KIND_SAMPLES_MAX) {
            let latency_ns = ctx.now().saturating_since(p.invoked_at).as_nanos() as u64;
            self.kind_samples.push(KindSample { kind, committed, attempts: 1, latency_ns });
        }
    }

    /// The finished transactions of a workload with types (TPC-C), one sample each.
    pub fn kind_samples(&self) -> &[KindSample] {
        &self.kind_samples
    }

    /// Tells the admission limit how `txn` (still pending) ended.
    fn finished(&mut self, ctx: &mut Ctx<'_, TigaMsg>, txn: TxnId, finish: Finish) {
        let Some(p) = self.pending.get(&txn) else { return };
        let path = path_of_shards(p.pieces.iter().map(|pc| pc.shard));
        if self.admission.on_finish(ctx.now(), p.invoked_at, path, self.pending.len(), finish) {
            ctx.metric("tiga.admission_steps_down", 1);
        }
    }

    fn on_retry(&mut self, ctx: &mut Ctx<'_, TigaMsg>, txn: TxnId) {
        let Some(p) = self.pending.get(&txn) else { return };
        let in_window = p.first_send_at.is_none_or(|at| ctx.now().saturating_since(at) <= self.resend_window());
        if p.sends < self.config.max_sends && in_window {
            self.stats.retransmissions += 1;
            ctx.metric("tiga.retransmissions", 1);
            return self.send(ctx, txn);
        }
        self.finished(ctx, txn, Finish::GaveUp);
        let Some(p) = self.pending.remove(&txn) else { return };
        self.sample_kind(ctx, &p, false);
        ctx.record(HistoryEvent::new(OpType::Info, self.process_id_base + p.slot, "txn", p.invoke));
        if let Some(c) = self.completions.as_mut() {
            c.push_back(Completion { txn, outputs: None });
        }
        self.slots.give_back(p.slot);
        self.stats.info += 1;
        ctx.metric("tiga.info", 1);
        ctx.metric("tiga.sends", u64::from(p.sends));
    }

    /// Whether the arrival due at `at` is part of the load.
    fn generating(&self, at: LocalTime) -> bool {
        self.load.generating(self.started_at, self.arrivals, at)
    }

    fn schedule_arrival(&mut self, ctx: &mut Ctx<'_, TigaMsg>) {
        let now = ctx.now();
        if let Some((at, after)) = self.load.next_arrival(ctx.rng(), self.arrival_due, now) {
            self.arrival_due = at;
            if self.generating(at) {
                ctx.set_timer(CoordinatorTimer::Arrival, after);
            }
        }
    }

    fn on_arrival(&mut self, ctx: &mut Ctx<'_, TigaMsg>) {
        if !self.generating(self.arrival_due) {
            return;
        }
        self.arrivals += 1;
        // Ids grow with invocation time, and a retry keeps its id: the first is the oldest.
        let oldest = self.pending.first_key_value().map(|(_, p)| p.invoked_at);
        if self.admission.on_arrival(ctx.now(), self.pending.len(), oldest) {
            ctx.metric("tiga.admission_steps_down", 1);
        }
        if !self.admission.admits(self.pending.len()) {
            self.stats.admission_dropped += 1;
            ctx.metric("tiga.admission_dropped", 1);
        } else {
            // An increment by 1 of each key (see `kairos_workload::micro`), or a read of each if
            // the transaction only reads, plus a TPC-C transaction's pieces.
            let now = ctx.now().as_nanos();
            let TxnWork { keys, pieces, kind } = self.workload.next_txn(ctx.rng(), now);
            let op = if reads_only(&pieces) { Op::read } else { Op::increment };
            let ops = keys.into_iter().map(op).collect();
            // A rejected transaction is counted by `submit`; the load goes on.
            let _ = self.submit_work(ctx, ops, pieces, kind);
        }
        self.schedule_arrival(ctx);
    }
}

fn retry_timer(txn: TxnId) -> CoordinatorTimer {
    CoordinatorTimer::Retry(txn.seq())
}

impl Process for Coordinator {
    type Msg = TigaMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, TigaMsg>) {
        self.started_at = ctx.now();
        self.arrival_due = ctx.now();
        if self.generating(ctx.now()) {
            self.schedule_arrival(ctx);
        }
    }

    fn on_message(&mut self, ctx: &mut Ctx<'_, TigaMsg>, from: NodeId, msg: TigaMsg) {
        match msg {
            TigaMsg::Reply(reply) => self.on_reply(ctx, from, reply),
            TigaMsg::NewView { view } => self.on_new_view(ctx, from, view),
            TigaMsg::PreReadAnswer(answer) => self.on_pre_read_answer(ctx, from, answer),
            _ => self.ignore(ctx),
        }
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_, TigaMsg>, timer: TimerId) {
        match CoordinatorTimer::from_id(timer) {
            Some(CoordinatorTimer::Arrival) => self.on_arrival(ctx),
            Some(CoordinatorTimer::Retry(seq)) => self.on_retry(ctx, TxnId::new(ctx.me(), seq)),
            None => {}
        }
    }

    /// Jepsen process slots ([`ProcessSlots::check`]): one per pending transaction.
    fn invariants(&self) -> Result<(), String> {
        self.slots.check(self.pending.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::Value;
    use kairos_core::{Effect, Rng};
    use kairos_workload::FixedKeys;
    use rand::SeedableRng;

    const ME: NodeId = NodeId(100);

    /// Test key `k` as bytes: a key whose id is ≡ k (mod 60), so that it sits on shard
    /// `k mod shards` for every shard count up to 6 (the old `key mod shards` placement).
    fn tk(k: u64) -> Vec<u8> {
        (0u32..)
            .map(|j| format!("k{k}-{j}").into_bytes())
            .find(|b| key_id(b) % 60 == k % 60)
            .expect("some suffix lands there")
    }

    /// The history key of test key `k`.
    fn hk(k: u64) -> u64 {
        history_key(&tk(k))
    }

    /// A leader's result for its piece of `txn` on shard `s` from (test key, version read)
    /// pairs; a key of the piece missing from `reads` makes the result malformed.
    fn leader_result(c: &Coordinator, txn: TxnId, s: ShardId, reads: Vec<(Key, Value)>) -> PieceResult {
        let Some(piece) = c.pending.get(&txn).and_then(|p| p.pieces.iter().find(|pc| pc.shard == s)) else {
            return PieceResult { outputs: vec![], versions: reads.iter().map(|r| r.1).collect() };
        };
        let versions: Vec<Option<u64>> = distinct_keys(&piece.ops)
            .iter()
            .map(|(k, _, _)| reads.iter().find(|(t, _)| tk(*t).as_slice() == *k).map(|r| r.1))
            .collect();
        match versions.into_iter().collect::<Option<Vec<u64>>>() {
            Some(versions) => {
                let outputs = versions.iter().map(|v| OpOutput::Int(*v as i64 + 1)).collect();
                PieceResult { outputs, versions }
            }
            None => PieceResult { outputs: vec![], versions: vec![] },
        }
    }
    const MS: u64 = 1_000_000;
    const BASE: u64 = 500;

    /// `shards` shards of `n` replicas: replica r of shard s is node s·n + r; leader replica 0.
    fn topology(shards: u32, n: u32) -> Topology {
        Topology {
            shards: (0..shards).map(|s| (0..n).map(|r| NodeId(s * n + r)).collect()).collect(),
            leader: vec![0; shards as usize],
        }
    }

    fn node(t: &Topology, s: ShardId, r: u32) -> NodeId {
        t.shards[s as usize][r as usize]
    }

    struct H {
        c: Coordinator,
        rng: Rng,
        now: LocalTime,
    }

    impl H {
        fn new(t: Topology, config: TigaConfig, initial: Vec<Vec<Duration>>) -> H {
            let c = Coordinator::new(t, config, Box::new(FixedKeys::new(vec![])), initial, BASE);
            H { c, rng: Rng::seed_from_u64(1), now: LocalTime::from_secs(1_000) }
        }

        /// 3 shards × 3 replicas, every initial OWD 50 ms.
        fn std() -> H {
            H::new(topology(3, 3), TigaConfig::default(), vec![vec![Duration::from_millis(50); 3]; 3])
        }

        fn run<R>(
            &mut self,
            f: impl FnOnce(&mut Coordinator, &mut Ctx<'_, TigaMsg>) -> R,
        ) -> (R, Vec<Effect<TigaMsg>>) {
            let mut effects = Vec::new();
            let mut ctx = Ctx::new(ME, self.now, &mut self.rng, &mut effects);
            let r = f(&mut self.c, &mut ctx);
            (r, effects)
        }

        fn submit(&mut self, keys: Vec<Key>) -> (Result<TxnId, TxnError>, Vec<Effect<TigaMsg>>) {
            self.run(|c, ctx| {
                c.submit(ctx, keys.into_iter().map(|k| Op::new(tk(k), crate::ops::OpKind::IncrBy(1))).collect())
            })
        }

        fn deliver(&mut self, from: NodeId, msg: TigaMsg) -> Vec<Effect<TigaMsg>> {
            self.run(|c, ctx| c.on_message(ctx, from, msg)).1
        }

        fn timer(&mut self, id: TimerId) -> Vec<Effect<TigaMsg>> {
            self.run(|c, ctx| c.on_timer(ctx, id)).1
        }

        /// A well-formed reply from replica r of shard s.
        #[allow(clippy::too_many_arguments)]
        fn reply(
            &mut self,
            txn: TxnId,
            s: ShardId,
            r: u32,
            kind: ReplyKind,
            ts: Ts,
            hash: u8,
            reads: Option<Vec<(Key, Value)>>,
        ) -> Vec<Effect<TigaMsg>> {
            let from = node(&self.c.topology, s, r);
            let result = reads.map(|rd| leader_result(&self.c, txn, s, rd));
            let msg = TigaMsg::Reply(ServerReply {
                view: 0,
                txn,
                shard: s,
                replica: r,
                kind,
                ts,
                hash: [hash; 20],
                result,
                owd_ns: 0,
            });
            self.deliver(from, msg)
        }
    }

    fn submits(effects: &[Effect<TigaMsg>]) -> Vec<(NodeId, Piece, Ts, LocalTime)> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Send { to, msg: TigaMsg::Submit(Submit { piece, ts, send_time, .. }) } => {
                    Some((*to, Piece::clone(piece), *ts, *send_time))
                }
                _ => None,
            })
            .collect()
    }

    fn history(effects: &[Effect<TigaMsg>]) -> Vec<HistoryEvent> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::History(h) => Some(h.clone()),
                _ => None,
            })
            .collect()
    }

    fn metrics(effects: &[Effect<TigaMsg>]) -> Vec<&'static str> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Metric { name, .. } => Some(*name),
                _ => None,
            })
            .collect()
    }

    /// The headroom a submit of `keys` got (ts − send time).
    fn headroom_of(h: &mut H, keys: Vec<Key>) -> u64 {
        let (r, eff) = h.submit(keys);
        r.unwrap();
        let s = submits(&eff);
        assert!(!s.is_empty());
        assert!(s.iter().all(|x| x.2 == s[0].2 && x.3 == h.now));
        duration_nanos(s[0].2.saturating_since(Ts::at(s[0].3)))
    }

    /// A Fast reply carrying only an OWD sample (for a transaction nobody waits for).
    fn owd_sample(h: &mut H, s: ShardId, r: u32, owd: Duration) {
        let from = node(&h.c.topology, s, r);
        let msg = TigaMsg::Reply(ServerReply {
            view: 0,
            txn: TxnId(u64::MAX),
            shard: s,
            replica: r,
            kind: ReplyKind::Fast,
            ts: Ts::ZERO,
            hash: [0; 20],
            result: None,
            owd_ns: duration_nanos(owd),
        });
        h.deliver(from, msg);
    }

    /// A by-name TPC-C transaction asks the customer's shard's leader, then the next replica,
    /// ignores an answer from another shard, and submits its pieces with the customer named by
    /// id once a replica of the shard answers (once: a duplicate answer changes nothing).
    #[test]
    fn a_by_name_tpcc_transaction_pre_reads_before_it_submits() {
        use kairos_workload::tpcc::{piece::split, CustomerRef, TpccTxn};
        let mut h = H::std();
        let t = topology(3, 3);
        let payment = TpccTxn::Payment {
            w: 0,
            d: 1,
            customer_w: 1,
            customer_d: 2,
            customer: CustomerRef::LastName(5),
            amount_cents: 100,
            date: 0,
        };
        let ops = vec![Op::new(tk(1), crate::ops::OpKind::IncrBy(1))];
        let (txn, fx) = h.run(|c, ctx| c.submit_work(ctx, ops, split(&payment).into(), Some(1)));
        let txn = txn.unwrap();
        let pre_reads = |fx: &[Effect<TigaMsg>]| -> Vec<(NodeId, PreReadRequest)> {
            fx.iter()
                .filter_map(|e| match e {
                    Effect::Send { to, msg: TigaMsg::PreRead(r) } => Some((*to, *r)),
                    _ => None,
                })
                .collect()
        };
        let read = PreRead { w: 1, d: 2, last_name: 5 };
        assert!(submits(&fx).is_empty(), "nothing is submitted before the pre-read");
        assert_eq!(pre_reads(&fx), vec![(node(&t, 1, 0), PreReadRequest { txn, read })]);
        let fx = h.timer(retry_timer(txn).id());
        assert_eq!(pre_reads(&fx), vec![(node(&t, 1, 1), PreReadRequest { txn, read })]);
        let answer = PreReadAnswer { txn, read, customer: Some(17) };
        let fx = h.deliver(node(&t, 0, 0), TigaMsg::PreReadAnswer(answer));
        assert!(submits(&fx).is_empty() && pre_reads(&fx).is_empty(), "another shard's node cannot answer");
        let fx = h.deliver(node(&t, 1, 2), TigaMsg::PreReadAnswer(answer));
        let sent = submits(&fx);
        assert!(!sent.is_empty());
        let resolved = split(&payment.resolved(17));
        assert!(sent.iter().all(|(_, piece, _, _)| piece.tpcc[..] == resolved[..]));
        assert!(submits(&h.deliver(node(&t, 1, 2), TigaMsg::PreReadAnswer(answer))).is_empty());
    }

    #[test]
    fn timer_ids_decode_to_the_timer_that_set_them() {
        use CoordinatorTimer::*;
        kairos_core::check_timer_encoding(&[Arrival, Retry(0), Retry(1), Retry(u32::MAX)]).unwrap();
        assert_eq!(CoordinatorTimer::from_id(TimerId(u64::MAX)), None);
    }
    #[test]
    fn headroom_from_initial_bounds_margin_shift_and_zero() {
        let ms = Duration::from_millis;
        // f = 2: 5 replicas, super quorum 4 → the 4th smallest OWD.
        let initial = vec![vec![ms(10), ms(50), ms(20), ms(40), ms(30)], vec![ms(5), ms(5), ms(5), ms(70), ms(90)]];
        let mut h = H::new(topology(2, 5), TigaConfig::default(), initial.clone());
        assert_eq!(h.c.topology.super_quorum(), 4);
        assert_eq!(headroom_of(&mut h, vec![0]), 50 * MS, "40 ms (4th of 5) + 10 ms margin");
        assert_eq!(headroom_of(&mut h, vec![1]), 80 * MS, "70 ms + 10 ms");
        assert_eq!(headroom_of(&mut h, vec![0, 1]), 80 * MS, "max over shards");

        let cfg = TigaConfig { headroom_shift_ns: -20 * MS as i64, ..TigaConfig::default() };
        let mut h = H::new(topology(2, 5), cfg, initial.clone());
        assert_eq!(headroom_of(&mut h, vec![0]), 30 * MS);
        let cfg = TigaConfig { headroom_shift_ns: -500 * MS as i64, ..TigaConfig::default() };
        let mut h = H::new(topology(2, 5), cfg, initial.clone());
        assert_eq!(headroom_of(&mut h, vec![0]), 0, "a negative shift saturates at 0");
        let cfg = TigaConfig { headroom_shift_ns: 7 * MS as i64, margin: ms(1), ..TigaConfig::default() };
        let mut h = H::new(topology(2, 5), cfg, initial.clone());
        assert_eq!(headroom_of(&mut h, vec![0]), 48 * MS);
        let cfg = TigaConfig { zero_headroom: true, ..TigaConfig::default() };
        let mut h = H::new(topology(2, 5), cfg, initial);
        assert_eq!(headroom_of(&mut h, vec![0, 1]), 0);

        // f = 1: the super quorum is all 3; a missing initial bound counts as the cap.
        let mut h = H::new(topology(1, 3), TigaConfig::default(), vec![vec![ms(1), ms(2)]]);
        assert_eq!(headroom_of(&mut h, vec![0]), 410 * MS);
    }

    #[test]
    fn headroom_follows_samples_percentile_cap_and_window() {
        let ms = Duration::from_millis;
        let mut h = H::std();
        assert_eq!(headroom_of(&mut h, vec![0]), 60 * MS, "initial 50 ms + margin");
        // Replica 2 of shard 0: samples 10, 20, 30, 100 → p50 nearest rank = 2nd = 20 ms.
        for v in [30, 10, 100, 20] {
            owd_sample(&mut h, 0, 2, ms(v));
        }
        assert_eq!(h.c.owd_estimate(h.now, 0, 2), Some(ms(20)));
        assert_eq!(headroom_of(&mut h, vec![0]), 60 * MS, "replicas 0 and 1 still at their 50 ms bound");
        for r in [0, 1] {
            owd_sample(&mut h, 0, r, ms(5));
        }
        assert_eq!(headroom_of(&mut h, vec![0]), 30 * MS, "farthest of the 3: 20 ms");
        // A huge sample is capped (and so is an estimate made of them).
        for _ in 0..9 {
            owd_sample(&mut h, 0, 0, Duration::from_secs(10));
        }
        assert_eq!(h.c.owd_estimate(h.now, 0, 0), Some(ms(400)));
        assert_eq!(headroom_of(&mut h, vec![0]), 410 * MS);
        // The window: 0.6 s later add a sample; 0.5 s after that the old samples expire.
        h.now = h.now + ms(600);
        owd_sample(&mut h, 0, 2, ms(70));
        assert_eq!(h.c.owd_estimate(h.now, 0, 2), Some(ms(30)), "10 20 30 70 100 → 3rd");
        h.now = h.now + ms(500);
        assert_eq!(h.c.owd_estimate(h.now, 0, 2), Some(ms(70)), "only the recent sample is left");
        assert_eq!(h.c.owd_estimate(h.now, 0, 0), Some(ms(50)), "no sample in the window: initial bound");
        h.now = h.now + ms(2000);
        assert_eq!(h.c.owd_estimate(h.now, 0, 2), Some(ms(50)));
        assert_eq!(h.c.owd_estimate(h.now, 0, 3), None);
        assert_eq!(h.c.owd_estimate(h.now, 9, 0), None);
    }

    #[test]
    fn fast_commit_with_a_super_quorum_including_the_leader() {
        let mut h = H::std();
        let (txn, eff) = h.submit(vec![3, 0]);
        let txn = txn.unwrap();
        let s = submits(&eff);
        assert_eq!(s.len(), 3, "one shard (keys 3 and 0 are on shard 0), 3 replicas");
        assert_eq!(s[0].1.reads, vec![key_id(&tk(3)), key_id(&tk(0))]);
        assert_eq!(s[0].1.writes, s[0].1.reads);
        assert_eq!(s[0].1.shards, vec![0]);
        let inv = history(&eff);
        assert_eq!(inv.len(), 1);
        assert_eq!((inv[0].op_type, inv[0].process, inv[0].f.as_str()), (OpType::Invoke, BASE, "txn"));
        assert_eq!(inv[0].value[0], MicroOp::Read { key: hk(3), value: None });
        assert_eq!(inv[0].value[1], MicroOp::WriteUnknown { key: hk(3) });
        let ts = s[0].2;

        let e = h.reply(txn, 0, 0, ReplyKind::Fast, ts, 7, Some(vec![(0, 0), (3, 41)]));
        assert!(history(&e).is_empty());
        let e = h.reply(txn, 0, 1, ReplyKind::Fast, ts, 7, None);
        assert!(history(&e).is_empty(), "2 of 3 is not a super quorum");
        let e = h.reply(txn, 0, 2, ReplyKind::Fast, ts, 7, None);
        let ok = history(&e);
        assert_eq!(ok.len(), 1);
        assert_eq!((ok[0].op_type, ok[0].process), (OpType::Ok, BASE));
        assert_eq!(
            ok[0].value,
            vec![
                MicroOp::Read { key: hk(3), value: Some(ReadValue::Int(41)) },
                MicroOp::Write { key: hk(3), value: 42 },
                MicroOp::Read { key: hk(0), value: None },
                MicroOp::Write { key: hk(0), value: 1 },
            ]
        );
        let m = metrics(&e);
        for name in ["tiga.committed", "tiga.committed_fast", "tiga.sends", "tiga.committed_sends_1"] {
            assert!(m.contains(&name), "{name} in {m:?}");
        }
        assert!(!m.contains(&"tiga.ts_revised"));
        assert!(e.contains(&Effect::CancelTimer { id: retry_timer(txn).id() }));
        let st = h.c.stats();
        assert_eq!((st.committed, st.committed_fast, st.committed_slow, st.ts_revised), (1, 1, 0, 0));
        assert_eq!(h.c.inflight(), 0);
        // Duplicates and late replies change nothing.
        let e = h.reply(txn, 0, 2, ReplyKind::Fast, ts, 7, None);
        assert!(history(&e).is_empty());
        assert_eq!(h.c.stats().committed, 1);
    }

    #[test]
    fn a_mismatching_hash_blocks_the_fast_path_and_the_slow_path_commits() {
        let mut h = H::std();
        let txn = h.submit(vec![0]).0.unwrap();
        let ts = Ts::from_nanos(5_000);
        h.reply(txn, 0, 0, ReplyKind::Fast, ts, 7, Some(vec![(0, 9)]));
        h.reply(txn, 0, 1, ReplyKind::Fast, ts, 7, None);
        let e = h.reply(txn, 0, 2, ReplyKind::Fast, ts, 8, None);
        assert!(history(&e).is_empty(), "follower 2's hash differs");
        let e = h.reply(txn, 0, 1, ReplyKind::Slow, Ts::from_nanos(ts.as_nanos() - 1), 0, None);
        assert!(history(&e).is_empty(), "a slow reply at another timestamp does not count");
        let e = h.reply(txn, 0, 0, ReplyKind::Slow, ts, 0, None);
        assert!(history(&e).is_empty(), "the leader's own slow reply does not count");
        let e = h.reply(txn, 0, 2, ReplyKind::Slow, ts, 0, None);
        let ok = history(&e);
        assert_eq!(ok.len(), 1, "leader + f = 1 synced follower");
        assert_eq!(ok[0].value[0], MicroOp::Read { key: hk(0), value: Some(ReadValue::Int(9)) });
        assert!(metrics(&e).contains(&"tiga.committed_slow"));
        let st = h.c.stats();
        assert_eq!((st.committed, st.committed_fast, st.committed_slow), (1, 0, 1));
    }

    #[test]
    fn a_follower_that_held_the_txn_is_replaced_by_the_slow_path() {
        // The leader bumped the timestamp; followers released nothing at it (they hold it).
        let mut h = H::std();
        let txn = h.submit(vec![0]).0.unwrap();
        h.reply(txn, 0, 0, ReplyKind::Fast, Ts::from_nanos(900), 1, Some(vec![(0, 0)]));
        let e = h.reply(txn, 0, 1, ReplyKind::Slow, Ts::from_nanos(900), 0, None);
        assert_eq!(history(&e).len(), 1);
    }

    #[test]
    fn multi_shard_waits_for_the_agreed_timestamp() {
        let mut h = H::std();
        let txn = h.submit(vec![0, 1]).0.unwrap();
        // Shard 0 released at 100, shard 1's leader bumped to 120; followers agree with their leaders.
        h.reply(txn, 0, 0, ReplyKind::Fast, Ts::from_nanos(100), 1, Some(vec![(0, 5)]));
        h.reply(txn, 1, 0, ReplyKind::Fast, Ts::from_nanos(120), 2, Some(vec![(1, 6)]));
        for r in [1, 2] {
            h.reply(txn, 0, r, ReplyKind::Fast, Ts::from_nanos(100), 1, None);
            let e = h.reply(txn, 1, r, ReplyKind::Fast, Ts::from_nanos(120), 2, None);
            assert!(history(&e).is_empty(), "leaders' timestamps differ: no commit");
        }
        // Shard 0's leader re-executes at 120 and re-sends; its followers still say 100.
        let e = h.reply(txn, 0, 0, ReplyKind::Fast, Ts::from_nanos(120), 3, Some(vec![(0, 7)]));
        assert!(history(&e).is_empty());
        // A stale reply from the same leader is discarded.
        h.reply(txn, 0, 0, ReplyKind::Fast, Ts::from_nanos(100), 1, Some(vec![(0, 5)]));
        let e = h.reply(txn, 0, 1, ReplyKind::Slow, Ts::from_nanos(120), 0, None);
        let ok = history(&e);
        assert_eq!(ok.len(), 1);
        assert_eq!(
            ok[0].value,
            vec![
                MicroOp::Read { key: hk(0), value: Some(ReadValue::Int(7)) },
                MicroOp::Write { key: hk(0), value: 8 },
                MicroOp::Read { key: hk(1), value: Some(ReadValue::Int(6)) },
                MicroOp::Write { key: hk(1), value: 7 },
            ]
        );
        let m = metrics(&e);
        assert!(m.contains(&"tiga.ts_revised") && m.contains(&"tiga.committed_slow"), "{m:?}");
        let st = h.c.stats();
        assert_eq!((st.committed, st.committed_fast, st.committed_slow, st.ts_revised), (1, 0, 1, 1));
    }

    #[test]
    fn multi_shard_all_fast_at_the_agreed_timestamp() {
        let mut h = H::std();
        let txn = h.submit(vec![2, 1]).0.unwrap();
        let s = submits(&h.submit(vec![]).1);
        assert!(s.is_empty());
        for sh in [1, 2] {
            for r in 0..3 {
                let reads = (r == 0).then(|| vec![(sh as Key, 0)]);
                h.reply(txn, sh, r, ReplyKind::Fast, Ts::from_nanos(300), sh as u8, reads);
            }
        }
        let st = h.c.stats();
        assert_eq!((st.committed, st.committed_fast, st.ts_revised), (1, 1, 0));
    }

    #[test]
    fn retransmission_keeps_the_id_and_gives_up_after_max_sends() {
        let mut h = H::std();
        let (txn, eff) = h.submit(vec![0, 1]);
        let txn = txn.unwrap();
        let first = submits(&eff);
        assert_eq!(first.len(), 6);
        assert!(eff.contains(&Effect::SetTimer { id: retry_timer(txn).id(), after: Duration::from_secs(2) }));
        // A follower's reply survives retransmission.
        h.reply(txn, 0, 1, ReplyKind::Fast, first[0].2, 1, None);
        h.now = h.now + Duration::from_secs(2);
        let e = h.timer(retry_timer(txn).id());
        let second = submits(&e);
        assert_eq!(second.len(), 6);
        assert!(second.iter().all(|x| x.1.txn == txn && x.2 > first[0].2 && x.3 == h.now));
        assert!(metrics(&e).contains(&"tiga.retransmissions"));
        assert!(history(&e).is_empty());
        h.now = h.now + Duration::from_secs(2);
        assert_eq!(submits(&h.timer(retry_timer(txn).id())).len(), 6, "third send");
        h.now = h.now + Duration::from_secs(2);
        let e = h.timer(retry_timer(txn).id());
        assert!(submits(&e).is_empty(), "max_sends = 3 reached");
        let info = history(&e);
        assert_eq!(info.len(), 1);
        assert_eq!((info[0].op_type, info[0].process), (OpType::Info, BASE));
        assert_eq!(info[0].value, history(&eff)[0].value, "info carries the invocation's micro-ops");
        assert!(metrics(&e).contains(&"tiga.info"));
        let st = h.c.stats();
        assert_eq!((st.retransmissions, st.info, st.committed), (2, 1, 0));
        // Late replies and a stale timer are ignored.
        for sh in [0, 1] {
            for r in 0..3 {
                let e = h.reply(txn, sh, r, ReplyKind::Fast, Ts::from_nanos(1), 1, Some(vec![(sh as Key, 1)]));
                assert!(history(&e).is_empty());
            }
        }
        assert!(h.timer(retry_timer(txn).id()).is_empty());
        // The slot is free again.
        let (_, e) = h.submit(vec![5]);
        assert_eq!(history(&e)[0].process, BASE);
    }

    /// A general transaction over three shards: each operation's output comes back in the
    /// transaction's order, and the history records versions — a read only where the
    /// transaction's first operation on the key reads it, a write of version + 1 where it writes.
    #[test]
    fn general_operations_return_outputs_in_order_and_record_versions() {
        use crate::ops::{OpError, OpKind};
        let mut h = H::std();
        h.c.completions = Some(VecDeque::new());
        let ops = vec![
            Op::new(tk(0), OpKind::Set(b"v".to_vec())),
            Op::new(tk(1), OpKind::Get),
            Op::new(tk(0), OpKind::IncrBy(2)),
            Op::new(tk(3), OpKind::Get),
            Op::new(tk(2), OpKind::Del),
        ];
        let (txn, eff) = h.run(|c, ctx| c.submit(ctx, ops));
        let txn = txn.unwrap();
        let inv = history(&eff);
        let placeholder = |k| MicroOp::WriteUnknown { key: hk(k) };
        assert_eq!(
            inv[0].value,
            vec![
                placeholder(0),
                MicroOp::Read { key: hk(1), value: None },
                MicroOp::Read { key: hk(3), value: None },
                placeholder(2)
            ]
        );
        let pieces = submits(&eff);
        let ops_of = |s: ShardId| pieces.iter().find(|p| p.1.shard == s).unwrap().1.ops.len();
        assert_eq!((ops_of(0), ops_of(1), ops_of(2)), (3, 1, 1), "each shard gets its keys' operations");
        let results = [
            (
                0,
                PieceResult {
                    outputs: vec![OpOutput::Ok, OpOutput::Error(OpError::NotInteger), OpOutput::Nil],
                    versions: vec![5, 7],
                },
            ),
            (1, PieceResult { outputs: vec![OpOutput::Bulk(b"x".to_vec())], versions: vec![2] }),
            (2, PieceResult { outputs: vec![OpOutput::Int(0)], versions: vec![0] }),
        ];
        let mut all = Vec::new();
        for (s, result) in results {
            for r in 0..3 {
                let from = node(&h.c.topology, s, r);
                let result = (r == 0).then(|| result.clone());
                let msg = TigaMsg::Reply(ServerReply {
                    view: 0,
                    txn,
                    shard: s,
                    replica: r,
                    kind: ReplyKind::Fast,
                    ts: Ts::from_nanos(50),
                    hash: [1; 20],
                    result,
                    owd_ns: 0,
                });
                all.extend(h.deliver(from, msg));
            }
        }
        let ok = history(&all);
        assert_eq!(ok.len(), 1);
        assert_eq!(
            ok[0].value,
            vec![
                MicroOp::Write { key: hk(0), value: 6 },
                MicroOp::Read { key: hk(1), value: Some(ReadValue::Int(2)) },
                MicroOp::Read { key: hk(3), value: Some(ReadValue::Int(7)) },
                MicroOp::Write { key: hk(2), value: 1 },
            ]
        );
        let done = h.c.take_completions();
        assert_eq!(
            done,
            vec![Completion {
                txn,
                outputs: Some(vec![
                    OpOutput::Ok,
                    OpOutput::Bulk(b"x".to_vec()),
                    OpOutput::Error(OpError::NotInteger),
                    OpOutput::Nil,
                    OpOutput::Int(0),
                ]),
            }]
        );
        assert!(h.c.take_completions().is_empty());
    }

    #[test]
    fn slots_are_reused_smallest_first() {
        let mut h = H::std();
        let a = h.submit(vec![0]).0.unwrap();
        let (b, e) = h.submit(vec![3]);
        assert_eq!(history(&e)[0].process, BASE + 1);
        let (_, e) = h.submit(vec![6]);
        assert_eq!(history(&e)[0].process, BASE + 2);
        assert_ne!(a, b.unwrap());
        h.reply(a, 0, 0, ReplyKind::Fast, Ts::from_nanos(10), 1, Some(vec![(0, 0)]));
        h.reply(a, 0, 1, ReplyKind::Slow, Ts::from_nanos(10), 1, None);
        assert_eq!(h.c.inflight(), 2);
        assert_eq!(h.c.invariants(), Ok(()));
        let (_, e) = h.submit(vec![9]);
        assert_eq!(history(&e)[0].process, BASE);
        assert_eq!(h.c.invariants(), Ok(()));
    }

    /// The negative control of the slot invariant: a slot given back while its transaction
    /// is pending is reported after the handler.
    #[test]
    fn the_slot_invariant_catches_a_slot_freed_while_in_use() {
        let mut h = H::std();
        h.submit(vec![0]).0.unwrap();
        h.submit(vec![3]).0.unwrap();
        assert_eq!(h.c.invariants(), Ok(()));
        h.c.slots.give_back(1);
        assert!(h.c.invariants().unwrap_err().contains("2 transactions in flight hold process slots"));
    }

    #[test]
    fn bad_submits_are_rejected_without_side_effects() {
        let cfg = TigaConfig { keys_per_txn_max: 3, inflight_max: 1, ..TigaConfig::default() };
        // Shard 1 has no replicas.
        let t = Topology { shards: vec![vec![NodeId(0)], vec![]], leader: vec![0, 0] };
        let mut h = H::new(t, cfg, vec![vec![Duration::from_millis(1)]]);
        let cases = [
            (vec![], TxnError::NoKeys),
            (vec![0, 2, 4, 6], TxnError::TooManyKeys { keys: 4, max: 3 }),
            (vec![0, 1], TxnError::UnknownShard { key: String::from_utf8(tk(1)).unwrap(), shard: 1 }),
        ];
        for (keys, want) in cases {
            let (r, e) = h.submit(keys);
            let err = r.unwrap_err();
            assert_eq!(err, want);
            assert!(!err.to_string().is_empty());
            assert_eq!(e, vec![Effect::Metric { name: "tiga.rejected", value: 1 }]);
        }
        assert_eq!(h.c.stats().rejected, 3);
        let (r, e) = h.submit(vec![2]);
        assert_eq!(r.unwrap(), TxnId::new(ME, 0), "no id was used by the rejected ones");
        assert_eq!(history(&e)[0].process, BASE);
        let (r, e) = h.submit(vec![4]);
        assert_eq!(r.unwrap_err(), TxnError::Overloaded { inflight: 1, max: 1 });
        assert_eq!(e, vec![Effect::Metric { name: "tiga.admission_dropped", value: 1 }]);
        // No shards at all.
        let mut h = H::new(Topology { shards: vec![], leader: vec![] }, TigaConfig::default(), vec![]);
        assert_eq!(
            h.submit(vec![1]).0.unwrap_err(),
            TxnError::UnknownShard { key: String::from_utf8(tk(1)).unwrap(), shard: 0 }
        );
        // A leader index outside the shard.
        let t = Topology { shards: vec![vec![NodeId(0)]], leader: vec![3] };
        let mut h = H::new(t, TigaConfig::default(), vec![]);
        assert!(matches!(h.submit(vec![1]).0, Err(TxnError::UnknownShard { .. })));
    }

    #[test]
    fn garbage_replies_are_ignored() {
        let mut h = H::std();
        let txn = h.submit(vec![0]).0.unwrap();
        let ok_result = leader_result(&h.c, txn, 0, vec![(0, 1)]);
        let wrong_key = PieceResult { outputs: vec![OpOutput::Int(2), OpOutput::Int(2)], versions: vec![1, 1] };
        let good = |replica, kind, result: Option<PieceResult>| {
            TigaMsg::Reply(ServerReply {
                view: 0,
                txn,
                shard: 0,
                replica,
                kind,
                ts: Ts::from_nanos(10),
                hash: [1; 20],
                result,
                owd_ns: u64::MAX,
            })
        };
        let with = |m: TigaMsg, f: &dyn Fn(&mut TigaMsg)| {
            let mut m = m;
            f(&mut m);
            m
        };
        let leader = good(0, ReplyKind::Fast, Some(ok_result));
        let bad: Vec<(NodeId, TigaMsg)> = vec![
            (NodeId(1), leader.clone()),  // claims to be replica 0 but is node 1
            (NodeId(77), leader.clone()), // not a server
            (
                NodeId(0),
                with(leader.clone(), &|m| {
                    if let TigaMsg::Reply(ServerReply { shard, .. }) = m {
                        *shard = 1
                    }
                }),
            ),
            (
                NodeId(0),
                with(leader.clone(), &|m| {
                    if let TigaMsg::Reply(ServerReply { shard, .. }) = m {
                        *shard = u32::MAX
                    }
                }),
            ),
            (
                NodeId(0),
                with(leader.clone(), &|m| {
                    if let TigaMsg::Reply(ServerReply { replica, .. }) = m {
                        *replica = u32::MAX
                    }
                }),
            ),
            (
                NodeId(0),
                with(leader.clone(), &|m| {
                    if let TigaMsg::Reply(ServerReply { view, .. }) = m {
                        *view = 9
                    }
                }),
            ),
            (
                NodeId(0),
                with(leader.clone(), &|m| {
                    if let TigaMsg::Reply(ServerReply { txn, .. }) = m {
                        *txn = TxnId(12345)
                    }
                }),
            ),
            (NodeId(0), good(0, ReplyKind::Fast, None)), // leader without reads
            (NodeId(0), good(0, ReplyKind::Fast, Some(wrong_key))), // a result of the wrong shape
            (NodeId(0), good(0, ReplyKind::Slow, None)), // leaders send no slow replies
            (
                NodeId(3),
                with(leader.clone(), &|m| {
                    if let TigaMsg::Reply(ServerReply { shard, .. }) = m {
                        *shard = 1
                    }
                }),
            ), // shard 1 not involved
            (
                NodeId(0),
                TigaMsg::Agree(crate::msg::Agreement {
                    view: 0,
                    txn,
                    shard: 0,
                    ts: Ts::from_nanos(1),
                    confirm: true,
                    resend: false,
                }),
            ),
            (NodeId(0), TigaMsg::SyncAck { view: 0, replica: 0, sync_point: 1 }),
            (NodeId(0), TigaMsg::LogSync { view: 0, from: 0, entries: vec![], commit_point: 0 }),
        ];
        let n = bad.len() as u64;
        for (from, m) in bad {
            let e = h.deliver(from, m);
            assert!(history(&e).is_empty());
            assert!(submits(&e).is_empty());
        }
        assert_eq!(h.c.stats().ignored_replies, n);
        h.timer(TimerId(u64::MAX));
        h.timer(TimerId(999));
        // Followers' fast replies alone never commit; the genuine leader then does.
        for r in [1, 2] {
            h.deliver(NodeId(r), good(r, ReplyKind::Fast, None));
        }
        assert_eq!(h.c.stats().committed, 0);
        let e = h.deliver(NodeId(0), leader);
        assert_eq!(history(&e).len(), 1);
        assert_eq!(h.c.owd_estimate(h.now, 0, 0), Some(Duration::from_millis(400)), "a huge OWD is capped");
    }

    #[test]
    fn open_loop_generates_a_fixed_number_and_respects_the_inflight_cap() {
        let cfg = TigaConfig { inflight_max: 2, ..TigaConfig::default() };
        let src = FixedKeys::new(vec![vec![0, 1], vec![]]);
        let c = Coordinator::new(topology(3, 3), cfg, Box::new(src), vec![vec![Duration::from_millis(50); 3]; 3], 0)
            .with_open_loop(OpenLoop { rate_per_s: 1000.0, stop_after: None, max_txns: Some(5) });
        let mut h = H { c, rng: Rng::seed_from_u64(9), now: LocalTime::from_secs(5) };
        let (_, e) = h.run(|c, ctx| c.on_start(ctx));
        let mut gaps = Vec::new();
        let mut all = Vec::new();
        let mut next = e;
        for _ in 0..10 {
            let Some(after) = next.iter().find_map(|x| match x {
                Effect::SetTimer { id, after } if *id == CoordinatorTimer::Arrival.id() => Some(*after),
                _ => None,
            }) else {
                break;
            };
            gaps.push(after);
            h.now = h.now + after;
            next = h.timer(CoordinatorTimer::Arrival.id());
            all.extend(next.clone());
        }
        assert_eq!(gaps.len(), 5, "5 arrivals, then the generator stops");
        assert!(gaps.windows(2).any(|w| w[0] != w[1]), "exponential gaps: {gaps:?}");
        let m = metrics(&all);
        let count = |n: &str| m.iter().filter(|x| **x == n).count();
        // Arrivals: [0,1] admitted, [] rejected, [0,1] admitted, then the cap drops 2.
        assert_eq!(count("tiga.rejected"), 1);
        assert_eq!(count("tiga.admission_dropped"), 2);
        assert_eq!(history(&all).len(), 2);
        assert_eq!(h.c.inflight(), 2);

        // stop_after in local time; rate 0 generates nothing.
        let c =
            Coordinator::new(topology(1, 1), TigaConfig::default(), Box::new(FixedKeys::new(vec![vec![0]])), vec![], 0)
                .with_open_loop(OpenLoop {
                    rate_per_s: 100.0,
                    stop_after: Some(Duration::from_millis(100)),
                    max_txns: None,
                });
        let start = LocalTime::from_secs(5);
        let mut h = H { c, rng: Rng::seed_from_u64(9), now: start };
        let arrival_timer = |e: &[Effect<TigaMsg>]| {
            e.iter().find_map(|x| match x {
                Effect::SetTimer { id, after } if *id == CoordinatorTimer::Arrival.id() => Some(*after),
                _ => None,
            })
        };
        let mut next = arrival_timer(&h.run(|c, ctx| c.on_start(ctx)).1);
        let mut arrivals = 0;
        while let Some(after) = next {
            h.now = h.now + after;
            assert!(h.now.saturating_since(start) < Duration::from_millis(100), "an arrival after stop_after");
            arrivals += 1;
            next = arrival_timer(&h.timer(CoordinatorTimer::Arrival.id()));
        }
        assert!((2..=40).contains(&arrivals), "about 10 arrivals at 100/s in 100 ms, got {arrivals}");
        let c = Coordinator::new(topology(1, 1), TigaConfig::default(), Box::new(FixedKeys::new(vec![])), vec![], 0);
        let mut h = H { c, rng: Rng::seed_from_u64(9), now: LocalTime::ZERO };
        assert!(h.run(|c, ctx| c.on_start(ctx)).1.is_empty());
    }
}
