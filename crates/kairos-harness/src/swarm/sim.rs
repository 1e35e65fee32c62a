//! SWARM's simulated runs ([`SwarmRun`]): deployment, load, warm-up, measured phase and what
//! it produced.
//!
//! Memory nodes ([`MemoryNode`]) and client machines ([`ClientNode`]) are `kairos-sim`
//! processes on one rack: one-way delay 0.7 µs ± jitter, FIFO per (client, node) link,
//! per-client clock offset and drift. The load phase writes every key straight into the node
//! images; the warm-up runs through the real clients on the synchronous [`DirectMemory`]
//! backend (cheap, not recorded except for each key's final value, written to the history as
//! one synthetic write so the checker knows the starting state).
//!
//! [`SwarmRun::adversary`] adds the adversarial scheduler ([`Adversary`]): one client's chains
//! stalled between two of their verbs for up to ~1 000 round trips, a client paused, a client
//! crashed while issuing a chain of any round — the races of chains that are ordered but not
//! atomic, which 10–100 ns pauses between verbs never reach. Every choice comes from the seed.

use kairos_clock::{SimClock, SIM_EPOCH_NS};
use kairos_core::history::{HistoryEvent, HistoryRecord, MicroOp, OpType};
use kairos_core::{LatencyMatrix, LocalTime, NodeId, RegionId, SimTime};
use kairos_sim::{Fault, Sim, SimConfig};
use kairos_swarm::client::{KvOp, OpKind};
use kairos_swarm::direct::DirectMemory;
use kairos_swarm::engine::{Client, ClientConfig, Protocol, UnsafeSwitch};
use kairos_swarm::index;
use kairos_swarm::layout::{Layout, LayoutConfig};
use kairos_swarm::sim::client_node::{self, ClientNode};
use kairos_swarm::sim::memory_node::MemoryNode;
use kairos_swarm::sim::SwarmMsg;
use kairos_swarm::verbs::MemoryImage;
use kairos_workload::ycsb::{self, Workload, Ycsb};
use rand::{Rng as _, SeedableRng};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// The adversarial scheduler: what the simulator does to clients between (and inside) their
/// chains, on top of network jitter and verb interleaving. Every choice it makes at run time
/// comes from the simulator's seeded generators.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Adversary {
    /// This client's chains are each, with probability `stall_chain_p`, stalled between two of
    /// their verbs (after a uniformly drawn prefix) for up to `stall_max` — a descheduled thread
    /// or a slow NIC. The connection stalls with it (later chains on it wait; FIFO).
    pub stall_client: Option<u32>,
    pub stall_chain_p: f64,
    pub stall_max: Duration,
    /// `(client, at, for)`: the client stops reacting (replies and timers wait) from `at` after
    /// its start for `for`, by its own clock.
    pub pause_client: Option<(u32, Duration, Duration)>,
    /// `(client, n)`: the client crashes while issuing its `n`-th chain of the measured phase
    /// (any round: write, lock, rewrite, read, write-back), leaving a random prefix of every
    /// chain of that batch applied.
    pub crash_client_at_chain: Option<(u32, u64)>,
}

impl Adversary {
    /// A seeded draw for randomized campaigns (each part present about half the time): chain
    /// stalls of up to 1.5 ms (~1 000 round trips), a client paused for up to 1 ms, a client
    /// crashed mid-chain within its first `chains_max` chains.
    pub fn draw(rng: &mut impl rand::Rng, clients: u32, chains_max: u64) -> Adversary {
        let clients = clients.max(1);
        Adversary {
            stall_client: rng.random_bool(0.6).then(|| rng.random_range(0..clients)),
            stall_chain_p: rng.random_range(0.01..0.3),
            stall_max: Duration::from_nanos(rng.random_range(1_000..=1_500_000)),
            pause_client: rng.random_bool(0.4).then(|| {
                let at = Duration::from_nanos(rng.random_range(0..=300_000));
                (rng.random_range(0..clients), at, Duration::from_nanos(rng.random_range(1_000..=1_000_000)))
            }),
            crash_client_at_chain: rng
                .random_bool(0.4)
                .then(|| (rng.random_range(0..clients), rng.random_range(1..=chains_max.max(1)))),
        }
    }
}

/// One simulated run.
#[derive(Clone, Debug)]
pub struct SwarmRun {
    pub protocol: Protocol,
    pub workload: Workload,
    pub clients: u32,
    /// Measured operations per client.
    pub ops: u64,
    /// Operations in flight per client.
    pub inflight: usize,
    pub keys: u64,
    pub key_size: u32,
    pub value_size: u32,
    pub replicas: u32,
    /// Warm-up operations (all clients together), run cheaply and not measured.
    pub warmup: u64,
    /// Each client's clock offset is uniform in `[0, clock_offset_max]`.
    pub clock_offset_max: Duration,
    /// Each client's clock drift is uniform in `±clock_drift_ppm_max`.
    pub clock_drift_ppm_max: i64,
    /// Every operation targets key 0.
    pub single_key_contention: bool,
    /// Crash memory node `n` at true time `t` after the start of the measured phase.
    pub crash_node_at: Option<(u32, Duration)>,
    /// Client `i` crashes after issuing `n` operations, leaving prefixes of its chains applied.
    pub crash_client_after: Option<(u32, u64)>,
    pub one_way: Duration,
    pub jitter_ratio: f64,
    /// Longest pause between two verb pieces on a memory node (interleaving granularity).
    pub piece_ns_max: u64,
    pub seed: u64,
    /// Check the history for linearizability (per key). [`SwarmRun::run`] only records it; the
    /// harness (`kairos_harness::swarm::run`) runs and checks.
    pub check: bool,
    pub unsafe_switch: UnsafeSwitch,
    /// Reuse retired buffers (off: every write takes a fresh buffer, to measure what recycling saves).
    pub recycling: bool,
    /// Stalls and crashes of clients mid-chain (none by default).
    pub adversary: Adversary,
    /// Keys beyond `keys`, not loaded: created during the run by their owner while every
    /// client reads and updates them ([`client_node::FreshKeys`]). 0 by default.
    pub fresh_keys: u64,
    /// Per mille of the operations on fresh keys that delete the key (any client may, racing
    /// its creation, updates and reads: a deleted key stays deleted). 0 by default.
    pub deletes_per_mille: u32,
    /// Share of the messages whose encoding the simulator changes ([`Sim::corrupt_messages`]:
    /// a Byzantine network, for tests that nothing panics; leave `check` off). 0 by default.
    pub corrupt_messages: f64,
}

/// Under corrupted messages a changed verb can leave garbage on a memory node that every later
/// operation on its key spins on, round after round, until its timeout (FUSEE campaign seed 6
/// at 0.1: 137 operations timed out after 50 ms each, 50 s of wall time for one seed). Only
/// panics are judged there, so operations give up after `CORRUPT_OP_TIMEOUT` (above the
/// adversary's longest stall, 1.5 ms) and a run ends after `CORRUPT_RUN_MAX` of virtual time
/// (clean campaign runs of SWARM-KV and DM-ABD take 3-4 ms, median of 300 seeds, and at most
/// 115 ms; FUSEE's 7 ms and up to 6 s, as its operations wait out stalled chains).
const CORRUPT_OP_TIMEOUT: Duration = Duration::from_millis(2);
const CORRUPT_RUN_MAX: Duration = Duration::from_secs(1);

impl Default for SwarmRun {
    /// The paper's defaults (YCSB B, 100 000 keys of 24 B, 64 B values, 3 replicas, 4 clients),
    /// with a shorter warm-up and run than the paper's 1 M operations.
    fn default() -> Self {
        SwarmRun {
            protocol: Protocol::SwarmKv,
            workload: Workload::YcsbB,
            clients: 4,
            ops: 10_000,
            inflight: 1,
            keys: 100_000,
            key_size: 24,
            value_size: 64,
            replicas: 3,
            warmup: 100_000,
            clock_offset_max: Duration::from_micros(1),
            clock_drift_ppm_max: 10,
            single_key_contention: false,
            crash_node_at: None,
            crash_client_after: None,
            one_way: Duration::from_nanos(700),
            jitter_ratio: 0.1,
            piece_ns_max: 10,
            seed: 1,
            check: true,
            unsafe_switch: UnsafeSwitch::Off,
            recycling: true,
            adversary: Adversary::default(),
            fresh_keys: 0,
            deletes_per_mille: 0,
            corrupt_messages: 0.0,
        }
    }
}

/// Percentiles of a sample, in microseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LatencyUs {
    pub count: u64,
    pub p1: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl LatencyUs {
    pub fn of(mut ns: Vec<u64>) -> LatencyUs {
        if ns.is_empty() {
            return LatencyUs::default();
        }
        ns.sort_unstable();
        let at = |q: f64| ns[((ns.len() - 1) as f64 * q).round() as usize] as f64 / 1e3;
        LatencyUs { count: ns.len() as u64, p1: at(0.01), p50: at(0.5), p90: at(0.9), p99: at(0.99), max: at(1.0) }
    }
}

/// What a run produced.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub history: Vec<HistoryRecord>,
    /// Latency per operation type (true time, invocation to completion).
    pub latency_us: BTreeMap<OpKind, LatencyUs>,
    /// Round trips per operation type: `round trips → count`.
    pub round_trips: BTreeMap<OpKind, BTreeMap<u32, u64>>,
    /// Node memory per key the layout allocates (all nodes).
    pub memory_bytes_per_key: f64,
    /// Memory per key actually touched: the pages memory nodes ever wrote (zeroed memory is
    /// allocated on first write), all nodes.
    pub memory_bytes_per_key_used: f64,
    /// The same by region of the layout ([`Layout::regions`]); empty where not measured.
    pub memory_bytes_per_key_by_region: BTreeMap<&'static str, f64>,
    /// Client counters summed (maxima for `*_max`).
    pub metrics: BTreeMap<String, u64>,
    pub errors: BTreeMap<String, u64>,
    pub completed: u64,
    /// True time of the measured phase.
    pub duration: Duration,
    /// `Some(valid)` if checked (by the harness) and decided; `None` if not checked, or if some
    /// key could not be decided (then `check_report` says which).
    pub linearizable: Option<bool>,
    pub check_report: String,
    pub checked_keys: usize,
    pub trace_hash: u64,
    /// The value id each key held after the warm-up (the checker's initial values).
    pub initial_values: BTreeMap<u64, u64>,
}

impl Outcome {
    /// Share of operations of `kind` that took exactly `n` round trips.
    pub fn share(&self, kind: OpKind, n: u32) -> f64 {
        let Some(h) = self.round_trips.get(&kind) else { return 0.0 };
        let total: u64 = h.values().sum();
        if total == 0 {
            return 0.0;
        }
        *h.get(&n).unwrap_or(&0) as f64 / total as f64
    }
    pub fn throughput_ops_per_s(&self) -> f64 {
        self.completed as f64 / self.duration.as_secs_f64().max(1e-9)
    }

    /// The history as the checker sees it: the warm-up's final value of every key first, as one
    /// completed write at time 0 by a loader process, then the measured phase. This is the
    /// history to save: `kairos check --model linearizable` on it judges the run as
    /// `kairos_harness::swarm::check_per_key` does (without the initial writes, reads of warm-up values look like
    /// reads of values never written).
    pub fn history_with_initial_values(&self) -> Vec<HistoryRecord> {
        let mut h = initial_writes(self.initial_values.iter().map(|(k, v)| (*k, *v)));
        for r in &self.history {
            h.push(HistoryRecord { index: h.len() as u64, time: r.time, event: r.event.clone() });
        }
        h
    }
}

/// One completed write at time 0 per `(key, value id)`, by the loader process.
pub fn initial_writes(values: impl IntoIterator<Item = (u64, u64)>) -> Vec<HistoryRecord> {
    let mut h = Vec::new();
    for (key, v) in values {
        for t in [OpType::Invoke, OpType::Ok] {
            let ev = HistoryEvent::new(t, LOADER_PROCESS, "write", vec![MicroOp::Write { key, value: v }]);
            h.push(HistoryRecord { index: h.len() as u64, time: 0, event: ev });
        }
    }
    h
}

/// Node images, clients and warm-up values after [`SwarmRun::load_and_warm_up`].
pub struct Warmed {
    pub ycsb: Ycsb,
    pub images: Vec<MemoryImage>,
    pub clients: Vec<Client>,
    /// The last value id the warm-up wrote per key (the checker's initial values).
    pub last_value: BTreeMap<u64, u64>,
    /// Local time when the warm-up ended.
    pub warmed_at: LocalTime,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    Layout(#[from] kairos_swarm::layout::LayoutError),
    #[error("{0}")]
    Ycsb(#[from] kairos_workload::ycsb::YcsbError),
    #[error("load phase: {0}")]
    Load(kairos_swarm::client::KvError),
    #[error("bad run: {0}")]
    Bad(String),
}

/// The history's key for a key number, and the synthetic "loader" process.
const LOADER_PROCESS: u64 = u64::MAX >> 1;

impl SwarmRun {
    /// A randomized deployment for swarm testing, all of it drawn from `seed`: 2–6 clients
    /// (`hard`: 4–8 on one key, shorter runs), 1–6 keys, value size, operations in flight,
    /// clock skew and drift, a memory-node crash or a client crash about a third of the time
    /// each, the adversarial scheduler ([`Adversary::draw`]), and about half the time 1–3 keys
    /// created during the run (drawn last, so the other draws are those of the seeds found
    /// before key creation joined the campaigns). `protocol`: the one to run,
    /// or `None` to draw it too (SWARM-KV four times in five, else DM-ABD). The draw is the
    /// same whichever is given, so a seed means one deployment.
    pub fn draw(seed: u64, hard: bool, protocol: Option<Protocol>) -> SwarmRun {
        use rand::{Rng, SeedableRng};
        let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let clients = if hard { r.random_range(4..=8) } else { r.random_range(2..=6) };
        let ops = if hard { r.random_range(20..=40) } else { r.random_range(50..=150) };
        let drawn = if r.random_bool(0.8) { Protocol::SwarmKv } else { Protocol::DmAbd };
        SwarmRun {
            protocol: protocol.unwrap_or(drawn),
            workload: if r.random_bool(0.5) { Workload::YcsbA } else { Workload::YcsbB },
            clients,
            ops,
            inflight: r.random_range(1..=2),
            keys: if hard { 1 } else { r.random_range(1..=6) },
            value_size: [8, 64, 512][r.random_range(0..3)],
            warmup: r.random_range(0..200),
            clock_offset_max: Duration::from_nanos(r.random_range(0..=1_000_000)),
            clock_drift_ppm_max: r.random_range(0..=100),
            crash_node_at: r
                .random_bool(0.3)
                .then(|| (r.random_range(0..3), Duration::from_micros(r.random_range(5..200)))),
            crash_client_after: r.random_bool(0.3).then(|| (r.random_range(0..clients), r.random_range(1..ops))),
            piece_ns_max: r.random_range(1..=100),
            adversary: Adversary::draw(&mut r, clients, ops * 3),
            fresh_keys: if r.random_bool(0.5) { r.random_range(1..=3) } else { 0 },
            // Drawn after everything else, so every other draw is the one the seeds found
            // before deletes joined the campaigns had.
            deletes_per_mille: if r.random_bool(0.5) { 30 } else { 0 },
            seed,
            ..SwarmRun::default()
        }
    }

    pub fn layout(&self) -> Result<Layout, RunError> {
        let cfg = LayoutConfig {
            keys: self.keys + self.fresh_keys,
            key_size: self.key_size,
            value_size: self.value_size.max(8),
            replicas: self.replicas,
            memory_nodes: self.replicas,
            writers: self.clients,
            buffers_per_writer: 0,
        }
        .with_default_buffers();
        let mut cfg = cfg;
        if !self.recycling {
            // Room for every write of the run (and the warm-up) in fresh buffers.
            let writes = self.ops * u64::from(self.clients) + self.warmup;
            let per_writer = (self.keys + writes).div_ceil(u64::from(self.clients.max(1))) + 4096;
            cfg.buffers_per_writer = per_writer.min(u64::from(kairos_swarm::layout::BUFFERS_PER_WRITER_MAX)) as u32;
        }
        Ok(Layout::new(cfg)?)
    }

    /// Loads every key into fresh node images, makes the clients (each configured by
    /// `configure` after the run's own settings), and runs the warm-up through them on the
    /// direct backend. Deterministic from the seed, so every backend starts from the same
    /// memory, clients and warm-up values. The warm-up starts 1 ms after `ts_epoch`.
    pub fn load_and_warm_up(
        &self,
        layout: &Layout,
        ts_epoch: LocalTime,
        configure: impl Fn(&mut ClientConfig),
    ) -> Result<Warmed, RunError> {
        if self.clients == 0 || self.inflight == 0 {
            return Err(RunError::Bad("need at least one client and one operation in flight".into()));
        }
        let ycsb = Ycsb::new(self.workload, self.keys, self.key_size)?;
        let value_size = layout.config.value_size;
        // Load: every key gets an initial value (value id 0 stands for "initial" = nil).
        let mut images: Vec<MemoryImage> =
            (0..layout.config.memory_nodes).map(|_| MemoryImage::new(layout.node_bytes())).collect();
        let keys = (0..self.keys).map(|k| (ycsb.key_bytes(k), ycsb::value_bytes(0, value_size)));
        let load = index::bulk_load(layout, self.protocol, &mut images, keys, 1).map_err(RunError::Load)?;
        let mut clients: Vec<Client> = (0..self.clients)
            .map(|w| {
                let mut cfg = ClientConfig::new(self.protocol, w, layout.clone(), ts_epoch);
                cfg.unsafe_switch = self.unsafe_switch;
                cfg.inflight_max = self.inflight.max(1) * 2;
                configure(&mut cfg);
                let mut c = Client::new(cfg);
                c.absorb_load(&load);
                c
            })
            .collect();
        let mut direct = DirectMemory::new(images);
        let mut warm_rng = rand_chacha::ChaCha8Rng::seed_from_u64(self.seed ^ 0x7761_726d);
        let mut now = LocalTime(ts_epoch.as_nanos() + 1_000_000);
        let mut last_value: BTreeMap<u64, u64> = BTreeMap::new();
        for i in 0..self.warmup {
            let y = ycsb.next(&mut warm_rng);
            let key = if self.single_key_contention { 0 } else { y.key };
            let c = &mut clients[(i % u64::from(self.clients)) as usize];
            let op = if y.update {
                let vid = (1 << 62) | (i + 1);
                last_value.insert(key, vid);
                KvOp::Update { key: ycsb.key_bytes(key), value: ycsb::value_bytes(vid, value_size) }
            } else {
                KvOp::Get { key: ycsb.key_bytes(key) }
            };
            if let Err(e) = direct.run_op(c, i, op, &mut now).result {
                return Err(RunError::Bad(format!("warm-up operation {i} failed: {e}")));
            }
        }
        Ok(Warmed { ycsb, images: std::mem::take(&mut direct.images), clients, last_value, warmed_at: now })
    }

    pub fn run(&self) -> Result<Outcome, RunError> {
        let layout = self.layout()?;
        let ts_epoch = LocalTime(SIM_EPOCH_NS - 10_000_000_000);
        let recycling = self.recycling;
        let corrupt = self.corrupt_messages > 0.0;
        let Warmed { ycsb, images, clients, last_value, warmed_at: now } =
            self.load_and_warm_up(&layout, ts_epoch, |cfg| {
                if !recycling {
                    cfg.grace = Duration::MAX;
                }
                if corrupt {
                    cfg.op_timeout = CORRUPT_OP_TIMEOUT;
                }
            })?;
        let value_size = layout.config.value_size;
        if now.as_nanos() >= SIM_EPOCH_NS - 1_000_000_000 {
            return Err(RunError::Bad("warm-up too long for the timestamp epoch; lower --warmup".into()));
        }
        // The simulated measured phase.
        let mut config = SimConfig::new(self.seed);
        config.network.jitter_ratio = self.jitter_ratio;
        let matrix = LatencyMatrix::single("rack", self.one_way);
        let mut sim: Sim<SwarmMsg> = Sim::new(config, matrix);
        if self.corrupt_messages > 0.0 {
            sim.corrupt_messages(self.corrupt_messages);
        }
        let rack = RegionId(0);
        let mut clock_rng = rand_chacha::ChaCha8Rng::seed_from_u64(self.seed ^ 0xc10c);
        for img in images {
            let mut img = Some(img);
            let (len, piece) = (layout.node_bytes(), self.piece_ns_max);
            sim.add_node(rack, SimClock::perfect(), move |_| {
                let image = img.take().unwrap_or_else(|| MemoryImage::new(len));
                Box::new(MemoryNode::new(image, piece))
            });
        }
        let m = layout.config.memory_nodes;
        for (i, c) in clients.into_iter().enumerate() {
            let offset_max = kairos_core::duration_nanos(self.clock_offset_max) as i64;
            let offset = if offset_max > 0 { clock_rng.random_range(0..=offset_max) } else { 0 };
            let drift_max = self.clock_drift_ppm_max.max(0) * 1000;
            let drift = if drift_max > 0 { clock_rng.random_range(-drift_max..=drift_max) } else { 0 };
            let crash = self.crash_client_after.filter(|(ci, _)| *ci as usize == i).map(|(_, n)| n);
            let adv = &self.adversary;
            let mine = |c: Option<u32>| c == Some(i as u32);
            let faults = client_node::ClientFaults {
                stall: mine(adv.stall_client)
                    .then(|| (adv.stall_chain_p, kairos_core::duration_nanos(adv.stall_max).max(1))),
                pause: adv.pause_client.filter(|(c, _, _)| *c as usize == i).map(|(_, at, len)| (at, len)),
                crash_at_chain: adv.crash_client_at_chain.filter(|(c, _)| *c as usize == i).map(|(_, n)| n),
            };
            let mut node = Some(ClientNode::new(
                i as u32,
                Box::new(c),
                ycsb.clone(),
                value_size,
                self.ops,
                self.inflight,
                self.single_key_contention,
                crash,
            ));
            if let Some(n) = node.as_mut() {
                n.faults = faults;
                n.fresh_keys = client_node::FreshKeys {
                    first: self.keys,
                    count: self.fresh_keys,
                    clients: self.clients,
                    deletes_per_mille: self.deletes_per_mille,
                };
            }
            sim.add_node(rack, SimClock::new(offset, drift, 0), move |_| {
                Box::new(node.take().expect("simulated clients are never restarted"))
            });
        }
        if let Some((n, at)) = self.crash_node_at {
            sim.schedule(SimTime::ZERO + at, Fault::Crash(NodeId(n)));
        }
        let client_ids: Vec<NodeId> = (m..m + self.clients).map(NodeId).collect();
        let deadline = if corrupt { SimTime::ZERO + CORRUPT_RUN_MAX } else { SimTime::from_secs(3600) };
        let mut end = SimTime::ZERO;
        loop {
            let next = sim.now() + Duration::from_micros(200);
            sim.run_until(next);
            let all_done = client_ids.iter().all(|id| sim.role::<ClientNode>(*id).is_none_or(|c| c.is_done()));
            if all_done {
                end = sim.now();
                break;
            }
            if sim.pending_events() == 0 || sim.now() >= deadline {
                break;
            }
        }
        if end == SimTime::ZERO {
            end = sim.now();
        }
        // Collect.
        let mut round_trips: BTreeMap<OpKind, BTreeMap<u32, u64>> = BTreeMap::new();
        let mut metrics: BTreeMap<String, u64> = BTreeMap::new();
        let mut errors: BTreeMap<String, u64> = BTreeMap::new();
        if self.corrupt_messages > 0.0 {
            metrics.insert("sim.messages_corrupted".into(), sim.stats().corrupted);
        }
        let mut completed = 0;
        for id in &client_ids {
            let Some(c) = sim.role::<ClientNode>(*id) else { continue };
            completed += c.completed;
            for (k, h) in &c.round_trips {
                for (n, count) in h {
                    *round_trips.entry(*k).or_default().entry(*n).or_insert(0) += count;
                }
            }
            for (k, v) in c.client.counters() {
                let e = metrics.entry(k.to_string()).or_insert(0);
                if k.ends_with("_max") {
                    *e = (*e).max(v);
                } else {
                    *e += v;
                }
            }
            for (k, v) in &c.errors {
                *errors.entry(k.clone()).or_insert(0) += v;
            }
            *metrics.entry("get_timeouts".to_string()).or_insert(0) += c.get_timeouts;
            *metrics.entry("client_crashes".to_string()).or_insert(0) += u64::from(c.crashed);
            *metrics.entry("stalled_chains".to_string()).or_insert(0) += c.stalled_chains;
        }
        let history = sim.take_history();
        // The measured phase ends with the last completion (finer than the 200 µs run slices).
        if let Some(last) = history.iter().map(|r| r.time).max() {
            end = SimTime(last);
        }
        let latency_us = latencies(&history);
        // Memory nodes are the first `m` nodes added.
        let images: Vec<&MemoryImage> =
            (0..m).filter_map(|n| sim.role::<MemoryNode>(NodeId(n))).map(|n| &n.image).collect();
        let written_bytes: u64 = images.iter().map(|i| i.written_bytes()).sum();
        let memory_bytes_per_key_by_region = layout
            .regions()
            .iter()
            .map(|(name, start, end)| {
                let bytes: u64 = images.iter().map(|i| i.written_bytes_in(*start, *end)).sum();
                (*name, bytes as f64 / self.keys as f64)
            })
            .collect();
        let outcome = Outcome {
            latency_us,
            round_trips,
            memory_bytes_per_key: layout.bytes_per_key(),
            memory_bytes_per_key_used: written_bytes as f64 / self.keys as f64,
            memory_bytes_per_key_by_region,
            metrics,
            errors,
            completed,
            duration: end.saturating_since(SimTime::ZERO),
            linearizable: None,
            check_report: String::new(),
            checked_keys: 0,
            trace_hash: sim.trace_hash(),
            history,
            initial_values: last_value.clone(),
        };
        Ok(outcome)
    }
}

/// Latency per kind from the history (one operation at a time per process).
fn latencies(history: &[HistoryRecord]) -> BTreeMap<OpKind, LatencyUs> {
    let mut open: BTreeMap<u64, u64> = BTreeMap::new();
    let mut ns: BTreeMap<OpKind, Vec<u64>> = BTreeMap::new();
    for r in history {
        match r.event.op_type {
            OpType::Invoke => {
                open.insert(r.event.process, r.time);
            }
            OpType::Ok => {
                if let Some(t0) = open.remove(&r.event.process) {
                    let kind = if r.event.f == "read" { OpKind::Get } else { OpKind::Update };
                    ns.entry(kind).or_default().push(r.time - t0);
                }
            }
            _ => {
                open.remove(&r.event.process);
            }
        }
    }
    ns.into_iter().map(|(k, v)| (k, LatencyUs::of(v))).collect()
}
