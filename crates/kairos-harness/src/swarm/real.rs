//! A SWARM run on a real memory backend (shared memory or TCP): the same protocols, workload,
//! load and warm-up as a simulated [`SwarmRun`], measured in real time by the [`driver`], with
//! the history checked per key like the simulator's.
//!
//! Phases: (1) load every key and run the warm-up through the real clients on the synchronous
//! [`DirectMemory`](kairos_swarm::direct::DirectMemory) backend (cheap, in local time from
//! 1 ms on); (2) copy the node images into the backend through ordinary write chains
//! ([`load_images`]); (3) run the measured phase with one thread per client, clocks continuing
//! after the warm-up, each offset by up to `clock_offset_max`; (4) check the history per key,
//! the warm-up's last values entering as synthetic writes.
//!
//! Real hosts are slower and noisier than the simulated rack (threads are descheduled for
//! milliseconds on a loaded machine), so the clients' chain and operation timeouts are longer
//! here ([`RealRun::chain_timeout`], [`RealRun::op_timeout`]): a too-short chain timeout makes a
//! client suspect a live node for good.
//!
//! [`driver`]: crate::swarm::driver

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::Duration;

use kairos_core::LocalTime;
use rand::{Rng as _, SeedableRng};

use super::sim::{LatencyUs, Outcome, RunError, SwarmRun, Warmed};
use crate::swarm::backend::{BackendError, MemoryBackend};
use crate::swarm::check_per_key;
use crate::swarm::driver::{self, DriverConfig, DriverReport, HistoryCodec, OpSource};
use kairos_swarm::client::{KvOp, OpKind};
use kairos_swarm::engine::{Client, Protocol};
use kairos_swarm::layout::Layout;
use kairos_swarm::verbs::{Chain, MemoryImage, Verb, VerbOutcome, PAGE_BYTES};
use kairos_workload::ycsb::{self, Ycsb};

/// Largest write chain [`load_images`] sends (well inside a TCP frame).
const LOAD_CHUNK_BYTES: usize = 1 << 20;

/// A run on a real backend: a [`SwarmRun`]'s parameters plus real-host timeouts.
#[derive(Clone, Debug)]
pub struct RealRun {
    /// Protocol, workload, sizes, clients, operations, warm-up, clock offsets, seed, check,
    /// recycling. (Simulator-only fields — delays, drift, interleaving, client crashes — are
    /// ignored; a memory-node crash is the caller's `crash` hook of [`RealRun::run_on`].)
    pub run: SwarmRun,
    /// A chain unanswered this long makes the client suspect its node.
    pub chain_timeout: Duration,
    /// An operation unfinished this long completes with a timeout (unknown outcome).
    pub op_timeout: Duration,
    /// Grace period before a retired buffer is reused.
    pub grace: Duration,
    /// After the last invocation, how long the driver waits for operations in flight.
    pub drain_timeout: Duration,
    /// Writer slots in the layout (metadata words per key and buffer pools);
    /// `None` = one per client. More slots than clients keeps one layout across client counts
    /// (a scaling experiment), and avoids the directory overflowing with 1–2 writers.
    pub layout_writers: Option<u32>,
}

impl RealRun {
    /// `run` with timeouts for a loaded host: 50 ms per chain, 1 s per operation, 10 ms grace.
    pub fn new(run: SwarmRun) -> Self {
        RealRun {
            run,
            chain_timeout: Duration::from_millis(50),
            op_timeout: Duration::from_secs(1),
            grace: Duration::from_millis(10),
            drain_timeout: Duration::from_secs(3),
            layout_writers: None,
        }
    }

    /// The node layout; a backend needs `layout()?.node_bytes()` bytes per node and
    /// `layout()?.config.memory_nodes` nodes.
    pub fn layout(&self) -> Result<Layout, RunError> {
        let Some(writers) = self.layout_writers else { return self.run.layout() };
        if writers < self.run.clients {
            return Err(RunError::Bad(format!(
                "{writers} layout writers cannot serve {} clients: give at least one per client",
                self.run.clients
            )));
        }
        let mut config = self.run.layout()?.config;
        config.writers = writers;
        Ok(Layout::new(config)?)
    }

    /// Runs on `backend` (whose nodes must be zeroed and sized from [`RealRun::layout`]).
    /// `crash`, if given, is called once after the given time into the measured phase (to kill
    /// a memory node) unless the run ends first.
    pub fn run_on(
        &self,
        backend: &dyn MemoryBackend,
        crash: Option<(Duration, Box<dyn FnOnce() + Send + '_>)>,
    ) -> Result<Outcome, RunError> {
        let prepared = self.prepare()?;
        self.load(&prepared, backend)?;
        let (layout, last_value) = (prepared.layout.clone(), prepared.last_value.clone());
        let report = self.measure(prepared, backend, 0..self.run.clients, None, crash)?;
        Ok(self.outcome(&layout, report, &last_value, backend))
    }

    /// Phase 1: loads every key and runs the warm-up through the clients on node images.
    /// Deterministic: every process that prepares the same run gets the same images, clients
    /// and warm-up values (so clients of one run can be split over processes).
    pub fn prepare(&self) -> Result<Prepared, RunError> {
        let layout = self.layout()?;
        let (chain_timeout, op_timeout) = (self.chain_timeout, self.op_timeout);
        let grace = if self.run.recycling { self.grace } else { Duration::MAX };
        let Warmed { ycsb, images, clients, last_value, warmed_at: now } =
            self.run.load_and_warm_up(&layout, LocalTime(0), |cfg| {
                cfg.chain_timeout = chain_timeout;
                cfg.op_timeout = op_timeout;
                cfg.grace = grace;
            })?;
        // Timestamps cover ~9 minutes of local time from the epoch: leave room for the run.
        if now.as_nanos() > 60_000_000_000 {
            return Err(RunError::Bad("warm-up too long for the timestamp epoch; lower --warmup".into()));
        }
        Ok(Prepared { layout, ycsb, images, clients, last_value, local_clock_base_ns: now.as_nanos() + 1_000_000_000 })
    }

    /// Phase 2: copies the prepared node images into `backend` (zeroed nodes of the layout's size).
    pub fn load(&self, prepared: &Prepared, backend: &dyn MemoryBackend) -> Result<(), RunError> {
        if backend.nodes() != prepared.layout.config.memory_nodes {
            return Err(RunError::Bad(format!(
                "the backend has {} memory nodes, the layout needs {}",
                backend.nodes(),
                prepared.layout.config.memory_nodes
            )));
        }
        load_images(backend, &prepared.images).map_err(|e| RunError::Bad(format!("loading the backend: {e}")))
    }

    /// Phase 3: the measured phase for clients `clients` (a sub-range when the run's clients are
    /// split over processes, which then pass the same `shared_epoch_unix_ns`).
    pub fn measure(
        &self,
        prepared: Prepared,
        backend: &dyn MemoryBackend,
        clients: std::ops::Range<u32>,
        shared_epoch_unix_ns: Option<u64>,
        crash: Option<(Duration, Box<dyn FnOnce() + Send + '_>)>,
    ) -> Result<DriverReport, RunError> {
        let r = &self.run;
        if clients.is_empty() || clients.end > r.clients {
            return Err(RunError::Bad(format!("clients {clients:?} are not a part of 0..{}", r.clients)));
        }
        let mut clock_rng = rand_chacha::ChaCha8Rng::seed_from_u64(r.seed ^ 0xc10c);
        let offset_max = kairos_core::duration_nanos(r.clock_offset_max).min(i64::MAX as u64) as i64;
        let offsets: Vec<i64> =
            (0..r.clients).map(|_| if offset_max > 0 { clock_rng.random_range(0..=offset_max) } else { 0 }).collect();
        let config = DriverConfig {
            ops_per_client: r.ops,
            in_flight_per_client: r.inflight,
            duration: None,
            drain_timeout: self.drain_timeout,
            op_timeout: self.op_timeout + self.drain_timeout,
            clock_offsets_ns: offsets,
            record_history: r.check,
            local_clock_base_ns: prepared.local_clock_base_ns,
            first_client: clients.start,
            shared_epoch_unix_ns,
        };
        let value_size = prepared.layout.config.value_size;
        let ycsb = prepared.ycsb;
        let with_sources: Vec<(Client, Box<dyn OpSource>)> = prepared
            .clients
            .into_iter()
            .enumerate()
            .filter(|(i, _)| clients.contains(&(*i as u32)))
            .map(|(i, c)| {
                let source = YcsbSource {
                    ycsb: ycsb.clone(),
                    rng: rand_chacha::ChaCha8Rng::seed_from_u64(r.seed.wrapping_mul(1_000_003) ^ i as u64),
                    client: i as u64,
                    seq: 0,
                    value_size,
                    single_key: r.single_key_contention,
                };
                (c, Box::new(source) as Box<dyn OpSource>)
            })
            .collect();
        let codec = YcsbCodec;
        std::thread::scope(|s| {
            let (done_tx, done_rx) = mpsc::channel::<()>();
            if let Some((after, crash)) = crash {
                s.spawn(move || {
                    if let Err(mpsc::RecvTimeoutError::Timeout) = done_rx.recv_timeout(after) {
                        crash();
                    }
                });
            }
            let report = driver::run(backend, with_sources, &codec, &config);
            drop(done_tx);
            report
        })
        .map_err(|e| RunError::Bad(format!("measured phase: {e}")))
    }

    /// Phase 4: the simulator's [`Outcome`] of a measured phase, its history checked per key
    /// (the warm-up's last values enter as synthetic writes) if the run asks for it.
    /// Memory is measured on `backend` where it can tell (shm), else estimated from the layout.
    pub fn outcome(
        &self,
        layout: &Layout,
        report: DriverReport,
        last_value: &BTreeMap<u64, u64>,
        backend: &dyn MemoryBackend,
    ) -> Outcome {
        let r = &self.run;
        let keys = r.keys as f64;
        let measured: Option<BTreeMap<&'static str, f64>> = layout
            .regions()
            .iter()
            .map(|(name, start, end)| {
                let bytes: Option<u64> =
                    (0..layout.config.memory_nodes).map(|n| backend.allocated_bytes_in(n, *start, *end)).sum();
                Some((*name, bytes? as f64 / keys))
            })
            .collect();
        let touched_bytes_per_key = match &measured {
            Some(regions) => regions.values().sum(),
            None => {
                let touched = report.counters.get("buffers_touched").copied().unwrap_or(0);
                estimated_touched_bytes(layout, r.protocol, touched) as f64 / keys
            }
        };
        let latency_us: BTreeMap<OpKind, LatencyUs> =
            report.latency_ns.iter().map(|(k, v)| (*k, LatencyUs::of(v.clone()))).collect();
        let mut outcome = Outcome {
            latency_us,
            round_trips: report.round_trips.clone(),
            memory_bytes_per_key: layout.bytes_per_key(),
            memory_bytes_per_key_used: touched_bytes_per_key,
            memory_bytes_per_key_by_region: measured.unwrap_or_default(),
            metrics: report.counters.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            errors: report.errors.clone(),
            completed: report.ok + report.failed + report.unknown,
            duration: report.wall,
            linearizable: None,
            check_report: String::new(),
            checked_keys: 0,
            trace_hash: 0,
            history: report.history,
            initial_values: last_value.clone(),
        };
        if r.check {
            let (valid, text, keys) = check_per_key(&outcome.history, last_value);
            outcome.linearizable = valid;
            outcome.check_report = text;
            outcome.checked_keys = keys;
        }
        outcome
    }
}

/// A run after its load and warm-up ([`RealRun::prepare`]).
pub struct Prepared {
    pub layout: Layout,
    ycsb: Ycsb,
    images: Vec<MemoryImage>,
    clients: Vec<Client>,
    /// Each key's last warm-up value (the checker's starting state).
    pub last_value: BTreeMap<u64, u64>,
    /// Local clocks of the measured phase start here (after the warm-up's local time).
    pub local_clock_base_ns: u64,
}

/// Memory touched on all nodes, estimated where a backend cannot measure it: the directory on
/// every node; for the replicated protocols the metadata words on every node and
/// `buffers_touched` buffers (the writers' high-water marks) on each replica; each key's
/// primary in-place entry except for FUSEE, which has none.
fn estimated_touched_bytes(layout: &Layout, protocol: Protocol, buffers_touched: u64) -> u64 {
    let c = &layout.config;
    let directory = layout.slots_base * u64::from(c.memory_nodes);
    let in_place = if protocol == Protocol::Fusee { 0 } else { c.keys * layout.inplace_entry_bytes };
    if protocol == Protocol::Raw {
        return directory + in_place;
    }
    let metadata = (layout.inplace_base - layout.slots_base) * u64::from(c.memory_nodes);
    directory + metadata + in_place + buffers_touched * layout.buffer_bytes * u64::from(c.replicas)
}

/// Writes node images into a backend's (zeroed) nodes with ordinary write chains, skipping
/// all-zero pages, and waits for every chain to complete.
pub fn load_images(backend: &dyn MemoryBackend, images: &[MemoryImage]) -> Result<(), BackendError> {
    let mut port = backend.connect(u32::MAX)?;
    for (node, img) in images.iter().enumerate() {
        let len = img.len_bytes();
        let mut addr = 0u64;
        let mut tag = 0u64;
        while addr < len {
            // A run of pages holding data, at most one chunk long: zero pages are skipped, so a
            // backend that allocates on first write allocates only what the image uses.
            let holds_data = |a: u64| a < len && !img.is_zero(a, PAGE_BYTES.min(len - a));
            if !holds_data(addr) {
                addr += PAGE_BYTES;
                continue;
            }
            let mut n = 0u64;
            while n < LOAD_CHUNK_BYTES as u64 && holds_data(addr + n) {
                n += PAGE_BYTES.min(len - addr - n);
            }
            let data = img.read(addr, n as usize);
            tag += 1;
            port.submit(tag, Chain { node: node as u32, verbs: vec![Verb::Write { addr, data }] })?;
            match port.poll(Duration::from_secs(10)) {
                Some(c) if c.result == Ok(vec![VerbOutcome::Written]) => {}
                Some(c) => {
                    return Err(BackendError::Config(format!(
                        "memory node {node} refused the load at byte {addr}: {:?} (is it at least {len} bytes?)",
                        c.result
                    )))
                }
                None => {
                    return Err(BackendError::Config(format!(
                        "memory node {node} did not answer a load write within 10 s (crashed?)"
                    )))
                }
            }
            addr += n;
        }
    }
    Ok(())
}

/// YCSB operations of one client, with values unique per write (`(client + 1) << 40 | seq`).
struct YcsbSource {
    ycsb: Ycsb,
    rng: rand_chacha::ChaCha8Rng,
    client: u64,
    seq: u64,
    value_size: u32,
    single_key: bool,
}

impl OpSource for YcsbSource {
    fn next_op(&mut self) -> Option<KvOp> {
        let y = self.ycsb.next(&mut self.rng);
        let key = self.ycsb.key_bytes(if self.single_key { 0 } else { y.key });
        self.seq += 1;
        Some(if y.update {
            let vid = ((self.client + 1) << 40) | self.seq;
            KvOp::Update { key, value: ycsb::value_bytes(vid, self.value_size) }
        } else {
            KvOp::Get { key }
        })
    }
}

/// YCSB keys (`u…u` + big-endian number) and values (little-endian id first; id 0 = initial),
/// as the simulator's history writes them.
struct YcsbCodec;

impl HistoryCodec for YcsbCodec {
    fn key(&self, key: &[u8]) -> u64 {
        let tail = &key[key.len().saturating_sub(8)..];
        tail.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b))
    }
    fn value(&self, value: &[u8]) -> Option<u64> {
        ycsb::value_id(value).filter(|id| *id != 0)
    }
}
