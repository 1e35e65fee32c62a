//! Runs sans-IO [`KvClient`]s on a real memory backend: one thread per client, several
//! operations in flight per client, real time from the host clock, per-operation latency and a
//! Jepsen history that `kairos_check` verifies.
//!
//! Each client thread loops: invoke operations until `in_flight_per_client` are pending, hand
//! every issued chain to its [`MemoryPort`], feed every completion back through
//! [`KvClient::on_reply`], and call [`KvClient::on_tick`] every [`KvClient::tick_interval`].
//! It stops after `ops_per_client` operations (or `duration`), then waits at most
//! `drain_timeout` for the operations still in flight; those are recorded as unknown (`info`).
//!
//! Clocks: all clients read one monotonic host clock (perfectly shared, as on one CXL host),
//! shifted by a per-client offset ([`DriverConfig::clock_offsets_ns`]) so that the protocols'
//! stale-guess and lock paths run. The local clock starts at [`DriverConfig::local_clock_base_ns`]
//! (default [`LOCAL_CLOCK_BASE_NS`]) so that a negative offset stays positive. Clients of one
//! run may be split over processes ([`DriverConfig::first_client`]); they then count true time
//! from one agreed Unix time ([`DriverConfig::shared_epoch_unix_ns`]), so their clocks agree and
//! their histories merge.
//!
//! History: every operation runs in one of `in_flight_per_client` Jepsen *processes* of its
//! client (`client × 2^32 + slot`), so a process never has two operations open; an operation
//! abandoned after `op_timeout` retires its process (the slot gets a fresh number); events carry real time in ns since the run began
//! (invocation read before `invoke`, completion after the reply that completed it: the
//! recorded interval contains the real one). Keys and values map to integers with
//! [`HistoryCodec`].

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kairos_core::history::{HistoryEvent, HistoryRecord, MicroOp, OpType, ReadValue};
use kairos_core::LocalTime;

use crate::swarm::backend::{BackendError, MemoryBackend, MemoryPort};
use kairos_swarm::client::{KvClient, KvError, KvOp, OpId, OpKind, Outbox, DELETED_VALUE_ID};

/// Local clocks start here (1 s), so offsets down to −1 s keep them positive.
pub const LOCAL_CLOCK_BASE_NS: u64 = 1_000_000_000;
/// Most operations one client may keep in flight.
pub const IN_FLIGHT_PER_CLIENT_MAX: usize = 64;

/// Where a client's operations come from.
pub trait OpSource: Send {
    /// The next operation, or `None` when this client is done.
    fn next_op(&mut self) -> Option<KvOp>;
}

impl<F: FnMut() -> Option<KvOp> + Send> OpSource for F {
    fn next_op(&mut self) -> Option<KvOp> {
        self()
    }
}

/// How keys and values appear in the history (Jepsen registers hold integers).
pub trait HistoryCodec: Sync {
    /// The register a key is.
    fn key(&self, key: &[u8]) -> u64;
    /// The integer a value stands for (values are unique per write in a checked run), or
    /// `None` for the initial value.
    fn value(&self, value: &[u8]) -> Option<u64>;
}

/// Keys and values whose first 8 bytes are a little-endian integer (shorter ones are
/// zero-padded); value 0 is the initial value.
#[derive(Clone, Copy, Debug, Default)]
pub struct LeU64Codec;

impl HistoryCodec for LeU64Codec {
    fn key(&self, key: &[u8]) -> u64 {
        le_u64(key)
    }
    fn value(&self, value: &[u8]) -> Option<u64> {
        Some(le_u64(value)).filter(|v| *v != 0)
    }
}

fn le_u64(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    let n = b.len().min(8);
    w[..n].copy_from_slice(&b[..n]);
    u64::from_le_bytes(w)
}

/// How a run goes.
#[derive(Clone, Debug)]
pub struct DriverConfig {
    /// Operations each client invokes (then it stops).
    pub ops_per_client: u64,
    /// Operations each client keeps in flight (1..=IN_FLIGHT_PER_CLIENT_MAX).
    pub in_flight_per_client: usize,
    /// Stop invoking after this long even if operations remain.
    pub duration: Option<Duration>,
    /// After invoking stops, wait this long for the operations in flight.
    pub drain_timeout: Duration,
    /// An operation pending this long is abandoned: recorded as unknown (`info`), and its
    /// history process is retired (a later completion of it is ignored).
    pub op_timeout: Duration,
    /// Offset of each client's clock from the shared host clock, ns, by client number (missing = 0).
    pub clock_offsets_ns: Vec<i64>,
    /// Record the history (costs memory and a little time per operation).
    pub record_history: bool,
    /// Local clocks read true time plus this (plus the client's offset), ns.
    pub local_clock_base_ns: u64,
    /// The first client's number (clients of one run split over several processes each take
    /// their own range).
    pub first_client: u32,
    /// Count true time from this Unix time (ns) instead of from this process's start, so that
    /// processes sharing a run share one time line (histories merge, clocks agree).
    pub shared_epoch_unix_ns: Option<u64>,
}

impl Default for DriverConfig {
    fn default() -> Self {
        DriverConfig {
            ops_per_client: 1000,
            in_flight_per_client: 1,
            duration: None,
            drain_timeout: Duration::from_secs(2),
            op_timeout: Duration::from_secs(5),
            clock_offsets_ns: Vec::new(),
            record_history: true,
            local_clock_base_ns: LOCAL_CLOCK_BASE_NS,
            first_client: 0,
            shared_epoch_unix_ns: None,
        }
    }
}

/// What a run measured.
#[derive(Clone, Debug, Default)]
pub struct DriverReport {
    pub clients: usize,
    /// Operations that completed with `Ok`.
    pub ok: u64,
    /// Operations that certainly did not take effect.
    pub failed: u64,
    /// Operations whose effect is unknown (timeouts, unavailability, still in flight at the end).
    pub unknown: u64,
    /// Latency of each successful operation by kind, ns, sorted.
    pub latency_ns: BTreeMap<OpKind, Vec<u64>>,
    /// Round trips on the critical path → operations, by kind of operation.
    pub round_trips: BTreeMap<OpKind, BTreeMap<u32, u64>>,
    /// Errors by message → count.
    pub errors: BTreeMap<String, u64>,
    /// Chains the backend refused to take (counted, then left to the client's timeouts).
    pub submit_errors: u64,
    /// The clients' counters, summed (`*_max` counters: the maximum).
    pub counters: BTreeMap<&'static str, u64>,
    /// Wall time from the first invocation to the last client stopping.
    pub wall: Duration,
    /// The history, ordered by time (empty unless recorded).
    pub history: Vec<HistoryRecord>,
}

impl DriverReport {
    /// The `q` quantile (0..=1) of kind `kind`'s latency in µs, if any operation of it succeeded.
    pub fn latency_us(&self, kind: OpKind, q: f64) -> Option<f64> {
        let v = self.latency_ns.get(&kind)?;
        if v.is_empty() {
            return None;
        }
        let i = ((v.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
        Some(v[i] as f64 / 1_000.0)
    }

    /// Successful operations per second of wall time.
    pub fn throughput_ops_per_s(&self) -> f64 {
        let s = self.wall.as_secs_f64();
        if s > 0.0 {
            self.ok as f64 / s
        } else {
            0.0
        }
    }

    fn absorb(&mut self, other: ClientOutcome) {
        self.ok += other.ok;
        self.failed += other.failed;
        self.unknown += other.unknown;
        for (k, mut v) in other.latency_ns {
            self.latency_ns.entry(k).or_default().append(&mut v);
        }
        for (k, h) in other.round_trips {
            for (n, c) in h {
                *self.round_trips.entry(k).or_default().entry(n).or_default() += c;
            }
        }
        for (k, v) in other.errors {
            *self.errors.entry(k).or_default() += v;
        }
        for (k, v) in other.counters {
            let e = self.counters.entry(k).or_default();
            *e = if k.ends_with("_max") { (*e).max(v) } else { *e + v };
        }
        self.submit_errors += other.submit_errors;
    }
}

#[derive(Default)]
struct ClientOutcome {
    ok: u64,
    failed: u64,
    unknown: u64,
    latency_ns: BTreeMap<OpKind, Vec<u64>>,
    round_trips: BTreeMap<OpKind, BTreeMap<u32, u64>>,
    errors: BTreeMap<String, u64>,
    counters: Vec<(&'static str, u64)>,
    submit_errors: u64,
    /// (time ns, event), in this client's order.
    events: Vec<(u64, HistoryEvent)>,
}

/// Where true time counts from.
#[derive(Clone, Copy, Debug)]
enum Epoch {
    /// This process's monotonic clock when the run began.
    Local(Instant),
    /// A Unix time in ns that several processes agreed on (they share the system clock).
    Unix(u64),
}

/// The host clock as the driver reads it.
#[derive(Clone, Copy, Debug)]
struct HostClock {
    epoch: Epoch,
    base_ns: u64,
    offset_ns: i64,
}

impl HostClock {
    /// True time: ns since the epoch.
    #[allow(clippy::disallowed_methods)] // the driver is a host: it reads the real clock
    fn true_ns(&self) -> u64 {
        match self.epoch {
            Epoch::Local(at) => at.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64,
            Epoch::Unix(at) => unix_now_ns().saturating_sub(at),
        }
    }

    fn local(&self, true_ns: u64) -> LocalTime {
        LocalTime(true_ns.saturating_add(self.base_ns).saturating_add_signed(self.offset_ns))
    }
}

/// The system clock in ns since the Unix epoch (shared by every process on the host).
#[allow(clippy::disallowed_methods)] // host code: processes that share a run agree on this clock
pub fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos().min(u128::from(u64::MAX)) as u64)
}

/// Runs one thread per client until every client is done, and merges what they saw.
/// `clients[i]` is client `config.first_client + i` (its port, clock offset, history processes).
pub fn run<C: KvClient + Send>(
    backend: &dyn MemoryBackend,
    clients: Vec<(C, Box<dyn OpSource>)>,
    codec: &dyn HistoryCodec,
    config: &DriverConfig,
) -> Result<DriverReport, BackendError> {
    if config.in_flight_per_client == 0 || config.in_flight_per_client > IN_FLIGHT_PER_CLIENT_MAX {
        return Err(BackendError::Config(format!(
            "{} operations in flight per client: use 1 to {IN_FLIGHT_PER_CLIENT_MAX}",
            config.in_flight_per_client
        )));
    }
    if config.drain_timeout > Duration::from_secs(600) {
        return Err(BackendError::Config("drain timeout over 10 minutes: use a shorter one".into()));
    }
    let first = config.first_client;
    let ports = (0..clients.len())
        .map(|i| backend.connect(first + i as u32))
        .collect::<Result<Vec<Box<dyn MemoryPort>>, _>>()?;
    #[allow(clippy::disallowed_methods)] // the driver is a host: it reads the real clock
    let epoch = match config.shared_epoch_unix_ns {
        Some(at) => Epoch::Unix(at),
        None => Epoch::Local(Instant::now()),
    };
    let start_ns = HostClock { epoch, base_ns: 0, offset_ns: 0 }.true_ns();
    let n = clients.len();
    let outcomes: Vec<ClientOutcome> = std::thread::scope(|s| {
        let handles: Vec<_> = clients
            .into_iter()
            .zip(ports)
            .enumerate()
            .map(|(i, ((client, ops), port))| {
                let id = u64::from(first) + i as u64;
                let offset_ns = config.clock_offsets_ns.get(id as usize).copied().unwrap_or(0);
                let clock = HostClock { epoch, base_ns: config.local_clock_base_ns, offset_ns };
                std::thread::Builder::new()
                    .name(format!("swarm-client-{i}"))
                    .spawn_scoped(s, move || run_client(id, client, ops, port, clock, codec, config))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|_| {
                    let mut o = ClientOutcome::default();
                    *o.errors.entry("client thread panicked".into()).or_default() += 1;
                    o
                }),
                Err(e) => {
                    let mut o = ClientOutcome::default();
                    *o.errors.entry(format!("cannot start a client thread: {e}")).or_default() += 1;
                    o
                }
            })
            .collect()
    });
    let wall = HostClock { epoch, base_ns: 0, offset_ns: 0 }.true_ns().saturating_sub(start_ns);
    let mut report = DriverReport { clients: n, wall: Duration::from_nanos(wall), ..Default::default() };
    let mut events = Vec::new();
    for mut o in outcomes {
        events.append(&mut o.events);
        report.absorb(o);
    }
    for v in report.latency_ns.values_mut() {
        v.sort_unstable();
    }
    // Each client's events are in time order; a stable sort by time keeps that order on ties.
    events.sort_by_key(|(t, _)| *t);
    report.history = events
        .into_iter()
        .enumerate()
        .map(|(i, (time, event))| HistoryRecord { index: i as u64, time, event })
        .collect();
    Ok(report)
}

struct Pending {
    op: KvOp,
    slot: u64,
    invoked_ns: u64,
}

fn history_invoke(codec: &dyn HistoryCodec, op: &KvOp) -> (&'static str, Vec<MicroOp>) {
    let key = codec.key(op.key());
    match op {
        KvOp::Get { .. } => ("read", vec![MicroOp::Read { key, value: None }]),
        KvOp::Update { value, .. } | KvOp::Insert { value, .. } => {
            ("write", vec![MicroOp::Write { key, value: codec.value(value).unwrap_or(0) }])
        }
        // A delete makes the key unusable; as a register it is a write of a value that only a
        // get reporting the deletion reads.
        KvOp::Delete { .. } => ("write", vec![MicroOp::Write { key, value: DELETED_VALUE_ID }]),
    }
}

fn run_client<C: KvClient>(
    id: u64,
    mut client: C,
    mut ops: Box<dyn OpSource>,
    mut port: Box<dyn MemoryPort>,
    clock: HostClock,
    codec: &dyn HistoryCodec,
    config: &DriverConfig,
) -> ClientOutcome {
    let n = config.in_flight_per_client;
    let mut out = ClientOutcome::default();
    let mut outbox = Outbox::new();
    let mut pending: BTreeMap<OpId, Pending> = BTreeMap::new();
    let mut free_slots: Vec<u64> = (0..n as u64).rev().map(|s| (id << 32) | s).collect();
    let mut next_slot = n as u64;
    let op_timeout_ns = config.op_timeout.as_nanos().min(u128::from(u64::MAX)) as u64;
    let mut next_op: OpId = 0;
    let mut invoked = 0u64;
    let mut source_done = false;
    // The client may shorten its tick once it has measured round trips (see `kairos_swarm::hedge`).
    let tick_ns = |client: &C| {
        client.tick_interval().clamp(Duration::from_micros(10), Duration::from_millis(100)).as_nanos() as u64
    };
    let mut next_tick_ns = clock.true_ns() + tick_ns(&client);
    let stop_invoking_ns = config.duration.map(|d| d.as_nanos().min(u128::from(u64::MAX)) as u64);
    let mut drain_deadline_ns: Option<u64> = None;

    loop {
        let mut now_ns = clock.true_ns();
        // Invoke until the window is full.
        let may_invoke = !source_done
            && invoked < config.ops_per_client
            && stop_invoking_ns.is_none_or(|stop| now_ns < stop)
            && drain_deadline_ns.is_none();
        if may_invoke {
            while pending.len() < n && invoked < config.ops_per_client {
                let Some(op) = ops.next_op() else {
                    source_done = true;
                    break;
                };
                let Some(slot) = free_slots.pop() else { break };
                let op_id = next_op;
                next_op += 1;
                invoked += 1;
                now_ns = clock.true_ns();
                if config.record_history {
                    let (f, value) = history_invoke(codec, &op);
                    out.events.push((now_ns, HistoryEvent::new(OpType::Invoke, slot, f, value)));
                }
                pending.insert(op_id, Pending { op: op.clone(), slot, invoked_ns: now_ns });
                client.invoke(op_id, op, clock.local(now_ns), &mut outbox);
                flush(&mut outbox, port.as_mut(), &mut pending, &mut free_slots, &mut out, clock, codec, config);
            }
        } else if drain_deadline_ns.is_none() {
            drain_deadline_ns = Some(now_ns + config.drain_timeout.as_nanos() as u64);
        }
        if pending.is_empty() && drain_deadline_ns.is_some() {
            break;
        }
        if drain_deadline_ns.is_some_and(|d| now_ns >= d) {
            break;
        }
        // Take every completion that is ready; if none, wait until the next tick. The clock is
        // read once per batch and the batch's replies are handled as of then (on shared memory
        // every one was there before; on a socket one may be a few microseconds younger): a
        // clock read costs about as much as handling a reply, and an operation that waits for
        // several replies would pay it once per reply inside its latency. Completions are
        // still timestamped after the reply that completed them (`flush`).
        let mut got_any = false;
        let mut batch_ns = None;
        while let Some(c) = port.poll(Duration::ZERO) {
            got_any = true;
            let reply_ns = *batch_ns.get_or_insert_with(|| clock.true_ns());
            client.on_reply(c.tag, c.result, clock.local(reply_ns), &mut outbox);
            flush(&mut outbox, port.as_mut(), &mut pending, &mut free_slots, &mut out, clock, codec, config);
        }
        now_ns = clock.true_ns();
        if now_ns >= next_tick_ns {
            // Abandon operations pending too long (their ids are in invocation order).
            while pending.first_key_value().is_some_and(|(_, p)| now_ns.saturating_sub(p.invoked_ns) >= op_timeout_ns) {
                let Some((_, p)) = pending.pop_first() else { break };
                out.unknown += 1;
                *out.errors.entry("abandoned after the driver's operation timeout".into()).or_default() += 1;
                if config.record_history {
                    let (f, value) = history_invoke(codec, &p.op);
                    out.events.push((now_ns, HistoryEvent::new(OpType::Info, p.slot, f, value)));
                }
                free_slots.push((id << 32) | next_slot);
                next_slot += 1;
            }
            client.on_tick(clock.local(now_ns), &mut outbox);
            flush(&mut outbox, port.as_mut(), &mut pending, &mut free_slots, &mut out, clock, codec, config);
            next_tick_ns = now_ns + tick_ns(&client);
        } else {
            let window_open = pending.len() < n && may_invoke;
            if got_any || window_open {
                continue;
            }
            if let Some(c) = port.poll(Duration::from_nanos(next_tick_ns - now_ns)) {
                client.on_reply(c.tag, c.result, clock.local(clock.true_ns()), &mut outbox);
                flush(&mut outbox, port.as_mut(), &mut pending, &mut free_slots, &mut out, clock, codec, config);
            }
        }
    }
    // Whatever is still in flight has an unknown outcome.
    let end_ns = clock.true_ns();
    for (_, p) in std::mem::take(&mut pending) {
        out.unknown += 1;
        *out.errors.entry("still in flight when the run ended".into()).or_default() += 1;
        if config.record_history {
            let (f, value) = history_invoke(codec, &p.op);
            out.events.push((end_ns, HistoryEvent::new(OpType::Info, p.slot, f, value)));
        }
    }
    out.counters = client.counters();
    out
}

/// Submits the chains the client issued and records the operations it completed.
#[allow(clippy::too_many_arguments)]
fn flush(
    outbox: &mut Outbox,
    port: &mut dyn MemoryPort,
    pending: &mut BTreeMap<OpId, Pending>,
    free_slots: &mut Vec<u64>,
    out: &mut ClientOutcome,
    clock: HostClock,
    codec: &dyn HistoryCodec,
    config: &DriverConfig,
) {
    // Operations complete when the client says so, before the chains it issued with the
    // completion run: those are other operations' rounds and background work (the VERIFIED
    // flip, the in-place refresh), which a shared-memory port executes inside `submit`. The
    // paper measures latency to the linearization point too.
    let now_ns = (!outbox.completions.is_empty()).then(|| clock.true_ns());
    for issue in outbox.issues.drain(..) {
        if let Err(e) = port.submit(issue.tag, issue.chain) {
            out.submit_errors += 1;
            *out.errors.entry(format!("backend refused a chain: {e}")).or_default() += 1;
        }
    }
    let Some(now_ns) = now_ns else { return };
    for c in outbox.completions.drain(..) {
        let Some(p) = pending.remove(&c.op_id) else {
            *out.errors.entry("completion of an unknown operation".into()).or_default() += 1;
            continue;
        };
        free_slots.push(p.slot);
        let (f, mut value) = history_invoke(codec, &p.op);
        let op_type = match &c.result {
            Ok(got) => {
                out.ok += 1;
                out.latency_ns.entry(p.op.kind()).or_default().push(now_ns.saturating_sub(p.invoked_ns));
                *out.round_trips.entry(p.op.kind()).or_default().entry(c.round_trips).or_default() += 1;
                if let (Some(MicroOp::Read { value: v, .. }), Some(bytes)) = (value.first_mut(), got) {
                    *v = codec.value(bytes).map(ReadValue::Int);
                }
                OpType::Ok
            }
            Err(KvError::Deleted) if matches!(p.op, KvOp::Get { .. }) => {
                *out.errors.entry(KvError::Deleted.to_string()).or_default() += 1;
                if let Some(MicroOp::Read { value: v, .. }) = value.first_mut() {
                    *v = Some(ReadValue::Int(DELETED_VALUE_ID));
                }
                OpType::Ok
            }
            Err(e) => {
                *out.errors.entry(e.to_string()).or_default() += 1;
                if e.is_unknown_outcome() && !matches!(p.op, KvOp::Get { .. }) {
                    out.unknown += 1;
                    OpType::Info
                } else {
                    out.failed += 1;
                    OpType::Fail
                }
            }
        };
        if config.record_history {
            out.events.push((now_ns, HistoryEvent::new(op_type, p.slot, f, value)));
        }
    }
}
