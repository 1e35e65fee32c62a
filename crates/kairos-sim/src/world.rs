//! The simulated world: nodes, their clocks and inboxes, the network between them, and the
//! event loop that drives everything in true time.

use crate::config::{CpuModel, SimConfig};
use crate::fault::{Fault, ScheduledFault};
use crate::queue::EventQueue;
use crate::trace::{TraceEntry, TraceKind, Tracer};
use kairos_clock::SimClock;
use kairos_core::history::HistoryRecord;
use kairos_core::{
    duration_nanos, Ctx, Effect, LatencyMatrix, LocalTime, Message, NodeId, Persist, Process, RegionId, Rng, SimTime,
    Stored, TimerId,
};
use rand::{Rng as _, SeedableRng};
use std::any::Any;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

/// A role the simulator can host: any [`Process`] that is also `Any`, so tests can inspect a
/// node's state with [`Sim::role`].
pub trait Role<M>: Process<Msg = M> + Any {
    fn as_any(&self) -> &dyn Any;
}

impl<M, T: Process<Msg = M> + Any> Role<M> for T {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Makes a fresh role instance for a node: at the start, and again after each crash.
pub type RoleFactory<M> = Box<dyn FnMut(NodeId) -> Box<dyn Role<M>>>;

/// A property over several nodes (committed log prefixes agree, a checkpoint equals a replay),
/// checked by [`Sim::add_world_check`] every so many events.
pub type WorldCheck<M> = Box<dyn Fn(&Sim<M>) -> Result<(), String>>;

/// The first invariant a run broke: the run stops at that event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub seed: u64,
    /// The number of the event that broke it (1 = the first event handled).
    pub event: u64,
    pub time: SimTime,
    /// The node whose handler broke a local invariant; `None` for a world check.
    pub node: Option<NodeId>,
    /// Which invariant, and the values that break it.
    pub what: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = match self.node {
            Some(n) => format!("in node {n}'s handler"),
            None => "in a world check".to_string(),
        };
        write!(
            f,
            "invariant violated {at} at event {} (t = {} ns, seed {}): {}",
            self.event,
            self.time.as_nanos(),
            self.seed,
            self.what
        )
    }
}

/// Counters of what the world did. Machine-independent facts for tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    pub events_handled: u64,
    pub messages_sent: u64,
    pub messages_delivered: u64,
    pub dropped_loss: u64,
    pub dropped_partition: u64,
    pub dropped_crashed: u64,
    pub dropped_overload: u64,
    pub dropped_unknown_node: u64,
    pub duplicated: u64,
    /// Old messages delivered again by [`Fault::Replay`].
    pub replayed: u64,
    /// Handlers cut short by [`Fault::CrashMidWrite`]: their node died while writing.
    pub torn_writes: u64,
    /// Messages whose encoding [`Sim::corrupt_messages`] changed and that still decoded: delivered
    /// as decoded.
    pub corrupted: u64,
    /// Messages whose changed encoding no longer decoded: dropped, as the TCP host drops a frame
    /// it cannot decode.
    pub dropped_corrupt: u64,
}

/// Messages kept for replays when a [`Fault::Replay`] is scheduled and nothing else was asked:
/// the last few hundred milliseconds of a loaded run, so a replay delivers messages a protocol
/// has already moved past.
pub const REPLAY_BUFFER_DEFAULT: usize = 4_096;

/// What [`Sim::corrupt_messages`] does to messages in flight.
struct Corruption {
    share: f64,
    rng: Rng,
}

/// Recently sent messages that [`Fault::Replay`] may deliver again.
struct ReplayBuffer<M> {
    capacity: usize,
    sent: VecDeque<(NodeId, NodeId, M)>,
    /// Its own stream: keeping the buffer does not change any other random draw.
    rng: Rng,
}

/// Work waiting for a node's CPU.
#[derive(Clone)]
enum Work<M> {
    Start,
    Message { from: NodeId, msg: M },
    Timer(TimerId),
}

enum Event<M> {
    Work { node: NodeId, incarnation: u32, work: Work<M> },
    Deliver { to: NodeId, from: NodeId, msg: M },
    Timer { node: NodeId, incarnation: u32, id: TimerId, generation: u64 },
    Wake { node: NodeId, incarnation: u32 },
    Fault(Fault),
}

struct Node<M> {
    region: RegionId,
    role: Option<Box<dyn Role<M>>>,
    factory: RoleFactory<M>,
    clock: SimClock,
    clock_rng: Rng,
    rng: Rng,
    incarnation: u32,
    /// Armed timers: id → generation of the arming (a re-arm or cancel makes older events stale).
    timers: HashMap<TimerId, u64>,
    /// Timers that fell due and wait to run (behind a busy CPU's inbox): id → the generation
    /// that fell due. One still runs only if that arming is still the current one when its
    /// turn comes (a handler before it may have re-armed or cancelled it), as on the real
    /// host, where a cancelled or re-armed deadline never fires.
    due_timers: HashMap<TimerId, u64>,
    busy_until: SimTime,
    inbox: VecDeque<Work<M>>,
    wake_pending: bool,
    inbox_len_max: usize,
    busy_ns_total: u64,
    /// The longest single handler (its whole charge).
    handler_ns_max: u64,
    /// The part of `busy_ns_total` charged for sending and receiving messages (measured model).
    wire_ns_total: u64,
    /// What the node made durable: it survives crashes (unless the disk is wiped).
    stored: Stored,
    /// [`Fault::CrashMidWrite`] is armed: the next handler that persists anything dies writing.
    crash_mid_write: bool,
    /// [`Fault::Pause`]: no handler runs; messages wait in the inbox and timers that fall due
    /// wait in `held_timers` (id, generation) until [`Fault::Resume`].
    paused: bool,
    held_timers: Vec<(TimerId, u64)>,
    /// [`Fault::Slow`]: every message the node sends takes this much longer (links stay FIFO).
    slow_ns: u64,
}

/// A deterministic simulation of one deployment. Same [`SimConfig::seed`], same roles, same
/// faults → the same trace hash, bit for bit (except under [`CpuModel::Measured`]).
pub struct Sim<M: Message> {
    config: SimConfig,
    matrix: LatencyMatrix,
    now: SimTime,
    queue: EventQueue<Event<M>>,
    nodes: Vec<Node<M>>,
    net_rng: Rng,
    loss: f64,
    duplicate: f64,
    replay: Option<ReplayBuffer<M>>,
    corruption: Option<Corruption>,
    /// blocked[from * n + to]: the directed link is cut.
    blocked: Vec<bool>,
    /// last_arrival[from * n + to]: keeps links FIFO.
    last_arrival: Vec<SimTime>,
    effects: Vec<Effect<M>>,
    history: Vec<HistoryRecord>,
    metrics: BTreeMap<&'static str, u64>,
    stats: SimStats,
    tracer: Tracer,
    next_timer_generation: u64,
    world_checks: Vec<(u64, WorldCheck<M>)>,
    violation: Option<Violation>,
    /// [`Sim::record_inputs`]: one node's inputs, for [`Sim::replay_alone`].
    recorded: Option<RecordedInputs<M>>,
}

/// Every input one incarnation of a node handled, in order, with its local clock reading.
struct RecordedInputs<M> {
    node: NodeId,
    incarnation: u32,
    inputs: Vec<(LocalTime, Work<M>)>,
}

/// What [`Sim::replay_alone`] measured: a node's recorded inputs handled again by a fresh
/// instance of its role with nothing else running between its handlers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AloneCost {
    /// Handlers run (start, messages, timers).
    pub handlers: u64,
    /// Their CPU time (thread CPU clock, the measured model's per-handler clock overhead
    /// subtracted as in the run).
    pub cpu: Duration,
    /// The longest of them.
    pub handler_max: Duration,
}

impl<M: Message> Sim<M> {
    pub fn new(config: SimConfig, matrix: LatencyMatrix) -> Self {
        let net_rng = Rng::seed_from_u64(mix(config.seed, u64::MAX, 0));
        let loss = config.network.loss;
        let duplicate = config.network.duplicate;
        let tracer = Tracer::new(config.keep_trace_log);
        Sim {
            config,
            matrix,
            now: SimTime::ZERO,
            queue: EventQueue::new(),
            nodes: Vec::new(),
            net_rng,
            loss,
            duplicate,
            replay: None,
            corruption: None,
            blocked: Vec::new(),
            last_arrival: Vec::new(),
            effects: Vec::new(),
            history: Vec::new(),
            metrics: BTreeMap::new(),
            stats: SimStats::default(),
            tracer,
            next_timer_generation: 0,
            world_checks: Vec::new(),
            violation: None,
            recorded: None,
        }
    }

    /// Adds a node in `region` with the given clock; `factory` makes its role (again after a
    /// crash). The node starts at the current time.
    pub fn add_node(
        &mut self,
        region: RegionId,
        clock: SimClock,
        mut factory: impl FnMut(NodeId) -> Box<dyn Role<M>> + 'static,
    ) -> NodeId {
        assert!(region.index() < self.matrix.len(), "region {region:?} is not in the latency matrix");
        let id = NodeId(u32::try_from(self.nodes.len()).expect("fewer than 2^32 nodes"));
        let role = factory(id);
        let seed = self.config.seed;
        self.nodes.push(Node {
            region,
            role: Some(role),
            factory: Box::new(factory),
            clock,
            clock_rng: Rng::seed_from_u64(mix(seed, id.0 as u64, 0xc10c)),
            rng: Rng::seed_from_u64(mix(seed, id.0 as u64, 0)),
            incarnation: 0,
            timers: HashMap::new(),
            busy_until: SimTime::ZERO,
            inbox: VecDeque::new(),
            wake_pending: false,
            paused: false,
            slow_ns: 0,
            held_timers: Vec::new(),
            due_timers: HashMap::new(),
            inbox_len_max: 0,
            busy_ns_total: 0,
            handler_ns_max: 0,
            wire_ns_total: 0,
            stored: Stored::default(),
            crash_mid_write: false,
        });
        let n = self.nodes.len();
        // Grow the n×n link tables, keeping existing entries.
        let mut blocked = vec![false; n * n];
        let mut last = vec![SimTime::ZERO; n * n];
        for from in 0..n - 1 {
            for to in 0..n - 1 {
                blocked[from * n + to] = self.blocked[from * (n - 1) + to];
                last[from * n + to] = self.last_arrival[from * (n - 1) + to];
            }
        }
        self.blocked = blocked;
        self.last_arrival = last;
        self.queue.push(self.now, Event::Work { node: id, incarnation: 0, work: Work::Start });
        id
    }

    /// Schedules `fault` (or a repair) at true time `at` (not before now). A [`Fault::Replay`]
    /// starts keeping sent messages now, if nothing did: `REPLAY_BUFFER_DEFAULT` of them.
    pub fn schedule(&mut self, at: SimTime, fault: Fault) {
        if matches!(fault, Fault::Replay(_)) && self.replay.is_none() {
            self.keep_sent_for_replay(REPLAY_BUFFER_DEFAULT);
        }
        self.queue.push(at.max(self.now), Event::Fault(fault));
    }

    pub fn schedule_all(&mut self, plan: impl IntoIterator<Item = ScheduledFault>) {
        for f in plan {
            self.schedule(f.at, f.fault);
        }
    }

    /// True time now.
    pub fn now(&self) -> SimTime {
        self.now
    }

    /// Keeps the last `capacity` messages sent, for [`Fault::Replay`] (off by default: it
    /// clones every message).
    pub fn keep_sent_for_replay(&mut self, capacity: usize) {
        let rng = Rng::seed_from_u64(mix(self.config.seed, u64::MAX - 1, 0));
        self.replay = Some(ReplayBuffer { capacity: capacity.max(1), sent: VecDeque::new(), rng });
    }

    /// Changes the encoding of `share` of the messages sent (a few bytes overwritten, or the
    /// end cut off or extended) and delivers whatever still decodes: a peer that sends any
    /// message the wire format can carry, for tests that no handler panics on network input
    /// (their histories are not meant to be checked: such a peer is Byzantine, and the roles'
    /// and the world's invariants are not checked either, as it breaks them by design). Its own
    /// random stream, so no other draw changes.
    pub fn corrupt_messages(&mut self, share: f64) {
        self.config.check_invariants = false;
        let rng = Rng::seed_from_u64(mix(self.config.seed, u64::MAX - 2, 0));
        self.corruption = Some(Corruption { share: share.clamp(0.0, 1.0), rng });
    }

    /// Adds a property over the whole world, checked after every `every_events` events (with
    /// [`SimConfig::check_invariants`] on); the run stops at the first violation.
    pub fn add_world_check(&mut self, every_events: u64, check: WorldCheck<M>) {
        self.world_checks.push((every_events.max(1), check));
    }

    /// The first invariant the run broke, if any; the run stopped at that event.
    pub fn violation(&self) -> Option<&Violation> {
        self.violation.as_ref()
    }

    /// Handles the next event. Returns false when nothing is pending, or when an invariant
    /// was violated (the run stops there: see [`Sim::violation`]).
    pub fn step(&mut self) -> bool {
        if self.violation.is_some() {
            return false;
        }
        let handled = self.step_event();
        if handled && self.config.check_invariants && !self.world_checks.is_empty() {
            let checks = std::mem::take(&mut self.world_checks);
            for (every, check) in &checks {
                if self.violation.is_none() && self.stats.events_handled.is_multiple_of(*every) {
                    if let Err(what) = check(self) {
                        self.violate(None, what);
                    }
                }
            }
            self.world_checks = checks;
        }
        handled
    }

    fn violate(&mut self, node: Option<NodeId>, what: String) {
        if self.violation.is_none() {
            self.violation = Some(Violation {
                seed: self.config.seed,
                event: self.stats.events_handled,
                time: self.now,
                node,
                what,
            });
        }
    }

    fn step_event(&mut self) -> bool {
        let Some((at, event)) = self.queue.pop() else { return false };
        debug_assert!(at >= self.now, "time never goes backwards");
        self.now = at;
        self.stats.events_handled += 1;
        match event {
            Event::Work { node, incarnation, work } => self.offer(node, incarnation, work),
            Event::Deliver { to, from, msg } => {
                let up = self.nodes[to.index()].role.is_some();
                if up {
                    self.stats.messages_delivered += 1;
                    let inc = self.nodes[to.index()].incarnation;
                    self.offer(to, inc, Work::Message { from, msg });
                } else {
                    self.stats.dropped_crashed += 1;
                }
            }
            Event::Timer { node, incarnation, id, generation } => {
                let n = &mut self.nodes[node.index()];
                if n.incarnation == incarnation && n.timers.get(&id) == Some(&generation) {
                    if n.paused {
                        // Due again at the resume.
                        n.held_timers.push((id, generation));
                    } else {
                        n.due_timers.insert(id, generation);
                        self.offer(node, incarnation, Work::Timer(id));
                    }
                }
            }
            Event::Wake { node, incarnation } => {
                let n = &mut self.nodes[node.index()];
                if n.incarnation == incarnation {
                    n.wake_pending = false;
                    if n.paused {
                        return true;
                    }
                    if let Some(work) = n.inbox.pop_front() {
                        self.handle(node, work);
                        self.schedule_wake_if_needed(node);
                    }
                }
            }
            Event::Fault(fault) => self.apply_fault(fault),
        }
        true
    }

    /// Runs every event up to and including true time `until`; afterwards `now() == until`.
    pub fn run_until(&mut self, until: SimTime) {
        while self.violation.is_none() && self.queue.peek_time().is_some_and(|t| t <= until) {
            self.step();
        }
        if self.violation.is_none() {
            self.now = self.now.max(until);
        }
    }

    pub fn run_for(&mut self, d: Duration) {
        self.run_until(self.now + d);
    }

    /// Runs until `done(self)` holds (checked after each event), nothing is pending, or true
    /// time passes `deadline`. Returns whether `done` held.
    pub fn run_until_pred(&mut self, deadline: SimTime, mut done: impl FnMut(&Self) -> bool) -> bool {
        loop {
            if done(self) {
                return true;
            }
            match self.queue.peek_time() {
                Some(t) if t <= deadline && self.violation.is_none() => {
                    self.step();
                }
                _ => return done(self),
            }
        }
    }

    fn offer(&mut self, node: NodeId, incarnation: u32, work: Work<M>) {
        let cpu_free = matches!(self.config.cpu, CpuModel::Free);
        let inbox_max = self.config.limits.inbox_max;
        let n = &mut self.nodes[node.index()];
        if n.role.is_none() || n.incarnation != incarnation {
            return;
        }
        // (The inbox holds work only while the CPU is busy or after a pause: later work waits
        // behind it.)
        if !n.paused && n.inbox.is_empty() && (cpu_free || n.busy_until <= self.now) {
            self.handle(node, work);
            return;
        }
        if n.inbox.len() >= inbox_max {
            self.stats.dropped_overload += 1;
            return;
        }
        n.inbox.push_back(work);
        n.inbox_len_max = n.inbox_len_max.max(n.inbox.len());
        self.schedule_wake_if_needed(node);
    }

    fn schedule_wake_if_needed(&mut self, node: NodeId) {
        let n = &mut self.nodes[node.index()];
        if !n.wake_pending && !n.paused && !n.inbox.is_empty() {
            n.wake_pending = true;
            let at = n.busy_until.max(self.now);
            let incarnation = n.incarnation;
            self.queue.push(at, Event::Wake { node, incarnation });
        }
    }

    /// Runs one handler of `node` now and applies its effects (a timer only if the arming
    /// that fell due is still the current one: `Node::due_timers`).
    fn handle(&mut self, node: NodeId, work: Work<M>) {
        let now = self.now;
        let n = &mut self.nodes[node.index()];
        if let Work::Timer(id) = &work {
            let due = n.due_timers.remove(id);
            if due.is_none() || n.timers.get(id) != due.as_ref() {
                return;
            }
            n.timers.remove(id);
        }
        let Some(mut role) = n.role.take() else { return };
        let local: LocalTime = n.clock.read(now, &mut n.clock_rng);
        if let Some(r) = self.recorded.as_mut().filter(|r| r.node == node && r.incarnation == n.incarnation) {
            r.inputs.push((local, work.clone()));
        }
        let mut effects = std::mem::take(&mut self.effects);
        let kind = match &work {
            Work::Start => TraceKind::Start,
            Work::Message { from, .. } => TraceKind::Message { from: *from },
            Work::Timer(id) => TraceKind::Timer(*id),
        };
        self.tracer.record(
            TraceEntry { time: now, node, kind },
            match &work {
                Work::Message { msg, .. } => Some(msg),
                _ => None,
            },
        );
        let measure = matches!(self.config.cpu, CpuModel::Measured { .. });
        let wire = match &self.config.cpu {
            CpuModel::Measured { wire, .. } if !wire.is_zero() => Some(*wire),
            _ => None,
        };
        let received = match (&work, &wire) {
            (Work::Message { from, msg }, Some(w)) if *from != node => w.receive(wire_bytes(msg)),
            _ => Duration::ZERO,
        };
        // The measured-CPU model charges a handler its real CPU time: the one place the
        // simulator reads a real clock, and why that mode is not bit-for-bit reproducible.
        let started = if measure { Some(crate::cpu_clock::now()) } else { None };
        {
            let mut ctx = Ctx::new(node, local, &mut n.rng, &mut effects);
            match work {
                Work::Start => role.on_start(&mut ctx),
                Work::Message { from, msg } => role.on_message(&mut ctx, from, msg),
                Work::Timer(id) => role.on_timer(&mut ctx, id),
            }
        }
        let mut wire_cost = Duration::ZERO;
        let cost = match &self.config.cpu {
            CpuModel::Free => Duration::ZERO,
            CpuModel::Fixed(d) => *d,
            CpuModel::Measured { scale, floor, .. } => {
                let spent = started
                    .map(|s| crate::cpu_clock::now().saturating_sub(s).saturating_sub(crate::cpu_clock::overhead()))
                    .unwrap_or_default();
                let sent: Duration = match &wire {
                    Some(w) => effects
                        .iter()
                        .filter_map(|e| match e {
                            Effect::Send { to, msg } if *to != node => Some(w.send(wire_bytes(msg))),
                            _ => None,
                        })
                        .sum(),
                    None => Duration::ZERO,
                };
                wire_cost = received + sent;
                spent.mul_f64(*scale) + *floor + wire_cost
            }
        };
        let broken = if self.config.check_invariants { role.invariants().err() } else { None };
        if let Some(what) = broken {
            self.violate(Some(node), what);
        }
        let n = &mut self.nodes[node.index()];
        n.role = Some(role);
        n.busy_until = now + cost;
        n.busy_ns_total += duration_nanos(cost);
        n.handler_ns_max = n.handler_ns_max.max(duration_nanos(cost));
        n.wire_ns_total += duration_nanos(wire_cost);
        let depart = now + cost;
        if self.nodes[node.index()].crash_mid_write && self.tear_write(node, &mut effects) {
            self.effects = effects;
            return;
        }
        // Write-ahead: what the handler persisted is durable before any other effect of it.
        for effect in &mut effects {
            if let Effect::Persist(p) = effect {
                let p = std::mem::replace(p, Persist::Append(Vec::new()));
                self.nodes[node.index()].stored.apply(p);
            }
        }
        for effect in effects.drain(..) {
            self.apply_effect(node, now, depart, effect);
        }
        self.effects = effects;
    }

    /// [`Fault::CrashMidWrite`]: if the handler persisted anything, only a prefix of it (maybe
    /// nothing) reaches the disk, no other effect happens (write-ahead: its messages had not
    /// left), and the node crashes. Returns whether it did.
    fn tear_write(&mut self, node: NodeId, effects: &mut Vec<Effect<M>>) -> bool {
        let written = effects.iter().filter(|e| matches!(e, Effect::Persist(_))).count();
        if written == 0 {
            return false;
        }
        let survive = self.net_rng.random_range(0..written);
        let persisted = effects.drain(..).filter_map(|e| match e {
            Effect::Persist(p) => Some(p),
            _ => None,
        });
        for p in persisted.take(survive) {
            self.nodes[node.index()].stored.apply(p);
        }
        self.stats.torn_writes += 1;
        self.crash(node);
        true
    }

    /// The node stops: its role, timers and inbox are lost; what it stored stays.
    fn crash(&mut self, id: NodeId) {
        let node = &mut self.nodes[id.index()];
        node.crash_mid_write = false;
        node.paused = false;
        node.held_timers.clear();
        if node.role.take().is_some() {
            node.incarnation += 1;
            node.timers.clear();
            node.due_timers.clear();
            node.inbox.clear();
            node.wake_pending = false;
            node.busy_until = self.now;
        }
    }

    fn apply_effect(&mut self, node: NodeId, now: SimTime, depart: SimTime, effect: Effect<M>) {
        match effect {
            Effect::Send { to, msg } => self.send(node, to, depart, msg),
            Effect::SetTimer { id, after } => {
                self.next_timer_generation += 1;
                let generation = self.next_timer_generation;
                let n = &mut self.nodes[node.index()];
                n.timers.insert(id, generation);
                let incarnation = n.incarnation;
                // `after` is local time; a drifting clock makes it longer or shorter in true time.
                let after = n.clock.true_duration_for_local(after);
                self.queue.push(depart + after, Event::Timer { node, incarnation, id, generation });
            }
            Effect::CancelTimer { id } => {
                self.nodes[node.index()].timers.remove(&id);
            }
            Effect::History(event) => {
                let index = self.history.len() as u64;
                self.history.push(HistoryRecord { index, time: now.as_nanos(), event });
            }
            Effect::Metric { name, value } => {
                *self.metrics.entry(name).or_insert(0) += value;
            }
            // Applied before every other effect of the handler (see `handle`).
            Effect::Persist(_) => {}
        }
    }

    fn send(&mut self, from: NodeId, to: NodeId, depart: SimTime, mut msg: M) {
        self.stats.messages_sent += 1;
        if let Some(c) = self.corruption.as_mut().filter(|c| c.share > 0.0) {
            if c.rng.random_bool(c.share) {
                match corrupt(&msg, &mut c.rng) {
                    Some(m) => {
                        self.stats.corrupted += 1;
                        msg = m;
                    }
                    None => {
                        self.stats.dropped_corrupt += 1;
                        return;
                    }
                }
            }
        }
        let n = self.nodes.len();
        if to.index() >= n {
            self.stats.dropped_unknown_node += 1;
            return;
        }
        let link = from.index() * n + to.index();
        if self.blocked[link] {
            self.stats.dropped_partition += 1;
            return;
        }
        if let Some(r) = &mut self.replay {
            if r.sent.len() == r.capacity {
                r.sent.pop_front();
            }
            r.sent.push_back((from, to, msg.clone()));
        }
        if self.loss > 0.0 && self.net_rng.random_bool(self.loss.clamp(0.0, 1.0)) {
            self.stats.dropped_loss += 1;
            return;
        }
        let duplicate = self.duplicate > 0.0 && self.net_rng.random_bool(self.duplicate.clamp(0.0, 1.0));
        if duplicate {
            self.stats.duplicated += 1;
            let arrival = self.arrival(from, to, depart);
            self.queue.push(arrival, Event::Deliver { to, from, msg: msg.clone() });
        }
        let arrival = self.arrival(from, to, depart);
        self.queue.push(arrival, Event::Deliver { to, from, msg });
    }

    /// When a message leaving `from` at `depart` reaches `to`: matrix delay, jitter, FIFO.
    fn arrival(&mut self, from: NodeId, to: NodeId, depart: SimTime) -> SimTime {
        let base = duration_nanos(self.matrix.one_way(self.nodes[from.index()].region, self.nodes[to.index()].region));
        let jitter = self.config.network.jitter_ratio;
        let delay = if jitter > 0.0 && base > 0 {
            let u: f64 = self.net_rng.random_range(-jitter..=jitter);
            (base as f64 * (1.0 + u)).max(0.0) as u64
        } else {
            base
        };
        let delay = delay.saturating_add(self.nodes[from.index()].slow_ns);
        let mut at = SimTime(depart.as_nanos().saturating_add(delay));
        if !self.config.network.reorder {
            let link = from.index() * self.nodes.len() + to.index();
            at = at.max(self.last_arrival[link]);
            self.last_arrival[link] = at;
        }
        at
    }

    fn apply_fault(&mut self, fault: Fault) {
        self.tracer.fault(self.now, &fault);
        let n = self.nodes.len();
        let valid = |id: NodeId| id.index() < n;
        match fault {
            Fault::Crash(id) if valid(id) => self.crash(id),
            Fault::CrashMidWrite(id) if valid(id) => {
                let node = &mut self.nodes[id.index()];
                node.crash_mid_write = node.role.is_some();
            }
            Fault::Restart(id) if valid(id) => {
                let seed = self.config.seed;
                let node = &mut self.nodes[id.index()];
                // A node that wrote nothing since its CrashMidWrite never crashed: disarm it.
                node.crash_mid_write = false;
                if node.role.is_none() {
                    node.incarnation += 1;
                    node.rng = Rng::seed_from_u64(mix(seed, id.0 as u64, node.incarnation as u64));
                    let mut role = (node.factory)(id);
                    if !node.stored.is_empty() {
                        role.on_recover(&node.stored);
                    } else {
                        role.on_amnesia();
                    }
                    node.role = Some(role);
                    let incarnation = node.incarnation;
                    self.queue.push(self.now, Event::Work { node: id, incarnation, work: Work::Start });
                }
            }
            Fault::Partition(groups) => {
                let mut group_of = vec![None; n];
                for (g, members) in groups.iter().enumerate() {
                    for m in members.iter().filter(|m| valid(**m)) {
                        group_of[m.index()] = Some(g);
                    }
                }
                for from in 0..n {
                    for to in 0..n {
                        if let (Some(a), Some(b)) = (group_of[from], group_of[to]) {
                            if a != b {
                                self.blocked[from * n + to] = true;
                            }
                        }
                    }
                }
            }
            Fault::CutLink { from, to } if valid(from) && valid(to) => {
                self.blocked[from.index() * n + to.index()] = true;
            }
            Fault::HealAll => self.blocked.iter_mut().for_each(|b| *b = false),
            Fault::WipeDisk(id) if valid(id) => self.nodes[id.index()].stored = Stored::default(),
            Fault::ClockStep { node, delta_ns } if valid(node) => {
                self.nodes[node.index()].clock.step_now(delta_ns);
            }
            Fault::SetLoss(p) => self.loss = p.clamp(0.0, 1.0),
            Fault::SetDuplicate(p) => self.duplicate = p.clamp(0.0, 1.0),
            Fault::Replay(count) => self.replay_old(count),
            Fault::Pause(id) if valid(id) => {
                let node = &mut self.nodes[id.index()];
                node.paused = node.role.is_some();
            }
            Fault::Resume(id) if valid(id) => {
                let node = &mut self.nodes[id.index()];
                if node.paused {
                    node.paused = false;
                    let incarnation = node.incarnation;
                    for (timer, generation) in std::mem::take(&mut node.held_timers) {
                        self.queue.push(self.now, Event::Timer { node: id, incarnation, id: timer, generation });
                    }
                    self.schedule_wake_if_needed(id);
                }
            }
            Fault::Slow { node, extra_ns } if valid(node) => self.nodes[node.index()].slow_ns = extra_ns,
            // A fault naming a node that does not exist is ignored (and traced above).
            _ => {}
        }
    }

    /// Delivers `count` messages drawn from the replay buffer again, over their links.
    fn replay_old(&mut self, count: u32) {
        let Some(r) = &mut self.replay else { return };
        if r.sent.is_empty() {
            return;
        }
        let picks: Vec<(NodeId, NodeId, M)> =
            (0..count).map(|_| r.sent[r.rng.random_range(0..r.sent.len())].clone()).collect();
        let n = self.nodes.len();
        for (from, to, msg) in picks {
            if self.blocked[from.index() * n + to.index()] {
                self.stats.dropped_partition += 1;
                continue;
            }
            self.stats.replayed += 1;
            let arrival = self.arrival(from, to, self.now);
            self.queue.push(arrival, Event::Deliver { to, from, msg });
        }
    }

    // ----- observation -----

    /// The client-visible history recorded so far.
    pub fn history(&self) -> &[HistoryRecord] {
        &self.history
    }
    pub fn take_history(&mut self) -> Vec<HistoryRecord> {
        std::mem::take(&mut self.history)
    }
    /// A digest of every handled event (time, node, kind, message bytes) and fault, in order.
    pub fn trace_hash(&self) -> u64 {
        self.tracer.digest()
    }
    pub fn trace_log(&self) -> &[TraceEntry] {
        self.tracer.log()
    }
    pub fn stats(&self) -> &SimStats {
        &self.stats
    }
    /// Counters emitted by roles with `ctx.metric`.
    pub fn metrics(&self) -> &BTreeMap<&'static str, u64> {
        &self.metrics
    }
    pub fn metric(&self, name: &str) -> u64 {
        self.metrics.get(name).copied().unwrap_or(0)
    }
    pub fn pending_events(&self) -> usize {
        self.queue.len()
    }
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }
    pub fn region_of(&self, node: NodeId) -> RegionId {
        self.nodes[node.index()].region
    }
    pub fn matrix(&self) -> &LatencyMatrix {
        &self.matrix
    }
    /// What `node` has made durable.
    pub fn stored(&self, node: NodeId) -> &Stored {
        &self.nodes[node.index()].stored
    }
    pub fn is_up(&self, node: NodeId) -> bool {
        self.nodes[node.index()].role.is_some()
    }
    /// The largest inbox (queue of work waiting for the CPU) the node has had.
    pub fn inbox_len_max(&self, node: NodeId) -> usize {
        self.nodes[node.index()].inbox_len_max
    }
    /// Records every input `node` handles from now on (its start, messages and timers, with
    /// its local clock reading), until it crashes, for [`Sim::replay_alone`]. Keeps a copy of
    /// each message: memory grows with the run.
    pub fn record_inputs(&mut self, node: NodeId) {
        let incarnation = self.nodes[node.index()].incarnation;
        self.recorded = Some(RecordedInputs { node, incarnation, inputs: Vec::new() });
    }

    /// Handles the inputs [`Sim::record_inputs`] recorded again, in order and at the same
    /// local times, on a fresh instance of the node's role (made by its factory, with the
    /// random stream of its first incarnation), and measures each handler's CPU time as the
    /// measured-CPU model does. Nothing else runs between its handlers, so the figure is the
    /// role's cost on a host of its own, without the other simulated nodes (and the
    /// simulator) evicting its data from the caches between its handlers; the run's own
    /// [`Sim::busy_time`] includes that. Effects are dropped after each handler, outside the
    /// measurement (as the run applies them outside it). `None` if nothing was recorded, or
    /// if the recording did not start with the node's first start (a fresh instance could
    /// not follow it).
    pub fn replay_alone(&mut self, node: NodeId) -> Option<AloneCost> {
        let recorded = self.recorded.take().filter(|r| r.node == node && r.incarnation == 0)?;
        if !matches!(recorded.inputs.first(), Some((_, Work::Start))) {
            return None;
        }
        let seed = self.config.seed;
        let n = &mut self.nodes[node.index()];
        let mut role = (n.factory)(node);
        let mut rng = Rng::seed_from_u64(mix(seed, node.0 as u64, 0));
        let mut effects = Vec::new();
        let overhead = crate::cpu_clock::overhead();
        let mut cost = AloneCost::default();
        for (local, work) in recorded.inputs {
            let started = crate::cpu_clock::now();
            {
                let mut ctx = Ctx::new(node, local, &mut rng, &mut effects);
                match work {
                    Work::Start => role.on_start(&mut ctx),
                    Work::Message { from, msg } => role.on_message(&mut ctx, from, msg),
                    Work::Timer(id) => role.on_timer(&mut ctx, id),
                }
            }
            let spent = crate::cpu_clock::now().saturating_sub(started).saturating_sub(overhead);
            effects.clear();
            cost.handlers += 1;
            cost.cpu += spent;
            cost.handler_max = cost.handler_max.max(spent);
        }
        Some(cost)
    }

    /// Total simulated CPU time the node has been busy.
    pub fn busy_time(&self, node: NodeId) -> Duration {
        Duration::from_nanos(self.nodes[node.index()].busy_ns_total)
    }
    /// The CPU time of the node's longest single handler: how long it stalled everything
    /// queued behind it (a copy of its whole state, say).
    pub fn longest_handler(&self, node: NodeId) -> Duration {
        Duration::from_nanos(self.nodes[node.index()].handler_ns_max)
    }
    /// The part of [`Sim::busy_time`] charged for sending and receiving messages (the
    /// measured-CPU model's per-message cost; zero under the other models).
    pub fn wire_time(&self, node: NodeId) -> Duration {
        Duration::from_nanos(self.nodes[node.index()].wire_ns_total)
    }
    /// The node's role, if it is up and of type `T`.
    pub fn role<T: 'static>(&self, node: NodeId) -> Option<&T> {
        self.nodes[node.index()].role.as_deref().and_then(|r| r.as_any().downcast_ref::<T>())
    }
    /// The node's clock model, read at the current true time without jitter.
    pub fn clock(&self, node: NodeId) -> &SimClock {
        &self.nodes[node.index()].clock
    }
}

/// Derives independent seeds for the network and every node from the run's seed.
fn mix(seed: u64, a: u64, b: u64) -> u64 {
    xxhash_rust::xxh3::xxh3_64(&[seed.to_le_bytes(), a.to_le_bytes(), b.to_le_bytes()].concat())
}

/// `msg` encoded, changed at random (see [`Sim::corrupt_messages`]) and decoded again, if it
/// still decodes.
fn corrupt<M: serde::Serialize + serde::de::DeserializeOwned>(msg: &M, rng: &mut Rng) -> Option<M> {
    let mut bytes = postcard::to_allocvec(msg).ok()?;
    match rng.random_range(0..4) {
        0 => bytes.truncate(rng.random_range(0..=bytes.len())),
        1 => bytes.extend((0..rng.random_range(1..8)).map(|_| rng.random::<u8>())),
        _ => {
            for _ in 0..rng.random_range(1..4) {
                if !bytes.is_empty() {
                    let i = rng.random_range(0..bytes.len());
                    // Small values most often: lengths, indexes and enum tags are small.
                    bytes[i] = if rng.random_bool(0.5) { rng.random_range(0..4) } else { rng.random() };
                }
            }
        }
    }
    postcard::from_bytes(&bytes).ok()
}

/// A message's encoded size on the TCP host (postcard), for [`crate::WireCost`].
fn wire_bytes<M: serde::Serialize>(msg: &M) -> usize {
    postcard::experimental::serialized_size(msg).unwrap_or(0)
}
