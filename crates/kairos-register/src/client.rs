use crate::{majority, Life, RegisterMsg, Tag, Versioned};
use kairos_core::history::{HistoryEvent, MicroOp, OpType, ReadValue};
use kairos_core::{Ctx, NodeId, Process, Timer, TimerId};
use rand::Rng as _;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

kairos_core::timers! {
    /// A register client's timers.
    enum ClientTimer {
        /// Resend the current phase to the replicas that have not answered.
        Retry = 1,
        /// The think time is over: start the next operation.
        NextOp = 2,
        /// The operation took too long: its outcome is unknown.
        Deadline = 3,
    }
}

/// What a client does.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub replicas: Vec<NodeId>,
    /// Jepsen process id in the history (one operation in flight at a time).
    pub process: u64,
    /// Keys are drawn uniformly from `0..keys`.
    pub keys: u64,
    /// Share of operations that are writes.
    pub write_ratio: f64,
    /// Pause between operations.
    pub think: Duration,
    /// Resend a phase's message to the replicas that have not answered after this long.
    pub retry: Duration,
    /// Give up on an operation after this long and record it as `info`.
    pub op_timeout: Duration,
    /// Stop after this many operations (`None`: run until the host stops).
    pub max_ops: Option<u64>,
    /// Wait this long before the first operation, so replicas finish their start-up recovery.
    pub start_delay: Duration,
}

impl ClientConfig {
    pub fn new(replicas: Vec<NodeId>, process: u64) -> Self {
        ClientConfig {
            replicas,
            process,
            keys: 4,
            write_ratio: 0.5,
            think: Duration::from_millis(10),
            retry: Duration::from_millis(700),
            op_timeout: Duration::from_secs(5),
            max_ops: None,
            start_delay: Duration::from_secs(1),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Read,
    Write(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Query,
    Store,
}

struct InFlight {
    /// Its id in messages: drawn at random, so that a reply to an operation of this client's
    /// previous incarnation (which numbered its operations from 1 too) is never taken for one.
    op: u64,
    key: u64,
    kind: Kind,
    phase: Phase,
    acks: BTreeSet<NodeId>,
    /// Store phase: the life each acknowledgement came from (see the crate docs).
    ack_lives: BTreeMap<NodeId, Life>,
    /// Store phase: the lives each counted acknowledgement reported for the other replicas.
    ack_reports: BTreeMap<NodeId, BTreeMap<NodeId, Life>>,
    best: Versioned,
    stored: Versioned,
    /// Message rounds sent so far (phases plus retransmissions).
    rounds: usize,
}

/// Metric names for "an operation completed in N round trips" (the last one means 8 or more).
pub const ROUND_TRIP_METRICS: [&str; 8] = [
    "register.ops_rt_1",
    "register.ops_rt_2",
    "register.ops_rt_3",
    "register.ops_rt_4",
    "register.ops_rt_5",
    "register.ops_rt_6",
    "register.ops_rt_7",
    "register.ops_rt_8+",
];

/// A closed-loop client of the register: one operation at a time, each two round trips.
pub struct Client {
    config: ClientConfig,
    next_op: u64,
    inflight: Option<InFlight>,
    completed: u64,
    last_ok: Option<(u64, Tag)>,
}

impl Client {
    pub fn new(config: ClientConfig) -> Self {
        Client { config, next_op: 0, inflight: None, completed: 0, last_ok: None }
    }

    /// Operations finished (ok or info).
    pub fn completed(&self) -> u64 {
        self.completed
    }

    /// The key and tag of the last operation that completed `ok`: when it completed, a majority
    /// of the replicas held that tag, or a newer one, for the key (a write stored it there; a
    /// read wrote back what it returns).
    pub fn last_ok(&self) -> Option<(u64, Tag)> {
        self.last_ok
    }

    pub fn is_done(&self) -> bool {
        self.config.max_ops.is_some_and(|m| self.completed >= m)
    }

    fn start_op(&mut self, ctx: &mut Ctx<'_, RegisterMsg>) {
        if self.is_done() || self.config.replicas.is_empty() {
            return;
        }
        self.next_op += 1;
        let op = ctx.rng().random();
        let key = ctx.rng().random_range(0..self.config.keys.max(1));
        let write = ctx.rng().random_bool(self.config.write_ratio.clamp(0.0, 1.0));
        let kind = if write { Kind::Write(((self.config.process + 1) << 32) | self.next_op) } else { Kind::Read };
        let (f, micro) = match kind {
            Kind::Read => ("read", MicroOp::Read { key, value: None }),
            Kind::Write(value) => ("write", MicroOp::Write { key, value }),
        };
        ctx.record(HistoryEvent::new(OpType::Invoke, self.config.process, f, vec![micro]));
        self.inflight = Some(InFlight {
            op,
            key,
            kind,
            phase: Phase::Query,
            acks: BTreeSet::new(),
            ack_lives: BTreeMap::new(),
            ack_reports: BTreeMap::new(),
            best: Versioned::default(),
            stored: Versioned::default(),
            rounds: 0,
        });
        ctx.set_timer(ClientTimer::Deadline, self.config.op_timeout);
        self.send_phase(ctx);
    }

    /// Sends the current phase's message to every replica that has not answered it yet.
    fn send_phase(&mut self, ctx: &mut Ctx<'_, RegisterMsg>) {
        let Some(f) = &mut self.inflight else { return };
        f.rounds += 1;
        let msg = match f.phase {
            Phase::Query => RegisterMsg::Query { op: f.op, key: f.key },
            Phase::Store => RegisterMsg::Store { op: f.op, key: f.key, state: f.stored },
        };
        let missing: Vec<NodeId> = self.config.replicas.iter().copied().filter(|r| !f.acks.contains(r)).collect();
        ctx.send_all(missing, &msg);
        ctx.metric("register.round_trips", 1);
        ctx.set_timer(ClientTimer::Retry, self.config.retry);
    }

    fn finish(&mut self, ctx: &mut Ctx<'_, RegisterMsg>, outcome: OpType) {
        let Some(f) = self.inflight.take() else { return };
        let (name, micro) = match f.kind {
            Kind::Read => {
                let value = if outcome == OpType::Ok { f.stored.value.map(ReadValue::Int) } else { None };
                ("read", MicroOp::Read { key: f.key, value })
            }
            Kind::Write(value) => ("write", MicroOp::Write { key: f.key, value }),
        };
        ctx.record(HistoryEvent::new(outcome, self.config.process, name, vec![micro]));
        if outcome == OpType::Ok {
            self.last_ok = Some((f.key, f.stored.tag));
            ctx.metric("register.ops_ok", 1);
            ctx.metric(ROUND_TRIP_METRICS[f.rounds.clamp(1, 8) - 1], 1);
        } else {
            ctx.metric("register.ops_info", 1);
        }
        ctx.cancel_timer(ClientTimer::Retry);
        ctx.cancel_timer(ClientTimer::Deadline);
        self.completed += 1;
        ctx.set_timer(ClientTimer::NextOp, self.config.think);
    }
}

impl Process for Client {
    type Msg = RegisterMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, RegisterMsg>) {
        ctx.set_timer(ClientTimer::NextOp, self.config.start_delay);
    }

    fn on_message(&mut self, ctx: &mut Ctx<'_, RegisterMsg>, from: NodeId, msg: RegisterMsg) {
        let quorum = majority(self.config.replicas.len());
        let me = ctx.me().0;
        let Some(f) = &mut self.inflight else { return };
        if !self.config.replicas.contains(&from) {
            return;
        }
        match msg {
            RegisterMsg::QueryAck { op, key, state } if op == f.op && key == f.key && f.phase == Phase::Query => {
                if f.acks.insert(from) && state.tag > f.best.tag {
                    f.best = state;
                }
                if f.acks.len() >= quorum {
                    f.stored = match f.kind {
                        Kind::Read => f.best,
                        Kind::Write(value) => match f.best.tag.ts.checked_add(1) {
                            Some(ts) => Versioned { tag: Tag { ts, writer: me }, value: Some(value) },
                            None => {
                                // A replica reported the largest tag there is: no write can
                                // follow it. Nothing was stored, so the write certainly failed.
                                self.finish(ctx, OpType::Fail);
                                return;
                            }
                        },
                    };
                    f.phase = Phase::Store;
                    f.acks.clear();
                    self.send_phase(ctx);
                }
            }
            RegisterMsg::StoreAck { op, key, life, lives } if op == f.op && key == f.key && f.phase == Phase::Store => {
                // Counted acknowledgements must agree on each other's lives (crate docs,
                // "Lives"): one whose life another reports otherwise may come from a life that
                // has ended, and that replica may have forgotten the store. The two that
                // disagree are both dropped and asked again (either may be the stale one: an
                // ack of an ended life, or a report made before the peer learned the new
                // life); their new answers settle it. (Checked both ways: an old life's acknowledgement arriving
                // after the report of its end was counted; and a stale report kept for the
                // phase voided every acknowledgement of the current life: two reviews'
                // schedules.)
                let report: BTreeMap<NodeId, Life> = lives.into_iter().collect();
                let disagree: Vec<NodeId> = f
                    .acks
                    .iter()
                    .copied()
                    .filter(|&other| other != from)
                    .filter(|other| {
                        let they_say = f.ack_reports.get(other).and_then(|r| r.get(&from));
                        let we_say = report.get(other);
                        they_say.is_some_and(|l| *l != life)
                            || we_say.is_some_and(|l| f.ack_lives.get(other) != Some(l))
                    })
                    .collect();
                if disagree.is_empty() {
                    f.acks.insert(from);
                    f.ack_lives.insert(from, life);
                    f.ack_reports.insert(from, report);
                } else {
                    for r in disagree.into_iter().chain([from]) {
                        f.acks.remove(&r);
                        f.ack_lives.remove(&r);
                        f.ack_reports.remove(&r);
                    }
                    ctx.metric("register.acks_of_ended_lives", 1);
                }
                if f.acks.len() >= quorum {
                    self.finish(ctx, OpType::Ok);
                }
            }
            _ => {} // stale or foreign replies are ignored
        }
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_, RegisterMsg>, timer: TimerId) {
        match ClientTimer::from_id(timer) {
            Some(ClientTimer::NextOp) if self.inflight.is_none() => self.start_op(ctx),
            Some(ClientTimer::Retry) => self.send_phase(ctx),
            Some(ClientTimer::Deadline) => self.finish(ctx, OpType::Info),
            _ => {}
        }
    }
}
