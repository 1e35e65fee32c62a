//! Client roles: a [`Session`] running a list-append workload (one operation at a time, the
//! driver's causal-consistency rules), and a scripted [`Probe`] for protocol tests.

use crate::msg::{codes, CausalMsg, ClientOp, ReadConcern, Reply, ReplyBody, Request, WriteConcern};
use crate::tpcc::{pick_txn, txn_ops, TpccConfig, TpccSessionKind};
use kairos_clock::{ClusterTime, SignedClusterTime};
use kairos_core::{Ctx, HistoryEvent, LocalTime, MicroOp, NodeId, OpType, Process, ReadValue, Timer, TimerId};
use rand::Rng as _;
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

kairos_core::timers! {
    /// A session's timers.
    enum SessionTimer {
        /// The pause before the next operation is over.
        NextOp = 1,
        /// The operation in flight got no answer in time.
        OpTimeout = 2,
    }
}

/// Most latency samples a session keeps per operation type.
pub const MAX_SAMPLES: usize = 1 << 20;

/// Where a session sends its reads.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ReadPref {
    Primary,
    Secondary,
    /// The member with the lowest configured latency from the session.
    Nearest,
}

/// What operations a session issues.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum SessionWorkload {
    /// Uniform reads (`read_fraction`) and unique appends over `0..keys`.
    ListAppend,
    /// TPC-C-derived transactions ([`crate::tpcc`]), each a short sequence of session
    /// operations; `home` is the session's home warehouse. `read_fraction` and `keys` are
    /// ignored.
    Tpcc { cfg: TpccConfig, kind: TpccSessionKind, home: u64 },
}

/// Appended values of session `s` are `s * VALUE_BASE + n`, `n = 1, 2, …`.
pub const VALUE_BASE: u64 = 1_000_000;

#[derive(Clone, Debug, PartialEq)]
pub struct SessionConfig {
    /// The Jepsen process id of this session.
    pub session_id: u64,
    /// The members, in member-index order (`primary_hint` indexes this list).
    pub members: Vec<NodeId>,
    /// The members sorted by latency from this session (nearest first).
    pub nearest: Vec<NodeId>,
    pub read_pref: ReadPref,
    pub read_concern: ReadConcern,
    pub write_concern: WriteConcern,
    /// Causally consistent session: send `afterClusterTime` = highest operationTime seen.
    pub causal: bool,
    /// Share of operations that are reads.
    pub read_fraction: f64,
    /// Keys are drawn uniformly from `0..keys`.
    pub keys: u64,
    /// The session gives up on an operation after this long (recorded `info` / `fail`).
    pub op_timeout: Duration,
    /// `maxTimeMS` sent with each request.
    pub max_time_ms: u32,
    /// Pause between operations.
    pub think_time: Duration,
    /// Pause after an error before the next operation.
    pub backoff: Duration,
    /// First operation after this long.
    pub start_after: Duration,
    /// No new operation after this long (local time since start).
    pub stop_after: Duration,
    /// No new operation after this many (None: no limit).
    pub max_ops: Option<u64>,
    pub workload: SessionWorkload,
}

impl SessionConfig {
    pub fn new(session_id: u64, members: Vec<NodeId>) -> Self {
        SessionConfig {
            session_id,
            nearest: members.clone(),
            members,
            read_pref: ReadPref::Primary,
            read_concern: ReadConcern::Majority,
            write_concern: WriteConcern::Majority,
            causal: true,
            read_fraction: 0.5,
            keys: 4,
            op_timeout: Duration::from_secs(4),
            max_time_ms: 3_000,
            think_time: Duration::from_millis(10),
            backoff: Duration::from_millis(100),
            start_after: Duration::from_secs(3),
            stop_after: Duration::from_secs(60),
            max_ops: None,
            workload: SessionWorkload::ListAppend,
        }
    }
}

/// What a session counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionStats {
    pub reads_ok: u64,
    pub reads_failed: u64,
    pub writes_ok: u64,
    pub writes_failed: u64,
    pub writes_unknown: u64,
    pub timeouts: u64,
    pub errors: BTreeMap<i32, u64>,
    /// Latencies of ok operations, nanoseconds of local time.
    pub read_latency_ns: Vec<u64>,
    pub write_latency_ns: Vec<u64>,
    /// Replies carrying the dummy signature (must stay 0 for an untrusted client).
    pub dummy_signatures: u64,
    /// Replies without `$clusterTime` (and without `operationTime`).
    pub replies_without_cluster_time: u64,
    /// Ok operations after `stop_after / 2` (liveness after faults are repaired).
    pub ok_in_second_half: u64,
    /// Ok reads answered by a member that named another member as primary (`primary_hint`):
    /// reads served by a secondary. Also the metric `causal.session.reads_from_secondary`.
    pub reads_from_secondary: u64,
    /// Of those, reads whose list contains a value this session appended earlier (read your
    /// own write from a secondary). Also the metric `causal.session.own_write_reads_from_secondary`.
    pub own_write_reads_from_secondary: u64,
    /// TPC-C transactions started, by [`crate::tpcc::TxnType::name`].
    pub txns: BTreeMap<&'static str, u64>,
    /// TPC-C transactions whose remaining operations were dropped after a failed operation.
    pub txns_abandoned: u64,
    /// Writes sent again because the primary was in a newer term than they named.
    pub writes_resent_in_new_term: u64,
}

/// What a causal session must see again when it next reads a key (its session guarantees):
/// its newest acknowledged append there, and the list its last read returned, which every
/// later read must extend (values are unique, so its length and last value identify it).
#[derive(Clone, Copy, Debug, Default)]
struct KeyFloor {
    own_append: Option<u64>,
    read_len: usize,
    read_last: Option<u64>,
}

struct InFlight {
    id: u64,
    op: ClientOp,
    to: NodeId,
    sent_at: LocalTime,
    /// The request as sent, for sending again with a newer term ([`Request::term`]).
    req: Request,
    /// Times it was sent again.
    resent: u32,
}

/// Times a write is sent again with a newer term before it is given up (each time the primary
/// named a higher term than the session knew; more than one is a failover during the retry).
const RESENDS_MAX: u32 = 2;

/// A client session running a closed loop of list-append operations.
pub struct Session {
    cfg: SessionConfig,
    primary: usize,
    nearest: usize,
    next_id: u64,
    counter: u64,
    started_at: Option<LocalTime>,
    in_flight: Option<InFlight>,
    operation_time: Option<ClusterTime>,
    cluster_time: Option<SignedClusterTime>,
    /// The highest primary's term learned from replies ([`Reply::term`]): writes name it
    /// ([`Request::term`]).
    term: u64,
    stats: SessionStats,
    /// The remaining operations of the current TPC-C transaction.
    queue: VecDeque<ClientOp>,
    ops_started: u64,
    /// Per key, what later reads must contain; kept only when the guarantees are promised
    /// ([`Session::guarantees_promised`]).
    floors: BTreeMap<u64, KeyFloor>,
    /// The first read that broke a promised guarantee, reported by [`Process::invariants`].
    broken: Option<String>,
}

impl Session {
    pub fn new(cfg: SessionConfig) -> Self {
        Session {
            cfg,
            primary: 0,
            nearest: 0,
            next_id: 1,
            counter: 0,
            started_at: None,
            in_flight: None,
            operation_time: None,
            cluster_time: None,
            term: 0,
            stats: SessionStats::default(),
            queue: VecDeque::new(),
            ops_started: 0,
            floors: BTreeMap::new(),
            broken: None,
        }
    }
    pub fn stats(&self) -> &SessionStats {
        &self.stats
    }
    pub fn operation_time(&self) -> Option<ClusterTime> {
        self.operation_time
    }
    pub fn cluster_time(&self) -> Option<SignedClusterTime> {
        self.cluster_time
    }
    pub fn config(&self) -> &SessionConfig {
        &self.cfg
    }

    fn micro(op: ClientOp) -> MicroOp {
        match op {
            ClientOp::Read { key } => MicroOp::Read { key, value: None },
            ClientOp::Append { key, value } => MicroOp::Append { key, value },
        }
    }

    fn record(&self, ctx: &mut Ctx<'_, CausalMsg>, t: OpType, m: MicroOp) {
        ctx.record(HistoryEvent::new(t, self.cfg.session_id, "txn", vec![m]));
    }

    fn target(&mut self, ctx: &mut Ctx<'_, CausalMsg>, op: ClientOp) -> Option<NodeId> {
        let n = self.cfg.members.len();
        if n == 0 {
            return None;
        }
        let primary = self.cfg.members[self.primary % n];
        Some(match (op, self.cfg.read_pref) {
            (ClientOp::Append { .. }, _) | (ClientOp::Read { .. }, ReadPref::Primary) => primary,
            (ClientOp::Read { .. }, ReadPref::Secondary) if n > 1 => {
                let others: Vec<NodeId> = self.cfg.members.iter().copied().filter(|&m| m != primary).collect();
                others[ctx.rng().random_range(0..others.len())]
            }
            (ClientOp::Read { .. }, ReadPref::Secondary) => primary,
            (ClientOp::Read { .. }, ReadPref::Nearest) => {
                let l = self.cfg.nearest.len().max(1);
                self.cfg.nearest.get(self.nearest % l).copied().unwrap_or(primary)
            }
        })
    }

    fn next_op(&mut self, ctx: &mut Ctx<'_, CausalMsg>) {
        let now = ctx.now();
        let start = *self.started_at.get_or_insert(now);
        if now.saturating_since(start) >= self.cfg.stop_after
            || self.in_flight.is_some()
            || self.cfg.max_ops.is_some_and(|m| self.ops_started >= m)
        {
            return;
        }
        let op = match self.cfg.workload {
            SessionWorkload::ListAppend => {
                let key = ctx.rng().random_range(0..self.cfg.keys.max(1));
                if ctx.rng().random_bool(self.cfg.read_fraction.clamp(0.0, 1.0)) {
                    ClientOp::Read { key }
                } else {
                    self.counter += 1;
                    ClientOp::Append { key, value: self.cfg.session_id * VALUE_BASE + self.counter }
                }
            }
            SessionWorkload::Tpcc { cfg, kind, home } => {
                if self.queue.is_empty() {
                    let t = pick_txn(kind, ctx.rng());
                    let (sid, counter) = (self.cfg.session_id, &mut self.counter);
                    let ops = txn_ops(&cfg, t, home, ctx.rng(), || {
                        *counter += 1;
                        sid * VALUE_BASE + *counter
                    });
                    *self.stats.txns.entry(t.name()).or_default() += 1;
                    self.queue.extend(ops);
                }
                match self.queue.pop_front() {
                    Some(op) => op,
                    None => return,
                }
            }
        };
        let Some(to) = self.target(ctx, op) else { return };
        self.ops_started += 1;
        let id = self.next_id;
        self.next_id += 1;
        let req = Request {
            id,
            op,
            read_concern: self.cfg.read_concern,
            write_concern: self.cfg.write_concern,
            after_cluster_time: if self.cfg.causal { self.operation_time } else { None },
            cluster_time: self.cluster_time,
            max_time_ms: self.cfg.max_time_ms,
            secondary_ok: self.cfg.read_pref != ReadPref::Primary,
            term: matches!(op, ClientOp::Append { .. }).then_some(self.term),
        };
        self.record(ctx, OpType::Invoke, Self::micro(op));
        ctx.send(to, CausalMsg::Request(req.clone()));
        ctx.set_timer(SessionTimer::OpTimeout, self.cfg.op_timeout);
        self.in_flight = Some(InFlight { id, op, to, sent_at: now, req, resent: 0 });
    }

    fn finish(&mut self, ctx: &mut Ctx<'_, CausalMsg>, pause: Duration) {
        self.in_flight = None;
        ctx.cancel_timer(SessionTimer::OpTimeout);
        ctx.set_timer(SessionTimer::NextOp, pause);
    }

    /// The operation failed or timed out: rotate to another member for its kind.
    fn rotate(&mut self, op: ClientOp) {
        match (op, self.cfg.read_pref) {
            (ClientOp::Read { .. }, ReadPref::Nearest) => self.nearest += 1,
            (ClientOp::Read { .. }, ReadPref::Secondary) => {}
            _ => self.primary = (self.primary + 1) % self.cfg.members.len().max(1),
        }
    }

    fn on_reply(&mut self, ctx: &mut Ctx<'_, CausalMsg>, from: NodeId, r: Reply) {
        let Some(f) = &self.in_flight else { return };
        if f.id != r.id || f.to != from {
            return;
        }
        let (op, sent_at, sent_term) = (f.op, f.sent_at, f.req.term);
        if r.result.as_ref().is_err_and(|e| e.code == codes::PRIMARY_STEPPED_DOWN)
            && r.term.is_some()
            && r.term == sent_term
        {
            // A primary refuses only writes naming another term than its own: this answers an
            // earlier copy, sent before the session learned that term.
            return;
        }
        let served_by_secondary = match (self.cfg.members.iter().position(|&m| m == from), r.primary_hint) {
            (Some(me), Some(h)) => h as usize != me,
            _ => false,
        };
        match r.cluster_time {
            Some(ct) => {
                if ct.is_dummy_signed() {
                    self.stats.dummy_signatures += 1;
                }
                if self.cluster_time.is_none_or(|c| c.time < ct.time) {
                    self.cluster_time = Some(ct);
                }
            }
            None => self.stats.replies_without_cluster_time += 1,
        }
        if let Some(t) = r.operation_time {
            self.operation_time = Some(self.operation_time.map_or(t, |o| o.max(t)));
        }
        if let Some(h) = r.primary_hint {
            if (h as usize) < self.cfg.members.len() {
                self.primary = h as usize;
            }
        }
        self.term = self.term.max(r.term.unwrap_or(0));
        let now = ctx.now();
        let latency = now.saturating_since(sent_at).as_nanos() as u64;
        let second_half = self.started_at.is_some_and(|s| now.saturating_since(s) >= self.cfg.stop_after / 2);
        match (r.result, op) {
            (Ok(ReplyBody::Read(list)), ClientOp::Read { key }) => {
                self.stats.reads_ok += 1;
                if served_by_secondary {
                    self.stats.reads_from_secondary += 1;
                    ctx.metric("causal.session.reads_from_secondary", 1);
                    if list.iter().any(|&v| self.is_own(v)) {
                        self.stats.own_write_reads_from_secondary += 1;
                        ctx.metric("causal.session.own_write_reads_from_secondary", 1);
                    }
                }
                self.stats.ok_in_second_half += u64::from(second_half);
                if self.stats.read_latency_ns.len() < MAX_SAMPLES {
                    self.stats.read_latency_ns.push(latency);
                }
                self.check_read(key, &list);
                self.record(ctx, OpType::Ok, MicroOp::Read { key, value: Some(ReadValue::List(list)) });
                self.finish(ctx, self.cfg.think_time);
            }
            (Ok(ReplyBody::Written), ClientOp::Append { key, value }) => {
                if self.guarantees_promised() {
                    self.floors.entry(key).or_default().own_append = Some(value);
                }
                self.stats.writes_ok += 1;
                self.stats.ok_in_second_half += u64::from(second_half);
                if self.stats.write_latency_ns.len() < MAX_SAMPLES {
                    self.stats.write_latency_ns.push(latency);
                }
                self.record(ctx, OpType::Ok, Self::micro(op));
                self.finish(ctx, self.cfg.think_time);
            }
            (Ok(_), _) => {
                // A reply of the wrong shape: the outcome is unknown.
                self.fail(ctx, op, None);
            }
            (Err(e), _) => {
                *self.stats.errors.entry(e.code).or_default() += 1;
                if e.code == codes::PRIMARY_STEPPED_DOWN && self.resend_in_term(ctx, from, sent_term) {
                    return;
                }
                let not_primary = matches!(e.code, codes::NOT_WRITABLE_PRIMARY | codes::NOT_PRIMARY_NO_SECONDARY_OK);
                let no_hint = not_primary && r.primary_hint.is_none();
                // A primary of a lower term than the session's: it has been replaced.
                let stale_primary = e.code == codes::PRIMARY_STEPPED_DOWN && r.term < sent_term;
                if no_hint || stale_primary || e.code == codes::MAX_TIME_MS_EXPIRED {
                    self.rotate(op);
                }
                self.fail(ctx, op, Some(e.code));
            }
        }
    }

    /// A primary refused the write in flight for naming `sent_term`, not its own: when it
    /// replied in a higher term, sends the same request (same id: it runs at most once) again
    /// with that term, at most [`RESENDS_MAX`] times. Returns whether it did.
    fn resend_in_term(&mut self, ctx: &mut Ctx<'_, CausalMsg>, to: NodeId, sent_term: Option<u64>) -> bool {
        let (term, cluster_time) = (self.term, self.cluster_time);
        let Some(f) = self.in_flight.as_mut() else { return false };
        if f.resent >= RESENDS_MAX || sent_term.is_none_or(|t| t >= term) {
            return false;
        }
        f.resent += 1;
        f.req.term = Some(term);
        f.req.cluster_time = cluster_time;
        self.stats.writes_resent_in_new_term += 1;
        ctx.send(to, CausalMsg::Request(f.req.clone()));
        true
    }

    /// Whether reads promise read-your-writes and monotonic reads even across failovers:
    /// a causal session with majority read and write concerns (MongoDB's documented rule; with
    /// w:1 a failover may roll an acknowledged write back).
    fn guarantees_promised(&self) -> bool {
        self.cfg.causal
            && self.cfg.read_concern == ReadConcern::Majority
            && self.cfg.write_concern == WriteConcern::Majority
    }

    /// Holds an ok read of `key` to the session guarantees (when promised), then raises the
    /// key's floor to it.
    fn check_read(&mut self, key: u64, list: &[u64]) {
        if !self.guarantees_promised() {
            return;
        }
        let floor = self.floors.entry(key).or_default();
        let extends = floor.read_len == 0 || list.get(floor.read_len - 1).copied() == floor.read_last;
        let broken = if let Some(v) = floor.own_append.filter(|v| !list.contains(v)) {
            Some(format!("read-your-writes: its acknowledged append {v} is missing"))
        } else if !extends {
            Some(format!(
                "monotonic reads: the list does not extend the {} values read before (ending in {:?})",
                floor.read_len, floor.read_last
            ))
        } else {
            None
        };
        if let Some(what) = broken {
            if self.broken.is_none() {
                self.broken =
                    Some(format!("session {}: read of key {key} broke {what}: {list:?}", self.cfg.session_id));
            }
        }
        floor.read_len = list.len();
        floor.read_last = list.last().copied();
    }

    /// Whether `v` is a value this session has appended (or tried to).
    fn is_own(&self, v: u64) -> bool {
        v / VALUE_BASE == self.cfg.session_id && (1..=self.counter).contains(&(v % VALUE_BASE))
    }

    /// Records a failed (reads, certain write failures) or unknown (other writes) outcome.
    /// The rest of the current TPC-C transaction is dropped.
    fn fail(&mut self, ctx: &mut Ctx<'_, CausalMsg>, op: ClientOp, code: Option<i32>) {
        if !self.queue.is_empty() {
            self.queue.clear();
            self.stats.txns_abandoned += 1;
        }
        let t = match op {
            ClientOp::Read { .. } => {
                self.stats.reads_failed += 1;
                OpType::Fail
            }
            ClientOp::Append { .. } if code.is_some_and(codes::write_certainly_failed) => {
                self.stats.writes_failed += 1;
                OpType::Fail
            }
            ClientOp::Append { .. } => {
                self.stats.writes_unknown += 1;
                OpType::Info
            }
        };
        self.record(ctx, t, Self::micro(op));
        self.finish(ctx, self.cfg.backoff);
    }
}

impl Process for Session {
    type Msg = CausalMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, CausalMsg>) {
        ctx.set_timer(SessionTimer::NextOp, self.cfg.start_after);
    }

    fn on_message(&mut self, ctx: &mut Ctx<'_, CausalMsg>, from: NodeId, msg: CausalMsg) {
        if let CausalMsg::Reply(r) = msg {
            self.on_reply(ctx, from, r);
        }
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_, CausalMsg>, timer: TimerId) {
        match SessionTimer::from_id(timer) {
            Some(SessionTimer::NextOp) => {
                if self.started_at.is_none() {
                    self.started_at = Some(ctx.now());
                }
                self.next_op(ctx)
            }
            Some(SessionTimer::OpTimeout) => {
                if let Some(f) = self.in_flight.take() {
                    self.stats.timeouts += 1;
                    self.rotate(f.op);
                    self.in_flight = Some(f);
                    let op = self.in_flight.as_ref().map(|f| f.op);
                    if let Some(op) = op {
                        self.fail(ctx, op, None);
                    }
                }
            }
            None => {}
        }
    }

    /// No read broke a session guarantee this session was promised (read-your-writes and
    /// monotonic reads, per key); checked at the reply, long before the history checker runs.
    fn invariants(&self) -> Result<(), String> {
        self.broken.clone().map_or(Ok(()), Err)
    }
}

/// A scripted client for protocol tests: sends each request at its time to its member and
/// keeps every reply.
pub struct Probe {
    script: Vec<(Duration, NodeId, Request)>,
    pub replies: Vec<(NodeId, Reply)>,
}

impl Probe {
    /// `script`: (send after this long since start, to, request). Requests go out in order.
    pub fn new(mut script: Vec<(Duration, NodeId, Request)>) -> Self {
        script.sort_by_key(|(at, _, _)| *at);
        script.reverse();
        Probe { script, replies: Vec::new() }
    }

    /// The reply to request `id`, if any.
    pub fn reply(&self, id: u64) -> Option<&Reply> {
        self.replies.iter().map(|(_, r)| r).find(|r| r.id == id)
    }

    fn arm(&self, ctx: &mut Ctx<'_, CausalMsg>, elapsed: Duration) {
        if let Some((at, _, _)) = self.script.last() {
            ctx.set_timer(TimerId(1), at.saturating_sub(elapsed));
        }
    }
}

impl Process for Probe {
    type Msg = CausalMsg;
    fn on_start(&mut self, ctx: &mut Ctx<'_, CausalMsg>) {
        self.arm(ctx, Duration::ZERO);
    }
    fn on_message(&mut self, _ctx: &mut Ctx<'_, CausalMsg>, from: NodeId, msg: CausalMsg) {
        if let CausalMsg::Reply(r) = msg {
            self.replies.push((from, r));
        }
    }
    fn on_timer(&mut self, ctx: &mut Ctx<'_, CausalMsg>, _timer: TimerId) {
        if let Some((at, to, req)) = self.script.pop() {
            ctx.send(to, CausalMsg::Request(req));
            self.arm(ctx, at);
        }
    }
}
