//! A client machine in the simulator: a [`KvClient`] driven by a YCSB generator with a fixed
//! number of operations in flight, recording the Jepsen history of its operations.
//!
//! With [`FreshKeys`], some operations go to keys that were never loaded: their owner creates
//! them ([`KvOp::Insert`]) while every client reads and updates them, so creation races
//! lookups. A get of a key not yet created is a read of nil (the history's initial value);
//! an update of one fails without effect. Some runs also delete fresh keys (any client, racing
//! the rest): a delete is a write of [`DELETED_VALUE_ID`], which a get reporting the deletion
//! reads.

use super::SwarmMsg;
use crate::client::{KvClient, KvError, KvOp, OpId, OpKind, Outbox, DELETED_VALUE_ID};
use kairos_core::history::{HistoryEvent, MicroOp, OpType, ReadValue};
use kairos_core::LocalTime;
use kairos_core::{Ctx, NodeId, Process, Timer, TimerId};
use kairos_workload::ycsb::{self, Ycsb};
use rand::Rng as _;
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

kairos_core::timers! {
    /// A client node's timers.
    enum ClientNodeTimer {
        /// The engine's periodic tick (timeouts, background work).
        Tick = 1,
        /// An adversarial pause is over.
        Wake = 2,
    }
}

/// What the adversarial scheduler does to this client (see `kairos_harness::swarm::sim::Adversary`).
#[derive(Clone, Debug, Default)]
pub struct ClientFaults {
    /// `(p, ns_max)`: each chain is stalled with probability `p`, after a random prefix, for up
    /// to `ns_max` nanoseconds.
    pub stall: Option<(f64, u64)>,
    /// `(at, for)` after the start: replies and timers wait.
    pub pause: Option<(Duration, Duration)>,
    /// Crash while issuing this chain (1-based count of chains issued).
    pub crash_at_chain: Option<u64>,
}

/// Keys `first .. first + count`, not loaded before the run. Key `k`'s owner (`k % clients`)
/// creates it; only the owner inserts, since two clients creating one key concurrently is
/// outside what the index supports (`kairos_swarm::index`, simplifications).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FreshKeys {
    pub first: u64,
    pub count: u64,
    pub clients: u32,
    /// Per mille of the writes to a fresh key that delete it instead.
    pub deletes_per_mille: u32,
}

/// The share of operations that go to a fresh key, when there are fresh keys.
const FRESH_KEY_SHARE: f64 = 0.25;

struct Pending {
    process: u64,
    slot: usize,
    key: u64,
    kind: OpKind,
    value_id: u64,
}

pub struct ClientNode {
    pub index: u32,
    /// Any protocol behind the sans-IO interface.
    pub client: Box<dyn KvClient>,
    ycsb: Ycsb,
    value_size: u32,
    pub ops_left: u64,
    inflight: usize,
    single_key: bool,
    pending: BTreeMap<OpId, Pending>,
    next_op: OpId,
    /// Round trips per operation kind: `kind → (round trips → count)`.
    pub round_trips: BTreeMap<OpKind, BTreeMap<u32, u64>>,
    pub errors: BTreeMap<String, u64>,
    pub completed: u64,
    /// Crash after issuing this many operations, leaving a prefix of each chain in flight applied.
    pub crash_after_ops: Option<u64>,
    pub crashed: bool,
    issued: u64,
    pub faults: ClientFaults,
    /// Keys created during the run (none by default).
    pub fresh_keys: FreshKeys,
    chains_sent: u64,
    /// Gets that ended with [`KvError::Timeout`].
    pub get_timeouts: u64,
    /// Chains this client sent with an adversarial stall.
    pub stalled_chains: u64,
    started_at: Option<LocalTime>,
    /// Replies that arrived while paused, in arrival order.
    deferred: VecDeque<SwarmMsg>,
}

impl ClientNode {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        index: u32,
        client: Box<dyn KvClient>,
        ycsb: Ycsb,
        value_size: u32,
        ops: u64,
        inflight: usize,
        single_key: bool,
        crash_after_ops: Option<u64>,
    ) -> Self {
        ClientNode {
            index,
            client,
            ycsb,
            value_size,
            ops_left: ops,
            inflight: inflight.max(1),
            single_key,
            pending: BTreeMap::new(),
            next_op: 1,
            round_trips: BTreeMap::new(),
            errors: BTreeMap::new(),
            completed: 0,
            crash_after_ops,
            crashed: false,
            issued: 0,
            faults: ClientFaults::default(),
            fresh_keys: FreshKeys::default(),
            chains_sent: 0,
            get_timeouts: 0,
            stalled_chains: 0,
            started_at: None,
            deferred: VecDeque::new(),
        }
    }

    pub fn is_done(&self) -> bool {
        self.crashed || (self.ops_left == 0 && self.pending.is_empty())
    }

    fn start_op(&mut self, ctx: &mut Ctx<'_, SwarmMsg>, slot: usize, out: &mut Outbox) {
        if self.ops_left == 0 || self.crashed {
            return;
        }
        self.ops_left -= 1;
        let y = self.ycsb.next(ctx.rng());
        let mut key = if self.single_key { 0 } else { y.key };
        let fresh = self.fresh_keys;
        if fresh.count > 0 && ctx.rng().random_bool(FRESH_KEY_SHARE) {
            key = fresh.first + ctx.rng().random_range(0..fresh.count);
        }
        let id = self.next_op;
        self.next_op += 1;
        let process = u64::from(self.index) * self.inflight as u64 + slot as u64;
        let key_bytes = self.ycsb.key_bytes(key);
        let deletes = fresh.deletes_per_mille > 0 && fresh.count > 0 && key >= fresh.first;
        let (op, kind, value_id, micro) =
            if y.update && deletes && ctx.rng().random_ratio(fresh.deletes_per_mille, 1000) {
                let write = MicroOp::Write { key, value: DELETED_VALUE_ID };
                (KvOp::Delete { key: key_bytes }, OpKind::Delete, DELETED_VALUE_ID, write)
            } else if y.update {
                let vid = (u64::from(self.index) + 1) << 40 | id;
                let value = ycsb::value_bytes(vid, self.value_size);
                let creates = key >= fresh.first
                    && fresh.count > 0
                    && key % u64::from(fresh.clients.max(1)) == u64::from(self.index);
                let (op, kind) = if creates {
                    (KvOp::Insert { key: key_bytes, value }, OpKind::Insert)
                } else {
                    (KvOp::Update { key: key_bytes, value }, OpKind::Update)
                };
                (op, kind, vid, MicroOp::Write { key, value: vid })
            } else {
                (KvOp::Get { key: key_bytes }, OpKind::Get, 0, MicroOp::Read { key, value: None })
            };
        let f = if y.update { "write" } else { "read" };
        ctx.record(HistoryEvent::new(OpType::Invoke, process, f, vec![micro]));
        self.pending.insert(id, Pending { process, slot, key, kind, value_id });
        self.issued += 1;
        self.client.invoke(id, op, ctx.now(), out);
    }

    fn drain(&mut self, ctx: &mut Ctx<'_, SwarmMsg>, mut out: Outbox) {
        loop {
            let mut crash_now = self.crash_after_ops.is_some_and(|n| self.issued >= n);
            let issues = std::mem::take(&mut out.issues);
            if let Some(n) = self.faults.crash_at_chain {
                crash_now |= !issues.is_empty() && self.chains_sent + issues.len() as u64 >= n;
            }
            for issue in issues {
                self.chains_sent += 1;
                let len = issue.chain.verbs.len();
                let prefix = if crash_now { Some(ctx.rng().random_range(0..=len)) } else { None };
                let mut pause = None;
                if let (Some((p, ns_max)), false) = (self.faults.stall, crash_now) {
                    if ctx.rng().random_bool(p.clamp(0.0, 1.0)) {
                        pause = Some((ctx.rng().random_range(0..len.max(1)), ctx.rng().random_range(1..=ns_max)));
                        self.stalled_chains += 1;
                    }
                }
                ctx.send(
                    NodeId(issue.chain.node),
                    SwarmMsg::Chain { tag: issue.tag, chain: issue.chain, prefix, pause },
                );
            }
            if crash_now {
                // The client dies with these chains partly applied; its open operations stay unknown.
                self.crashed = true;
                ctx.metric("swarm.client_crashes", 1);
                return;
            }
            let completions = std::mem::take(&mut out.completions);
            if completions.is_empty() {
                return;
            }
            for c in completions {
                let Some(p) = self.pending.remove(&c.op_id) else { continue };
                self.completed += 1;
                *self.round_trips.entry(p.kind).or_default().entry(c.round_trips).or_insert(0) += 1;
                let (op_type, f, micro) = match (&c.result, p.kind) {
                    (Ok(v), OpKind::Get) => {
                        let value = v.as_deref().and_then(ycsb::value_id).filter(|id| *id != 0).map(ReadValue::Int);
                        (OpType::Ok, "read", MicroOp::Read { key: p.key, value })
                    }
                    (Ok(_), _) => (OpType::Ok, "write", MicroOp::Write { key: p.key, value: p.value_id }),
                    // The deletion, on a majority (`crate::deletion`): read as its value.
                    (Err(KvError::Deleted), OpKind::Get) => (
                        OpType::Ok,
                        "read",
                        MicroOp::Read { key: p.key, value: Some(ReadValue::Int(DELETED_VALUE_ID)) },
                    ),
                    // Not created yet: a definite "absent", the history's initial nil.
                    (Err(KvError::UnknownKey), OpKind::Get) => {
                        (OpType::Ok, "read", MicroOp::Read { key: p.key, value: None })
                    }
                    (Err(e), OpKind::Get) => {
                        *self.errors.entry(e.to_string()).or_insert(0) += 1;
                        if matches!(e, KvError::Timeout) {
                            self.get_timeouts += 1;
                        }
                        (OpType::Fail, "read", MicroOp::Read { key: p.key, value: None })
                    }
                    (Err(e), _) => {
                        *self.errors.entry(e.to_string()).or_insert(0) += 1;
                        let t = if e.is_unknown_outcome() || matches!(e, KvError::Timeout) {
                            OpType::Info
                        } else {
                            OpType::Fail
                        };
                        (t, "write", MicroOp::Write { key: p.key, value: p.value_id })
                    }
                };
                ctx.record(HistoryEvent::new(op_type, p.process, f, vec![micro]));
                self.start_op(ctx, p.slot, &mut out);
            }
        }
    }
}

impl ClientNode {
    /// The end of the adversary's pause if `now` is inside it.
    fn paused_until(&self, now: LocalTime) -> Option<LocalTime> {
        let (at, len) = self.faults.pause?;
        let from = self.started_at? + at;
        let until = from + len;
        (now >= from && now < until).then_some(until)
    }

    fn handle(&mut self, ctx: &mut Ctx<'_, SwarmMsg>, msg: SwarmMsg) {
        if let SwarmMsg::Reply { tag, reply } = msg {
            let mut out = Outbox::new();
            self.client.on_reply(tag, reply, ctx.now(), &mut out);
            self.drain(ctx, out);
        }
    }

    fn tick(&mut self, ctx: &mut Ctx<'_, SwarmMsg>) {
        let mut out = Outbox::new();
        self.client.on_tick(ctx.now(), &mut out);
        self.drain(ctx, out);
        if !self.is_done() || self.client.in_flight() > 0 {
            ctx.set_timer(ClientNodeTimer::Tick, self.client.tick_interval());
        }
    }
}

impl Process for ClientNode {
    type Msg = SwarmMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, SwarmMsg>) {
        self.started_at = Some(ctx.now());
        ctx.set_timer(ClientNodeTimer::Tick, self.client.tick_interval());
        let mut out = Outbox::new();
        for slot in 0..self.inflight {
            self.start_op(ctx, slot, &mut out);
        }
        self.drain(ctx, out);
    }

    fn on_message(&mut self, ctx: &mut Ctx<'_, SwarmMsg>, _from: NodeId, msg: SwarmMsg) {
        if self.crashed {
            return;
        }
        if let Some(until) = self.paused_until(ctx.now()) {
            if self.deferred.is_empty() {
                ctx.set_timer(ClientNodeTimer::Wake, until.saturating_since(ctx.now()));
            }
            self.deferred.push_back(msg);
            return;
        }
        self.handle(ctx, msg);
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_, SwarmMsg>, timer: TimerId) {
        if self.crashed {
            return;
        }
        if let Some(until) = self.paused_until(ctx.now()) {
            // Asleep: look again when the pause ends.
            ctx.set_timer(timer, until.saturating_since(ctx.now()));
            return;
        }
        // Replies that came in during a pause are handled first, in order, then time passes.
        while let Some(msg) = self.deferred.pop_front() {
            if self.crashed {
                return;
            }
            self.handle(ctx, msg);
        }
        if ClientNodeTimer::from_id(timer) == Some(ClientNodeTimer::Tick) {
            self.tick(ctx);
        }
    }
}
