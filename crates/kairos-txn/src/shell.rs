//! The client side every peer's coordinator shares: open-loop arrivals from a
//! [`TxnSource`], Jepsen process slots, the history encoding, abort-and-retry bookkeeping and
//! the protocol-neutral counters. A protocol's coordinator embeds a [`TxnShell`], asks it for
//! transactions to run, and tells it how each attempt ended; everything client-visible is
//! recorded here, identically for every protocol, so their histories and statistics compare.
//!
//! # History encoding
//! The same as Tiga's coordinator (`kairos_workload::history`): one Jepsen process per
//! in-flight transaction (`process_base + slot`); a transaction increments its keys (MicroBench's
//! keys, or TPC-C's conflict keys, whose pieces run beside: [`Attempt::pieces`]), or only
//! reads them if its pieces only read ([`kairos_workload::reads_only`]);
//! the invocation names `["r", k, null]` and `["w", k, null]` (a write of unknown value,
//! [`MicroOp::WriteUnknown`]); `ok` carries the values read and written (`v + 1`); a transaction
//! that exhausted its attempts is `fail` (every attempt aborted: it took no effect); one whose
//! outcome is unknown is `info` with its invocation's micro-ops.
//!
//! # Transaction ids across restarts
//! A crashed coordinator restarts as a fresh shell, while servers still remember its old
//! transactions (OCC answers a repeated (txn, attempt) with its recorded outcome, Tapir ignores
//! prepares of finished ones). So sequence numbers never restart from 0: they follow the local
//! clock. With `c(t)` = local time in [`ID_UNIT`] units (4 µs), an incarnation started at local
//! time `T` issues `c(T)`, `c(T) + 1`, … and issues `s` at time `t` only while
//! `s ≤ c(t) + ID_BURST` (beyond, the arrival is refused and counted as `admission_dropped` and
//! `txn.id_rate_dropped`: a sustained 250 000 transactions per second per coordinator, bursts of
//! [`ID_BURST`]). A later incarnation starting at `T'` therefore issues only ids above every
//! earlier one as long as `c(T') > c(t) + ID_BURST` for every `t` of the earlier incarnation, i.e.
//! **the local clock advanced more than (ID_BURST + 1) · ID_UNIT ≈ 4.1 ms between the crash and the
//! restart** (a backward clock step across the crash eats into that margin). The [`TxnId`] carries
//! the low 32 bits, so ids are unique while a coordinator's whole life (first start to last id) is
//! shorter than 2³² · 4 µs ≈ 4.8 h of its local clock.
//!
//! # Jepsen processes across restarts
//! A transaction in flight when its coordinator crashed keeps its invocation without a
//! completion (the checker reads it as `info`), so its process may never invoke again. The
//! shell's one piece of durable state is its incarnation: [`TxnShell::start`] persists it
//! ([`Ctx::persist_snapshot`]) and a restarted coordinator's shell reads it back in
//! [`TxnShell::recover`] (call it from the coordinator's `on_recover`). The first incarnation
//! uses processes `process_base + slot` (the `inflight_max` ids reserved for it), incarnation
//! `i > 0` uses `2⁶² | (i mod 2³²) · 2³⁰ | (process_base + slot)` (below 2⁶³: the checkers take
//! process ids as i64), fresh for every incarnation given `process_base + inflight_max ≤ 2³⁰`.
//! Such processes lie outside the coordinator's reserved range, so per-region summaries do not
//! count them.
//!
//! # Admission
//! Open-loop arrivals are admitted under the adaptive in-flight limit of
//! [`kairos_workload::admission`] when `admission_control` is set (off in the default config,
//! on in `kairos bench micro`; the same rule as Tiga's coordinator), so that no protocol's
//! throughput collapses past saturation.
//!
//! # Pre-reads
//! A TPC-C payment or order-status naming its customer by last name first asks a replica of
//! the customer's shard (its leader first, the next replica after `pre_read_timeout`) which
//! customer that is, then runs its first attempt with the customer named by id
//! (`kairos_workload::tpcc::pre_read`). The invocation is recorded before the pre-read, so the
//! latency includes it; a transaction whose pre-read goes unanswered [`PRE_READ_SENDS_MAX`]
//! times fails, having taken no effect. Tiga's coordinator does the same.
//!
//! # Attempts
//! An aborted attempt is retried under the same [`TxnId`] (so wound-wait keeps its age) after
//! a randomized exponential backoff, up to `max_attempts`; latency runs from the invocation to
//! the commit of the last attempt. Commit rate = commits / attempts.
//!
//! # Timers
//! The shell's timers are [`ShellTimer`]s; a coordinator's timer type embeds them (decode
//! its own first, then `ShellTimer::from_id`) and uses ids between 0 and 2^40 for its own.

use std::collections::BTreeMap;
use std::time::Duration;

use kairos_core::{Ctx, HistoryEvent, LocalTime, MicroOp, NodeId, OpType, Stored, Timer, TimerId};
use kairos_workload::history::{increment_completion, increment_invocation, ProcessSlots};
use kairos_workload::tpcc::pre_read::{self, pre_read_of, PreRead, PreReadAnswer, PreReadMsg, PreReadRequest};
use kairos_workload::txn::{Key, TxnId, Value};
use kairos_workload::{path_of_shards, AdmissionLimit, Finish, OpenLoop};
use kairos_workload::{reads_only, Pieces, TxnSource, TxnWork};
use rand::Rng as _;

/// The shell's timers (a coordinator embeds them in its own timer type: their ids are 0 and
/// from 2^40 on, so a coordinator's own timers take ids in between).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ShellTimer {
    /// The next open-loop arrival.
    Arrival,
    /// An aborted transaction (its sequence number) is due for its next attempt.
    Backoff(u32),
    /// A transaction's (its sequence number) pre-read is overdue: ask the next replica.
    PreRead(u32),
}

/// The first id of [`ShellTimer::Backoff`].
const BACKOFF_TIMER_BASE: u64 = 1 << 40;
/// The first id of [`ShellTimer::PreRead`].
const PRE_READ_TIMER_BASE: u64 = 1 << 41;

impl Timer for ShellTimer {
    fn id(self) -> TimerId {
        match self {
            ShellTimer::Arrival => TimerId(0),
            ShellTimer::Backoff(seq) => TimerId(BACKOFF_TIMER_BASE + u64::from(seq)),
            ShellTimer::PreRead(seq) => TimerId(PRE_READ_TIMER_BASE + u64::from(seq)),
        }
    }
    fn from_id(id: TimerId) -> Option<Self> {
        match id.0 {
            0 => Some(ShellTimer::Arrival),
            n if n >= PRE_READ_TIMER_BASE => u32::try_from(n - PRE_READ_TIMER_BASE).ok().map(ShellTimer::PreRead),
            n => u32::try_from(n.checked_sub(BACKOFF_TIMER_BASE)?).ok().map(ShellTimer::Backoff),
        }
    }
}

/// The timers of a coordinator that keeps one timer per transaction (Janus, Detock): the
/// shell's, or one transaction's overdue round. Its own ids run from 2^32 to 2^33, between the
/// shell's.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum TxnTimer {
    Shell(ShellTimer),
    /// A transaction's (its sequence number) current round is overdue.
    Txn(u32),
}

/// The first id of a coordinator's per-transaction timer ([`TxnTimer::Txn`], and those of
/// Calvin+'s and Tapir's own timer types): between the shell's arrival (0) and backoff (2^40)
/// timers.
pub const TXN_TIMER_BASE: u64 = 1 << 32;

impl Timer for TxnTimer {
    fn id(self) -> TimerId {
        match self {
            TxnTimer::Shell(t) => t.id(),
            TxnTimer::Txn(seq) => TimerId(TXN_TIMER_BASE + u64::from(seq)),
        }
    }
    fn from_id(id: TimerId) -> Option<Self> {
        match id.0.checked_sub(TXN_TIMER_BASE).and_then(|n| u32::try_from(n).ok()) {
            Some(seq) => Some(TxnTimer::Txn(seq)),
            None => ShellTimer::from_id(id).map(TxnTimer::Shell),
        }
    }
}

/// The clock unit of transaction sequence numbers (module docs).
pub const ID_UNIT: Duration = Duration::from_micros(4);
/// How many sequence numbers a coordinator may issue ahead of its clock (module docs).
pub const ID_BURST: u64 = 1_024;
/// The bit marking the Jepsen processes of a restarted coordinator (module docs).
pub const RESTARTED_PROCESS_BIT: u64 = 1 << 62;

/// How the shell admits and retries transactions.
#[derive(Clone, Debug, PartialEq)]
pub struct ShellConfig {
    /// Transactions in flight at most; arrivals beyond it are dropped and counted.
    pub inflight_max: usize,
    /// Open-loop arrivals are admitted under the adaptive in-flight limit of
    /// [`kairos_workload::admission`] (at most `inflight_max`), as Tiga's coordinator does.
    pub admission_control: bool,
    /// The shards the keys spread over (key mod shards, as `Topology::shard_of_key`): the
    /// admission limit keeps a latency floor per set of shards touched. 1: one floor for all.
    pub shard_count: usize,
    /// Attempts per transaction before it is recorded as failed.
    pub max_attempts: u32,
    /// Backoff before retry k (1-based) is uniform in [0, backoff_base · 2^(k−1)], capped.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// Each shard's replicas, its leader first: where the pre-read of a by-name TPC-C
    /// transaction goes (module docs). Empty: no pre-read; the pieces look the name up where
    /// the customer lives, with no round trip of their own.
    pub pre_read_replicas: Vec<Vec<NodeId>>,
    /// A pre-read unanswered this long is sent to the shard's next replica.
    pub pre_read_timeout: Duration,
}

impl Default for ShellConfig {
    fn default() -> Self {
        ShellConfig {
            inflight_max: 15_000,
            admission_control: false,
            shard_count: 1,
            max_attempts: 10,
            backoff_base: Duration::from_millis(10),
            backoff_max: Duration::from_secs(1),
            pre_read_replicas: Vec::new(),
            pre_read_timeout: Duration::from_secs(1),
        }
    }
}

/// Protocol-neutral counters, summable across coordinators.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct TxnStats {
    /// Transactions invoked (recorded in the history).
    pub invoked: u64,
    pub committed: u64,
    /// Attempts started (first tries and retries).
    pub attempts: u64,
    /// Attempts that aborted.
    pub aborted_attempts: u64,
    /// Transactions that exhausted their attempts (`fail`).
    pub failed: u64,
    /// Transactions with unknown outcome (`info`).
    pub unknown: u64,
    /// Arrivals dropped because `inflight_max` transactions were in flight.
    pub admission_dropped: u64,
    /// Committed in the protocol's fast path / common case (protocols that have one).
    pub committed_fast: u64,
}

impl std::ops::AddAssign for TxnStats {
    fn add_assign(&mut self, o: Self) {
        let TxnStats {
            invoked,
            committed,
            attempts,
            aborted_attempts,
            failed,
            unknown,
            admission_dropped,
            committed_fast,
        } = o;
        self.invoked += invoked;
        self.committed += committed;
        self.attempts += attempts;
        self.aborted_attempts += aborted_attempts;
        self.failed += failed;
        self.unknown += unknown;
        self.admission_dropped += admission_dropped;
        self.committed_fast += committed_fast;
    }
}

impl TxnStats {
    /// Commits per attempt (1.0 when nothing was attempted).
    pub fn commit_rate(&self) -> f64 {
        if self.attempts == 0 {
            1.0
        } else {
            self.committed as f64 / self.attempts as f64
        }
    }
}

/// A transaction attempt the protocol should run now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    pub txn: TxnId,
    /// The keys to increment (to read only, if the pieces [only read](reads_only)), in the
    /// transaction's order.
    pub keys: Vec<Key>,
    /// What the shards run besides (TPC-C's pieces; none for MicroBench): run a shard's in the
    /// step that writes the transaction's keys there ([`crate::store::Store::run_pieces`]).
    pub pieces: Pieces,
    /// 1 for the first try.
    pub attempt: u32,
}

pub use kairos_workload::{KindSample, KIND_SAMPLES_MAX};

#[derive(Clone, Debug)]
struct Pending {
    keys: Vec<Key>,
    pieces: Pieces,
    kind: Option<u8>,
    slot: u64,
    invoked_at: LocalTime,
    attempt: u32,
    invoke: Vec<MicroOp>,
    /// The pre-read the transaction waits for before its first attempt, if any.
    pre_read: Option<PreReadWait>,
}

/// A pre-read in flight.
#[derive(Copy, Clone, Debug)]
struct PreReadWait {
    read: PreRead,
    /// Requests sent so far (the k-th goes to replica k − 1 of the shard, leader first).
    sends: u32,
}

/// Pre-read requests per transaction before it is recorded as failed (it took no effect).
pub const PRE_READ_SENDS_MAX: u32 = 10;

/// See the module docs.
pub struct TxnShell {
    workload: Box<dyn TxnSource>,
    load: OpenLoop,
    config: ShellConfig,
    process_base: u64,
    started_at: LocalTime,
    /// When the current (last scheduled) arrival of the open-loop load is due.
    arrival_due: LocalTime,
    arrivals: u64,
    /// The next sequence number in clock units (module docs), once the first is drawn.
    next_seq: Option<u64>,
    /// How many times this coordinator restarted (durable; fresh Jepsen processes each time).
    incarnation: u32,
    /// Restarted from durable state and not started since.
    recovered: bool,
    pending: BTreeMap<TxnId, Pending>,
    slots: ProcessSlots,
    /// The open-loop load's adaptive in-flight limit (`ShellConfig::admission_control`).
    admission: AdmissionLimit,
    stats: TxnStats,
    kind_samples: Vec<KindSample>,
}

impl TxnShell {
    /// `process_base`: the first of this coordinator's `config.inflight_max` Jepsen process ids.
    pub fn new(workload: Box<dyn TxnSource>, load: OpenLoop, config: ShellConfig, process_base: u64) -> Self {
        let admission = AdmissionLimit::new(config.inflight_max, config.admission_control);
        let slots = ProcessSlots::new(config.inflight_max);
        TxnShell {
            workload,
            load,
            config,
            process_base,
            started_at: LocalTime::ZERO,
            arrival_due: LocalTime::ZERO,
            arrivals: 0,
            next_seq: None,
            incarnation: 0,
            recovered: false,
            pending: BTreeMap::new(),
            slots,
            admission,
            stats: TxnStats::default(),
            kind_samples: Vec::new(),
        }
    }

    /// Gives a restarted coordinator's shell its durable state (call from the coordinator's
    /// `on_recover`, before `start`): the next incarnation then uses fresh Jepsen processes, so
    /// none collides with a transaction of an earlier one left without a completion (module
    /// docs). A note that does not decode (written by another version of Kairos) restarts the
    /// count at 2³¹, far from any count that restarts reach.
    pub fn recover(&mut self, stored: &Stored) {
        self.incarnation = match stored.snapshot.as_deref().map(postcard::from_bytes::<u32>) {
            Some(Ok(i)) => i,
            _ => 1 << 31,
        };
        self.recovered = true;
    }

    /// How many times this coordinator restarted.
    pub fn incarnation(&self) -> u32 {
        self.incarnation
    }

    /// The first of this coordinator's reserved Jepsen process ids.
    pub fn process_base(&self) -> u64 {
        self.process_base
    }

    /// The Jepsen process of `slot` (module docs).
    fn process(&self, slot: u64) -> u64 {
        let p = self.process_base + slot;
        if self.incarnation > 0 {
            RESTARTED_PROCESS_BIT | u64::from(self.incarnation) << 30 | (p & ((1 << 30) - 1))
        } else {
            p
        }
    }

    /// Local time in [`ID_UNIT`]s.
    fn id_clock(now: LocalTime) -> u64 {
        now.as_nanos() / ID_UNIT.as_nanos() as u64
    }

    /// Draws the next sequence number, or `None` if issuing it now would run more than
    /// [`ID_BURST`] ahead of the clock (module docs).
    fn next_seq(&mut self, now: LocalTime) -> Option<u32> {
        let clock = Self::id_clock(now);
        let seq = *self.next_seq.get_or_insert(clock);
        if seq > clock.saturating_add(ID_BURST) {
            return None;
        }
        self.next_seq = Some(seq + 1);
        Some(seq as u32)
    }

    pub fn stats(&self) -> TxnStats {
        self.stats
    }

    /// The finished transactions of a workload with types (TPC-C), one sample each.
    pub fn kind_samples(&self) -> &[KindSample] {
        &self.kind_samples
    }

    fn sample_kind(&mut self, p: &Pending, committed: bool, now: LocalTime) {
        if let Some(kind) = p.kind.filter(|_| self.kind_samples.len() < KIND_SAMPLES_MAX) {
            let latency_ns = now.saturating_since(p.invoked_at).as_nanos() as u64;
            self.kind_samples.push(KindSample { kind, committed, attempts: p.attempt, latency_ns });
        }
    }

    pub fn config(&self) -> &ShellConfig {
        &self.config
    }

    /// Transactions invoked and not yet finished.
    pub fn inflight(&self) -> usize {
        self.pending.len()
    }

    /// Whether `txn` is in flight, and its current attempt.
    pub fn attempt_of(&self, txn: TxnId) -> Option<u32> {
        self.pending.get(&txn).map(|p| p.attempt)
    }

    /// Call from the coordinator's `on_start`: arms the first arrival.
    pub fn start<M>(&mut self, ctx: &mut Ctx<'_, M>) {
        self.started_at = ctx.now();
        self.arrival_due = ctx.now();
        if std::mem::take(&mut self.recovered) {
            self.incarnation = self.incarnation.saturating_add(1);
        }
        if let Ok(note) = postcard::to_allocvec(&self.incarnation) {
            ctx.persist_snapshot(note);
        }
        if self.next_seq.is_none() {
            self.next_seq = Some(Self::id_clock(ctx.now()));
        }
        if self.generating(ctx.now()) {
            self.schedule_arrival(ctx);
        }
    }

    /// A shell timer fired: a new transaction arrived, an aborted one's backoff is over, or a
    /// pre-read is overdue.
    pub fn on_timer<M: PreReadMsg>(&mut self, ctx: &mut Ctx<'_, M>, timer: ShellTimer) -> Option<Attempt> {
        let seq = match timer {
            ShellTimer::Arrival => return self.on_arrival(ctx),
            ShellTimer::PreRead(seq) => {
                self.send_pre_read(ctx, TxnId::new(ctx.me(), seq));
                return None;
            }
            ShellTimer::Backoff(seq) => seq,
        };
        let txn = TxnId::new(ctx.me(), seq);
        let p = self.pending.get_mut(&txn).filter(|p| p.pre_read.is_none())?;
        p.attempt += 1;
        self.stats.attempts += 1;
        ctx.metric("txn.attempts", 1);
        Some(Attempt { txn, keys: p.keys.clone(), pieces: p.pieces.clone(), attempt: p.attempt })
    }

    /// Invokes a transaction on `keys` now (outside the open loop, e.g. from a test), or
    /// `None` if it is refused (no keys, too many in flight, ids too far ahead of the clock).
    pub fn invoke<M>(&mut self, ctx: &mut Ctx<'_, M>, keys: Vec<Key>) -> Option<Attempt> {
        self.register(ctx, TxnWork { keys, pieces: Pieces::default(), kind: None })
    }

    /// Invokes a transaction that runs `work` (see [`TxnShell::invoke`]). A by-name TPC-C
    /// transaction first sends its pre-read (module docs) and returns `None`: its first
    /// attempt comes from [`TxnShell::on_pre_read_answer`].
    pub fn invoke_work<M: PreReadMsg>(&mut self, ctx: &mut Ctx<'_, M>, work: TxnWork) -> Option<Attempt> {
        let attempt = self.register(ctx, work)?;
        let read = pre_read_of(&attempt.pieces).filter(|_| !self.config.pre_read_replicas.is_empty());
        if let (Some(read), Some(p)) = (read, self.pending.get_mut(&attempt.txn)) {
            p.pre_read = Some(PreReadWait { read, sends: 0 });
            self.send_pre_read(ctx, attempt.txn);
            return None;
        }
        Some(attempt)
    }

    /// Records the invocation of `work` and files it as pending, or refuses it.
    fn register<M>(&mut self, ctx: &mut Ctx<'_, M>, work: TxnWork) -> Option<Attempt> {
        let TxnWork { keys, pieces, kind } = work;
        if keys.is_empty() {
            return None;
        }
        if self.pending.len() >= self.config.inflight_max {
            self.stats.admission_dropped += 1;
            ctx.metric("txn.admission_dropped", 1);
            return None;
        }
        let Some(seq) = self.next_seq(ctx.now()) else {
            self.stats.admission_dropped += 1;
            ctx.metric("txn.admission_dropped", 1);
            ctx.metric("txn.id_rate_dropped", 1);
            return None;
        };
        let txn = TxnId::new(ctx.me(), seq);
        // Fewer than `inflight_max` are pending (above), so a slot is free.
        let slot = self.slots.take()?;
        let invoke = increment_invocation(&keys, reads_only(&pieces));
        ctx.record(HistoryEvent::new(OpType::Invoke, self.process(slot), "txn", invoke.clone()));
        self.pending.insert(
            txn,
            Pending {
                keys: keys.clone(),
                pieces: pieces.clone(),
                kind,
                slot,
                invoked_at: ctx.now(),
                attempt: 1,
                invoke,
                pre_read: None,
            },
        );
        self.stats.invoked += 1;
        self.stats.attempts += 1;
        ctx.metric("txn.invoked", 1);
        ctx.metric("txn.attempts", 1);
        Some(Attempt { txn, keys, pieces, attempt: 1 })
    }

    /// Sends `txn`'s pre-read to the next replica of the customer's shard (its leader first)
    /// and arms its timeout; after [`PRE_READ_SENDS_MAX`] unanswered requests the transaction
    /// fails (it took no effect).
    fn send_pre_read<M: PreReadMsg>(&mut self, ctx: &mut Ctx<'_, M>, txn: TxnId) {
        let shards = self.config.pre_read_replicas.len();
        let Some(wait) = self.pending.get_mut(&txn).and_then(|p| p.pre_read.as_mut()) else { return };
        let replicas = &self.config.pre_read_replicas[wait.read.shard(shards) as usize];
        if wait.sends >= PRE_READ_SENDS_MAX || replicas.is_empty() {
            ctx.metric("txn.pre_reads_unanswered", 1);
            return self.fail(ctx, txn);
        }
        let to = replicas[wait.sends as usize % replicas.len()];
        wait.sends += 1;
        ctx.metric("txn.pre_reads_sent", 1);
        ctx.send(to, M::pre_read_request(PreReadRequest { txn, read: wait.read }));
        ctx.set_timer(ShellTimer::PreRead(txn.seq()), self.config.pre_read_timeout);
    }

    /// A replica answered a pre-read: returns the transaction's first attempt, its customer
    /// named by id. Ignores an answer from a node outside the customer's shard, or for a
    /// transaction not waiting for exactly this pre-read (a late or duplicated answer).
    pub fn on_pre_read_answer<M>(
        &mut self,
        ctx: &mut Ctx<'_, M>,
        from: NodeId,
        answer: PreReadAnswer,
    ) -> Option<Attempt> {
        let shards = self.config.pre_read_replicas.len();
        let p = self.pending.get_mut(&answer.txn)?;
        let genuine = p.pre_read.is_some_and(|w| {
            w.read == answer.read && self.config.pre_read_replicas[w.read.shard(shards) as usize].contains(&from)
        });
        if !genuine {
            ctx.metric("txn.pre_read_answers_ignored", 1);
            return None;
        }
        p.pre_read = None;
        if let Some(customer) = answer.customer {
            p.pieces = pre_read::resolve(&p.pieces, answer.read, customer);
        }
        ctx.metric("txn.pre_reads_answered", 1);
        Some(Attempt { txn: answer.txn, keys: p.keys.clone(), pieces: p.pieces.clone(), attempt: p.attempt })
    }

    /// The shell's invariant, for its coordinator's [`kairos_core::Process::invariants`]: one
    /// Jepsen process slot per pending transaction ([`ProcessSlots::check`]).
    pub fn invariants(&self) -> Result<(), String> {
        self.slots.check(self.pending.len())
    }

    /// `txn` committed; `reads` holds the value read for each of its keys (a missing key
    /// reads the initial 0). `fast`: committed in the protocol's fast path. Returns false
    /// (and records nothing) if `txn` is not in flight.
    pub fn committed<M>(&mut self, ctx: &mut Ctx<'_, M>, txn: TxnId, reads: &[(Key, Value)], fast: bool) -> bool {
        self.finished(ctx, txn, Finish::Committed);
        let Some(p) = self.pending.remove(&txn) else { return false };
        let read = |key| reads.iter().find(|(k, _)| *k == key).map_or(0, |(_, v)| *v);
        let value = increment_completion(&p.keys, reads_only(&p.pieces), read);
        ctx.record(HistoryEvent::new(OpType::Ok, self.process(p.slot), "txn", value));
        self.sample_kind(&p, true, ctx.now());
        self.slots.give_back(p.slot);
        self.stats.committed += 1;
        ctx.metric("txn.committed", 1);
        if fast {
            self.stats.committed_fast += 1;
            ctx.metric("txn.committed_fast", 1);
        }
        ctx.metric(
            match p.attempt {
                1 => "txn.committed_attempt_1",
                2 => "txn.committed_attempt_2",
                _ => "txn.committed_attempt_3plus",
            },
            1,
        );
        true
    }

    /// The current attempt of `txn` aborted (it took no effect). Retries after a backoff, or
    /// records `fail` once `max_attempts` are spent.
    pub fn aborted<M>(&mut self, ctx: &mut Ctx<'_, M>, txn: TxnId) {
        let Some(p) = self.pending.get(&txn) else { return };
        self.stats.aborted_attempts += 1;
        ctx.metric("txn.aborted_attempts", 1);
        if p.attempt < self.config.max_attempts {
            let cap =
                self.config.backoff_base.saturating_mul(1 << (p.attempt - 1).min(20)).min(self.config.backoff_max);
            let after = Duration::from_nanos(ctx.rng().random_range(0..=cap.as_nanos() as u64));
            ctx.set_timer(ShellTimer::Backoff(txn.seq()), after);
            return;
        }
        self.fail(ctx, txn);
    }

    /// `txn` ends without having taken effect (its attempts spent, or its pre-read unanswered).
    fn fail<M>(&mut self, ctx: &mut Ctx<'_, M>, txn: TxnId) {
        self.finished(ctx, txn, Finish::Aborted);
        let Some(p) = self.pending.remove(&txn) else { return };
        self.sample_kind(&p, false, ctx.now());
        ctx.record(HistoryEvent::new(OpType::Fail, self.process(p.slot), "txn", p.invoke));
        self.slots.give_back(p.slot);
        self.stats.failed += 1;
        ctx.metric("txn.failed", 1);
    }

    /// The coordinator gives up on `txn` without knowing whether it took effect.
    pub fn unknown<M>(&mut self, ctx: &mut Ctx<'_, M>, txn: TxnId) {
        self.finished(ctx, txn, Finish::GaveUp);
        let Some(p) = self.pending.remove(&txn) else { return };
        ctx.record(HistoryEvent::new(OpType::Info, self.process(p.slot), "txn", p.invoke));
        self.slots.give_back(p.slot);
        self.stats.unknown += 1;
        ctx.metric("txn.unknown", 1);
    }

    /// Tells the admission limit how `txn` (still pending) ended.
    fn finished<M>(&mut self, ctx: &mut Ctx<'_, M>, txn: TxnId, finish: Finish) {
        let Some(p) = self.pending.get(&txn) else { return };
        let path = path_of_shards(p.keys.iter().map(|k| kairos_workload::shard_of(*k, self.config.shard_count)));
        if self.admission.on_finish(ctx.now(), p.invoked_at, path, self.pending.len(), finish) {
            ctx.metric("txn.admission_steps_down", 1);
        }
    }

    /// Whether the arrival due at `at` is part of the load.
    fn generating(&self, at: LocalTime) -> bool {
        self.load.generating(self.started_at, self.arrivals, at)
    }

    /// Arms the next arrival on the open-loop schedule ([`OpenLoop::next_arrival`]).
    fn schedule_arrival<M>(&mut self, ctx: &mut Ctx<'_, M>) {
        let now = ctx.now();
        if let Some((at, after)) = self.load.next_arrival(ctx.rng(), self.arrival_due, now) {
            self.arrival_due = at;
            if self.generating(at) {
                ctx.set_timer(ShellTimer::Arrival, after);
            }
        }
    }

    fn on_arrival<M: PreReadMsg>(&mut self, ctx: &mut Ctx<'_, M>) -> Option<Attempt> {
        if !self.generating(self.arrival_due) {
            return None;
        }
        self.arrivals += 1;
        // Ids grow with invocation time (`next_seq`), and a retry keeps its id: the first is
        // the oldest.
        let oldest = self.pending.first_key_value().map(|(_, p)| p.invoked_at);
        if self.admission.on_arrival(ctx.now(), self.pending.len(), oldest) {
            ctx.metric("txn.admission_steps_down", 1);
        }
        let attempt = if !self.admission.admits(self.pending.len()) {
            self.stats.admission_dropped += 1;
            ctx.metric("txn.admission_dropped", 1);
            None
        } else {
            let now = ctx.now().as_nanos();
            let work = self.workload.next_txn(ctx.rng(), now);
            self.invoke_work(ctx, work)
        };
        self.schedule_arrival(ctx);
        attempt
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kairos_core::{Effect, NodeId, ReadValue, Rng};
    use kairos_workload::FixedKeys;
    use rand::SeedableRng;

    fn shell(max_attempts: u32) -> TxnShell {
        let config = ShellConfig { max_attempts, ..ShellConfig::default() };
        TxnShell::new(Box::new(FixedKeys::new(vec![vec![1, 2]])), OpenLoop::default(), config, 100)
    }

    fn with_ctx<R>(f: impl FnOnce(&mut Ctx<'_, PreReadOnly>) -> R) -> (R, Vec<Effect<PreReadOnly>>) {
        let mut rng = Rng::seed_from_u64(1);
        let mut effects = Vec::new();
        let r = f(&mut Ctx::new(NodeId(7), LocalTime::ZERO, &mut rng, &mut effects));
        (r, effects)
    }

    fn history(effects: &[Effect<PreReadOnly>]) -> Vec<&HistoryEvent> {
        effects.iter().filter_map(|e| if let Effect::History(h) = e { Some(h) } else { None }).collect()
    }

    #[test]
    fn commit_records_reads_and_increments() {
        let mut s = shell(3);
        let (a, fx) = with_ctx(|ctx| s.invoke(ctx, vec![1, 2]).unwrap());
        assert_eq!((a.attempt, a.keys.clone()), (1, vec![1, 2]));
        assert_eq!(history(&fx)[0].op_type, OpType::Invoke);
        let (ok, fx) = with_ctx(|ctx| s.committed(ctx, a.txn, &[(1, 4)], true));
        assert!(ok);
        let h = history(&fx);
        assert_eq!(h[0].op_type, OpType::Ok);
        assert_eq!(h[0].process, 100);
        assert_eq!(
            h[0].value,
            vec![
                MicroOp::Read { key: 1, value: Some(ReadValue::Int(4)) },
                MicroOp::Write { key: 1, value: 5 },
                MicroOp::Read { key: 2, value: None },
                MicroOp::Write { key: 2, value: 1 },
            ]
        );
        assert_eq!((s.stats().committed, s.stats().committed_fast, s.inflight()), (1, 1, 0));
        // A second commit of the same transaction records nothing.
        let (again, fx) = with_ctx(|ctx| s.committed(ctx, a.txn, &[], false));
        assert!(!again && fx.is_empty());
    }

    #[test]
    fn aborts_retry_with_backoff_then_fail() {
        let mut s = shell(2);
        let (a, _) = with_ctx(|ctx| s.invoke(ctx, vec![3]).unwrap());
        let (_, fx) = with_ctx(|ctx| s.aborted(ctx, a.txn));
        let timer = fx.iter().find_map(|e| if let Effect::SetTimer { id, .. } = e { Some(*id) } else { None });
        let timer = timer.expect("a backoff timer");
        let timer = ShellTimer::from_id(timer).expect("a shell timer");
        let (retry, _) = with_ctx(|ctx| s.on_timer(ctx, timer));
        let retry = retry.expect("the retry");
        assert_eq!((retry.txn, retry.attempt), (a.txn, 2));
        let (_, fx) = with_ctx(|ctx| s.aborted(ctx, a.txn));
        assert_eq!(history(&fx)[0].op_type, OpType::Fail);
        let st = s.stats();
        assert_eq!((st.attempts, st.aborted_attempts, st.failed, st.committed), (2, 2, 1, 0));
        assert_eq!(st.commit_rate(), 0.0);
    }

    fn with_ctx_at<R>(now: LocalTime, f: impl FnOnce(&mut Ctx<'_, PreReadOnly>) -> R) -> (R, Vec<Effect<PreReadOnly>>) {
        let mut rng = Rng::seed_from_u64(1);
        let mut effects = Vec::new();
        let r = f(&mut Ctx::new(NodeId(7), now, &mut rng, &mut effects));
        (r, effects)
    }

    /// A message type that carries pre-reads, for the shell's pre-read tests.
    #[derive(Clone, Debug, PartialEq)]
    enum PreReadOnly {
        Request(PreReadRequest),
        Answer(PreReadAnswer),
    }

    impl PreReadMsg for PreReadOnly {
        fn pre_read_request(request: PreReadRequest) -> Self {
            PreReadOnly::Request(request)
        }
        fn pre_read_answer(answer: PreReadAnswer) -> Self {
            PreReadOnly::Answer(answer)
        }
    }

    /// A by-name payment asks the customer's shard's leader first, the next replica after a
    /// timeout, runs with the customer named by id once a replica of that shard answers, and
    /// ignores answers from elsewhere or for another lookup; unanswered, it fails (no effect).
    #[test]
    fn a_by_name_transaction_pre_reads_its_customer_first() {
        use kairos_workload::tpcc::{piece::split, CustomerRef, TpccTxn};
        let payment = TpccTxn::Payment {
            w: 0,
            d: 1,
            customer_w: 1,
            customer_d: 2,
            customer: CustomerRef::LastName(5),
            amount_cents: 100,
            date: 0,
        };
        let work = || TxnWork { keys: vec![1, 2], pieces: split(&payment).into(), kind: Some(1) };
        let replicas = vec![vec![NodeId(0), NodeId(1), NodeId(2)], vec![NodeId(4), NodeId(3), NodeId(5)]];
        let config = ShellConfig { pre_read_replicas: replicas, shard_count: 2, ..ShellConfig::default() };
        let mut s = TxnShell::new(Box::new(FixedKeys::new(vec![vec![1]])), OpenLoop::default(), config, 100);
        let sent = |fx: &[Effect<PreReadOnly>]| -> Vec<(NodeId, PreReadOnly)> {
            fx.iter()
                .filter_map(|e| if let Effect::Send { to, msg } = e { Some((*to, msg.clone())) } else { None })
                .collect()
        };
        let (a, fx) = with_ctx(|ctx| s.invoke_work(ctx, work()));
        assert_eq!(a, None, "the first attempt waits for the pre-read");
        let read = PreRead { w: 1, d: 2, last_name: 5 };
        let PreReadOnly::Request(request) = sent(&fx)[0].1 else { panic!("{fx:?}") };
        assert_eq!((sent(&fx)[0].0, request.read), (NodeId(4), read), "the leader of warehouse 1's shard first");
        assert_eq!(s.inflight(), 1);
        let txn = request.txn;
        let (_, fx) = with_ctx(|ctx| s.on_timer(ctx, ShellTimer::PreRead(txn.seq())));
        assert_eq!(sent(&fx)[0].0, NodeId(3), "then the next replica");
        let answer = PreReadAnswer { txn, read, customer: Some(17) };
        let (a, _) = with_ctx(|ctx| s.on_pre_read_answer(ctx, NodeId(0), answer));
        assert_eq!(a, None, "a node of another shard cannot answer");
        let wrong = PreReadAnswer { read: PreRead { last_name: 6, ..read }, ..answer };
        assert_eq!(with_ctx(|ctx| s.on_pre_read_answer(ctx, NodeId(5), wrong)).0, None);
        let a = with_ctx(|ctx| s.on_pre_read_answer(ctx, NodeId(5), answer)).0.expect("the first attempt");
        assert_eq!((a.txn, a.attempt, a.keys.clone()), (txn, 1, vec![1, 2]));
        assert_eq!(&a.pieces[..], &split(&payment.clone().resolved(17))[..]);
        assert_eq!(with_ctx(|ctx| s.on_pre_read_answer(ctx, NodeId(5), answer)).0, None, "a duplicate");
        assert_eq!(with_ctx(|ctx| s.on_timer(ctx, ShellTimer::PreRead(txn.seq()))).1.len(), 0, "a stale timer");

        let (_, fx) = with_ctx(|ctx| s.invoke_work(ctx, work()));
        let PreReadOnly::Request(PreReadRequest { txn: second, .. }) = sent(&fx)[0].1 else { panic!("{fx:?}") };
        let mut fx = Vec::new();
        for _ in 1..=PRE_READ_SENDS_MAX {
            fx = with_ctx(|ctx| s.on_timer(ctx, ShellTimer::PreRead(second.seq()))).1;
        }
        assert!(sent(&fx).is_empty(), "{fx:?}");
        let events: Vec<_> =
            fx.iter().filter_map(|e| if let Effect::History(h) = e { Some(h.op_type) } else { None }).collect();
        assert_eq!(events, vec![OpType::Fail], "unanswered, it fails having taken no effect");
        assert_eq!((s.inflight(), s.stats().failed), (1, 1));
    }

    #[test]
    fn shell_timer_ids_round_trip() {
        for t in [
            ShellTimer::Arrival,
            ShellTimer::Backoff(0),
            ShellTimer::Backoff(u32::MAX),
            ShellTimer::PreRead(0),
            ShellTimer::PreRead(u32::MAX),
        ] {
            assert_eq!(ShellTimer::from_id(t.id()), Some(t));
        }
    }

    /// Applies the `Persist` effects of a call, as a host does.
    fn persisted(stored: &mut Stored, effects: Vec<Effect<PreReadOnly>>) {
        for e in effects {
            if let Effect::Persist(p) = e {
                stored.apply(p);
            }
        }
    }

    /// A shell built fresh and given `stored`, as the simulator restarts a node.
    fn restarted(stored: &mut Stored) -> TxnShell {
        let mut s = shell(3);
        s.recover(stored);
        s
    }

    /// A coordinator crashes with transactions in flight and restarts 10 ms later as a fresh
    /// shell: its transaction ids are all above the first incarnation's (servers remember
    /// those), and its Jepsen processes are new (the lost invocations never complete).
    #[test]
    fn a_restarted_shell_never_reuses_transaction_ids_or_processes() {
        let t0 = LocalTime::from_secs(1_764_000_000);
        let mut stored = Stored::default();
        let mut first = shell(3);
        let (_, fx) = with_ctx_at(t0, |ctx| first.start(ctx));
        persisted(&mut stored, fx);
        let mut old = Vec::new();
        // A burst of ID_BURST ids at one instant is fine; the next one must wait for the clock.
        for _ in 0..=ID_BURST {
            let (a, fx) = with_ctx_at(t0, |ctx| first.invoke(ctx, vec![1]).unwrap());
            old.push((a.txn, history(&fx)[0].process));
        }
        let (refused, _) = with_ctx_at(t0, |ctx| first.invoke(ctx, vec![1]));
        assert!(refused.is_none());
        assert_eq!(first.stats().admission_dropped, 1);
        let (later, _) = with_ctx_at(t0 + Duration::from_millis(1), |ctx| first.invoke(ctx, vec![1]));
        let later = later.expect("the clock caught up");
        old.push((later.txn, 100 + ID_BURST + 1));
        // The crash loses everything in flight; the restart is a fresh shell given what the
        // first one persisted.
        let mut second = restarted(&mut stored);
        let t1 = t0 + Duration::from_millis(10);
        let (_, fx) = with_ctx_at(t1, |ctx| second.start(ctx));
        persisted(&mut stored, fx);
        let max_old = old.iter().map(|(t, _)| t.seq()).max().unwrap();
        for _ in 0..100 {
            let (a, fx) = with_ctx_at(t1, |ctx| second.invoke(ctx, vec![1]).unwrap());
            let process = history(&fx)[0].process;
            assert!(a.txn.seq() > max_old, "{:?} after {max_old}", a.txn);
            assert!(old.iter().all(|(t, p)| *t != a.txn && *p != process));
            assert!(process & RESTARTED_PROCESS_BIT != 0);
        }
        // A second restart gets processes distinct from the first restart's too.
        let mut third = restarted(&mut stored);
        let t2 = t1 + Duration::from_millis(10);
        let (a, fx) = with_ctx_at(t2, |ctx| {
            third.start(ctx);
            third.invoke(ctx, vec![1]).unwrap()
        });
        assert_eq!((second.incarnation(), third.incarnation()), (1, 2));
        let (b, fx2) = with_ctx_at(t2, |ctx| second.invoke(ctx, vec![1]).unwrap());
        assert_ne!(history(&fx)[0].process, history(&fx2)[0].process);
        assert!(a.txn.seq() > b.txn.seq());
    }

    #[test]
    fn unknown_outcomes_are_recorded_as_info() {
        let mut s = shell(3);
        let (a, _) = with_ctx(|ctx| s.invoke(ctx, vec![5]).unwrap());
        let (_, fx) = with_ctx(|ctx| s.unknown(ctx, a.txn));
        let h = history(&fx);
        assert_eq!((h[0].op_type, h[0].process, h[0].value.len()), (OpType::Info, 100, 2));
        assert_eq!((s.stats().unknown, s.inflight()), (1, 0));
    }

    #[test]
    fn admission_limit_and_empty_transactions_are_refused() {
        let mut s = TxnShell::new(
            Box::new(FixedKeys::new(vec![])),
            OpenLoop::default(),
            ShellConfig { inflight_max: 1, ..ShellConfig::default() },
            0,
        );
        let (r, fx) = with_ctx(|ctx| s.invoke(ctx, vec![]));
        assert!(r.is_none() && fx.is_empty());
        assert!(with_ctx(|ctx| s.invoke(ctx, vec![1])).0.is_some());
        assert!(with_ctx(|ctx| s.invoke(ctx, vec![2])).0.is_none());
        assert_eq!(s.stats().admission_dropped, 1);
        assert_eq!(ShellTimer::from_id(TimerId(5)), None);
        kairos_core::check_timer_encoding(&[
            ShellTimer::Arrival,
            ShellTimer::Backoff(0),
            ShellTimer::Backoff(u32::MAX),
        ])
        .unwrap();
    }
}
