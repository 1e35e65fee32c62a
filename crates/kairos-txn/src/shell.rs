//! The client side every peer's coordinator shares: open-loop arrivals from a
//! [`TxnSource`], Jepsen process slots, the history encoding, abort-and-retry bookkeeping and
//! the protocol-neutral counters. A protocol's coordinator embeds a [`TxnShell`], asks it for
//! transactions to run, and tells it how each attempt ended; everything client-visible is
//! recorded here, identically for every protocol, so their histories and statistics compare.
//!
//! # History encoding
//! The same as Tiga's coordinator (see `kairos_tiga::coordinator`): one Jepsen process per
//! in-flight transaction (`process_base + slot`); a MicroBench transaction increments its keys;
//! the invocation names `["r", k, null]` and `["w", k, P]` with P the unique placeholder
//! [`write_placeholder`]; `ok` carries the values read and written (`v + 1`); a transaction
//! that exhausted its attempts is `fail` (every attempt aborted: it took no effect); one whose
//! outcome is unknown is `info` with its invocation's micro-ops.
//!
//! # Attempts
//! An aborted attempt is retried under the same [`TxnId`] (so wound-wait keeps its age) after
//! a randomized exponential backoff, up to `max_attempts`; latency runs from the invocation to
//! the commit of the last attempt. Commit rate = commits / attempts.
//!
//! # Timers
//! The shell owns [`ARRIVAL_TIMER`] and the ids from [`SHELL_TIMER_BASE`] up; protocols use
//! ids below `SHELL_TIMER_BASE` other than 0 (see [`TxnShell::owns_timer`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kairos_core::{Ctx, HistoryEvent, LocalTime, MicroOp, OpType, ReadValue, TimerId};
use kairos_tiga::coordinator::{write_placeholder, OpenLoop};
use kairos_tiga::msg::{Key, TxnId, Value};
use kairos_tiga::workload::TxnSource;
use rand::Rng as _;

/// The timer of the next open-loop arrival.
pub const ARRIVAL_TIMER: TimerId = TimerId(0);
/// Retry-backoff timers are `SHELL_TIMER_BASE + seq`.
pub const SHELL_TIMER_BASE: u64 = 1 << 40;

/// How the shell admits and retries transactions.
#[derive(Clone, Debug, PartialEq)]
pub struct ShellConfig {
    /// Transactions in flight at most; arrivals beyond it are dropped and counted.
    pub inflight_max: usize,
    /// Attempts per transaction before it is recorded as failed.
    pub max_attempts: u32,
    /// Backoff before retry k (1-based) is uniform in [0, backoff_base · 2^(k−1)], capped.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
}

impl Default for ShellConfig {
    fn default() -> Self {
        ShellConfig {
            inflight_max: 15_000,
            max_attempts: 10,
            backoff_base: Duration::from_millis(10),
            backoff_max: Duration::from_secs(1),
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
    /// The keys to increment, in the transaction's order.
    pub keys: Vec<Key>,
    /// 1 for the first try.
    pub attempt: u32,
}

#[derive(Clone, Debug)]
struct Pending {
    keys: Vec<Key>,
    slot: u64,
    attempt: u32,
    invoke: Vec<MicroOp>,
}

/// See the module docs.
pub struct TxnShell {
    workload: Box<dyn TxnSource>,
    load: OpenLoop,
    config: ShellConfig,
    process_base: u64,
    started_at: LocalTime,
    arrivals: u64,
    next_seq: u32,
    ids_exhausted: bool,
    pending: BTreeMap<TxnId, Pending>,
    free_slots: BTreeSet<u64>,
    next_slot: u64,
    stats: TxnStats,
}

impl TxnShell {
    /// `process_base`: the first of this coordinator's `config.inflight_max` Jepsen process ids.
    pub fn new(workload: Box<dyn TxnSource>, load: OpenLoop, config: ShellConfig, process_base: u64) -> Self {
        TxnShell {
            workload,
            load,
            config,
            process_base,
            started_at: LocalTime::ZERO,
            arrivals: 0,
            next_seq: 0,
            ids_exhausted: false,
            pending: BTreeMap::new(),
            free_slots: BTreeSet::new(),
            next_slot: 0,
            stats: TxnStats::default(),
        }
    }

    pub fn stats(&self) -> TxnStats {
        self.stats
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

    pub fn keys_of(&self, txn: TxnId) -> Option<&[Key]> {
        self.pending.get(&txn).map(|p| p.keys.as_slice())
    }

    /// Whether `timer` is the shell's (pass it to [`TxnShell::on_timer`]).
    pub fn owns_timer(timer: TimerId) -> bool {
        timer == ARRIVAL_TIMER || timer.0 >= SHELL_TIMER_BASE
    }

    /// Call from the coordinator's `on_start`: arms the first arrival.
    pub fn start<M>(&mut self, ctx: &mut Ctx<'_, M>) {
        self.started_at = ctx.now();
        if self.generating(ctx.now()) {
            self.schedule_arrival(ctx);
        }
    }

    /// A shell timer fired: a new transaction arrived, or an aborted one's backoff is over.
    pub fn on_timer<M>(&mut self, ctx: &mut Ctx<'_, M>, timer: TimerId) -> Option<Attempt> {
        if timer == ARRIVAL_TIMER {
            return self.on_arrival(ctx);
        }
        let seq = u32::try_from(timer.0.checked_sub(SHELL_TIMER_BASE)?).ok()?;
        let txn = TxnId::new(ctx.me(), seq);
        let p = self.pending.get_mut(&txn)?;
        p.attempt += 1;
        self.stats.attempts += 1;
        ctx.metric("txn.attempts", 1);
        Some(Attempt { txn, keys: p.keys.clone(), attempt: p.attempt })
    }

    /// Invokes a transaction on `keys` now (outside the open loop, e.g. from a test), or
    /// `None` if it is refused (no keys, too many in flight, ids exhausted).
    pub fn invoke<M>(&mut self, ctx: &mut Ctx<'_, M>, keys: Vec<Key>) -> Option<Attempt> {
        if keys.is_empty() || self.ids_exhausted {
            return None;
        }
        if self.pending.len() >= self.config.inflight_max {
            self.stats.admission_dropped += 1;
            ctx.metric("txn.admission_dropped", 1);
            return None;
        }
        let txn = TxnId::new(ctx.me(), self.next_seq);
        match self.next_seq.checked_add(1) {
            Some(n) => self.next_seq = n,
            None => self.ids_exhausted = true,
        }
        let slot = self.free_slots.pop_first().unwrap_or_else(|| {
            self.next_slot += 1;
            self.next_slot - 1
        });
        let invoke: Vec<MicroOp> = keys
            .iter()
            .flat_map(|&key| {
                [MicroOp::Read { key, value: None }, MicroOp::Write { key, value: write_placeholder(txn, key) }]
            })
            .collect();
        ctx.record(HistoryEvent::new(OpType::Invoke, self.process_base + slot, "txn", invoke.clone()));
        self.pending.insert(txn, Pending { keys: keys.clone(), slot, attempt: 1, invoke });
        self.stats.invoked += 1;
        self.stats.attempts += 1;
        ctx.metric("txn.invoked", 1);
        ctx.metric("txn.attempts", 1);
        Some(Attempt { txn, keys, attempt: 1 })
    }

    /// `txn` committed; `reads` holds the value read for each of its keys (a missing key
    /// reads the initial 0). `fast`: committed in the protocol's fast path. Returns false
    /// (and records nothing) if `txn` is not in flight.
    pub fn committed<M>(&mut self, ctx: &mut Ctx<'_, M>, txn: TxnId, reads: &[(Key, Value)], fast: bool) -> bool {
        let Some(p) = self.pending.remove(&txn) else { return false };
        let mut value = Vec::with_capacity(2 * p.keys.len());
        for &key in &p.keys {
            let v = reads.iter().find(|(k, _)| *k == key).map_or(0, |(_, v)| *v);
            value.push(MicroOp::Read { key, value: (v != 0).then_some(ReadValue::Int(v)) });
            value.push(MicroOp::Write { key, value: v.saturating_add(1) });
        }
        ctx.record(HistoryEvent::new(OpType::Ok, self.process_base + p.slot, "txn", value));
        self.free_slots.insert(p.slot);
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
            ctx.set_timer(TimerId(SHELL_TIMER_BASE + u64::from(txn.seq())), after);
            return;
        }
        let Some(p) = self.pending.remove(&txn) else { return };
        ctx.record(HistoryEvent::new(OpType::Fail, self.process_base + p.slot, "txn", p.invoke));
        self.free_slots.insert(p.slot);
        self.stats.failed += 1;
        ctx.metric("txn.failed", 1);
    }

    /// The coordinator gives up on `txn` without knowing whether it took effect.
    pub fn unknown<M>(&mut self, ctx: &mut Ctx<'_, M>, txn: TxnId) {
        let Some(p) = self.pending.remove(&txn) else { return };
        ctx.record(HistoryEvent::new(OpType::Info, self.process_base + p.slot, "txn", p.invoke));
        self.free_slots.insert(p.slot);
        self.stats.unknown += 1;
        ctx.metric("txn.unknown", 1);
    }

    fn generating(&self, now: LocalTime) -> bool {
        self.load.generating(self.started_at, self.arrivals, now)
    }

    fn schedule_arrival<M>(&mut self, ctx: &mut Ctx<'_, M>) {
        if let Some(gap) = self.load.next_gap(ctx.rng()) {
            ctx.set_timer(ARRIVAL_TIMER, gap);
        }
    }

    fn on_arrival<M>(&mut self, ctx: &mut Ctx<'_, M>) -> Option<Attempt> {
        if !self.generating(ctx.now()) {
            return None;
        }
        self.arrivals += 1;
        let attempt = if self.pending.len() >= self.config.inflight_max {
            self.stats.admission_dropped += 1;
            ctx.metric("txn.admission_dropped", 1);
            None
        } else {
            let keys = self.workload.next_keys(ctx.rng());
            self.invoke(ctx, keys)
        };
        if self.generating(ctx.now()) {
            self.schedule_arrival(ctx);
        }
        attempt
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kairos_core::{Effect, NodeId, Rng};
    use kairos_tiga::workload::FixedKeys;
    use rand::SeedableRng;

    fn shell(max_attempts: u32) -> TxnShell {
        let config = ShellConfig { max_attempts, ..ShellConfig::default() };
        TxnShell::new(Box::new(FixedKeys::new(vec![vec![1, 2]])), OpenLoop::default(), config, 100)
    }

    fn with_ctx<R>(f: impl FnOnce(&mut Ctx<'_, ()>) -> R) -> (R, Vec<Effect<()>>) {
        let mut rng = Rng::seed_from_u64(1);
        let mut effects = Vec::new();
        let r = f(&mut Ctx::new(NodeId(7), LocalTime::ZERO, &mut rng, &mut effects));
        (r, effects)
    }

    fn history(effects: &[Effect<()>]) -> Vec<&HistoryEvent> {
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
        assert!(TxnShell::owns_timer(timer));
        let (retry, _) = with_ctx(|ctx| s.on_timer(ctx, timer));
        let retry = retry.expect("the retry");
        assert_eq!((retry.txn, retry.attempt), (a.txn, 2));
        let (_, fx) = with_ctx(|ctx| s.aborted(ctx, a.txn));
        assert_eq!(history(&fx)[0].op_type, OpType::Fail);
        let st = s.stats();
        assert_eq!((st.attempts, st.aborted_attempts, st.failed, st.committed), (2, 2, 1, 0));
        assert_eq!(st.commit_rate(), 0.0);
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
        assert!(!TxnShell::owns_timer(TimerId(5)));
    }
}
