//! `kairos bench swarm`: SWARM-KV against DM-ABD and RAW on the same memory verbs, YCSB A or
//! B, every history checked linearizable per key. Backends: the simulator (`sim`), shared
//! memory regions in /dev/shm (`shm`), or TCP memory servers on loopback started in this
//! process (`tcp`); the real backends run one thread per client in real time
//! (`kairos_harness::swarm::real`), with fresh zeroed nodes for every protocol.

use crate::result::{self, CheckResult, RunResult};
use crate::stats::{self, Percentiles};
use crate::CliError;
use clap::{Args, ValueEnum};
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use kairos_harness::swarm::sim::{Outcome, SwarmRun};
use kairos_swarm::client::OpKind;
use kairos_swarm::engine::Protocol;
use kairos_workload::ycsb::Workload;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendArg {
    /// The deterministic simulator (0.7 µs one-way, adversarial verb interleaving, torn reads).
    Sim,
    /// Shared memory regions in /dev/shm (CXL-like).
    Shm,
    /// TCP memory servers.
    Tcp,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum YcsbArg {
    /// 50% updates.
    YcsbA,
    /// 5% updates.
    YcsbB,
}

#[derive(Args, Debug, Clone)]
pub struct SwarmBenchArgs {
    /// Where memory nodes live.
    #[arg(long, value_enum, default_value_t = BackendArg::Sim)]
    pub backend: BackendArg,
    /// Protocols to run side by side: swarm-kv, dm-abd, fusee (the paper's peers), raw (no
    /// replication: the lower bound).
    #[arg(long, value_delimiter = ',', default_value = "swarm-kv,dm-abd,fusee,raw")]
    pub protocols: Vec<String>,
    #[arg(long, value_enum, default_value_t = YcsbArg::YcsbB)]
    pub workload: YcsbArg,
    /// Client machines (each is a writer with its own metadata word per key).
    #[arg(long, default_value_t = 4)]
    pub clients: u32,
    /// Measured operations per client.
    #[arg(long, default_value_t = 25_000)]
    pub ops: u64,
    /// Operations in flight per client.
    #[arg(long, default_value_t = 1)]
    pub inflight: usize,
    /// Keys loaded before the run (every key is on `--replicas` memory nodes; paper: 100,000).
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// Key size, bytes.
    #[arg(long, default_value_t = 24)]
    pub key_size: u32,
    /// Value size, bytes (at least 8: a value carries its unique id for the checker).
    #[arg(long, default_value_t = 64)]
    pub value_size: u32,
    /// Copies of every key, one per memory node (RAW keeps one).
    #[arg(long, default_value_t = 3)]
    pub replicas: u32,
    /// Warm-up operations (all clients together; run cheaply, not measured). The paper uses 1,000,000.
    #[arg(long, default_value_t = 1_000_000)]
    pub warmup: u64,
    /// Largest client clock offset, µs (each client's offset is uniform in [0, this]).
    #[arg(long, default_value_t = 1.0)]
    pub clock_skew_us: f64,
    /// shm/tcp only: writer slots in the memory layout (default: one per client). Fix it (e.g. 8)
    /// to compare client counts on one layout.
    #[arg(long)]
    pub layout_writers: Option<u32>,
    /// Every operation on one key (the contention experiment).
    #[arg(long)]
    pub contention_one_key: bool,
    /// Skip the linearizability check.
    #[arg(long)]
    pub no_check: bool,
    /// Crash memory node 0 this many µs (virtual) into the measured phase.
    #[arg(long)]
    pub crash_node_at_us: Option<u64>,
    /// Never reuse out-of-place buffers (to measure what memory recycling saves).
    #[arg(long)]
    pub no_recycling: bool,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write the result contract JSON (one object per protocol) to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write this run's figure (latency CDF of every protocol run, SVG) to this file.
    #[arg(long, value_name = "PATH.svg")]
    pub plot: Option<PathBuf>,
}

impl SwarmBenchArgs {
    pub fn runs(&self) -> Result<Vec<SwarmRun>, CliError> {
        let bad = |m: String| Err(CliError::Usage(m));
        if self.layout_writers.is_some() && self.backend == BackendArg::Sim {
            return bad("--layout-writers applies to --backend shm and tcp only".into());
        }
        if self.clients == 0 || self.clients > 127 {
            return bad(format!("--clients must be 1..=127 (writers fit in 7 bits), not {}", self.clients));
        }
        if self.inflight == 0 || self.inflight > 64 {
            return bad(format!("--inflight must be 1..=64, not {}", self.inflight));
        }
        if self.value_size < 8 {
            return bad(format!("--value-size must be at least 8 bytes (the value's id), not {}", self.value_size));
        }
        if self.replicas == 0 || self.replicas.is_multiple_of(2) {
            return bad(format!("--replicas must be odd (a majority must intersect), not {}", self.replicas));
        }
        if !(self.clock_skew_us.is_finite() && (0.0..=1e6).contains(&self.clock_skew_us)) {
            return bad(format!("--clock-skew-us must be between 0 and 1,000,000, not {}", self.clock_skew_us));
        }
        let mut out = Vec::new();
        for name in &self.protocols {
            let Some(protocol) = Protocol::parse(name.trim()) else {
                return bad(format!("unknown protocol `{name}`; choose from swarm-kv, dm-abd, fusee, raw"));
            };
            out.push(SwarmRun {
                protocol,
                workload: match self.workload {
                    YcsbArg::YcsbA => Workload::YcsbA,
                    YcsbArg::YcsbB => Workload::YcsbB,
                },
                clients: self.clients,
                ops: self.ops,
                inflight: self.inflight,
                keys: self.keys,
                key_size: self.key_size,
                value_size: self.value_size,
                replicas: self.replicas,
                warmup: self.warmup,
                clock_offset_max: Duration::from_nanos((self.clock_skew_us * 1e3) as u64),
                single_key_contention: self.contention_one_key,
                seed: self.seed,
                check: !self.no_check,
                recycling: !self.no_recycling,
                crash_node_at: self.crash_node_at_us.map(|us| (0, Duration::from_micros(us))),
                ..SwarmRun::default()
            });
        }
        Ok(out)
    }
}

pub fn bench(a: SwarmBenchArgs) -> Result<(), CliError> {
    let mut runs = a.runs()?;
    if a.contention_one_key && !a.no_check && u64::from(a.clients) * a.ops > 2_000 {
        // Checking one register costs time exponential in its concurrency.
        println!(
            "note: not checking linearizability of {} × {} operations on one key (too costly); \
             use fewer --ops for a checked run",
            a.clients, a.ops
        );
        runs.iter_mut().for_each(|r| r.check = false);
    }
    let mut results = Vec::new();
    let mut outcomes = Vec::new();
    println!(
        "SWARM on {}: {} clients × {} ops ({} in flight), {} over {} keys of {} B, {} B values, {} replicas, \
         warm-up {}, client clock offsets up to {} µs, seed {}{}",
        match a.backend {
            BackendArg::Sim => "the simulator".to_string(),
            BackendArg::Shm => format!("shared memory (/dev/shm, {} client threads on {} cores)", a.clients, cores()),
            BackendArg::Tcp => format!(
                "TCP memory servers on loopback ({} client threads and the servers' threads on {} cores)",
                a.clients,
                cores()
            ),
        },
        a.clients,
        a.ops,
        a.inflight,
        runs[0].workload.name(),
        a.keys,
        a.key_size,
        a.value_size,
        a.replicas,
        a.warmup,
        a.clock_skew_us,
        a.seed,
        if a.contention_one_key { ", every operation on ONE key" } else { "" }
    );
    for run in &runs {
        let started = Instant::now();
        let o = match a.backend {
            BackendArg::Sim => kairos_harness::swarm::run(run).map_err(|e| CliError::Usage(e.to_string()))?,
            BackendArg::Shm | BackendArg::Tcp => super::swarm_real::run(a.backend, run, a.layout_writers)?,
        };
        let wall = started.elapsed();
        print_table_on(run, &o, a.backend);
        results.push(swarm_result_on(run, &o, wall, a.backend));
        outcomes.push((run.protocol, o));
    }
    let median = |p: Protocol, k: OpKind| {
        outcomes.iter().find(|(q, _)| *q == p).and_then(|(_, o)| o.latency_us.get(&k)).map(|l| l.p50)
    };
    for k in [OpKind::Get, OpKind::Update] {
        if let Some(s) = median(Protocol::SwarmKv, k) {
            let mut parts = Vec::new();
            for base in [Protocol::Raw, Protocol::DmAbd, Protocol::Fusee] {
                if let Some(b) = median(base, k).filter(|b| *b > 0.0) {
                    parts.push(format!("SWARM-KV/{} = {:.2}", base.name().to_uppercase(), s / b));
                }
            }
            if !parts.is_empty() {
                println!("median {} latency: {}", k.name(), parts.join(", "));
            }
        }
    }
    if let Some(path) = &a.json {
        result::write_json(path, &results)?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &a.plot {
        let title = format!("SWARM on {}, {}: latency CDFs", results[0].host, runs[0].workload.name());
        crate::report::write_run_figure(path, &title, &results)?;
    }
    let bad: Vec<String> = outcomes
        .iter()
        .filter(|(_, o)| o.linearizable == Some(false))
        .map(|(p, o)| format!("{}: {}", p.name(), o.check_report))
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(CliError::Anomaly(format!("non-linearizable history (seed {}): {}", a.seed, bad.join("; "))))
    }
}

fn rtt_text(h: &BTreeMap<u32, u64>) -> String {
    let total: u64 = h.values().sum::<u64>().max(1);
    h.iter().map(|(n, c)| format!("{n}: {:.2}%", *c as f64 * 100.0 / total as f64)).collect::<Vec<_>>().join("  ")
}

pub fn print_table(run: &SwarmRun, o: &Outcome) {
    print_table_on(run, o, BackendArg::Sim)
}

pub fn print_table_on(run: &SwarmRun, o: &Outcome, backend: BackendArg) {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(["op", "count", "p1 µs", "p50 µs", "p90 µs", "p99 µs", "round trips (share of ops)"]);
    for k in [OpKind::Get, OpKind::Update] {
        let Some(l) = o.latency_us.get(&k) else { continue };
        let rtt = o.round_trips.get(&k).map(rtt_text).unwrap_or_default();
        table.add_row([
            k.name().to_string(),
            l.count.to_string(),
            format!("{:.2}", l.p1),
            format!("{:.2}", l.p50),
            format!("{:.2}", l.p90),
            format!("{:.2}", l.p99),
            rtt,
        ]);
    }
    println!("\n{}", run.protocol.name().to_uppercase());
    println!("{table}");
    let verdict = match o.linearizable {
        Some(true) => format!("linearizable per key ({} keys; kairos-wgl + todc-utils)", o.checked_keys),
        Some(false) => format!("NOT LINEARIZABLE: {}", o.check_report),
        None if o.check_report.is_empty() => "not checked".to_string(),
        None => format!("UNVERIFIED (no checker could decide): {}", o.check_report),
    };
    println!(
        "throughput {:.0} ops/s ({}) · memory {:.0} B/key reserved, {:.0} B/key touched · errors {:?} · {verdict}",
        o.throughput_ops_per_s(),
        if backend == BackendArg::Sim { "virtual" } else { "real time" },
        o.memory_bytes_per_key,
        o.memory_bytes_per_key_used,
        o.errors
    );
    if o.memory_bytes_per_key_by_region.is_empty() {
        println!("memory touched is estimated from the layout (this backend cannot measure its pages)");
    } else {
        let parts: Vec<String> =
            o.memory_bytes_per_key_by_region.iter().map(|(region, b)| format!("{region} {b:.0}")).collect();
        println!("memory touched per key, all nodes, by region (pages written): {}", parts.join(", "));
    }
}

/// CPU cores this process may use (real backends share them between clients and memory).
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Processes at or above this are not clients (the simulator's loader is `u64::MAX >> 1`).
const LOADER_PROCESS_MIN: u64 = 1 << 40;

pub fn swarm_result(run: &SwarmRun, o: &Outcome, wall: Duration) -> RunResult {
    swarm_result_on(run, o, wall, BackendArg::Sim)
}

pub fn swarm_result_on(run: &SwarmRun, o: &Outcome, wall: Duration, backend: BackendArg) -> RunResult {
    let summary = stats::summarize(&o.history, |_| None);
    // The loader's writes (one process above every client's) are not the workload's.
    let (cdf, cdf_by_op) = stats::latency_cdfs(
        &o.history,
        |e| e.process < LOADER_PROCESS_MIN,
        |e| Some(if e.f == "read" { "get" } else { "update" }.to_string()),
    );
    let all: u64 = o.round_trips.values().flat_map(|h| h.values()).sum::<u64>().max(1);
    let mut rtt: BTreeMap<String, f64> = BTreeMap::new();
    for h in o.round_trips.values() {
        for (n, c) in h {
            *rtt.entry(n.to_string()).or_insert(0.0) += *c as f64 / all as f64;
        }
    }
    let mut extra = BTreeMap::new();
    let lat: BTreeMap<&str, serde_json::Value> = o
        .latency_us
        .iter()
        .map(|(k, l)| {
            (k.name(), serde_json::json!({"p1": l.p1, "p50": l.p50, "p90": l.p90, "p99": l.p99, "max": l.max, "count": l.count}))
        })
        .collect();
    extra.insert("latency_us".into(), serde_json::json!(lat));
    let by_op: BTreeMap<&str, BTreeMap<String, u64>> =
        o.round_trips.iter().map(|(k, h)| (k.name(), h.iter().map(|(n, c)| (n.to_string(), *c)).collect())).collect();
    extra.insert("round_trips_by_op".into(), serde_json::json!(by_op));
    extra.insert("memory_bytes_per_key".into(), o.memory_bytes_per_key.into());
    if backend != BackendArg::Sim {
        extra.insert("host_cores".into(), cores().into());
    }
    extra.insert("memory_bytes_per_key_used".into(), o.memory_bytes_per_key_used.into());
    if !o.memory_bytes_per_key_by_region.is_empty() {
        extra.insert("memory_bytes_per_key_by_region".into(), serde_json::json!(o.memory_bytes_per_key_by_region));
    }
    extra.insert("metrics".into(), serde_json::json!(o.metrics));
    RunResult {
        system: "swarm".into(),
        protocol: run.protocol.name().into(),
        workload: serde_json::json!({
            "name": run.workload.name(),
            "keys": run.keys,
            "key_size": run.key_size,
            "value_size": run.value_size,
            "replicas": run.replicas,
            "clients": run.clients,
            "ops_per_client": run.ops,
            "inflight": run.inflight,
            "warmup": run.warmup,
            "clock_offset_max_us": run.clock_offset_max.as_secs_f64() * 1e6,
            "single_key_contention": run.single_key_contention,
            "recycling": run.recycling,
            "crash_node_at_us": run.crash_node_at.map(|(_, t)| t.as_micros() as u64),
            "zipf": kairos_workload::ycsb::ZIPF_THETA,
        }),
        host: match backend {
            BackendArg::Sim => "sim",
            BackendArg::Shm => "shm",
            BackendArg::Tcp => "net",
        }
        .into(),
        clock: format!("offset ≤ {} µs", run.clock_offset_max.as_secs_f64() * 1e6),
        seed: run.seed,
        duration_s: o.duration.as_secs_f64(),
        offered_ops_per_s: None,
        throughput_ops_per_s: o.throughput_ops_per_s(),
        latency_ms: Percentiles { p50: summary.overall.p50, p90: summary.overall.p90, p99: summary.overall.p99 },
        latency_ms_by_region: BTreeMap::new(),
        latency_cdf_ms: cdf,
        latency_cdf_ms_by_region: BTreeMap::new(),
        latency_cdf_ms_by_op: cdf_by_op,
        committed: summary.ok,
        aborted: summary.failed,
        unknown: summary.unknown,
        fast_path_ratio: rtt.get("1").copied(),
        rollback_ratio: None,
        round_trips: Some(rtt),
        check: CheckResult {
            model: "linearizable".into(),
            valid: o.linearizable.unwrap_or(false),
            verdict: match o.linearizable {
                Some(true) => "valid",
                Some(false) => "invalid",
                None => "unknown",
            }
            .into(),
            ops: o.completed as usize,
            checker: if o.check_report.is_empty() { "not checked" } else { "kairos-wgl + todc-utils (per key)" }.into(),
        },
        trace_hash: (backend == BackendArg::Sim).then(|| format!("{:016x}", o.trace_hash)),
        wall_s: wall.as_secs_f64(),
        extra,
    }
}
